"""Importing TensorRT and pycuda on the board, and TensorRT's installed version.

Both are optional (``pip install cuvil-edge[jetson]``, or JetPack's apt packages) and import only
where used, so ``import cuvil_edge`` and the daemon's ONNX Runtime path work on any machine; a
missing one raises :class:`TensorRTMissing` saying what to install.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from cuvil_edge._optional import optional_import
from cuvil_edge.errors import CuvilEdgeError

__all__ = ["TensorRTMissing", "import_pycuda", "import_tensorrt", "installed_tensorrt_version"]

# TensorRT comes from JetPack's apt packages into the system Python (PyPI's tensorrt refuses Tegra);
# the jetson extra carries pycuda only, which builds on the board with CUDA_ROOT set.
_INSTALL_HINT = ("sudo apt install python3-libnvinfer (JetPack's TensorRT; a venv sees it when made with "
                 "--system-site-packages) and CUDA_ROOT=/usr/local/cuda pip install cuvil-edge[jetson] (pycuda)")


class TensorRTMissing(CuvilEdgeError):
    """TensorRT (or pycuda) is not importable here; the message says what to install."""


def import_tensorrt() -> Any:
    """``import tensorrt``, or TensorRTMissing naming ``pip install cuvil-edge[jetson]``."""
    return optional_import("tensorrt", needed_for="the TensorRT backend (TensorRT is not installed here)",
                           install=f"on the device run: {_INSTALL_HINT}", error=TensorRTMissing)


def import_pycuda() -> Any:
    """``import pycuda.driver``, or TensorRTMissing naming ``pip install cuvil-edge[jetson]``."""
    return optional_import("pycuda.driver", needed_for="the TensorRT backend (pycuda is not installed here)",
                           install=f"on the device run: {_INSTALL_HINT}", error=TensorRTMissing)


def installed_tensorrt_version() -> str:
    """TensorRT's version here, from package metadata when present (cheap), else from the module.

    JetPack's apt package (``python3-libnvinfer``) may install the module without pip metadata.

    Raises:
        TensorRTMissing: TensorRT is not installed.
    """
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return str(import_tensorrt().__version__)
