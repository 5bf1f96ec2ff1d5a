"""Detectors: does the quantized model find the boxes the original finds?

Both models' outputs are decoded by the bundle's own post-processing (``[postprocess]``: the head,
box format, score and IoU thresholds), then each sample's detections are matched greedily, best
score first, to the original's of the same class with IoU at least 0.5. Recall is the share of the
original's detections found, precision the share of the quantized model's that the original also
made; mean IoU and score drift are over matched pairs. Keypoints decoded with the boxes (CenterFace's
five) give a keypoint error relative to the box size.

Heads (``recipes.DETECTION_HEADS``):

- ``yolo``: ``[N, 4+C, A]`` (YOLOv8 and later, channels first) or ``[N, A, 4+C]``; with
  ``objectness`` a column after the box multiplies the class scores (YOLOv5/v7, ``[N, A, 5+C]``).
- ``centernet``: heatmap, scale and offset maps at ``stride`` (4), optional keypoint offsets, decoded
  as CenterFace's authors do (``exp(scale) * stride`` sizes, ``(cell + offset + 0.5) * stride`` centres).
- ``nms``: NMS inside the model, ``[N, K, 6]`` rows of x1, y1, x2, y2, score, class.
- ``yolox``: YOLOX's raw ``[N, A, 5+C]`` (decode not exported into the graph): per grid cell at
  ``strides`` (8, 16, 32) centre offsets and log sizes, decoded as YOLOX's ``demo_postprocess``
  (``(xy + cell) * stride``, ``exp(wh) * stride``), objectness times class scores. The input side is
  recovered from ``A`` (a square input: ``A = sum((side / s) ** 2)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil_edge.errors import AccuracyError
from cuvil_edge.packager.tasks._common import Outputs, as_samples, box_iou, nms

__all__ = ["GOALS", "METRICS", "Detections", "decode", "infer", "match", "metrics"]

GOALS = {"min_recall": 0.9, "min_precision": 0.9}
METRICS = ("recall", "precision", "mean_iou", "score_drift", "keypoint_error", "map50")
MATCH_IOU = 0.5


@dataclass
class Detections:
    """One sample's decoded detections."""

    boxes: np.ndarray  # [K, 4] x1, y1, x2, y2
    scores: np.ndarray  # [K]
    classes: np.ndarray  # [K] int
    keypoints: np.ndarray | None = None  # [K, P, 2]


def _empty() -> Detections:
    return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))


def _suppress(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, post: dict[str, Any],
              keypoints: np.ndarray | None = None) -> Detections:
    limit = int(post.get("max_detections", 100))
    iou = float(post.get("iou_threshold", 0.45))
    agnostic = bool(post.get("class_agnostic", False))
    if len(boxes) == 0:
        return _empty()
    offset = 0.0 if agnostic else (classes.astype(np.float64) * (float(np.abs(boxes).max()) + 1.0) * 2)[:, None]
    keep = nms(boxes.astype(np.float64) + offset, scores, iou, limit)
    kp = keypoints[keep] if keypoints is not None else None
    return Detections(boxes[keep], scores[keep], classes[keep], kp)


def _yolo(raw: np.ndarray, post: dict[str, Any]) -> list[Detections]:
    """YOLO heads, as the daemon's pipeline decodes them (``daemon/pipeline.py`` ``_detect``)."""
    if raw.ndim != 3:
        raise AccuracyError(f"a yolo detection head needs one [N, 4+C, A] or [N, A, 4+C] output, got {list(raw.shape)}")
    if raw.shape[1] < raw.shape[2]:
        raw = raw.transpose(0, 2, 1)
    thr = float(post.get("score_threshold", 0.25))
    out = []
    for b in range(raw.shape[0]):
        boxes = raw[b, :, :4].astype(np.float64)
        if post.get("objectness"):
            cls_scores = raw[b, :, 5:].astype(np.float64) * raw[b, :, 4:5].astype(np.float64)
        else:
            cls_scores = raw[b, :, 4:].astype(np.float64)
        cls = cls_scores.argmax(-1)
        score = cls_scores.max(-1)
        sel = score > thr
        bx, cls, score = boxes[sel], cls[sel], score[sel]
        if post.get("box_format", "cxcywh") == "cxcywh":
            cx, cy, w, h = bx.T
            bx = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
        out.append(_suppress(bx, score, cls, post))
    return out


def _yolox_grid(anchors: int, strides: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Cell coordinates ``[A, 2]`` and strides ``[A, 1]`` of a square input, as YOLOX lays them out."""
    per_pixel = sum(1.0 / (s * s) for s in strides)
    side = int(round(np.sqrt(anchors / per_pixel)))
    cells, scales = [], []
    for s in strides:
        n = side // s
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        cells.append(np.stack([xv, yv], -1).reshape(-1, 2))
        scales.append(np.full((n * n, 1), float(s)))
    grid, stride = np.concatenate(cells), np.concatenate(scales)
    if len(grid) != anchors:
        raise AccuracyError(f"a yolox head's {anchors} rows are not the cells of a square input at strides {strides}")
    return grid.astype(np.float64), stride


def _yolox(raw: np.ndarray, post: dict[str, Any]) -> list[Detections]:
    if raw.ndim != 3 or raw.shape[2] < 6:
        raise AccuracyError(f"a yolox detection head needs one [N, A, 5+C] output, got {list(raw.shape)}")
    grid, stride = _yolox_grid(raw.shape[1], list(post.get("strides", [8, 16, 32])))
    boxes = raw.astype(np.float64).copy()
    boxes[..., :2] = (boxes[..., :2] + grid) * stride
    # Clipped: a broken model's log-sizes must not overflow (it then simply matches nothing).
    boxes[..., 2:4] = np.exp(np.clip(boxes[..., 2:4], -30, 30)) * stride
    return _yolo(boxes, {**post, "objectness": True, "box_format": "cxcywh"})


def _centernet_maps(outputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Heatmap, scale, offset and keypoint maps, told apart by channel count in the authors' order."""
    maps = [o for o in outputs if o.ndim == 4]
    if len(maps) < 3:
        raise AccuracyError("a centernet detection head needs heatmap, scale and offset outputs [N, C, h, w]; "
                            f"got shapes {[list(o.shape) for o in outputs]}")
    heat = maps[0]
    scale, offset = maps[1], maps[2]
    keypoints = maps[3] if len(maps) > 3 and maps[3].shape[1] % 2 == 0 else None
    return heat, scale, offset, keypoints


def _centernet(outputs: list[np.ndarray], post: dict[str, Any]) -> list[Detections]:
    heat, scale, offset, kps = _centernet_maps(outputs)
    stride = float(post.get("stride", 4))
    thr = float(post.get("score_threshold", 0.25))
    out = []
    for b in range(heat.shape[0]):
        cls, ys, xs = np.nonzero(heat[b] > thr)
        score = heat[b][cls, ys, xs].astype(np.float64)
        # Clipped: a broken model's log-sizes must not overflow (it then simply matches nothing).
        s0 = np.exp(np.clip(scale[b, 0, ys, xs].astype(np.float64), -30, 30)) * stride
        s1 = np.exp(np.clip(scale[b, 1, ys, xs].astype(np.float64), -30, 30)) * stride
        o0, o1 = offset[b, 0, ys, xs].astype(np.float64), offset[b, 1, ys, xs].astype(np.float64)
        x1 = (xs + o1 + 0.5) * stride - s1 / 2
        y1 = (ys + o0 + 0.5) * stride - s0 / 2
        boxes = np.stack([x1, y1, x1 + s1, y1 + s0], -1) if len(xs) else np.zeros((0, 4))
        points = None
        if kps is not None:
            n = kps.shape[1] // 2
            px = np.stack([kps[b, 2 * j + 1, ys, xs] * s1 + x1 for j in range(n)], -1) if len(xs) else np.zeros((0, n))
            py = np.stack([kps[b, 2 * j, ys, xs] * s0 + y1 for j in range(n)], -1) if len(xs) else np.zeros((0, n))
            points = np.stack([px, py], -1)
        out.append(_suppress(boxes, score, cls.astype(np.int64), post, points))
    return out


def _nms_inside(raw: np.ndarray, post: dict[str, Any]) -> list[Detections]:
    if raw.ndim != 3 or raw.shape[2] < 6:
        raise AccuracyError(f"an nms detection head needs one [N, K, 6] output, got {list(raw.shape)}")
    thr = float(post.get("score_threshold", 0.25))
    out = []
    for b in range(raw.shape[0]):
        rows = raw[b].astype(np.float64)
        rows = rows[rows[:, 4] > thr]
        out.append(Detections(rows[:, :4], rows[:, 4], rows[:, 5].astype(np.int64)))
    return out


def decode(outputs: Outputs, post: dict[str, Any]) -> list[Detections]:
    """Every sample's detections, decoded as the bundle's ``post``-processing spec says."""
    head = post.get("head", "yolo")
    names = list(outputs)
    per_sample = [as_samples(outputs[n]) for n in names]
    found: list[Detections] = []
    for sample in zip(*per_sample, strict=True):
        arrays = [np.asarray(a, dtype=np.float32) for a in sample]
        if head == "centernet":
            found += _centernet(arrays, post)
        elif head == "nms":
            found += _nms_inside(arrays[0], post)
        elif head == "yolox":
            found += _yolox(arrays[0], post)
        else:
            found += _yolo(arrays[0], post)
    return found


def match(ref: Detections, test: Detections) -> list[tuple[int, int, float]]:
    """Greedy matches ``(ref index, test index, IoU)``: same class, IoU >= 0.5, best test score first."""
    iou = box_iou(test.boxes, ref.boxes)
    used: set[int] = set()
    pairs = []
    for ti in np.argsort(-test.scores, kind="stable"):
        best, best_iou = -1, MATCH_IOU
        for ri in range(len(ref.boxes)):
            if ri in used or ref.classes[ri] != test.classes[ti]:
                continue
            if iou[ti, ri] >= best_iou:
                best, best_iou = ri, float(iou[ti, ri])
        if best >= 0:
            used.add(best)
            pairs.append((best, int(ti), best_iou))
    return pairs


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    """Recall and precision against the original's detections, mean IoU and score drift of matches.

    When the original finds nothing on the whole evaluation data, recall and precision are None
    (with ``not_computable`` saying why): a goal on them is then an error, never a pass.
    """
    a, b = decode(ref, post), decode(test, post)
    n_ref, n_test = sum(len(d.scores) for d in a), sum(len(d.scores) for d in b)
    if n_ref == 0:
        return {"reference_detections": 0, "detections": n_test, "recall": None, "precision": None,
                "not_computable": f"the original model finds no detection above score_threshold "
                                  f"{post.get('score_threshold', 0.25)} on the {len(a)} evaluation sample(s); give "
                                  "evaluation data with objects in it (--eval) or set [postprocess] score_threshold "
                                  "lower"}
    matched, ious, drift, kp_err = 0, [], [], []
    for r, t in zip(a, b, strict=True):
        for ri, ti, iou in match(r, t):
            matched += 1
            ious.append(iou)
            drift.append(abs(float(r.scores[ri]) - float(t.scores[ti])))
            if r.keypoints is not None and t.keypoints is not None:
                size = max(float(np.sqrt(np.prod(r.boxes[ri, 2:] - r.boxes[ri, :2]).clip(1e-6))), 1e-6)
                kp_err.append(float(np.linalg.norm(r.keypoints[ri] - t.keypoints[ti], axis=-1).mean()) / size)
    m: dict[str, Any] = {
        "reference_detections": n_ref,
        "detections": n_test,
        "matched": matched,
        "recall": matched / n_ref,
        "precision": matched / n_test if n_test else (1.0 if n_ref == 0 else 0.0),
        "mean_iou": float(np.mean(ious)) if ious else 0.0,
        "score_drift": float(np.mean(drift)) if drift else 0.0,
    }
    if kp_err:
        m["keypoint_error"] = float(np.mean(kp_err))
    return m


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _scores_like(values: Outputs | None) -> bool:
    """Columns after the box are scores in 0..1 (sigmoid), unlike embeddings or logits."""
    if values is None:
        return True
    raw = as_samples(next(iter(values.values())))[0][0]
    if raw.shape[0] < raw.shape[1]:
        raw = raw.T
    scores = raw[:, 4:]
    return bool(scores.size) and float(scores.min()) >= 0.0 and float(scores.max()) <= 1.0 + 1e-6


def _raw_yolox(anchors: int, values: Outputs | None) -> bool:
    """``[N, A, 5+C]`` whose rows are a square input's cells at strides 8/16/32 and whose size columns
    go negative (log sizes: decoded widths never do): YOLOX without its decode in the graph."""
    if values is None:
        return False
    try:
        _yolox_grid(anchors, [8, 16, 32])
    except AccuracyError:
        return False
    raw = as_samples(next(iter(values.values())))[0][0]
    return bool(float(raw[:, 2:4].min()) < 0.0 and float(raw[:, 4:].min()) >= 0.0 and float(raw[:, 4:].max()) <= 1.0)


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None) -> dict[str, Any] | None:
    """A detection head recognised from the outputs' shapes (as run on the evaluation data).

    Three or four ``[N, C, h, w]`` maps of one size with C = 1 first, then 2 and 2 (then an even
    count of keypoint offsets): CenterNet. One ``[N, a, b]`` with a small side of 5 to 300 and a long
    side at least eight times longer, scores in 0..1 after the four box columns: a YOLO head (YOLOX's
    raw grid when the rows are a square input's cells and the size columns are log sizes). One
    ``[N, K, 6|7]`` with K at most 300: NMS inside.
    """
    dims = [_dims(s) for s in shapes.values()]
    maps = [d for d in dims if len(d) == 4]
    if 3 <= len(maps) == len(dims) <= 4 and [d[1] for d in maps[:3]] == [1, 2, 2] \
            and len({d[2:] for d in maps}) == 1:
        return {"kind": "detection", "head": "centernet", "box_format": "xyxy", "score_threshold": 0.5,
                "iou_threshold": 0.3, "class_agnostic": True, "max_detections": 100, "stride": 4}
    if len(dims) == 1 and len(dims[0]) == 3:
        _, a, b = dims[0]
        if 0 < b <= 7 and b >= 6 and 0 < a <= 300:
            return {"kind": "detection", "head": "nms", "box_format": "xyxy", "score_threshold": 0.25,
                    "iou_threshold": 0.45, "class_agnostic": False, "max_detections": 300}
        small, large = min(a, b), max(a, b)
        if 6 <= b < a and _raw_yolox(a, values):
            return {"kind": "detection", "head": "yolox", "box_format": "cxcywh", "score_threshold": 0.25,
                    "iou_threshold": 0.45, "class_agnostic": False, "max_detections": 100, "strides": [8, 16, 32]}
        if 5 <= small <= 300 and large >= 8 * small and _scores_like(values):
            return {"kind": "detection", "head": "yolo", "box_format": "cxcywh", "score_threshold": 0.25,
                    "iou_threshold": 0.45, "class_agnostic": False, "max_detections": 100}
    return None
