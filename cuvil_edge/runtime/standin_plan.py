"""The STAND-IN engine file format (NOT TensorRT): magic, one JSON header line, the ONNX bytes.

Written by the stand-in builder (:mod:`cuvil_edge.packager.engine_standin`, which re-exports these
names) and read by the stand-in runtime (:mod:`cuvil_edge.runtime.trt_standin`); it lives here so
the runtime, which runs on the board, never imports the packager.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["STANDIN_MAGIC", "read_standin_plan", "standin_plan_bytes"]

STANDIN_MAGIC = b"CUVIL-STANDIN-PLAN/1\n"
_NOTE = ("stand-in engine written by cuvil_edge.packager.engine_standin for tests without TensorRT: "
         "it holds the ONNX model, not a TensorRT plan")


def standin_plan_bytes(onnx: bytes, header: dict[str, Any]) -> bytes:
    """The stand-in engine file: magic, one JSON header line, the ONNX bytes."""
    head = {**header, "note": _NOTE, "model_sha256": hashlib.sha256(onnx).hexdigest(), "onnx_size": len(onnx)}
    return STANDIN_MAGIC + json.dumps(head, sort_keys=True).encode() + b"\n" + onnx


def read_standin_plan(data: bytes, where: str = "engine") -> tuple[dict[str, Any], bytes]:
    """Split a stand-in engine into its header and ONNX bytes.

    Raises:
        ValueError: not a stand-in engine, or its ONNX bytes do not hash to the header's sha256.
    """
    if not data.startswith(STANDIN_MAGIC):
        raise ValueError(f"{where}: not a stand-in engine (a real TensorRT plan needs TensorRT to load)")
    rest = data[len(STANDIN_MAGIC):]
    line, sep, onnx = rest.partition(b"\n")
    if not sep:
        raise ValueError(f"{where}: truncated stand-in engine")
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{where}: bad stand-in engine header ({exc})") from exc
    if len(onnx) != header.get("onnx_size") or hashlib.sha256(onnx).hexdigest() != header.get("model_sha256"):
        raise ValueError(f"{where}: stand-in engine's model bytes do not match its header (corrupt)")
    return header, onnx
