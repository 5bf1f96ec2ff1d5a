"""What the op-support rules read from an ONNX graph: constants, producers, inferred shapes.

The TensorRT parser restrictions (:mod:`cuvil_edge.packager.trt_support`) and the DLA layer rules
(:mod:`cuvil_edge.packager.dla_rules`) both ask the same questions of a node's inputs (is this a
build-time weight? what shape does it have?), so the answers are computed once per model here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
from onnx import helper, numpy_helper

__all__ = ["DEFAULT_DOMAINS", "GraphFacts", "attrs", "decode", "default_opset", "in_range", "shape_of"]

# The ONNX standard operator set; any other domain needs a plugin.
DEFAULT_DOMAINS = ("", "ai.onnx")


class GraphFacts:
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
            self.shapes[vi.name] = shape_of(vi)
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
        """The dims of a weight (seen through its DequantizeLinear), else its inferred shape."""
        if name in self.constants:
            return tuple(self.constants[name].dims)
        prod = self.producers.get(name)
        if prod is not None and prod.op_type == "DequantizeLinear" and prod.input[0] in self.constants:
            return tuple(self.constants[prod.input[0]].dims)
        return self.shapes.get(name)


def shape_of(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A value's shape, ``-1`` where a dimension is dynamic; None when it has no shape at all."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim)


def attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def decode(value: Any) -> Any:
    """A string attribute as ``str`` (ONNX stores them as bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def in_range(values: Sequence[int], bounds: Sequence[int]) -> bool:
    """Every value within the inclusive ``[low, high]`` of a documented limit."""
    return all(bounds[0] <= int(v) <= bounds[1] for v in values)


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the standard domain (0 when it imports none)."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 0
