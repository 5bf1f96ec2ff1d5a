"""ONNX Runtime backend: CPU here; CUDA and TensorRT execution providers where installed.

Models that do not run at the same instant share one CPU arena: the first session registers an
environment allocator (``create_and_register_allocator``) and every session opts in with
``session.use_env_allocators`` (ONNX Runtime docs, "Share allocator(s) between sessions").
``InferenceSession.run`` releases the GIL, so worker threads overlap with the event loop.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.errors import DaemonError, ModelError
from cuvil_edge.runtime._manifest import ManifestLike, as_manifest
from cuvil_edge.runtime.base import Backend, BackendOptions, Footprint, TensorSpec, dtype_of
from cuvil_edge.runtime.cpus import usable_cores

__all__ = ["OrtBackend", "rss_bytes"]

_ARENA_LOCK = threading.Lock()
_ARENA_REGISTERED = False

# ONNX Runtime's tensor type strings -> numpy.
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(uint16)": "uint16",
    "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm`` (0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _register_shared_arena(ort: Any) -> bool:
    global _ARENA_REGISTERED
    with _ARENA_LOCK:
        if _ARENA_REGISTERED:
            return True
        try:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                     ort.OrtMemType.DEFAULT)
            # 0 = no arena size limit, -1 = ONNX Runtime's defaults for the other knobs.
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        except (AttributeError, RuntimeError):
            return False
        _ARENA_REGISTERED = True
        return True


def _dims(shape: Sequence[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


class OrtBackend(Backend):
    """Runs an ONNX model with ONNX Runtime.

    Args:
        model_path (Path): the ``.onnx`` file.
        options (BackendOptions | None): runtime options. Defaults to ``BackendOptions()``.
        name (str | None): label for logs. Defaults to the file name.
        providers (list | None): explicit execution providers. Defaults to TensorRT, CUDA, CPU
            as available and allowed by ``options.device``.
        exact_qdq (bool): compute Q/DQ nodes as written (``session.disable_quant_qdq``) instead of
            fusing them into ONNX Runtime's integer kernels. Set for TensorRT-form bundles served
            without TensorRT: their accuracy was certified for exact (int32-accumulating) arithmetic,
            and ONNX Runtime's fused x86 u8s8 kernels saturate on CPUs without AVX-512 VNNI.
    """

    kind = "ort"

    def __init__(
        self,
        model_path: Path,
        options: BackendOptions | None = None,
        name: str | None = None,
        providers: list[Any] | None = None,
        exact_qdq: bool = False,
    ) -> None:
        super().__init__(name or Path(model_path).name)
        self.model_path = Path(model_path)
        self.exact_qdq = exact_qdq
        self.options = options or BackendOptions()
        self._providers = providers
        self._session: Any = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._output_names: list[str] = []
        self._measured: Footprint | None = None

    @staticmethod
    def available() -> tuple[bool, str]:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return False, f"onnxruntime is not installed ({exc}); pip install onnxruntime"
        return True, ""

    @classmethod
    def from_bundle(
        cls, bundle_dir: Path, manifest: ManifestLike, options: BackendOptions | None = None
    ) -> OrtBackend:
        manifest = as_manifest(manifest)
        model = Path(bundle_dir) / manifest.model
        if not model.is_file():
            raise ModelError(f"{model}: the bundle's model file is missing (manifest field 'model')")
        name = f"{manifest.name or model.stem}:{manifest.version or '?'}"
        backend = cls(model, options=options, name=name, exact_qdq=manifest.format_kind == "tensorrt")
        # The manifest's specs until the session has its own: the footprint estimate made before
        # activation needs them, and reading them from the graph imported onnx into the daemon
        # (10.5 MB resident, for a number the manifest already holds).
        try:
            backend._inputs = [TensorSpec.from_manifest(e) for e in manifest.inputs]
            backend._outputs = [TensorSpec.from_manifest(e) for e in manifest.outputs]
        except (KeyError, TypeError, ValueError):
            backend._inputs, backend._outputs = [], []  # read from the graph when asked
        return backend

    def providers(self) -> list[Any]:
        """The execution providers this backend asks for, in priority order."""
        if self._providers is not None:
            return list(self._providers)
        import onnxruntime as ort

        have = set(ort.get_available_providers())
        chosen: list[Any] = []
        if self.options.device in ("auto", "gpu"):
            if "TensorrtExecutionProvider" in have:
                trt_opts: dict[str, Any] = {"trt_fp16_enable": True}
                if self.options.cache_dir is not None:
                    trt_opts.update(trt_engine_cache_enable=True,
                                    trt_engine_cache_path=str(self.options.cache_dir))
                if self.options.dla_core is not None:
                    trt_opts.update(trt_dla_enable=True, trt_dla_core=self.options.dla_core)
                chosen.append(("TensorrtExecutionProvider", trt_opts))
            if "CUDAExecutionProvider" in have:
                chosen.append("CUDAExecutionProvider")
            if self.options.device == "gpu" and not chosen:
                raise DaemonError(f"{self.name}: device 'gpu' asked but ONNX Runtime here has only "
                                  f"{sorted(have)}; install onnxruntime-gpu or use device 'cpu'")
        chosen.append("CPUExecutionProvider")
        return chosen

    def activate_impl(self) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        # Always explicit: left at 0, ONNX Runtime pins its threads, which the daemon's systemd
        # unit refuses (one error line per thread; see cuvil_edge.runtime.cpus).
        so.intra_op_num_threads = int(self.options.intra_op_threads) or usable_cores()
        so.inter_op_num_threads = 1
        if not self.options.extra.get("spin", True):
            # ONNX Runtime's default is to spin: EfficientNet-Lite0 ran at p50 4.2 ms spinning and
            # 5.1 ms sleeping between operators (bench_serving, 1 client). Turn it off where the
            # cores are needed by other work between requests.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.exact_qdq:
            so.add_session_config_entry("session.disable_quant_qdq", "1")
        if self.options.shared_arena and _register_shared_arena(ort):
            so.add_session_config_entry("session.use_env_allocators", "1")
        before = rss_bytes()
        try:
            self._session = ort.InferenceSession(self.model_source(), sess_options=so,
                                                 providers=self.providers())
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ModelError(f"{self.model_path}: ONNX Runtime could not load the model: {exc}") from exc
        after = rss_bytes()
        self._inputs = [TensorSpec(i.name, dtype_of(_ORT_TYPES.get(i.type, "float32")), _dims(i.shape))
                        for i in self._session.get_inputs()]
        self._outputs = [TensorSpec(o.name, dtype_of(_ORT_TYPES.get(o.type, "float32")), _dims(o.shape))
                         for o in self._session.get_outputs()]
        self._output_names = [o.name for o in self._outputs]
        weights = self.model_path.stat().st_size
        self._measured = Footprint(weights=max(weights, after - before), workspace=0,
                                   io=self._io_bytes(), measured=after > 0)

    def model_source(self) -> str | bytes:
        """What the session loads: the model's path (a subclass may hand over the bytes)."""
        return str(self.model_path)

    def deactivate_impl(self) -> None:
        self._session = None

    def infer_impl(
        self, feed: Mapping[str, np.ndarray], outputs: Sequence[str] | None
    ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs else self._output_names
        values = self._session.run(names, feed)
        return dict(zip(names, values, strict=True))

    def run_serially(self) -> bool:
        """One intra-op thread: no pool, so nothing spins between requests (see the base class).

        Measured on the tiny CNN (13 us a run) over gRPC on 2 cores: the pool's second thread,
        spinning after every run, cost 0.6-1.2 ms of CPU per request, more than the whole
        request path, and slowed the event loop it competed with."""
        if self.options.intra_op_threads == 1 or not self.is_active:
            return False
        self.deactivate()
        self.options = dataclasses.replace(self.options, intra_op_threads=1)
        self.activate()
        return True

    def release_scratch(self, feed: Mapping[str, np.ndarray]) -> None:
        """One run with ONNX Runtime's arena shrinkage: the CPU arena frees the chunks the run
        leaves unused, the activations of the largest batch timed at warm-up (EfficientNet-Lite0:
        about 85 MB of a 200 MB process). Serving grows them again only if such batches form."""
        import onnxruntime as ort

        ro = ort.RunOptions()
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._session.run(self._output_names, dict(feed), ro)

    def input_specs_impl(self) -> list[TensorSpec]:
        if not self._inputs:
            self._inputs, self._outputs = self._read_specs()
        return self._inputs

    def output_specs_impl(self) -> list[TensorSpec]:
        if not self._outputs:
            self._inputs, self._outputs = self._read_specs()
        return self._outputs

    @property
    def max_concurrency(self) -> int:
        # InferenceSession.run is thread-safe. On the CPU the intra-op threads already use every
        # core, so a second batch in flight only contends with the first; with a GPU provider two
        # batches overlap copies, pre-processing and compute.
        if self._session is not None:
            gpu = any(p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
                      for p in self._session.get_providers())
            return 2 if gpu else 1
        return 1 if self.options.device == "cpu" else 2

    def footprint_impl(self) -> Footprint:
        if self._measured is not None:
            return self._measured
        weights = self.model_path.stat().st_size if self.model_path.exists() else 0
        # Before activation: weights plus ONNX Runtime's usual arena growth (about the weights
        # again for CNNs once fused) plus I/O at the largest batch.
        return Footprint(weights=weights, workspace=weights, io=self._io_bytes())

    def _io_bytes(self) -> int:
        batch = self.options.max_batch or 1
        total = 0
        try:
            specs = self.input_specs_impl() + self.output_specs_impl()
        except ModelError:
            return 0
        for spec in specs:
            n = 1
            for i, d in enumerate(spec.shape):
                n *= batch if (i == 0 and d < 0) else max(d, 1)
            total += n * spec.dtype.itemsize
        return total

    def _read_specs(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """Read I/O specs from the ONNX graph without creating a session."""
        import onnx

        src = self.model_source()
        try:
            if isinstance(src, bytes):
                model = onnx.load_model_from_string(src)
            else:
                model = onnx.load(src, load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError and friends
            raise ModelError(f"{self.model_path}: not a readable ONNX model: {exc}") from exc
        from onnx import helper

        inits = {i.name for i in model.graph.initializer}

        def spec(v: Any) -> TensorSpec:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            return TensorSpec(v.name, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)), dims)

        ins = [spec(v) for v in model.graph.input if v.name not in inits]
        outs = [spec(v) for v in model.graph.output]
        return ins, outs
