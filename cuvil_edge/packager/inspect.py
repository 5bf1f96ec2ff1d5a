"""Inspect an ONNX model for a target: TensorRT parser support, DLA placement, dynamic shapes.

For every node: whether each TensorRT version the target ships parses it (onnx-tensorrt's
operator matrix, ``data/trt_ops.toml``), whether DLA can run it (NVIDIA's DLA layer
restrictions, same file, checked by the small ``_dla_*`` rule functions below) and, when not,
why. For the model: which inputs have dynamic dimensions and the optimization profiles
(min/opt/max) an engine needs for them, one for the GPU and a fixed one for DLA, which does not
take dynamic shapes.

Nothing here needs TensorRT: the answers come from the documented tables, so the packager can
tell on a laptop what will fall back on the board.

    report = inspect_model(onnx.load("model.onnx"), get_target("orin-nx-16gb"), max_batch=8)
    console.print(render_inspect_table(report))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import onnx
from onnx import helper, numpy_helper

from cuvil_edge._toml import loads_toml
from cuvil_edge.bundle.engine_key import major_minor as _major_minor
from cuvil_edge.bundle.engine_key import version_tuple as _version_tuple
from cuvil_edge.errors import ModelError
from cuvil_edge.packager.qdq_rules import QdqFacts, node_violation
from cuvil_edge.targets import Target

__all__ = [
    "DynamicInput",
    "InspectReport",
    "NodeSupport",
    "dla_available",
    "inspect_cmd",
    "inspect_model",
    "optimization_profiles",
    "parser_snapshot",
    "render_inspect_table",
    "trt_op_status",
]

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"
UNVERIFIED = "unverified"
PLUGIN = "plugin"

DLA_YES = "yes"
DLA_NO = "no"
DLA_FOLDED = "folded"
DLA_NA = "n/a"

_DEFAULT_DOMAINS = ("", "ai.onnx")


# --------------------------------------------------------------------------------------- data


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, Any]:
    text = resources.files("cuvil_edge").joinpath("data/trt_ops.toml").read_text("utf-8")
    return loads_toml(text)


def _snapshots() -> list[dict[str, Any]]:
    snaps = list(_tables()["parser"].values())
    return sorted(snaps, key=lambda s: _version_tuple(s["applies_from"]))


def parser_snapshot(tensorrt: str) -> dict[str, Any]:
    """The onnx-tensorrt operator table that describes TensorRT version ``tensorrt``.

    Args:
        tensorrt (str): a TensorRT version such as ``"10.3.0"``.

    Returns:
        dict: the ``[parser.*]`` table (``tensorrt``, ``opset_max``, ``source``, ``supported`` ...).
    """
    version = _version_tuple(tensorrt)
    chosen = None
    for snap in _snapshots():
        if version >= _version_tuple(snap["applies_from"]):
            chosen = snap
    if chosen is None:
        chosen = _snapshots()[0]
    return chosen


def trt_op_status(op_type: str, tensorrt: str, domain: str = "") -> tuple[str, str]:
    """Whether TensorRT ``tensorrt``'s ONNX parser takes ``op_type``, from the documented tables.

    Args:
        op_type (str): the ONNX operator, e.g. ``"Conv"``.
        tensorrt (str): the TensorRT version, e.g. ``"8.5.2"``.
        domain (str): the node's domain; custom domains need a plugin. Defaults to ``""``.

    Returns:
        tuple[str, str]: (status, reason): status is ``supported``, ``unsupported``,
        ``unverified`` (the tables disagree across releases around this one) or ``plugin``
        (a cuvil-edge TensorRT plugin of that name exists); reason is empty when supported.
    """
    from cuvil_edge.trt_plugins import plugin_op_names

    if op_type in plugin_op_names():
        return PLUGIN, "runs as a cuvil-edge TensorRT plugin (cuvil_edge.trt_plugins)"
    snap = parser_snapshot(tensorrt)
    label = f"TensorRT {snap['tensorrt']} operator table"
    if domain not in _DEFAULT_DOMAINS:
        return UNSUPPORTED, f"custom domain '{domain}': the ONNX parser needs a plugin named {op_type}"
    mm = _major_minor(tensorrt)
    snap_mm = _major_minor(snap["tensorrt"])
    if op_type in snap["supported"]:
        if op_type in snap.get("newer_than_floor", []) and mm < snap_mm:
            return UNVERIFIED, f"listed from {label}; older {mm[0]}.{mm[1]} releases may lack it"
        return SUPPORTED, ""
    newer = [s for s in _snapshots() if _version_tuple(s["applies_from"]) > _version_tuple(snap["applies_from"])
             and op_type in s["supported"]]
    if newer and mm > snap_mm:
        return UNVERIFIED, (f"not in {label}, supported by TensorRT {newer[0]['tensorrt']}; "
                            f"{tensorrt} is not documented here")
    if op_type in snap["unsupported"]:
        return UNSUPPORTED, f"not supported by the ONNX parser ({label})"
    return UNSUPPORTED, f"not in the {label}"


def dla_available(tensorrt: str) -> bool:
    """Whether TensorRT ``tensorrt`` on Jetson can place layers on DLA (10.8-11.4.0 cannot)."""
    version = _version_tuple(tensorrt)
    for lo, hi in _tables()["dla"]["available"]:
        if version >= _version_tuple(lo) and (not hi or _major_minor(tensorrt) <= _major_minor(hi)):
            return True
    return False


# ------------------------------------------------------------------------------------ results


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


@dataclass(frozen=True)
class DynamicInput:
    """A graph input with dynamic dimensions: its shape (``-1`` where dynamic) and their names."""

    name: str
    shape: tuple[int, ...]
    dim_names: tuple[str, ...]

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if d < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dim_names": list(self.dim_names),
                "dynamic_axes": list(self.dynamic_axes)}


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


# ------------------------------------------------------------------------------- graph facts


class _Graph:
    """Initializers, constant tensors, producers and inferred shapes of a model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - shape inference is best effort; rules then say "unknown"
            inferred = model
        g = inferred.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.constants: dict[str, onnx.TensorProto] = dict(self.initializers)
        self.producers: dict[str, onnx.NodeProto] = {}
        for node in g.node:
            for out in node.output:
                self.producers[out] = node
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            self.shapes[vi.name] = _shape_of(vi)
        for name, t in self.initializers.items():
            self.shapes[name] = tuple(t.dims)

    def const(self, name: str) -> Any:
        """The numpy value of a constant input (initializer or Constant node), else None."""
        t = self.constants.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def is_weight(self, name: str) -> bool:
        """A build-time constant, possibly behind a DequantizeLinear of a constant (Q/DQ weights)."""
        if name in self.constants:
            return True
        prod = self.producers.get(name)
        return bool(prod is not None and prod.op_type == "DequantizeLinear" and prod.input
                    and prod.input[0] in self.constants)

    def weight_dims(self, name: str) -> tuple[int, ...] | None:
        if name in self.constants:
            return tuple(self.constants[name].dims)
        prod = self.producers.get(name)
        if prod is not None and prod.op_type == "DequantizeLinear" and prod.input[0] in self.constants:
            return tuple(self.constants[prod.input[0]].dims)
        return self.shapes.get(name)


def _shape_of(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _in_range(values: Sequence[int], bounds: Sequence[int]) -> bool:
    return all(bounds[0] <= int(v) <= bounds[1] for v in values)


# ------------------------------------------------------------------------- parser restrictions


def _parser_restriction(node: onnx.NodeProto, graph: _Graph, snap: dict[str, Any]) -> str:
    """A documented parser restriction this node breaks, or ``""``."""
    op, attrs = node.op_type, _attrs(node)  # Q/DQ nodes: qdq_rules.node_violation
    if op in ("Conv", "ConvTranspose") and snap["tensorrt"].startswith("8.4") and len(node.input) > 1:
        if not graph.is_weight(node.input[1]):
            return "weights W must be an initializer in this TensorRT release"
    if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return "the Indices output of MaxPool is unsupported"
    if op in ("MaxPool", "AveragePool"):
        ks = attrs.get("kernel_shape", [])
        if ks and len(ks) not in (2, 3):
            return f"{len(ks)}D pooling: only 2D or 3D pooling is supported"
    if op == "Resize":
        mode = _decode(attrs.get("mode", "nearest"))
        ctm = _decode(attrs.get("coordinate_transformation_mode", "half_pixel"))
        if mode not in ("nearest", "linear"):
            return f"Resize mode '{mode}' is unsupported (nearest, linear only)"
        if ctm not in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners"):
            return f"Resize coordinate_transformation_mode '{ctm}' is unsupported"
        if attrs.get("antialias", 0):
            return "Resize antialiasing is unsupported"
    if op == "TopK" and len(node.input) > 1:
        k = graph.const(node.input[1])
        if k is None and snap["tensorrt"].startswith("8"):
            return "K must be an initializer in this TensorRT release"
        if k is not None and k.size and int(k.reshape(-1)[0]) >= 3840 and not snap["tensorrt"].startswith("8"):
            return "K must be less than 3840"
        if snap["tensorrt"].startswith("10") and attrs.get("sorted", 1) != 1:
            return "TopK sorted must be 1"
    return ""


# -------------------------------------------------------------------------------- DLA rules


class _DlaContext:
    def __init__(self, graph: _Graph, tensorrt: str, sm: str) -> None:
        self.graph = graph
        self.tensorrt = tensorrt
        self.major = _major_minor(tensorrt)[0]
        data = _tables()["dla"]
        self.data = data
        self.limits = data["limits"]
        self.orin = sm == data["orin_sm"]


def _dla_convolution(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    lim = ctx.limits["convolution"]
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "weights must be a build-time constant"
    dims = ctx.graph.weight_dims(node.input[1])
    if dims is None or len(dims) - 2 != lim["spatial_dims"]:
        return "only 2D convolution runs on DLA"
    attrs = _attrs(node)
    kernel = list(attrs.get("kernel_shape", dims[2:]))
    if not _in_range(kernel, lim["kernel"]):
        return f"kernel {kernel} outside DLA's {lim['kernel']}"
    stride = list(attrs.get("strides", [1, 1]))
    if not _in_range(stride, lim["stride"]):
        return f"stride {stride} outside DLA's {lim['stride']}"
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if not _in_range(pads, lim["padding"]) or any(p >= k for p, k in zip(pads, kernel + kernel)):
        return f"padding {pads} outside DLA's {lim['padding']} or not below the kernel size"
    dil = list(attrs.get("dilations", [1, 1]))
    if not _in_range(dil, lim["dilation"]):
        return f"dilation {dil} outside DLA's {lim['dilation']}"
    if not _in_range([dims[0]], lim["channels"]):
        return f"{dims[0]} output channels outside DLA's {lim['channels']}"
    if not _in_range([attrs.get("group", 1)], lim["groups"]):
        return f"{attrs.get('group')} groups outside DLA's {lim['groups']}"
    return ""


def _dla_deconvolution(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    lim = ctx.limits["deconvolution"]
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "weights must be a build-time constant"
    dims = ctx.graph.weight_dims(node.input[1])
    if dims is None or len(dims) - 2 != lim["spatial_dims"]:
        return "only 2D deconvolution runs on DLA"
    attrs = _attrs(node)
    kernel = list(attrs.get("kernel_shape", dims[2:]))
    if not _in_range(kernel, lim["kernel"]):
        return f"kernel {kernel} outside DLA's {lim['kernel']}"
    if any(attrs.get("pads", [0])):
        return "DLA deconvolution needs padding 0"
    if attrs.get("group", 1) != 1:
        return "grouped deconvolution does not run on DLA"
    if any(d != 1 for d in attrs.get("dilations", [1])):
        return "dilated deconvolution does not run on DLA"
    channels = dims[1] * attrs.get("group", 1)
    if not _in_range([channels], lim["channels"]):
        return f"{channels} output channels outside DLA's {lim['channels']}"
    return ""


def _dla_fully_connected(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "the second input must be a build-time constant (TensorRT maps it to a 1x1 convolution)"
    dims = ctx.graph.weight_dims(node.input[1])
    if dims and len(dims) == 2:
        out = dims[0] if (node.op_type == "Gemm" and _attrs(node).get("transB", 0)) else dims[-1]
        if not _in_range([out], ctx.limits["convolution"]["channels"]):
            return f"{out} outputs outside DLA's {ctx.limits['convolution']['channels']}"
    return ""


def _dla_pooling(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    lim = ctx.limits["pooling"]
    attrs = _attrs(node)
    window = list(attrs.get("kernel_shape", []))
    if len(window) != lim["spatial_dims"]:
        return "only 2D pooling runs on DLA"
    if not _in_range(window, lim["window"]):
        return f"window {window} outside DLA's {lim['window']}"
    stride = list(attrs.get("strides", [1, 1]))
    if not _in_range(stride, lim["stride"]):
        return f"stride {stride} outside DLA's {lim['stride']}"
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if not _in_range(pads, lim["padding"]):
        return f"padding {pads} outside DLA's {lim['padding']}"
    if len(node.output) > 1 and node.output[1]:
        return "the Indices output does not run on DLA"
    return ""


def _dla_clip(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    attrs = _attrs(node)
    lo: Any = attrs.get("min")
    hi: Any = attrs.get("max")
    if len(node.input) > 1 and node.input[1]:
        lo = ctx.graph.const(node.input[1])
        if lo is None:
            return "Clip min must be a build-time constant"
    if len(node.input) > 2 and node.input[2]:
        hi = ctx.graph.const(node.input[2])
        if hi is None:
            return "Clip max must be a build-time constant"
    lo = 0.0 if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if lo != 0.0 or hi > ctx.limits["clip"]["max"]:
        return f"DLA runs Clip only as a clipped ReLU (min 0, max <= {ctx.limits['clip']['max']:g}); got [{lo:g}, {hi:g}]"
    return ""


def _dla_prelu(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "the slope must be a build-time constant"
    return ""


def _dla_elementwise(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    since = ctx.limits["elementwise"]["since"].get(node.op_type, 99)
    if ctx.major < since:
        return f"{node.op_type} is not exposed on DLA through TensorRT {ctx.tensorrt} (from TensorRT {since})"
    return ""


def _dla_lrn(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    size = _attrs(node).get("size")
    if size not in ctx.limits["lrn"]["sizes"]:
        return f"LRN size {size} not in DLA's {ctx.limits['lrn']['sizes']}"
    return ""


def _dla_concatenation(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    if len([i for i in node.input if i]) < 2:
        return "DLA concatenation needs at least two inputs"
    axis = int(_attrs(node).get("axis", 1))
    shape = ctx.graph.shapes.get(node.output[0])
    rank = len(shape) if shape else 4
    if axis < 0:
        axis += rank
    if axis != 1:
        return f"DLA concatenates along the channel axis only (axis 1), not axis {axis}"
    return ""


def _dla_resize(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    lim = ctx.limits["resize"]
    attrs = _attrs(node)
    mode = _decode(attrs.get("mode", "nearest"))
    if mode not in lim["modes"]:
        return f"DLA resizes with {lim['modes']} only, not '{mode}'"
    if mode == "linear":
        ctm = _decode(attrs.get("coordinate_transformation_mode", "half_pixel"))
        if ctm not in lim["linear_transforms"]:
            return f"DLA bilinear resize needs half_pixel coordinates, not '{ctm}'"
    scales = None
    idx_scales = 1 if node.op_type == "Upsample" else 2
    if len(node.input) > idx_scales and node.input[idx_scales]:
        scales = ctx.graph.const(node.input[idx_scales])
    if (scales is None or scales.size == 0) and node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
        sizes = ctx.graph.const(node.input[3])
        in_shape = ctx.graph.shapes.get(node.input[0])
        if sizes is not None and in_shape and len(in_shape) == len(sizes) and all(d > 0 for d in in_shape):
            scales = sizes.astype(float) / [float(d) for d in in_shape]
    if scales is None or scales.size == 0:
        return "resize scales must be build-time constants"
    s = [float(v) for v in scales.reshape(-1)]
    if len(s) != 4 or s[0] != 1 or s[1] != 1:
        return f"DLA resizes 4D tensors over H and W only; scales {s}"
    if any(v != int(v) or not lim["scale"][0] <= v <= lim["scale"][1] for v in s[2:]):
        return f"DLA needs integer H/W scales in {lim['scale']}; got {s[2:]}"
    return ""


def _dla_comparison(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    return ""


def _dla_ok(node: onnx.NodeProto, ctx: _DlaContext) -> str:
    return ""


_DLA_RULES = {
    "convolution": _dla_convolution,
    "deconvolution": _dla_deconvolution,
    "fully_connected": _dla_fully_connected,
    "pooling": _dla_pooling,
    "activation": _dla_ok,
    "clip": _dla_clip,
    "prelu": _dla_prelu,
    "scale": _dla_ok,
    "elementwise": _dla_elementwise,
    "lrn": _dla_lrn,
    "concatenation": _dla_concatenation,
    "resize": _dla_resize,
    "softmax": _dla_ok,
    "slice": _dla_ok,
    "shuffle": _dla_ok,
    "comparison": _dla_comparison,
    "unary": _dla_ok,
}


def _dla_check(node: onnx.NodeProto, ctx: _DlaContext) -> tuple[str, str]:
    data = ctx.data
    if node.op_type in data["folded"]:
        return DLA_FOLDED, "no layer after parsing"
    kind = data["ops"].get(node.op_type)
    if kind is None or node.domain not in _DEFAULT_DOMAINS:
        hint = data["fallback_hints"].get(node.op_type)
        return DLA_NO, hint or f"{node.op_type} has no DLA layer"
    if kind in data["limits"]["orin_only"]["kinds"] and not ctx.orin:
        return DLA_NO, f"the {kind} layer runs on Orin's DLA only, not on Xavier's"
    why = _DLA_RULES[kind](node, ctx)
    if why:
        return DLA_NO, why
    for out in node.output:
        shape = ctx.graph.shapes.get(out)
        if shape and any(d > data["max_dim"] for d in shape[1:]):
            return DLA_NO, f"output {out} {list(shape)} has a dimension over DLA's {data['max_dim']}"
    return DLA_YES, ""


# ----------------------------------------------------------------------------- dynamic shapes


def _dynamic_inputs(model: onnx.ModelProto) -> list[DynamicInput]:
    init = {t.name for t in model.graph.initializer}
    found = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in dims)
        names = tuple(d.dim_param if d.HasField("dim_param") else ("" if s > 0 else "?")
                      for d, s in zip(dims, shape))
        if any(s < 0 for s in shape):
            found.append(DynamicInput(vi.name, shape, names))
    return found


def optimization_profiles(
    dynamic: Sequence[DynamicInput],
    max_batch: int,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dla: bool = False,
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], list[str]]:
    """Optimization profiles for the dynamic inputs, and warnings for dimensions left open.

    The first dimension is the batch: min 1, opt and max ``max_batch`` (the daemon batches up to
    ``max_batch`` under load, the case worth tuning for). Other dynamic dimensions take their value
    from ``shapes`` (min = opt = max). The DLA profile fixes every dimension (DLA takes no dynamic
    shapes): batch ``max_batch``, partial batches padded by the runtime.

    Args:
        dynamic (Sequence[DynamicInput]): the dynamic inputs.
        max_batch (int): the recipe's largest batch.
        shapes (Mapping[str, Sequence[int]] | None): full shapes for inputs with dynamic
            non-batch dimensions (the batch entry is ignored). Defaults to None.
        dla (bool): also return a ``"dla"`` profile. Defaults to False.

    Returns:
        tuple: ``({"gpu": {...}, "dla": {...}}, warnings)``.
    """
    if max_batch < 1:
        raise ModelError(f"max_batch must be at least 1, got {max_batch}")
    shapes = shapes or {}
    gpu: dict[str, dict[str, list[int]]] = {}
    fixed: dict[str, dict[str, list[int]]] = {}
    warnings: list[str] = []
    for d in dynamic:
        given = list(shapes.get(d.name, []))
        lo, opt, hi = [], [], []
        open_dims = []
        for axis, size in enumerate(d.shape):
            if axis == 0 and size < 0:
                lo.append(1)
                opt.append(max_batch)
                hi.append(max_batch)
            elif size < 0:
                if len(given) == len(d.shape) and int(given[axis]) > 0:
                    v = int(given[axis])
                    lo.append(v)
                    opt.append(v)
                    hi.append(v)
                else:
                    open_dims.append(axis)
            else:
                lo.append(size)
                opt.append(size)
                hi.append(size)
        if open_dims:
            names = ", ".join(f"{a} ('{d.dim_names[a]}')" for a in open_dims)
            warnings.append(f"input '{d.name}': dynamic dimension(s) {names} have no size; give the "
                            f"input shape in the recipe so the engine gets a profile")
            continue
        gpu[d.name] = {"min": lo, "opt": opt, "max": hi}
        fixed[d.name] = {"min": list(hi), "opt": list(hi), "max": list(hi)}
    profiles: dict[str, dict[str, dict[str, list[int]]]] = {"gpu": gpu}
    if dla:
        profiles["dla"] = fixed
    return profiles, warnings


# ------------------------------------------------------------------------------------ inspect


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            return int(imp.version)
    return 0


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
    graph = _Graph(model)
    opset = _default_opset(model)
    versions = [r.tensorrt for r in target.releases] if target.has_gpu else []
    dla_versions = [v for v in versions if dla_available(v)] if target.dla_cores > 0 else []
    dla_trt = max(dla_versions, key=_version_tuple) if dla_versions else None
    ctx = _DlaContext(graph, dla_trt, target.gpu_sm) if dla_trt else None
    warnings: list[str] = []
    for v in versions:
        snap = parser_snapshot(v)
        # A snapshot's opset ceiling binds its own release and older ones in its range.
        if _major_minor(v) <= _major_minor(snap["tensorrt"]) and opset > snap["opset_max"]:
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
                why = (_parser_restriction(node, graph, parser_snapshot(v))
                       or node_violation(node, qdq_facts, v, target.gpu_sm))
                if why:
                    st = UNSUPPORTED
            status[v] = st
            if why:
                reasons[v] = why
        if ctx is not None:
            dla, dla_why = _dla_check(node, ctx)
        else:
            dla, dla_why = DLA_NA, ""
        rows.append(NodeSupport(i, node.name or f"{node.op_type}_{i}", node.op_type, node.domain,
                                status, reasons, dla, dla_why))

    dynamic = _dynamic_inputs(model)
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


def inspect_cmd(
    model: Path,
    target: str,
    max_batch: int = 8,
    as_json: bool = False,
    only_issues: bool = False,
) -> int:
    """Print which ops the target's TensorRT and DLA support, dynamic inputs and profiles.

    Typer-ready: the lead registers it as ``cuvil-edge inspect`` with options ``--target``,
    ``--max-batch``, ``--json`` and ``--issues``. Returns the exit status: 0, or 1 when a node
    is unsupported by every TensorRT version of the target.
    """
    import json

    from rich.console import Console

    from cuvil_edge.targets import get_target

    tgt = get_target(target)
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"{path}: no such model file")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelError(f"{path}: not a readable ONNX model ({exc})") from exc
    report = inspect_model(proto, tgt, max_batch=max_batch)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        from cuvil_edge._console import print_table

        console = Console()
        print_table(render_inspect_table(report, only_issues=only_issues), console)
        for name, prof in report.profiles.items():
            for inp, p in prof.items():
                console.print(f"profile {name}: {inp} min {p['min']} opt {p['opt']} max {p['max']}")
        for w in report.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        n_bad = len(report.unsupported)
        console.print(f"{len(report.nodes)} nodes: {n_bad} unsupported or unverified on some TensorRT "
                      f"version, {len(report.dla_fallbacks)} DLA fallback(s)")
    blocked = [n for n in report.nodes if n.tensorrt and all(s == UNSUPPORTED for s in n.tensorrt.values())]
    return 1 if blocked else 0
