"""TensorRT's explicit-quantization rules, checked node by node before a bundle is written.

TensorRT cannot run here, so this is a stand-in for its ONNX parser on the points its documentation
states (onnx-tensorrt's operator matrix for QuantizeLinear/DequantizeLinear, and the "explicit
quantization" section of the TensorRT developer guide), per TensorRT version:

- quantized types: INT8 everywhere; FP8 (E4M3) from TensorRT 9 on GPUs of SM 8.9 or newer; INT4 from
  TensorRT 10, weights only, blocked. Anything else, int32 in particular, is refused: a
  ``DequantizeLinear`` of an int32 bias fails the parser with "only activation types allowed as
  input to this layer" (what ONNX Runtime's quantizer writes by default);
- the scale is a build-time constant, positive and finite, float32 (float16/bfloat16 from TensorRT 10);
- the zero-point is absent or a constant 0 (TensorRT quantizes symmetrically);
- per-channel (1-D scale of more than one value) only on constant weights, along the output-channel
  axis the consuming layer expects (Conv: 0; ConvTranspose: 1; MatMul: the last axis; Gemm: 0 with
  ``transB=1``, else 1); activations are quantized per tensor; per-channel needs opset 13;
- blocked quantization (``block_size``, opset 21) from TensorRT 10, INT4 weights only.

Each violation names the node, the rule and the TensorRT version; ``cuvil-edge inspect`` shows them
and ``package`` refuses a bundle with any for a TensorRT version of the board.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["QdqFacts", "QdqViolation", "check_qdq", "node_violation"]

_INT8 = {TensorProto.INT8}
_FP8 = {TensorProto.FLOAT8E4M3FN}
_INT4 = {TensorProto.INT4}
_SCALE_TYPES_8 = {TensorProto.FLOAT}
_SCALE_TYPES_10 = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


@dataclass(frozen=True)
class QdqViolation:
    """One Q/DQ node a TensorRT version's parser or builder would refuse, and why."""

    node: str
    op_type: str
    tensorrt: str
    rule: str

    def __str__(self) -> str:
        return f"{self.op_type} '{self.node}': {self.rule} (TensorRT {self.tensorrt})"

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "tensorrt": self.tensorrt, "rule": self.rule}


def _major(tensorrt: str) -> int:
    return int(tensorrt.split(".")[0])


def _sm(sm: str) -> tuple[int, int]:
    try:
        major, minor = sm.split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


class QdqFacts:
    """What the rules need to know about the graph: constants, producers, consumers, element types."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.inits = {i.name: i for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value":
                        t = onnx.TensorProto()
                        t.CopyFrom(a.t)
                        t.name = node.output[0]
                        self.inits[node.output[0]] = t
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.types: dict[str, int] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
            for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
                self.types[vi.name] = vi.type.tensor_type.elem_type
        except Exception:  # noqa: BLE001 - types are then read from initializers only
            pass
        for name, init in self.inits.items():
            self.types[name] = init.data_type
        self.opset = next((int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)

    def is_constant(self, name: str, depth: int = 0) -> bool:
        """An initializer, or computed from constants only (``Q(weight) -> DQ``, casts, transposes):
        TensorRT folds those into build-time weights."""
        if name in self.inits:
            return True
        node = self.producers.get(name)
        if node is None or depth > 8:
            return False
        return all(self.is_constant(i, depth + 1) for i in node.input if i)

    def array(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _quantized_type(node: onnx.NodeProto, facts: QdqFacts) -> int | None:
    """Element type of the quantized side: DQ input, or Q output (zero-point type, else attribute, else uint8)."""
    if node.op_type == "DequantizeLinear":
        return facts.types.get(node.input[0])
    if len(node.input) > 2 and node.input[2]:
        return facts.types.get(node.input[2])
    return _attr(node, "output_dtype", 0) or TensorProto.UINT8


def _expected_axis(consumer: onnx.NodeProto, facts: QdqFacts, weight: str) -> int | None:
    """The output-channel axis a weight's consumer quantizes along, or None when not a weight input."""
    if consumer.op_type == "Conv" and len(consumer.input) > 1 and consumer.input[1] == weight:
        return 0
    if consumer.op_type == "ConvTranspose" and len(consumer.input) > 1 and consumer.input[1] == weight:
        return 1
    if consumer.op_type == "Gemm" and len(consumer.input) > 1 and consumer.input[1] == weight:
        return 0 if _attr(consumer, "transB", 0) else 1
    if consumer.op_type == "MatMul" and len(consumer.input) > 1 and consumer.input[1] == weight:
        return -1
    return None


def node_violation(node: onnx.NodeProto, facts: QdqFacts, tensorrt: str, sm: str = "") -> str:
    """The first rule ``node`` breaks for ``tensorrt`` (on a GPU of compute capability ``sm``), or ``""``."""
    if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
        return ""
    major = _major(tensorrt)
    qtype = _quantized_type(node, facts)
    constant_input = facts.is_constant(node.input[0])
    allowed = set(_INT8)
    if major >= 9 and _sm(sm) >= (8, 9):
        allowed |= _FP8
    if major >= 10:
        allowed |= _INT4
    if qtype is not None and qtype not in allowed:
        name = TensorProto.DataType.Name(qtype)
        if node.op_type == "DequantizeLinear" and qtype == TensorProto.INT32:
            return ("input is INT32 (a quantized bias): the parser takes only activation types here "
                    "(\"only activation types allowed as input to this layer\"); keep biases float")
        if qtype == TensorProto.UINT8:
            return ("quantized type UINT8: TensorRT quantizes to signed INT8 with zero-point 0 "
                    "(quantize with int8 activations, ActivationSymmetric=True, WeightSymmetric=True)")
        if qtype in _FP8:
            return f"FP8 needs TensorRT 9+ on SM 8.9 or newer (this GPU is SM {sm or '?'})"
        return f"quantized type {name} is not supported (INT8{', FP8' if major >= 9 else ''}{', INT4 weights' if major >= 10 else ''} only)"
    if qtype in _INT4 and not constant_input:
        return "INT4 quantizes weights only (a constant input), not activations"
    scale = facts.array(node.input[1])
    if scale is None:
        return f"scale '{node.input[1]}' is not a constant: TensorRT needs build-time scales"
    stype = facts.inits[node.input[1]].data_type
    if stype not in (_SCALE_TYPES_10 if major >= 10 else _SCALE_TYPES_8):
        return f"scale type {TensorProto.DataType.Name(stype)} is not supported"
    values = scale.astype(np.float64)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        return "scale must be positive and finite"
    if len(node.input) > 2 and node.input[2]:
        zp = facts.array(node.input[2])
        if zp is None:
            return "zero-point is not a constant; TensorRT needs it to be 0"
        if zp.size and np.any(zp.astype(np.float64) != 0):
            return ("zero-point is not 0: TensorRT takes symmetric Q/DQ only "
                    "(quantize with ActivationSymmetric=True, WeightSymmetric=True)")
    block = _attr(node, "block_size", 0)
    if block:
        if major < 10:
            return "blocked quantization (block_size) needs TensorRT 10"
        if qtype not in _INT4 or not constant_input:
            return "blocked quantization is for INT4 weights only"
        return ""
    if scale.size > 1:
        if facts.opset < 13:
            return f"per-channel quantization needs opset 13 (model has {facts.opset})"
        weight = node.input[0]
        if not constant_input:
            # A Q of a constant weight followed by DQ is fine; anything else per-channel is an activation.
            return "per-channel scales on an activation: TensorRT quantizes activations per tensor"
        axis = _attr(node, "axis", 1)
        source = facts.inits.get(weight)
        if source is None and weight in facts.producers:  # DQ(Q(weight)): the weight's rank
            source = facts.inits.get(facts.producers[weight].input[0])
        if source is None:
            return ""
        rank = len(source.dims)
        out = node.output[0]
        consumers = facts.consumers.get(out, [])
        if node.op_type == "QuantizeLinear":  # Q(weight) -> DQ -> layer: look through the DQ
            consumers = [c2 for dq in consumers if dq.op_type == "DequantizeLinear"
                         for c2 in facts.consumers.get(dq.output[0], [])]
            out = next((dq.output[0] for dq in facts.consumers.get(node.output[0], [])), out)
        for consumer in consumers:
            want = _expected_axis(consumer, facts, out)
            if want is not None and axis % rank != want % rank:
                return (f"per-channel axis {axis} does not match the {consumer.op_type} output-channel axis "
                        f"{want % rank} of '{consumer.name}'")
    return ""


def check_qdq(model: onnx.ModelProto, tensorrt_versions: list[str], sm: str = "") -> list[QdqViolation]:
    """Every Q/DQ node each TensorRT version would refuse (empty when the model is in TensorRT's form)."""
    facts = QdqFacts(model)
    found = []
    for node in model.graph.node:
        for version in tensorrt_versions:
            rule = node_violation(node, facts, version, sm)
            if rule:
                found.append(QdqViolation(node.name or node.output[0], node.op_type, version, rule))
    return found
