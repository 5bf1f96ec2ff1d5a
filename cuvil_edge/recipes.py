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

__all__ = ["CALIBRATION_METHODS", "PRECISIONS", "QUANTIZERS", "AccuracyGoal", "Recipe", "choices", "load_recipe",
           "recipe_from_dict"]

PRECISIONS = ("fp32", "fp16", "int8", "mixed")
_PRE_KINDS = ("image", "none")
_POST_KINDS = ("classification", "detection", "segmentation", "none")

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
    """Thresholds the quantized model must meet against the FP32 original (None: not checked)."""

    min_top1_agreement: float | None = None
    min_confident_top1_agreement: float | None = 0.99
    min_top5_containment: float | None = 0.995
    max_mean_kl: float | None = None
    min_cosine: float | None = None
    max_mae: float | None = None
    min_mask_iou: float | None = None
    min_label_accuracy: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


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
    preprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    postprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    calibration_data: str = ""
    calibration_samples: int = 128
    calibration_method: str = "percentile"
    bias_correction: bool = True
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
            "input": {"name": self.input_name} if self.input_name else {},
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


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: [{key}] must be a table")
    return value


def _check_preprocess(pre: dict[str, Any], where: str) -> dict[str, Any]:
    kind = _get(pre, "kind", str, f"{where} [preprocess]", "none")
    if kind not in _PRE_KINDS:
        raise RecipeError(f"{where}: [preprocess] kind must be one of {_PRE_KINDS}, got '{kind}'")
    if kind == "none":
        return {"kind": "none"}
    w = f"{where} [preprocess]"
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
    if kind not in _POST_KINDS:
        raise RecipeError(f"{w}: kind must be one of {_POST_KINDS}, got '{kind}'")
    if kind == "classification":
        top_k = _get(post, "top_k", int, w, 5)
        if top_k < 1:
            raise RecipeError(f"{w}: field 'top_k' must be at least 1")
        return {"kind": kind, "softmax": bool(_get(post, "softmax", bool, w, True)), "top_k": top_k}
    if kind == "detection":
        fmt = _get(post, "box_format", str, w, "cxcywh")
        if fmt not in ("cxcywh", "xyxy"):
            raise RecipeError(f"{w}: field 'box_format' must be cxcywh or xyxy")
        out = {
            "kind": kind,
            "box_format": fmt,
            "score_threshold": _get(post, "score_threshold", float, w, 0.25),
            "iou_threshold": _get(post, "iou_threshold", float, w, 0.45),
            "class_agnostic": bool(_get(post, "class_agnostic", bool, w, False)),
            "max_detections": _get(post, "max_detections", int, w, 100),
        }
        for key in ("score_threshold", "iou_threshold"):
            if not 0.0 <= out[key] <= 1.0:
                raise RecipeError(f"{w}: field '{key}' must be within 0..1")
        return out
    if kind == "segmentation":
        return {"kind": kind, "threshold": _get(post, "threshold", float, w, 0.5)}
    return {"kind": "none"}


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
             "evaluation", "accuracy", "latency"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecipeError(f"{where}: unknown section or field '{unknown[0]}' (known: {', '.join(sorted(known))})")
    model = _table(data, "model", where)
    target = _table(data, "target", where)
    calib = _table(data, "calibration", where)
    evaluation = _table(data, "evaluation", where)
    acc = _table(data, "accuracy", where)
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
    latency = _table(data, "latency", where)
    return Recipe(
        name=_get(data, "name", str, where),
        version=str(_get(data, "version", (str, int, float), where, "1.0.0")),
        model=_resolve(_get(model, "source", str, f"{where} [model]"), base, f"{where} [model]"),
        target=board,
        precision=precision,
        max_batch=max_batch,
        input_name=_table(data, "input", where).get("name"),
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
