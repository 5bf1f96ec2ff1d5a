"""The TensorRT backend's CUDA half on a real GPU: buffers, scratch arena, streams, worker threads.

Skips without pycuda and a CUDA device (the development machine has neither); it runs on a
borrowed NVIDIA H200 (see ``bench/results/engines_gpu_h200.json`` for the recorded run and its
command). TensorRT itself is not on that machine either, so a small CUDA kernel launched on the
slot's stream stands in for ``execute_async_v3`` (:class:`KernelContext`, not TensorRT): it reads
and writes exactly the device addresses :func:`run_slot` binds with ``set_tensor_address`` and
uses the scratch block the arena grants through ``set_device_memory``. Everything else is the code
the daemon runs: :class:`PyCudaOps`, :class:`IOSlot` (mapped zero-copy and pinned + async copies),
:class:`ScratchArena`, :class:`BufferPool` and its page-locked allocator.

With ``CUVIL_EDGE_GPU_REPORT=FILE`` the module writes what it measured there as JSON.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

cuda = pytest.importorskip("pycuda.driver", reason="pycuda is not installed (no GPU stack here)")

try:
    cuda.init()
    _HAVE_GPU = cuda.Device.count() > 0
except Exception:  # noqa: BLE001 - no driver, no device: skip
    _HAVE_GPU = False

pytestmark = pytest.mark.skipif(not _HAVE_GPU, reason="no CUDA device")

from cuvil_edge.runtime.buffers import BufferPool, PageLockedAllocator, Placement  # noqa: E402
from cuvil_edge.runtime.trt import (  # noqa: E402
    IOSlot,
    PyCudaOps,
    ScratchArena,
    TensorBinding,
    choose_placement,
    run_slot,
)

# y = 2 x + 1, computed through the scratch block: s = 2 x (scratch), then y = s + 1, so a scratch
# block that is too small, freed, or shared by two inferences at once gives wrong answers.
KERNEL = r"""
__global__ void through_scratch(const float* x, float* s, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        s[i] = 2.0f * x[i];
        __threadfence();
        y[i] = s[i] + 1.0f;
    }
}
__global__ void add_one(float* p, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        p[i] += 1.0f;
}
"""

REPORT: dict = {"tests": {}}


@pytest.fixture(scope="module")
def gpu():
    """The device's primary context, current on the test thread for the module."""
    dev = cuda.Device(0)
    ctx = dev.retain_primary_context()
    ctx.push()
    from pycuda.compiler import SourceModule

    mod = SourceModule(KERNEL)
    REPORT.update(device=dev.name(), sm="{}.{}".format(*dev.compute_capability()),
                  integrated=bool(dev.get_attribute(cuda.device_attribute.INTEGRATED)),
                  can_map_host_memory=bool(dev.get_attribute(cuda.device_attribute.CAN_MAP_HOST_MEMORY)),
                  driver=cuda.get_driver_version(), pycuda=getattr(__import__("pycuda"), "VERSION_TEXT", "?"))
    yield {"dev": dev, "ctx": ctx, "through": mod.get_function("through_scratch"),
           "add_one": mod.get_function("add_one")}
    cuda.Context.pop()
    path = os.environ.get("CUVIL_EDGE_GPU_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump(REPORT, fh, indent=2)


class KernelContext:
    """Stands in for a TensorRT execution context (it is not TensorRT): records what run_slot
    binds and, on ``execute_async_v3``, launches :data:`KERNEL` on those addresses on the stream."""

    def __init__(self, func, stream, scratch_needed: int) -> None:
        self.func, self.stream, self.needed = func, stream, scratch_needed
        self.shapes: dict = {}
        self.addr: dict = {}
        self.scratch: tuple[int, int] | None = None

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name, ptr):
        self.addr[name] = int(ptr)

    def set_device_memory(self, ptr, size):
        self.scratch = (int(ptr), int(size))

    def get_tensor_shape(self, name):
        return self.shapes["x"]

    def execute_async_v3(self, handle):
        assert handle == int(self.stream.handle), "enqueued on a stream other than the slot's"
        assert self.scratch is not None and self.scratch[1] >= self.needed, "scratch block too small"
        n = int(np.prod(self.shapes["x"]))
        self.func(np.uintp(self.addr["x"]), np.uintp(self.scratch[0]), np.uintp(self.addr["y"]), np.int64(n),
                  block=(256, 1, 1), grid=(min(1024, (n + 255) // 256), 1), stream=self.stream)
        return True


def _bindings(max_batch: int = 8) -> list[TensorBinding]:
    shape = (max_batch, 3, 64, 64)
    return [TensorBinding("x", np.dtype(np.float32), shape, True),
            TensorBinding("y", np.dtype(np.float32), shape, False)]


def _set_mem(ctx, ptr, size):
    ctx.set_device_memory(ptr, size)


class TestPageLockedFromWorkerThreads:
    """The ORT path's risk: the batcher allocates pool buffers in worker threads with no context."""

    def test_a_bare_allocation_in_a_fresh_thread_fails(self, gpu):
        # The bug this module's fix is for: pycuda allocates in the calling thread's context.
        errors = []

        def bare():
            try:
                cuda.pagelocked_empty((16,), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
            except cuda.Error as exc:
                errors.append(type(exc).__name__ + ": " + str(exc))

        t = threading.Thread(target=bare)
        t.start()
        t.join()
        REPORT["tests"]["bare_worker_allocation_error"] = errors[0] if errors else None
        assert errors, "pagelocked_empty in a thread without a context unexpectedly worked"

    @pytest.mark.parametrize("placement", [Placement.MAPPED, Placement.PINNED])
    def test_pool_allocates_from_workers_and_the_gpu_uses_it(self, gpu, placement):
        pool = BufferPool(placement=placement)
        assert pool.placement == placement
        ops = PyCudaOps()
        shape = (4, 1000)

        def work(i):
            arr = pool.acquire(shape, np.float32)
            arr[...] = i
            return arr

        with ThreadPoolExecutor(4) as ex:
            arrays = list(ex.map(work, range(8)))
        assert all(ops.is_pagelocked(a) for a in arrays)
        if placement == Placement.MAPPED:
            for i, a in enumerate(arrays):
                alias = ops.pagelocked_alias(a)
                assert alias is not None
                gpu["add_one"](np.uintp(alias), np.int64(a.size), block=(256, 1, 1), grid=(16, 1))
                cuda.Context.synchronize()
                assert np.all(a == i + 1), "the GPU did not write the mapped buffer in place"
        for a in arrays:
            pool.release(a)
        del arrays  # freed in the pool's context, whatever thread collects them
        REPORT["tests"][f"pool_{placement}_from_workers"] = "ok"


class TestSlots:
    @pytest.mark.parametrize("placement", [Placement.MAPPED, Placement.PINNED])
    def test_run_slot_on_device_memory(self, gpu, placement):
        ops = PyCudaOps()
        need = 8 * 3 * 64 * 64 * 4
        arena = ScratchArena(ops, slots=1)
        arena.register("m", need)
        slot = IOSlot(_bindings(), placement, ops)
        ctx = KernelContext(gpu["through"], slot.stream, need)
        rng = np.random.default_rng(1)
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 3, 64, 64), dtype=np.float32)
            out = run_slot(ctx, slot, {"x": x}, arena, _set_mem)
            assert out["y"].shape == x.shape
            np.testing.assert_allclose(out["y"], 2 * x + 1, rtol=1e-6)
        if placement == Placement.MAPPED:
            assert ctx.addr["y"] == ops.device_alias(slot.host["y"]), "mapped output is not the host alias"
        else:
            assert ctx.addr["x"] == slot.device["x"], "pinned input is not bound to its device twin"
        # A batch the batcher assembled in a pool of the same placement is used in place.
        pool = BufferPool(placement=placement)
        fed = pool.acquire((2, 3, 64, 64), np.float32)
        fed[...] = 0.5
        copies = slot.host_copies
        out = run_slot(ctx, slot, {"x": fed}, arena, _set_mem)
        np.testing.assert_allclose(out["y"], 2.0)
        assert slot.host_copies == copies, "a page-locked batch was staged again"
        if placement == Placement.MAPPED:
            assert ctx.addr["x"] == ops.pagelocked_alias(fed)
        slot.release()
        arena.trim()
        REPORT["tests"][f"run_slot_{placement}"] = {"placement_chosen_here": choose_placement(REPORT["integrated"]),
                                                   "ok": True}

    def test_concurrent_streams_share_the_arena_safely(self, gpu):
        ops = PyCudaOps()
        need = 8 * 3 * 64 * 64 * 4
        arena = ScratchArena(ops, slots=2)
        arena.register("a", need)
        arena.register("b", need // 2)
        placement = choose_placement(REPORT["integrated"])
        slots = [IOSlot(_bindings(), placement, ops) for _ in range(3)]
        contexts = [KernelContext(gpu["through"], s.stream, need) for s in slots]
        errors: list[str] = []
        rounds = 60

        def worker(i):
            # Each worker thread makes the primary context current, as TrtBackend.infer_impl does.
            gpu["ctx"].push()
            try:
                rng = np.random.default_rng(10 + i)
                for _ in range(rounds):
                    x = rng.standard_normal((8, 3, 64, 64), dtype=np.float32)
                    y = run_slot(contexts[i], slots[i], {"x": x}, arena, _set_mem)["y"]
                    if not np.allclose(y, 2 * x + 1, rtol=1e-6):
                        errors.append(f"worker {i}: wrong result (shared or too small scratch?)")
                        return
            finally:
                cuda.Context.pop()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len({int(s.stream.handle) for s in slots}) == 3
        assert arena.allocations == 2, "each of the two arena slots should be allocated exactly once"
        assert arena.reserved_bytes == 2 * need
        REPORT["tests"]["concurrent_streams"] = {"threads": 3, "arena_slots": 2, "inferences": 3 * rounds,
                                                 "arena_reserved_bytes": arena.reserved_bytes}
        for s in slots:
            s.release()
        arena.trim()

    def test_arena_grows_and_trim_gives_memory_back(self, gpu):
        ops = PyCudaOps()
        arena = ScratchArena(ops, slots=2)
        arena.register("small", 64 << 20)
        free0, _total = cuda.mem_get_info()
        for _ in range(2):
            slot_id, _ptr, size = arena.acquire()
            assert size == 64 << 20
            arena.release(slot_id)
        arena.register("large", 512 << 20)  # a larger engine loads: blocks grow on next use
        grants = [arena.acquire(), arena.acquire()]
        assert all(g[2] == 512 << 20 for g in grants)
        for g in grants:
            arena.release(g[0])
        held = free0 - cuda.mem_get_info()[0]
        arena.trim()  # the co-scheduler's RELEASE_IDLE step
        after = free0 - cuda.mem_get_info()[0]
        assert held >= 2 * (512 << 20) - (8 << 20), f"arena holds {held} bytes, expected about 1 GiB"
        assert after < held - (900 << 20), "trim did not give the scratch blocks back to the device"
        REPORT["tests"]["arena_trim"] = {"held_bytes": int(held), "after_trim_bytes": int(after),
                                         "allocations": arena.allocations}


def test_page_locked_allocator_reports_its_placement(gpu):
    assert PageLockedAllocator(mapped=True).placement == Placement.MAPPED
    assert PageLockedAllocator(mapped=False).placement == Placement.PINNED
