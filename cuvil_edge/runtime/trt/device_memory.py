"""Device memory and copies behind a small interface, so placement and copy traffic are testable.

:class:`DeviceOps` is the few operations the backend needs; :class:`PyCudaOps` implements them
with pycuda on a device. Tests implement the same protocol over host RAM (there is no GPU on the
development machine).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from cuvil_edge.runtime.trt.tensorrt_import import import_pycuda

__all__ = ["DeviceOps", "PyCudaOps"]


class DeviceOps(Protocol):
    """The few device-memory operations the backend needs (pycuda on a device)."""

    def alloc_host(self, shape: tuple[int, ...], dtype: np.dtype, mapped: bool) -> np.ndarray:
        """Page-locked host array; ``mapped`` makes it addressable by the GPU (zero-copy)."""

    def device_alias(self, host: np.ndarray) -> int:
        """Device pointer of a mapped host array."""

    def pagelocked_alias(self, arr: np.ndarray) -> int | None:
        """Device pointer of ``arr`` when it lies in mapped page-locked memory, else None."""

    def is_pagelocked(self, arr: np.ndarray) -> bool:
        """Whether ``arr`` lies in page-locked host memory (async copies straight from it)."""

    def alloc_device(self, nbytes: int) -> int:
        """A device allocation; returns its pointer."""

    def free_device(self, ptr: int) -> None:
        """Free a device allocation."""

    def htod_async(self, dst: int, src: np.ndarray, stream: Any) -> None:
        """Copy host ``src`` to device ``dst`` on ``stream``."""

    def dtoh_async(self, dst: np.ndarray, src: int, stream: Any) -> None:
        """Copy device ``src`` into host ``dst`` on ``stream``."""

    def new_stream(self) -> Any:
        """A CUDA stream; ``stream_handle`` gives what ``execute_async_v3`` takes."""

    def stream_handle(self, stream: Any) -> int:
        """The raw ``cudaStream_t`` of a stream."""

    def synchronize(self, stream: Any) -> None:
        """Wait for the stream (releasing the GIL)."""


class PyCudaOps:
    """:class:`DeviceOps` with pycuda (``pip install cuvil-edge[jetson]``)."""

    def __init__(self) -> None:
        self.cuda = import_pycuda()
        self._allocs: dict[int, Any] = {}

    def alloc_host(self, shape: tuple[int, ...], dtype: np.dtype, mapped: bool) -> np.ndarray:
        flags = self.cuda.host_alloc_flags.DEVICEMAP if mapped else 0
        return self.cuda.pagelocked_empty(shape, dtype, mem_flags=flags)

    def device_alias(self, host: np.ndarray) -> int:
        allocation: Any = host.base  # pycuda's PagelockedHostAllocation (numpy types .base as an ndarray)
        return int(allocation.get_device_pointer())

    def _allocation_root(self, arr: np.ndarray) -> np.ndarray | None:
        # pagelocked_empty returns an ndarray whose .base is pycuda's PagelockedHostAllocation
        # (a HostPointer); views chain their .base back to that array.
        node: Any = arr
        while isinstance(node, np.ndarray):
            if isinstance(node.base, self.cuda.HostPointer):
                return node
            node = node.base
        return None

    def pagelocked_alias(self, arr: np.ndarray) -> int | None:
        root = self._allocation_root(arr)
        if root is None:
            return None
        allocation: Any = root.base
        try:
            base_ptr = int(allocation.get_device_pointer())
        except self.cuda.Error:  # page-locked but not mapped
            return None
        return base_ptr + (arr.ctypes.data - root.ctypes.data)

    def is_pagelocked(self, arr: np.ndarray) -> bool:
        return self._allocation_root(arr) is not None

    def alloc_device(self, nbytes: int) -> int:
        mem = self.cuda.mem_alloc(max(1, int(nbytes)))
        self._allocs[int(mem)] = mem
        return int(mem)

    def free_device(self, ptr: int) -> None:
        mem = self._allocs.pop(ptr, None)
        if mem is not None:
            mem.free()

    def htod_async(self, dst: int, src: np.ndarray, stream: Any) -> None:
        self.cuda.memcpy_htod_async(dst, src, stream)

    def dtoh_async(self, dst: np.ndarray, src: int, stream: Any) -> None:
        self.cuda.memcpy_dtoh_async(dst, src, stream)

    def new_stream(self) -> Any:
        return self.cuda.Stream()

    def stream_handle(self, stream: Any) -> int:
        return int(stream.handle)

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()
