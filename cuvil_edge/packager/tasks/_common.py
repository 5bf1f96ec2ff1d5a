"""Helpers the task modules share: output arrays, similarity figures, boxes and NMS, edit distance."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Outputs", "as_samples", "box_iou", "cosine", "edit_distance", "nms", "output_figures"]

# Outputs by name: one array [N, ...], or per-sample [1, ...] arrays when shapes differ between samples.
Outputs = dict[str, Any]


def as_samples(value: np.ndarray | list[np.ndarray]) -> list[np.ndarray]:
    """An output as one ``[1, ...]`` array per sample, whichever way it was collected."""
    if isinstance(value, list):
        return [np.asarray(v) for v in value]
    return [value[i : i + 1] for i in range(len(value))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean per-sample cosine similarity (1.0 for two all-zero samples)."""
    a2 = a.reshape(len(a), -1).astype(np.float64)
    b2 = b.reshape(len(b), -1).astype(np.float64)
    den = np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)
    both_zero = (np.linalg.norm(a2, axis=1) == 0) & (np.linalg.norm(b2, axis=1) == 0)
    cos = np.where(den > 0, (a2 * b2).sum(axis=1) / np.maximum(den, 1e-30), np.where(both_zero, 1.0, 0.0))
    return float(cos.mean())


def output_figures(ref: np.ndarray | list[np.ndarray], test: np.ndarray | list[np.ndarray]) -> dict[str, Any]:
    """What every output gets, whatever the task: cosine, relative error, mean and max absolute error.

    ``relative_error`` is ``||test - ref|| / ||ref||`` over all samples together (a sample whose
    original is near zero does not dominate): unlike cosine it sees a change of scale, and unlike
    MAE it means the same for logits and for pixel coordinates.
    """
    rs, ts = as_samples(ref), as_samples(test)
    cos, mae, mx, diff2, norm2 = [], [], 0.0, 0.0, 0.0
    for r, t in zip(rs, ts, strict=True):
        r64, t64 = r.astype(np.float64), t.astype(np.float64)
        cos.append(cosine(r64, t64))
        norm2 += float((r64 * r64).sum())
        diff2 += float(((t64 - r64) ** 2).sum())
        mae.append(float(np.abs(r64 - t64).mean()) if r64.size else 0.0)
        mx = max(mx, float(np.abs(r64 - t64).max()) if r64.size else 0.0)
    rel = np.sqrt(diff2 / norm2) if norm2 > 0 else (0.0 if diff2 == 0 else 1.0)
    return {"samples": len(rs), "cosine": float(np.mean(cos)), "relative_error": float(rel),
            "mae": float(np.mean(mae)), "max_abs_error": mx}


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` [K, 4] with every box in ``b`` [M, 4], both x1, y1, x2, y2."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, limit: int) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, best score first (the daemon's rule)."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while len(order) and len(keep) < limit:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        if not len(rest):
            break
        order = rest[box_iou(boxes[i : i + 1], boxes[rest])[0] <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance of two label sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
