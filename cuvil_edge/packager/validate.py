"""Compare a quantized model with its FP32 original on data calibration did not see.

What is measured follows the model's job (``packager/tasks``): class agreement for classifiers,
recall and precision of decoded boxes for detectors, IoU of decoded masks, CTC text agreement,
decisions of a model run as a stream with its own state, cosine and relative error for embeddings.
Every output gets cosine, relative error, mean and max absolute error whatever the task, and goals
on those hold for the worst output. The task is the recipe's ``[postprocess] kind`` or, when it says
nothing, inferred from the outputs; the report says which. A goal the task cannot measure is an
error, never a pass.
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
from cuvil_edge.packager.tasks import (
    TaskSpec,
    classification,
    measure,
    needs_outputs,
    resolve_task,
    segmentation,
    stream,
)
from cuvil_edge.packager.tasks import goal_failures as _task_goal_failures
from cuvil_edge.packager.tasks._common import output_figures
from cuvil_edge.recipes import AccuracyGoal

__all__ = ["ValidationReport", "compare_outputs", "fused_session", "goal_failures", "make_session", "model_outputs_for",
           "run_model", "probe_task", "task_for", "validate_models"]

CONFIDENT = classification.CONFIDENT


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


def fused_session(model: bytes) -> ort.InferenceSession:
    """A CPU session as ONNX Runtime serves the file on a CPU board: QDQ fusions on (integer kernels).

    Never used for an accuracy verdict (those are ``make_session``'s); only to know how far a
    board's integer kernels may legitimately land from the file's exact arithmetic."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
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
    # Samples of one shape run together (a batch per shape), and their outputs go back in order.
    order = data.shape_order() if batch > 1 else None
    run_on = data.take(order) if order is not None else data
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for _, _, feed in run_on.batches(batch):
        for name, arr in zip(names, session.run(names, feed), strict=True):
            parts[name].append(np.asarray(arr, dtype=np.float32))
    out: dict[str, np.ndarray | list[np.ndarray]] = {}
    back = np.argsort(order) if order is not None else None
    for k, v in parts.items():
        if len({a.shape[1:] for a in v}) <= 1:
            whole = np.concatenate(v)
            out[k] = whole[back] if back is not None and len(whole) == len(back) else whole
        else:
            each = [a[i : i + 1] for a in v for i in range(len(a))]
            out[k] = [each[i] for i in back] if back is not None and len(each) == len(back) else each
    return out


def compare_outputs(
    ref: np.ndarray | list[np.ndarray], test: np.ndarray | list[np.ndarray], kind: str,
    labels: np.ndarray | None = None, threshold: float = 0.5,
) -> dict[str, Any]:
    """Metrics of ``test`` against ``ref`` for one output: the figures every output gets, plus class
    agreement (``kind="classification"``, one ``[N, C]`` output) or mask IoU (maps of rank >= 3)."""
    m: dict[str, Any] = {"task": kind, **output_figures(ref, test)}
    if kind == "classification" and not isinstance(ref, list) and ref.ndim == 2 and ref.shape[1] > 1:
        m.update(classification.classify(np.asarray(ref), np.asarray(test), labels))
    elif np.asarray(ref[0] if isinstance(ref, list) else ref).ndim >= 3 and kind in ("segmentation", "other"):
        pairs = zip(ref if isinstance(ref, list) else list(ref), test if isinstance(test, list) else list(test),
                    strict=True)
        m["mask_iou"] = float(np.mean([segmentation.mask_iou(r, t, threshold) for r, t in pairs]))
    return m


def goal_failures(metrics: dict[str, Any], goal: AccuracyGoal) -> list[str]:
    """Human-readable misses, e.g. 'top5_containment 0.990 < 0.995 (short by 0.005)'.

    The task's default goals (``metrics["task"]``) fill the fields ``goal`` leaves unset.

    Raises:
        RecipeError: a goal whose metric cannot be computed for this task, naming it and the fix.
    """
    from cuvil_edge.packager.tasks import TASKS

    kind = metrics.get("task")
    if kind in TASKS:
        goal = goal.resolved(TASKS[kind].goals)
    return _task_goal_failures(metrics, goal, kind)


@dataclass
class ValidationReport:
    """Per-output figures and the task's metrics of the quantized model against the original, and
    the goal's verdict."""

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


def task_for(reference: ort.InferenceSession, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None
             ) -> TaskSpec:
    """The task to validate for: declared (a kind or a ``[postprocess]`` spec), or inferred from the
    original's outputs on the first sample when the recipe says nothing."""
    if isinstance(kind, TaskSpec):
        return kind
    post = {"kind": kind} if isinstance(kind, str) else dict(kind or {"kind": "none"})
    if needs_outputs(post):
        feed = next(data.batches(1))[2]  # one sample: its outputs' shapes are exact (state axes too)
        names = [o.name for o in reference.get_outputs()]
        values = dict(zip(names, reference.run(names, feed), strict=True))
        return resolve_task(post, values, feed)
    return resolve_task(post)


def probe_task(model: onnx.ModelProto, post: dict[str, Any] | None = None) -> tuple[TaskSpec | None, str]:
    """The task ``inspect`` shows when no data is at hand: the declared one, or the one inferred from
    the outputs of one run on a random input (dynamic dims set to 1 for the batch, 256 for an image's height and width, 64 elsewhere).

    Returns ``(spec, "")``, or ``(None, why)`` when the model cannot be run on a made-up input."""
    if post and not needs_outputs(post):
        return resolve_task(post), ""
    rng = np.random.default_rng(0)
    try:
        session = make_session(model)
        feed: dict[str, np.ndarray] = {}
        for inp in session.get_inputs():
            spatial = 256 if len(inp.shape) == 4 else 64  # images: room for a detector's anchors
            dims = [d if isinstance(d, int) and d > 0 else (1 if i == 0 else spatial) for i, d in enumerate(inp.shape)]
            if "int" in inp.type:
                feed[inp.name] = np.ones(dims, dtype=np.int64 if "int64" in inp.type else np.int32)
            else:
                dtype = np.float16 if "float16" in inp.type else np.float32
                feed[inp.name] = rng.random(dims).astype(dtype)
        names = [o.name for o in session.get_outputs()]
        values = dict(zip(names, session.run(names, feed), strict=True))
    except Exception as exc:  # any model a made-up input cannot drive
        return None, f"not inferred: the model does not run on a made-up input ({str(exc).splitlines()[0][:120]})"
    return resolve_task(post, values, feed), ""


def model_outputs_for(session: ort.InferenceSession, data: Dataset, spec: TaskSpec) -> dict[str, Any]:
    """The outputs the task compares: a stream run with carried state, or one run per batch."""
    if spec.kind == "stream":
        return stream.run_stream(session, data, spec.post)
    return run_model(session, data)


def validate_models(
    reference: ort.InferenceSession | dict[str, np.ndarray],
    candidate: ort.InferenceSession,
    data: Dataset,
    kind: str | dict[str, Any] | TaskSpec | None,
    goal: AccuracyGoal | None,
    threshold: float = 0.5,
) -> ValidationReport:
    """Run both on ``data`` (or reuse reference outputs) and check ``goal`` on the task's metrics and on
    every output; the task's default goals fill what ``goal`` leaves unset (``goal=None``: no goal)."""
    if isinstance(reference, dict):
        spec = kind if isinstance(kind, TaskSpec) else resolve_task(kind, reference, next(data.batches(1))[2])
        ref_out = reference
    else:
        spec = task_for(reference, data, kind)
        ref_out = model_outputs_for(reference, data, spec)
    if spec.kind == "segmentation" and "threshold" not in spec.post:
        spec.post["threshold"] = threshold
    test_out = model_outputs_for(candidate, data, spec)
    task_metrics, outputs = measure(ref_out, test_out, spec, data.labels)
    # The decoded output's entry carries the task's metrics too (reports and scripts read it there).
    primary = task_metrics.get("scores_output") or task_metrics.get("mask_output") or task_metrics.get("sequence_output")
    if primary in outputs:
        outputs[primary].update({k: v for k, v in task_metrics.items() if k not in ("cosine", "mae", "relative_error")})
    resolved = spec.goal(goal) if goal is not None else AccuracyGoal()
    failures = _task_goal_failures(task_metrics, resolved, spec.kind) if goal is not None else []
    return ValidationReport(outputs, resolved.to_dict(), failures, data.source,
                            {"task": spec.to_dict(), "task_metrics": task_metrics})
