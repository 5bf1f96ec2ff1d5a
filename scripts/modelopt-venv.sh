#!/usr/bin/env bash
# A virtual environment with NVIDIA Model Optimizer's ONNX INT8 quantizer, CPU only, for
# `--quantizer modelopt` and the bench's Model Optimizer column:
#   scripts/modelopt-venv.sh [DIR]     (default .modelopt-venv; then
#   export CUVIL_EDGE_MODELOPT_PYTHON=DIR/bin/python)
# The smallest set that makes `modelopt.onnx.quantization.quantize` run with ONNX Runtime's CPU
# provider: `nvidia-modelopt[onnx]` would pull cupy-cuda12x and onnxruntime-gpu on x86 (and a CUDA
# PyTorch). modelopt imports torch at module level (qdq_utils), so torch is needed: a CPU-only wheel
# (`torch==2.13.0+cpu`) where a wheel source provides one, else PyPI's torch without its CUDA
# libraries (--no-deps). About 1.4 GiB installed.
set -euo pipefail
dir="${1:-.modelopt-venv}"
PY="${PYTHON:-python3}"
[ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
pip=("$dir/bin/python" -m pip install -q)
"${pip[@]}" --no-deps nvidia-modelopt==0.47.0
"${pip[@]}" --no-deps "torch==2.13.0+cpu" 2>/dev/null || "${pip[@]}" --no-deps "torch==2.13.0"
"${pip[@]}" numpy packaging tqdm pyyaml omegaconf "pulp<4" "pydantic>=2" regex rich safetensors scipy ml_dtypes \
  "onnx-graphsurgeon>=0.6.1" "onnx~=1.21.0" "onnxconverter-common~=1.16.0" "onnxruntime~=1.24.2" onnxscript \
  "onnxslim>=0.1.76" "polygraphy>=0.53.4" nvidia-ml-py "setuptools>=80" lief cppimport \
  filelock typing-extensions sympy networkx jinja2 fsspec
"$dir/bin/python" -c "from modelopt.onnx.quantization import quantize; import modelopt; print('modelopt', modelopt.__version__)"
echo "==> export CUVIL_EDGE_MODELOPT_PYTHON=$(cd "$dir" && pwd)/bin/python"
