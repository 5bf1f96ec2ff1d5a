"""Load and check an ONNX model: parse, external data, checker, shape inference, opset, truncation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from cuvil_edge.errors import ModelError
from cuvil_edge.packager.data import InputSpec

__all__ = ["MIN_QUANT_OPSET", "load_model", "model_inputs", "model_outputs", "opset_of", "upgrade_opset"]

MIN_QUANT_OPSET = 13  # per-channel Q/DQ needs opset 13


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ModelError("model imports no default-domain opset")


def _check_initializers(model: onnx.ModelProto, path: Path) -> None:
    """Catch truncation that protobuf parsing misses: raw data shorter than the tensor's shape."""
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or not init.HasField("raw_data"):
            continue
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        expected = int(np.prod(init.dims, dtype=np.int64)) * np.dtype(dtype).itemsize
        if len(init.raw_data) != expected:
            raise ModelError(
                f"{path}: truncated or corrupt: initializer '{init.name}' has {len(init.raw_data)} bytes, "
                f"its shape needs {expected}"
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_model(path: Path) -> onnx.ModelProto:
    """Load an ONNX file (with external data) and check it; one-line ModelError on any problem."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: model file not found")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, expected an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=True)
    except DecodeError:
        raise ModelError(f"{path}: not an ONNX model, or the file is truncated (protobuf parse failed)") from None
    except onnx.checker.ValidationError as exc:
        # onnx refuses external data outside the model's folder (path traversal) this way.
        raise ModelError(f"{path}: refused external data: {_first_line(exc)}") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot load ONNX model or its external data ({_first_line(exc)})") from None
    if not model.graph.node or not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model, or the file is truncated (graph has no nodes or outputs)")
    if not model_inputs(model):
        raise ModelError(f"{path}: the graph has no inputs (every graph input is an initializer); "
                         "cuvil-edge packages models that take at least one input tensor")
    _check_initializers(model, path)
    opset = opset_of(model)
    if opset < 7:
        raise ModelError(f"{path}: opset {opset} is too old (need 7 or newer)")
    try:
        onnx.checker.check_model(model, full_check=False)
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: ONNX checker rejected the model: {first}") from None
    return model


def upgrade_opset(model: onnx.ModelProto, opset: int = MIN_QUANT_OPSET) -> onnx.ModelProto:
    """Convert to ``opset`` if older (quantization needs 13 for per-channel Q/DQ)."""
    if opset_of(model) >= opset:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, opset)
    except Exception as exc:  # the converter raises bare RuntimeError/ValidationError
        raise ModelError(f"cannot upgrade model from opset {opset_of(model)} to {opset}: {exc}") from None


def _dims(vi: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    shape = vi.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in shape.dim)


def _dtype(vi: onnx.ValueInfoProto) -> str:
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)))


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """Graph inputs that are not initializers."""
    inits = {i.name for i in model.graph.initializer}
    return [InputSpec(i.name, _dtype(i), _dims(i)) for i in model.graph.input if i.name not in inits]


def model_outputs(model: onnx.ModelProto) -> list[InputSpec]:
    return [InputSpec(o.name, _dtype(o), _dims(o)) for o in model.graph.output]
