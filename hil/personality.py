"""A Jetson personality for the emulated board: an L4T 36 board as the daemon and deploy meet it.

What a board shows of itself, planted where the real one keeps it, at boot time (nothing here is
in the cached image, so changing it costs no image rebuild):

* the device-tree ``model`` and ``compatible`` strings: QEMU's own device tree for the ``virt``
  machine, dumped (``-M virt,dumpdtb=``) and edited with ``fdtput``, is passed back with ``-dtb``,
  so the guest kernel itself reports ``/proc/device-tree/model`` (no bind mount over /proc);
* the kernel command line of L4T 36: ``psi=0`` (NVIDIA's L4T 36 kernel config has no
  ``CONFIG_PSI``, so ``/proc/pressure`` is absent on a real board);
* ``/etc/nv_tegra_release``, the first line as L4T writes it;
* the GPU device nodes CUDA opens on Orin (``/dev/nvmap``, ``/dev/nvgpu/igpu0/ctrl|power``,
  ``/dev/host1x-fence``, ``/dev/dri/renderD128``) with L4T's owners, groups and modes. They are
  STAND-IN nodes: each is a real character device of a harmless kernel driver with a distinct
  major:minor (those of fuse, tun, loop-control, uinput, uhid), so opening one succeeds exactly when
  systemd's device cgroup, the groups and the mode allow it, as on the board. A oneshot unit
  recreates them at every boot (``/dev`` is devtmpfs);
* the ``video``, ``render`` and ``jtop`` groups, and jtop's socket ``/run/jtop.sock`` as
  jetson-stats leaves it (root:jtop 0660; nothing listens: the rig has no jtop service);
* TensorRT's apt layout: real Debian packages built here with ``dpkg-deb`` and installed with
  ``dpkg -i`` (``tensorrt`` and ``python3-libnvinfer`` of the board's TensorRT version), holding a
  ``tensorrt`` module in the system site-packages that says it is a STAND-IN (its version is the
  board's; any TensorRT API raises), its ``tensorrt-<ver>.dist-info``, and ``trtexec`` where
  JetPack puts it (``/usr/src/tensorrt/bin``; it runs cuvil-edge's labelled stand-in builder).
  ``nvcc`` is not on PATH (JetPack does not put it there);
* ``/usr/bin/tegrastats``: a stand-in that synthesizes lines from the board's own memory and CPU
  load and the profile's data-sheet figures (``hil/standins/tegrastats``; its docstring says so).

There is no GPU, TensorRT or nvmap behind any of it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hil.errors import BootError, HilError

if TYPE_CHECKING:
    from hil.board import Board

__all__ = ["GPU_NODES", "PERSONALITIES", "Personality", "apply_personality", "board_figures", "kernel_args",
           "nodes_script", "personality_dtb", "tensorrt_debs"]

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Personality:
    """The identity of one Jetson board profile on one JetPack release."""

    model: str
    compatible: tuple[str, ...]
    nv_tegra_release: str
    jetpack: str  # the release (targets.toml) whose TensorRT the apt stand-in carries
    kernel_args: tuple[str, ...] = ()


PERSONALITIES: dict[str, Personality] = {
    # Orin Nano 8GB developer kit on JetPack 6.2 (L4T R36.4.3), as the board prints them.
    "orin-nano-8gb": Personality(
        model="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        compatible=("nvidia,p3768-0000+p3767-0005-super", "nvidia,p3767-0005", "nvidia,tegra234"),
        nv_tegra_release="# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
                         "DATE: Tue Jan  8 21:12:29 UTC 2025\n# KERNEL_VARIANT: oot\n",
        jetpack="6.2",
        kernel_args=("psi=0",),
    ),
}

# (node, the stand-in driver's own node, owner:group, mode): L4T 36's udev rules give the GPU nodes
# root:video 0660 and the render node root:render 0660. Each stand-in takes the major:minor of a
# harmless misc driver (read at boot), one per node, so the device cgroup tells them apart.
GPU_NODES: tuple[tuple[str, str, str, str], ...] = (
    ("/dev/nvmap", "/dev/fuse", "root:video", "0660"),
    ("/dev/nvgpu/igpu0/ctrl", "/dev/net/tun", "root:video", "0660"),
    ("/dev/nvgpu/igpu0/power", "/dev/loop-control", "root:video", "0660"),
    ("/dev/host1x-fence", "/dev/uinput", "root:video", "0660"),
    ("/dev/dri/renderD128", "/dev/uhid", "root:render", "0660"),
)
NODE_MODULES = ("fuse", "tun", "loop", "uinput", "uhid")


def kernel_args(board: str | None) -> tuple[str, ...]:
    """Kernel command-line arguments of the personality (``psi=0`` for L4T 36), none without one."""
    return _get(board).kernel_args if board else ()


def nodes_script() -> str:
    """Shell that (re)creates the stand-in GPU nodes with L4T's owners, groups and modes."""
    lines = ["#!/bin/sh", "# cuvil-edge HIL rig: STAND-IN Jetson GPU nodes (see hil/personality.py)", "set -e",
             f"modprobe -a {' '.join(NODE_MODULES)} 2>/dev/null || true"]
    for node, source, owner, mode in GPU_NODES:
        lines += [f"set -- $(stat -L -c '%t %T' {source})", f"mkdir -p {Path(node).parent}", f"rm -f {node}",
                  f"mknod -m {mode} {node} c $((0x$1)) $((0x$2))", f"chown {owner} {node}"]
    lines += ["python3 -c \"import socket,os; p='/run/jtop.sock'; os.path.exists(p) and os.unlink(p); "
              "s=socket.socket(socket.AF_UNIX); s.bind(p)\"",
              "chown root:jtop /run/jtop.sock", "chmod 0660 /run/jtop.sock"]
    return "\n".join(lines) + "\n"


NODES_UNIT = """[Unit]
Description=cuvil-edge HIL rig: STAND-IN Jetson GPU nodes and jtop socket (hil/personality.py)
DefaultDependencies=no
After=systemd-udev-trigger.service systemd-sysusers.service
Before=sysinit.target cuvil-edged.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/lib/cuvil-hil/l4t-nodes.sh

[Install]
WantedBy=sysinit.target
"""


def tensorrt_debs(out_dir: Path, tensorrt: str) -> list[Path]:
    """``python3-libnvinfer`` and ``tensorrt`` .debs of TensorRT ``tensorrt``: JetPack's apt layout,
    holding a STAND-IN module (built with ``dpkg-deb``, arm64, nothing compiled)."""
    if shutil.which("dpkg-deb") is None:
        raise BootError("dpkg-deb not found (apt: dpkg)")
    version = f"{tensorrt}.30-1+cuda12.6"
    debs = []
    module = f'''"""STAND-IN for TensorRT {tensorrt}'s Python bindings on the emulated board. NOT TensorRT.

Installed where JetPack's python3-libnvinfer puts them, so the board's TensorRT is importable and
reports its version; every TensorRT API raises. Engines on this board come from cuvil-edge's
stand-in builder and are served by its stand-in runtime.
"""

__version__ = "{tensorrt}"


def __getattr__(name):
    raise AttributeError(f"tensorrt.{{name}}: this is a STAND-IN for TensorRT {tensorrt} on an emulated board "
                         "(no TensorRT API, no GPU)")
'''
    trtexec = ("#!/bin/sh\n# STAND-IN for trtexec on the emulated board (not TensorRT): cuvil-edge's labelled builder.\n"
               f"exec python3 -m cuvil_edge.packager.engine_standin --standin-tensorrt={tensorrt} \"$@\"\n")
    packages = {
        "python3-libnvinfer": ({
            "usr/lib/python3/dist-packages/tensorrt/__init__.py": module,
            f"usr/lib/python3/dist-packages/tensorrt-{tensorrt}.dist-info/METADATA":
                f"Metadata-Version: 2.1\nName: tensorrt\nVersion: {tensorrt}\n"
                "Summary: STAND-IN for TensorRT's Python bindings (cuvil-edge HIL rig)\n",
            f"usr/lib/python3/dist-packages/tensorrt-{tensorrt}.dist-info/INSTALLER": "debian\n",
            "usr/src/tensorrt/bin/trtexec": trtexec,
        }, ""),
        "tensorrt": ({}, f"Depends: python3-libnvinfer (= {version})\n"),
    }
    for name, (files, depends) in packages.items():
        root = out_dir / name
        (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: arm64\nMaintainer: cuvil-edge HIL rig\n"
            f"{depends}Section: multiverse/devel\nPriority: optional\n"
            f"Description: STAND-IN for JetPack's {name} {tensorrt} (cuvil-edge HIL rig, not TensorRT)\n")
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o755 if rel.endswith("trtexec") else 0o644)
        deb = out_dir / f"{name}_{version}_arm64.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                       capture_output=True, timeout=120)
        debs.append(deb)
    return debs


def _get(board: str) -> Personality:
    if board not in PERSONALITIES:
        raise HilError(f"no Jetson personality for board '{board}'; known: {', '.join(sorted(PERSONALITIES))}")
    return PERSONALITIES[board]


def personality_dtb(board: str, run_dir: Path, dump_argv: Callable[[Path], list[str]]) -> Path:
    """QEMU's device tree for this VM with the board's model and compatible strings.

    Args:
        board (str): board profile.
        run_dir (Path): where the ``.dtb`` goes.
        dump_argv (Callable[[Path], list[str]]): the VM's own QEMU command line with
            ``dumpdtb=<path>`` (the tree must match the VM's memory, CPUs and devices).
    """
    p = _get(board)
    if shutil.which("fdtput") is None:
        raise BootError("fdtput not found: run scripts/bootstrap.sh test (apt: device-tree-compiler)")
    dtb = run_dir / "board.dtb"
    res = subprocess.run(dump_argv(dtb), capture_output=True, text=True, timeout=60)
    if not dtb.is_file():
        raise BootError(f"QEMU did not dump its device tree ({res.returncode}): {res.stderr.strip()[-400:]}")
    for argv in (["fdtput", "-t", "s", str(dtb), "/", "model", p.model],
                 ["fdtput", "-t", "s", str(dtb), "/", "compatible", *p.compatible]):
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return dtb


def board_figures(board: str) -> dict[str, object]:
    """The profile's data-sheet figures the tegrastats stand-in synthesizes from."""
    from cuvil_edge.targets import get_target

    t = get_target(board)
    f = t.figures
    if f is None:
        raise HilError(f"board '{board}' has no clocks_power figures in targets.toml")
    return {"board": board, "rails": list(f.rails), "gpu_max_mhz": f.gpu_max_mhz, "cpu_max_mhz": f.cpu_max_mhz,
            "emc_max_mhz": f.emc_max_mhz, "idle_mw": f.idle_mw, "max_mw": f.max_mw}


def apply_personality(board: Board, name: str) -> None:
    """Plants the L4T 36 personality on a booted board (see the module docstring)."""
    import json
    import tempfile

    from cuvil_edge.targets import get_target

    p = _get(name)
    release = next(r for r in get_target(name).releases if r.jetpack == p.jetpack)
    board.ssh("mkdir -p /usr/share/cuvil-hil /usr/lib/cuvil-hil && groupadd -f video && groupadd -f render "
              "&& groupadd -f -r jtop")
    board.ssh("cat > /usr/share/cuvil-hil/tegrastats.json", input=json.dumps(board_figures(name)) + "\n")
    board.put(HERE / "standins" / "tegrastats", "/usr/bin/tegrastats")
    board.ssh("chmod 755 /usr/bin/tegrastats && cat > /etc/nv_tegra_release", input=p.nv_tegra_release)
    board.ssh("cat > /usr/lib/cuvil-hil/l4t-nodes.sh && chmod 755 /usr/lib/cuvil-hil/l4t-nodes.sh",
              input=nodes_script())
    board.ssh("cat > /etc/systemd/system/cuvil-hil-l4t-nodes.service && systemctl daemon-reload "
              "&& systemctl enable --now cuvil-hil-l4t-nodes.service", input=NODES_UNIT, timeout=300)
    with tempfile.TemporaryDirectory(prefix="cuvil-hil-debs-") as tmp:
        debs = tensorrt_debs(Path(tmp), release.tensorrt)
        for deb in debs:
            board.put(deb, f"/tmp/{deb.name}")
        board.ssh(["dpkg", "-i", *[f"/tmp/{d.name}" for d in debs]], timeout=600)
        board.ssh(["rm", "-f", *[f"/tmp/{d.name}" for d in debs]])
