"""Importing TensorRT and pycuda on the board, and TensorRT's installed version.

Both are optional (``pip install cuvil-edge[jetson]``, or JetPack's apt packages) and import only
where used, so ``import cuvil_edge`` and the daemon's ONNX Runtime path work on any machine; a
missing one raises :class:`TensorRTMissing` saying what to install.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from cuvil_edge.errors import CuvilEdgeError

__all__ = ["TensorRTMissing", "import_pycuda", "import_tensorrt", "installed_tensorrt_version"]

_INSTALL_HINT = "pip install cuvil-edge[jetson] (JetPack also ships it: apt install python3-libnvinfer)"


class TensorRTMissing(CuvilEdgeError):
    """TensorRT (or pycuda) is not importable here; the message says what to install."""


def import_tensorrt() -> Any:
    """``import tensorrt``, or TensorRTMissing naming ``pip install cuvil-edge[jetson]``."""
    try:
        import tensorrt
    except ImportError as exc:
        raise TensorRTMissing(f"TensorRT is not installed here ({exc}); on the device run: {_INSTALL_HINT}") from exc
    return tensorrt


def import_pycuda() -> Any:
    """``import pycuda.driver``, or TensorRTMissing naming ``pip install cuvil-edge[jetson]``."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise TensorRTMissing(f"pycuda is not installed here ({exc}); on the device run: {_INSTALL_HINT}") from exc
    return cuda


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
