"""Classifiers: do the quantized model's class scores pick the same classes as the original's?

Scores are logits (a softmax makes them probabilities) or, when the original's rows already sum to 1,
probabilities as they are. Top-1 agreement overall and on confident samples (original's top-1
probability at least 0.5: random crops often leave the original undecided, so overall agreement understates quality), top-5
containment, mean KL divergence, and accuracy against labels when the data has them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.packager.tasks._common import Outputs

__all__ = ["CONFIDENT", "GOALS", "METRICS", "classify", "infer", "metrics"]

CONFIDENT = 0.5
GOALS = {"min_confident_top1_agreement": 0.99, "min_top5_containment": 0.995}
METRICS = ("top1_agreement", "confident_top1_agreement", "top5_containment", "mean_kl", "label_accuracy")


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _is_probability(x: np.ndarray) -> bool:
    """True when every row of ``x`` is already a distribution (the model ends in a softmax)."""
    return bool(x.size) and float(x.min()) >= 0.0 and bool(np.all(np.abs(x.sum(axis=-1) - 1.0) < 1e-3))


def _probabilities(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` renormalised (a quantized softmax's rows sum to about 1), clipped away from 0."""
    x = np.clip(x, 1e-12, None)
    return x / x.sum(axis=-1, keepdims=True)


def classify(ref: np.ndarray, test: np.ndarray, labels: np.ndarray | None = None) -> dict[str, Any]:
    """Agreement figures of ``test`` against ``ref``, both ``[N, C]`` class scores: logits, or
    probabilities when the original's rows already are distributions (a softmax twice flattens them:
    Magika's 214 probabilities became a top-1 of at most e / (e + 213) = 0.013, never confident)."""
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    if _is_probability(ref):
        p, q = _probabilities(ref), _probabilities(test)
    else:
        p, q = _softmax(ref), _softmax(test)
    top1_ref, top1_test = p.argmax(1), q.argmax(1)
    k = min(5, ref.shape[1])
    top5_test = np.argsort(-q, axis=1)[:, :k]
    confident = p.max(1) >= CONFIDENT
    agree = top1_ref == top1_test
    m: dict[str, Any] = {
        "top1_agreement": float(agree.mean()),
        "samples": len(ref),
        "confident_samples": int(confident.sum()),
        "confident_top1_agreement": float(agree[confident].mean()) if confident.any() else None,
        "top5_containment": float((top5_test == top1_ref[:, None]).any(1).mean()),
        "mean_kl": float((p * (np.log(p + 1e-12) - np.log(q + 1e-12))).sum(1).mean()),
    }
    if labels is not None and len(labels) == len(ref):
        m["label_accuracy_reference"] = float((top1_ref == labels).mean())
        m["label_accuracy"] = float((top1_test == labels).mean())
    return m


def _scores_output(outputs: Outputs) -> str:
    for name, value in outputs.items():
        if not isinstance(value, list) and value.ndim == 2 and value.shape[1] > 1:
            return name
    return next(iter(outputs))


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    name = _scores_output(ref)
    r, t = np.asarray(ref[name]), np.asarray(test[name])
    r, t = r.reshape(len(r), -1), t.reshape(len(t), -1)
    if r.shape[1] < 2:
        return {}
    m = classify(r, t, labels)
    m["scores_output"] = name
    return m


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None) -> dict[str, Any] | None:
    """One output ``[N, C]`` with C > 1: class scores."""
    if len(shapes) == 1:
        (shape,) = shapes.values()
        if len(shape) == 2 and shape[1] > 1:
            return {"kind": "classification", "softmax": True, "top_k": min(5, shape[1])}
    return None
