"""Task kinds: what the accuracy gate measures, chosen from the model's job.

One table, :data:`TASKS`, keyed like ``recipes.TASK_KINDS``: each kind's metric function, its
default goals and how it is recognised from the model's outputs. The recipe parser, ``inspect``, the
package report and validation all read it, so a new kind is one module and one row.

Every output of every model also gets cosine, relative error, mean and max absolute error
(``_common.output_figures``); the task's metrics come on top. A goal whose metric the task does not
compute is an error naming the goal and the fix (:func:`goal_failures`), never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil_edge.errors import RecipeError
from cuvil_edge.packager.tasks import (
    classification,
    ctc,
    detection,
    embedding,
    keypoints,
    segmentation,
    stream,
)
from cuvil_edge.packager.tasks._common import Outputs, output_figures
from cuvil_edge.recipes import TASK_KINDS, AccuracyGoal

__all__ = ["GOAL_METRICS", "SHARE_OF", "TASKS", "Task", "TaskSpec", "declares_task", "goal_failures", "infer_task",
           "measure", "needs_outputs", "resolve_task", "search_error"]

Metric = Callable[[Outputs, Outputs, dict[str, Any], "np.ndarray | None"], dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task kind: its metric, its default goals, the goal metrics it computes."""

    name: str
    metrics: Metric
    goals: dict[str, float]
    computes: tuple[str, ...]


TASKS: dict[str, Task] = {
    "classification": Task("classification", classification.metrics, classification.GOALS, classification.METRICS),
    "detection": Task("detection", detection.metrics, detection.GOALS, detection.METRICS),
    "segmentation": Task("segmentation", segmentation.metrics, segmentation.GOALS, segmentation.METRICS),
    "ctc": Task("ctc", ctc.metrics, ctc.GOALS, ctc.METRICS),
    "stream": Task("stream", stream.metrics, stream.GOALS, stream.METRICS),
    "keypoints": Task("keypoints", keypoints.metrics, keypoints.GOALS, keypoints.METRICS),
    "embedding": Task("embedding", embedding.metrics, embedding.GOALS, embedding.METRICS),
    "regression": Task("regression", embedding.metrics, embedding.GOALS, embedding.METRICS),
}
assert list(TASKS) == list(TASK_KINDS), "packager.tasks.TASKS and recipes.TASK_KINDS name the same kinds"

# Goal field -> (metric, direction: +1 at least, -1 at most). Per-output figures (cosine, mae,
# relative_error) are computed for every task, on the worst output.
GOAL_METRICS: dict[str, tuple[str, int]] = {
    "min_top1_agreement": ("top1_agreement", 1),
    "min_confident_top1_agreement": ("confident_top1_agreement", 1),
    "min_top5_containment": ("top5_containment", 1),
    "max_mean_kl": ("mean_kl", -1),
    "min_label_accuracy": ("label_accuracy", 1),
    "min_cosine": ("cosine", 1),
    "max_mae": ("mae", -1),
    "max_relative_error": ("relative_error", -1),
    "min_mask_iou": ("mask_iou", 1),
    "min_recall": ("recall", 1),
    "min_precision": ("precision", 1),
    "min_mean_iou": ("mean_iou", 1),
    "max_score_drift": ("score_drift", -1),
    "min_map50": ("map50", 1),
    "min_sequence_agreement": ("sequence_agreement", 1),
    "max_char_error_rate": ("char_error_rate", -1),
    "min_decision_agreement": ("decision_agreement", 1),
    "min_pck": ("pck", 1),
    "max_keypoint_error": ("keypoint_error", -1),
}
assert set(GOAL_METRICS) == set(AccuracyGoal.__dataclass_fields__), "every goal field has a metric"
# Metrics that are a share of a count, and the metric key holding that count: measured on n of them,
# their sampling error is sqrt(p (1 - p) / n), which ``goal_failures(margin=...)`` allows for.
SHARE_OF: dict[str, str] = {
    "recall": "reference_detections",
    "precision": "detections",
    "top1_agreement": "samples",
    "confident_top1_agreement": "confident_samples",
    "top5_containment": "samples",
    "label_accuracy": "samples",
    "sequence_agreement": "sequences",
    "char_error_rate": "reference_characters",
    "decision_agreement": "frames",
    "pck": "scored_points",
}
_EVERY_OUTPUT = ("cosine", "mae", "relative_error")


@dataclass
class TaskSpec:
    """The task a model is validated for: its post-processing spec, and whether it was inferred."""

    post: dict[str, Any]
    inferred: bool = False
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.post["kind"])

    @property
    def task(self) -> Task:
        return TASKS[self.kind]

    def goal(self, goal: AccuracyGoal | None) -> AccuracyGoal:
        """``goal``'s own fields over this task's default goals."""
        return (goal or AccuracyGoal()).resolved(self.task.goals)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "postprocess": self.post, "inferred": self.inferred, "reason": self.reason}


def _shapes(values: Outputs) -> dict[str, tuple[int, ...]]:
    return {k: tuple(np.asarray(v[0] if isinstance(v, list) else v).shape) for k, v in values.items()}


def infer_task(values: Outputs, feed: dict[str, np.ndarray] | None = None) -> TaskSpec:
    """The task recognised from the original model's outputs on a few samples (shapes and ranges).

    ``values`` are one sample's outputs, ``feed`` its inputs. Order matters: a state fed back
    (stream), a probability sequence (ctc), CenterNet maps or a YOLO/NMS head (detection), a
    single-channel map (segmentation), class scores (classification);
    anything else is an embedding or a regression, judged by cosine and relative error.
    """
    shapes = _shapes(values)
    found = stream.infer(shapes, values, feed)
    for infer in (ctc.infer, detection.infer, segmentation.infer, classification.infer, embedding.infer):
        if found is not None:
            break
        found = infer(shapes, values)
    assert found is not None
    shown = ", ".join(f"{k} {list(v)}" for k, v in shapes.items())
    return TaskSpec(found, inferred=True, reason=f"inferred from the outputs ({shown}): {found['kind']}"
                    + (f" ({found['head']} head)" if "head" in found else "")
                    + (f", state {found['state']}" if "state" in found else ""))


def declares_task(post: dict[str, Any] | str | None) -> bool:
    """Whether a ``[postprocess]`` spec (or kind name) names a task, rather than leaving it to be inferred."""
    kind = post if isinstance(post, str) or post is None else post.get("kind")
    return kind not in (None, "", "none")


def needs_outputs(post: dict[str, Any] | str | None) -> bool:
    """Whether :func:`resolve_task` needs the original's outputs for this spec: no task declared, or
    a detection that does not say its head (read from the outputs' shapes)."""
    if not declares_task(post):
        return True
    return isinstance(post, dict) and post.get("kind") == "detection" and "head" not in post


def resolve_task(post: dict[str, Any] | str | None, values: Outputs | None = None,
                 feed: dict[str, np.ndarray] | None = None) -> TaskSpec:
    """The declared task (a ``[postprocess]`` spec or a kind name), or the one inferred from ``values``."""
    if isinstance(post, str):
        post = {"kind": post}
    kind = (post or {}).get("kind", "none")
    if kind in TASKS:
        spec = dict(post or {})
        if kind == "stream" and not spec.get("state"):
            raise RecipeError("task 'stream' needs [postprocess] state = {input = \"output\"}: which inputs carry "
                              "state and which outputs feed them")
        if kind == "detection" and values is not None and "head" not in spec:
            guess = detection.infer(_shapes(values), values)
            spec = {**(guess or {}), **spec}
        return TaskSpec(spec, inferred=False, reason="declared")
    if declares_task(kind):
        raise RecipeError(f"unknown task kind '{kind}' (known: {', '.join(TASKS)})")
    if values is None:
        raise RecipeError("no task given and no outputs to infer it from: set [postprocess] kind or --kind")
    return infer_task(values, feed)


def measure(ref: Outputs, test: Outputs, spec: TaskSpec, labels: np.ndarray | None = None
            ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The task's metrics and every output's figures; the worst output's cosine, MAE and relative
    error join the task metrics so goals on them hold for every output, not the first."""
    per_output = {name: output_figures(ref[name], test[name]) for name in ref}
    task_metrics = {"task": spec.kind, **spec.task.metrics(ref, test, spec.post, labels)}
    if per_output:
        task_metrics["cosine"] = min(o["cosine"] for o in per_output.values())
        task_metrics["mae"] = max(o["mae"] for o in per_output.values())
        task_metrics["relative_error"] = max(o["relative_error"] for o in per_output.values())
    return task_metrics, per_output


def goal_failures(metrics: dict[str, Any], goal: AccuracyGoal, kind: str | None = None, strict: bool = True,
                  margin: float = 0.0) -> list[str]:
    """Human-readable misses, e.g. 'recall 0.000 < 0.900 (short by 0.900)'.

    ``strict=False`` (the mixed search, a heuristic on calibration data) passes over a goal its data
    cannot measure; validation, which decides, is strict.

    ``margin`` (the mixed search's check on samples it never saw): a goal on a share of a count
    (``SHARE_OF``: recall of n reference detections, agreement on n samples) holds only when it holds
    by ``margin`` standard errors of a share at the goal measured on that count, ``sqrt(g (1 - g) / n)``,
    capped at a perfect score (so a perfect score always holds). Other goals are checked as given.

    Raises:
        RecipeError: a goal asks for a metric this task does not compute, naming the goal and the fix.
    """
    kind = kind or metrics.get("task")
    misses = []
    for key, limit in goal.to_dict().items():
        metric, sign = GOAL_METRICS[key]
        value = metrics.get(metric)
        if value is None and not strict and (kind not in TASKS or metric in TASKS[kind].computes):
            continue
        if value is None:
            raise RecipeError(_not_computable(key, metric, kind, metrics))
        count = metrics.get(SHARE_OF.get(metric, ""))
        why = ""
        if margin and count and 0.0 <= limit <= 1.0:
            allow = margin * math.sqrt(limit * (1.0 - limit) / count)
            limit = min(1.0, limit + allow) if sign > 0 else max(0.0, limit - allow)
            why = f", the goal {'+' if sign > 0 else '-'} {margin:g} standard error on {count}"
        if sign > 0 and value < limit:
            misses.append(f"{metric} {value:.4f} < {limit:.4f} (short by {limit - value:.4f}{why})")
        if sign < 0 and value > limit:
            misses.append(f"{metric} {value:.4f} > {limit:.4f} (over by {value - limit:.4f}{why})")
    return misses


def _not_computable(key: str, metric: str, kind: str | None, metrics: dict[str, Any]) -> str:
    owners = [t.name for t in TASKS.values() if metric in t.computes]
    where = f"task '{kind}'" if kind else "this model's task"
    if metrics.get("not_computable") and metric in (TASKS[kind].computes if kind in TASKS else ()):
        why = str(metrics["not_computable"])
    elif metric == "confident_top1_agreement":
        why = "no evaluation sample has a confident original (top-1 probability >= 0.5); give more or other data"
    elif metric in ("label_accuracy", "map50"):
        why = "the evaluation data has no labels; give labelled data or drop the goal"
    elif owners:
        why = f"it is a {' or '.join(owners)} metric: set [postprocess] kind = \"{owners[0]}\" (or --kind {owners[0]})"
    else:
        why = "drop the goal"
    return f"accuracy goal '{key}' cannot be computed for {where}: {why}, or remove '{key}' from [accuracy]"


def search_error(metrics: dict[str, Any]) -> float:
    """One figure to rank and budget quantization choices by, from the task's own metrics.

    Classifiers: mean KL. Others: the task's shortfall (1 - F1 of detections, 1 - mask IoU, the
    character error rate, 1 - decision agreement, 1 - PCK of keypoints) plus the worst output's
    1 - cosine, so a choice that breaks the job ranks first even when cosine barely moves. Detections
    add the matched boxes' mean score drift: on a few search samples F1 moves in steps of one box, and
    a cosine over box coordinates (0-320) barely sees the scores that decide which boxes pass the
    threshold.
    """
    if metrics.get("mean_kl") is not None:
        return float(metrics["mean_kl"])
    err = 1.0 - float(metrics.get("cosine", 1.0))
    if metrics.get("recall") is not None:
        r, p = float(metrics["recall"]), float(metrics["precision"])
        err += 1.0 - (2 * r * p / (r + p) if r + p else 0.0)
        err += float(metrics.get("score_drift") or 0.0)
    for key, sign in (("mask_iou", 1), ("char_error_rate", -1), ("decision_agreement", 1), ("pck", 1)):
        if metrics.get(key) is not None:
            err += (1.0 - float(metrics[key])) if sign > 0 else float(metrics[key])
    return err
