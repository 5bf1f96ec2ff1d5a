#!/usr/bin/env bash
# Build libcuvil_sve and its self-test.
#   cross/build.sh host      -> build/host/{libcuvil_sve.so,cuvil_sve_selftest}, copied into
#                               cuvil_edge/sve/_lib/linux-<machine>/ so the package imports it
#   cross/build.sh aarch64   -> build/aarch64/{libcuvil_sve.so,cuvil_sve_selftest,cuvil_sve_bench} (Debian's
#                               aarch64-linux-gnu cross gcc), copied into cuvil_edge/sve/_lib/linux-aarch64/
# Installs missing Debian packages when run as root. Idempotent and quiet: skips the build
# when sources and flags are unchanged; prints the compiler log only on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
arch="${1:-}"
src="$root/cuvil_edge/sve"
case "$arch" in
  host)
    bdir="$root/build/host"
    plat="linux-$(uname -m)"
    need=(cmake gcc make)
    pkgs="cmake build-essential"
    cmake_args=()
    ;;
  aarch64)
    bdir="$root/build/aarch64"
    plat="linux-aarch64"
    need=(cmake aarch64-linux-gnu-gcc make)
    pkgs="cmake make gcc-aarch64-linux-gnu"
    cmake_args=(-DCMAKE_TOOLCHAIN_FILE="$root/cross/aarch64-linux-gnu.toolchain.cmake")
    ;;
  *)
    echo "usage: cross/build.sh host|aarch64" >&2
    exit 2
    ;;
esac

missing=0
for tool in "${need[@]}"; do command -v "$tool" >/dev/null || missing=1; done
if [ "$missing" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  else
    echo "cross/build.sh: missing tools; run: sudo apt-get install $pkgs" >&2
    exit 3
  fi
fi

# Up-to-date check: hash of every input (sources, CMake files, this script).
sum=$(cd "$root" && find cross/build.sh cross/aarch64-linux-gnu.toolchain.cmake "$src/CMakeLists.txt" \
        "$src/include" "$src/src" -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.sh' \
        -o -name '*.cmake' -o -name '*.txt' \) | LC_ALL=C sort | xargs cat | sha256sum | cut -d' ' -f1)
stamp="$bdir/.cuvil-build-stamp"
dest="$src/_lib/$plat"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -f "$bdir/libcuvil_sve.so" ] \
   && [ -f "$bdir/cuvil_sve_selftest" ] && [ -f "$bdir/cuvil_sve_bench" ] && cmp -s "$bdir/libcuvil_sve.so" "$dest/libcuvil_sve.so"; then
  exit 0
fi

mkdir -p "$bdir"
log="$bdir/build.log"
if ! { cmake -S "$src" -B "$bdir/cmake" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" \
       && cmake --build "$bdir/cmake" -j "$(nproc)"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "cross/build.sh: $arch build failed (log: $log)" >&2
  exit 1
fi
cp "$bdir/cmake/libcuvil_sve.so" "$bdir/libcuvil_sve.so.tmp" && mv "$bdir/libcuvil_sve.so.tmp" "$bdir/libcuvil_sve.so"
for exe in cuvil_sve_selftest cuvil_sve_bench; do
  cp "$bdir/cmake/$exe" "$bdir/$exe.tmp" && mv "$bdir/$exe.tmp" "$bdir/$exe"
done
mkdir -p "$dest"
cp "$bdir/libcuvil_sve.so" "$dest/libcuvil_sve.so.tmp" && mv "$dest/libcuvil_sve.so.tmp" "$dest/libcuvil_sve.so"
echo "$sum" >"$stamp"
