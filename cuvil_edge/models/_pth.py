"""Read a PyTorch state dict (legacy or zip serialization) into numpy without importing torch.

The EfficientNet-Lite0 weights ship as a ``.pth``; torch is a multi-GB dependency for reading
296 arrays, so this unpickler rebuilds tensors from their storages. It only accepts the classes a
plain state dict uses, so a hostile pickle cannot run code.
"""

from __future__ import annotations

import collections
import pickle
import struct
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from cuvil_edge.errors import ModelError

__all__ = ["load_state_dict"]

_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _Storage:
    def __init__(self, key: str, dtype: Any) -> None:
        self.key = key
        self.dtype = np.dtype(dtype)
        self.data: np.ndarray | None = None


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> Any:
    return ("tensor", storage, offset, tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: IO[bytes]) -> None:
        super().__init__(f)
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch" and name in _DTYPES:
            return name
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a state dict")

    def persistent_load(self, pid: Any) -> Any:
        _, storage_type, key, _location, _numel = pid[:5]
        name = storage_type if isinstance(storage_type, str) else str(storage_type)
        if key not in self.storages:
            self.storages[key] = _Storage(key, _DTYPES[name])
        return self.storages[key]


def _materialize(obj: Any) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, value in obj.items():
        if not (isinstance(value, tuple) and value and value[0] == "tensor"):
            continue
        _, storage, offset, size, stride = value
        assert storage.data is not None
        itemsize = storage.dtype.itemsize
        arr = np.lib.stride_tricks.as_strided(
            storage.data[offset:], shape=size, strides=tuple(s * itemsize for s in stride)
        )
        out[name] = np.array(arr, copy=True)
    return out


def load_state_dict(path: Path) -> dict[str, np.ndarray]:
    """Load a ``.pth`` state dict as ``{name: ndarray}``."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                pkl = next(n for n in zf.namelist() if n.endswith("data.pkl"))
                prefix = pkl[: -len("data.pkl")]
                with zf.open(pkl) as f:
                    up = _Unpickler(f)
                    obj = up.load()
                for key, st in up.storages.items():
                    st.data = np.frombuffer(zf.read(f"{prefix}data/{key}"), dtype=st.dtype)
                return _materialize(obj)
        with open(path, "rb") as f:
            for _ in range(3):  # magic number, protocol version, system info
                pickle.load(f)
            up = _Unpickler(f)
            obj = up.load()
            keys = pickle.load(f)
            for key in keys:
                (numel,) = struct.unpack("<q", f.read(8))
                st = up.storages[key]
                st.data = np.frombuffer(f.read(numel * st.dtype.itemsize), dtype=st.dtype)
            return _materialize(obj)
    except (OSError, pickle.UnpicklingError, EOFError, struct.error, KeyError, StopIteration) as exc:
        raise ModelError(f"{path}: cannot read PyTorch state dict ({exc})") from exc
