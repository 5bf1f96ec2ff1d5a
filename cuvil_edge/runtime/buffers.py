"""Host I/O buffers: a reuse pool and the placement policy per device.

Placement (issue #4): on an integrated GPU (Jetson, unified LPDDR) inputs go in
zero-copy *mapped* host memory the GPU reads directly; on a discrete GPU in *pinned* host memory
copied asynchronously to device buffers; with no GPU (or no pycuda) in plain pageable memory.
``pycuda`` is imported only when a GPU placement is asked for.

The pool hands out arrays by (dtype, shape) and takes them back, so the batcher's concatenation
buffers are allocated once per batch size rather than once per request. It is bounded in bytes;
beyond the bound a released buffer is simply dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BufferPool", "Placement", "host_allocator"]


class Placement:
    """Names of the placement policies."""

    PAGEABLE = "pageable"
    PINNED = "pinned"
    MAPPED = "mapped"


def host_allocator(placement: str = Placement.PAGEABLE) -> Callable[[tuple[int, ...], np.dtype], np.ndarray]:
    """An ``alloc(shape, dtype) -> ndarray`` for a placement.

    Args:
        placement (str): ``"pageable"``, ``"pinned"`` (discrete GPU) or ``"mapped"`` (integrated
            GPU, zero-copy). Defaults to ``"pageable"``. Pinned and mapped need pycuda and a CUDA
            context; without them this falls back to pageable memory.
    """
    if placement == Placement.PAGEABLE:
        return lambda shape, dtype: np.empty(shape, dtype)
    try:
        import pycuda.driver as cuda  # noqa: F401
    except ImportError:
        return lambda shape, dtype: np.empty(shape, dtype)
    import pycuda.driver as cuda

    flags = cuda.host_alloc_flags.DEVICEMAP if placement == Placement.MAPPED else 0

    def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return cuda.pagelocked_empty(shape, dtype, mem_flags=flags)

    return alloc


class BufferPool:
    """A bounded pool of reusable host arrays keyed by (dtype, shape).

    Args:
        max_bytes (int): bytes kept idle in the pool at most. Defaults to 64 MiB.
        placement (str): see :func:`host_allocator`. Defaults to pageable.
    """

    def __init__(self, max_bytes: int = 64 << 20, placement: str = Placement.PAGEABLE) -> None:
        self.max_bytes = int(max_bytes)
        self.placement = placement
        self._alloc = host_allocator(placement)
        self._free: dict[tuple[str, tuple[int, ...]], list[np.ndarray]] = {}
        self._idle_bytes = 0
        self._lock = threading.Lock()
        self.allocations = 0
        self.reuses = 0

    @property
    def idle_bytes(self) -> int:
        """Bytes held by idle buffers."""
        return self._idle_bytes

    def acquire(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of this shape and dtype, reused when one is idle."""
        dt = np.dtype(dtype)
        key = (dt.str, tuple(shape))
        with self._lock:
            stack = self._free.get(key)
            if stack:
                arr = stack.pop()
                self._idle_bytes -= arr.nbytes
                self.reuses += 1
                return arr
            self.allocations += 1
        return self._alloc(tuple(shape), dt)

    def release(self, arr: np.ndarray) -> None:
        """Give an array back; it is dropped if the pool is full."""
        key = (arr.dtype.str, arr.shape)
        with self._lock:
            if self._idle_bytes + arr.nbytes > self.max_bytes:
                return
            self._free.setdefault(key, []).append(arr)
            self._idle_bytes += arr.nbytes

    def clear(self) -> None:
        """Drop every idle buffer (pressure ladder: release memory)."""
        with self._lock:
            self._free.clear()
            self._idle_bytes = 0
