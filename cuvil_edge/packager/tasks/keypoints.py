"""Keypoint and pose models: does the quantized model put the points where the original puts them?

Both models' keypoint outputs are decoded the way the model's own post-processing reads them
(``[postprocess] layout``), into ``[K, 2]`` points per sample in units of the model's frame (the
crop, box or image the points are relative to, divided by ``scale``), then compared point by point:

- ``pck``: the share of points within ``pck_threshold`` (default 0.05) of the original's, a distance
  relative to that frame (PCK@0.05 of the box/image size, as pose benchmarks count a correct point);
- ``keypoint_error``: the mean distance, in the same units.

Layouts (``recipes.KEYPOINT_LAYOUTS``): ``xxyy`` (every x, then every y: MTCNN's ``[N, 10]``),
``xyxy`` (interleaved pairs, ``[N, 2K]`` or ``[N, K, 2]``), ``heatmap`` (``[N, K, h, w]`` maps, the
arg-max cell of each, as HRNet-style pose heads are read; ``scale`` is then the map size).

When ``score_output`` names the output a model's post-processing filters on (a face probability),
only samples whose original scores above ``score_threshold`` are compared: the points of a crop the
bundle discards are not its job. ``score_agreement`` says how often both models keep the same samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.errors import AccuracyError
from cuvil_edge.packager.tasks._common import Outputs, as_samples

__all__ = ["GOALS", "METRICS", "decode", "metrics"]

GOALS = {"min_pck": 0.95}
METRICS = ("pck", "keypoint_error")


def decode(raw: np.ndarray, post: dict[str, Any]) -> np.ndarray:
    """One sample's points ``[K, 2]`` (x, y) in units of the frame (``scale`` = 1)."""
    layout = str(post.get("layout", "xyxy"))
    x = np.asarray(raw, np.float64)
    if x.ndim and x.shape[0] == 1:
        x = x[0]
    if layout == "heatmap":
        if x.ndim != 3:
            raise AccuracyError(f"keypoint layout 'heatmap' needs a [N, K, h, w] output, got {list(np.shape(raw))}")
        k, h, w = x.shape
        flat = x.reshape(k, -1).argmax(-1)
        # Cell centres over the map size: a point in 0..1 of the frame, whatever the map's resolution.
        return np.stack([(flat % w + 0.5) / w, (flat // w + 0.5) / h], -1)
    flat = x.reshape(-1)
    if flat.size % 2:
        raise AccuracyError(f"keypoint layout '{layout}' needs an even number of coordinates, got {flat.size}")
    k = flat.size // 2
    pts = np.stack([flat[:k], flat[k:]], -1) if layout == "xxyy" else flat.reshape(k, 2)
    return pts / float(post.get("scale", 1.0))


def _score(raw: np.ndarray, post: dict[str, Any]) -> float:
    """The sample's score: ``score_index`` (default: the last column, a softmax's positive class)."""
    flat = np.asarray(raw, np.float64).reshape(-1)
    return float(flat[int(post.get("score_index", -1))])


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    """PCK and mean error of the quantized model's points against the original's.

    Raises:
        AccuracyError: the keypoint output (``[postprocess] output``) is not among the model's outputs.
    """
    name = str(post.get("output") or next(iter(ref)))
    if name not in ref:
        raise AccuracyError(f"[postprocess] output '{name}' is not an output of the model (outputs: {', '.join(ref)})")
    thr = float(post.get("pck_threshold", 0.05))
    score_name = post.get("score_output")
    keep_ref = keep_test = None
    if score_name:
        if score_name not in ref:
            raise AccuracyError(f"[postprocess] score_output '{score_name}' is not an output of the model "
                                f"(outputs: {', '.join(ref)})")
        cut = float(post.get("score_threshold", 0.5))
        keep_ref = [_score(s, post) > cut for s in as_samples(ref[score_name])]
        keep_test = [_score(s, post) > cut for s in as_samples(test[score_name])]
    dists: list[np.ndarray] = []
    for i, (r, t) in enumerate(zip(as_samples(ref[name]), as_samples(test[name]), strict=True)):
        if keep_ref is not None and not keep_ref[i]:
            continue
        dists.append(np.linalg.norm(decode(r, post) - decode(t, post), axis=-1))
    m: dict[str, Any] = {"keypoint_output": name, "scored_samples": len(dists)}
    if keep_ref is not None and keep_test is not None:
        m["score_agreement"] = float(np.mean([a == b for a, b in zip(keep_ref, keep_test, strict=True)]))
    if not dists:
        m.update(pck=None, keypoint_error=None,
                 not_computable=f"the original's {score_name} is above score_threshold {post.get('score_threshold', 0.5)} "
                                "on no evaluation sample; give evaluation data the model keeps (--eval) or lower "
                                "[postprocess] score_threshold")
        return m
    d = np.concatenate(dists)
    m.update(pck=float((d <= thr).mean()), keypoint_error=float(d.mean()), max_keypoint_error=float(d.max()),
             keypoints_per_sample=int(len(dists[0])), scored_points=int(d.size))
    return m
