"""A small helper to emit ONNX graphs node by node with folded weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Accumulates nodes and initializers; names are generated from a prefix and a counter."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: object) -> str:
        node_name = name or self._name(op_type.lower())
        out = f"{node_name}_out"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=node_name, **attrs))
        return out

    def conv(
        self,
        x: str,
        weight: np.ndarray,
        bias: np.ndarray,
        name: str,
        stride: int = 1,
        pads: tuple[int, int, int, int] = (0, 0, 0, 0),
        group: int = 1,
    ) -> str:
        w = self.const(f"{name}.weight", weight.astype(np.float32))
        b = self.const(f"{name}.bias", bias.astype(np.float32))
        k = weight.shape[2:]
        return self.op(
            "Conv", [x, w, b], name=name, kernel_shape=list(k), strides=[stride, stride], pads=list(pads), group=group
        )

    def relu6(self, x: str, name: str) -> str:
        lo = self.const(f"{name}.min", np.array(0.0, np.float32))
        hi = self.const(f"{name}.max", np.array(6.0, np.float32))
        return self.op("Clip", [x, lo, hi], name=name)

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: list[tuple[str, str, list[object]]], graph_name: str
    ) -> onnx.ModelProto:
        outs = []
        for produced, public, shape in outputs:
            self.nodes.append(helper.make_node("Identity", [produced], [public], name=f"{public}_identity"))
            outs.append(helper.make_tensor_value_info(public, TensorProto.FLOAT, shape))
        graph = helper.make_graph(self.nodes, graph_name, inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="cuvil-edge")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model
