"""Recipes: model + target + precision + pre/post-processing + data + accuracy goal, in TOML.

Every field is checked here, so a typo fails before a minute of calibration is spent, with an
error naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge._toml import TOMLDecodeError, load_toml
from cuvil_edge.errors import RecipeError
from cuvil_edge.targets import get_target

__all__ = ["CALIBRATION_METHODS", "PRECISIONS", "QUANTIZERS", "TASK_KINDS", "AccuracyGoal", "Recipe",
           "check_input_shapes", "check_postprocess", "choices", "input_shape_from_text", "load_recipe",
           "preprocess_from_text", "recipe_from_dict"]

PRECISIONS = ("fp32", "fp16", "int8", "mixed")
_PRE_KINDS = ("image", "none")

# One table per vocabulary (uvicorn's LOOP_SETUPS): a name and what it means. The recipe parser, the
# CLI's help and choices, the docs check (tests/core/test_vocabularies.py) and the packager's dispatch
# (``packager/calibrate.py`` RANGE_METHODS, ``packager/package.py`` QUANTIZER_STEPS) all read these keys,
# so a new method is one entry here plus its implementation there.
CALIBRATION_METHODS: dict[str, str] = {
    "percentile": "the 99.99th percentile of |x| (default: best of 99.9/99.99/99.995/99.999/mse on "
                  "EfficientNet-Lite0)",
    "mse": "the clipping threshold of least expected squared quantization error",
    "minmax": "the observed minimum and maximum",
    "entropy": "TensorRT's KL-divergence threshold on 128 bins",
}
# What the model does decides what the accuracy gate measures (``packager/tasks`` TASKS: metric,
# default goals, inference from output shapes). ``[postprocess] kind`` names one, or is left out
# ("none") and the packager infers it from the outputs and says so.
TASK_KINDS: dict[str, str] = {
    "classification": "top-1 agreement on confident samples, top-5 containment and KL divergence of the "
                      "class scores",
    "detection": "boxes decoded by the bundle's post-processing (YOLO heads, CenterNet heatmaps, NMS inside), "
                 "matched by class and IoU: recall and precision against FP32, mean IoU, score drift; mAP@0.5 "
                 "against labels",
    "segmentation": "IoU of the decoded mask (probability map thresholded)",
    "ctc": "greedy CTC decoding of a sequence recogniser: sequence agreement and character error rate "
           "against FP32",
    "stream": "the model run as a stream, each carrying its own state: decision agreement and drift over time",
    "keypoints": "keypoints or pose decoded by the model's own layout: share of points within 5% of the frame "
                 "of the original's (PCK@0.05) and mean normalized error",
    "embedding": "cosine similarity and relative error of every output",
    "regression": "cosine similarity and relative error of every output",
}
DETECTION_HEADS: dict[str, str] = {
    "yolo": "one [N, 4+C, A] or [N, A, 4+C] tensor (anchor-free, YOLOv8 and later), or [N, A, 5+C] with an "
            "objectness column (anchor-based, YOLOv5/v7)",
    "centernet": "heatmap [N, 1, h, w], scale [N, 2, h, w], offset [N, 2, h, w] (+ keypoints), CenterFace-style",
    "nms": "NMS inside the model: [N, K, 6] rows of x1, y1, x2, y2, score, class",
    "yolox": "raw YOLOX grid outputs [N, A, 5+C]: centre offsets and log sizes per cell at strides 8, 16, 32, "
             "objectness, class scores",
}
# How a keypoint output lays out its points (``packager/tasks/keypoints.py``).
KEYPOINT_LAYOUTS: dict[str, str] = {
    "xyxy": "interleaved x, y pairs: [N, 2K] or [N, K, 2]",
    "xxyy": "every x, then every y: [N, 2K] (MTCNN)",
    "heatmap": "one map per point [N, K, h, w], read at its arg-max cell",
}
QUANTIZERS: dict[str, str] = {
    "cuvil": "cuvil-edge's calibration ranges through ONNX Runtime's quantizer (every board)",
    "modelopt": "NVIDIA Model Optimizer's INT8 (TensorRT boards, int8 only; the modelopt extra)",
}


def choices(table: dict[str, str]) -> str:
    """The keys of a vocabulary as a user reads them: ``"a, b or c"``."""
    names = list(table)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class AccuracyGoal:
    """Thresholds the quantized model must meet against the FP32 original (None: not set).

    Fields left unset take the task's default goal (``packager/tasks`` TASKS) when the task is
    known: :meth:`resolved`. A goal whose metric the task cannot compute is an error, not a pass.
    """

    min_top1_agreement: float | None = None
    min_confident_top1_agreement: float | None = None
    min_top5_containment: float | None = None
    max_mean_kl: float | None = None
    min_cosine: float | None = None
    max_mae: float | None = None
    min_mask_iou: float | None = None
    min_label_accuracy: float | None = None
    min_recall: float | None = None
    min_precision: float | None = None
    min_mean_iou: float | None = None
    max_score_drift: float | None = None
    min_map50: float | None = None
    min_sequence_agreement: float | None = None
    max_char_error_rate: float | None = None
    min_decision_agreement: float | None = None
    max_relative_error: float | None = None
    min_pck: float | None = None
    max_keypoint_error: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def resolved(self, defaults: dict[str, float]) -> AccuracyGoal:
        """The task's ``defaults`` with this goal's own fields over them."""
        return AccuracyGoal(**{**defaults, **self.to_dict()})


@dataclass
class Recipe:
    """A parsed recipe. Paths are absolute (resolved against the recipe's folder)."""

    name: str
    version: str
    model: str
    target: str
    precision: str
    max_batch: int = 8
    input_name: str | None = None
    # [input] shapes: per input a full shape (dynamic non-batch sizes) or {min, opt, max} shapes.
    input_shapes: dict[str, Any] = field(default_factory=dict)
    # [input] batch_axes: per input its batch axis, or None for an input without one.
    batch_axes: dict[str, int | None] = field(default_factory=dict)
    preprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    postprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    calibration_data: str = ""
    calibration_samples: int = 128
    calibration_method: str = "percentile"
    bias_correction: bool = True
    # [quantization] exclude: node-name or op-type patterns (fnmatch) kept in float.
    exclude: list[str] = field(default_factory=list)
    evaluation_data: str = ""
    evaluation_samples: int = 200
    sensitivity_samples: int = 96
    accuracy: AccuracyGoal = field(default_factory=AccuracyGoal)
    latency_p95_ms: float | None = None
    source: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "model": {"source": self.model},
            "target": {"board": self.target, "precision": self.precision, "max_batch": self.max_batch},
            "input": {k: v for k, v in (("name", self.input_name), ("shapes", self.input_shapes),
                                        ("batch_axes", {n: ("none" if a is None else a)
                                                        for n, a in self.batch_axes.items()}))
                      if v},
            "quantization": {"exclude": list(self.exclude)} if self.exclude else {},
            "preprocess": self.preprocess,
            "postprocess": self.postprocess,
            "calibration": {
                "data": self.calibration_data,
                "samples": self.calibration_samples,
                "method": self.calibration_method,
                "bias_correction": self.bias_correction,
            },
            "evaluation": {
                "data": self.evaluation_data,
                "samples": self.evaluation_samples,
                "sensitivity_samples": self.sensitivity_samples,
            },
            "accuracy": self.accuracy.to_dict(),
            "latency": {"p95_ms": self.latency_p95_ms} if self.latency_p95_ms else {},
        }


def _get(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise RecipeError(f"{where}: missing field '{key}'")
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise RecipeError(f"{where}: field '{key}' must be {name}, got {type(value).__name__}")
    return value


def _table(data: dict[str, Any], key: str, where: str, known: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The ``[key]`` table; with ``known``, a field outside it is an error naming it (a typo such as
    ``[input] shape`` must not be silently ignored)."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: [{key}] must be a table")
    if known is not None:
        bad = sorted(set(value) - set(known))
        if bad:
            raise RecipeError(f"{where}: [{key}] unknown field '{bad[0]}' (known: {', '.join(sorted(known))})")
    return value


_INPUT_KEYS = ("name", "shapes", "batch_axes")
_QUANT_KEYS = ("exclude",)
_CALIB_KEYS = ("data", "samples", "method", "bias_correction")
_EVAL_KEYS = ("data", "samples", "sensitivity_samples")
_PRE_KEYS = ("kind", "size", "resize", "letterbox", "layout", "color", "mean", "std", "scale", "dtype")


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                              for d in value):
        raise RecipeError(f"{where} must be a list of positive integers, got {value!r}")
    return [int(d) for d in value]


def check_input_shapes(shapes: Any, where: str) -> dict[str, Any]:
    """``[input] shapes``: per input a full shape, or ``{min, opt, max}`` shapes of one rank, min <= opt <= max."""
    if not isinstance(shapes, dict):
        raise RecipeError(f"{where}: field 'shapes' must be a table of input name = shape")
    out: dict[str, Any] = {}
    for name, value in shapes.items():
        w = f"{where}: shapes.{name}"
        if isinstance(value, list):
            out[name] = _shape(value, w)
            continue
        if not isinstance(value, dict):
            raise RecipeError(f"{w} must be a shape [1, 3, 640, 640] or {{min = [...], opt = [...], max = [...]}}")
        bad = sorted(set(value) - {"min", "opt", "max"})
        if bad or set(value) != {"min", "opt", "max"}:
            raise RecipeError(f"{w} needs exactly min, opt and max" + (f" (unknown '{bad[0]}')" if bad else ""))
        prof = {k: _shape(value[k], f"{w}.{k}") for k in ("min", "opt", "max")}
        if len({len(v) for v in prof.values()}) != 1:
            raise RecipeError(f"{w}: min, opt and max must have the same rank")
        if not all(a <= b <= c for a, b, c in zip(prof["min"], prof["opt"], prof["max"], strict=True)):
            raise RecipeError(f"{w}: needs min <= opt <= max in every dimension")
        out[name] = prof
    return out


def _check_batch_axes(axes: Any, where: str) -> dict[str, int | None]:
    if not isinstance(axes, dict):
        raise RecipeError(f"{where}: field 'batch_axes' must be a table of input name = axis (or \"none\")")
    out: dict[str, int | None] = {}
    for name, value in axes.items():
        if value == "none":
            out[name] = None
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[name] = value
        else:
            raise RecipeError(f"{where}: batch_axes.{name} must be an axis >= 0 or \"none\", got {value!r}")
    return out


def _check_exclude(quant: dict[str, Any], where: str) -> list[str]:
    patterns = _get(quant, "exclude", list, f"{where} [quantization]", [])
    if not all(isinstance(p, str) and p for p in patterns):
        raise RecipeError(f"{where}: [quantization] field 'exclude' must be a list of node-name or op-type patterns")
    return list(patterns)


def _check_preprocess(pre: dict[str, Any], where: str) -> dict[str, Any]:
    kind = _get(pre, "kind", str, f"{where} [preprocess]", "none")
    if kind not in _PRE_KINDS:
        raise RecipeError(f"{where}: [preprocess] kind must be one of {_PRE_KINDS}, got '{kind}'")
    if kind == "none":
        extra = sorted(set(pre) - {"kind"})
        if extra:
            raise RecipeError(f"{where}: [preprocess] field '{extra[0]}' needs kind = \"image\"")
        return {"kind": "none"}
    w = f"{where} [preprocess]"
    bad = sorted(set(pre) - set(_PRE_KEYS))
    if bad:
        raise RecipeError(f"{w}: unknown field '{bad[0]}' (known: {', '.join(_PRE_KEYS)})")
    size = _get(pre, "size", list, w)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise RecipeError(f"{w}: field 'size' must be [height, width] of positive integers")
    mean = _get(pre, "mean", list, w, [0.0, 0.0, 0.0])
    std = _get(pre, "std", list, w, [1.0, 1.0, 1.0])
    for key, vals in (("mean", mean), ("std", std)):
        if len(vals) != 3 or not all(isinstance(v, (int, float)) for v in vals):
            raise RecipeError(f"{w}: field '{key}' must be 3 numbers")
    if any(float(s) == 0 for s in std):
        raise RecipeError(f"{w}: field 'std' must not contain 0")
    # scale multiplies after the mean is taken off ((pixel - mean) / std * scale): YOLO's 1/255 is
    # scale = 0.00392..., folded into std so the device's pipeline needs no new field.
    scale = _get(pre, "scale", float, w, 1.0)
    if not scale > 0:
        raise RecipeError(f"{w}: field 'scale' must be positive")
    std = [float(s) / scale for s in std]
    color = _get(pre, "color", str, w, "RGB").upper()
    layout = _get(pre, "layout", str, w, "NCHW").upper()
    resize = _get(pre, "resize", str, w, "bilinear")
    if color not in ("RGB", "BGR"):
        raise RecipeError(f"{w}: field 'color' must be RGB or BGR")
    if layout not in ("NCHW", "NHWC"):
        raise RecipeError(f"{w}: field 'layout' must be NCHW or NHWC")
    if resize not in ("bilinear",):
        raise RecipeError(f"{w}: field 'resize' must be 'bilinear'")
    dtype = _get(pre, "dtype", str, w, "float32")
    if dtype not in ("float32", "float16"):
        raise RecipeError(f"{w}: field 'dtype' must be float32 or float16")
    return {
        "kind": "image",
        "size": [int(s) for s in size],
        "resize": resize,
        "letterbox": bool(_get(pre, "letterbox", bool, w, False)),
        "layout": layout,
        "color": color,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "dtype": dtype,
    }


def _check_postprocess(post: dict[str, Any], where: str) -> dict[str, Any]:
    w = f"{where} [postprocess]"
    kind = _get(post, "kind", str, w, "none")
    if kind != "none" and kind not in TASK_KINDS:
        raise RecipeError(f"{w}: kind must be {choices(TASK_KINDS)} (or left out to infer it), got '{kind}'")
    if kind == "classification":
        top_k = _get(post, "top_k", int, w, 5)
        if top_k < 1:
            raise RecipeError(f"{w}: field 'top_k' must be at least 1")
        return {"kind": kind, "softmax": bool(_get(post, "softmax", bool, w, True)), "top_k": top_k}
    if kind == "detection":
        head = _get(post, "head", str, w, "yolo")
        if head not in DETECTION_HEADS:
            raise RecipeError(f"{w}: field 'head' must be {choices(DETECTION_HEADS)}, got '{head}'")
        fmt = _get(post, "box_format", str, w, "cxcywh" if head == "yolo" else "xyxy")
        if fmt not in ("cxcywh", "xyxy"):
            raise RecipeError(f"{w}: field 'box_format' must be cxcywh or xyxy")
        out = {
            "kind": kind,
            "head": head,
            "box_format": fmt,
            "score_threshold": _get(post, "score_threshold", float, w, 0.25),
            "iou_threshold": _get(post, "iou_threshold", float, w, 0.45),
            "class_agnostic": bool(_get(post, "class_agnostic", bool, w, False)),
            "max_detections": _get(post, "max_detections", int, w, 100),
        }
        if "objectness" in post:
            out["objectness"] = bool(_get(post, "objectness", bool, w))
        if "stride" in post:
            out["stride"] = _get(post, "stride", int, w)
        if "strides" in post:
            strides = _get(post, "strides", list, w)
            if not strides or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in strides):
                raise RecipeError(f"{w}: field 'strides' must be a list of positive integers, e.g. [8, 16, 32]")
            out["strides"] = list(strides)
        for key in ("score_threshold", "iou_threshold"):
            if not 0.0 <= out[key] <= 1.0:
                raise RecipeError(f"{w}: field '{key}' must be within 0..1")
        return out
    if kind == "segmentation":
        return {"kind": kind, "threshold": _get(post, "threshold", float, w, 0.5)}
    if kind == "ctc":
        return {"kind": kind, "blank": _get(post, "blank", int, w, 0)}
    if kind == "stream":
        state = _get(post, "state", dict, w, None)
        if not state or not all(isinstance(k, str) and isinstance(v, str) for k, v in state.items()):
            raise RecipeError(f"{w}: field 'state' must map each state input to the output that feeds it, "
                              'e.g. state = { state = "stateN" }')
        out = {"kind": kind, "state": dict(state), "threshold": _get(post, "threshold", float, w, 0.5),
               "stream_length": _get(post, "stream_length", int, w, 0)}
        if "decision" in post:
            out["decision"] = _get(post, "decision", str, w)
        if out["stream_length"] < 0:
            raise RecipeError(f"{w}: field 'stream_length' must be 0 (one stream) or more")
        return out
    if kind == "keypoints":
        layout = _get(post, "layout", str, w, "xyxy")
        if layout not in KEYPOINT_LAYOUTS:
            raise RecipeError(f"{w}: field 'layout' must be {choices(KEYPOINT_LAYOUTS)}, got '{layout}'")
        out = {"kind": kind, "layout": layout, "scale": _get(post, "scale", float, w, 1.0),
               "pck_threshold": _get(post, "pck_threshold", float, w, 0.05)}
        for key in ("output", "score_output"):
            if key in post:
                out[key] = _get(post, key, str, w)
        if "score_output" in out:
            out["score_threshold"] = _get(post, "score_threshold", float, w, 0.5)
            out["score_index"] = _get(post, "score_index", int, w, -1)
        if out["scale"] <= 0 or out["pck_threshold"] <= 0:
            raise RecipeError(f"{w}: fields 'scale' and 'pck_threshold' must be above 0")
        return out
    if kind in ("embedding", "regression"):
        return {"kind": kind}
    return {"kind": "none"}


def check_postprocess(post: dict[str, Any], where: str = "recipe") -> dict[str, Any]:
    """A ``[postprocess]`` table checked and filled with its defaults (``--kind`` uses it too)."""
    return _check_postprocess(post, where)


def _resolve(value: str, base: Path | None, where: str = "recipe") -> str:
    if not value or value.startswith("builtin:") or base is None:
        return value
    try:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())
    except (RuntimeError, ValueError, OSError) as exc:  # "~nobody/x", a NUL byte, a loop of links
        raise RecipeError(f"{where}: cannot use the path {value[:200]!r}: {exc}") from None


def recipe_from_dict(data: dict[str, Any], where: str = "recipe", base: Path | None = None) -> Recipe:
    """Validate a recipe dict; ``base`` resolves relative paths."""
    known = {"name", "version", "model", "target", "input", "preprocess", "postprocess", "calibration",
             "evaluation", "accuracy", "latency", "quantization"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecipeError(f"{where}: unknown section or field '{unknown[0]}' (known: {', '.join(sorted(known))})")
    model = _table(data, "model", where, ("source",))
    target = _table(data, "target", where, ("board", "precision", "max_batch"))
    calib = _table(data, "calibration", where, _CALIB_KEYS)
    evaluation = _table(data, "evaluation", where, _EVAL_KEYS)
    acc = _table(data, "accuracy", where)
    inp = _table(data, "input", where, _INPUT_KEYS)
    quant = _table(data, "quantization", where, _QUANT_KEYS)
    input_name = _get(inp, "name", str, f"{where} [input]", None)
    precision = _get(target, "precision", str, f"{where} [target]", "fp32")
    if precision not in PRECISIONS:
        raise RecipeError(f"{where}: [target] precision must be one of {PRECISIONS}, got '{precision}'")
    board = _get(target, "board", str, f"{where} [target]")
    try:
        get_target(board)
    except Exception as exc:
        raise RecipeError(f"{where}: [target] board: {exc}") from None
    method = _get(calib, "method", str, f"{where} [calibration]", "percentile")
    if method not in CALIBRATION_METHODS:
        raise RecipeError(f"{where}: [calibration] method must be {choices(CALIBRATION_METHODS)}, got '{method}'")
    goal_fields = set(AccuracyGoal.__dataclass_fields__)
    bad = sorted(set(acc) - goal_fields)
    if bad:
        raise RecipeError(f"{where}: [accuracy] unknown field '{bad[0]}' (known: {', '.join(sorted(goal_fields))})")
    goal = AccuracyGoal(**{k: float(_get(acc, k, (int, float), f"{where} [accuracy]")) for k in acc})
    max_batch = _get(target, "max_batch", int, f"{where} [target]", 8)
    if max_batch < 1:
        raise RecipeError(f"{where}: [target] max_batch must be at least 1")
    samples = {
        "calibration": _get(calib, "samples", int, f"{where} [calibration]", 128),
        "evaluation": _get(evaluation, "samples", int, f"{where} [evaluation]", 200),
    }
    for key, n in samples.items():
        if n < 1:
            raise RecipeError(f"{where}: [{key}] samples must be at least 1")
    latency = _table(data, "latency", where, ("p95_ms",))
    return Recipe(
        name=_get(data, "name", str, where),
        version=str(_get(data, "version", (str, int, float), where, "1.0.0")),
        model=_resolve(_get(model, "source", str, f"{where} [model]"), base, f"{where} [model]"),
        target=board,
        precision=precision,
        max_batch=max_batch,
        input_name=input_name,
        input_shapes=check_input_shapes(inp.get("shapes", {}), f"{where} [input]"),
        batch_axes=_check_batch_axes(inp.get("batch_axes", {}), f"{where} [input]"),
        exclude=_check_exclude(quant, where),
        preprocess=_check_preprocess(_table(data, "preprocess", where), where),
        postprocess=_check_postprocess(_table(data, "postprocess", where), where),
        calibration_data=_resolve(_get(calib, "data", str, f"{where} [calibration]", ""), base,
                                  f"{where} [calibration]"),
        calibration_samples=samples["calibration"],
        calibration_method=method,
        bias_correction=_get(calib, "bias_correction", bool, f"{where} [calibration]", True),
        evaluation_data=_resolve(_get(evaluation, "data", str, f"{where} [evaluation]", ""), base,
                                 f"{where} [evaluation]"),
        evaluation_samples=samples["evaluation"],
        sensitivity_samples=_get(evaluation, "sensitivity_samples", int, f"{where} [evaluation]", 96),
        accuracy=goal,
        latency_p95_ms=float(latency["p95_ms"]) if "p95_ms" in latency else None,
        source=None,
    )


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe TOML file."""
    path = Path(path)
    try:
        data = load_toml(path)
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe not found") from None
    except TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror})") from None
    recipe = recipe_from_dict(data, str(path), path.parent.resolve())
    recipe.source = path.resolve()
    return recipe


def _number(text: str, what: str) -> float:
    """``0.5``, ``1/255``: a number as a command line writes it."""
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise RecipeError(f"{what}: '{text}' is not a number") from None


def preprocess_from_text(text: str) -> dict[str, Any]:
    """``--preprocess``: the ``[preprocess]`` table from one line, checked as a recipe's is.

    Grammar: ``none`` or ``image:HxW`` then comma-separated options: ``letterbox``, ``rgb``/``bgr``,
    ``nchw``/``nhwc``, ``fp16``, ``scale=1/255``, ``mean=M`` or ``mean=R/G/B`` (pixel units, ``/``
    between channels), ``std=S`` or ``std=R/G/B``. Example: ``image:320x320,letterbox,rgb,scale=1/255``.
    """
    what = f"--preprocess '{text}'"
    head, _, rest = text.strip().partition(",")
    kind, _, size = head.partition(":")
    if kind == "none" and not size and not rest:
        return {"kind": "none"}
    if kind != "image":
        raise RecipeError(f"{what}: must start with image:HxW (or be 'none')")
    try:
        h, w = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise RecipeError(f"{what}: the size must be HxW, such as image:320x320") from None
    table: dict[str, Any] = {"kind": "image", "size": [h, w]}
    for opt in [o.strip() for o in rest.split(",") if o.strip()]:
        key, eq, value = opt.partition("=")
        key = key.lower()
        if not eq and key == "letterbox":
            table["letterbox"] = True
        elif not eq and key in ("rgb", "bgr"):
            table["color"] = key.upper()
        elif not eq and key in ("nchw", "nhwc"):
            table["layout"] = key.upper()
        elif not eq and key == "fp16":
            table["dtype"] = "float16"
        elif eq and key == "scale":
            table["scale"] = _number(value, what)
        elif eq and key in ("mean", "std"):
            parts = value.split("/") if value.count("/") == 2 else [value]
            nums = [_number(p, what) for p in parts]
            table[key] = nums * 3 if len(nums) == 1 else nums
        else:
            raise RecipeError(f"{what}: unknown option '{opt}' (letterbox, rgb, bgr, nchw, nhwc, fp16, scale=, "
                              "mean=, std=)")
    return _check_preprocess(table, "--preprocess")


def input_shape_from_text(text: str) -> tuple[str, Any]:
    """``--input-shape``: ``NAME:1x3x320x320`` (one shape) or ``NAME:MIN,OPT,MAX`` (a profile)."""
    name, sep, shapes = text.rpartition(":")
    if not sep or not name:
        raise RecipeError(f"--input-shape '{text}': write NAME:1x3x320x320 or NAME:MIN,OPT,MAX")
    try:
        parsed = [[int(d) for d in part.lower().split("x")] for part in shapes.split(",")]
    except ValueError:
        raise RecipeError(f"--input-shape '{text}': dimensions must be integers joined by x") from None
    if len(parsed) == 1:
        return name, check_input_shapes({name: parsed[0]}, "--input-shape")[name]
    if len(parsed) != 3:
        raise RecipeError(f"--input-shape '{text}': give one shape or three (min,opt,max)")
    prof = dict(zip(("min", "opt", "max"), parsed, strict=True))
    return name, check_input_shapes({name: prof}, "--input-shape")[name]
