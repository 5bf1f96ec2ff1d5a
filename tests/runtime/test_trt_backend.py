"""TensorRT backend: engine choice, I/O placement and copy traffic, shared scratch, padding.

TensorRT cannot be installed on the development machine, so the parts that need it skip with
the reason; everything around the engine (placement, copies, scratch sharing, call order) runs
against :class:`HostDeviceOps`, a model of device memory in host RAM.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime.buffers import Placement
from cuvil_edge.runtime.trt import (
    IOSlot,
    ScratchArena,
    TensorBinding,
    TensorRTMissing,
    TrtBackend,
    choose_placement,
    local_l4t,
    pad_batch,
    run_slot,
    select_engine,
)

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None and importlib.util.find_spec("pycuda") is not None


class HostDeviceOps:
    """Models a GPU's memory in host RAM for the tests (this machine has no GPU).

    Device pointers are keys into a table of byte buffers; a *mapped* host array's device alias
    is registered as a view of the same memory (what zero-copy means on a Jetson); copies move
    bytes between host arrays and buffers and are recorded with their sizes.
    """

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.copies: list[tuple[str, int]] = []
        self.freed: list[int] = []
        self.pagelocked: list[tuple[np.ndarray, bool]] = []  # (allocation, mapped)
        self._aliases: dict[int, int] = {}
        self._next = 0x1000

    def _new_ptr(self, buf: np.ndarray) -> int:
        ptr = self._next
        self._next += 0x10000000
        self.buffers[ptr] = buf
        return ptr

    def memory(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes at a device pointer (which may point inside an allocation)."""
        base = max(p for p in self.buffers if p <= ptr)
        return self.buffers[base][ptr - base: ptr - base + nbytes]

    def alloc_host(self, shape, dtype, mapped):
        arr = np.zeros(shape, dtype)
        self.pagelocked.append((arr, mapped))
        return arr

    def device_alias(self, host):
        if id(host) not in self._aliases:
            self._aliases[id(host)] = self._new_ptr(host.reshape(-1).view(np.uint8))
        return self._aliases[id(host)]

    def pagelocked_alias(self, arr):
        for alloc, mapped in self.pagelocked:
            if mapped and np.shares_memory(arr, alloc):
                return self.device_alias(alloc) + (arr.ctypes.data - alloc.ctypes.data)
        return None

    def is_pagelocked(self, arr):
        return any(np.shares_memory(arr, alloc) for alloc, _m in self.pagelocked)

    def alloc_device(self, nbytes):
        return self._new_ptr(np.zeros(int(nbytes), np.uint8))

    def free_device(self, ptr):
        self.freed.append(ptr)
        self.buffers.pop(ptr)

    def htod_async(self, dst, src, stream):
        raw = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        self.memory(dst, raw.size)[:] = raw
        self.copies.append(("htod", raw.size))

    def dtoh_async(self, dst, src, stream):
        raw = dst.reshape(-1).view(np.uint8)
        raw[:] = self.memory(src, raw.size)
        self.copies.append(("dtoh", raw.size))

    def new_stream(self):
        return object()

    def stream_handle(self, stream):
        return id(stream)

    def synchronize(self, stream):
        self.copies.append(("sync", 0))


class DoublingContext:
    """Stands in for an IExecutionContext in these tests; it is not TensorRT.

    It records the documented calls ``run_slot`` makes (``set_input_shape``,
    ``set_tensor_address``, ``set_device_memory``, ``execute_async_v3``) and, on execute, writes
    ``2 * input`` into the output through the bound device addresses, so the data path through
    each placement can be checked end to end.
    """

    def __init__(self, ops: HostDeviceOps, delay: float = 0.0) -> None:
        self.ops = ops
        self.calls: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addr: dict[str, int] = {}
        self.scratch: tuple[int, int] | None = None
        self.delay = delay
        self.in_use: set[int] | None = None

    def set_input_shape(self, name, shape):
        self.calls.append("set_input_shape")
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name, ptr):
        self.calls.append("set_tensor_address")
        self.addr[name] = ptr

    def set_device_memory(self, ptr, size):
        self.calls.append("set_device_memory")
        self.scratch = (ptr, size)

    def get_tensor_shape(self, name):
        return self.shapes["x"][:1] + (4,)

    def execute_async_v3(self, handle):
        self.calls.append("execute_async_v3")
        if self.in_use is not None:
            assert self.scratch[0] not in self.in_use, "two contexts share a scratch block at once"
            self.in_use.add(self.scratch[0])
        time.sleep(self.delay)
        n = int(np.prod(self.shapes["x"]))
        x = self.ops.memory(self.addr["x"], n * 4).view(np.float32)
        y = self.ops.memory(self.addr["y"], n * 4).view(np.float32)
        y[:] = 2 * x
        if self.in_use is not None:
            self.in_use.discard(self.scratch[0])
        return True


BINDINGS = [TensorBinding("x", np.dtype(np.float32), (8, 4), True),
            TensorBinding("y", np.dtype(np.float32), (8, 4), False)]


def _set_mem(ctx, ptr, size):
    ctx.set_device_memory(ptr, size)


class TestPlacement:
    def test_policy(self):
        assert choose_placement(integrated=True) == Placement.MAPPED
        assert choose_placement(integrated=False) == Placement.PINNED
        assert choose_placement(integrated=False, has_gpu=False) == Placement.PAGEABLE

    def test_mapped_is_zero_copy(self):
        ops = HostDeviceOps()
        slot = IOSlot(BINDINGS, Placement.MAPPED, ops)
        # The device pointer aliases the host array: what the engine writes, the host reads.
        ops.memory(slot.device["x"], 4)[:] = np.frombuffer(np.float32(7).tobytes(), np.uint8)
        assert slot.host["x"].reshape(-1)[0] == 7
        out = run_slot(DoublingContext(ops), slot, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)},
                       None, _set_mem)
        np.testing.assert_array_equal(out["y"], 2 * np.arange(12, dtype=np.float32).reshape(3, 4))
        assert [c for c in ops.copies if c[0] != "sync"] == []
        assert slot.nbytes == 2 * 8 * 4 * 4  # one host buffer per tensor, no device twin

    def test_pinned_copies_only_the_batch(self):
        ops = HostDeviceOps()
        slot = IOSlot(BINDINGS, Placement.PINNED, ops)
        assert slot.device["x"] != slot.device["y"] and slot.nbytes == 2 * 2 * 8 * 4 * 4
        x = np.ones((3, 4), np.float32)
        out = run_slot(DoublingContext(ops), slot, {"x": x}, None, _set_mem)
        np.testing.assert_array_equal(out["y"], 2 * x)
        assert ops.copies == [("htod", 3 * 4 * 4), ("dtoh", 3 * 4 * 4), ("sync", 0)]
        slot.release()
        assert len(ops.freed) == 2

    def test_inputs_already_in_page_locked_memory_are_not_staged(self):
        """The batcher assembling a batch in a BufferPool of the slot's placement saves a copy."""
        for placement, mapped in ((Placement.MAPPED, True), (Placement.PINNED, False)):
            ops = HostDeviceOps()
            slot = IOSlot(BINDINGS, placement, ops)
            pooled = ops.alloc_host((8, 4), np.dtype(np.float32), mapped)
            batch = pooled[:3]  # a pool buffer holding 3 requests
            batch[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
            ctx = DoublingContext(ops)
            out = run_slot(ctx, slot, {"x": batch}, None, _set_mem)
            np.testing.assert_array_equal(out["y"], 2 * batch)
            assert slot.host_copies == 0
            if mapped:
                assert ctx.addr["x"] == ops.pagelocked_alias(batch) != slot.device["x"]
                assert [c for c in ops.copies if c[0] == "htod"] == []
            else:
                assert ctx.addr["x"] == slot.device["x"] and ("htod", 48) in ops.copies
            run_slot(ctx, slot, {"x": np.ones((3, 4), np.float32)}, None, _set_mem)
            assert slot.host_copies == 1  # plain numpy input: staged once

    def test_bad_input_is_refused(self):
        slot = IOSlot(BINDINGS, Placement.PINNED, HostDeviceOps())
        with pytest.raises(DaemonError, match="exceeds the engine"):
            slot.stage_inputs({"x": np.zeros((9, 4), np.float32)})
        with pytest.raises(DaemonError, match="missing input 'x'"):
            slot.stage_inputs({})
        with pytest.raises(DaemonError, match="mapped or pinned"):
            IOSlot(BINDINGS, Placement.PAGEABLE, HostDeviceOps())

    def test_results_do_not_alias_reused_buffers(self):
        ops = HostDeviceOps()
        slot = IOSlot(BINDINGS, Placement.MAPPED, ops)
        first = run_slot(DoublingContext(ops), slot, {"x": np.ones((2, 4), np.float32)}, None, _set_mem)
        run_slot(DoublingContext(ops), slot, {"x": np.full((2, 4), 5, np.float32)}, None, _set_mem)
        assert (first["y"] == 2).all()

    def test_call_order_follows_the_api(self):
        ops = HostDeviceOps()
        arena = ScratchArena(ops, slots=1)
        arena.register("m", 1 << 20)
        ctx = DoublingContext(ops)
        run_slot(ctx, IOSlot(BINDINGS, Placement.PINNED, ops), {"x": np.ones((1, 4), np.float32)}, arena, _set_mem)
        assert ctx.calls == ["set_input_shape", "set_tensor_address", "set_tensor_address",
                             "set_device_memory", "execute_async_v3"]
        assert ctx.scratch[1] == 1 << 20
        with pytest.raises(DaemonError, match="unknown output"):
            run_slot(ctx, IOSlot(BINDINGS, Placement.PINNED, ops), {"x": np.ones((1, 4), np.float32)}, arena,
                     _set_mem, outputs=["z"])


class TestScratchArena:
    def test_models_share_blocks(self):
        ops = HostDeviceOps()
        arena = ScratchArena(ops, slots=2)
        arena.register("a", 1 << 20)
        arena.register("b", 3 << 20)
        s1, p1, n1 = arena.acquire()
        s2, p2, n2 = arena.acquire()
        assert p1 != p2 and n1 == n2 == 3 << 20
        arena.release(s1)
        arena.release(s2)
        # Two models x two streams would hold 8 MiB with private scratch; the arena holds 6 MiB.
        assert arena.reserved_bytes == 6 << 20 and arena.allocations == 2
        for _ in range(5):
            s, _p, _n = arena.acquire()
            arena.release(s)
        assert arena.allocations == 2  # reused, not reallocated

    def test_grows_for_a_larger_model_and_trims(self):
        ops = HostDeviceOps()
        arena = ScratchArena(ops, slots=1)
        arena.register("a", 1 << 20)
        s, p, n = arena.acquire()
        arena.release(s)
        arena.register("big", 5 << 20)
        s, p2, n2 = arena.acquire()
        arena.release(s)
        assert n2 == 5 << 20 and p in ops.freed
        arena.trim()
        assert arena.reserved_bytes == 0
        arena.unregister("big")
        s, _p, n3 = arena.acquire()
        assert n3 == 1 << 20
        arena.release(s)

    def test_concurrent_inferences_never_share_a_block(self):
        ops = HostDeviceOps()
        arena = ScratchArena(ops, slots=2)
        arena.register("m", 1 << 16)
        in_use: set[int] = set()
        errors = []

        def worker():
            ctx = DoublingContext(ops, delay=0.01)
            ctx.in_use = in_use
            slot = IOSlot(BINDINGS, Placement.MAPPED, ops)
            try:
                for _ in range(5):
                    out = run_slot(ctx, slot, {"x": np.ones((2, 4), np.float32)}, arena, _set_mem)
                    assert (out["y"] == 2).all()
            except AssertionError as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and arena.allocations == 2

    def test_timeout(self):
        arena = ScratchArena(HostDeviceOps(), slots=1)
        s, _p, _n = arena.acquire()
        with pytest.raises(DaemonError, match="no scratch slot"):
            arena.acquire(timeout=0.01)
        arena.release(s)
        with pytest.raises(DaemonError):
            ScratchArena(HostDeviceOps(), slots=0)


class TestHelpers:
    def test_pad_batch(self):
        padded, n = pad_batch({"x": np.ones((3, 2), np.float32)}, 8)
        assert n == 3 and padded["x"].shape == (8, 2) and padded["x"][3:].sum() == 0
        with pytest.raises(DaemonError, match="exceeds the engine's fixed batch"):
            pad_batch({"x": np.ones((9, 2))}, 8)
        with pytest.raises(DaemonError, match="disagree"):
            pad_batch({"a": np.ones((2, 1)), "b": np.ones((3, 1))}, 8)

    def test_select_engine(self):
        engines = [
            {"key": {"l4t": "36.3.0", "tensorrt": "8.6.2", "sm": "8.7", "dla_core": None}, "path": "a"},
            {"key": {"l4t": "36.4.3", "tensorrt": "10.3.0", "sm": "8.7", "dla_core": None}, "path": "b"},
            {"key": {"l4t": "36.4.3", "tensorrt": "10.3.0", "sm": "8.7", "dla_core": 0}, "path": "c"},
            {"key": {"l4t": "36.4.0", "tensorrt": "10.3.1", "sm": "8.7", "dla_core": None}, "path": "d"},
        ]
        assert select_engine(engines, "10.3.0", "36.4.3")["path"] == "b"
        assert select_engine(engines, "10.3.1")["path"] == "d"  # exact version wins
        assert select_engine(engines, "10.3.0", dla_core=0)["path"] == "c"
        assert select_engine(engines, "8.6.2")["path"] == "a"
        assert select_engine(engines, "10.7.0") is None
        assert select_engine(engines, "10.3.0", sm="7.2") is None

    def test_local_l4t(self, tmp_path):
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc/nv_tegra_release").write_text(
            "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: x\n")
        assert local_l4t(tmp_path) == "36.4.3"
        assert local_l4t(tmp_path / "nothing") is None


class TestBeforeActivation:
    def test_declared_specs_and_footprint_estimate(self, tmp_path):
        from cuvil_edge.runtime.base import BackendOptions, TensorSpec

        engine = tmp_path / "m.engine"
        engine.write_bytes(b"x" * 1000)
        specs = ([TensorSpec.from_manifest({"name": "input", "dtype": "float32", "shape": [-1, 3, 224, 224]})],
                 [TensorSpec.from_manifest({"name": "logits", "dtype": "float32", "shape": [-1, 1000]})])
        backend = TrtBackend(engine, BackendOptions(max_batch=8, extra={"streams": 2}), specs=specs)
        assert [s.name for s in backend.inputs] == ["input"] and backend.outputs[0].shape == (-1, 1000)
        fp = backend.footprint()
        assert fp.weights == 1000 and fp.workspace == 0
        assert fp.io == 2 * 8 * (3 * 224 * 224 + 1000) * 4
        assert backend.max_concurrency == 2


class TestWithoutTensorRT:
    @pytest.mark.skipif(HAVE_TRT, reason="checks the behaviour where TensorRT is missing")
    def test_unavailable_says_why(self, tmp_path):
        ok, why = TrtBackend.available()
        assert not ok and "TensorRT not installable here" in why and "cuvil-edge[jetson]" in why
        with pytest.raises(TensorRTMissing, match=r"cuvil-edge\[jetson\]"):
            TrtBackend.from_bundle(tmp_path, {"engines": []})
        backend = TrtBackend(tmp_path / "m.engine")
        with pytest.raises(CuvilEdgeError, match="TensorRT is not installed"):
            backend.activate()
        assert not backend.is_active

    @pytest.mark.skipif(HAVE_TRT, reason="checks the behaviour where TensorRT is missing")
    def test_loader_falls_back_to_onnx_runtime(self, tmp_path):
        from cuvil_edge.runtime import load_backend

        with pytest.raises(DaemonError, match="cannot run here"):
            load_backend(tmp_path, {"format_kind": "tensorrt"}, kind="tensorrt")


@pytest.mark.skipif(not HAVE_TRT, reason="TensorRT not installable here")
class TestOnDevice:
    """Runs where TensorRT and pycuda exist (a Jetson): build the digits CNN, compare with ORT."""

    def test_engine_matches_onnx_runtime(self, tmp_path):
        import tensorrt

        from cuvil_edge.models import build_digits_cnn
        from cuvil_edge.packager.engine_build import EngineFromOnnx
        from cuvil_edge.packager.engine_plan import make_build_plan
        from cuvil_edge.runtime.ort import OrtBackend
        from cuvil_edge.targets import JetPackRelease, get_target

        model = build_digits_cnn(tmp_path / "digits.onnx")
        release = JetPackRelease("local", "0.0.0", tensorrt.__version__, "local")
        plan = make_build_plan(model, {"precision": "fp32", "max_batch": 4}, get_target("orin-nano-8gb"), release)
        engine = tmp_path / "digits.engine"
        engine.write_bytes(EngineFromOnnx(model, plan)())
        x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
        with TrtBackend(Path(engine)) as trt_b, OrtBackend(model) as ort_b:
            np.testing.assert_allclose(trt_b.infer({"input": x})["logits"], ort_b.infer({"input": x})["logits"],
                                       rtol=1e-3, atol=1e-3)


def test_pressure_trims_the_shared_arena(monkeypatch):
    # The daemon calls trim_shared_arena through the package (sys.modules["cuvil_edge.runtime.trt"]);
    # the arena itself is a global of the scratch module, where the function looks it up.
    import cuvil_edge.runtime.trt as trt
    import cuvil_edge.runtime.trt.scratch as scratch

    arena = ScratchArena(HostDeviceOps(), slots=2)
    monkeypatch.setattr(scratch, "_ARENA", arena)
    arena.register("m", 4096)
    for grant in [arena.acquire(), arena.acquire()]:
        arena.release(grant[0])
    assert arena.reserved_bytes == 8192
    assert trt.trim_shared_arena() == 8192 and arena.reserved_bytes == 0
    monkeypatch.setattr(scratch, "_ARENA", None)
    assert trt.trim_shared_arena() == 0


def test_shared_arena_is_one_per_process(monkeypatch):
    import cuvil_edge.runtime.trt.scratch as scratch

    monkeypatch.setattr(scratch, "_ARENA", None)
    first = scratch.shared_arena(HostDeviceOps(), slots=3)
    assert scratch.shared_arena(HostDeviceOps(), slots=1) is first and first.slots == 3


def test_package_keeps_the_names_of_the_former_module():
    """``runtime/trt`` was one module; every name imported from it then still imports from the package."""
    import importlib

    import cuvil_edge.runtime.trt as trt

    for job in ("backend", "device_memory", "engine_choice", "io_buffers", "scratch", "tensorrt_import"):
        module = importlib.import_module(f"cuvil_edge.runtime.trt.{job}")
        for name in module.__all__:
            assert getattr(module, name).__module__ == module.__name__, f"{job}.{name} is defined elsewhere"
            if name in trt.__all__:
                assert getattr(trt, name) is getattr(module, name)


def test_dla_core_is_set_before_the_engine_deserializes(tmp_path):
    """IRuntime::setDLACore must precede deserializeCudaEngine, or a DLA engine lands on core 0."""
    import types

    from cuvil_edge.runtime.base import BackendOptions

    calls: list[tuple[str, object]] = []

    class Runtime:  # records what the backend does to TensorRT's IRuntime; it is not TensorRT
        def __init__(self, logger):
            calls.append(("Runtime", None))

        def __setattr__(self, name, value):
            calls.append((f"set {name}", value))

        def deserialize_cuda_engine(self, data):
            calls.append(("deserialize_cuda_engine", len(data)))
            return None

    class Logger:
        WARNING = "W"

        def __init__(self, severity):
            pass

    trt = types.SimpleNamespace(__version__="10.3.0", Runtime=Runtime, Logger=Logger)
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"dla engine")
    backend = TrtBackend(engine, BackendOptions(dla_core=1), ops=HostDeviceOps())
    with pytest.raises(DaemonError, match="could not deserialize"):
        backend._activate_engine(trt, backend._ops, True)
    assert [c[0] for c in calls] == ["Runtime", "set DLA_core", "deserialize_cuda_engine"]
    assert calls[1][1] == 1
    calls.clear()
    gpu = TrtBackend(engine, BackendOptions(), ops=HostDeviceOps())
    with pytest.raises(DaemonError):
        gpu._activate_engine(trt, gpu._ops, True)
    assert [c[0] for c in calls] == ["Runtime", "deserialize_cuda_engine"]


def test_footprint_counts_cuda_startup_once_per_process(tmp_path):
    from cuvil_edge.runtime.base import BackendOptions
    from cuvil_edge.runtime.trt import backend as backend_mod
    from cuvil_edge.runtime.trt.startup import EAGER_STARTUP_BYTES, LAZY_STARTUP_BYTES, cuda_startup_bytes

    assert cuda_startup_bytes("10.3.0") == LAZY_STARTUP_BYTES  # JetPack 6.2: CUDA 12.6, lazy loading
    assert cuda_startup_bytes("8.6.2") == LAZY_STARTUP_BYTES  # JetPack 6.0: CUDA 12.2
    assert cuda_startup_bytes("8.5.2") == EAGER_STARTUP_BYTES  # JetPack 5.1: CUDA 11.4, eager
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x" * 10)
    opts = BackendOptions(extra={"tensorrt_version": "10.3.0"})
    first, second = TrtBackend(engine, opts), TrtBackend(engine, opts)
    assert first.footprint().startup == LAZY_STARTUP_BYTES
    backend_mod._STARTUP_OWNER["owner"] = id(first)  # first activated: it carries the process's start-up
    try:
        assert first.footprint().startup == LAZY_STARTUP_BYTES and second.footprint().startup == 0
        assert first.footprint().total == first.footprint().weights + first.footprint().io + LAZY_STARTUP_BYTES
    finally:
        backend_mod._STARTUP_OWNER.clear()
