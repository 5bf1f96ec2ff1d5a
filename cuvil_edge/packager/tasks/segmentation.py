"""Dense maps: does the quantized model's decoded mask cover the same pixels as the original's?

The mask is the probability map thresholded at ``[postprocess] threshold`` (a map outside 0..1 is
taken as logits and passed through a sigmoid first), as a DB text detector or a segmenter's
post-processing reads it: IoU of masks, not cosine of raw logits, decides.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.packager.tasks._common import Outputs, as_samples

__all__ = ["GOALS", "METRICS", "infer", "mask_iou", "metrics"]

GOALS = {"min_mask_iou": 0.9}
METRICS = ("mask_iou",)


def _mask(x: np.ndarray, threshold: float) -> np.ndarray:
    prob = x if (x.min() >= 0 and x.max() <= 1) else 1 / (1 + np.exp(-x.astype(np.float64)))
    return prob >= threshold


def mask_iou(ref: np.ndarray, test: np.ndarray, threshold: float) -> float:
    """IoU of the two decoded masks of one sample; 1.0 when both are empty."""
    a, b = _mask(ref, threshold), _mask(test, threshold)
    union = int((a | b).sum())
    return float((a & b).sum() / union) if union else 1.0


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    """``mask_iou`` pools every pixel of the evaluation set (intersection over union of all masks), as
    segmentation benchmarks do: a crop whose original marks three pixels weighs three pixels, not a
    whole sample. The per-sample mean and minimum are reported beside it."""
    name = next(iter(ref))
    thr = float(post.get("threshold", 0.5))
    inter = union = 0
    ious = []
    for r, t in zip(as_samples(ref[name]), as_samples(test[name]), strict=True):
        a, b = _mask(r, thr), _mask(t, thr)
        inter += int((a & b).sum())
        union += int((a | b).sum())
        ious.append(mask_iou(r, t, thr))
    return {"mask_iou": inter / union if union else 1.0, "mean_sample_mask_iou": float(np.mean(ious)),
            "min_sample_mask_iou": float(np.min(ious)), "mask_pixels": union, "mask_output": name}


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None) -> dict[str, Any] | None:
    """One ``[N, 1, H, W]`` map: a mask."""
    if len(shapes) == 1:
        (shape,) = shapes.values()
        if len(shape) == 4 and shape[1] == 1:
            return {"kind": "segmentation", "threshold": 0.5}
    return None
