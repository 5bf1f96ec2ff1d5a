"""The TensorRT backend: runs a serialized engine on a Jetson (or any NVIDIA GPU with TensorRT >= 8.5).

One execution context per concurrent stream, each with its :class:`~cuvil_edge.runtime.trt.IOSlot`;
scratch from the shared :class:`~cuvil_edge.runtime.trt.ScratchArena` bound right before each
enqueue. Execution: ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3(stream)``,
stream synchronize; pycuda's synchronize and TensorRT's enqueue release the GIL.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.bundle.engine_key import major_minor
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime._manifest import ManifestLike, as_manifest
from cuvil_edge.runtime.base import Backend, BackendOptions, Footprint, TensorSpec
from cuvil_edge.runtime.trt.device_memory import DeviceOps, PyCudaOps
from cuvil_edge.runtime.trt.engine_choice import local_l4t, select_engine
from cuvil_edge.runtime.trt.io_buffers import IOSlot, TensorBinding, choose_placement, pad_batch
from cuvil_edge.runtime.trt.scratch import ScratchArena, shared_arena
from cuvil_edge.runtime.trt.startup import cuda_startup_bytes
from cuvil_edge.runtime.trt.tensorrt_import import (
    TensorRTMissing,
    import_pycuda,
    import_tensorrt,
    installed_tensorrt_version,
)

__all__ = ["TrtBackend", "declared_specs", "run_slot"]


def declared_specs(manifest: Manifest) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs a manifest declares, which a backend answers before activation."""
    return ([TensorSpec.from_manifest(e) for e in manifest.inputs],
            [TensorSpec.from_manifest(e) for e in manifest.outputs])


# Which TensorRT backend of this process carries the CUDA/TensorRT start-up memory in its footprint
# (the process pays it once, however many engines it serves).
_STARTUP_OWNER: dict[str, int] = {}

class TrtBackend(Backend):
    """Runs a serialized TensorRT engine.

    Args:
        engine_path (Path): the ``.engine`` file.
        options (BackendOptions | None): runtime options; ``extra["streams"]`` sets the number of
            execution contexts (concurrent batches), ``extra["python_plugins"]`` registers the
            cuvil Python plugins before the engine loads. Defaults to ``BackendOptions()``.
        name (str | None): label for logs. Defaults to the file name.
        ops (DeviceOps | None): device memory operations. Defaults to :class:`PyCudaOps`.
        specs (tuple[list[TensorSpec], list[TensorSpec]] | None): inputs and outputs as the
            manifest declares them, answered before activation (model metadata, footprint
            estimate). Defaults to None (known after activation only).
    """

    kind = "tensorrt"

    def __init__(
        self,
        engine_path: Path,
        options: BackendOptions | None = None,
        name: str | None = None,
        ops: DeviceOps | None = None,
        specs: tuple[list[TensorSpec], list[TensorSpec]] | None = None,
    ) -> None:
        super().__init__(name or Path(engine_path).name)
        self._declared = specs or ([], [])
        self.engine_path = Path(engine_path)
        self.options = options or BackendOptions()
        self.streams = max(1, int(self.options.extra.get("streams", 2)))
        self._ops = ops
        self._trt: Any = None
        self._engine: Any = None
        self._cuda_ctx: Any = None
        self._bindings: list[TensorBinding] = []
        self._slots: queue.Queue[tuple[Any, IOSlot]] = queue.Queue()
        self._all_slots: list[tuple[Any, IOSlot]] = []
        self._arena: ScratchArena | None = None
        self._scratch = 0
        self._fixed_batch: int | None = None
        self.placement: str | None = None
        self._trt_version = str(self.options.extra.get("tensorrt_version", ""))

    # ------------------------------------------------------------------ discovery

    @staticmethod
    def available() -> tuple[bool, str]:
        try:
            import_tensorrt()
            import_pycuda()
        except TensorRTMissing as exc:
            return False, f"TensorRT not installable here: {exc}"
        return True, ""

    @classmethod
    def from_bundle(
        cls, bundle_dir: Path, manifest: ManifestLike, options: BackendOptions | None = None
    ) -> TrtBackend:
        options = options or BackendOptions()
        version = installed_tensorrt_version()
        manifest = as_manifest(manifest)
        entry = select_engine(manifest.engines, version, local_l4t(), None, options.dla_core)
        if entry is None:
            keys = [e.get("key") for e in manifest.engines]
            raise DaemonError(f"bundle {manifest.name}: no engine for TensorRT {version} "
                              f"(DLA core {options.dla_core}); it carries {keys}. Build one for the device from the "
                              "host: cuvil-edge engine build --on DEVICE BUNDLE")
        return cls(Path(bundle_dir) / str(entry["path"]), options, name=manifest.name or "model",
                   specs=declared_specs(manifest))

    # ------------------------------------------------------------------ lifecycle

    def activate_impl(self) -> None:
        trt = self._trt = import_tensorrt()
        self._trt_version = str(trt.__version__)
        _STARTUP_OWNER.setdefault("owner", id(self))
        if major_minor(trt.__version__) < (8, 5):
            raise DaemonError(f"TensorRT {trt.__version__} lacks the named-tensor API (set_tensor_address, "
                              "execute_async_v3, from 8.5); serve this model with the ONNX Runtime backend")
        ops = self._ops
        if ops is None:
            ops = self._ops = PyCudaOps()
            cuda = ops.cuda
            cuda.init()
            device = cuda.Device(0)
            self._cuda_ctx = device.retain_primary_context()
            self._cuda_ctx.push()
            integrated = bool(device.get_attribute(cuda.device_attribute.INTEGRATED))
        else:
            integrated = bool(self.options.extra.get("integrated", True))
        try:
            self._activate_engine(trt, ops, integrated)
        finally:
            if self._cuda_ctx is not None:
                self._cuda_ctx.pop()

    def _activate_engine(self, trt: Any, ops: DeviceOps, integrated: bool) -> None:
        logger = trt.Logger(trt.Logger.WARNING)
        if self.options.extra.get("python_plugins"):
            # Engines with cuvil Python plugins need their definitions before deserialization.
            from cuvil_edge.trt_plugins import register_python_plugins

            register_python_plugins()
        self._runtime = trt.Runtime(logger)
        if self.options.dla_core is not None:
            # A DLA engine runs on the core the runtime names at deserialization (IRuntime::setDLACore
            # must come first); left unset, TensorRT uses core 0 whatever core the engine was built for.
            self._runtime.DLA_core = int(self.options.dla_core)
        engine = self._engine = self._runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if engine is None:
            raise DaemonError(f"{self.engine_path}: TensorRT {trt.__version__} could not deserialize the engine "
                              "(built by another TensorRT version or for another GPU?)")
        max_batch = self.options.max_batch
        self._bindings = []
        probe = self._new_context(trt, engine)
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            shape = tuple(engine.get_tensor_shape(name))
            if is_input:
                if any(d < 0 for d in shape):
                    _lo, _opt, hi = engine.get_tensor_profile_shape(name, 0)
                    shape = tuple(hi)
                    if max_batch:
                        shape = (min(shape[0], max_batch), *shape[1:])
                else:
                    self._fixed_batch = shape[0] if shape else None
                probe.set_input_shape(name, shape)
            self._bindings.append(TensorBinding(name, dtype, shape, is_input))
        # Output shapes at the largest input shapes.
        self._bindings = [b if b.is_input else TensorBinding(b.name, b.dtype, tuple(probe.get_tensor_shape(b.name)),
                                                           False) for b in self._bindings]
        del probe
        self._scratch = int(getattr(engine, "device_memory_size_v2", 0) or getattr(engine, "device_memory_size", 0))
        self.placement = choose_placement(integrated)
        self._arena = shared_arena(ops, max(self.streams, int(self.options.extra.get("arena_slots", 2))))
        self._arena.register(self._owner, self._scratch)
        for _ in range(self.streams):
            ctx = self._new_context(trt, engine)
            slot = IOSlot(self._bindings, self.placement, ops)
            self._all_slots.append((ctx, slot))
            self._slots.put((ctx, slot))

    @property
    def _owner(self) -> str:
        return f"{self.name}:{id(self)}"

    def _new_context(self, trt: Any, engine: Any) -> Any:
        strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
        if strategy is not None:
            ctx = engine.create_execution_context(strategy.USER_MANAGED)
        else:  # TensorRT 8.5/8.6
            ctx = engine.create_execution_context_without_device_memory()
        if ctx is None:
            raise DaemonError(f"{self.engine_path}: could not create an execution context")
        return ctx

    def deactivate_impl(self) -> None:
        if _STARTUP_OWNER.get("owner") == id(self):
            del _STARTUP_OWNER["owner"]
        if self._arena is not None:
            self._arena.unregister(self._owner)
        if self._cuda_ctx is not None:
            self._cuda_ctx.push()  # device frees need the context current on this thread
        try:
            for _ctx, slot in self._all_slots:
                slot.release()
        finally:
            if self._cuda_ctx is not None:
                self._cuda_ctx.pop()
        self._all_slots.clear()
        self._slots = queue.Queue()
        self._engine = None

    # ------------------------------------------------------------------ inference

    @property
    def max_concurrency(self) -> int:
        return self.streams

    def infer_impl(self, feed: Mapping[str, np.ndarray], outputs: Sequence[str] | None) -> dict[str, np.ndarray]:
        n = None
        if self._fixed_batch:
            feed, n = pad_batch(feed, self._fixed_batch)
        ctx, slot = self._slots.get()
        try:
            if self._cuda_ctx is not None:
                self._cuda_ctx.push()
            try:
                result = run_slot(ctx, slot, feed, self._arena, self._set_device_memory, outputs)
            finally:
                if self._cuda_ctx is not None:
                    self._cuda_ctx.pop()
        finally:
            self._slots.put((ctx, slot))
        if n is not None:
            result = {k: v[:n] for k, v in result.items()}
        return result

    @staticmethod
    def _set_device_memory(ctx: Any, ptr: int, size: int) -> None:
        if hasattr(ctx, "set_device_memory"):
            ctx.set_device_memory(ptr, size)  # TensorRT >= 10.1 (setDeviceMemoryV2)
        else:
            ctx.device_memory = ptr  # TensorRT 8.5 - 10.0

    def input_specs_impl(self) -> list[TensorSpec]:
        if not self._bindings:
            return list(self._declared[0])
        return [TensorSpec(b.name, b.dtype, (-1, *b.max_shape[1:])) for b in self._bindings if b.is_input]

    def output_specs_impl(self) -> list[TensorSpec]:
        if not self._bindings:
            return list(self._declared[1])
        return [TensorSpec(b.name, b.dtype, (-1, *b.max_shape[1:])) for b in self._bindings if not b.is_input]

    def footprint_impl(self) -> Footprint:
        """Engine size as weights; scratch and I/O once active, else I/O from the declared specs.

        Before activation the scratch size is unknown (it needs the deserialized engine); I/O is
        estimated at ``max_batch`` per stream, once (mapped, the Jetson case).
        """
        weights = self.engine_path.stat().st_size if self.engine_path.exists() else 0
        if self._all_slots:
            io = sum(slot.nbytes for _c, slot in self._all_slots)
        else:
            batch = int(self.options.max_batch or 1)
            io = self.streams * sum(
                batch * int(np.prod([d if d > 0 else 1 for d in spec.shape[1:]], dtype=np.int64)) * spec.dtype.itemsize
                for spec in (*self._declared[0], *self._declared[1])
            )
        return Footprint(weights=weights, workspace=self._scratch, io=io, measured=False,
                         startup=self._startup_bytes())

    def _startup_bytes(self) -> int:
        """CUDA and TensorRT start-up memory, counted by the first TensorRT backend of the process."""
        owner = _STARTUP_OWNER.get("owner")
        if owner is not None and owner != id(self):
            return 0
        version = self._trt_version
        if not version:
            try:
                version = installed_tensorrt_version()
            except TensorRTMissing:
                return 0
        return cuda_startup_bytes(version)


def run_slot(
    ctx: Any,
    slot: IOSlot,
    feed: Mapping[str, np.ndarray],
    arena: ScratchArena | None,
    set_device_memory: Callable[[Any, int, int], None],
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """One inference on one execution context: stage, bind, enqueue, fetch, synchronize.

    The order follows the TensorRT API: input shapes and every tensor address are set before
    ``execute_async_v3``; the scratch block is bound right before the enqueue and returned to
    the arena only after the stream synchronized.
    """
    staged = slot.stage_inputs(feed)
    for name, (shape, _ptr) in staged.items():
        ctx.set_input_shape(name, shape)
    for name, ptr in slot.device.items():
        ctx.set_tensor_address(name, staged[name][1] if name in staged else ptr)
    out_shapes = {b.name: tuple(ctx.get_tensor_shape(b.name)) for b in slot.bindings.values() if not b.is_input}
    grant = arena.acquire() if arena is not None else None
    try:
        if grant is not None and grant[2] > 0:
            set_device_memory(ctx, grant[1], grant[2])
        if not ctx.execute_async_v3(slot.ops.stream_handle(slot.stream)):
            raise DaemonError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        views = slot.fetch_outputs(out_shapes)
        slot.ops.synchronize(slot.stream)
    finally:
        if grant is not None and arena is not None:
            arena.release(grant[0])
    wanted = list(outputs) if outputs else list(views)
    missing = [o for o in wanted if o not in views]
    if missing:
        raise DaemonError(f"unknown output(s) {missing}; the engine has {sorted(views)}")
    # Copy out of the slot's buffers: they are reused by the next request on this context.
    return {name: np.array(views[name], copy=True) for name in wanted}
