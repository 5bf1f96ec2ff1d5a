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

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from cuvil_edge.errors import CuvilEdgeError

__all__ = ["BufferPool", "PageLockedAllocator", "Placement", "host_allocator"]

log = logging.getLogger("cuvil_edge.runtime.buffers")


class Placement:
    """Names of the placement policies."""

    PAGEABLE = "pageable"
    PINNED = "pinned"
    MAPPED = "mapped"


def host_allocator(placement: str = Placement.PAGEABLE) -> Callable[[tuple[int, ...], np.dtype], np.ndarray]:
    """An ``alloc(shape, dtype) -> ndarray`` for a placement, callable from any thread.

    Args:
        placement (str): ``"pageable"``, ``"pinned"`` (discrete GPU) or ``"mapped"`` (integrated
            GPU, zero-copy). Defaults to ``"pageable"``. Pinned and mapped need pycuda and a GPU;
            without them this falls back to pageable memory, once, with a warning (the returned
            callable's ``placement`` attribute says what it really gives).
    """
    if placement == Placement.PAGEABLE:
        return _pageable
    try:
        return PageLockedAllocator(mapped=placement == Placement.MAPPED)
    except _NoCuda as exc:
        log.warning("%s host buffers unavailable (%s): using pageable memory", placement, exc)
        return _pageable


def _pageable(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


_pageable.placement = Placement.PAGEABLE  # type: ignore[attr-defined]


class _NoCuda(CuvilEdgeError):
    """pycuda or a CUDA device is missing (internal: turned into the pageable fallback)."""


class PageLockedAllocator:
    """Page-locked (pinned, optionally device-mapped) host arrays, safe to call from any thread.

    Why this exists: pycuda allocates page-locked memory *in the calling thread's current CUDA
    context*. The daemon's batcher calls the pool from worker threads, which have no current
    context, so a bare ``pagelocked_empty`` there fails ("no currently active context"), and the
    first batch of every model on a GPU board raised instead of being served. This object retains
    the device's *primary* context once (the same context the TensorRT backend retains, so a
    mapped buffer's device alias is valid for the engine) and makes it current around each
    allocation. The allocation remembers its context, so freeing it later (garbage collection, any
    thread) works too.

    Args:
        mapped (bool): ``DEVICEMAP``: the GPU reads and writes the host array through
            ``get_device_pointer()`` (zero-copy, integrated GPUs).
        device (int): CUDA device ordinal. Defaults to 0.

    Raises:
        _NoCuda: pycuda is not importable or no CUDA device answers.
    """

    def __init__(self, mapped: bool, device: int = 0) -> None:
        try:
            import pycuda.driver as cuda
        except ImportError as exc:
            raise _NoCuda(f"pycuda is not installed: {exc}") from exc
        try:
            cuda.init()
            if cuda.Device.count() <= device:
                raise _NoCuda(f"no CUDA device {device}")
            self._ctx = cuda.Device(device).retain_primary_context()
        except cuda.Error as exc:
            raise _NoCuda(f"CUDA is not usable: {exc}") from exc
        self._cuda = cuda
        self._flags = cuda.host_alloc_flags.DEVICEMAP if mapped else 0
        self.placement = Placement.MAPPED if mapped else Placement.PINNED

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        self._ctx.push()
        try:
            return self._cuda.pagelocked_empty(tuple(shape), np.dtype(dtype), mem_flags=self._flags)
        finally:
            self._cuda.Context.pop()


class BufferPool:
    """A bounded pool of reusable host arrays keyed by (dtype, shape).

    Args:
        max_bytes (int): bytes kept idle in the pool at most. Defaults to 64 MiB.
        placement (str): see :func:`host_allocator`. Defaults to pageable.
    """

    def __init__(self, max_bytes: int = 64 << 20, placement: str = Placement.PAGEABLE) -> None:
        self.max_bytes = int(max_bytes)
        self._alloc = host_allocator(placement)
        # What the pool really hands out: "pageable" when pinned/mapped memory is unavailable.
        self.placement = str(getattr(self._alloc, "placement", placement))
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
