"""Inspect an ONNX model for a target: the report of what its TensorRT versions and DLA will run.

For every node: whether each TensorRT version the target ships parses it
(:mod:`~cuvil_edge.packager.trt_support`), whether DLA can run it
(:mod:`~cuvil_edge.packager.dla_rules`) and, when not, why. For the model: which inputs have
dynamic dimensions and the optimization profiles (min/opt/max) an engine needs for them, one for
the GPU and a fixed one for DLA, which does not take dynamic shapes
(:mod:`~cuvil_edge.packager.profiles`). This module puts those answers together into one report
and its table; ``cuvil-edge inspect`` (:mod:`cuvil_edge.packager.cli`) prints it.

Nothing here needs TensorRT: the answers come from the documented tables, so the packager can
tell on a laptop what will fall back on the board.

    report = inspect_model(onnx.load("model.onnx"), get_target("orin-nx-16gb"), max_batch=8)
    console.print(render_inspect_table(report))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from cuvil_edge.bundle.engine_key import major_minor, version_tuple
from cuvil_edge.errors import ModelError
from cuvil_edge.packager._onnx_graph import GraphFacts, default_opset
from cuvil_edge.packager.dla_rules import (
    DLA_FOLDED,
    DLA_NA,
    DLA_NO,
    DLA_YES,
    DlaContext,
    dla_available,
    dla_check,
)
from cuvil_edge.packager.profiles import DynamicInput, dynamic_inputs, optimization_profiles
from cuvil_edge.packager.qdq_rules import QdqFacts, node_violation
from cuvil_edge.packager.trt_support import (
    PLUGIN,
    SUPPORTED,
    UNSUPPORTED,
    UNVERIFIED,
    parser_restriction,
    parser_snapshot,
    trt_op_status,
)
from cuvil_edge.targets import Target

# The report's own names, and the answers it is made of, importable from here as before the split.
__all__ = [
    "DynamicInput",
    "InspectReport",
    "NodeSupport",
    "dla_available",
    "inspect_model",
    "optimization_profiles",
    "parser_snapshot",
    "render_inspect_table",
    "trt_op_status",
]


@dataclass(frozen=True)
class NodeSupport:
    """One node's row: parser status per TensorRT version, DLA placement, reasons.

    ``tensorrt`` maps each version to ``supported``/``unsupported``/``unverified``/``plugin``;
    ``reasons`` holds a reason for every version that is not plainly supported. ``dla`` is
    ``yes``, ``no`` (falls back to the GPU), ``folded`` (no layer left after parsing) or ``n/a``
    (no DLA on this target).
    """

    index: int
    name: str
    op_type: str
    domain: str
    tensorrt: dict[str, str]
    reasons: dict[str, str]
    dla: str
    dla_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "op_type": self.op_type, "domain": self.domain,
            "tensorrt": dict(self.tensorrt), "reasons": dict(self.reasons), "dla": self.dla,
            "dla_reason": self.dla_reason,
        }



@dataclass
class InspectReport:
    """What :func:`inspect_model` found. ``profiles`` maps ``"gpu"``/``"dla"`` to
    ``{input: {"min": [...], "opt": [...], "max": [...]}}``."""

    model: str
    target: str
    tensorrt_versions: list[str]
    dla_tensorrt: str | None
    opset: int
    max_batch: int
    nodes: list[NodeSupport]
    dynamic_inputs: list[DynamicInput]
    profiles: dict[str, dict[str, dict[str, list[int]]]]
    warnings: list[str] = field(default_factory=list)

    @property
    def unsupported(self) -> list[NodeSupport]:
        """Nodes some TensorRT version of the target cannot parse (or cannot be sure to)."""
        return [n for n in self.nodes if any(s in (UNSUPPORTED, UNVERIFIED) for s in n.tensorrt.values())]

    @property
    def dla_fallbacks(self) -> list[NodeSupport]:
        """Nodes that would run on the GPU in a DLA engine (GPU fallback)."""
        return [n for n in self.nodes if n.dla == DLA_NO]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "target": self.target, "tensorrt_versions": list(self.tensorrt_versions),
            "dla_tensorrt": self.dla_tensorrt, "opset": self.opset, "max_batch": self.max_batch,
            "nodes": [n.to_dict() for n in self.nodes],
            "unsupported": [n.name for n in self.unsupported],
            "dla_fallbacks": [n.name for n in self.dla_fallbacks],
            "dynamic_inputs": [d.to_dict() for d in self.dynamic_inputs],
            "profiles": self.profiles, "warnings": list(self.warnings),
        }



def inspect_model(
    model: onnx.ModelProto,
    target: Target,
    max_batch: int = 8,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> InspectReport:
    """Check every node of ``model`` against ``target``'s TensorRT versions and DLA.

    Args:
        model (onnx.ModelProto): the model (external data loaded).
        target (Target): the board profile (``cuvil_edge.targets.get_target``).
        max_batch (int): the largest batch; sizes the optimization profiles. Defaults to 8.
        shapes (Mapping[str, Sequence[int]] | None): full input shapes for dynamic non-batch
            dimensions. Defaults to None.

    Returns:
        InspectReport: rows per node, dynamic inputs, profiles and warnings.
    """
    if not isinstance(model, onnx.ModelProto):
        raise ModelError(f"inspect_model needs an onnx.ModelProto, got {type(model).__name__}")
    graph = GraphFacts(model)
    opset = default_opset(model)
    versions = [r.tensorrt for r in target.releases] if target.has_gpu else []
    dla_versions = [v for v in versions if dla_available(v)] if target.dla_cores > 0 else []
    dla_trt = max(dla_versions, key=version_tuple) if dla_versions else None
    ctx = DlaContext(graph, dla_trt, target.gpu_sm) if dla_trt else None
    warnings: list[str] = []
    for v in versions:
        snap = parser_snapshot(v)
        # A snapshot's opset ceiling binds its own release and older ones in its range.
        if major_minor(v) <= major_minor(snap["tensorrt"]) and opset > snap["opset_max"]:
            warnings.append(f"model opset {opset} is above the {snap['opset_max']} TensorRT {v} parses")
    if target.dla_cores > 0 and not dla_trt:
        warnings.append(f"{target.name} has {target.dla_cores} DLA core(s) but none of its TensorRT "
                        f"versions ({', '.join(versions)}) places layers on DLA")

    qdq_facts = QdqFacts(model)
    rows = []
    for i, node in enumerate(model.graph.node):
        status: dict[str, str] = {}
        reasons: dict[str, str] = {}
        for v in versions:
            st, why = trt_op_status(node.op_type, v, node.domain)
            if st == SUPPORTED:
                why = (parser_restriction(node, graph, parser_snapshot(v))
                       or node_violation(node, qdq_facts, v, target.gpu_sm))
                if why:
                    st = UNSUPPORTED
            status[v] = st
            if why:
                reasons[v] = why
        if ctx is not None:
            dla, dla_why = dla_check(node, ctx)
        else:
            dla, dla_why = DLA_NA, ""
        rows.append(NodeSupport(i, node.name or f"{node.op_type}_{i}", node.op_type, node.domain,
                                status, reasons, dla, dla_why))

    dynamic = dynamic_inputs(model)
    profiles, pwarn = optimization_profiles(dynamic, max_batch, shapes, dla=ctx is not None)
    warnings.extend(pwarn)
    if ctx is not None and dynamic:
        warnings.append("DLA takes no dynamic shapes: a DLA engine uses the fixed 'dla' profile "
                        f"(batch {max_batch}); the runtime pads smaller batches")
    return InspectReport(
        model=model.graph.name or "model", target=target.name, tensorrt_versions=versions,
        dla_tensorrt=dla_trt, opset=opset, max_batch=max_batch, nodes=rows, dynamic_inputs=dynamic,
        profiles=profiles, warnings=warnings,
    )


# ------------------------------------------------------------------------------------ output

_MARKS = {SUPPORTED: "[green]yes[/]", UNSUPPORTED: "[red]no[/]", UNVERIFIED: "[yellow]?[/]",
          PLUGIN: "[cyan]plugin[/]"}
_DLA_MARKS = {DLA_YES: "[green]yes[/]", DLA_NO: "[yellow]GPU[/]", DLA_FOLDED: "folded", DLA_NA: "-"}


def render_inspect_table(report: InspectReport, only_issues: bool = False) -> Any:
    """A rich Table of the report: one row per node, a column per TensorRT version and DLA.

    Args:
        report (InspectReport): from :func:`inspect_model`.
        only_issues (bool): list only nodes with an unsupported/unverified status or a DLA
            fallback. Defaults to False.
    """
    from rich.table import Table

    title = f"{report.model} on {report.target} (opset {report.opset})"
    if report.dla_tensorrt:
        title += f", DLA per TensorRT {report.dla_tensorrt}"
    table = Table(title=title)
    table.add_column("#", justify="right")
    table.add_column("node", no_wrap=True)
    table.add_column("op")
    for v in report.tensorrt_versions:
        table.add_column(f"TRT {v}")
    show_dla = any(row.dla != DLA_NA for row in report.nodes)
    if show_dla:
        table.add_column("DLA")
    table.add_column("why")
    for row in report.nodes:
        issue = row.dla == DLA_NO or any(s != SUPPORTED for s in row.tensorrt.values())
        if only_issues and not issue:
            continue
        why = "; ".join(dict.fromkeys([*row.reasons.values(), row.dla_reason if row.dla == DLA_NO else ""]))
        dla_cell = [_DLA_MARKS[row.dla]] if show_dla else []
        table.add_row(str(row.index), row.name, row.op_type,
                      *[_MARKS[row.tensorrt[v]] for v in report.tensorrt_versions],
                      *dla_cell, why.strip("; "))
    return table

