"""Loaded models: one :class:`ModelInstance` per served version, and the :class:`ModelRegistry`.

Loading happens in a worker thread (store lookup, optional signature check, memory admission,
backend activation, warm-up on the bundle's sample with a check against ``sample/expected.npz``).
Only then does the registry swap the new instance in; the old one keeps answering the requests
it already holds and is retired once they are done. A failed load leaves the old instance
serving. So a reload never fails a request.

Warm-up also times the model at each power-of-two batch size and caps dynamic batches below a
size that costs clearly more per sample (``--batch-autotune``, :func:`choose_batch_cap`), and
measures a batch-1 execution: models faster than ``--inline-us`` run on the event loop when
nothing else is queued (the batcher's fast path).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.daemon.batcher import Batcher, Pending
from cuvil_edge.daemon.footprint import trim_heap
from cuvil_edge.daemon.metrics import ModelStats
from cuvil_edge.daemon.pipeline import Pipeline
from cuvil_edge.daemon.store import BundleStore, read_manifest
from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime import Backend, BackendOptions, TensorSpec, load_backend
from cuvil_edge.runtime.buffers import BufferPool
from cuvil_edge.runtime.ort import rss_bytes
from cuvil_edge.runtime.trt_select import EngineChoice, backend_for_choice, choose_engine

if TYPE_CHECKING:
    from cuvil_edge.daemon.config import Config

__all__ = ["BATCH_SLOWER_CUTOFF", "ModelEntry", "ModelInstance", "ModelRegistry", "ModelUnavailable", "UnknownModel",
           "choose_batch_cap", "io_bytes_per_item"]

log = logging.getLogger("cuvil_edge.daemon.models")

# A model whose batch-1 run takes less than this at warm-up runs without an intra-op thread pool
# (Backend.run_serially): at that size the pool's threads only spin. The tiny CNN (13 us) cost
# 0.6-1.2 ms of CPU per request with the pool and 0.3 without; EfficientNet-Lite0 (~15 ms) keeps it.
SERIAL_BELOW_US = 1000.0


# A batch size is given up at warm-up only when it costs this much more per sample than the best
# size does (--batch-autotune, choose_batch_cap).
BATCH_SLOWER_CUTOFF = 1.15


def choose_batch_cap(per_sample: dict[int, float]) -> int:
    """The dynamic batch cap from warm-up's time per sample by batch size: the largest size that
    costs at most :data:`BATCH_SLOWER_CUTOFF` times the best size's time per sample.

    Why biased to the large end: warm-up times the runtime alone, and under load a batch also
    shares one hand-off, one split and one wake-up among its requests, which warm-up never sees.
    EfficientNet-Lite0 on 2 CPU cores costs about the same per image at every size (batch 2 to 8
    3-7% below batch 1 at warm-up), yet at 16 clients a cap of 8 served 113.6 req/s against
    100.8 with batches off (bench_serving, one run). An earlier rule that asked a larger batch to
    beat batch 1 by 10% turned batching off there in one run of two, and the daemon fell to 0.8x
    Triton's throughput at 8 clients; Triton batches up to max_batch_size untuned. What the cut-off
    still catches is a model whose larger batches spill out of the caches, costing clearly more per
    sample (a measured 17-18 ms an image at batch 1 against 22-27 at batch 4 on a loaded machine).
    """
    if not per_sample:
        return 1
    best = min(per_sample.values())
    fits = [n for n, t in per_sample.items() if t <= best * BATCH_SLOWER_CUTOFF]
    return max(fits)


def io_bytes_per_item(manifest: Manifest) -> int:
    """Bytes one sample's inputs and outputs take (free dimensions counted as 1): what the memory
    scheduler multiplies by batches queued and in flight."""
    total = 0
    for entry in [*manifest.inputs, *manifest.outputs]:
        try:
            spec = TensorSpec.from_manifest(entry)
        except CuvilEdgeError:
            continue
        n = 1
        for d in spec.shape[1:]:
            n *= max(d, 1)
        total += n * spec.dtype.itemsize
    return total


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (ONNX Runtime's carry a stack of their own)."""
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else ""


class UnknownModel(DaemonError):
    """The request names a model (or version) that is not being served."""


class ModelUnavailable(UnknownModel):
    """The model is not served now but comes back by itself (unloaded under memory pressure, it
    loads again once the pressure eases): a retry after ``retry_after`` seconds may succeed."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelInstance:
    """One model version being served: backend, pipeline, batcher and counters.

    Args:
        name (str): model name.
        version (str): bundle version.
        bundle_dir (Path): the extracted bundle.
        manifest (Manifest): its typed manifest (kept as ``spec``).
        backend (Backend): the (inactive) backend.
        max_batch_cap (int | None): the daemon's cap on batch size.
        preferred (list[int]): preferred batch sizes.
        max_queue_delay_us (int): batcher delay.
        max_depth (int): batches in flight at most.
        inline_us (float): run a request on the event loop when the batcher is idle and a batch-1
            execution takes less than this (0: never).
        pool (BufferPool | None): reused buffers for concatenated batches. Defaults to none.
        autotune (bool): at warm-up, cap dynamic batches at the size with the lowest time per
            sample. Defaults to True.
        scratch_idle_s (float): seconds without a batch, after one larger than 1, before the
            runtime gives that batch's scratch back (:meth:`release_idle_scratch`; 0: never).
            Defaults to 0.
    """

    def __init__(self, name: str, version: str, bundle_dir: Path, manifest: Manifest,
                 backend: Backend, max_batch_cap: int | None = None, preferred: list[int] | None = None,
                 max_queue_delay_us: int = 0, max_depth: int = 2, inline_us: float = 0.0,
                 pool: BufferPool | None = None, autotune: bool = True,
                 scratch_idle_s: float = 0.0) -> None:
        self.name = name
        self.pool = pool
        self.version = version
        self.bundle_dir = bundle_dir
        self.spec = manifest
        self.backend = backend
        self.stats = ModelStats(name, version)
        self.pipeline: Pipeline | None = None
        self.batcher: Batcher | None = None
        self.inflight = 0
        self.loaded_at = 0.0
        self.last_used = time.monotonic()
        self.footprint_bytes = 0
        self._cap = max_batch_cap
        self._preferred = list(preferred or [])
        self._delay = max_queue_delay_us
        self._depth = max_depth
        self.max_batch = 0
        self.inline_us = inline_us
        self._autotune = autotune
        self.scratch_idle_s = scratch_idle_s
        # The largest batch run since the runtime's scratch was last given back (rows), when it
        # ended, and a batch-1 input to run the hand-back with (set by warm-up).
        self._grown_rows = 0
        self._last_batch_end = 0.0
        self._small_feed: dict[str, np.ndarray] | None = None
        self.batch_limit = 0  # most efficient batch size (0: max_batch), set by warm-up
        self.batch_profile_us: dict[int, float] = {}
        self.single_us: float | None = None  # EWMA of a batch-1 execution, microseconds
        self.input_specs: dict[str, TensorSpec] = {}
        self.output_specs: dict[str, TensorSpec] = {}
        # Bytes of one sample's inputs and outputs, from the manifest once (the memory tick reads it).
        self.io_bytes_per_item = io_bytes_per_item(manifest)
        # Which runtime serves this version and why (/config and cuvil-edge status report it).
        self.engine = EngineChoice()

    # ------------------------------------------------------------------ loading (worker thread)

    def load(self, warmup: bool = True) -> None:
        """Activate the backend, build the pipeline, warm up and check the sample.

        Raises:
            CuvilEdgeError: the model does not load, does not run on its warm-up inputs, or
                answers its sample differently from ``sample/expected.npz``. A failure of the
                runtime itself (ONNX Runtime's own exceptions) is one :class:`DaemonError` naming
                the model and the step, so one model's failure never takes the daemon down.
        """
        step = "loading"
        try:
            self.backend.activate()
        except CuvilEdgeError:
            raise
        except Exception as exc:
            raise DaemonError(f"{self.name} {self.version}: the runtime cannot load the model: "
                              f"{type(exc).__name__}: {_first_line(exc)}") from exc
        try:
            ins, outs = self.backend.inputs, self.backend.outputs
            self.pipeline = Pipeline(self.spec, ins, outs)
            # Requests are concatenated on axis 0. A model batches across requests only when every
            # input has its batch there: an input whose batch axis is elsewhere (a recurrent state
            # [2, batch, 128]), a scalar, or a declared state input runs one request per execution,
            # so two clients' states are never mixed.
            axes = self.spec.batch_axes
            batching = (bool(ins) and all(s.shape and s.shape[0] == -1 and axes.get(s.name, 0) == 0 for s in ins)
                        and not self.spec.state_inputs)
            # No max_batch in the manifest (or 0): the daemon's own default for a batching model.
            mb = self.spec.max_batch if self.spec.declared("max_batch") else 0
            if batching:
                mb = mb or 8
                if self._cap:
                    mb = min(mb, self._cap)
            self.max_batch = mb if batching else 0
            self.input_specs = {s.name: s for s in self.pipeline.request_inputs}
            self.output_specs = {s.name: s for s in self.pipeline.request_outputs}
            if warmup:
                step = "warm-up"
                self._warmup()
            self.footprint_bytes = self.backend.footprint().total
        except BaseException as exc:
            self.backend.deactivate()
            if isinstance(exc, Exception) and not isinstance(exc, CuvilEdgeError):
                raise DaemonError(f"{self.name} {self.version}: {step} failed: {type(exc).__name__}: "
                                  f"{_first_line(exc)}") from exc
            raise
        self.loaded_at = time.time()

    def _warmup(self) -> None:
        """Run the model on real inputs before it serves: the bundle's own sample (checked against
        ``sample/expected.npz``), else the optimization profile's shapes, else, for a model whose
        inputs have no free dimension but the batch, zeros of its shape. Never invented sizes: a
        detector's Resize or a streaming model's Pad refuses a 1x1 image or a 1-sample chunk."""
        sample = self._sample()
        feed = sample if sample is not None else self._profile_feed()
        if feed is None:
            log.info("%s %s: no sample inputs and no profile shapes for its dynamic dimensions; warm-up skipped",
                     self.name, self.version)
            return
        self.backend.infer(feed)
        if sample is not None:
            self._check_expected(sample)
        one = self._rows(feed, 1)
        self._small_feed = one
        self.backend.infer(one)
        t0 = time.perf_counter()
        self.backend.infer(one)
        self.single_us = (time.perf_counter() - t0) * 1e6
        if self.single_us < SERIAL_BELOW_US and self.backend.run_serially():
            self.backend.infer(one)
            t0 = time.perf_counter()
            self.backend.infer(one)
            serial_us = (time.perf_counter() - t0) * 1e6
            log.info("%s %s: a batch-1 run takes %.0f us: runs on the calling thread (%.0f us), "
                     "no intra-op pool", self.name, self.version, self.single_us, serial_us)
            self.single_us = serial_us
        if self.max_batch > 1 and self._autotune:
            self.batch_limit = self._tune_batch(one)
            # Timing batch 8 grew the runtime's arena by its activations: give them back, so the
            # daemon's memory after warm-up is what serving needs (bench_serving reports both).
            self.backend.release_scratch(one)

    def _tune_batch(self, one: dict[str, np.ndarray]) -> int:
        """Time each power-of-two batch size at warm-up on the warm-up input and cap dynamic
        batches by :func:`choose_batch_cap`. Sizes are timed in interleaved rounds (so a burst of
        other load hits all of them) and each size's median round is kept."""
        sizes = sorted({1, self.max_batch} | {2 ** k for k in range(1, 8) if 2 ** k < self.max_batch})
        feeds = {n: self._rows(one, n) for n in sizes}
        for n in sizes:
            self.backend.infer(feeds[n])
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        budget_end = time.perf_counter() + 5.0  # never spend more than ~5 s of load time here
        for _ in range(5):
            for n in sizes:
                t0 = time.perf_counter()
                self.backend.infer(feeds[n])
                samples[n].append((time.perf_counter() - t0) / n)
            if time.perf_counter() > budget_end:
                break
        per_sample = {n: sorted(v)[len(v) // 2] for n, v in samples.items()}
        chosen = choose_batch_cap(per_sample)
        self.batch_profile_us = {n: round(t * 1e6, 1) for n, t in per_sample.items()}
        log.info("%s %s: batch cap %d (us/sample by batch size: %s)", self.name, self.version, chosen,
                 self.batch_profile_us)
        return chosen

    def _rows(self, feed: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """``feed`` with ``n`` samples: its first sample repeated on axis 0 for a batching model;
        unchanged for one that does not batch (its inputs are one request as they are)."""
        if not self.max_batch:
            return feed
        return {k: np.repeat(v[:1], n, axis=0) for k, v in feed.items()}

    def _profile_feed(self) -> dict[str, np.ndarray] | None:
        """Zeros in the shapes the recipe's optimization profiles name (``opt``, batch 1), or the
        model's own shapes when only the batch axis is free; None when a size is unknown."""
        profiles = self.spec.profile_shapes
        axes = self.spec.batch_axes
        feed = {}
        for s in self.backend.inputs:
            shape = list(profiles.get(s.name) or s.shape)
            axis = axes.get(s.name, 0)
            if axis is not None and axis < len(shape):
                shape[axis] = 1
            if len(shape) != len(s.shape) or any(d < 0 for d in shape):
                return None
            feed[s.name] = np.zeros(shape, s.dtype)
        return feed

    def _sample(self) -> dict[str, np.ndarray] | None:
        path = self.bundle_dir / self.spec.sample_member("sample_inputs")
        if not path.is_file():
            return None
        with np.load(path) as npz:
            feed = {s.name: npz[s.name] for s in self.backend.inputs if s.name in npz.files}
        if len(feed) != len(self.backend.inputs):
            return None
        if self.max_batch:
            feed = {k: v[: self.max_batch] for k, v in feed.items()}
        return feed

    def _check_expected(self, sample: dict[str, np.ndarray]) -> None:
        path = self.bundle_dir / self.spec.sample_member("sample_expected")
        if not path.is_file():
            return
        got = self.backend.infer(sample)
        rtol, atol = self.spec.tolerances
        with np.load(path) as npz:
            for name, arr in got.items():
                if name not in npz.files:
                    continue
                exp = npz[name][: arr.shape[0]] if self.max_batch else npz[name]
                if exp.shape != arr.shape or not np.allclose(arr, exp, rtol=rtol, atol=atol):
                    worst = float(np.max(np.abs(arr - exp))) if exp.shape == arr.shape else float("nan")
                    raise DaemonError(
                        f"{self.name} {self.version}: output {name!r} on the bundle's sample differs from "
                        f"{path.name} (max abs error {worst:.4g}, atol {atol}, rtol {rtol}); the bundle "
                        "does not run correctly on this device, the previous version stays")

    # ------------------------------------------------------------------ serving

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the batcher (on the loop, after :meth:`load`)."""
        # Batches in flight are bounded by the daemon's --max-depth and by what the backend can
        # overlap (one on a CPU-only ONNX Runtime, whose intra-op threads use every core).
        depth = max(1, min(self._depth, self.backend.max_concurrency))
        self.batcher = Batcher(f"{self.name}:{self.version}", self.execute, loop, self.max_batch,
                               self._preferred, self._delay, depth)
        self.batcher.set_cap(self.batch_cap())
        self._update_inline(self.single_us)

    def batch_cap(self, pressure_cap: int | None = None) -> int:
        """The dynamic batch cap: the tuned efficient size, lowered further by memory pressure."""
        cap = self.batch_limit or max(1, self.max_batch)
        return cap if pressure_cap is None else max(1, min(cap, pressure_cap))

    def submit(self, p: Pending, at_once: bool = False) -> None:
        """Run or queue a request (loop thread); ``p.deliver`` gets the outcome.

        ``at_once``: the caller accepts ``p.deliver`` being called before this returns
        (:meth:`Batcher.run_now`); otherwise it always runs later, on the loop or a worker."""
        self.inflight += 1
        self.last_used = time.monotonic()
        b = self.batcher
        assert b is not None
        if at_once and b.run_now(p):
            return
        if not b.run_inline(p):
            b.submit(p)

    def execute(self, batch: list[Pending]) -> None:
        """Run one batch (worker thread): prepare, concatenate, infer, post-process, split, encode."""
        t0 = time.perf_counter_ns()
        pipe = self.pipeline
        assert pipe is not None
        ready: list[tuple[Pending, dict[str, np.ndarray]]] = []
        geometry: dict[int, np.ndarray] = {}  # request image -> model input placement, by id(p)
        for p in batch:
            if p.cancelled:
                continue
            try:
                geo = pipe.geometry(p.inputs)
                if geo is not None:
                    geometry[id(p)] = geo
                ready.append((p, pipe.prepare(p.inputs)))
            except CuvilEdgeError as exc:
                p.error = (400, str(exc))
            except Exception as exc:
                p.error = (400, f"pre-processing failed: {type(exc).__name__}: {exc}")
        if not ready:
            return
        wanted: set[str] | None = set()
        for p, _ in ready:
            if p.outputs is None:
                wanted = None
                break
            wanted.update(p.outputs)  # type: ignore[union-attr]
        borrowed: list[np.ndarray] = []
        if len(ready) == 1:
            feed = ready[0][1]
        else:
            feed = {}
            for name in ready[0][1]:
                parts = [f[name] for _, f in ready]
                shape = (sum(a.shape[0] for a in parts), *parts[0].shape[1:])
                if self.pool is not None:
                    buf = self.pool.acquire(shape, parts[0].dtype)
                    borrowed.append(buf)
                    feed[name] = np.concatenate(parts, out=buf)
                else:
                    feed[name] = np.concatenate(parts)
        size = next(iter(feed.values())).shape[0] if self.max_batch else 1
        t1 = time.perf_counter_ns()
        try:
            out = self.backend.infer(feed, pipe.needs_model_output(wanted))
        except Exception as exc:
            msg = f"inference failed for model '{self.name}' version {self.version}: {exc}"
            for p, _ in ready:
                p.error = (500, msg)
            return
        finally:
            # The runtime has read the inputs (outputs are its own arrays): buffers go back.
            for buf in borrowed:
                self.pool.release(buf)  # type: ignore[union-attr]
        t2 = time.perf_counter_ns()
        try:
            out = pipe.postprocess(out, wanted)
        except Exception as exc:
            for p, _ in ready:
                p.error = (500, f"post-processing failed: {exc}")
            return
        offset = 0
        for p, _ in ready:
            n = p.n
            p.result = {k: v[offset:offset + n] for k, v in out.items()} if len(ready) > 1 else out
            offset += n
            if id(p) in geometry:  # boxes in the client's image, not the letterboxed model input
                p.result = pipe.to_image_space(p.result, geometry[id(p)])
            if p.encode is not None:
                # An encoder returns the answer, or sets p.error for a client's mistake it finds
                # (a shared-memory region too small for an output) and returns None.
                try:
                    p.body = p.encode(p)
                except Exception as exc:
                    p.error = (500, f"encoding the answer failed: {exc}")
            p.result = None
        t3 = time.perf_counter_ns()
        if len(ready) == 1 and size <= 1:
            self._update_inline((t3 - t0) / 1000)
        if size > 1:
            self._grown_rows = max(self._grown_rows, size)
        self._last_batch_end = time.monotonic()
        self.stats.record_batch(size, (p.queue_ns for p, _ in ready), t1 - t0, t2 - t1, t3 - t2, len(ready))

    def claim_idle_scratch(self, now: float) -> int:
        """The largest batch (rows) of a burst whose scratch is due back, or 0 (event loop).

        Due when batches larger than 1 ran, none has for ``scratch_idle_s`` and none is queued or
        running: the runtime's scratch (ONNX Runtime's arena) still holds their activations.
        Claiming resets the count, so one burst is handed back once (:meth:`release_idle_scratch`).

        EfficientNet-Lite0 on the CPU, batch 8 under 16 clients: the arena kept about 170 MB after
        the burst, more than the model and the daemon together (bench_serving, memory section)."""
        b = self.batcher
        if self.scratch_idle_s <= 0 or self._grown_rows <= 1 or self._small_feed is None:
            return 0
        if b is not None and (b.active or b.queued):
            return 0
        if now - self._last_batch_end < self.scratch_idle_s:
            return 0
        rows, self._grown_rows = self._grown_rows, 0
        return rows

    def release_idle_scratch(self, rows: int) -> int:
        """Give back the scratch a burst of batches of up to ``rows`` grew (worker thread); returns
        the bytes the process's resident set shrank by.

        One batch-1 run on the warm-up input with the runtime's arena shrinkage on (about a batch-1
        run's time), then the C heap is trimmed. The next burst grows the scratch again: its first
        batch pays the allocation. A version retired meanwhile is left alone."""
        if self._small_feed is None or not self.backend.is_active:
            return 0
        before = rss_bytes()
        try:
            self.backend.release_scratch(self._small_feed)
        except Exception as exc:  # the version was retired between the check and the run
            log.warning("%s %s: giving back the scratch of batch-%d runs failed: %s",
                        self.name, self.version, rows, _first_line(exc))
            return 0
        trim_heap()
        freed = max(0, before - rss_bytes())
        log.debug("%s %s: idle after batches of up to %d rows: %.1f MB of runtime scratch given back",
                  self.name, self.version, rows, freed / 1e6)
        return freed

    def _update_inline(self, us: float | None) -> None:
        if us is None:
            return
        ewma = self.single_us = us if self.single_us is None else 0.8 * self.single_us + 0.2 * us
        if self.batcher is not None:
            # A queue delay asks for fuller batches: never bypass the queue then.
            self.batcher.inline_ok = self.inline_us > 0 and ewma < self.inline_us and self._delay == 0

    def close(self) -> None:
        """Stop the batcher and free the backend (worker thread)."""
        if self.batcher is not None:
            self.batcher.stop()
        self.backend.deactivate()


@dataclass
class ModelEntry:
    """A model name's serving state (repository index entry)."""

    name: str
    instance: ModelInstance | None = None
    state: str = "UNAVAILABLE"
    reason: str = ""
    retry_after: int | None = None  # seconds: the model comes back by itself (unloaded under pressure)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelRegistry:
    """The models being served, with load/unload/swap.

    Args:
        store (BundleStore): where bundles come from.
        options (BackendOptions): backend options.
        config (Config): the daemon's settings (batching, warm-up, public key, engine choice).
        admit (Callable | None): ``admit(name, version, bundle_dir, manifest, estimate_bytes)``
            raising DaemonError when the model does not fit (memory co-scheduler); None to skip.
        release (Callable | None): ``release(name, version)`` when an instance is retired.
        measured (Callable | None): ``measured(name, version, bytes)`` after a load.
        pool (BufferPool | None): where batch buffers come from. Defaults to plain allocations.
    """

    def __init__(self, store: BundleStore, options: BackendOptions, config: Config,
                 admit: Callable[..., Any] | None = None,
                 release: Callable[[str, str], Any] | None = None,
                 measured: Callable[[str, str, int], Any] | None = None,
                 pool: BufferPool | None = None) -> None:
        self.store = store
        self.pool = pool
        self.options = options
        self.config = config
        self.admit = admit
        self.release = release
        self.measured = measured
        self.entries: dict[str, ModelEntry] = {}
        self._retiring: set[asyncio.Task[None]] = set()  # hard references (uvicorn lifespan)
        self.retired_instances: list[ModelInstance] = []

    # ------------------------------------------------------------------ lookups (loop)

    def get(self, name: str, version: str | None = None) -> ModelInstance:
        """The instance serving ``name`` (and ``version`` if given); raises UnknownModel."""
        entry = self.entries.get(name)
        inst = entry.instance if entry is not None else None
        if inst is None:
            if entry is not None and entry.retry_after is not None:
                raise ModelUnavailable(f"model '{name}' is not available now ({entry.reason}); retry in "
                                       f"{entry.retry_after} s", entry.retry_after)
            if entry is not None and entry.reason:
                raise UnknownModel(f"Request for unknown model: '{name}' has no available versions"
                                   f" ({entry.reason})")
            raise UnknownModel(f"Request for unknown model: '{name}' is not found")
        if version not in (None, "", inst.version):
            raise UnknownModel(f"Request for unknown model: '{name}' version {version} is not found "
                               f"(serving version {inst.version})")
        return inst

    def instances(self) -> list[ModelInstance]:
        """Every instance currently serving."""
        return [e.instance for e in self.entries.values() if e.instance is not None]

    def index(self) -> list[dict[str, Any]]:
        """Repository index: every model in the store and every loaded one."""
        names = set(self.store.names()) | set(self.entries)
        out = []
        for name in sorted(names):
            e = self.entries.get(name)
            if e is not None and e.instance is not None:
                out.append({"name": name, "version": e.instance.version, "state": e.state, "reason": e.reason})
            else:
                try:
                    version = self.store.current(name) or ""
                except OSError:
                    version = ""
                item = {"name": name, "version": version, "state": e.state if e else "UNAVAILABLE",
                        "reason": (e.reason if e else "not loaded")}
                out.append(item)
        return out

    # ------------------------------------------------------------------ load / unload (loop)

    async def load(self, name: str, version: str | None = None) -> ModelInstance:
        """Load ``name`` (store's current version unless ``version``) and swap it in.

        Raises:
            CuvilEdgeError: the load failed; whatever served before still serves.
        """
        loop = asyncio.get_running_loop()
        entry = self.entries.get(name)
        if entry is None:
            # A name that is not in the store leaves no trace: no index entry, no log traceback.
            if not self.store.versions(name):
                raise UnknownModel(f"model '{name[:128]}' is not in the store")
            entry = self.entries[name] = ModelEntry(name)
        async with entry.lock:
            previous_state = entry.state
            if entry.instance is None:
                entry.state = "LOADING"
            try:
                inst = await loop.run_in_executor(None, self._build, name, version)
            except BaseException as exc:
                failure = exc
                if isinstance(exc, Exception) and not isinstance(exc, CuvilEdgeError):
                    # Whatever a bundle's files or the runtime raise, the caller gets one error
                    # naming the model; the daemon and the other models go on.
                    failure = DaemonError(f"{name}: load failed: {type(exc).__name__}: {_first_line(exc)}")
                    log.debug("loading model %s failed", name, exc_info=exc)
                if entry.instance is None:
                    entry.state = "UNAVAILABLE"
                    entry.reason = f"load failed: {failure}"
                    entry.retry_after = None
                else:
                    entry.state = previous_state
                log.error("loading model %s failed: %s", name, failure)
                if failure is not exc:
                    raise failure from exc
                raise
            inst.start(loop)
            old = entry.instance
            entry.instance = inst
            entry.state = "READY"
            entry.reason = ""
            entry.retry_after = None
            log.info("model %s version %s ready (%s backend, max batch %d, %.1f MiB)%s", name, inst.version,
                     inst.engine.backend, inst.max_batch, inst.footprint_bytes / 1048576,
                     f"; {inst.engine.reason}" if inst.engine.reason else "")
            if old is not None:
                self._retire(old)
            return inst

    async def unload(self, name: str, reason: str = "unloaded", retry_after: int | None = None) -> None:
        """Stop serving ``name``; requests it already holds still complete.

        Args:
            name (str): the model.
            reason (str): what the index and refused requests say. Defaults to "unloaded".
            retry_after (int | None): seconds after which it is expected back (unloaded under
                memory pressure: requests get 503 with Retry-After); None for an unload that lasts.

        Raises:
            UnknownModel: the model is not loaded.
        """
        entry = self.entries.get(name)
        if entry is None or entry.instance is None:
            raise UnknownModel(f"failed to unload '{name}': the model is not loaded")
        async with entry.lock:
            old = entry.instance
            entry.instance = None
            entry.state = "UNAVAILABLE"
            entry.reason = reason
            entry.retry_after = retry_after
            if old is not None:
                self._retire(old)
                log.info("model %s version %s unloaded", name, old.version)

    def _build(self, name: str, version: str | None) -> ModelInstance:
        """Worker thread: everything up to a warmed, checked instance."""
        bundle_dir = self.store.path(name, version)
        if self.config.pub is not None:
            from cuvil_edge.bundle import verify_directory

            verify_directory(bundle_dir, self.config.pub)
        manifest = read_manifest(bundle_dir)
        if manifest.name != name:
            raise DaemonError(f"{bundle_dir}/manifest.json names model {manifest.name!r}, "
                              f"but it is stored under {name!r}; reinstall the bundle")
        ver = manifest.version
        choice = self._choose_engine(bundle_dir, manifest)
        try:
            backend = self._backend(choice, bundle_dir, manifest)
            estimate = backend.footprint().total
        except CuvilEdgeError as exc:
            if choice.backend == "onnxruntime":
                raise
            # A plan whose record matches but whose bytes are no engine (rewritten together).
            log.warning("%s %s: engine %s cannot be opened (%s); serving with ONNX Runtime", name, ver,
                        choice.engine_key, exc)
            choice = choice.fall_back(f"engine failed to load: {exc}", refused=True)
            backend = self._backend(choice, bundle_dir, manifest)
            estimate = backend.footprint().total
        inst = self._instance(name, ver, bundle_dir, manifest, backend)
        inst.engine = choice
        if self.admit is not None:
            self.admit(name, ver, bundle_dir, manifest, estimate)
        try:
            try:
                inst.load(warmup=self.config.warmup)
            except CuvilEdgeError as exc:
                if choice.backend == "onnxruntime":
                    raise
                # An engine that deserializes badly or fails the bundle's sample never keeps the
                # bundle from serving: the same version goes on with ONNX Runtime, saying why.
                log.warning("%s %s: engine %s failed to load (%s); serving with ONNX Runtime", name, ver,
                            choice.engine_key, exc)
                choice = choice.fall_back(f"engine failed to load: {exc}", refused=True)
                inst = self._instance(name, ver, bundle_dir, manifest, self._backend(choice, bundle_dir, manifest))
                inst.engine = choice
                inst.load(warmup=self.config.warmup)
        except BaseException:
            if self.release is not None:
                self.release(name, ver)
            raise
        if self.measured is not None:
            self.measured(name, ver, inst.footprint_bytes)
        return inst

    def _choose_engine(self, bundle_dir: Path, manifest: Manifest) -> EngineChoice:
        """This device's engine for the bundle, or ONNX Runtime with the reason."""
        cfg = self.config
        try:
            return choose_engine(Path(self.store.layout.engines_dir), bundle_dir, manifest,
                                 root=cfg.root or "/", dla_core=cfg.dla_core,
                                 allow_standin=cfg.engine_standin, device=cfg.device)
        except CuvilEdgeError as exc:
            return EngineChoice(precision=manifest.precision).fall_back(f"engine lookup failed: {exc}")

    def engine_changed(self, inst: ModelInstance) -> bool:
        """Whether this device's engine for a served version differs from the one it serves
        (built, replaced or removed since it loaded): SIGHUP then reloads the same version."""
        now = self._choose_engine(inst.bundle_dir, inst.spec)
        was = inst.engine
        return (now.backend, now.plan_sha256, now.refused) != (was.backend, was.plan_sha256, was.refused)

    def _backend(self, choice: EngineChoice, bundle_dir: Path, manifest: Manifest) -> Backend:
        if choice.backend == "onnxruntime":
            return load_backend(bundle_dir, manifest, self.options, kind="ort")
        return backend_for_choice(choice, manifest, self.options)

    def _instance(self, name: str, ver: str, bundle_dir: Path, manifest: Manifest,
                  backend: Backend) -> ModelInstance:
        return ModelInstance(name, ver, bundle_dir, manifest, backend, self.config.max_batch,
                             self.config.preferred_batch, self.config.max_queue_delay_us,
                             max(1, self.config.max_depth), float(self.config.inline_us), self.pool,
                             self.config.batch_autotune, float(self.config.scratch_idle_s))

    def _retire(self, inst: ModelInstance) -> None:
        task = asyncio.ensure_future(self._retire_when_idle(inst))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire_when_idle(self, inst: ModelInstance) -> None:
        while inst.inflight > 0:
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, inst.close)
        if self.release is not None:
            try:
                self.release(inst.name, inst.version)
            except Exception:
                log.exception("memory release for %s failed", inst.name)
        self.retired_instances.append(inst)
        del self.retired_instances[:-8]

    async def close_all(self) -> None:
        """Retire every instance and wait for it (shutdown)."""
        for entry in self.entries.values():
            if entry.instance is not None:
                self._retire(entry.instance)
                entry.instance = None
                entry.state = "UNAVAILABLE"
                entry.reason = "server shutting down"
        if self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)
