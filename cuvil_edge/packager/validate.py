"""Compare a quantized model with its FP32 original on data calibration did not see.

Classifiers: top-1 agreement overall and on confident samples (original's top-1 probability at
least 0.5: random crops often leave the original undecided, so overall agreement understates
quality), top-5 containment, mean KL divergence, cosine similarity, max absolute error, and
accuracy against labels when the data has them. Dense maps: mean absolute error and IoU of
thresholded masks. Other outputs: cosine, mean and max absolute error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from cuvil_edge.errors import AccuracyError, ModelError
from cuvil_edge.packager.data import Dataset
from cuvil_edge.recipes import AccuracyGoal

__all__ = ["ValidationReport", "compare_outputs", "goal_failures", "make_session", "run_model", "validate_models"]

CONFIDENT = 0.5


# ``CUVIL_EDGE_ORT_OPTIMIZATION`` (disable|basic|extended|all, default all) sets ONNX Runtime's graph
# optimisation level for every packager session. A diagnostic knob: accuracy verdicts are computed on
# emulated models (``emulate.py``) and must not move with it; a test holds them to that.
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
               "all": "ORT_ENABLE_ALL"}


def make_session(model: onnx.ModelProto | Path | bytes, threads: int = 0) -> ort.InferenceSession:
    """A CPU session that computes a Q/DQ model exactly as written: the target's arithmetic.

    ONNX Runtime's QDQ fusions are off (``session.disable_quant_qdq``): each QuantizeLinear and
    DequantizeLinear runs as its own kernel (divide, round half to even, saturate; subtract, multiply)
    and the operator between them runs in float, which is what TensorRT and non-saturating integer
    kernels compute, up to float rounding. The fused x86 u8s8 kernels would saturate on CPUs without
    AVX-512 VNNI and make every verdict the host's. ``emulate.py`` is an independent rewrite of the
    same semantics in float operators; the tests hold the two to each other. ``WeightBiasQuantization``
    is disabled too: it would re-quantize (per tensor) the FP32 weights of layers a mixed model
    deliberately kept in float."""
    import os

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    level = os.environ.get("CUVIL_EDGE_ORT_OPTIMIZATION", "all").strip().lower()
    if level not in _OPT_LEVELS:
        raise ModelError(f"CUVIL_EDGE_ORT_OPTIMIZATION='{level}' is not one of {', '.join(_OPT_LEVELS)}")
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[level])
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    if threads:
        opts.intra_op_num_threads = threads
    src: Any = model.SerializeToString() if isinstance(model, onnx.ModelProto) else (
        model if isinstance(model, bytes) else str(model)
    )
    try:
        return ort.InferenceSession(
            src, opts, providers=["CPUExecutionProvider"], disabled_optimizers=["WeightBiasQuantization"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped exceptions
        raise ModelError(f"ONNX Runtime cannot load the model: {str(exc).splitlines()[0]}") from None


def run_model(session: ort.InferenceSession, data: Dataset, batch: int = 32) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Run ``data`` through ``session`` in batches; outputs by name, concatenated.

    When output shapes differ between samples (dynamic H/W), an output is a list of per-sample
    ``[1, ...]`` arrays instead of one array.
    """
    names = [o.name for o in session.get_outputs()]
    dyn_batch = {i.name: not i.shape or not isinstance(i.shape[0], int) for i in session.get_inputs()}
    if not all(dyn_batch.values()):
        batch = 1
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for _, _, feed in data.batches(batch):
        for name, arr in zip(names, session.run(names, feed), strict=True):
            parts[name].append(np.asarray(arr, dtype=np.float32))
    out: dict[str, np.ndarray | list[np.ndarray]] = {}
    for k, v in parts.items():
        if len({a.shape[1:] for a in v}) <= 1:
            out[k] = np.concatenate(v)
        else:
            out[k] = [a[i : i + 1] for a in v for i in range(len(a))]
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a2 = a.reshape(len(a), -1).astype(np.float64)
    b2 = b.reshape(len(b), -1).astype(np.float64)
    den = np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)
    cos = np.where(den > 0, (a2 * b2).sum(axis=1) / np.maximum(den, 1e-30), 1.0)
    return float(cos.mean())


def compare_outputs(
    ref: np.ndarray | list[np.ndarray], test: np.ndarray | list[np.ndarray], kind: str,
    labels: np.ndarray | None = None, threshold: float = 0.5,
) -> dict[str, Any]:
    """Metrics of ``test`` against ``ref`` for one output.

    Per-sample outputs of different shapes (lists) are compared sample by sample: means of the
    per-sample figures, the largest ``max_abs_error``.
    """
    if isinstance(ref, list) or isinstance(test, list):
        per = [compare_outputs(np.asarray(r), np.asarray(t), kind, None, threshold) for r, t in zip(ref, test, strict=True)]
        merged: dict[str, Any] = {"samples": len(per)}
        for key in per[0]:
            if key == "samples":
                continue
            values = [p[key] for p in per if p.get(key) is not None]
            merged[key] = max(values) if key == "max_abs_error" else float(np.mean(values))
        return merged
    m: dict[str, Any] = {
        "samples": len(ref),
        "cosine": _cosine(ref, test),
        "mae": float(np.abs(ref - test).mean()),
        "max_abs_error": float(np.abs(ref - test).max()),
    }
    if kind == "classification" and ref.ndim == 2 and ref.shape[1] > 1:
        p, q = _softmax(ref.astype(np.float64)), _softmax(test.astype(np.float64))
        top1_ref, top1_test = p.argmax(1), q.argmax(1)
        k = min(5, ref.shape[1])
        top5_test = np.argsort(-q, axis=1)[:, :k]
        confident = p.max(1) >= CONFIDENT
        agree = top1_ref == top1_test
        m.update(
            {
                "top1_agreement": float(agree.mean()),
                "confident_samples": int(confident.sum()),
                "confident_top1_agreement": float(agree[confident].mean()) if confident.any() else None,
                "top5_containment": float((top5_test == top1_ref[:, None]).any(1).mean()),
                "mean_kl": float((p * (np.log(p + 1e-12) - np.log(q + 1e-12))).sum(1).mean()),
            }
        )
        if labels is not None and len(labels) == len(ref):
            m["label_accuracy_reference"] = float((top1_ref == labels).mean())
            m["label_accuracy"] = float((top1_test == labels).mean())
    elif ref.ndim >= 3:
        def to_mask(x: np.ndarray) -> np.ndarray:
            prob = x if (x.min() >= 0 and x.max() <= 1) else 1 / (1 + np.exp(-x))
            return prob >= threshold

        a, b = to_mask(ref).reshape(len(ref), -1), to_mask(test).reshape(len(test), -1)
        inter, union = (a & b).sum(1), (a | b).sum(1)
        m["mask_iou"] = float(np.where(union > 0, inter / np.maximum(union, 1), 1.0).mean())
    return m


_GOAL_KEYS = {
    "min_top1_agreement": ("top1_agreement", 1),
    "min_confident_top1_agreement": ("confident_top1_agreement", 1),
    "min_top5_containment": ("top5_containment", 1),
    "max_mean_kl": ("mean_kl", -1),
    "min_cosine": ("cosine", 1),
    "max_mae": ("mae", -1),
    "min_mask_iou": ("mask_iou", 1),
    "min_label_accuracy": ("label_accuracy", 1),
}


def goal_failures(metrics: dict[str, Any], goal: AccuracyGoal) -> list[str]:
    """Human-readable misses, e.g. 'top5_containment 0.990 < 0.995 (short by 0.005)'."""
    misses = []
    for key, limit in goal.to_dict().items():
        metric, sign = _GOAL_KEYS[key]
        value = metrics.get(metric)
        if value is None:
            continue
        if sign > 0 and value < limit:
            misses.append(f"{metric} {value:.4f} < {limit:.4f} (short by {limit - value:.4f})")
        if sign < 0 and value > limit:
            misses.append(f"{metric} {value:.4f} > {limit:.4f} (over by {value - limit:.4f})")
    return misses


@dataclass
class ValidationReport:
    """Per-output metrics of the quantized model against the original, and the goal's verdict."""

    outputs: dict[str, dict[str, Any]]
    goal: dict[str, float]
    failures: list[str]
    data_source: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def primary(self) -> dict[str, Any]:
        return next(iter(self.outputs.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "goal": self.goal,
            "failures": self.failures,
            "data": self.data_source,
            "outputs": self.outputs,
            **self.extra,
        }

    def raise_if_failed(self, what: str) -> None:
        if self.failures:
            raise AccuracyError(f"{what} missed the accuracy goal: {'; '.join(self.failures)}")


def validate_models(
    reference: ort.InferenceSession | dict[str, np.ndarray],
    candidate: ort.InferenceSession,
    data: Dataset,
    kind: str,
    goal: AccuracyGoal,
    threshold: float = 0.5,
) -> ValidationReport:
    """Run both on ``data`` (or reuse reference outputs) and check the goal on the first output."""
    ref_out = reference if isinstance(reference, dict) else run_model(reference, data)
    test_out = run_model(candidate, data)
    outputs = {
        name: compare_outputs(ref_out[name], test_out[name], kind if i == 0 else "other", data.labels, threshold)
        for i, name in enumerate(ref_out)
    }
    first = next(iter(outputs.values()))
    return ValidationReport(outputs, goal.to_dict(), goal_failures(first, goal), data.source)
