"""INT8 with NVIDIA's Model Optimizer (``--quantizer modelopt``): TensorRT's own reference form.

ModelOpt (``nvidia-modelopt[onnx]``, the ``cuvil-edge[modelopt]`` extra) places Q/DQ where TensorRT
fuses them and keeps biases in float; it is NVIDIA's quantizer for TensorRT, so its output is the
reference our own TensorRT form is checked against (``bench/bench_packager.py`` runs both).

It pulls PyTorch and, on x86, ``onnxruntime-gpu``, which replaces ``onnxruntime``'s module in the
environment it is installed into. So it is never a core dependency, and it can live in a virtual
environment of its own: set ``CUVIL_EDGE_MODELOPT_PYTHON`` to that environment's interpreter. The
quantization always runs in a subprocess, on files (this interpreter when the variable is unset), so
ModelOpt's imports never touch the packager's own ONNX Runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from cuvil_edge.errors import QuantizationError
from cuvil_edge.packager.data import Dataset

__all__ = ["MODELOPT_METHODS", "modelopt_available", "quantize_with_modelopt"]

# Our calibration method names -> ModelOpt's.
MODELOPT_METHODS = {"minmax": "max", "entropy": "entropy", "percentile": "max"}

_RUNNER = r"""
import sys, numpy as np
from modelopt.onnx.quantization import quantize
src, data, out, method = sys.argv[1:5]
with np.load(data) as npz:
    calibration = {k: npz[k] for k in npz.files}
quantize(onnx_path=src, quantize_mode="int8", calibration_data=calibration, calibration_method=method,
         calibration_eps=["cpu"], high_precision_dtype="fp32", output_path=out, log_level="ERROR")
"""


def modelopt_available() -> tuple[bool, str]:
    """(available, how): ModelOpt importable here, or an interpreter named by CUVIL_EDGE_MODELOPT_PYTHON."""
    python = os.environ.get("CUVIL_EDGE_MODELOPT_PYTHON")
    if python:
        return Path(python).is_file(), f"subprocess {python}"
    try:
        import modelopt.onnx.quantization  # noqa: F401
    except ImportError:
        return False, "not installed"
    return True, "in process"


def quantize_with_modelopt(model: onnx.ModelProto, calibration: Dataset, method: str = "minmax",
                           timeout_s: float = 3600) -> onnx.ModelProto:
    """The model quantized to INT8 Q/DQ by ModelOpt, calibrated on ``calibration``.

    Raises:
        QuantizationError: ModelOpt missing (names the extra and the environment variable), ragged
            calibration data (ModelOpt takes one array per input), or ModelOpt failing.
    """
    ok, how = modelopt_available()
    if not ok:
        raise QuantizationError("--quantizer modelopt needs NVIDIA Model Optimizer: pip install 'cuvil-edge[modelopt]' "
                                "(or set CUVIL_EDGE_MODELOPT_PYTHON to a Python that has nvidia-modelopt[onnx])")
    if calibration.ragged:
        raise QuantizationError("--quantizer modelopt takes calibration samples of one shape per input; "
                                "these differ in size (use the default quantizer)")
    with tempfile.TemporaryDirectory(prefix="cuvil-modelopt-") as tmp:
        src, data, out = Path(tmp) / "fp32.onnx", Path(tmp) / "calib.npz", Path(tmp) / "int8.onnx"
        onnx.save(model, str(src))
        np.savez(data, **{k: np.asarray(v) for k, v in calibration.inputs.items()})
        python = os.environ.get("CUVIL_EDGE_MODELOPT_PYTHON") or sys.executable
        try:
            proc = subprocess.run([python, "-c", _RUNNER, str(src), str(data), str(out), MODELOPT_METHODS[method]],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise QuantizationError(f"ModelOpt did not finish within {timeout_s:.0f} s ({how})") from None
        if proc.returncode != 0 or not out.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise QuantizationError(f"ModelOpt failed ({how}): {last}")
        return onnx.load(str(out))
