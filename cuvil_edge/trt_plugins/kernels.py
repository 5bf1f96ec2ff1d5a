"""The plugins' arithmetic, written once for any array module (numpy here, CuPy on the device).

The Python plugins (:mod:`cuvil_edge.trt_plugins._python`) call these with CuPy arrays wrapping
TensorRT's buffers; tests call them with numpy against straightforward references. The CUDA
kernels in ``cpp/cuvil_kernels.cu`` compute the same values.
"""

from __future__ import annotations

from typing import Any

__all__ = ["normalize_u8", "topk"]


def normalize_u8(xp: Any, image: Any, mean: Any, std: Any, out: Any) -> Any:
    """``out[n, c, h, w] = (image[n, h, w, c] - mean[c]) / std[c]`` in float32.

    Args:
        xp: the array module (``numpy`` or ``cupy``).
        image: uint8 ``[N, H, W, C]``.
        mean: ``C`` floats.
        std: ``C`` floats, none zero.
        out: float32 ``[N, C, H, W]``, written in place and returned.
    """
    c = image.shape[3]
    inv = (1.0 / xp.asarray(std, dtype=xp.float32)).reshape(1, c, 1, 1)
    m = xp.asarray(mean, dtype=xp.float32).reshape(1, c, 1, 1)
    # Multiply by 1/std as the CUDA kernel does (one reciprocal per channel, not per pixel).
    xp.multiply(xp.subtract(image.transpose(0, 3, 1, 2).astype(xp.float32), m), inv, out=out)
    return out


def topk(xp: Any, logits: Any, k: int, values: Any, indices: Any) -> tuple[Any, Any]:
    """The ``k`` largest entries of each row, largest first; ties keep the lower index.

    Args:
        xp: the array module.
        logits: ``[N, classes]``.
        k (int): how many per row.
        values: float32 ``[N, k]`` output.
        indices: int32 ``[N, k]`` output.
    """
    x = logits.astype(xp.float32)
    # A stable sort of the negated values keeps the lower index first among equal values.
    order = xp.argsort(-x, axis=1, kind="stable")[:, :k]
    indices[...] = order.astype(xp.int32)
    values[...] = xp.take_along_axis(x, order, axis=1)
    return values, indices
