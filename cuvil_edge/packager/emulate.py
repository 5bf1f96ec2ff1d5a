"""Exact Q/DQ emulation: a quantized model rewritten so that any host computes what the target does.

Why: ONNX Runtime fuses ``DequantizeLinear -> Conv -> QuantizeLinear`` into integer kernels chosen
for the host CPU. On x86 CPUs without AVX-512 VNNI those kernels (u8 x s8 through ``vpmaddubsw``)
saturate their int16 intermediate sums, so an accuracy verdict measured through them is the host's
arithmetic, not the target's: a digits CNN that keeps 0.97+ top-1 agreement on TensorRT or on an ARM
dot-product kernel read 0.78 there. TensorRT (int32 accumulation) and non-saturating integer kernels
compute exactly what the Q/DQ graph says: quantize (divide, round half to even, add the zero-point,
saturate), dequantize (subtract the zero-point, multiply), and the float operator in between.

This module makes that computation explicit in float operators, so no runtime can fuse it into an
integer kernel at any optimisation level:

- ``DequantizeLinear`` of a constant (weights, biases) becomes the dequantized float32 initializer,
  computed exactly as the operator defines it (``(q - zero_point) * scale`` in float32);
- ``QuantizeLinear`` of an activation becomes ``Clip(Round(x / scale) + zero_point, qmin, qmax)``
  held in float (every value is an integer, so float32 holds it exactly), and each
  ``DequantizeLinear`` reading it becomes ``(q - zero_point) * scale``.

The result equals the Q/DQ model's reference semantics up to float rounding of the operators in
between (a convolution's float sum may associate differently from an int32 sum by a few ulps). It
is a stand-in for the target's arithmetic, not the target: it does not model TensorRT's choice of
FP16 kernels for float layers (``emulate_fp16`` does that separately) or its layer fusions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import ModelError

__all__ = ["QUANT_RANGES", "emulate_fp16", "emulate_qdq", "has_qdq"]

# Saturation bounds of each quantized element type (ONNX QuantizeLinear).
QUANT_RANGES: dict[int, tuple[int, int]] = {
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT8: (0, 255),
    TensorProto.INT16: (-32768, 32767),
    TensorProto.UINT16: (0, 65535),
    TensorProto.INT4: (-8, 7),
    TensorProto.UINT4: (0, 15),
}


def has_qdq(model: onnx.ModelProto) -> bool:
    """True when the graph holds any QuantizeLinear or DequantizeLinear node."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _broadcast(values: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis 1-D parameter reshaped to broadcast against a rank-``rank`` tensor along ``axis``."""
    shape = [1] * rank
    shape[axis % rank] = -1
    return values.reshape(shape)


class _Rewriter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = copy.deepcopy(model)
        self.graph = self.model.graph
        self.inits = {i.name: i for i in self.graph.initializer}
        self.ranks = self._ranks()
        self.counter = 0

    def _ranks(self) -> dict[str, int]:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model)
        except Exception:  # noqa: BLE001 - shape inference is best effort here
            inferred = self.model
        ranks: dict[str, int] = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            t = vi.type.tensor_type
            if t.HasField("shape"):
                ranks[vi.name] = len(t.shape.dim)
        for init in self.graph.initializer:
            ranks[init.name] = len(init.dims)
        return ranks

    def name(self, base: str) -> str:
        self.counter += 1
        return f"{base}__emu{self.counter}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def array(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def params(self, node: onnx.NodeProto, rank: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        """(scale, zero_point as float32, element type) of a Q or DQ node, shaped for broadcasting."""
        scale = self.array(node.input[1])
        if scale is None:
            raise ModelError(f"node '{node.name}': scale '{node.input[1]}' is not a constant; cannot emulate")
        zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        zp = self.array(zp_name) if zp_name else None
        if zp_name and zp is None:
            raise ModelError(f"node '{node.name}': zero-point '{zp_name}' is not a constant; cannot emulate")
        if node.op_type == "QuantizeLinear":
            qtype = self.inits[zp_name].data_type if zp_name else _attr(node, "output_dtype", TensorProto.UINT8) or TensorProto.UINT8
        else:
            src = self.inits.get(node.input[0])
            qtype = src.data_type if src is not None else (self.inits[zp_name].data_type if zp_name else TensorProto.UINT8)
        zpf = (zp if zp is not None else np.zeros_like(scale, dtype=np.int32)).astype(np.float32)
        scale = scale.astype(np.float32)
        if scale.size == 1:
            scale, zpf = scale.reshape(()), zpf.reshape(())
        else:
            if _attr(node, "block_size", 0):
                raise ModelError(f"node '{node.name}': blocked quantization is not emulated")
            if rank is None:
                raise ModelError(f"node '{node.name}': per-axis parameters on a tensor of unknown rank")
            axis = _attr(node, "axis", 1)
            scale, zpf = _broadcast(scale, axis, rank), _broadcast(zpf, axis, rank)
        return scale, zpf, qtype

    def run(self) -> onnx.ModelProto:
        nodes = list(self.graph.node)
        quantized_float: set[str] = set()  # Q outputs now carried as float integers
        out_nodes: list[onnx.NodeProto] = []
        for node in nodes:
            if node.op_type == "DequantizeLinear" and node.input[0] in self.inits:
                out_nodes.extend(self._constant_dq(node))
            elif node.op_type == "QuantizeLinear":
                out_nodes.extend(self._quantize(node))
                quantized_float.add(node.output[0])
            elif node.op_type == "DequantizeLinear":
                if node.input[0] not in quantized_float:
                    raise ModelError(f"node '{node.name}': DequantizeLinear of '{node.input[0]}', which is neither a "
                                     "constant nor a QuantizeLinear output; cannot emulate")
                out_nodes.extend(self._dequantize(node))
            else:
                out_nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(out_nodes)
        # Tensors that changed element type lose their stale type annotations.
        stale = quantized_float | {n.output[0] for n in nodes if n.op_type == "DequantizeLinear"}
        keep = [vi for vi in self.graph.value_info if vi.name not in stale]
        del self.graph.value_info[:]
        self.graph.value_info.extend(keep)
        used = {i for n in self.graph.node for i in n.input} | {o.name for o in self.graph.output}
        keep_inits = [i for i in self.graph.initializer if i.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep_inits)
        return self.model

    def _constant_dq(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        q = self.array(node.input[0])
        assert q is not None
        scale, zp, _ = self.params(node, q.ndim)
        value = (q.astype(np.float32) - zp) * scale
        self.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        self.inits[node.output[0]] = self.graph.initializer[-1]
        return []

    def _quantize(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        rank = self.ranks.get(node.input[0])
        scale, zp, qtype = self.params(node, rank)
        if qtype not in QUANT_RANGES:
            raise ModelError(f"node '{node.name}': quantized type {TensorProto.DataType.Name(qtype)} is not emulated")
        lo, hi = QUANT_RANGES[qtype]
        s = self.const(node.name or "q", scale)
        div, rnd, add = self.name("div"), self.name("round"), self.name("zp")
        made = [
            helper.make_node("Div", [node.input[0], s], [div], name=self.name(f"{node.name}/div")),
            helper.make_node("Round", [div], [rnd], name=self.name(f"{node.name}/round")),
        ]
        if np.any(zp != 0):
            made.append(helper.make_node("Add", [rnd, self.const("zp", zp)], [add], name=self.name(f"{node.name}/zp")))
        else:
            add = rnd
        made.append(helper.make_node(
            "Clip", [add, self.const("lo", np.array(lo, np.float32)), self.const("hi", np.array(hi, np.float32))],
            [node.output[0]], name=self.name(f"{node.name}/saturate")))
        return made

    def _dequantize(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        rank = self.ranks.get(node.input[0]) or self.ranks.get(node.output[0])
        scale, zp, _ = self.params(node, rank)
        src = node.input[0]
        made = []
        if np.any(zp != 0):
            sub = self.name("sub")
            made.append(helper.make_node("Sub", [src, self.const("zp", zp)], [sub], name=self.name(f"{node.name}/zp")))
            src = sub
        made.append(helper.make_node("Mul", [src, self.const("scale", scale)], [node.output[0]],
                                     name=self.name(f"{node.name}/scale")))
        return made


def emulate_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every Q/DQ node rewritten as the float arithmetic it defines (see module doc).

    A model without Q/DQ nodes is returned unchanged (as a copy).

    Raises:
        ModelError: a Q/DQ node whose scale or zero-point is not a constant, blocked quantization, or
            a quantized type other than (u)int4/8/16: none of these occur in what this packager writes.
    """
    if not has_qdq(model):
        return copy.deepcopy(model)
    return _Rewriter(model).run()


def _rounded_inline(weight: onnx.TensorProto, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16).astype(np.float32), name)


def emulate_fp16(model: onnx.ModelProto, nodes: list[str],
                 rounded: Callable[[onnx.TensorProto, str], onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """``nodes`` computed as FP16 layers store their values: weights and activations rounded to FP16.

    A stand-in for TensorRT's FP16 kernels: every weight of those nodes, every activation entering
    them from outside the set and every activation they produce is rounded to half precision
    (``Cast`` to FLOAT16 and back), while the arithmetic stays FP32. TensorRT's FP16 kernels may also
    accumulate in FP16 by tactic; storage rounding is the dominant FP16 error for convolutional
    networks, and this form runs at FP32 speed on any CPU (ONNX Runtime's x86 FP16 kernels do not).

    ``rounded(weight, name)`` makes the rounded copy of a weight, named ``name`` (the mixed search's
    ``WeightStore.fp16_rounded``, for weights kept outside the model); by default it is made inline.
    """
    wanted = set(nodes)
    if not wanted:
        return model
    out = copy.deepcopy(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    made_by_fp16 = {o for n in graph.node if n.name in wanted for o in n.output}
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
        types = {vi.name: vi.type.tensor_type.elem_type
                 for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    except Exception:  # noqa: BLE001 - without types, only first inputs and outputs are rounded
        types = {}

    def is_float(name: str, first: bool) -> bool:
        return types.get(name, TensorProto.FLOAT if first else 0) == TensorProto.FLOAT
    done: dict[str, str] = {}
    round_weight = rounded or _rounded_inline
    counter = 0

    def round_trip(name: str) -> tuple[str, list[onnx.NodeProto]]:
        nonlocal counter
        counter += 1
        half, back = f"{name}__fp16_{counter}", f"{name}__fp16r_{counter}"
        return back, [helper.make_node("Cast", [name], [half], name=f"{half}/cast", to=TensorProto.FLOAT16),
                      helper.make_node("Cast", [half], [back], name=f"{back}/cast", to=TensorProto.FLOAT)]

    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name not in wanted:
            new_nodes.append(node)
            continue
        for i, name in enumerate(node.input):
            if not name:
                continue
            init = inits.get(name)
            if init is not None:
                if init.data_type == TensorProto.FLOAT:
                    if name not in done:
                        done[name] = f"{name}__fp16w"
                        graph.initializer.append(round_weight(init, done[name]))
                    node.input[i] = done[name]
            elif name not in made_by_fp16 and is_float(name, i == 0):
                node.input[i], casts = round_trip(name)
                new_nodes.extend(casts)
        new_nodes.append(node)
        for j, name in enumerate(node.output):
            if not name or not is_float(name, j == 0):
                continue
            raw = f"{name}__fp32out"
            node.output[j] = raw
            half = f"{name}__fp16o"
            new_nodes.extend([helper.make_node("Cast", [raw], [half], name=f"{half}/cast", to=TensorProto.FLOAT16),
                              helper.make_node("Cast", [half], [name], name=f"{name}/round", to=TensorProto.FLOAT)])
    del graph.node[:]
    graph.node.extend(new_nodes)
    return out
