"""Activation ("scratch") memory shared by every TensorRT model's execution contexts.

Each context is created with ``ExecutionContextAllocationStrategy.USER_MANAGED``
(``create_execution_context_without_device_memory`` before TensorRT 10) and gets its activation
memory from the process-wide :class:`ScratchArena` right before each enqueue
(``set_device_memory``), so models that do not run at the same instant share scratch instead of
each holding its own.
"""

from __future__ import annotations

import queue
import threading

from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime.trt.device_memory import DeviceOps

__all__ = ["ScratchArena", "shared_arena", "trim_shared_arena"]


class ScratchArena:
    """Activation ("scratch") memory shared by the execution contexts of every model.

    ``slots`` device blocks, each as large as the largest engine registered so far. An
    inference takes a free slot, points its context at that block (``set_device_memory``) and
    gives it back after the stream synchronizes, so N models with concurrency C hold C blocks of
    the largest requirement instead of N x C blocks. Blocks grow (reallocated while idle) when
    a larger engine registers.

    Args:
        ops (DeviceOps): device allocator.
        slots (int): concurrent inferences across all models. Defaults to 2.
    """

    def __init__(self, ops: DeviceOps, slots: int = 2) -> None:
        if slots < 1:
            raise DaemonError(f"scratch arena needs at least one slot, got {slots}")
        self.ops = ops
        self._ptrs: list[int | None] = [None] * slots
        self._sizes: list[int] = [0] * slots
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            self._free.put(i)
        self._lock = threading.Lock()
        self.requirements: dict[str, int] = {}
        self.allocations = 0

    @property
    def slots(self) -> int:
        return len(self._ptrs)

    @property
    def size(self) -> int:
        """Bytes one inference may need: the largest registered requirement."""
        return max(self.requirements.values(), default=0)

    @property
    def reserved_bytes(self) -> int:
        """Device bytes the arena holds now."""
        return sum(self._sizes)

    def register(self, owner: str, nbytes: int) -> None:
        """Declare that ``owner`` needs ``nbytes`` of scratch per inference."""
        with self._lock:
            self.requirements[owner] = int(nbytes)

    def unregister(self, owner: str) -> None:
        with self._lock:
            self.requirements.pop(owner, None)

    def acquire(self, timeout: float | None = None) -> tuple[int, int, int]:
        """Take a slot: ``(slot, pointer, block size)``; blocks until one is free.

        A slot's block is (re)allocated when it is smaller than the largest requirement.
        """
        try:
            slot = self._free.get(timeout=timeout)
        except queue.Empty:
            raise DaemonError("no scratch slot became free in time") from None
        try:
            with self._lock:
                need = self.size
                ptr = self._ptrs[slot]
                if need > self._sizes[slot]:
                    if ptr is not None:
                        self.ops.free_device(ptr)
                    ptr = self._ptrs[slot] = self.ops.alloc_device(need)
                    self._sizes[slot] = need
                    self.allocations += 1
                return slot, int(ptr or 0), self._sizes[slot]
        except BaseException:
            self._free.put(slot)
            raise

    def release(self, slot: int) -> None:
        """Give a slot back once its stream has synchronized."""
        self._free.put(slot)

    def trim(self) -> None:
        """Free every idle block (pressure ladder: release idle contexts' memory)."""
        taken = []
        while True:
            try:
                taken.append(self._free.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            for slot in taken:
                ptr = self._ptrs[slot]
                if ptr is not None:
                    self.ops.free_device(ptr)
                self._ptrs[slot] = None
                self._sizes[slot] = 0
        for slot in taken:
            self._free.put(slot)


_ARENA: ScratchArena | None = None
_ARENA_LOCK = threading.Lock()


def trim_shared_arena() -> int:
    """Free the shared arena's idle scratch blocks, if there is an arena; returns the bytes freed.

    The memory co-scheduler's ``RELEASE_IDLE`` step calls this: scratch is the largest memory a
    TensorRT model holds besides its weights, and an idle block comes back on the next inference.
    """
    arena = _ARENA
    if arena is None:
        return 0
    before = arena.reserved_bytes
    arena.trim()
    return before - arena.reserved_bytes


def shared_arena(ops: DeviceOps, slots: int = 2) -> ScratchArena:
    """The process-wide arena every TensorRT backend shares (created on first use)."""
    global _ARENA
    with _ARENA_LOCK:
        if _ARENA is None:
            _ARENA = ScratchArena(ops, slots)
        return _ARENA
