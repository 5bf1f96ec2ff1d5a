"""Build the board's initramfs on the host, natively: static busybox + the virtio/ext4 modules.

Debian's own initramfs (mkinitramfs) takes minutes per run under qemu-user emulation and the
image build would run it twice. The board boots from one virtio disk, so its initramfs only has
to load the modules that reach and mount it (resolved through ``modules.dep`` and
``modules.softdep``, built-in ones skipped), then ``switch_root`` to systemd.

Usage: ``python3 initramfs.py MODULES_ROOT KVER BUSYBOX OUT_DIR`` (pure standard library; the
caller packs ``OUT_DIR`` with cpio).
"""

from __future__ import annotations

import lzma
import shutil
import sys
from pathlib import Path

# What the boot needs: the disk, the file system on it, the network, an entropy source (sshd
# and Python ask for random bytes early), the PCI transport the virt machine's devices sit on.
WANTED = ("virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng", "ext4", "crc32c_generic")

INIT = """#!/bin/busybox sh
# Minimal init of the cuvil-edge HIL board: load the modules, mount /dev/vda, hand over to systemd.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod "/modules/$m" 2>/dev/null || echo "initramfs: insmod $m failed"; done
root=/dev/vda
for opt in $(cat /proc/cmdline); do case "$opt" in root=*) root="${opt#root=}";; esac; done
i=0
while [ ! -b "$root" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /newroot
if ! mount -t ext4 -o rw "$root" /newroot; then
  echo "initramfs: cannot mount $root; dropping to a shell"
  exec sh
fi
umount /proc /sys
mount --move /dev /newroot/dev 2>/dev/null || umount /dev
exec switch_root /newroot /sbin/init
"""


def _name(path: str) -> str:
    base = Path(path).name
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base.replace("-", "_")


def resolve(mod_root: Path, wanted: tuple[str, ...]) -> list[str]:
    """Module files (relative to ``mod_root``) to insmod, dependencies first."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (mod_root / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_name(path)] = path
    soft: dict[str, list[str]] = {}
    softdep = mod_root / "modules.softdep"
    if softdep.is_file():
        for line in softdep.read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[0] == "softdep":
                pre = parts[2 : parts.index("post:")] if "post:" in parts else parts[2:]
                soft[parts[1].replace("-", "_")] = [p for p in pre if p != "pre:"]
    builtin = {_name(x) for x in (mod_root / "modules.builtin").read_text().split()}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for extra in soft.get(_name(path), []):
            if extra.replace("-", "_") in by_name:
                visit(by_name[extra.replace("-", "_")])
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name in builtin:
            continue
        if name not in by_name:
            raise SystemExit(f"initramfs: module {name} is neither built in nor in modules.dep")
        visit(by_name[name])
    return order


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    mod_root = Path(argv[1]) / "lib" / "modules" / argv[2]
    busybox, out = Path(argv[3]), Path(argv[4])
    for sub in ("bin", "dev", "proc", "sys", "newroot", "modules"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, out / "bin" / "busybox")
    names: list[str] = []
    for rel in resolve(mod_root, WANTED):
        src = mod_root / rel
        dest_name = Path(rel).name
        data = src.read_bytes()
        if dest_name.endswith(".xz"):  # busybox insmod takes plain ELF objects
            data, dest_name = lzma.decompress(data), dest_name[:-3]
        (out / "modules" / dest_name).write_bytes(data)
        names.append(dest_name)
    (out / "modules.order").write_text("\n".join(names) + "\n")
    init = out / "init"
    init.write_text(INIT)
    init.chmod(0o755)
    print(f"initramfs: {len(names)} modules: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
