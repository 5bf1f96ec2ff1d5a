"""Quantize an FP32 ONNX model in the form the target's runtime needs.

- ``tensorrt`` targets: FP16 with IO types kept, or INT8 as explicit Q/DQ with symmetric scales
  (every zero-point 0), per-channel weights and float biases: the form TensorRT's ONNX parser takes
  from 8.x to 11 (``qdq_rules.py`` checks every node against its rules).
- ``ort-cpu`` targets (boards without an NVIDIA GPU, the host): asymmetric uint8 activations and
  int8 per-channel weights, which ONNX Runtime fuses into QLinear kernels (symmetric Q/DQ leaves
  ReLU6 clips unfused and runs at about half FP32 speed there); on x86 the weights use 7 bits so
  the fused kernels cannot saturate (``int8_form``).
- ``mixed``: INT8, with the most sensitive layer groups kept out of INT8 until the accuracy goal
  holds; on TensorRT targets a kept group runs in FP16 unless FP16 alone costs too much, else FP32.
  Sensitivity is measured by quantizing one group alone ("quantize only this block"), which ranks
  better than leave-one-out because quantization errors mask each other; groups are then returned
  to float greedily, most sensitive first, until the goal holds on the search data *and* the mean KL
  divergence there is within a budget: goal metrics such as top-5 containment saturate on a few
  hundred samples, while mean KL keeps measuring the distance to FP32.

Every accuracy figure here is the target's arithmetic: Q/DQ computed exactly as written (``make_session``,
cross-checked against the float rewrite in ``emulate.py``), identical on any host.
"""

from __future__ import annotations

import fnmatch
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from cuvil_edge.errors import QuantizationError
from cuvil_edge.packager.bias_correction import correct_biases
from cuvil_edge.packager.calibrate import (
    ORT_CACHE_METHOD,
    check_method,
    collect_ranges,
    mixed_range_nodes,
    output_tensors,
)
from cuvil_edge.packager.data import Dataset
from cuvil_edge.packager.emulate import emulate_fp16
from cuvil_edge.packager.load import upgrade_opset
from cuvil_edge.packager.partial_quant import (
    float_nodes_except,
    quantized_nodes,
    sort_topologically,
    with_float_nodes,
)
from cuvil_edge.packager.tasks import TaskSpec, measure, search_error
from cuvil_edge.packager.tasks import goal_failures as task_goal_failures
from cuvil_edge.packager.validate import make_session, model_outputs_for, task_for
from cuvil_edge.packager.weight_store import WeightStore
from cuvil_edge.recipes import AccuracyGoal

__all__ = ["Int8Form", "MixedResult", "Quantizer", "convert_fp16", "int8_form", "layer_groups", "match_nodes",
           "name_unnamed_nodes", "sort_topologically", "symmetric_zero_points", "target_arithmetic"]

# Mean KL (nats) the mixed search accepts on its data when the recipe sets no max_mean_kl. The
# search data come from the calibration photos that bias correction is fitted on, so held-out KL
# ran 1.8-2.3x the search KL on EfficientNet-Lite0; at 0.02 the TensorRT-form search kept nothing
# and held-out top-5 containment landed at 0.994 (goal 0.995). 0.01 leaves that margin.
SEARCH_KL_BUDGET = 0.01
# A group kept out of INT8 goes to FP16 when FP16 alone costs at most this share of the search budget.
FP16_SENSITIVITY_SHARE = 0.1
# Samples the per-group sensitivity ranking runs on (the goal itself is checked on all the search data).
SENSITIVITY_SAMPLES = 48
# Layer groups the search ranks: each costs a model run on the search data. Names alone gave
# YOLOv8n 115 groups (about two minutes of ranking on 2 cores), MiniLM 252 and PP-OCR's detector
# 10 op-type families spanning the whole network (no blocks at all); see ``layer_groups``.
SEARCH_GROUPS = 24
# Once the goal holds, halves of the groups kept in float are tried back in INT8 (one model run
# each): coarse groups find what matters fast, this returns what did not need to stay in float.
REFINE_TRIES = 8
# ... and only while the search error gives back at most this share of what the coarse choice bought
# over INT8: the goal alone holds on a few search samples where held-out data flips (PP-OCR's
# 2-class direction classifier refined to 2 float nodes met it on 8 and 24 samples, then flipped 2
# of 24 held-out crops).
REFINE_GIVE_BACK = 0.25

# When INT8 meets the goal on the search data, it is checked on the calibration samples the search
# never saw too, where a goal on a share of a count (recall of n detections, agreement on n samples)
# must hold by this many standard errors of that share (``tasks.goal_failures``); once that check
# fails, every choice of the search is held to it. ddddocr's YOLOX met recall 0.9 on the 37 characters
# of 8 search crops (0.95) and missed it on 82 held-out ones (0.88); keeping its stem in FP16 reached
# 0.902 there and 0.867-0.896 at validation.
HELD_OUT_MARGIN = 1.0

_QUANT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "GlobalAveragePool", "AveragePool",
              "MaxPool", "Concat", "Resize", "Sigmoid", "Clip", "Relu", "Flatten", "Reshape", "Transpose")


def convert_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """FP16 weights and compute; inputs and outputs stay FP32 so clients need no change."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return sort_topologically(convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False))


def name_unnamed_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (a copy when anything changes) with a stable name on every node, subgraphs included.

    Exporters may leave node names empty; the mixed search, bias correction, exclude patterns and the
    build plans' per-layer precisions all address nodes by name. A generated name is
    ``<op_type>_<n>`` (n counting that op type in graph order; ``<If name>/<branch>/<op_type>_<n>``
    inside a subgraph), so the same model always gets the same names.
    """
    def unnamed(graph: onnx.GraphProto) -> bool:
        return any(not n.name or any(_subgraphs_unnamed(a, unnamed) for a in n.attribute) for n in graph.node)

    if not unnamed(model.graph):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    taken = set()

    def collect(graph: onnx.GraphProto) -> None:
        for n in graph.node:
            if n.name:
                taken.add(n.name)
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    collect(g)

    def assign(graph: onnx.GraphProto, prefix: str) -> None:
        counts: dict[str, int] = {}
        for n in graph.node:
            if not n.name:
                while True:
                    counts[n.op_type] = counts.get(n.op_type, 0) + 1
                    name = f"{prefix}{n.op_type}_{counts[n.op_type]}"
                    if name not in taken:
                        break
                n.name = name
                taken.add(name)
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    assign(g, f"{n.name}/{a.name}/")

    collect(out.graph)
    assign(out.graph, "")
    return out


def _constant_inputs_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the graph inputs that are initializers too (exports of opset <= 9 list every
    weight as an input): the quantizer and the search treat them as weights, and a variant that
    reads a float copy of one would otherwise leave an input nobody feeds."""
    inits = {i.name for i in model.graph.initializer}
    if not any(i.name in inits for i in model.graph.input):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [i for i in out.graph.input if i.name not in inits]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    return out


def _gemm_biases_flat(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (a copy when anything changes) with every Gemm bias initializer of shape ``[1, N]``
    stored as ``[N]``: the same Gemm (C broadcasts to ``[M, N]`` either way).

    ONNX Runtime's pre-processing fuses ``MatMul`` + ``Add [1, N]`` into such a Gemm (Magika's last
    layer), and its QDQ quantizer's per-channel int32-bias check indexes the bias by output channel:
    ``bias[i]`` of a ``[1, N]`` bias is a row, and the check raised "The truth value of an array with
    more than one element is ambiguous" (onnxruntime 1.23-1.24; the CPU form keeps that check).
    """
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    todo = [n for n in model.graph.node if n.op_type == "Gemm" and len(n.input) > 2 and n.input[2] in inits
            and len(inits[n.input[2]].dims) == 2 and inits[n.input[2]].dims[0] == 1]
    if not todo:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: i for i in out.graph.initializer}
    graph_inputs = {i.name for i in out.graph.input}
    for node in out.graph.node:
        if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in inits:
            continue
        bias = inits[node.input[2]]
        if len(bias.dims) != 2 or bias.dims[0] != 1:
            continue
        flat = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias).reshape(-1), bias.name)
        if readers.get(bias.name, 0) > 1 or bias.name in graph_inputs:  # shared: a flat copy of its own
            flat.name = f"{node.name}/bias_flat"
            out.graph.initializer.append(flat)
            node.input[2] = flat.name
        else:
            bias.CopyFrom(flat)
    return out


def _subgraphs_unnamed(attr: onnx.AttributeProto, check: Callable[[onnx.GraphProto], bool]) -> bool:
    return any(check(g) for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs))


def match_nodes(model: onnx.ModelProto, patterns: Iterable[str]) -> list[str]:
    """Names of the top-level nodes whose name or op type matches a pattern (``fnmatch``:
    ``/model.22/*``, ``Concat``, ``*cv3*``), in graph order."""
    pats = list(patterns)
    return [n.name for n in model.graph.node
            if n.name and any(fnmatch.fnmatchcase(n.name, p) or fnmatch.fnmatchcase(n.op_type, p) for p in pats)]


def layer_groups(model: onnx.ModelProto, only: Iterable[str] | None = None,
                 max_groups: int | None = None) -> dict[str, list[str]]:
    """Quantizable nodes grouped into blocks by name (``blocks.3.expand`` -> ``blocks.3``,
    ``/features/features.3/conv/Conv`` -> ``/features/features.3``), in graph order.

    ``only``: the node names to group (the nodes a quantized model actually quantized), whatever
    their op type; by default the nodes of the usual quantized op types.

    ``max_groups``: at most this many groups (the mixed search pays a full model run per group).
    Names only say where blocks are when they are hierarchical: past the limit, the first path
    component (``/model.3``) when that gives at most ``max_groups`` blocks, else contiguous runs of
    nodes in graph order (paddle2onnx's ``p2o.Conv.12`` names one op type across the whole network,
    an exporter's ``node_MatMul_450`` names one node: neither is a block). A run is named after its
    first and last node.
    """
    wanted = set(only) if only is not None else None
    nodes = [n for n in model.graph.node if n.name
             and ((n.name in wanted) if wanted is not None else (n.op_type in _QUANT_OPS))]
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(_block_key(node.name), []).append(node.name)
    if max_groups is None or (len(groups) <= max_groups and not _interleaved(groups, nodes)):
        return groups
    top: dict[str, list[str]] = {}
    for node in nodes:
        parts = [p for p in node.name.split("/") if p]
        top.setdefault("/" + parts[0] if node.name.startswith("/") and len(parts) > 1 else "", []).append(node.name)
    if "" not in top and 1 < len(top) <= max_groups:
        return top
    names = [n.name for n in nodes]
    bounds = np.linspace(0, len(names), max_groups + 1).round().astype(int)
    runs = [names[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    return {(run[0] if len(run) == 1 else f"{run[0]}..{run[-1]}"): run for run in runs}


def _interleaved(groups: dict[str, list[str]], nodes: list[onnx.NodeProto]) -> bool:
    """True when the named groups are not blocks: their spans in graph order overlap (one group per
    op type across the whole network), so their spans add up to over twice the nodes."""
    index = {n.name: i for i, n in enumerate(nodes)}
    spans = sum(index[g[-1]] - index[g[0]] + 1 for g in groups.values())
    return spans > 2 * len(nodes)


def _block_key(name: str) -> str:
    """The block a node name belongs to (see ``layer_groups``)."""
    if "/" in name:
        parts = [p for p in name.split("/") if p]
        return "/" + "/".join(parts[:2]) if len(parts) > 2 else name
    if "." in name:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else parts[0]
    return name


def symmetric_zero_points(model: onnx.ModelProto) -> bool:
    """True when every QuantizeLinear/DequantizeLinear zero-point is 0 (TensorRT's requirement)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            zp = inits.get(node.input[2])
            if zp is None or np.any(zp != 0):
                return False
    return True


@dataclass(frozen=True)
class Int8Form:
    """How INT8 is laid out for a target's runtime, and why."""

    name: str
    symmetric_activations: bool
    reduce_range: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "symmetric_activations": self.symmetric_activations,
                "reduce_range": self.reduce_range, "why": self.why}


def int8_form(runtime_format: str, arch: str) -> Int8Form:
    """The INT8 form for a runtime on a CPU architecture.

    - ``tensorrt``: symmetric int8 activations and weights, float biases (TensorRT's parser refuses a
      DequantizeLinear of an int32 bias: "only activation types allowed as input to this layer").
    - ``ort-cpu`` on x86-64: ONNX Runtime's u8 x s8 kernels saturate their int16 pair sums on CPUs
      without AVX-512 VNNI; 7-bit weights (``reduce_range``) keep every pair sum within int16 (255 x 63
      x 2 < 32767), the remedy ONNX Runtime documents. Accuracy is measured with that form.
    - ``ort-cpu`` elsewhere (ARM): u8 activations x s8 weights; the dot-product kernels accumulate in
      int32 and do not saturate.
    """
    if runtime_format == "tensorrt":
        return Int8Form("s8s8-symmetric-float-bias", True, False,
                        "TensorRT explicit quantization: zero-points 0, int8 Q/DQ, biases kept float")
    if arch == "x86_64":
        return Int8Form("u8s7-reduce-range", False, True,
                        "x86 u8s8 kernels saturate without AVX-512 VNNI; 7-bit weights cannot")
    return Int8Form("u8s8", False, False, "ARM dot-product kernels accumulate in int32 without saturation")


@dataclass
class MixedResult:
    """Outcome of the mixed-precision search.

    ``tiers`` maps each layer group kept out of INT8 to ``fp16`` or ``fp32``; ``fp16_nodes`` and
    ``fp32_nodes`` are their node names (what a TensorRT build plan needs).
    """

    model: onnx.ModelProto
    kept_float: list[str]
    sensitivity: dict[str, float]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tiers: dict[str, str] = field(default_factory=dict)
    fp16_sensitivity: dict[str, float] = field(default_factory=dict)
    fp16_nodes: list[str] = field(default_factory=list)
    fp32_nodes: list[str] = field(default_factory=list)


class Quantizer:
    """Calibrates once, then quantizes as often as the mixed search needs.

    Calibration statistics are collected once, in one streaming pass (``calibrate.py``), and handed
    to ONNX Runtime's quantizer through its calibration cache; every accuracy figure comes from the
    Q/DQ graph computed as written (``make_session``), never from the host's fused INT8 kernels.

    Args:
        model (onnx.ModelProto): the FP32 model (upgraded to opset 13 if older).
        runtime_format (str): ``tensorrt`` (symmetric Q/DQ, float biases) or ``ort-cpu``.
        calibration (Dataset): calibration samples (any count, any per-sample shapes).
        method (str): a name of ``recipes.CALIBRATION_METHODS``. Defaults to ``percentile`` (99.99, best here).
        bias_correction (bool): subtract each quantized Conv's mean output shift from its bias
            (see ``bias_correction.py``); on by default.
        arch (str): the target CPU architecture (chooses the ``ort-cpu`` INT8 form, see ``int8_form``).
    """

    def __init__(self, model: onnx.ModelProto, runtime_format: str, calibration: Dataset, method: str = "percentile",
                 progress: Callable[[str], None] | None = None,
                 bar: Callable[[str, int, int], None] | None = None, bias_correction: bool = True,
                 arch: str = "aarch64", exclude: Iterable[str] = ()) -> None:
        if runtime_format not in ("tensorrt", "ort-cpu"):
            raise QuantizationError(f"unknown runtime format '{runtime_format}'")
        check_method(method)
        if len(calibration) == 0:
            raise QuantizationError("no calibration samples")
        self.model = name_unnamed_nodes(_constant_inputs_dropped(upgrade_opset(model)))
        self.runtime_format = runtime_format
        self.form = int8_form(runtime_format, arch)
        self.calibration = calibration
        self.method = method
        self._progress = progress or (lambda msg: None)
        self._bar = bar or (lambda task, done, total: None)
        self._tmp = tempfile.TemporaryDirectory(prefix="cuvil-quant-")
        self._dir = Path(self._tmp.name)
        self._prepared = self._prepare()
        # The search's models refer to their weights here instead of carrying them (``weight_store``).
        self._store = WeightStore(self._dir / "weights")
        self._light_float: onnx.ModelProto | None = None
        self._cache = self._dir / "calibration.json"
        # Nodes always kept in float: the user's exclude patterns, then mixed-range nodes (calibrate()).
        self.exclude_patterns = list(exclude)
        prepared = onnx.load(str(self._prepared))
        self.excluded: list[str] = match_nodes(prepared, self.exclude_patterns)
        unmatched = [p for p in self.exclude_patterns if not match_nodes(prepared, [p])]
        if unmatched:
            raise QuantizationError(f"exclude pattern '{unmatched[0]}' matches no node name or op type of the model")
        self.range_split: list[dict[str, Any]] = []
        self.unclipped: set[str] = set()
        self.bias_correction = bias_correction
        # (prepared float model, per-Conv input means), computed on the first quantize() only.
        self._bias_reference: tuple[onnx.ModelProto, dict[str, np.ndarray]] | None = None
        self.corrected: list[str] = []
        self._tasks: dict[str, TaskSpec] = {}

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self) -> Path:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        src = self._dir / "fp32.onnx"
        out = self._dir / "prepared.onnx"
        onnx.save(self.model, str(src))
        try:
            quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
        except Exception as exc:  # pre-processing is an optimisation; fall back to the model as given
            self._progress(f"quantization pre-processing skipped: {str(exc).splitlines()[0]}")
            return src
        prepared = onnx.load(str(out))
        named = name_unnamed_nodes(prepared)  # ONNX Runtime's fusions may leave new nodes unnamed
        flat = _gemm_biases_flat(named)
        if flat is not prepared:
            onnx.save(flat, str(out))
        return out

    @property
    def float_model(self) -> onnx.ModelProto:
        """The float model as the quantizer sees it (after ONNX Runtime's pre-processing)."""
        return onnx.load(str(self._prepared))

    def _float_ref(self) -> onnx.ModelProto:
        """``float_model`` with its weights in the store (loaded once): what the search's variants read."""
        if self._light_float is None:
            self._light_float = self._store.light(self.float_model)
        return self._light_float

    def calibrate(self) -> None:
        """Collect activation ranges once (streaming) and store them as ONNX Runtime's calibration cache."""
        if self._cache.is_file():
            return
        try:
            from onnxruntime.quantization.calibrate import save_tensors_data
        except ImportError:
            raise QuantizationError("the installed onnxruntime has no calibration cache (save_tensors_data); "
                                    "install onnxruntime >= 1.23") from None
        prepared = onnx.load(str(self._prepared))
        convs = [n for n in prepared.graph.node if n.op_type == "Conv" and n.name] if self.bias_correction else []
        collector = collect_ranges(prepared, self.calibration, on_batch=lambda d, t: self._bar("calibrating", d, t),
                                   channel_means_of={n.input[0] for n in convs})
        self.unclipped = output_tensors(prepared)
        save_tensors_data(collector.tensors_data(self.method, self.form.symmetric_activations,
                                                 unclipped=self.unclipped), self._cache)
        # Nodes that would put inputs of very different ranges under one scale stay in float.
        self.range_split = mixed_range_nodes(prepared, collector, self.method, self.form.symmetric_activations)
        for found in self.range_split:
            self._progress(f"keeping {found['node']} in float: {found['why']}")
        self.excluded += [f["node"] for f in self.range_split if f["node"] not in self.excluded]
        means = collector.channel_means()
        self._bias_reference = (prepared, {n.name: means[n.input[0]] for n in convs if n.input[0] in means})

    def _options(self) -> dict[str, Any]:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

        extra: dict[str, Any] = {"ActivationSymmetric": self.form.symmetric_activations, "WeightSymmetric": True}
        if self.runtime_format == "tensorrt":
            # ORT widens a weight's scale so an int32 bias fits: pointless when biases stay float. The CPU
            # form keeps it (PP-OCR's detector has a bias that would overflow int32 without it); Gemm
            # biases of rank 2, which that check cannot index, are flattened first (``_gemm_biases_flat``).
            extra["QDQDisableWeightAdjustForInt32Bias"] = True
            extra["QuantizeBias"] = False
            act = QuantType.QInt8
        else:
            act = QuantType.QUInt8
        return {
            "quant_format": QuantFormat.QDQ,
            "per_channel": True,
            "reduce_range": self.form.reduce_range,
            "activation_type": act,
            "weight_type": QuantType.QInt8,
            "calibrate_method": getattr(CalibrationMethod, ORT_CACHE_METHOD[self.method]),
            "extra_options": extra,
        }

    def quantize(self, nodes_to_exclude: list[str] | None = None, nodes_to_quantize: list[str] | None = None
                 ) -> onnx.ModelProto:
        """INT8 model; ``nodes_to_exclude`` (and the always-excluded nodes) stay in float."""
        self.calibrate()
        out = self._dir / "int8.onnx"
        excluded = list(dict.fromkeys([*self.excluded, *(nodes_to_exclude or [])]))
        try:
            _quantize_static()(
                str(self._prepared), str(out), None,
                nodes_to_exclude=excluded, nodes_to_quantize=nodes_to_quantize or [],
                calibration_cache_path=str(self._cache), **self._options(),
            )
        except Exception as exc:  # onnxruntime's quantizer raises assorted untyped errors
            raise QuantizationError(f"quantization failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        # ONNX Runtime's quantizer orders nodes ignoring what If/Loop bodies read from the main
        # graph: a branch may come before its input's producer, which onnx.checker refuses.
        model = sort_topologically(onnx.load(str(out)))
        if self.bias_correction and self._bias_reference is not None:
            self.corrected = correct_biases(model, *self._bias_reference)
        if self.runtime_format == "tensorrt" and not symmetric_zero_points(model):
            raise QuantizationError("quantizer produced a non-zero zero-point; TensorRT needs symmetric Q/DQ")
        return model

    def mixed(self, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None, goal: AccuracyGoal, reference: dict[str, Any] | None = None,
              max_kept_fraction: float = 0.5, kl_budget: float | None = None,
              holdout: Dataset | None = None) -> MixedResult:
        """INT8 with the fewest most-sensitive groups kept out of INT8 so ``goal`` holds on ``data``.

        Groups are ranked by the error of quantizing each alone. On TensorRT targets a group kept out
        of INT8 goes to FP16 unless its own FP16 error (measured alone) exceeds a tenth of the budget;
        if the goal still misses once the limit of kept groups is reached, FP16 groups move to FP32,
        most sensitive first. Every figure is measured by exact emulation.

        When layer names are op-type families (paddle2onnx's ``p2o.Conv.12``), the search runs on
        contiguous runs of nodes (``layer_groups``); the earlier search over the families themselves
        (forward only) stays a candidate: it runs when the first choice misses the goal on ``data``
        or on ``holdout``, and the candidate that does better on ``holdout`` ships (PP-OCR's
        recogniser: on 4 search samples the runs met the goal with every group in FP16 and a
        character error rate of 0.07 on held-out crops; the families, mostly in FP32, kept every
        character).

        Args:
            kl_budget (float): largest mean KL (classifiers) or 1 - cosine (other outputs) accepted
                on ``data``. Defaults to the goal's ``max_mean_kl``, else SEARCH_KL_BUDGET.
            holdout (Dataset): samples the search never sees (calibration samples past ``data``),
                on which candidates are compared; none: the first choice ships.
        """
        result = self._mixed(data, kind, goal, reference, max_kept_fraction, kl_budget, holdout)
        result.model = self._store.embedded(result.model)  # the search's models refer to the store
        return result

    def _mixed(self, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None, goal: AccuracyGoal,
               reference: dict[str, Any] | None, max_kept_fraction: float, kl_budget: float | None,
               holdout: Dataset | None) -> MixedResult:
        budget = kl_budget if kl_budget is not None else (goal.max_mean_kl or SEARCH_KL_BUDGET)
        # The search measures the model's job (``packager/tasks``), on every output, as validation does.
        kind = self.task(data, kind)
        goal = kind.goal(goal)
        ref = reference if reference is not None else self.reference_outputs(data, kind)
        spare = holdout if holdout is not None and len(holdout) else None
        held_ref: dict[str, Any] = {}
        # Set once the held-out samples contradict the search data (INT8, or the search's choice, meets
        # the goal on ``data`` and misses it on ``holdout``): from then on a choice meets the goal only
        # where it meets it on both.
        confirm = False

        def on_held_out(model: onnx.ModelProto, fp16_nodes: list[str] | None = None) -> list[str]:
            if spare is None:
                return []
            if not held_ref:
                held_ref.update(self.reference_outputs(spare, kind))
            miss = self.measure(model, spare, held_ref, kind, goal, fp16_nodes, margin=HELD_OUT_MARGIN)[1]
            return [f"{x} on {len(spare)} held-out calibration samples" for x in miss]

        def score(model: onnx.ModelProto, fp16_nodes: list[str] | None = None, on: Dataset | None = None,
                  expected: dict[str, Any] | None = None) -> tuple[float, list[str], dict[str, Any]]:
            err, misses, m = self.measure(model, on if on is not None else data,
                                          expected if expected is not None else ref, kind, goal, fp16_nodes)
            if kind.kind == "classification" and err > budget:  # other tasks' errors are not KL
                misses.append(f"search error {err:.4f} > budget {budget:.4f}")
            if confirm and on is None and not misses:
                misses += on_held_out(model, fp16_nodes)
            return err, misses, m

        full = self.quantize()
        err, misses, metrics = score(full)
        steps = [{"kept_float": [], "tiers": {}, "error": err, "failures": misses, "metrics": metrics}]
        if not misses and spare is not None:
            # A few search samples can hold the goal by chance (ddddocr's YOLOX: recall 0.95 on the 37
            # characters of 8 search crops, 0.88 on the 82 of 16 held-out ones, 0.86 at validation).
            misses = on_held_out(full)
            steps[0]["failures"] = misses
            if misses:
                confirm = True
                self._progress(f"INT8 meets the goal on the {len(data)} search samples but not on "
                               f"{len(spare)} the search never saw ({'; '.join(misses)}): searching on, every "
                               "choice held to the goal on both")
        if not misses:
            self._progress(f"INT8 meets the goal with no layer kept in float (search error {err:.4f})")
            return MixedResult(full, [], {}, steps)
        full = self._store.light(full)
        groups = self.groups(full)
        first, missed = self._search(data, kind, ref, score, full, groups, steps, budget, max_kept_fraction, True)
        if not missed and not confirm and spare is not None:
            held_miss = on_held_out(first.model, first.fp16_nodes)
            if held_miss:
                confirm = True
                self._progress(f"the choice meets the goal on the {len(data)} search samples but not on {len(spare)} "
                               f"the search never saw ({'; '.join(held_miss)}): searching again, every choice held "
                               "to the goal on both")
                again_steps = [dict(steps[0])]
                # The most a search over these groups can do first: when every group out of INT8 misses
                # too, searching again is a minute for nothing (PP-OCR's recogniser on 8 held-out crops).
                tier = "fp16" if self.runtime_format == "tensorrt" else "fp32"
                every = [n for g in groups.values() for n in g]
                e, miss, m = score(with_float_nodes(full, self._float_ref(), set(every)),
                                   every if tier == "fp16" else [])
                again_steps.append({"kept_float": list(groups), "tiers": {g: tier for g in groups}, "error": e,
                                    "failures": miss, "metrics": m, "model": "variant"})
                again, again_missed = first, True
                if not miss:
                    again, again_missed = self._search(data, kind, ref, score, full, groups, again_steps, budget,
                                                       max_kept_fraction, True, ranking=first.sensitivity,
                                                       fp16_known=first.fp16_sensitivity)
                for step in again_steps[1:]:
                    step["held_out_checked"] = True
                if not again_missed:
                    first, missed = again, False
                else:  # nothing meets both: the first choice stands, and what follows is checked as before
                    confirm = False
                    self._progress(f"no choice meets the goal on both ({'; '.join(miss) or 'the search missed'}): "
                                   "keeping the first")
                first.steps = steps + again_steps[1:]  # both searches stay in the report
                steps = first.steps
        families = layer_groups(self._float_ref(), quantized_nodes(full))
        in_families = {x for g in families.values() for x in g}
        nodes = [n for n in self._float_ref().graph.node if n.name and n.name in in_families]
        if families == groups or not _interleaved(families, nodes) or len(families) > 2 * SEARCH_GROUPS:
            return first
        if spare is None and not missed:
            return first
        held: dict[str, Any] = {}
        if spare is not None:
            if not held_ref:
                held_ref.update(self.reference_outputs(spare, kind))

            def on_holdout(result: MixedResult) -> tuple[float, list[str]]:
                e, miss, _ = self.measure(result.model, spare, held_ref, kind, goal, result.fp16_nodes)
                return e, miss

            held["runs"] = on_holdout(first)
            if not missed and not held["runs"][1]:
                return first
        where = "the search data" if missed else f"{len(spare) if spare is not None else 0} held-out samples"
        self._progress(f"the choice over node runs misses the goal on {where}: "
                       f"trying the {len(families)} op-type families as groups too")
        other_steps = [dict(steps[0])]
        other, other_missed = self._search(data, kind, ref, score, full, families, other_steps, budget,
                                           max_kept_fraction, False)
        if spare is not None:
            held["families"] = on_holdout(other)
        # Goal met on the search data first, then on the held-out samples, then the lower held-out error.
        rank = {label: (miss, bool(held[label][1]), held[label][0]) if held else (miss, False, 0.0)
                for label, miss in (("runs", missed), ("families", other_missed))}
        chosen = other if rank["families"] < rank["runs"] else first
        self._progress(f"shipping the choice over {'families' if chosen is other else 'runs'}" + (
            f" (held-out error {held['runs'][0]:.5f} over runs, {held['families'][0]:.5f} over families)"
            if held else ""))
        for step in other_steps[1:]:
            step["groups"] = "op-type families"
        chosen.steps = steps + other_steps[1:]  # both searches stay in the report
        return chosen

    def _search(self, data: Dataset, kind: TaskSpec, ref: dict[str, Any],
                score: Callable[..., tuple[float, list[str], dict[str, Any]]], full: onnx.ModelProto,
                groups: dict[str, list[str]], steps: list[dict[str, Any]], budget: float,
                max_kept_fraction: float, thorough: bool, ranking: dict[str, float] | None = None,
                fp16_known: dict[str, float] | None = None) -> tuple[MixedResult, bool]:
        """One search over ``groups`` (see ``mixed``): the result and whether the goal was missed on
        ``data``. ``thorough``: a group that does not lower the error goes back to INT8, and the
        search eliminates from every group out of INT8 and refines the choice; else forward only.
        ``ranking`` and ``fp16_known``: the per-group sensitivities an earlier search over the same
        groups and data measured (not measured again)."""
        err, misses = steps[0]["error"], list(steps[0]["failures"])
        metrics = steps[0]["metrics"]
        fp16_tier = self.runtime_format == "tensorrt"
        float_model = self._float_ref()
        sensitivity = ranking if ranking is not None else self.sensitivity(data, kind, full=full, reference=ref,
                                                                             groups=groups)
        order = sorted(sensitivity, key=lambda k: -sensitivity[k])
        tiers: dict[str, str] = {}
        fp16_sensitivity: dict[str, float] = {}
        known = dict(fp16_known or {})

        def attempt() -> tuple[onnx.ModelProto, float, list[str], dict[str, Any]]:
            excluded = [n for g in tiers for n in groups[g]]
            half = [n for g, t in tiers.items() if t == "fp16" for n in groups[g]]
            model = with_float_nodes(full, float_model, set(excluded))
            e, miss, m = score(model, half)
            kind_of = "variant"
            if not miss and thorough:
                model, e, miss, m, kind_of = self._confirm(model, excluded, half, score, (e, miss, m))
            elif not miss:  # the forward search as it was: the model quantized for real decides
                model = self.quantize(nodes_to_exclude=excluded)
                e, miss, m = score(model, half)
                kind_of = "quantized"
            steps.append({"kept_float": list(tiers), "tiers": dict(tiers), "error": e, "failures": miss,
                          "metrics": m, "model": kind_of})
            shown = ", ".join(f"{g}={t}" for g, t in tiers.items())
            self._progress(f"kept {len(tiers)} group(s) out of INT8 ({shown}): error {e:.5f}, "
                           f"{'goal met' if not miss else 'goal missed'}")
            return model, e, miss, m

        # The FP16 check ranks on the same samples as the sensitivity ranking.
        rank_data = data.slice(0, min(len(data), SENSITIVITY_SAMPLES))
        rank_ref = {k: v[: len(rank_data)] for k, v in ref.items()}
        model = full
        limit = max(1, int(len(order) * max_kept_fraction))
        previous = err
        for name in order[:limit]:
            tier = "fp32"
            if fp16_tier:
                fp16_sensitivity[name] = (known[name] if name in known
                                          else score(float_model, groups[name], rank_data, rank_ref)[0])
                tier = "fp16" if fp16_sensitivity[name] <= FP16_SENSITIVITY_SHARE * budget else "fp32"
            tiers[name] = tier
            model, err, misses, metrics = attempt()
            if not misses:
                break
            if thorough and err >= previous:  # it did not help: back to INT8 (isolated rankings miss interactions)
                del tiers[name]
                self._progress(f"{name} back in INT8: keeping it in float did not lower the error")
                continue
            previous = err
        halves = [g for g in order if tiers.get(g) == "fp16"]
        every = self._all_in_fp32(tiers, halves, groups, full, float_model, score, steps) if (
            misses and fp16_tier and len(halves) > 1) else None
        if every is not None and every[2]:
            # Every FP16 group in FP32 at once misses already: moving them one at a time cannot get
            # there either, and would cost a model run per group for nothing (MiniLM: 12, each a miss).
            # The search goes on from where that loop would have ended: all of them in FP32.
            self._progress(f"the {len(halves)} FP16 group(s) all in FP32 still miss the goal")
            tiers.update({g: "fp32" for g in halves})
            model, err, misses, metrics = every
        elif misses and fp16_tier:
            for name in halves:
                tiers[name] = "fp32"
                model, err, misses, metrics = attempt()
                if not misses:
                    break
        if misses and thorough:
            model, err, misses, metrics = self._eliminate(tiers, groups, order, full, float_model, score, steps,
                                                          "fp16" if fp16_tier else "fp32", (model, err, misses, metrics))
        if not misses and tiers and thorough:
            model, err, metrics = self._refine(tiers, groups, full, float_model, score, steps, model, err, metrics)
        if misses:  # the goal was never met: ship the last step, quantized for real (validation will say)
            model = self.quantize(nodes_to_exclude=[n for g in tiers for n in groups[g]])
        return MixedResult(
            model, list(tiers), sensitivity, steps, tiers, fp16_sensitivity,
            fp16_nodes=[n for g, t in tiers.items() if t == "fp16" for n in groups[g]],
            fp32_nodes=[n for g, t in tiers.items() if t == "fp32" for n in groups[g]],
        ), bool(misses)

    def _all_in_fp32(self, tiers: dict[str, str], halves: list[str], groups: dict[str, list[str]],
                     full: onnx.ModelProto, float_model: onnx.ModelProto,
                     score: Callable[..., tuple[float, list[str], dict[str, Any]]], steps: list[dict[str, Any]]
                     ) -> tuple[onnx.ModelProto, float, list[str], dict[str, Any]]:
        """The variant with the FP16 groups ``halves`` in FP32 too (the most moving groups from FP16 to
        FP32 can give) and its (error, misses, metrics): one model run, recorded in ``steps``."""
        every = {g: ("fp32" if g in halves else t) for g, t in tiers.items()}
        excluded = {n for g in every for n in groups[g]}
        half = [n for g, t in every.items() if t == "fp16" for n in groups[g]]
        variant = with_float_nodes(full, float_model, excluded)
        e, miss, m = score(variant, half)
        steps.append({"kept_float": list(every), "tiers": every, "error": e, "failures": miss, "metrics": m,
                      "model": "variant (every FP16 group in FP32)"})
        return variant, e, miss, m

    def _confirm(self, variant: onnx.ModelProto, excluded: list[str], half: list[str],
                 score: Callable[..., tuple[float, list[str], dict[str, Any]]],
                 measured: tuple[float, list[str], dict[str, Any]]
                 ) -> tuple[onnx.ModelProto, float, list[str], dict[str, Any], str]:
        """The model to ship for a choice whose variant (``partial_quant``) was ``measured``: quantized
        for real with ``excluded`` when that meets the goal too (ONNX Runtime's quantizer leaves fewer
        Q/DQ pairs), else the variant itself, which is exactly what was measured. Quantized for real,
        a tensor between an INT8 node and a kept one is still rounded for the kept reader: on PP-OCR's
        detector that alone cost the mask (0.33 search error where the variant met the goal)."""
        if measured[1]:
            return variant, *measured, "variant"
        real = self.quantize(nodes_to_exclude=excluded)
        e, miss, m = score(real, half)
        if not miss:
            return real, e, miss, m, "quantized"
        self._progress(f"quantized for real with that choice the goal misses ({'; '.join(miss)}): "
                       "shipping the variant measured")
        return variant, *measured, "variant"

    def _eliminate(self, tiers: dict[str, str], groups: dict[str, list[str]], order: list[str],
                   full: onnx.ModelProto, float_model: onnx.ModelProto,
                   score: Callable[..., tuple[float, list[str], dict[str, Any]]], steps: list[dict[str, Any]],
                   tier: str, last: tuple[onnx.ModelProto, float, list[str], dict[str, Any]]
                   ) -> tuple[onnx.ModelProto, float, list[str], dict[str, Any]]:
        """From every group out of INT8 (in ``tier``), return groups to INT8, least sensitive first,
        while the goal holds: for models whose INT8 error is spread over the whole network (PP-OCR's
        DB detector: no quarter of it kept in float restores the mask), where adding the most
        sensitive groups one by one never gets there. One model run per group; the choice is
        confirmed quantized for real. ``last`` (the forward search's result) is returned when even
        every group out of INT8 misses; ``tiers`` is updated in place when the goal is met.
        """
        def run(candidate: dict[str, str]) -> tuple[float, list[str], dict[str, Any]]:
            excluded = {n for g in candidate for n in groups[g]}
            half = [n for g, t in candidate.items() if t == "fp16" for n in groups[g]]
            e, miss, m = score(with_float_nodes(full, float_model, excluded), half)
            steps.append({"kept_float": list(candidate), "tiers": dict(candidate), "error": e, "failures": miss,
                          "metrics": m, "model": "eliminate"})
            return e, miss, m

        current = {g: tier for g in order}
        e, miss, m = run(current)
        if miss:
            self._progress(f"every group in {tier} still misses the goal ({'; '.join(miss)})")
            return last
        self._progress(f"the forward search missed; every group in {tier} meets the goal: returning groups "
                       f"to INT8, least sensitive first")
        for name in reversed(order):
            candidate = {g: t for g, t in current.items() if g != name}
            if candidate and not run(candidate)[1]:
                current = candidate
        excluded = [n for g in current for n in groups[g]]
        half = [n for g, t in current.items() if t == "fp16" for n in groups[g]]
        variant = with_float_nodes(full, float_model, set(excluded))
        model, e, miss, m, kind_of = self._confirm(variant, excluded, half, score, score(variant, half))
        steps.append({"kept_float": list(current), "tiers": dict(current), "error": e, "failures": miss,
                      "metrics": m, "model": kind_of})
        self._progress(f"kept {len(current)} of {len(order)} group(s) out of INT8 in {tier}: error {e:.5f}, "
                       f"{'goal met' if not miss else 'goal missed'}")
        if miss:
            return last
        tiers.clear()
        tiers.update(current)
        return model, e, miss, m

    def _refine(self, tiers: dict[str, str], groups: dict[str, list[str]], full: onnx.ModelProto,
                float_model: onnx.ModelProto,
                score: Callable[..., tuple[float, list[str], dict[str, Any]]], steps: list[dict[str, Any]],
                model: onnx.ModelProto, err: float, metrics: dict[str, Any]
                ) -> tuple[onnx.ModelProto, float, dict[str, Any]]:
        """Return halves of the kept groups to INT8 while the goal holds (``REFINE_TRIES`` model runs).

        A kept group is split in two runs of its nodes (``NAME#1``, ``NAME#2``, added to ``groups``);
        one half goes back to INT8 when the goal still holds without it (and the error stays under
        the ``REFINE_GIVE_BACK`` ceiling), and the half that stays is
        split again; when neither half alone suffices both stay and each is split in turn. The result
        is confirmed on the model quantized for real; if that misses, ``tiers`` is left as it was.
        ``tiers`` is updated in place.
        """
        before = dict(tiers)
        queue = [g for g in tiers if len(groups[g]) > 1]
        tries = 0
        ceiling = err + REFINE_GIVE_BACK * max(0.0, steps[0]["error"] - err)

        def holds(candidate: dict[str, str]) -> bool:
            nonlocal tries
            tries += 1
            excluded = {n for g in candidate for n in groups[g]}
            half = [n for g, t in candidate.items() if t == "fp16" for n in groups[g]]
            e, miss, m = score(with_float_nodes(full, float_model, excluded), half)
            if not miss and e > ceiling:
                miss = [f"search error {e:.5f} > {ceiling:.5f} (refinement gives back at most "
                        f"{REFINE_GIVE_BACK:.0%} of what keeping groups in float bought)"]
            steps.append({"kept_float": list(candidate), "tiers": dict(candidate), "error": e, "failures": miss,
                          "metrics": m, "model": "refine"})
            return not miss

        while queue and tries < REFINE_TRIES:
            name = queue.pop(0)
            nodes, tier = groups[name], tiers[name]
            mid = len(nodes) // 2
            first, second = f"{name}#1", f"{name}#2"
            groups[first], groups[second] = nodes[:mid], nodes[mid:]
            rest = {g: t for g, t in tiers.items() if g != name}
            for keep in (second, first):
                if tries < REFINE_TRIES and holds({**rest, keep: tier}):
                    tiers.clear()
                    tiers.update({**rest, keep: tier})
                    self._progress(f"refined: {len(groups[keep])} of {name}'s {len(nodes)} node(s) stay out of INT8")
                    queue += [keep] if len(groups[keep]) > 1 else []
                    break
            else:
                tiers.clear()
                tiers.update({**rest, first: tier, second: tier})
                queue += [g for g in (first, second) if len(groups[g]) > 1]
        if tiers == before or set().union(*(groups[g] for g in tiers)) == set().union(*(groups[g] for g in before)):
            tiers.clear()
            tiers.update(before)
            return model, err, metrics
        excluded = [n for g in tiers for n in groups[g]]
        half = [n for g, t in tiers.items() if t == "fp16" for n in groups[g]]
        variant = with_float_nodes(full, float_model, set(excluded))
        refined, e, miss, m, kind_of = self._confirm(variant, excluded, half, score, score(variant, half))
        steps.append({"kept_float": list(tiers), "tiers": dict(tiers), "error": e, "failures": miss, "metrics": m,
                      "model": kind_of})
        if miss:
            self._progress("the refined choice misses the goal quantized for real: keeping the coarse one")
            tiers.clear()
            tiers.update(before)
            return model, err, metrics
        self._progress(f"refined: {len(excluded)} node(s) out of INT8 in {len(tiers)} group(s), goal met")
        return refined, e, m

    def task(self, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None) -> TaskSpec:
        """The task the search measures: declared, or inferred from the float model's outputs."""
        if isinstance(kind, TaskSpec):
            return kind
        key = repr(kind)
        if key not in self._tasks:
            self._tasks[key] = task_for(make_session(self.model), data, kind)
        return self._tasks[key]

    def reference_outputs(self, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None) -> dict[str, Any]:
        """The float model's outputs the task compares against (a stream run for stream models)."""
        return model_outputs_for(make_session(self.model), data, self.task(data, kind))

    def measure(self, model: onnx.ModelProto, data: Dataset, reference: dict[str, Any],
                kind: str | dict[str, Any] | TaskSpec | None, goal: AccuracyGoal,
                fp16_nodes: list[str] | None = None, margin: float = 0.0) -> tuple[float, list[str], dict[str, Any]]:
        """``model`` as the target computes it against ``reference`` on ``data``: (error, goal misses,
        the task's metrics). The error is the task's (``tasks.search_error``: mean KL for classifiers,
        the job's shortfall plus 1 - worst cosine for the rest); ``goal`` is checked as given, goals on
        shares of a count by ``margin`` standard errors (``tasks.goal_failures``)."""
        spec = self.task(data, kind)
        store = self._store
        emulated = target_arithmetic(store.light(model), fp16_nodes or [], rounded=store.fp16_rounded)
        got = model_outputs_for(make_session(store.write(emulated)), data, spec)
        m, _ = measure(reference, got, spec, data.labels)
        return float(search_error(m)), task_goal_failures(m, goal, spec.kind, strict=False, margin=margin), m

    def groups(self, quantized: onnx.ModelProto) -> dict[str, list[str]]:
        """The layer groups the search may keep out of INT8: every node ``quantized`` reads through
        Q/DQ, whatever its op type or name (generated names included), grouped by block."""
        return layer_groups(self._float_ref(), quantized_nodes(quantized), max_groups=SEARCH_GROUPS)

    def sensitivity(self, data: Dataset, kind: str | dict[str, Any] | TaskSpec | None, full: onnx.ModelProto | None = None,
                    reference: dict[str, Any] | None = None,
                    groups: dict[str, list[str]] | None = None) -> dict[str, float]:
        """Per layer group (``groups``, by default ``self.groups``), the error of quantizing that
        group alone ("quantize only this block").

        Runs on the first SENSITIVITY_SAMPLES of ``data``; variants of the one quantized model
        (``partial_quant``), no quantizer run per group.
        """
        full = self._store.light(full if full is not None else self.quantize())
        float_model = self._float_ref()
        rank_data = data.slice(0, min(len(data), SENSITIVITY_SAMPLES))
        ref = reference if reference is not None else self.reference_outputs(rank_data, kind)
        rank_ref = {k: v[: len(rank_data)] for k, v in ref.items()}
        groups = groups if groups is not None else self.groups(full)
        out: dict[str, float] = {}
        for i, (name, nodes) in enumerate(groups.items()):
            self._progress(f"sensitivity {i + 1}/{len(groups)}: {name}")
            self._bar("layer sensitivity", i, len(groups))
            only = with_float_nodes(full, float_model, float_nodes_except(full, nodes))
            out[name] = self.measure(only, rank_data, rank_ref, kind, AccuracyGoal(None, None, None))[0]
        self._bar("layer sensitivity", len(groups), len(groups))
        return out

    def keep_float_advice(self, quantized: onnx.ModelProto, data: Dataset,
                          kind: str | dict[str, Any] | TaskSpec | None, goal: AccuracyGoal,
                          ranking: dict[str, float], kept: dict[str, str] | None = None, top: int = 5
                          ) -> list[dict[str, Any]]:
        """What keeping each of the ``top`` most sensitive groups out of INT8 would give on ``data``.

        For each group (most sensitive first, those already kept skipped): the metrics and goal
        misses of ``quantized`` with that group also in FP16 (TensorRT targets) and in FP32, measured
        as the target computes. Variants of ``quantized``: no quantizer run.
        """
        kept = kept or {}
        goal = self.task(data, kind).goal(goal)
        ref = self.reference_outputs(data, kind)
        float_model = self._float_ref()
        quantized = self._store.light(quantized)
        full = self.quantize()
        groups = self.groups(full)
        if ranking and not set(ranking) & set(groups):  # ranked by the op-type-family search (``mixed``)
            groups = layer_groups(float_model, quantized_nodes(full))
        kept_nodes = {n for g in kept for n in groups.get(g, [])}
        half_kept = [n for g, t in kept.items() if t == "fp16" for n in groups.get(g, [])]
        rows = []
        for name in [g for g in sorted(ranking, key=lambda k: -ranking[k]) if g not in kept and g in groups][:top]:
            row: dict[str, Any] = {"group": name, "nodes": groups[name], "sensitivity": ranking[name]}
            variant = with_float_nodes(quantized, float_model, kept_nodes | set(groups[name]))
            tiers = ("fp16", "fp32") if self.runtime_format == "tensorrt" else ("fp32",)
            for tier in tiers:
                half = half_kept + (groups[name] if tier == "fp16" else [])
                err, misses, m = self.measure(variant, data, ref, kind, goal, half)
                row[tier] = {"error": err, "failures": misses, "passes": not misses,
                             **{k: v for k, v in m.items() if isinstance(v, (int, float)) and v is not None}}
            rows.append(row)
        return rows


def target_arithmetic(model: onnx.ModelProto, fp16_nodes: list[str] | None = None,
                      rounded: Callable[[onnx.TensorProto, str], onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """The model as the target computes it, to run in a packager session (``make_session``, which
    executes Q/DQ as written): ``fp16_nodes`` rounded to FP16 (``emulate_fp16``; ``rounded`` makes
    the rounded weights), the rest unchanged."""
    return emulate_fp16(model, fp16_nodes or [], rounded)


def _quantize_static() -> Callable[..., Any]:
    from onnxruntime.quantization import quantize_static

    return quantize_static
