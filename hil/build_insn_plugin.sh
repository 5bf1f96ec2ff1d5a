#!/usr/bin/env bash
# Build QEMU's `insn` TCG plugin (dynamic instruction counts) for the installed qemu-aarch64.
#   hil/build_insn_plugin.sh [OUT_DIR]   default OUT_DIR: ~/.cache/cuvil-edge/qemu-plugins
# Debian ships no plugin binaries: fetch the qemu source package with a private deb-src list
# (the system's apt configuration is left alone), build tests/plugin/insn.c against
# include/qemu/qemu-plugin.h and glib (libglib2.0-dev). Idempotent: prints the path.
set -euo pipefail
out="${1:-$HOME/.cache/cuvil-edge/qemu-plugins}"
if [ -f "$out/libinsn.so" ]; then echo "$out/libinsn.so"; exit 0; fi
pkg-config --exists glib-2.0 || { echo "build_insn_plugin: libglib2.0-dev missing" >&2; exit 3; }
mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
           /etc/apt/sources.list.d/*.list 2>/dev/null | grep -oE 'https?://[^ ]+/debian/?' \
         | grep -v security | head -n1 || true)
mirror="${CUVIL_DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial"
echo "deb-src $mirror bookworm main" >"$work/sources.list"
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::State::Lists=$work/lists" -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" update -qq >/dev/null
(cd "$work" && apt-get "${opts[@]}" source --download-only -qq qemu >/dev/null)
orig=$(ls "$work"/qemu_*.orig.tar.* | head -n1)
tar -xf "$orig" -C "$work" --wildcards '*/tests/plugin/insn.c' '*/include/qemu/qemu-plugin.h'
src=$(dirname "$(dirname "$(find "$work" -path '*/tests/plugin/insn.c' | head -n1)")")
mkdir -p "$out"
gcc -O2 -fPIC -shared -I"$src/../include/qemu" -o "$out/libinsn.so.tmp" "$src/plugin/insn.c" \
  $(pkg-config --cflags --libs glib-2.0)
mv "$out/libinsn.so.tmp" "$out/libinsn.so"
echo "$out/libinsn.so"
