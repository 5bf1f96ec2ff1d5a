"""The mixed search's weights, written once: its models carry references to them, not their bytes.

The search builds a model per question (``partial_quant``), rounds some of its layers to FP16
(``emulate.emulate_fp16``) and opens an ONNX Runtime session on it: several times a second, on models
whose weights run to tens of megabytes (MiniLM's prepared float model: 90 MB). With the weights
inside each ``ModelProto``, copying, shape-inferring and serializing them took most of the search's
time (MiniLM: 0.2 s per serialization, over 80 s of a 117 s search; its model runs took 11 s).

A :class:`WeightStore` keeps each large initializer once in one file, as ONNX external data
(``data_location = EXTERNAL``, the file's name, offset and length), so the search's models are a
few hundred kilobytes of graph. Sessions open the model from a file beside the weights and ONNX
Runtime reads them from there: the same graph and the same bytes, so every figure is what the model
with embedded weights gives (``tests/packager/test_mixed_search.py`` holds them bit-identical). Models
handed out of the search are made whole again (:meth:`WeightStore.embedded`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["EXTERNAL_MIN_BYTES", "WeightStore"]

# Initializers of at least this many bytes go to the store; scales, zero-points and shapes stay inline
# (the quantizer and the rules read them, and they cost nothing to copy).
EXTERNAL_MIN_BYTES = 4096
# Offsets are multiples of a page, so ONNX Runtime can map the weights instead of reading them.
_ALIGN = 4096
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")


class WeightStore:
    """Large initializers of models, each stored once in ``folder/weights.bin``.

    Args:
        folder (Path): a private folder (the quantizer's temporary one); the store writes
            ``weights.bin`` and the model file sessions are opened from.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "weights.bin"
        self.path.touch()
        self._by_digest: dict[bytes, tuple[int, int]] = {}
        self._rounded: dict[tuple[int, int], tuple[int, int]] = {}
        self._size = self.path.stat().st_size

    def _is_ours(self, tensor: TensorProto) -> bool:
        return tensor.data_location == TensorProto.EXTERNAL and any(
            e.key == "location" and e.value == self.path.name for e in tensor.external_data)

    @staticmethod
    def _span(tensor: TensorProto) -> tuple[int, int]:
        info = {e.key: e.value for e in tensor.external_data}
        return int(info["offset"]), int(info["length"])

    def _append(self, data: bytes) -> tuple[int, int]:
        digest = hashlib.blake2b(data, digest_size=20).digest()
        found = self._by_digest.get(digest)
        if found is not None:
            return found
        offset = -(-self._size // _ALIGN) * _ALIGN
        with self.path.open("r+b") as f:
            f.seek(offset)
            f.write(data)
        self._size = offset + len(data)
        self._by_digest[digest] = (offset, len(data))
        return offset, len(data)

    def _refer(self, tensor: TensorProto, span: tuple[int, int]) -> None:
        for name in _DATA_FIELDS:
            tensor.ClearField(name)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(span[0])), ("length", str(span[1]))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value

    def array(self, tensor: TensorProto) -> np.ndarray:
        """The values of ``tensor``, inline or in the store."""
        if not self._is_ours(tensor):
            return numpy_helper.to_array(tensor)
        offset, length = self._span(tensor)
        with self.path.open("rb") as f:
            f.seek(offset)
            data = f.read(length)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        return np.frombuffer(data, dtype=dtype).reshape(tuple(tensor.dims)).copy()

    def light(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` (itself when nothing is inline to move) with every main-graph initializer of
        ``EXTERNAL_MIN_BYTES`` or more referring to the store; the same bytes are stored once."""
        big = [i for i, t in enumerate(model.graph.initializer)
               if not self._is_ours(t) and t.data_type not in (TensorProto.STRING, TensorProto.UNDEFINED)
               and t.data_location != TensorProto.EXTERNAL and _nbytes(t) >= EXTERNAL_MIN_BYTES]
        if not big:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for i in big:
            tensor = out.graph.initializer[i]
            self._refer(tensor, self._append(numpy_helper.to_array(tensor).tobytes()))
        return out

    def embedded(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` (itself when it refers to nothing here) with the store's weights back inline."""
        ours = [i for i, t in enumerate(model.graph.initializer) if self._is_ours(t)]
        if not ours:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for i in ours:
            tensor = out.graph.initializer[i]
            value = self.array(tensor)
            del tensor.external_data[:]
            tensor.ClearField("data_location")
            tensor.raw_data = value.tobytes()
        return out

    def fp16_rounded(self, tensor: TensorProto, name: str) -> TensorProto:
        """An FP32 initializer named ``name`` holding ``tensor``'s values rounded to FP16 (what an FP16
        layer stores), in the store when ``tensor`` is (rounded once per tensor)."""
        if not self._is_ours(tensor):
            return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32), name)
        src = self._span(tensor)
        span = self._rounded.get(src)
        if span is None:
            span = self._rounded[src] = self._append(self.array(tensor).astype(np.float16).astype(np.float32).tobytes())
        out = TensorProto()
        out.name, out.data_type = name, TensorProto.FLOAT
        out.dims.extend(tensor.dims)
        self._refer(out, span)
        return out

    def write(self, model: onnx.ModelProto, name: str = "session.onnx") -> Path:
        """``model`` (made light first) saved beside the weights, for ONNX Runtime to open by path."""
        path = self.folder / name
        path.write_bytes(self.light(model).SerializeToString())
        return path


def _nbytes(tensor: TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    itemsize: Any = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return count * int(itemsize)
