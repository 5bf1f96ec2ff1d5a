#!/usr/bin/env bash
# Build (once) a lean arm64 Debian root file system with python3 + numpy for qemu-user tests.
#   hil/make_rootfs.sh [DIR]    default DIR: ~/.cache/cuvil-edge/rootfs-arm64-bookworm
# The mirror is the one apt on this machine uses (first deb.debian.org-style URI in
# /etc/apt/sources.list(.d)), or $CUVIL_DEBIAN_MIRROR. Idempotent: a finished root file
# system carries a stamp file and is reused. Fails loudly (non-zero) when it cannot be made.
set -euo pipefail
dir="${1:-${CUVIL_ROOTFS:-$HOME/.cache/cuvil-edge/rootfs-arm64-bookworm}}"
stamp="$dir/.cuvil-rootfs-ok"
if [ -f "$stamp" ]; then exit 0; fi

mirror="${CUVIL_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2>/dev/null \
           | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)
fi
mirror="${mirror:-http://deb.debian.org/debian}"
for tool in debootstrap dpkg-deb qemu-aarch64-static; do
  command -v "$tool" >/dev/null || { echo "make_rootfs: '$tool' missing: run scripts/bootstrap.sh test (apt: debootstrap qemu-user-static)" >&2; exit 3; }
done

tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$(dirname "$dir")"
trap 'rm -rf "$tmp"' EXIT
echo "make_rootfs: debootstrap arm64 bookworm from $mirror into $dir" >&2
debootstrap --arch=arm64 --foreign --variant=minbase \
  --include=python3-minimal,python3,python3-numpy bookworm "$tmp" "$mirror" >"$tmp.log" 2>&1 \
  || { tail -n 20 "$tmp.log" >&2; echo "make_rootfs: first stage failed (mirror $mirror)" >&2; exit 4; }
# Second stage without emulation: qemu-user only needs the files, not maintainer scripts,
# so unpack every downloaded package natively (seconds instead of minutes under proot).
for deb in "$tmp"/var/cache/apt/archives/*.deb; do
  dpkg-deb -x "$deb" "$tmp" || { echo "make_rootfs: cannot unpack $deb" >&2; exit 5; }
done
# The links update-alternatives would make (numpy needs libblas.so.3 and liblapack.so.3).
for lib in blas lapack; do
  so="$tmp/usr/lib/aarch64-linux-gnu/lib$lib.so.3"
  [ -e "$so" ] || ln -sfn "$lib/lib$lib.so.3" "$so"
done
# qemu-user -L resolves absolute symlinks on the host: make them relative to the rootfs.
find "$tmp" -type l -lname '/*' | while read -r link; do
  target=$(readlink "$link")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$tmp$target")" "$link"
done
rm -f "$tmp.log"
# Lean: drop apt caches, docs and locales (not needed to run python3 + numpy).
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/usr/share/doc "$tmp"/usr/share/man "$tmp"/usr/share/locale
QEMU_LD_PREFIX="$tmp" qemu-aarch64-static "$tmp/usr/bin/python3" -c 'import numpy, ctypes; print(numpy.__version__)' >&2 \
  || { echo "make_rootfs: python3/numpy do not run in $tmp" >&2; exit 6; }
touch "$tmp/.cuvil-rootfs-ok"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
