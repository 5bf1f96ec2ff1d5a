"""Whether DLA runs a node: NVIDIA's DLA layer restrictions as small rule functions.

Each ONNX op maps to a DLA layer kind (``data/trt_ops.toml``, ``[dla.ops]``); each kind has a rule
below that checks the documented limits (kernel, stride, padding, channels, scales ...) and says
why a node falls back to the GPU. Which TensorRT releases place layers on DLA at all is in the same
table (:func:`dla_available`): 10.8 to 11.4.0 on Jetson place none.

    ctx = DlaContext(GraphFacts(model), "10.3.0", "8.7")
    placement, why = dla_check(node, ctx)   # ("yes", "") or ("no", "kernel [9, 9] outside ...")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import onnx

from cuvil_edge.bundle.engine_key import major_minor, version_tuple
from cuvil_edge.packager._onnx_graph import DEFAULT_DOMAINS, GraphFacts, attrs, decode, in_range
from cuvil_edge.packager.trt_support import op_tables

__all__ = ["DLA_FOLDED", "DLA_NA", "DLA_NO", "DLA_YES", "DlaContext", "dla_available", "dla_check"]

DLA_YES = "yes"
DLA_NO = "no"
DLA_FOLDED = "folded"
DLA_NA = "n/a"


def dla_available(tensorrt: str) -> bool:
    """Whether TensorRT ``tensorrt`` on Jetson can place layers on DLA (10.8-11.4.0 cannot)."""
    version = version_tuple(tensorrt)
    for lo, hi in op_tables()["dla"]["available"]:
        if version >= version_tuple(lo) and (not hi or major_minor(tensorrt) <= major_minor(hi)):
            return True
    return False


class DlaContext:
    """What the rules need besides the node: the graph's facts, the TensorRT release, Orin or not."""

    def __init__(self, graph: GraphFacts, tensorrt: str, sm: str) -> None:
        self.graph = graph
        self.tensorrt = tensorrt
        self.major = major_minor(tensorrt)[0]
        data = op_tables()["dla"]
        self.data = data
        self.limits = data["limits"]
        self.orin = sm == data["orin_sm"]


def _dla_kernel(node: onnx.NodeProto, ctx: DlaContext, lim: dict[str, Any],
               op: str) -> str | tuple[list[int], dict[str, Any], list[int]]:
    """What convolution and deconvolution check alike: constant 2D weights and the kernel size.

    Returns the refusal, or the weights' dims, the node's attributes and its kernel.
    """
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "weights must be a build-time constant"
    dims = ctx.graph.weight_dims(node.input[1])
    if dims is None or len(dims) - 2 != lim["spatial_dims"]:
        return f"only 2D {op} runs on DLA"
    node_attrs = attrs(node)
    kernel = list(node_attrs.get("kernel_shape", dims[2:]))
    if not in_range(kernel, lim["kernel"]):
        return f"kernel {kernel} outside DLA's {lim['kernel']}"
    return list(dims), node_attrs, kernel


def _dla_convolution(node: onnx.NodeProto, ctx: DlaContext) -> str:
    lim = ctx.limits["convolution"]
    checked = _dla_kernel(node, ctx, lim, "convolution")
    if isinstance(checked, str):
        return checked
    dims, node_attrs, kernel = checked
    stride = list(node_attrs.get("strides", [1, 1]))
    if not in_range(stride, lim["stride"]):
        return f"stride {stride} outside DLA's {lim['stride']}"
    pads = list(node_attrs.get("pads", [0, 0, 0, 0]))
    if not in_range(pads, lim["padding"]) or any(p >= k for p, k in zip(pads, kernel + kernel)):
        return f"padding {pads} outside DLA's {lim['padding']} or not below the kernel size"
    dil = list(node_attrs.get("dilations", [1, 1]))
    if not in_range(dil, lim["dilation"]):
        return f"dilation {dil} outside DLA's {lim['dilation']}"
    if not in_range([dims[0]], lim["channels"]):
        return f"{dims[0]} output channels outside DLA's {lim['channels']}"
    if not in_range([node_attrs.get("group", 1)], lim["groups"]):
        return f"{node_attrs.get('group')} groups outside DLA's {lim['groups']}"
    return ""


def _dla_deconvolution(node: onnx.NodeProto, ctx: DlaContext) -> str:
    lim = ctx.limits["deconvolution"]
    checked = _dla_kernel(node, ctx, lim, "deconvolution")
    if isinstance(checked, str):
        return checked
    dims, node_attrs, _ = checked
    if any(node_attrs.get("pads", [0])):
        return "DLA deconvolution needs padding 0"
    if node_attrs.get("group", 1) != 1:
        return "grouped deconvolution does not run on DLA"
    if any(d != 1 for d in node_attrs.get("dilations", [1])):
        return "dilated deconvolution does not run on DLA"
    channels = dims[1] * node_attrs.get("group", 1)
    if not in_range([channels], lim["channels"]):
        return f"{channels} output channels outside DLA's {lim['channels']}"
    return ""


def _dla_fully_connected(node: onnx.NodeProto, ctx: DlaContext) -> str:
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "the second input must be a build-time constant (TensorRT maps it to a 1x1 convolution)"
    dims = ctx.graph.weight_dims(node.input[1])
    if dims and len(dims) == 2:
        out = dims[0] if (node.op_type == "Gemm" and attrs(node).get("transB", 0)) else dims[-1]
        if not in_range([out], ctx.limits["convolution"]["channels"]):
            return f"{out} outputs outside DLA's {ctx.limits['convolution']['channels']}"
    return ""


def _dla_pooling(node: onnx.NodeProto, ctx: DlaContext) -> str:
    lim = ctx.limits["pooling"]
    node_attrs = attrs(node)
    window = list(node_attrs.get("kernel_shape", []))
    if len(window) != lim["spatial_dims"]:
        return "only 2D pooling runs on DLA"
    if not in_range(window, lim["window"]):
        return f"window {window} outside DLA's {lim['window']}"
    stride = list(node_attrs.get("strides", [1, 1]))
    if not in_range(stride, lim["stride"]):
        return f"stride {stride} outside DLA's {lim['stride']}"
    pads = list(node_attrs.get("pads", [0, 0, 0, 0]))
    if not in_range(pads, lim["padding"]):
        return f"padding {pads} outside DLA's {lim['padding']}"
    if len(node.output) > 1 and node.output[1]:
        return "the Indices output does not run on DLA"
    return ""


def _dla_clip(node: onnx.NodeProto, ctx: DlaContext) -> str:
    node_attrs = attrs(node)
    lo: Any = node_attrs.get("min")
    hi: Any = node_attrs.get("max")
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


def _dla_prelu(node: onnx.NodeProto, ctx: DlaContext) -> str:
    if len(node.input) < 2 or not ctx.graph.is_weight(node.input[1]):
        return "the slope must be a build-time constant"
    return ""


def _dla_elementwise(node: onnx.NodeProto, ctx: DlaContext) -> str:
    since = ctx.limits["elementwise"]["since"].get(node.op_type, 99)
    if ctx.major < since:
        return f"{node.op_type} is not exposed on DLA through TensorRT {ctx.tensorrt} (from TensorRT {since})"
    return ""


def _dla_lrn(node: onnx.NodeProto, ctx: DlaContext) -> str:
    size = attrs(node).get("size")
    if size not in ctx.limits["lrn"]["sizes"]:
        return f"LRN size {size} not in DLA's {ctx.limits['lrn']['sizes']}"
    return ""


def _dla_concatenation(node: onnx.NodeProto, ctx: DlaContext) -> str:
    if len([i for i in node.input if i]) < 2:
        return "DLA concatenation needs at least two inputs"
    axis = int(attrs(node).get("axis", 1))
    shape = ctx.graph.shapes.get(node.output[0])
    rank = len(shape) if shape else 4
    if axis < 0:
        axis += rank
    if axis != 1:
        return f"DLA concatenates along the channel axis only (axis 1), not axis {axis}"
    return ""


def _dla_resize(node: onnx.NodeProto, ctx: DlaContext) -> str:
    lim = ctx.limits["resize"]
    node_attrs = attrs(node)
    mode = decode(node_attrs.get("mode", "nearest"))
    if mode not in lim["modes"]:
        return f"DLA resizes with {lim['modes']} only, not '{mode}'"
    if mode == "linear":
        ctm = decode(node_attrs.get("coordinate_transformation_mode", "half_pixel"))
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


def _dla_comparison(node: onnx.NodeProto, ctx: DlaContext) -> str:
    return ""


def _dla_ok(node: onnx.NodeProto, ctx: DlaContext) -> str:
    return ""


_DLA_RULES: dict[str, Callable[[onnx.NodeProto, DlaContext], str]] = {
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


def dla_check(node: onnx.NodeProto, ctx: DlaContext) -> tuple[str, str]:
    """Where ``node`` runs in a DLA engine, and why when not on DLA.

    Returns:
        tuple[str, str]: (placement, reason): ``yes``, ``no`` (falls back to the GPU) or
        ``folded`` (no layer left after parsing); the reason is empty on ``yes``.
    """
    data = ctx.data
    if node.op_type in data["folded"]:
        return DLA_FOLDED, "no layer after parsing"
    kind = data["ops"].get(node.op_type)
    if kind is None or node.domain not in DEFAULT_DOMAINS:
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

