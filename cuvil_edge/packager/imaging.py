"""Reference image pre-processing in numpy: the semantics the C kernels and the daemon follow.

Bilinear resize uses half-pixel centres (as OpenCV's INTER_LINEAR and TensorRT's resize do), so a
tensor made here for calibration matches what the device makes from the same frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_rgb_uint8", "preprocess_image", "resize_bilinear"]


def as_rgb_uint8(img: np.ndarray) -> np.ndarray:
    """Grey, boolean or RGBA images to ``uint8 [H,W,3]``."""
    if img.dtype == bool:
        img = img.astype(np.uint8) * 255
    if img.dtype != np.uint8:
        img = np.clip(img, 0, 255).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.shape[2] == 4:
        img = img[:, :, :3]
    return np.ascontiguousarray(img)


def resize_bilinear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of ``[H,W,C]`` to float32 ``[height,width,C]`` with half-pixel centres."""
    h, w = img.shape[:2]
    ys = np.clip((np.arange(height, dtype=np.float32) + 0.5) * (h / height) - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width, dtype=np.float32) + 0.5) * (w / width) - 0.5, 0, w - 1)
    y0 = np.floor(ys).astype(np.intp)
    x0 = np.floor(xs).astype(np.intp)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    fy = (ys - y0)[:, None, None]
    fx = (xs - x0)[None, :, None]
    src = img.astype(np.float32)
    top = src[y0][:, x0] * (1 - fx) + src[y0][:, x1] * fx
    bottom = src[y1][:, x0] * (1 - fx) + src[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def preprocess_image(img: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """One RGB ``uint8 [H,W,3]`` image to the model's input tensor (without the batch axis)."""
    img = as_rgb_uint8(img)
    th, tw = spec["size"]
    if spec.get("letterbox"):
        h, w = img.shape[:2]
        scale = min(th / h, tw / w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        canvas = np.full((th, tw, 3), 114.0, np.float32)
        top, left = (th - nh) // 2, (tw - nw) // 2
        canvas[top : top + nh, left : left + nw] = resize_bilinear(img, nh, nw)
        x = canvas
    else:
        x = resize_bilinear(img, th, tw)
    if spec.get("color", "RGB") == "BGR":
        x = x[:, :, ::-1]
    mean = np.asarray(spec.get("mean", [0, 0, 0]), np.float32)
    std = np.asarray(spec.get("std", [1, 1, 1]), np.float32)
    x = (x - mean) / std
    if spec.get("layout", "NCHW") == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x.astype(spec.get("dtype", "float32")))
