"""The Backend protocol every inference runtime implements (ONNX Runtime, TensorRT).

Modelled on Polygraphy's ``BaseRunner`` (``backend/base/runner.py``): the public methods
``activate``/``infer``/``deactivate`` check state and time the call, then delegate to the ``*_impl``
hooks a backend overrides. A backend is a context manager::

    with OrtBackend.from_bundle(bundle_dir, manifest) as backend:
        outputs = backend.infer({"input": batch})

Writing a backend (``runtime/trt/backend.py`` follows this):

* subclass :class:`Backend`; set the class attribute ``kind`` (``"ort"``, ``"tensorrt"``);
* ``available() -> tuple[bool, str]`` (staticmethod): whether the runtime imports here, and if
  not the reason (shown by the loader and used by tests to skip);
* ``from_bundle(bundle_dir, manifest, options) -> Backend`` (classmethod): pick the artefact
  (``model.onnx``, ``engines/<key>.engine``) from the manifest (a typed ``Manifest``; docs/bundle-format.md) and construct,
  cheaply: nothing heavy happens before ``activate``;
* ``activate_impl()`` loads the session/engine; ``deactivate_impl()`` frees it;
* ``infer_impl(feed, outputs)`` takes C-contiguous numpy arrays keyed by input name, whose first
  dimension is the batch, and returns numpy arrays keyed by output name. It is called from a
  worker thread and must release the GIL while the device works; it may be called from several
  threads at once (``max_concurrency`` says how many are useful);
* ``input_specs_impl()`` / ``output_specs_impl()`` describe the tensors (``-1`` for a dynamic
  dimension, the first one being the batch);
* ``footprint_impl()`` estimates the memory the activated backend holds (weights, workspace).

Optional dependencies (``onnxruntime``, ``tensorrt``, ``pycuda``) are imported inside the methods
that need them, so ``import cuvil_edge.runtime`` works on any machine.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil_edge.errors import DaemonError, ModelError

if TYPE_CHECKING:
    from cuvil_edge.runtime._manifest import ManifestLike

__all__ = [
    "Backend",
    "BackendOptions",
    "Footprint",
    "TensorSpec",
    "datatype_of",
    "dtype_of",
]

# KServe v2 / Triton datatype names <-> numpy dtypes.
_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NAMES: dict[np.dtype, str] = {v: k for k, v in _DATATYPES.items()}
# Manifest / ONNX spellings accepted besides numpy's own.
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bool": "bool"}


def dtype_of(name: str) -> np.dtype:
    """Numpy dtype for a KServe datatype (``"FP32"``) or a numpy/manifest name (``"float32"``).

    Raises:
        ModelError: for a name that is neither.
    """
    if name in _DATATYPES:
        return _DATATYPES[name]
    try:
        dt = np.dtype(_ALIASES.get(name, name))
    except TypeError as exc:
        raise ModelError(f"unknown tensor datatype {name!r}: use one of {sorted(_DATATYPES)}") from exc
    if dt not in _NAMES:
        raise ModelError(f"tensor datatype {name!r} is not supported: use one of {sorted(_DATATYPES)}")
    return dt


def datatype_of(dtype: np.dtype | type | str) -> str:
    """KServe datatype name (``"FP32"``) for a numpy dtype."""
    dt = np.dtype(dtype) if not isinstance(dtype, str) else dtype_of(dtype)
    try:
        return _NAMES[dt]
    except KeyError as exc:
        raise ModelError(f"numpy dtype {dt} has no KServe datatype") from exc


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, numpy dtype and shape (``-1`` for a dynamic dimension).

    Args:
        name (str): the tensor's name in the model.
        dtype (np.dtype): its element type.
        shape (tuple[int, ...]): its shape; the first dimension is the batch when the model batches.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def datatype(self) -> str:
        """The KServe datatype name, e.g. ``"FP32"``."""
        return datatype_of(self.dtype)

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> TensorSpec:
        """Build from a manifest ``inputs``/``outputs`` entry (``{"name", "dtype", "shape"}``)."""
        try:
            shape = tuple(-1 if (d is None or isinstance(d, str) or int(d) < 0) else int(d)
                          for d in entry["shape"])
            return cls(str(entry["name"]), dtype_of(str(entry["dtype"])), shape)
        except KeyError as exc:
            raise ModelError(f"manifest tensor entry {dict(entry)!r} lacks field {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The manifest form: ``{"name", "dtype", "shape"}``."""
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


@dataclass
class BackendOptions:
    """Runtime options shared by every backend; a backend ignores those that do not apply.

    Args:
        device (str): ``"auto"`` (GPU/TensorRT when present, CPU otherwise), ``"cpu"`` or ``"gpu"``.
            Defaults to ``"auto"``.
        intra_op_threads (int): threads one inference may use (ONNX Runtime); 0 means the
            physical cores the process may run on (:func:`cuvil_edge.runtime.cpus.usable_cores`,
            ONNX Runtime's own count, without its thread pinning). Defaults to 0.
        shared_arena (bool): let models share one scratch arena (ONNX Runtime environment
            allocator; TensorRT user-managed context memory). Defaults to True.
        max_batch (int | None): the largest batch the server will send; sizes TensorRT
            profiles and warm-up. Defaults to the manifest's ``max_batch``.
        dla_core (int | None): DLA core for TensorRT, None for the GPU. Defaults to None.
        cache_dir (Path | None): where a backend may cache compiled artefacts. Defaults to None.
        extra (dict): backend-specific settings.
    """

    device: str = "auto"
    intra_op_threads: int = 0
    shared_arena: bool = True
    max_batch: int | None = None
    dla_core: int | None = None
    cache_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Footprint:
    """Memory an activated backend holds, in bytes.

    ``weights`` is the model's parameters, ``workspace`` the runtime's scratch (arena, TensorRT
    activation memory), ``io`` the input/output buffers at the largest batch, ``startup`` what
    the process paid once to start CUDA and TensorRT (counted by the first such backend). ``measured`` is
    True when the figures come from a measurement (RSS or device memory delta) rather than an
    estimate.
    """

    weights: int
    workspace: int
    io: int
    measured: bool = False
    startup: int = 0  # once per process: the CUDA context and TensorRT's libraries (runtime/trt/startup.py)

    @property
    def total(self) -> int:
        """Sum of the parts."""
        return self.weights + self.workspace + self.io + self.startup


class Backend(abc.ABC):
    """Base of every inference backend: activate, infer, deactivate; a context manager.

    Args:
        name (str | None): a label for logs and errors. Defaults to the class's ``kind``.
    """

    kind: str = "base"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.kind
        self.is_active = False
        self.inference_time = 0.0  # seconds taken by the last infer() call
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- discovery

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether this backend's runtime can be used here, and the reason if not."""
        return True, ""

    @classmethod
    @abc.abstractmethod
    def from_bundle(
        cls, bundle_dir: Path, manifest: ManifestLike, options: BackendOptions | None = None
    ) -> Backend:
        """Construct (without activating) from an extracted bundle directory and its manifest.

        ``manifest`` is a :class:`~cuvil_edge.bundle.manifest.Manifest` or its dict form; read it
        through :func:`cuvil_edge.runtime._manifest.as_manifest`.
        """

    # ----------------------------------------------------------------- hooks

    @abc.abstractmethod
    def activate_impl(self) -> None:
        """Load the model (session, engine, contexts)."""

    @abc.abstractmethod
    def deactivate_impl(self) -> None:
        """Free what ``activate_impl`` made."""

    @abc.abstractmethod
    def infer_impl(
        self, feed: Mapping[str, np.ndarray], outputs: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        """Run one batch; see the module docstring for the rules."""

    @abc.abstractmethod
    def input_specs_impl(self) -> list[TensorSpec]:
        """The model's inputs."""

    @abc.abstractmethod
    def output_specs_impl(self) -> list[TensorSpec]:
        """The model's outputs."""

    def footprint_impl(self) -> Footprint:
        """Estimated memory held once active; backends override with better figures."""
        return Footprint(0, 0, 0)

    # ----------------------------------------------------------------- public API

    @property
    def max_concurrency(self) -> int:
        """How many ``infer`` calls may usefully run at once (batches in flight)."""
        return 1

    def activate(self) -> None:
        """Load the model. Raises DaemonError if already active."""
        with self._lock:
            if self.is_active:
                raise DaemonError(f"backend {self.name!r} is already active")
            self.activate_impl()
            self.is_active = True

    def deactivate(self) -> None:
        """Free the model; a second call does nothing."""
        with self._lock:
            if not self.is_active:
                return
            try:
                self.deactivate_impl()
            finally:
                self.is_active = False

    def infer(
        self, feed: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one batch.

        Args:
            feed (Mapping[str, np.ndarray]): input arrays by name, batch first.
            outputs (Sequence[str] | None): outputs to compute. Defaults to all of them.

        Returns:
            dict[str, np.ndarray]: output arrays by name.
        """
        if not self.is_active:
            raise DaemonError(f"backend {self.name!r} must be activated before infer()")
        start = time.perf_counter()
        result = self.infer_impl(feed, outputs)
        self.inference_time = time.perf_counter() - start
        return result

    @property
    def inputs(self) -> list[TensorSpec]:
        """The model's inputs."""
        return self.input_specs_impl()

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs."""
        return self.output_specs_impl()

    def footprint(self) -> Footprint:
        """Memory this backend holds (or will hold) once active."""
        return self.footprint_impl()

    def release_scratch(self, feed: Mapping[str, np.ndarray]) -> None:
        """Give back the scratch memory larger batches grew (after warm-up timed every batch size),
        running ``feed`` (a small input) once to do it. Runtimes without such a pool do nothing."""
        return None

    def run_serially(self) -> bool:
        """Run every inference on the calling thread, without a pool of helper threads; True
        when the backend changed (it was re-activated), False where it has no such pool.

        For a model whose whole run takes microseconds a thread pool cannot help, and its idle
        threads still cost: ONNX Runtime's spin after each run. Called by the daemon after
        warm-up timed a batch-1 run below ``SERIAL_BELOW_US`` (cuvil_edge.daemon.models)."""
        return False

    def __enter__(self) -> Backend:
        self.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    def __repr__(self) -> str:
        state = "active" if self.is_active else "inactive"
        return f"<{type(self).__name__} {self.name!r} {state}>"
