"""TensorRT Python plugins (``tensorrt.plugin``, TensorRT >= 10.6) for the specs in this package.

:func:`register` defines and registers them with TensorRT's plugin registry (once per process);
call it through :func:`cuvil_edge.trt_plugins.register_python_plugins`. The module itself imports
nothing from TensorRT, so it imports anywhere.

The descriptor functions (``@trtp.register``) state output shapes and types symbolically; the
implementations (``@trtp.impl``) run the arithmetic of :mod:`cuvil_edge.trt_plugins.kernels`
with CuPy on the stream TensorRT passes in, on TensorRT's own buffers (``trtp.Tensor`` exposes
``__cuda_array_interface__``), so nothing is copied.

Not runnable on the development machine (no TensorRT); the shape rules and the arithmetic are
tested there through :func:`cuvil_edge.trt_plugins.output_shapes` and ``kernels``.
"""

# No ``from __future__ import annotations``: tensorrt.plugin reads the annotations as types.

import threading
from typing import Any, Tuple  # noqa: UP035 - the tensorrt.plugin docs spell it Tuple

from cuvil_edge._optional import optional_import
from cuvil_edge.errors import ModelError
from cuvil_edge.trt_plugins import get_plugin, kernels

__all__ = ["register"]

_LOCK = threading.Lock()
_REGISTERED: Tuple[str, ...] = ()  # noqa: UP006


def _cupy() -> Any:
    return optional_import("cupy", needed_for="the cuvil-edge Python TensorRT plugins (they compute with CuPy)",
                           install="install the CuPy wheel matching the device's CUDA (e.g. cupy-cuda12x)",
                           error=ModelError)


def register() -> Tuple[str, ...]:  # noqa: UP006
    """Register ``cuvil::normalize_u8`` and ``cuvil::topk`` with TensorRT; returns their ids."""
    global _REGISTERED
    with _LOCK:
        if _REGISTERED:
            return _REGISTERED
        import numpy as np
        import numpy.typing as npt
        import tensorrt as trt
        import tensorrt.plugin as trtp

        normalize_id = get_plugin("normalize_u8").plugin_id
        topk_id = get_plugin("topk").plugin_id

        @trtp.register(normalize_id)
        def normalize_u8_desc(
            image: trtp.TensorDesc, mean: npt.NDArray[np.float32], std: npt.NDArray[np.float32]
        ) -> trtp.TensorDesc:
            """uint8 ``[N, H, W, C]`` -> float32 ``[N, C, H, W]``."""
            s = image.shape_expr
            return trtp.from_shape_expr(trtp.ShapeExprs.from_tuple((s[0], s[3], s[1], s[2])), dtype=trt.float32)

        @trtp.impl(normalize_id)
        def normalize_u8_impl(
            image: trtp.Tensor,
            mean: npt.NDArray[np.float32],
            std: npt.NDArray[np.float32],
            outputs: Tuple[trtp.Tensor],  # noqa: UP006
            stream: int,
        ) -> None:
            cp = _cupy()
            with cp.cuda.ExternalStream(stream):
                kernels.normalize_u8(cp, cp.asarray(image), cp.asarray(mean), cp.asarray(std), cp.asarray(outputs[0]))

        @trtp.register(topk_id)
        def topk_desc(logits: trtp.TensorDesc, k: int) -> Tuple[trtp.TensorDesc, trtp.TensorDesc]:  # noqa: UP006
            """float ``[N, classes]`` -> float32 values ``[N, k]`` and int32 indices ``[N, k]``."""
            shape = trtp.ShapeExprs.from_tuple((logits.shape_expr[0], k))
            return trtp.from_shape_expr(shape, dtype=trt.float32), trtp.from_shape_expr(shape, dtype=trt.int32)

        @trtp.impl(topk_id)
        def topk_impl(
            logits: trtp.Tensor, k: int, outputs: Tuple[trtp.Tensor, trtp.Tensor], stream: int  # noqa: UP006
        ) -> None:
            cp = _cupy()
            with cp.cuda.ExternalStream(stream):
                kernels.topk(cp, cp.asarray(logits), k, cp.asarray(outputs[0]), cp.asarray(outputs[1]))

        _REGISTERED = (normalize_id, topk_id)
        return _REGISTERED
