"""numpy wrappers of the C kernels: validate, allocate, call (the GIL is released), return."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from cuvil_edge.errors import KernelError
from cuvil_edge.sve._library import current_platform, get_library, load_library

__all__ = [
    "ISAS",
    "OPS",
    "Detections",
    "Letterbox",
    "cpu_info",
    "dequantize",
    "letterbox_rect",
    "nms",
    "normalize",
    "quantize",
    "resize_normalize",
    "select_isa",
    "set_num_threads",
    "softmax",
    "softmax_topk",
]

ISAS = ("scalar", "neon", "sve", "sve2")
OPS = ("normalize", "resize_normalize", "quantize", "dequantize", "softmax_topk", "nms")
_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
_CODES = {-1: "invalid argument", -2: "out of memory", -3: "ISA not available"}


class Letterbox(NamedTuple):
    """Where the resized image sits in the tensor: ``scale`` (tensor pixels per source pixel) and
    the rectangle ``x, y, w, h``. Map a box back with ``(bx - x) / scale``, ``(by - y) / scale``."""

    scale: float
    x: int
    y: int
    w: int
    h: int


class Detections(NamedTuple):
    """NMS output, in descending score order: ``boxes`` (M, 4) float32 x1, y1, x2, y2;
    ``scores`` (M,) float32; ``classes`` (M,) int32; ``indices`` (M,) int32 (input box index)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    indices: np.ndarray


def _check(rc: int, op: str) -> None:
    if rc < 0:
        lib, path = get_library()
        detail = lib.cuvil_init_message().decode() if rc == -3 else _CODES.get(rc, f"error {rc}")
        raise KernelError(f"{op}: {detail} ({path})")


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _floats3(name: str, v: float | Sequence[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32).reshape(-1)
    if a.size == 1:
        a = np.repeat(a, 3)
    if a.size != 3 or not np.all(np.isfinite(a)):
        raise KernelError(f"{name} must be one or three finite numbers, got {v!r}")
    return np.ascontiguousarray(a)


def _image(image: np.ndarray, op: str) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise KernelError(f"{op}: image must be a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise KernelError(f"{op}: image dtype must be uint8, got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise KernelError(f"{op}: image must be HWC with 3 channels (RGB or BGR), got shape {image.shape}")
    h, w, _ = image.shape
    if h and w and (image.strides[2] != 1 or image.strides[1] != 3 or image.strides[0] < 3 * w):
        raise KernelError(
            f"{op}: image pixels must be packed (strides (row>={3 * w}, 3, 1)), got strides {image.strides}: "
            "pass np.ascontiguousarray(image) or a row-cropped view")
    return image


def _out(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype, op: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray) or out.dtype != dtype:
        raise KernelError(f"{op}: out must be a {dtype} numpy array, got {getattr(out, 'dtype', type(out))}")
    if out.shape != tuple(shape):
        raise KernelError(f"{op}: out must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise KernelError(f"{op}: out must be C-contiguous and writeable")
    return out


def _out_chw(out: np.ndarray | None, h: int, w: int, dtype: np.dtype, op: str) -> np.ndarray:
    if out is not None and out.ndim == 4 and out.shape[0] == 1:
        _out(out, (1, 3, h, w), dtype, op)
        return out
    return _out(out, (3, h, w), dtype, op)


def _dtype(dtype: object, op: str) -> np.dtype:
    d = np.dtype(dtype)  # type: ignore[call-overload]
    if d not in _DTYPES:
        raise KernelError(f"{op}: dtype must be float32 or float16, got {d}")
    return d


def normalize(image: np.ndarray, mean: float | Sequence[float], std: float | Sequence[float], *,
              swap_rb: bool = False, dtype: object = np.float32, out: np.ndarray | None = None) -> np.ndarray:
    """Converts a uint8 HWC image to a normalized CHW tensor in one pass.

    ``out[c] = (image[..., c'] - mean[c]) * (1 / std[c])`` computed in float32 (float16 output rounds
    that value to nearest even); ``c' = 2 - c`` when ``swap_rb`` else ``c``.

    Args:
        image (np.ndarray): uint8 (H, W, 3), packed pixels, any row stride (row crops work).
        mean (float | Sequence[float]): per output channel, in pixel units.
        std (float | Sequence[float]): per output channel, in pixel units.
        swap_rb (bool): swap channels 0 and 2 (BGR input to RGB output or back). Defaults to False.
        dtype (np.dtype): float32 or float16. Defaults to float32.
        out (np.ndarray | None): preallocated C-contiguous (3, H, W) or (1, 3, H, W). Defaults to None.

    Returns:
        np.ndarray: the (3, H, W) tensor (``out`` when given).

    Raises:
        KernelError: bad shape, dtype, strides or parameters.
    """
    op = "normalize"
    image = _image(image, op)
    d = _dtype(dtype, op)
    m = _floats3("mean", mean)
    inv = (np.float32(1.0) / _floats3("std", std)).astype(np.float32)
    h, w, _ = image.shape
    res = _out_chw(out, h, w, d, op)
    lib, _ = get_library()
    _check(lib.cuvil_normalize(_ptr(image), h, w, image.strides[0] if h else 3 * w, int(swap_rb), _ptr(m),
                               _ptr(inv), _ptr(res), _DTYPES[d]), op)
    return res


def letterbox_rect(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> Letterbox:
    """Returns where a letterboxed image sits: aspect kept, centred, as YOLO preprocessing does.

    Args:
        src_hw (tuple[int, int]): source height and width.
        dst_hw (tuple[int, int]): tensor height and width.

    Returns:
        Letterbox: scale and rectangle.
    """
    (sh, sw), (dh, dw) = src_hw, dst_hw
    if sh <= 0 or sw <= 0 or dh <= 0 or dw <= 0:
        raise KernelError(f"letterbox sizes must be positive, got {src_hw} -> {dst_hw}")
    scale = min(dh / sh, dw / sw)
    w = min(dw, max(1, int(round(sw * scale))))
    h = min(dh, max(1, int(round(sh * scale))))
    return Letterbox(scale, (dw - w) // 2, (dh - h) // 2, w, h)


def resize_normalize(image: np.ndarray, size: tuple[int, int], mean: float | Sequence[float],
                     std: float | Sequence[float], *, swap_rb: bool = False, letterbox: bool = False,
                     pad_value: float | Sequence[float] = 114.0, dtype: object = np.float32,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Bilinear resize fused with normalization: one read of the frame, one write of the tensor.

    Sampling follows ``cv2.resize(..., interpolation=cv2.INTER_LINEAR)`` (half-pixel centres, edge
    clamp) but in float32, so values are within rounding of OpenCV's fixed-point result, not equal.
    With ``letterbox`` the image keeps its aspect ratio, centred (see :func:`letterbox_rect`), and the
    border is ``pad_value`` (pixel units) normalized like the pixels.

    Args:
        image (np.ndarray): uint8 (H, W, 3), packed pixels, any row stride.
        size (tuple[int, int]): output (height, width).
        mean (float | Sequence[float]): per output channel, pixel units.
        std (float | Sequence[float]): per output channel, pixel units.
        swap_rb (bool): swap channels 0 and 2. Defaults to False.
        letterbox (bool): keep aspect ratio and pad. Defaults to False.
        pad_value (float | Sequence[float]): border colour, output channel order. Defaults to 114.
        dtype (np.dtype): float32 or float16. Defaults to float32.
        out (np.ndarray | None): preallocated C-contiguous (3, h, w) or (1, 3, h, w). Defaults to None.

    Returns:
        np.ndarray: the (3, h, w) tensor.

    Raises:
        KernelError: bad shape, dtype, strides, size or parameters.
    """
    op = "resize_normalize"
    image = _image(image, op)
    d = _dtype(dtype, op)
    try:
        dh, dw = (int(size[0]), int(size[1]))
    except (TypeError, ValueError, IndexError) as exc:
        raise KernelError(f"{op}: size must be (height, width), got {size!r}") from exc
    if dh <= 0 or dw <= 0:
        raise KernelError(f"{op}: size must be positive, got {size!r}")
    h, w, _ = image.shape
    if h == 0 or w == 0:
        raise KernelError(f"{op}: image is empty (shape {image.shape})")
    m = _floats3("mean", mean)
    inv = (np.float32(1.0) / _floats3("std", std)).astype(np.float32)
    if letterbox:
        lb = letterbox_rect((h, w), (dh, dw))
        pad = ((_floats3("pad_value", pad_value) - m) * inv).astype(np.float32)
        rect = (lb.x, lb.y, lb.w, lb.h)
    else:
        pad = np.zeros(3, np.float32)
        rect = (0, 0, dw, dh)
    res = _out_chw(out, dh, dw, d, op)
    lib, _ = get_library()
    _check(lib.cuvil_resize_normalize(_ptr(image), h, w, image.strides[0], int(swap_rb), _ptr(m), _ptr(inv),
                                      _ptr(res), _DTYPES[d], dh, dw, *rect, _ptr(pad)), op)
    return res


def _scales(scale: float | Sequence[float] | np.ndarray, x: np.ndarray, axis: int | None,
            op: str) -> tuple[np.ndarray, int, int, int]:
    s = np.ascontiguousarray(np.asarray(scale, dtype=np.float32).reshape(-1))
    if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise KernelError(f"{op}: scale must be positive finite numbers, got {scale!r}")
    if axis is None:
        if s.size != 1:
            raise KernelError(f"{op}: {s.size} scales need axis= (per-channel), or give one scale")
        return s, x.size, 1, 1
    if x.ndim == 0:
        raise KernelError(f"{op}: per-channel needs an array with axes, got a scalar")
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise KernelError(f"{op}: axis {axis} out of range for shape {x.shape}")
    ch = x.shape[ax]
    if s.size == 1:
        s = np.repeat(s, ch)
    if s.size != ch:
        raise KernelError(f"{op}: {s.size} scales for axis {axis} of length {ch} (shape {x.shape})")
    outer = int(np.prod(x.shape[:ax], dtype=np.int64))
    inner = int(np.prod(x.shape[ax + 1:], dtype=np.int64))
    return s, outer, ch, inner


def _contig(x: np.ndarray, dtype: np.dtype, op: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != dtype:
        raise KernelError(f"{op}: input must be a {dtype} numpy array, got {getattr(x, 'dtype', type(x))}")
    if not x.flags.c_contiguous:
        raise KernelError(f"{op}: input must be C-contiguous (use np.ascontiguousarray)")
    return x


def quantize(x: np.ndarray, scale: float | Sequence[float] | np.ndarray, *, axis: int | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> int8 symmetric quantization (zero point 0), as ONNX ``QuantizeLinear``.

    ``q = clip(round_half_even(x / scale), -128, 127)``; NaN gives 0.

    Args:
        x (np.ndarray): float32, C-contiguous.
        scale (float | Sequence[float] | np.ndarray): one scale (per tensor) or one per index of ``axis``.
        axis (int | None): the channel axis for per-channel scales. Defaults to None (per tensor).
        out (np.ndarray | None): preallocated int8 array of x's shape. Defaults to None.

    Returns:
        np.ndarray: int8 array of x's shape.

    Raises:
        KernelError: bad dtype, layout, scales or axis.
    """
    op = "quantize"
    x = _contig(x, np.dtype(np.float32), op)
    s, outer, ch, inner = _scales(scale, x, axis, op)
    res = _out(out, x.shape, np.dtype(np.int8), op)
    lib, _ = get_library()
    _check(lib.cuvil_quantize(_ptr(x), _ptr(res), outer, ch, inner, _ptr(s)), op)
    return res


def dequantize(q: np.ndarray, scale: float | Sequence[float] | np.ndarray, *, axis: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
    """int8 -> float32, ``y = q * scale`` (ONNX ``DequantizeLinear`` with zero point 0).

    Args:
        q (np.ndarray): int8, C-contiguous.
        scale (float | Sequence[float] | np.ndarray): one scale or one per index of ``axis``.
        axis (int | None): channel axis for per-channel scales. Defaults to None.
        out (np.ndarray | None): preallocated float32 array of q's shape. Defaults to None.

    Returns:
        np.ndarray: float32 array of q's shape.

    Raises:
        KernelError: bad dtype, layout, scales or axis.
    """
    op = "dequantize"
    q = _contig(q, np.dtype(np.int8), op)
    s, outer, ch, inner = _scales(scale, q, axis, op)
    res = _out(out, q.shape, np.dtype(np.float32), op)
    lib, _ = get_library()
    _check(lib.cuvil_dequantize(_ptr(q), _ptr(res), outer, ch, inner, _ptr(s)), op)
    return res


def _rows(x: np.ndarray, op: str) -> tuple[np.ndarray, int, int, int]:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise KernelError(f"{op}: input must be a float32 numpy array, got {getattr(x, 'dtype', type(x))}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise KernelError(f"{op}: input needs a non-empty last axis, got shape {x.shape}")
    n = x.shape[-1]
    x2 = x.reshape(-1, n) if x.ndim != 2 else x
    if x2.strides[1] != 4 or (x2.shape[0] > 1 and x2.strides[0] < 4 * n):
        x2 = np.ascontiguousarray(x2)
    stride = x2.strides[0] if x2.shape[0] > 1 else 4 * n
    return x2, x2.shape[0], n, stride


def softmax_topk(x: np.ndarray, k: int, *, probs_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Numerically stable softmax over the last axis and its top ``k``.

    Args:
        x (np.ndarray): float32 logits (..., n); rows may be strided.
        k (int): how many, 0 <= k <= n.
        probs_out (np.ndarray | None): float32 C-contiguous array of x's shape that receives the full
            softmax. Defaults to None (not kept).

    Returns:
        tuple[np.ndarray, np.ndarray]: top-k probabilities (..., k) float32, descending (ties: lower
        index first), and their indices (..., k) int32.

    Raises:
        KernelError: bad dtype, shape or k.
    """
    op = "softmax_topk"
    x2, rows, n, stride = _rows(x, op)
    if not isinstance(k, (int, np.integer)) or not 0 <= int(k) <= n:
        raise KernelError(f"{op}: k must be an integer in [0, {n}], got {k!r}")
    k = int(k)
    probs = None if probs_out is None else _out(probs_out, x.shape, np.dtype(np.float32), op)
    scores = np.empty(x.shape[:-1] + (k,), np.float32)
    idx = np.empty(x.shape[:-1] + (k,), np.int32)
    lib, _ = get_library()
    _check(lib.cuvil_softmax_topk(_ptr(x2), rows, n, stride, None if probs is None else _ptr(probs), k,
                                  _ptr(scores), _ptr(idx)), op)
    return scores, idx


def softmax(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable softmax over the last axis (float32).

    Args:
        x (np.ndarray): float32 (..., n).
        out (np.ndarray | None): preallocated float32 C-contiguous array of x's shape. Defaults to None.

    Returns:
        np.ndarray: probabilities, x's shape.
    """
    op = "softmax"
    _rows(x, op)
    res = _out(out, x.shape, np.dtype(np.float32), op)
    softmax_topk(x, 0, probs_out=res)
    return res


_BOX_FORMATS = {"cxcywh": 0, "xyxy": 1}


def nms(boxes: np.ndarray, scores: np.ndarray, *, box_format: str = "cxcywh", score_threshold: float = 0.25,
        iou_threshold: float = 0.45, class_agnostic: bool = False, max_detections: int = 300) -> Detections:
    """Decodes detections and applies non-maximum suppression.

    Each box takes its best class (lowest index on ties) and is a candidate when that score is
    ``> score_threshold``; candidates are visited in descending score order (ties: lower index) and
    a box is dropped when its IoU with a kept box is ``> iou_threshold`` (same class unless
    ``class_agnostic``). Strided views work without copies: for YOLOv8's (1, 4 + C, N) output pass
    ``boxes=out[0, :4].T`` and ``scores=out[0, 4:].T``.

    Args:
        boxes (np.ndarray): float32 (N, 4), any strides.
        scores (np.ndarray): float32 (N, C), any strides.
        box_format (str): ``"cxcywh"`` (centre, size) or ``"xyxy"`` (corners). Defaults to "cxcywh".
        score_threshold (float): Defaults to 0.25.
        iou_threshold (float): Defaults to 0.45.
        class_agnostic (bool): suppress across classes. Defaults to False.
        max_detections (int): keep at most this many. Defaults to 300.

    Returns:
        Detections: boxes as x1, y1, x2, y2, scores, classes, input indices.

    Raises:
        KernelError: bad dtype, shape, format or thresholds.
    """
    op = "nms"
    for name, a in (("boxes", boxes), ("scores", scores)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2:
            raise KernelError(f"{op}: {name} must be a 2-D float32 numpy array, got "
                              f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}")
    if boxes.shape[1] != 4:
        raise KernelError(f"{op}: boxes must be (N, 4), got {boxes.shape}")
    if scores.shape[0] != boxes.shape[0] or scores.shape[1] == 0:
        raise KernelError(f"{op}: scores must be (N, C>0) with N = {boxes.shape[0]}, got {scores.shape}")
    if box_format not in _BOX_FORMATS:
        raise KernelError(f"{op}: box_format must be 'cxcywh' or 'xyxy', got {box_format!r}")
    if not (np.isfinite(score_threshold) and np.isfinite(iou_threshold)) or max_detections < 0:
        raise KernelError(f"{op}: thresholds must be finite and max_detections >= 0")
    n, c = scores.shape
    cap = min(int(max_detections), n)
    ob = np.empty((cap, 4), np.float32)
    os_ = np.empty(cap, np.float32)
    oc = np.empty(cap, np.int32)
    oi = np.empty(cap, np.int32)
    lib, _ = get_library()
    kept = lib.cuvil_nms(_ptr(boxes), n, boxes.strides[0], boxes.strides[1], _BOX_FORMATS[box_format],
                         _ptr(scores), c, scores.strides[0], scores.strides[1], float(score_threshold),
                         float(iou_threshold), int(class_agnostic), cap, _ptr(ob), _ptr(os_), _ptr(oc), _ptr(oi))
    _check(int(kept), op)
    return Detections(ob[:kept], os_[:kept], oc[:kept], oi[:kept])


def select_isa(isa: str | None) -> None:
    """Forces every op of the loaded library onto one ISA (``None``: the best available).

    Unlike ``CUVIL_FORCE_ISA`` (read when the library loads) this switches at run time; tests use
    it to compare ISAs in one process.

    Raises:
        KernelError: unknown ISA, or one this CPU lacks.
    """
    lib, _ = get_library()
    if isa is not None and isa not in ISAS:
        raise KernelError(f"unknown ISA {isa!r}: use one of {', '.join(ISAS)}")
    code = -1 if isa is None else ISAS.index(isa)
    if lib.cuvil_select_isa(code) != 0:
        avail = [n for i, n in enumerate(ISAS) if lib.cuvil_isa_available() & (1 << i)]
        raise KernelError(f"this CPU lacks {isa}: available ISAs are {', '.join(avail)}")


def set_num_threads(n: int) -> None:
    """Sets how many threads one kernel call may use (default 1, or ``$CUVIL_NUM_THREADS``).

    Large calls split rows or elements into ranges run in parallel; results never depend on the
    count. Keep 1 where requests already run concurrently (the daemon); raise it for one big
    frame at a time.

    Raises:
        KernelError: n outside 1..64.
    """
    lib, _ = get_library()
    if not isinstance(n, (int, np.integer)) or lib.cuvil_set_threads(int(n)) != 0:
        raise KernelError(f"threads must be an integer in 1..64, got {n!r}")


def cpu_info(library: str | os.PathLike[str] | None = None) -> dict[str, object]:
    """Describes the kernel library in use and the ISA it chose per op.

    Args:
        library (str | os.PathLike | None): load this library first (see :func:`load_library`).
            Defaults to None (the one in use, or the default).

    Returns:
        dict: ``platform``, ``library`` (path), ``available`` (ISAs), ``isa`` (op -> ISA),
        ``sve_vector_bytes`` and ``sve_vector_bits`` (0 without SVE), ``forced`` (``CUVIL_FORCE_ISA``
        or None).
    """
    if library is not None:
        load_library(library)
    lib, path = get_library()
    avail = lib.cuvil_isa_available()
    vb = int(lib.cuvil_sve_vector_bytes())
    return {
        "platform": current_platform(),
        "library": str(path),
        "available": [n for i, n in enumerate(ISAS) if avail & (1 << i)],
        "isa": {op: ISAS[lib.cuvil_isa_for(i)] for i, op in enumerate(OPS)},
        "sve_vector_bytes": vb,
        "sve_vector_bits": 8 * vb,
        "forced": os.environ.get("CUVIL_FORCE_ISA") or None,
        "threads": int(lib.cuvil_get_threads()),
        "message": lib.cuvil_init_message().decode(),
    }


