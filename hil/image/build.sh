#!/usr/bin/env bash
# Build the emulated arm64 board of the HIL rig from Debian's and PyPI's packages only.
#   hil/image/build.sh OUT_DIR
# OUT_DIR receives: disk.raw (ext4 root file system), vmlinuz, initrd.img, id_ed25519(.pub)
# (the key the rig logs in with), kernel.txt, manifest.json. The caller (hil/images.py) names
# OUT_DIR by the hash of this folder's files and renames it into place only on success.
#
# Fast cold build: apt resolves and downloads natively (mmdebstrap); only dpkg and the
# maintainer scripts (configuring systemd, sshd, python3) run under qemu-user. The kernel .deb
# is unpacked on the host (no mkinitramfs under emulation), the initramfs is a tiny busybox
# cpio built natively, and the Python wheels go in with host pip --target. Lines starting with "==> " name the steps (the caller shows them
# as progress).
#
# Needs root (chroot, binfmt_misc, device nodes) and: mmdebstrap qemu-user-static
# e2fsprogs cpio kmod curl python3 (scripts/bootstrap.sh test installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="${1:?usage: build.sh OUT_DIR}"
suite=bookworm
mirror="${CUVIL_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2>/dev/null \
           | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)
fi
mirror="${mirror:-http://deb.debian.org/debian}"
mirror="${mirror%/}"
pip_py="${CUVIL_HIL_PIP_PYTHON:-python3}"

for tool in mmdebstrap qemu-aarch64-static mkfs.ext4 cpio depmod curl chroot; do
  command -v "$tool" >/dev/null || { echo "build.sh: '$tool' missing: run scripts/bootstrap.sh test" >&2; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "build.sh: needs root (debootstrap, chroot)" >&2; exit 3; }

mkdir -p "$out"
root="$out/root"
cleanup() {
  for m in proc sys dev/pts dev; do umount "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "==> mmdebstrap (apt on the host, dpkg and maintainer scripts emulated)"
pkgs=$(grep -vE '^\s*(#|$)' "$here/packages.txt" | paste -sd, -)
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if ! ls /proc/sys/fs/binfmt_misc/ | grep -q aarch64; then
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi
mmdebstrap --mode=root --arch=arm64 --variant=minbase --include="$pkgs" --skip=cleanup/apt/lists \
  --aptopt='Acquire::Retries "3"' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  "$suite" "$root" "$mirror" >"$out/mmdebstrap.log" 2>&1 || { tail -n 30 "$out/mmdebstrap.log" >&2; exit 4; }

echo "==> fetch kernel and busybox (host)"
lists=$(ls "$root"/var/lib/apt/lists/*binary-arm64_Packages | head -n1)
fetch_urls=$(python3 - "$lists" <<'PY'
import re, sys
paras = open(sys.argv[1], encoding="utf-8").read().split("\n\n")
pkgs = {}
for p in paras:
    f = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", p, re.M))
    if "Package" in f:
        pkgs[f["Package"]] = f
meta = pkgs["linux-image-arm64"]["Depends"]
kpkg = re.search(r"(linux-image-[0-9][^ ,]*-arm64)\b", meta).group(1)
for name in (kpkg, "busybox-static"):
    print(name, pkgs[name]["Filename"], pkgs[name]["SHA256"])
PY
)
mkdir -p "$out/debs"
while read -r name path sha; do
  deb="$out/debs/$name.deb"
  curl -fsSL --retry 3 -o "$deb" "$mirror/$path"
  echo "$sha  $deb" | sha256sum -c --quiet - || { echo "build.sh: $name: checksum mismatch" >&2; exit 5; }
done <<< "$fetch_urls"

echo "==> kernel modules and initramfs (host)"
kx="$out/kernel"
dpkg-deb -x "$out/debs/$(sed -n 1p <<< "$fetch_urls" | cut -d' ' -f1).deb" "$kx"
kver=$(ls "$kx/lib/modules" 2>/dev/null || ls "$kx/usr/lib/modules")
kmods=$( [ -d "$kx/lib/modules" ] && echo "$kx/lib/modules/$kver" || echo "$kx/usr/lib/modules/$kver")
kbase="${kmods%/lib/modules/*}"
depmod -b "$kbase" "$kver"
mkdir -p "$root/usr/lib/modules"
# The board's modules, without the driver families no virt machine has (smaller image).
(cd "$kmods/.." && tar --exclude="$kver/kernel/drivers/gpu" --exclude="$kver/kernel/drivers/media" \
   --exclude="$kver/kernel/drivers/staging" --exclude="$kver/kernel/drivers/infiniband" \
   --exclude="$kver/kernel/drivers/net/wireless" --exclude="$kver/kernel/sound" -cf - "$kver") \
  | tar -C "$root/usr/lib/modules" -xf -
depmod -b "$root/usr" "$kver" 2>/dev/null || depmod -b "$root" "$kver"
cp "$kx/boot/vmlinuz-$kver" "$out/vmlinuz"
bb="$out/busybox"
dpkg-deb -x "$out/debs/busybox-static.deb" "$bb"
ird="$out/initramfs"
python3 "$here/initramfs.py" "$kbase" "$kver" "$bb/bin/busybox" "$ird"
(cd "$ird" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet | gzip -1) > "$out/initrd.img"
echo "$kver" > "$out/kernel.txt"
rm -rf "$kx" "$bb" "$ird"

echo "==> configure the board (host)"
echo cuvil-board > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 cuvil-board\n::1 localhost ip6-localhost\n' > "$root/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' > "$root/etc/fstab"
mkdir -p "$root/etc/systemd/network" "$root/etc/systemd/journald.conf.d" "$root/root/.ssh"
printf '[Match]\nName=e*\n\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/20-wired.network"
printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/volatile.conf"
printf 'nameserver 10.0.2.3\n' > "$root/etc/resolv.conf"
rm -f "$out/id_ed25519" "$out/id_ed25519.pub"
ssh-keygen -q -t ed25519 -N '' -C cuvil-hil -f "$out/id_ed25519"
# A stock JetPack board logs in as a normal user with sudo (oem-config's user; `nvidia` on NVIDIA's
# images), never as root: root SSH is refused, the rig's key opens `nvidia`, whose sudo asks no
# password. NOPASSWD is the RIG's choice (a stock board's sudo asks for the password oem-config
# set): every root step of the project goes through `sudo -n`, which a password would stop. The
# second user, `jetson`, is in the sudo group with a password, as a stock board's user is: the rig
# checks that the project says so in one line instead of hanging at a prompt.
chroot "$root" /usr/sbin/useradd -m -u 1000 -s /bin/bash -G sudo nvidia
chroot "$root" /usr/sbin/useradd -m -u 1001 -s /bin/bash -G sudo jetson
echo 'jetson:jetson-hil' | chroot "$root" /usr/sbin/chpasswd
printf '# cuvil-edge HIL rig: passwordless sudo for the login user (the RIG'"'"'s choice; a stock\n# JetPack board asks for the password). Every root step of the project runs through sudo -n.\nnvidia ALL=(ALL:ALL) NOPASSWD: ALL\n' \
  > "$root/etc/sudoers.d/90-cuvil-hil-nvidia"
chmod 440 "$root/etc/sudoers.d/90-cuvil-hil-nvidia"
chroot "$root" /usr/sbin/visudo -c -q
mkdir -p "$root/etc/ssh/sshd_config.d"
printf '# cuvil-edge HIL rig: as a stock JetPack board, no root login over SSH\nPermitRootLogin no\n' \
  > "$root/etc/ssh/sshd_config.d/10-cuvil-hil.conf"
for u in nvidia jetson; do
  install -d -m 700 -o "$(stat -c %u "$root/home/$u")" -g "$(stat -c %g "$root/home/$u")" "$root/home/$u/.ssh"
  install -m 600 -o "$(stat -c %u "$root/home/$u")" -g "$(stat -c %g "$root/home/$u")" "$out/id_ed25519.pub" \
    "$root/home/$u/.ssh/authorized_keys"
done
# The rig checks the board's host key (made by openssh-server's postinst) instead of ignoring it.
cp "$root/etc/ssh/ssh_host_ed25519_key.pub" "$out/host_key.pub"
chmod 700 "$root/root/.ssh"
# Enabled and masked the way `systemctl enable/mask` would (no emulation needed for links).
wants="$root/etc/systemd/system/multi-user.target.wants"
mkdir -p "$wants" "$root/etc/systemd/system/sockets.target.wants" "$root/etc/systemd/system/network-online.target.wants"
ln -sfn /lib/systemd/system/systemd-networkd.service "$wants/systemd-networkd.service"
ln -sfn /lib/systemd/system/systemd-networkd.socket "$root/etc/systemd/system/sockets.target.wants/systemd-networkd.socket"
ln -sfn /lib/systemd/system/ssh.service "$wants/ssh.service"
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer \
            systemd-networkd-wait-online.service; do
  ln -sfn /dev/null "$root/etc/systemd/system/$unit"
done
passwd_line=$(grep '^root:' "$root/etc/shadow")
sed -i 's/^root:[^:]*:/root::/' "$root/etc/shadow"  # console login without a password (debugging)
[ -n "$passwd_line" ]

echo "==> Python wheels (host pip, aarch64)"
site="$root/usr/local/lib/python3.11/dist-packages"
mkdir -p "$site"
"$pip_py" -m pip install -q --no-compile --disable-pip-version-check --target "$site" \
  --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
  --python-version 3.11 --implementation cp --only-binary=:all: --no-deps \
  -r "$here/requirements-aarch64.txt" >"$out/pip.log" 2>&1 || { tail -n 20 "$out/pip.log" >&2; exit 7; }
rm -rf "$site/bin"

echo "==> check the board's Python (emulated)"
chroot "$root" /usr/bin/python3 -c 'import numpy, onnxruntime, onnx, typer, rich, cryptography, httptools, asyncssh, pip; print("python ok", numpy.__version__, onnxruntime.__version__)'
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale "$out/debs"

echo "==> file system image (host)"
trap - EXIT
cleanup
truncate -s 6G "$out/disk.raw"
mkfs.ext4 -q -F -L cuvil-root -d "$root" "$out/disk.raw"
systemd_version=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' systemd)
python3 - "$out" "$kver" "$systemd_version" "$suite" <<'PY'
import json, sys
out, kver, sd, suite = sys.argv[1:]
json.dump({"kernel": kver, "systemd_package": sd, "suite": suite, "arch": "aarch64", "login_user": "nvidia"},
          open(f"{out}/manifest.json", "w"), indent=1)
PY
rm -rf "$root"
echo "==> done"
