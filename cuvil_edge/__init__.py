"""cuvil-edge: package, quantize, sign, serve and deploy models on Jetson and other ARM boards."""

from __future__ import annotations

from cuvil_edge.errors import (
    AccuracyError,
    BundleError,
    CuvilEdgeError,
    DaemonError,
    DataError,
    DeployError,
    InternalError,
    KernelError,
    ModelError,
    QuantizationError,
    RecipeError,
    SignatureError,
    TargetError,
    TelemetryError,
)

__version__ = "0.1.0"

__all__ = [
    "AccuracyError",
    "BundleError",
    "CuvilEdgeError",
    "DaemonError",
    "DataError",
    "DeployError",
    "InternalError",
    "KernelError",
    "ModelError",
    "QuantizationError",
    "RecipeError",
    "SignatureError",
    "TargetError",
    "TelemetryError",
    "__version__",
]
