"""Whether TensorRT's ONNX parser takes a node, per TensorRT version, from the documented tables.

The answers come from onnx-tensorrt's operator matrix per release (``data/trt_ops.toml``,
``[parser.*]``) and the parser restrictions its documentation lists (attribute values, inputs
that must be initializers), so the packager can tell on a laptop, without TensorRT, what a board's
parser will refuse. Q/DQ placement is checked by :mod:`cuvil_edge.packager.qdq_rules`.

    status, why = trt_op_status("Resize", "10.3.0")
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import onnx

from cuvil_edge._toml import loads_toml
from cuvil_edge.bundle.engine_key import major_minor, version_tuple
from cuvil_edge.packager._onnx_graph import DEFAULT_DOMAINS, GraphFacts, attrs, decode

__all__ = [
    "PLUGIN",
    "SUPPORTED",
    "UNSUPPORTED",
    "UNVERIFIED",
    "op_tables",
    "parser_restriction",
    "parser_snapshot",
    "trt_op_status",
]

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"
UNVERIFIED = "unverified"
PLUGIN = "plugin"


@functools.lru_cache(maxsize=1)
def op_tables() -> dict[str, Any]:
    """The documented tables, ``data/trt_ops.toml``: ``parser`` snapshots and the ``dla`` rules' data."""
    text = resources.files("cuvil_edge").joinpath("data/trt_ops.toml").read_text("utf-8")
    return loads_toml(text)


def _snapshots() -> list[dict[str, Any]]:
    snaps = list(op_tables()["parser"].values())
    return sorted(snaps, key=lambda s: version_tuple(s["applies_from"]))


def parser_snapshot(tensorrt: str) -> dict[str, Any]:
    """The onnx-tensorrt operator table that describes TensorRT version ``tensorrt``.

    Args:
        tensorrt (str): a TensorRT version such as ``"10.3.0"``.

    Returns:
        dict: the ``[parser.*]`` table (``tensorrt``, ``opset_max``, ``source``, ``supported`` ...).
    """
    version = version_tuple(tensorrt)
    chosen = None
    for snap in _snapshots():
        if version >= version_tuple(snap["applies_from"]):
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
    if domain not in DEFAULT_DOMAINS:
        return UNSUPPORTED, f"custom domain '{domain}': the ONNX parser needs a plugin named {op_type}"
    mm = major_minor(tensorrt)
    snap_mm = major_minor(snap["tensorrt"])
    if op_type in snap["supported"]:
        if op_type in snap.get("newer_than_floor", []) and mm < snap_mm:
            return UNVERIFIED, f"listed from {label}; older {mm[0]}.{mm[1]} releases may lack it"
        return SUPPORTED, ""
    newer = [s for s in _snapshots() if version_tuple(s["applies_from"]) > version_tuple(snap["applies_from"])
             and op_type in s["supported"]]
    if newer and mm > snap_mm:
        return UNVERIFIED, (f"not in {label}, supported by TensorRT {newer[0]['tensorrt']}; "
                            f"{tensorrt} is not documented here")
    if op_type in snap["unsupported"]:
        return UNSUPPORTED, f"not supported by the ONNX parser ({label})"
    return UNSUPPORTED, f"not in the {label}"


def parser_restriction(node: onnx.NodeProto, graph: GraphFacts, snap: dict[str, Any]) -> str:
    """A documented parser restriction ``node`` breaks on the release ``snap`` describes, or ``""``.

    Args:
        node (onnx.NodeProto): a node whose op the release's table lists as supported.
        graph (GraphFacts): the model's constants and shapes.
        snap (dict): the release's table (:func:`parser_snapshot`).
    """
    op, node_attrs = node.op_type, attrs(node)  # Q/DQ nodes: qdq_rules.node_violation
    if op in ("Conv", "ConvTranspose") and snap["tensorrt"].startswith("8.4") and len(node.input) > 1:
        if not graph.is_weight(node.input[1]):
            return "weights W must be an initializer in this TensorRT release"
    if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return "the Indices output of MaxPool is unsupported"
    if op in ("MaxPool", "AveragePool"):
        ks = node_attrs.get("kernel_shape", [])
        if ks and len(ks) not in (2, 3):
            return f"{len(ks)}D pooling: only 2D or 3D pooling is supported"
    if op == "Resize":
        mode = decode(node_attrs.get("mode", "nearest"))
        ctm = decode(node_attrs.get("coordinate_transformation_mode", "half_pixel"))
        if mode not in ("nearest", "linear"):
            return f"Resize mode '{mode}' is unsupported (nearest, linear only)"
        if ctm not in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners"):
            return f"Resize coordinate_transformation_mode '{ctm}' is unsupported"
        if node_attrs.get("antialias", 0):
            return "Resize antialiasing is unsupported"
    if op == "TopK" and len(node.input) > 1:
        k = graph.const(node.input[1])
        if k is None and snap["tensorrt"].startswith("8"):
            return "K must be an initializer in this TensorRT release"
        if k is not None and k.size and int(k.reshape(-1)[0]) >= 3840 and not snap["tensorrt"].startswith("8"):
            return "K must be less than 3840"
        if snap["tensorrt"].startswith("10") and node_attrs.get("sorted", 1) != 1:
            return "TopK sorted must be 1"
    return ""

