"""Fuzz target: a gRPC ``ModelInferRequest`` message, from wire bytes to decoded arrays.

The path every gRPC inference message takes in the daemon: the method handler's parser (a
message that does not parse becomes an INVALID_ARGUMENT answer, never an exception) and
``decode_grpc_infer`` against a model's specs, with system shared memory on: one registered
region whose POSIX object the input may shrink or grow before each execution (as a client may
``truncate`` it under the daemon, finding 1 of issue #26). A digits-like model (FP32 [N,1,8,8]
in, two outputs, batches up to 8) and an image model (UINT8 [N,H,W,3] pre-processing input)
stand in for served ones (stand-in: only their specs are used). Promise: arrays matching the
specs, or an RpcFailure with a client-error code and a bounded message.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import atheris
import grpc
import numpy as np
from _harness import main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.daemon.grpc_calls import Malformed, RpcFailure, parser_for
    from cuvil_edge.daemon.grpc_server import decode_grpc_infer
    from cuvil_edge.daemon.limits import MAX_ERROR
    from cuvil_edge.daemon.pipeline import IMAGE_INPUT
    from cuvil_edge.daemon.proto import grpc_service_pb2 as pb
    from cuvil_edge.daemon.shm import SharedMemoryRegistry
    from cuvil_edge.runtime.base import TensorSpec


_IN = TensorSpec("input", np.dtype(np.float32), (-1, 1, 8, 8))
_IMG_MODEL = TensorSpec("pixels", np.dtype(np.float32), (-1, 3, 16, 16))
_IMG = TensorSpec(IMAGE_INPUT, np.dtype(np.uint8), (-1, -1, -1, 3))
_OUTS = {"logits": TensorSpec("logits", np.dtype(np.float32), (-1, 10)),
         "topk_classes": TensorSpec("topk_classes", np.dtype(np.int64), (-1, 3))}
DIGITS = SimpleNamespace(name="digits", version="1", input_specs={"input": _IN}, output_specs=_OUTS, max_batch=8,
                         pipeline=SimpleNamespace(image_spec=None, model_inputs=[_IN]))
IMAGES = SimpleNamespace(name="imgcls", version="1", input_specs={"pixels": _IMG_MODEL, IMAGE_INPUT: _IMG},
                         output_specs=_OUTS, max_batch=4,
                         pipeline=SimpleNamespace(image_spec=_IMG, model_inputs=[_IMG_MODEL]))
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.UNAVAILABLE}
REGION_BYTES = 4096

_ROOT = Path(tempfile.mkdtemp(prefix="cuvil-fuzz-shm-"))
_OBJECT = _ROOT / "fuzz-region"
_OBJECT.write_bytes(bytes(range(256)) * (REGION_BYTES // 256))
SHM = SharedMemoryRegistry(_ROOT, max_input_bytes=1 << 20)
SHM.register("r", "/fuzz-region", 0, REGION_BYTES)
PARSE = parser_for(pb.ModelInferRequest)


def test_one_input(data: bytes) -> None:
    # Byte 0: bit 0 picks the model; bits 1-7 give the shm object's size now (in 64-byte steps,
    # 0..8128: smaller than the region is a shrunk object). The rest is the message's wire bytes.
    if not data:
        return
    inst = DIGITS if data[0] & 1 else IMAGES
    os.truncate(_OBJECT, (data[0] >> 1) * 64)
    req = PARSE(data[1:])
    if isinstance(req, Malformed):
        assert req.message.startswith("malformed ModelInferRequest")
        return
    try:
        arrays, n_batch, outputs = decode_grpc_infer(req, inst, SHM)  # type: ignore[arg-type]
    except RpcFailure as exc:
        assert exc.code in CLIENT_ERRORS, exc.code
        assert len(str(exc)) <= MAX_ERROR + 40
        return
    assert arrays and n_batch >= 1
    for name, arr in arrays.items():
        assert arr.dtype == inst.input_specs[name].dtype, (name, arr.dtype)
    if outputs is not None:
        assert all(o[0] in inst.output_specs for o in outputs)


def seeds() -> list[bytes]:
    x = (np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) / 64)
    raw = pb.ModelInferRequest(model_name="digits")
    t = raw.inputs.add(name="input", datatype="FP32")
    t.shape.extend([1, 1, 8, 8])
    raw.raw_input_contents.append(x.tobytes())
    raw.outputs.add(name="logits")
    typed = pb.ModelInferRequest(model_name="digits")
    t = typed.inputs.add(name="input", datatype="FP32")
    t.shape.extend([1, 1, 8, 8])
    t.contents.fp32_contents.extend(x.ravel().tolist())
    o = typed.outputs.add(name="topk_classes")
    o.parameters["classification"].int64_param = 3
    shm = pb.ModelInferRequest(model_name="digits")
    t = shm.inputs.add(name="input", datatype="FP32")
    t.shape.extend([2, 1, 8, 8])
    t.parameters["shared_memory_region"].string_param = "r"
    t.parameters["shared_memory_byte_size"].int64_param = 512
    t.parameters["shared_memory_offset"].int64_param = 1024
    o = shm.outputs.add(name="logits")
    o.parameters["shared_memory_region"].string_param = "r"
    o.parameters["shared_memory_byte_size"].int64_param = 80
    img = pb.ModelInferRequest(model_name="imgcls")
    t = img.inputs.add(name=IMAGE_INPUT, datatype="UINT8")
    t.shape.extend([4, 5, 3])
    img.raw_input_contents.append(bytes(range(60)))
    full = 127 << 1  # the object at full size
    return [bytes([full | 1]) + raw.SerializeToString(), bytes([full | 1]) + typed.SerializeToString(),
            bytes([full | 1]) + shm.SerializeToString(), bytes([2 << 1 | 1]) + shm.SerializeToString(),
            bytes([full]) + img.SerializeToString()]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
