"""Fuzz target: the KServe v2 request decoder, JSON and the binary tensor extension.

``decode_infer`` takes the body, the ``Inference-Header-Content-Length`` value and the model's
tensor specs; a digits-like model (FP32 [N,1,8,8] in, two outputs, batches up to 8) and an image
model ([N,H,W,3] UINT8 through the pre-processing input) stand in for served ones (stand-in: only
their specs are used). Promise: decoded arrays that match the specs, or BadRequest.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import atheris
import numpy as np
from _harness import main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.daemon.infer import BadRequest
    from cuvil_edge.daemon.kserve import decode_infer
    from cuvil_edge.daemon.limits import Limits
    from cuvil_edge.daemon.pipeline import IMAGE_INPUT
    from cuvil_edge.runtime.base import TensorSpec


_IN = TensorSpec("input", np.dtype(np.float32), (-1, 1, 8, 8))
_IMG_MODEL = TensorSpec("pixels", np.dtype(np.float32), (-1, 3, 16, 16))
_IMG = TensorSpec(IMAGE_INPUT, np.dtype(np.uint8), (-1, -1, -1, 3))
_OUTS = {"logits": TensorSpec("logits", np.dtype(np.float32), (-1, 10)),
         "topk_classes": TensorSpec("topk_classes", np.dtype(np.int64), (-1, 3))}
DIGITS = SimpleNamespace(name="digits", input_specs={"input": _IN}, output_specs=_OUTS, max_batch=8,
                         pipeline=SimpleNamespace(image_spec=None, model_inputs=[_IN]))
IMAGES = SimpleNamespace(name="imgcls", input_specs={"pixels": _IMG_MODEL, IMAGE_INPUT: _IMG}, output_specs=_OUTS,
                         max_batch=4, pipeline=SimpleNamespace(image_spec=_IMG, model_inputs=[_IMG_MODEL]))
LIMITS = Limits(max_json=1 << 20, max_json_depth=32)


def test_one_input(data: bytes) -> None:
    # Byte 0 picks the model (bit 0) and the header-length form (bits 1-2); for the numeric form
    # bytes 1-2 give it; the rest is the body. Plain slicing keeps real requests intact as seeds.
    if not data:
        return
    inst = DIGITS if data[0] & 1 else IMAGES
    mode = (data[0] >> 1) % 3
    if mode == 0:
        header_len, body = None, data[1:]
    elif mode == 1:
        header_len, body = str(int.from_bytes(data[1:3], "little") % 4096).encode(), data[3:]
    else:
        n = data[1] % 7 if len(data) > 1 else 0
        header_len, body = data[2:2 + n], data[2 + n:]
    try:
        doc, arrays, n_batch, outputs, _binary = decode_infer(body, header_len, inst, None, LIMITS)  # type: ignore[arg-type]
    except BadRequest as exc:
        assert 400 <= exc.status < 500
        return
    assert isinstance(doc, dict) and arrays and n_batch >= 1
    for name, arr in arrays.items():
        spec = inst.input_specs[name]
        assert arr.dtype == spec.dtype, (name, arr.dtype)
    if outputs is not None:
        assert all(o[0] in inst.output_specs for o in outputs)


def seeds() -> list[bytes]:
    x = np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) / 64
    json_doc = {"id": "1", "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                       "data": x.ravel().tolist()}],
                "outputs": [{"name": "logits", "parameters": {"binary_data": True}},
                            {"name": "topk_classes", "parameters": {"classification": 3}}]}
    header = json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 512}}],
                         "parameters": {"binary_data_output": True}}).encode()
    two = np.concatenate([x, x]).tobytes()
    img_header = json.dumps({"inputs": [{"name": IMAGE_INPUT, "shape": [4, 5, 3], "datatype": "UINT8",
                                         "parameters": {"binary_data_size": 60}}]}).encode()
    return [
        b"\x01" + json.dumps(json_doc).encode(),
        b"\x03" + len(header).to_bytes(2, "little") + header + two,
        b"\x02" + len(img_header).to_bytes(2, "little") + img_header + bytes(range(60)),
        b"\x05\x03" + str(len(header)).encode()[:3] + header + two,
    ]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
