"""TensorRT backend: runs a bundle's engine on a Jetson (or any NVIDIA GPU with TensorRT >= 8.5).

Written against the documented TensorRT Python API; TensorRT cannot be installed on the
development machine, so the parts that need it are thin and the rest is plain Python, tested:

* **Engine choice**: the daemon serves engines from the device's engine store, outside the
  signed bundle (:mod:`cuvil_edge.runtime.trt_select`: key, record and sha256 checks, ONNX
  Runtime fallback). :func:`select_engine` and :meth:`TrtBackend.from_bundle` still read a
  manifest ``engines`` list, for bundles that carry engines themselves.
* **One execution context per concurrent stream.** Each context is created with
  ``ExecutionContextAllocationStrategy.USER_MANAGED`` (``create_execution_context_without_device_memory``
  before TensorRT 10) and gets its activation memory from a process-wide :class:`ScratchArena`
  right before each enqueue (``set_device_memory``), so models that do not run at the same
  instant share scratch instead of each holding its own.
* **I/O placement** (:func:`choose_placement`, :class:`IOSlot`): on an integrated GPU
  (``INTEGRATED`` device attribute, Jetson) inputs and outputs live in mapped zero-copy host
  memory (``pagelocked_empty(..., mem_flags=host_alloc_flags.DEVICEMAP)``) whose device alias is
  bound with ``set_tensor_address``: no copies. On a discrete GPU they live in pinned host memory
  with device twins and async copies on the context's stream.
* Execution: ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3(stream)``, stream
  synchronize; pycuda's synchronize and TensorRT's enqueue release the GIL.

Device memory and copies go through a small :class:`DeviceOps` interface (pycuda here:
:class:`PyCudaOps`), which is what lets the tests check placement and copy traffic without a GPU.
"""

from __future__ import annotations

import importlib.metadata
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime.base import Backend, BackendOptions, Footprint, TensorSpec
from cuvil_edge.runtime.buffers import Placement

__all__ = [
    "DeviceOps",
    "IOSlot",
    "PyCudaOps",
    "ScratchArena",
    "TensorBinding",
    "TensorRTMissing",
    "TrtBackend",
    "choose_placement",
    "import_tensorrt",
    "installed_tensorrt_version",
    "local_l4t",
    "pad_batch",
    "run_slot",
    "select_engine",
    "shared_arena",
    "trim_shared_arena",
]

_INSTALL_HINT = "pip install cuvil-edge[jetson] (JetPack also ships it: apt install python3-libnvinfer)"


class TensorRTMissing(CuvilEdgeError):
    """TensorRT (or pycuda) is not importable here; the message says what to install."""


def import_tensorrt() -> Any:
    """``import tensorrt``, or TensorRTMissing naming ``pip install cuvil-edge[jetson]``."""
    try:
        import tensorrt
    except ImportError as exc:
        raise TensorRTMissing(f"TensorRT is not installed here ({exc}); on the device run: {_INSTALL_HINT}") from exc
    return tensorrt


def _import_pycuda() -> Any:
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise TensorRTMissing(f"pycuda is not installed here ({exc}); on the device run: {_INSTALL_HINT}") from exc
    return cuda


def _mm(version: str) -> tuple[int, int]:
    from cuvil_edge.bundle.engine_key import major_minor as _major_minor

    return _major_minor(version)


# ------------------------------------------------------------------------- engine selection


def local_l4t(root: Path = Path("/")) -> str | None:
    """L4T release from ``<root>/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.3``)."""
    try:
        text = (Path(root) / "etc/nv_tegra_release").read_text("utf-8", "replace")
    except OSError:
        return None
    import re

    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def select_engine(
    engines: Sequence[Mapping[str, Any]],
    tensorrt: str,
    l4t: str | None = None,
    sm: str | None = None,
    dla_core: int | None = None,
) -> Mapping[str, Any] | None:
    """The manifest ``engines`` entry built for this device, or None.

    An engine loads only under the TensorRT version that built it (major.minor must match;
    the patch level is tolerated), on the same SM, for the same DLA core. L4T and SM are
    compared when known. Among matches, an exact TensorRT version and L4T win.
    """
    best: tuple[int, Mapping[str, Any]] | None = None
    for entry in engines:
        key = entry.get("key") or {}
        if _mm(str(key.get("tensorrt", "0"))) != _mm(tensorrt):
            continue
        if key.get("dla_core") != dla_core:
            continue
        if sm is not None and str(key.get("sm")) != str(sm):
            continue
        score = (2 if str(key.get("tensorrt")) == tensorrt else 0) + (1 if l4t and str(key.get("l4t")) == l4t else 0)
        if best is None or score > best[0]:
            best = (score, entry)
    return best[1] if best else None


def installed_tensorrt_version() -> str:
    """TensorRT's version here, from package metadata when present (cheap), else from the module.

    JetPack's apt package (``python3-libnvinfer``) may install the module without pip metadata.

    Raises:
        TensorRTMissing: TensorRT is not installed.
    """
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return str(import_tensorrt().__version__)


def choose_placement(integrated: bool, has_gpu: bool = True) -> str:
    """I/O placement for a device: mapped zero-copy on integrated GPUs, pinned + device copies
    on discrete ones, pageable without a GPU (issue #4; see ``runtime/buffers.py``)."""
    if not has_gpu:
        return Placement.PAGEABLE
    return Placement.MAPPED if integrated else Placement.PINNED


# ----------------------------------------------------------------------------- device memory


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
        self.cuda = _import_pycuda()
        self._allocs: dict[int, Any] = {}

    def alloc_host(self, shape: tuple[int, ...], dtype: np.dtype, mapped: bool) -> np.ndarray:
        flags = self.cuda.host_alloc_flags.DEVICEMAP if mapped else 0
        return self.cuda.pagelocked_empty(shape, dtype, mem_flags=flags)

    def device_alias(self, host: np.ndarray) -> int:
        return int(host.base.get_device_pointer())

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
        try:
            base_ptr = int(root.base.get_device_pointer())
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


# ------------------------------------------------------------------------------- I/O buffers


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


# ---------------------------------------------------------------------------------- backend


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

    # ------------------------------------------------------------------ discovery

    @staticmethod
    def available() -> tuple[bool, str]:
        try:
            import_tensorrt()
            _import_pycuda()
        except TensorRTMissing as exc:
            return False, f"TensorRT not installable here: {exc}"
        return True, ""

    @classmethod
    def from_bundle(
        cls, bundle_dir: Path, manifest: Mapping[str, Any], options: BackendOptions | None = None
    ) -> TrtBackend:
        options = options or BackendOptions()
        version = installed_tensorrt_version()
        entry = select_engine(manifest.get("engines") or [], version, local_l4t(), None, options.dla_core)
        if entry is None:
            keys = [e.get("key") for e in manifest.get("engines") or []]
            raise DaemonError(f"bundle {manifest.get('name')}: no engine for TensorRT {version} "
                              f"(DLA core {options.dla_core}); it carries {keys}. Build one for the device from the "
                              "host: cuvil-edge engine build --on DEVICE BUNDLE")
        specs = ([TensorSpec.from_manifest(e) for e in manifest.get("inputs") or []],
                 [TensorSpec.from_manifest(e) for e in manifest.get("outputs") or []])
        return cls(Path(bundle_dir) / str(entry["path"]), options, name=str(manifest.get("name") or "model"),
                   specs=specs)

    # ------------------------------------------------------------------ lifecycle

    def activate_impl(self) -> None:
        trt = self._trt = import_tensorrt()
        if _mm(trt.__version__) < (8, 5):
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
        return Footprint(weights=weights, workspace=self._scratch, io=io, measured=False)


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
