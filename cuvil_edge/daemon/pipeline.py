"""Pre- and post-processing from a bundle's manifest spec, around the backend's model call.

Pre-processing (``preprocess.kind == "image"``): besides the model's own tensor input, the
daemon accepts an input named :data:`IMAGE_INPUT` (``"image"``), datatype UINT8, shape
``[H, W, 3]`` or ``[N, H, W, 3]`` (HWC, RGB, any size). It is resized to the spec's ``size``
(bilinear or nearest; letterboxed when ``letterbox`` is true), channel-swapped for ``color: BGR``,
normalized ``(x - mean) / std``, laid out NCHW or NHWC, and fed as the model's first input.
Letterbox borders take ``pad_value`` (pixel units, default 114 as YOLO) before normalization.

Post-processing adds outputs computed from the model's first output:

* ``classification``: :data:`TOPK_SCORES` (FP32 ``[N, k]``, softmax probabilities when
  ``softmax`` is true) and :data:`TOPK_CLASSES` (INT64 ``[N, k]``), best first;
* ``detection``: :data:`DETECTIONS` (FP32 ``[N, max_detections, 6]``: x1, y1, x2, y2, score,
  class; zero rows after the last) and :data:`NUM_DETECTIONS` (INT32 ``[N]``). The raw output is
  ``[N, A, 4 + C]`` or ``[N, 4 + C, A]`` (YOLOv8 style, transposed when the middle dimension is
  the smaller), boxes in ``box_format``. A request that sent an ``image`` gets its boxes in that
  image's pixels (letterbox and resize undone, clipped to the image) and the model-space ones as
  :data:`DETECTIONS_MODEL`.

The heavy steps use :mod:`cuvil_edge.sve` kernels when that package imports and its library is
built, numpy otherwise (the same arithmetic; the kernels' scalar path is their reference).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime.base import TensorSpec

__all__ = [
    "DETECTIONS",
    "DETECTIONS_MODEL",
    "IMAGE_INPUT",
    "NUM_DETECTIONS",
    "TOPK_CLASSES",
    "TOPK_SCORES",
    "Pipeline",
    "kernels",
    "top_k",
]

log = logging.getLogger("cuvil_edge.daemon.pipeline")

IMAGE_INPUT = "image"
TOPK_SCORES = "topk_scores"
TOPK_CLASSES = "topk_classes"
DETECTIONS = "detections"
DETECTIONS_MODEL = "detections_model"
NUM_DETECTIONS = "num_detections"

_SVE: Any = None
_SVE_CHECKED = False


def kernels() -> Any:
    """The :mod:`cuvil_edge.sve` module when importable and built, else None (numpy is used)."""
    global _SVE, _SVE_CHECKED
    if not _SVE_CHECKED:
        _SVE_CHECKED = True
        try:
            from cuvil_edge import sve

            info: dict[str, Any] | None = sve.cpu_info() if hasattr(sve, "cpu_info") else None
            _SVE = sve if info is not None else None
            if info is not None:
                # One line per process, so an operator (and the HIL rig) sees the ISA chosen per op.
                log.info("pre-processing kernels: %s", " ".join(f"{op}={isa}" for op, isa in info["isa"].items()))
        except Exception as exc:  # missing package, unbuilt library (KernelError), bad ABI
            log.info("cuvil_edge.sve kernels not usable (%s); using numpy", exc)
            _SVE = None
    return _SVE


# ---------------------------------------------------------------------- numpy reference ops

def _resize_bilinear(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """HWC uint8/float -> HWC float32, half-pixel centres (as OpenCV/PIL bilinear)."""
    ih, iw = img.shape[:2]
    if (ih, iw) == (oh, ow):
        return img.astype(np.float32)
    ys = np.clip((np.arange(oh, dtype=np.float32) + 0.5) * (ih / oh) - 0.5, 0, ih - 1)
    xs = np.clip((np.arange(ow, dtype=np.float32) + 0.5) * (iw / ow) - 0.5, 0, iw - 1)
    y0 = ys.astype(np.intp)
    x0 = xs.astype(np.intp)
    y1 = np.minimum(y0 + 1, ih - 1)
    x1 = np.minimum(x0 + 1, iw - 1)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    f = img.astype(np.float32, copy=False)
    top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
    bot = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
    return top * (1 - wy) + bot * wy


def _resize_nearest(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    ih, iw = img.shape[:2]
    ys = np.minimum((np.arange(oh) * ih) // oh, ih - 1)
    xs = np.minimum((np.arange(ow) * iw) // ow, iw - 1)
    return img[ys][:, xs].astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest values of each row (last axis) and their indices, best first, ties by
    index: the one top-k of the daemon (the classification post-process and Triton's
    classification extension, :func:`cuvil_edge.daemon.infer.classify`)."""
    k = min(k, x.shape[-1])
    if x.shape[-1] <= 256:  # one sort beats partition + gather + sort on short rows
        idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
        return np.take_along_axis(x, idx, -1), idx.astype(np.int64)
    idx = np.argpartition(-x, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(x, idx, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(vals, order, -1), np.take_along_axis(idx, order, -1).astype(np.int64)


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float, limit: int) -> np.ndarray:
    """Greedy NMS on xyxy boxes; indices kept, best first (a box goes when IoU > ``iou``)."""
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes.T
    area = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    keep: list[int] = []
    while order.size and len(keep) < limit:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
        h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
        inter = w * h
        ov = inter / np.maximum(area[i] + area[rest] - inter, 1e-12)
        order = rest[ov <= iou]
    return np.asarray(keep, dtype=np.int64)


class Pipeline:
    """Pre-processing, model call and post-processing for one bundle.

    Args:
        manifest (Manifest | Mapping[str, Any]): the bundle's typed manifest, or a mapping holding
            its ``preprocess`` and ``postprocess`` sections (tests, the HIL suite).
        inputs (list[TensorSpec]): the model's inputs (from the backend).
        outputs (list[TensorSpec]): the model's outputs.
    """

    def __init__(self, manifest: Manifest | Mapping[str, Any], inputs: list[TensorSpec],
                 outputs: list[TensorSpec]) -> None:
        self.model_inputs = inputs
        self.model_outputs = outputs
        pre: Mapping[str, Any] | None
        post: Mapping[str, Any] | None
        if isinstance(manifest, Manifest):
            pre, post = manifest.preprocess, manifest.postprocess
        else:  # the two sections alone (tests, the HIL suite)
            pre, post = manifest.get("preprocess"), manifest.get("postprocess")
        self.pre = dict(pre or {"kind": "none"})
        self.post = dict(post or {"kind": "none"})
        self.image_spec: TensorSpec | None = None
        if self.pre.get("kind") == "image":
            if not inputs:
                raise DaemonError("image preprocess needs a model input")
            size = self.pre.get("size") or []
            if len(size) != 2:
                raise DaemonError(f"manifest preprocess.size {size!r} must be [height, width]")
            self.image_spec = TensorSpec(IMAGE_INPUT, np.dtype(np.uint8), (-1, -1, -1, 3))
            self._mean = np.asarray(self.pre.get("mean", [0.0, 0.0, 0.0]), np.float32)
            self._std = np.asarray(self.pre.get("std", [1.0, 1.0, 1.0]), np.float32)
        self.post_specs: list[TensorSpec] = []
        kind = self.post.get("kind", "none")
        if kind == "classification" and outputs:
            k = int(self.post.get("top_k", 5))
            self.post_specs = [TensorSpec(TOPK_SCORES, np.dtype(np.float32), (-1, k)),
                               TensorSpec(TOPK_CLASSES, np.dtype(np.int64), (-1, k))]
        elif kind == "detection" and outputs and self.post.get("head", "yolo") == "yolo":
            # Other heads (CenterNet maps, NMS inside) are served raw; the packager validates them.
            m = int(self.post.get("max_detections", 100))
            self.post_specs = [TensorSpec(DETECTIONS, np.dtype(np.float32), (-1, m, 6)),
                               TensorSpec(NUM_DETECTIONS, np.dtype(np.int32), (-1,))]
            if self.image_spec is not None:
                self.post_specs.append(TensorSpec(DETECTIONS_MODEL, np.dtype(np.float32), (-1, m, 6)))
        self.post_names = {s.name for s in self.post_specs}

    # ------------------------------------------------------------------ description

    @property
    def request_inputs(self) -> list[TensorSpec]:
        """Inputs a request may carry (the model's, plus ``image`` with an image preprocess)."""
        return self.model_inputs + ([self.image_spec] if self.image_spec else [])

    @property
    def request_outputs(self) -> list[TensorSpec]:
        """Outputs a request may ask for (the model's plus post-processing's)."""
        return self.model_outputs + self.post_specs

    # ------------------------------------------------------------------ pre-processing

    def prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model feed for one request (converts ``image`` when given)."""
        if self.image_spec is None or IMAGE_INPUT not in inputs:
            return inputs
        img = inputs[IMAGE_INPUT]
        batch = img if img.ndim == 4 else img[None]
        tensor = np.stack([self.preprocess_image(frame) for frame in batch])
        feed = {k: v for k, v in inputs.items() if k != IMAGE_INPUT}
        feed[self.model_inputs[0].name] = tensor.astype(self.model_inputs[0].dtype, copy=False)
        return feed

    def geometry(self, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """Where each request image lands in the model's input, ``[N, 6]`` rows of (scale y,
        scale x, top, left, height, width): what turns boxes in model space back into the
        client's pixels. None when the request sent no ``image`` (its tensor is model space)."""
        if self.image_spec is None or IMAGE_INPUT not in inputs:
            return None
        img = inputs[IMAGE_INPUT]
        ih, iw = img.shape[-3], img.shape[-2]
        oh, ow = (int(v) for v in self.pre["size"])
        if self.pre.get("letterbox", False):
            scale = min(oh / ih, ow / iw)
            rh, rw = max(1, min(oh, round(ih * scale))), max(1, min(ow, round(iw * scale)))
            top, left = (oh - rh) // 2, (ow - rw) // 2
        else:
            rh, rw, top, left = oh, ow, 0, 0
        n = img.shape[0] if img.ndim == 4 else 1
        return np.tile(np.array([[rh / ih, rw / iw, top, left, ih, iw]], np.float32), (n, 1))

    def to_image_space(self, result: dict[str, np.ndarray], geometry: np.ndarray | None) -> dict[str, np.ndarray]:
        """One request's detections in its image's pixels (letterbox undone, clipped to the image);
        the model-space boxes stay available as :data:`DETECTIONS_MODEL`."""
        dets = result.get(DETECTIONS)
        if geometry is None or dets is None:
            return result
        out = dict(result)
        out[DETECTIONS_MODEL] = dets
        img = dets.copy()
        sy, sx, top, left, ih, iw = (geometry[:, i, None] for i in range(6))
        img[..., [0, 2]] = np.clip((dets[..., [0, 2]] - left) / sx, 0, iw)
        img[..., [1, 3]] = np.clip((dets[..., [1, 3]] - top) / sy, 0, ih)
        counts = result.get(NUM_DETECTIONS)
        if counts is not None:  # rows after the last detection stay zero
            img[np.arange(img.shape[1])[None, :] >= counts[:, None]] = 0
        out[DETECTIONS] = img
        return out

    def preprocess_image(self, img: np.ndarray) -> np.ndarray:
        """One HWC uint8 RGB frame -> the model's input layout (no batch dimension)."""
        oh, ow = (int(v) for v in self.pre["size"])
        if img.ndim != 3 or img.shape[2] != 3:
            raise DaemonError(f"input '{IMAGE_INPUT}' must be HWC with 3 channels, got shape {list(img.shape)}")
        swap = self.pre.get("color", "RGB").upper() == "BGR"
        method = self.pre.get("resize", "bilinear")
        letterbox = bool(self.pre.get("letterbox", False))
        pad = self.pre.get("pad_value", 114.0)
        sve = kernels()
        out: np.ndarray | None = None  # (3, oh, ow) float32
        if sve is not None and method == "bilinear":
            try:
                out = sve.resize_normalize(np.ascontiguousarray(img), (oh, ow), self._mean, self._std,
                                           swap_rb=swap, letterbox=letterbox, pad_value=pad)
            except Exception as exc:  # a kernel never takes the daemon down: numpy instead
                log.debug("sve.resize_normalize failed (%s); numpy fallback", exc)
                out = None
        if out is None:
            out = self._preprocess_numpy(img, oh, ow, swap, method, letterbox, pad)
        if self.pre.get("layout", "NCHW").upper() == "NHWC":
            out = out.transpose(1, 2, 0)
        return np.ascontiguousarray(out, dtype=np.float32)

    def _preprocess_numpy(self, img: np.ndarray, oh: int, ow: int, swap: bool, method: str, letterbox: bool,
                          pad: Any) -> np.ndarray:
        """The reference path: same arithmetic as the kernels' scalar version, (3, oh, ow) float32."""
        if swap:
            img = img[..., ::-1]
        ih, iw = img.shape[:2]
        resize = _resize_nearest if method == "nearest" else _resize_bilinear
        if letterbox:
            scale = min(oh / ih, ow / iw)
            rh, rw = max(1, min(oh, round(ih * scale))), max(1, min(ow, round(iw * scale)))
            canvas = np.empty((oh, ow, 3), np.float32)
            canvas[...] = np.broadcast_to(np.asarray(pad, np.float32), (3,))
            top, left = (oh - rh) // 2, (ow - rw) // 2
            canvas[top:top + rh, left:left + rw] = resize(img, rh, rw)
            resized = canvas
        else:
            resized = resize(img, oh, ow)
        return ((resized - self._mean) / self._std).transpose(2, 0, 1)

    # ------------------------------------------------------------------ post-processing

    def needs_model_output(self, wanted: set[str] | None) -> list[str] | None:
        """Model outputs to compute for the union of requested names (None: all)."""
        if wanted is None:
            return None
        if DETECTIONS_MODEL in wanted:
            wanted = wanted | {DETECTIONS}
        names = [s.name for s in self.model_outputs if s.name in wanted]
        if wanted & self.post_names and self.model_outputs and self.model_outputs[0].name not in names:
            names.append(self.model_outputs[0].name)
        return names

    def postprocess(self, outputs: dict[str, np.ndarray], wanted: set[str] | None) -> dict[str, np.ndarray]:
        """Add post-processing outputs that were asked for (all when ``wanted`` is None)."""
        if not self.post_specs or (wanted is not None and not (wanted & self.post_names)):
            return outputs
        raw = outputs[self.model_outputs[0].name]
        kind = self.post.get("kind")
        if kind == "classification":
            scores, classes = self._classify(raw)
            outputs[TOPK_SCORES] = scores
            outputs[TOPK_CLASSES] = classes
        elif kind == "detection":
            dets, counts = self._detect(raw)
            outputs[DETECTIONS] = dets
            outputs[NUM_DETECTIONS] = counts
            if self.image_spec is not None:  # a tensor request's boxes are model space already
                outputs[DETECTIONS_MODEL] = dets
        return outputs

    def _classify(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = int(self.post.get("top_k", 5))
        x = logits.reshape(logits.shape[0], -1).astype(np.float32, copy=False)
        soft = bool(self.post.get("softmax", True))
        sve = kernels()
        if sve is not None and soft:
            try:
                vals, idx = sve.softmax_topk(x, min(k, x.shape[1]))
                return vals, idx.astype(np.int64)
            except Exception as exc:
                log.debug("sve.softmax_topk failed (%s); numpy fallback", exc)
        if soft:
            x = _softmax(x)
        vals, idx = top_k(x, k)
        return vals.astype(np.float32), idx

    def _detect(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = self.post
        limit = int(p.get("max_detections", 100))
        thr = float(p.get("score_threshold", 0.25))
        iou = float(p.get("iou_threshold", 0.45))
        agnostic = bool(p.get("class_agnostic", False))
        if raw.ndim != 3:
            raise DaemonError(f"detection postprocess needs a [N, A, 4+C] output, got {list(raw.shape)}")
        if raw.shape[1] < raw.shape[2]:
            raw = raw.transpose(0, 2, 1)
        n = raw.shape[0]
        dets = np.zeros((n, limit, 6), np.float32)
        counts = np.zeros((n,), np.int32)
        sve = kernels()
        fmt = str(p.get("box_format", "cxcywh"))
        for b in range(n):
            boxes = raw[b, :, :4].astype(np.float32, copy=False)
            cls_scores = raw[b, :, 4:].astype(np.float32, copy=False)
            if sve is not None:
                try:
                    d = sve.nms(boxes, cls_scores, box_format=fmt, score_threshold=thr, iou_threshold=iou,
                                class_agnostic=agnostic, max_detections=limit)
                    m = len(d.scores)
                    dets[b, :m, :4] = d.boxes
                    dets[b, :m, 4] = d.scores
                    dets[b, :m, 5] = d.classes
                    counts[b] = m
                    continue
                except Exception as exc:
                    log.debug("sve.nms failed (%s); numpy fallback", exc)
            cls = cls_scores.argmax(-1)
            score = cls_scores.max(-1)
            sel = score > thr
            bx, cls, score = boxes[sel], cls[sel], score[sel]
            if fmt == "cxcywh":
                cx, cy, w, h = bx.T
                bx = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
            shifted = bx if agnostic else bx + (cls.astype(np.float32) * 1e4)[:, None]
            keep = _nms(shifted, score, iou, limit)
            m = len(keep)
            dets[b, :m, :4] = bx[keep]
            dets[b, :m, 4] = score[keep]
            dets[b, :m, 5] = cls[keep]
            counts[b] = m
        return dets, counts
