"""Where an engine's inputs and outputs live, and moving a request's tensors in and out.

On an integrated GPU (``INTEGRATED`` device attribute, Jetson) inputs and outputs live in mapped
zero-copy host memory (``pagelocked_empty(..., mem_flags=host_alloc_flags.DEVICEMAP)``) whose
device alias is bound with ``set_tensor_address``: no copies. On a discrete GPU they live in
pinned host memory with device twins and async copies on the context's stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime.buffers import Placement
from cuvil_edge.runtime.trt.device_memory import DeviceOps

__all__ = ["IOSlot", "TensorBinding", "choose_placement", "pad_batch"]


def choose_placement(integrated: bool, has_gpu: bool = True) -> str:
    """I/O placement for a device: mapped zero-copy on integrated GPUs, pinned + device copies
    on discrete ones, pageable without a GPU (issue #4; see ``runtime/buffers.py``)."""
    if not has_gpu:
        return Placement.PAGEABLE
    return Placement.MAPPED if integrated else Placement.PINNED


@dataclass(frozen=True)
class TensorBinding:
    """An engine I/O tensor: name, numpy dtype, largest shape it takes, direction."""

    name: str
    dtype: np.dtype
    max_shape: tuple[int, ...]
    is_input: bool

    @property
    def max_bytes(self) -> int:
        return int(np.prod(self.max_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class IOSlot:
    """The host/device buffers of one execution context, placed per device.

    ``mapped``: one page-locked, device-mapped host array per tensor; the engine reads and
    writes it through its device alias: no copies. ``pinned``: a page-locked host array and a
    device buffer per tensor; inputs are copied in and outputs out on the stream, only the bytes
    of the actual batch. Inputs the batcher already assembled in page-locked memory
    (``BufferPool`` with the same placement) skip the staging copy (:meth:`stage_inputs`).

    Args:
        bindings (Sequence[TensorBinding]): the engine's I/O tensors.
        placement (str): ``mapped`` or ``pinned``.
        ops (DeviceOps): device allocator.
        stream: the stream this slot's context runs on. Defaults to a new stream.
    """

    def __init__(self, bindings: Sequence[TensorBinding], placement: str, ops: DeviceOps, stream: Any = None) -> None:
        if placement not in (Placement.MAPPED, Placement.PINNED):
            raise DaemonError(f"TensorRT I/O placement must be mapped or pinned, not {placement!r}")
        self.bindings = {b.name: b for b in bindings}
        self.placement = placement
        self.ops = ops
        self.stream = stream if stream is not None else ops.new_stream()
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, int] = {}
        self.host_copies = 0
        mapped = placement == Placement.MAPPED
        for b in bindings:
            host = ops.alloc_host(b.max_shape, np.dtype(b.dtype), mapped)
            self.host[b.name] = host
            self.device[b.name] = ops.device_alias(host) if mapped else ops.alloc_device(b.max_bytes)

    @property
    def nbytes(self) -> int:
        host = sum(a.nbytes for a in self.host.values())
        return host if self.placement == Placement.MAPPED else 2 * host

    def stage_inputs(self, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], int]]:
        """Make the request's inputs visible to the engine; returns ``{name: (shape, device pointer)}``.

        An input that already lives in page-locked memory of the right kind is used in place:
        mapped memory is bound through its device alias (no copy at all), pinned memory is copied
        to the device straight from where it is. Anything else (plain numpy arrays) is first
        copied into this slot's buffers. ``host_copies`` counts those staging copies.
        """
        staged = {}
        for name, b in self.bindings.items():
            if not b.is_input:
                continue
            if name not in feed:
                raise DaemonError(f"missing input '{name}'")
            arr = np.ascontiguousarray(feed[name], dtype=b.dtype)
            if arr.ndim != len(b.max_shape) or any(d > m for d, m in zip(arr.shape, b.max_shape)):
                raise DaemonError(f"input '{name}' shape {list(arr.shape)} exceeds the engine's {list(b.max_shape)}")
            shape = arr.shape
            if self.placement == Placement.MAPPED:
                alias = self.ops.pagelocked_alias(arr)
                if alias is not None:
                    staged[name] = (shape, alias)
                    continue
            elif self.ops.is_pagelocked(arr):
                self.ops.htod_async(self.device[name], arr, self.stream)
                staged[name] = (shape, self.device[name])
                continue
            view = self.host[name].reshape(-1)[: arr.size].reshape(shape)
            np.copyto(view, arr)
            self.host_copies += 1
            if self.placement == Placement.PINNED:
                self.ops.htod_async(self.device[name], view, self.stream)
            staged[name] = (shape, self.device[name])
        return staged

    def fetch_outputs(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        """Bring the outputs home (device -> host when pinned); call, then synchronize, then read."""
        views = {}
        for name, shape in shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            view = self.host[name].reshape(-1)[:n].reshape(shape)
            if self.placement == Placement.PINNED:
                self.ops.dtoh_async(view, self.device[name], self.stream)
            views[name] = view
        return views

    def release(self) -> None:
        if self.placement == Placement.PINNED:
            for ptr in self.device.values():
                self.ops.free_device(ptr)
        self.host.clear()
        self.device.clear()


def pad_batch(feed: Mapping[str, np.ndarray], batch: int) -> tuple[dict[str, np.ndarray], int]:
    """Zero-pad every input's first dimension to ``batch`` (fixed-shape DLA engines).

    Returns the padded arrays and the original batch size, to slice the outputs back.
    """
    sizes = {a.shape[0] for a in feed.values()}
    if len(sizes) != 1:
        raise DaemonError(f"inputs disagree on the batch size: {sorted(sizes)}")
    n = sizes.pop()
    if n > batch:
        raise DaemonError(f"batch {n} exceeds the engine's fixed batch {batch}")
    if n == batch:
        return dict(feed), n
    padded = {}
    for name, arr in feed.items():
        out = np.zeros((batch, *arr.shape[1:]), dtype=arr.dtype)
        out[:n] = arr
        padded[name] = out
    return padded, n
