"""Per-layer INT8 sensitivity: how much each layer group costs when it alone is quantized.

What ``cuvil-edge inspect --sensitivity`` prints, and what a missed goal's report ranks: the mixed
search's own ranking ("quantize only this block", ``Quantizer.sensitivity``), measured as the
target computes (exact Q/DQ emulation), on calibration data. On TensorRT boards each group's cost
in FP16 alone is measured too, so a user sees which groups FP16 would rescue.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from cuvil_edge.packager.data import Dataset
from cuvil_edge.packager.quantize import Quantizer
from cuvil_edge.packager.validate import make_session, run_model
from cuvil_edge.recipes import AccuracyGoal
from cuvil_edge.targets import Target

__all__ = ["LayerSensitivity", "layer_sensitivity"]


@dataclass(frozen=True)
class LayerSensitivity:
    """One layer group's row: its nodes and op types, the error with only it in INT8, in FP16 alone."""

    group: str
    nodes: list[str]
    op_types: list[str]
    int8_error: float
    fp16_error: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "nodes": self.nodes, "op_types": self.op_types, "int8_error": self.int8_error,
                "fp16_error": self.fp16_error}


def layer_sensitivity(
    model: onnx.ModelProto,
    target: Target,
    calibration: Dataset,
    kind: str = "none",
    method: str = "percentile",
    exclude: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    bar: Callable[[str, int, int], None] | None = None,
) -> list[LayerSensitivity]:
    """Layer groups of ``model`` from the most to the least sensitive to INT8 on ``target``.

    The error is the mean KL against FP32 for classifiers (``kind="classification"``), else
    1 - cosine, on the first samples of ``calibration`` (``quantize.SENSITIVITY_SAMPLES``).
    """
    with contextlib.redirect_stdout(io.StringIO()), Quantizer(
            model, target.runtime_format, calibration, method, progress=progress, bar=bar, arch=target.arch,
            exclude=exclude or []) as q:
        full = q.quantize()
        groups = q.groups(full)
        ranking = q.sensitivity(calibration, kind, full=full)
        float_model = q.float_model
        ops = {n.name: n.op_type for n in float_model.graph.node}
        fp16: dict[str, float] = {}
        if target.runtime_format == "tensorrt":
            data = calibration.slice(0, min(len(calibration), 48))
            ref = run_model(make_session(q.model), data)
            for i, name in enumerate(groups):
                if bar is not None:
                    bar("FP16 sensitivity", i, len(groups))
                fp16[name] = q.measure(float_model, data, ref, kind, AccuracyGoal(None, None, None), groups[name])[0]
            if bar is not None:
                bar("FP16 sensitivity", len(groups), len(groups))
    rows = [LayerSensitivity(name, groups[name], sorted({ops.get(n, "?") for n in groups[name]}), err, fp16.get(name))
            for name, err in ranking.items()]
    return sorted(rows, key=lambda r: -r.int8_error)
