"""A simulated inference pipeline on a :class:`SimulatedBoard`, to exercise the schedulers.

This is a *model* for tests and ``bench/bench_prefetch.py``; its figures are assumptions stated in
:class:`Workload`, not measurements. It is a discrete-event simulation of what ``cuvil-edged`` does
with a video-style stream:

1. Frames arrive from ``streams`` cameras at ``fps`` each (unsynchronized, with jitter) into a
   bounded capture ring (a leaky queue, as GStreamer's ``leaky=downstream``): when it is full the
   oldest frame is dropped.
2. The batcher forms a batch (up to ``max_batch`` frames, or what waited ``max_queue_delay_ms``)
   only while fewer than ``depth`` batches are in flight: *depth* is the prefetch depth.
3. Pre-processing runs on ``cpu_workers`` cores (log-normal time per frame): with
   ``pre_parallel`` false (the default) one batch at a time is split over all cores; with it true
   each batch is one task on a pool of ``cpu_workers`` threads, so up to ``cpu_workers`` batches
   are prepared at once and only a deep enough pipeline keeps every worker busy (a daemon whose
   decode and resize run per request on a thread pool). Then the batch waits for the GPU, which runs batches one at a time in ``t0 + t1 * batch`` milliseconds divided by the
   board's current speed factor (GPU share left by other processes × clock scale under throttling
   ÷ EMC contention slowdown).
4. Every in-flight frame holds ``bytes_per_frame`` (decoded frame + model input + output); the
   model and runtime hold ``resident_bytes``. If the board's RAM would overflow, the kernel's OOM
   killer ends the daemon: its in-flight frames are lost and it restarts after ``restart_s``
   (systemd ``Restart=on-failure``), reloading the model.

Every ``telemetry_interval_s`` the pipeline reports its load to the board
(:meth:`SimulatedBoard.report_load`), takes a sample and, in adaptive mode, feeds it to a
:class:`~cuvil_edge.daemon.scheduler.MemoryScheduler` and a
:class:`~cuvil_edge.daemon.scheduler.PrefetchController`, exactly as the daemon wires them. It
knows them only by the protocols of :mod:`cuvil_edge.telemetry.control` (telemetry sits below the
daemon and does not import it).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil_edge.telemetry.control import DepthControl, DepthInputs, MemoryControl
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.sim import SimulatedBoard

__all__ = ["PipelineResult", "PipelineSim", "Workload"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class Workload:
    """The simulated stream and model (assumptions, not measurements).

    Defaults: two unsynchronized 1080p30 cameras into a 960×960 FP16 detector on an Orin Nano.
    ``bytes_per_frame`` = decoded NV12 frame (1920·1080·1.5 = 3.1 MB) + FP16 input
    (960·960·3·2 = 5.5 MB) + outputs ≈ 8.8 MB. GPU time ``4 ms + 13 ms/frame`` is an assumed
    figure in the range of published TensorRT FP16 detector timings on Orin Nano, chosen so that
    the GPU, not the CPU, is the bottleneck near 60 fps. Pre-processing 6 ms/frame/core
    (resize + normalize on Cortex-A78AE, assumed) with coefficient of variation ``pre_cv``.
    """

    streams: int = 2
    fps: float = 30.0
    arrival_jitter: float = 0.3  # fraction of the frame period
    ring_frames: int = 8  # capture ring per stream
    max_batch: int = 8
    max_queue_delay_ms: float = 10.0
    cpu_workers: int = 2
    pre_ms: float = 6.0
    pre_cv: float = 0.6
    gpu_t0_ms: float = 4.0
    gpu_t1_ms: float = 13.0
    gpu_cv: float = 0.15
    bytes_per_frame: int = int(8.8 * MiB)
    dram_bytes_per_frame: int = 400 * MiB  # DRAM traffic per inference (activations, weights)
    resident_bytes: int = 300 * MiB
    restart_s: float = 5.0
    latency_target_ms: float = 400.0
    pre_parallel: bool = False  # each batch one task on a pool of cpu_workers threads
    queued_frame_bytes: int = int(3.1 * MiB)  # a captured frame waiting in the ring (decoded NV12 1080p)


@dataclass
class PipelineResult:
    """What one run measured."""

    mode: str
    duration_s: float
    arrived: int = 0
    completed: int = 0
    dropped: int = 0
    rejected: int = 0
    lost_to_oom: int = 0
    oom_events: int = 0
    throughput_fps: float = 0.0
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    p99_ms: float = math.nan
    peak_daemon_mb: float = 0.0
    peak_inflight_mb: float = 0.0
    peak_board_used_mb: float = 0.0
    mean_depth: float = 0.0
    depth_changes: int = 0
    direction_changes: int = 0
    pressure_steps: dict[str, int] = field(default_factory=dict)
    budget_overruns: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)
    oom_times: list[float] = field(default_factory=list)
    completions: list[tuple[float, float]] = field(default_factory=list)  # (time s, latency ms)

    def window(self, start: float, end: float) -> dict[str, float]:
        """Throughput and latency of the frames completed in ``[start, end)``."""
        lat = [ms for t, ms in self.completions if start <= t < end]
        peaks = [x["peak_daemon_mb"] for x in self.trace if start < x["t"] <= end and "peak_daemon_mb" in x]
        return {"throughput_fps": len(lat) / (end - start) if end > start else math.nan,
                "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
                "peak_daemon_mb": max(peaks) if peaks else math.nan,
                "oom_events": sum(1 for t in self.oom_times if start <= t < end)}

    def to_dict(self, with_trace: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d.pop("completions")
        if not with_trace:
            d.pop("trace")
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _lognormal(rng: random.Random, mean: float, cv: float) -> float:
    if cv <= 0:
        return mean
    sigma2 = math.log(1 + cv * cv)
    return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(math.ceil(q / 100.0 * len(s))) - 1))
    return s[k]


class PipelineSim:
    """Runs a :class:`Workload` on a board at a fixed depth, or adaptively.

    Args:
        board (SimulatedBoard): the board (scenarios already scheduled on it).
        workload (Workload | None): the stream. Defaults to ``Workload()``.
        depth (int | None): a fixed prefetch depth; None means adaptive (needs ``controller``).
        controller (DepthControl | None): adaptive depth controller (the daemon's
            ``PrefetchController``).
        scheduler (MemoryControl | None): memory scheduler: admission, ladder, caps (the daemon's
            ``MemoryScheduler``).
        telemetry_interval_s (float): sampling period. Defaults to 0.5.
        seed (int): random seed. Defaults to 0.
    """

    def __init__(
        self,
        board: SimulatedBoard,
        workload: Workload | None = None,
        *,
        depth: int | None = None,
        controller: DepthControl | None = None,
        scheduler: MemoryControl | None = None,
        telemetry_interval_s: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.board = board
        self.w = workload or Workload()
        self.fixed_depth = depth
        self.controller = controller
        self.scheduler = scheduler
        self.dt = telemetry_interval_s
        self.rng = random.Random(seed)
        if depth is not None:
            self.depth = depth
        elif controller is not None:
            self.depth = controller.depth
        else:
            raise ValueError("give a fixed depth or a controller")

    # ------------------------------------------------------------------ run

    def run(self, duration_s: float) -> PipelineResult:
        """Simulate ``duration_s`` seconds of the stream; the result holds figures and a trace per tick."""
        return _SimRun(self, duration_s).run()


class _SimRun:
    """One run of a :class:`PipelineSim`: the event queue, the pipeline's state, one handler per event.

    Events are ``arrive`` (a frame of a stream), ``form`` (the batcher's queue delay ran out),
    ``pre_done`` (a batch is pre-processed), ``gpu_done`` (a batch executed) and ``tick`` (a
    telemetry sample: the board advances, the scheduler and the controller decide). An OOM kill bumps
    ``epoch``; events of an older epoch are dropped.
    """

    def __init__(self, sim: PipelineSim, duration_s: float) -> None:
        self.sim, self.w, self.board, self.rng = sim, sim.w, sim.board, sim.rng
        self.scheduler, self.controller = sim.scheduler, sim.controller
        self.duration_s = duration_s
        mode = f"fixed-{sim.fixed_depth}" if sim.fixed_depth is not None else "adaptive"
        self.res = PipelineResult(mode=mode, duration_s=duration_s)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        w = self.w
        self.period = 1.0 / w.fps
        for s in range(w.streams):
            self.push(self.rng.uniform(0, self.period), "arrive", s)
        self.push(sim.dt, "tick")
        self.rings: list[deque[float]] = [deque() for _ in range(w.streams)]
        self.in_flight = 0  # batches
        self.inflight_frames = 0
        self.cpu_free_at = 0.0
        self.workers_free_at = [0.0] * max(1, w.cpu_workers)
        self.pre_window: list[float] = []  # processing time of each batch formed (not its wait for a worker)
        self.peak_tick_bytes = 0  # daemon memory peak since the last tick, tracked at every change
        self.gpu_queue: deque[tuple[list[float], float]] = deque()  # (arrivals, ready_time)
        self.gpu_busy_accum = 0.0
        self.gpu_running = False
        self.down_until = -1.0
        self.epoch = 0  # bumped by an OOM kill; stale events are ignored
        self.latencies: list[float] = []
        self.waits_window: list[float] = []
        self.pwaits_window: list[float] = []
        self.exec_window: list[float] = []
        self.depth_sum = 0.0
        self.depth_n = 0
        self.completed_window = 0
        self.blocked_accum = 0.0
        self.resident = w.resident_bytes
        if self.scheduler is not None:
            self.scheduler.admit("detector", self.resident)
            self.scheduler.measure("detector", self.resident)

    def push(self, t: float, kind: str, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    # ------------------------------------------------------------------ the loop

    def run(self) -> PipelineResult:
        handlers = {"arrive": self.on_arrive, "form": self.on_form, "pre_done": self.on_pre_done,
                    "gpu_done": self.on_gpu_done, "tick": self.on_tick}
        last_t = 0.0
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if now > self.duration_s:
                break
            # Time the batcher had frames but no free slot: depth was the limit.
            if now >= self.down_until and self.in_flight >= self.sim.depth and self.queued() > 0:
                self.blocked_accum += now - last_t
            last_t = now
            handlers[kind](now, payload)
        return self.finish()

    def finish(self) -> PipelineResult:
        res, sim = self.res, self.sim
        res.throughput_fps = res.completed / self.duration_s
        res.p50_ms = _pct(self.latencies, 50)
        res.p95_ms = _pct(self.latencies, 95)
        res.p99_ms = _pct(self.latencies, 99)
        res.mean_depth = self.depth_sum / self.depth_n if self.depth_n else float(sim.depth)
        if self.controller is not None:
            res.depth_changes = self.controller.changes
            res.direction_changes = self.controller.direction_changes
        if self.scheduler is not None:
            res.pressure_steps = dict(self.scheduler.steps_total)
        return res

    # ------------------------------------------------------------------ the pipeline's state

    def queued(self) -> int:
        return sum(len(r) for r in self.rings)

    def oldest(self) -> float | None:
        heads = [r[0] for r in self.rings if r]
        return min(heads) if heads else None

    def daemon_bytes(self, now: float) -> int:
        return (self.resident if now >= self.down_until else 0) + self.inflight_frames * self.w.bytes_per_frame

    def report(self, now: float) -> None:
        w = self.w
        self.peak_tick_bytes = max(self.peak_tick_bytes, self.daemon_bytes(now))
        self.board.report_load(
            inflight_bytes=self.inflight_frames * w.bytes_per_frame + self.queued() * w.queued_frame_bytes,
            resident_bytes=self.resident if now >= self.down_until else 0)

    def oom_check(self, now: float) -> bool:
        """Kill the daemon if the board ran out of RAM: everything queued and in flight is lost."""
        self.report(now)
        if self.board.ram_used_mb <= self.board.total_mb:
            return False
        res = self.res
        res.oom_events += 1
        res.oom_times.append(round(now, 3))
        res.lost_to_oom += self.inflight_frames + self.queued()
        for r in self.rings:
            r.clear()
        self.gpu_queue.clear()
        if self.scheduler is not None:
            for _ in range(self.in_flight):
                self.scheduler.end_use("detector")
        self.in_flight = self.inflight_frames = 0
        self.gpu_running = False
        self.down_until = now + self.w.restart_s
        self.epoch += 1
        self.report(now)
        return True

    def try_form(self, now: float) -> None:
        """Form batches while a prefetch slot is free (or wait for the queue delay to fill one)."""
        w = self.w
        if now < self.down_until:
            return
        while self.in_flight < self.sim.depth and self.queued() > 0:
            old = self.oldest()
            batch_cap = (self.scheduler.batch_cap(w.max_batch, w.bytes_per_frame) if self.scheduler is not None
                         else w.max_batch)
            if self.queued() < batch_cap and old is not None and (now - old) * 1000 < w.max_queue_delay_ms:
                self.push(old + w.max_queue_delay_ms / 1000 + 1e-9, "form")
                return
            frames: list[float] = []
            while len(frames) < batch_cap and self.queued() > 0:
                i = min((k for k in range(len(self.rings)) if self.rings[k]), key=lambda k: self.rings[k][0])
                frames.append(self.rings[i].popleft())
            self.in_flight += 1
            self.inflight_frames += len(frames)
            if self.scheduler is not None:
                self.scheduler.begin_use("detector")
            if self.oom_check(now):
                return
            self.push(self.preprocess(now, frames), "pre_done", (self.epoch, frames))

    def preprocess(self, now: float, frames: list[float]) -> float:
        """When the batch's pre-processing ends: on the least busy worker, or spread over all."""
        w = self.w
        pre = sum(_lognormal(self.rng, w.pre_ms, w.pre_cv) for _ in frames) / 1000
        if w.pre_parallel:
            k = min(range(len(self.workers_free_at)), key=self.workers_free_at.__getitem__)
            start = max(now, self.workers_free_at[k])
            self.workers_free_at[k] = start + pre
            done = start + pre
        else:
            pre /= w.cpu_workers
            start = max(now, self.cpu_free_at)
            self.cpu_free_at = start + pre
            done = self.cpu_free_at
        self.pre_window.append(pre * 1000)
        return done

    def start_gpu(self, now: float) -> None:
        if self.gpu_running or not self.gpu_queue:
            return
        w = self.w
        frames, ready = self.gpu_queue.popleft()
        # Queue delay as Triton counts it: from the request's arrival to the start of its execution;
        # prefetch wait: how long the prepared batch waited for the device.
        self.waits_window.extend((now - a) * 1000 for a in frames)
        self.pwaits_window.append((now - ready) * 1000)
        speed = max(0.05, self.board.speed_factor)
        t = _lognormal(self.rng, (w.gpu_t0_ms + w.gpu_t1_ms * len(frames)) / 1000, w.gpu_cv) / speed
        self.gpu_running = True
        self.push(now + t, "gpu_done", (self.epoch, frames, t))

    # ------------------------------------------------------------------ events

    def on_arrive(self, now: float, stream: int) -> None:
        w, res = self.w, self.res
        self.push(now + self.period * (1 + self.rng.uniform(-w.arrival_jitter, w.arrival_jitter)), "arrive", stream)
        res.arrived += 1
        if now < self.down_until:
            res.dropped += 1
            return
        if self.scheduler is not None and self.scheduler.should_reject():
            res.rejected += 1
            return
        ring = self.rings[stream]
        if len(ring) >= w.ring_frames:
            ring.popleft()
            res.dropped += 1
        ring.append(now)
        self.try_form(now)

    def on_form(self, now: float, _payload: Any) -> None:
        self.try_form(now)

    def on_pre_done(self, now: float, payload: tuple[int, list[float]]) -> None:
        ep, frames = payload
        if ep != self.epoch:
            return
        self.gpu_queue.append((frames, now))
        self.start_gpu(now)

    def on_gpu_done(self, now: float, payload: tuple[int, list[float], float]) -> None:
        ep, frames, t = payload
        if ep != self.epoch:
            return
        res = self.res
        self.gpu_running = False
        self.gpu_busy_accum += t
        self.exec_window.append(t * 1000)
        for a in frames:
            self.latencies.append((now - a) * 1000)
            res.completions.append((now, (now - a) * 1000))
        res.completed += len(frames)
        self.completed_window += len(frames)
        self.in_flight -= 1
        self.inflight_frames -= len(frames)
        if self.scheduler is not None:
            self.scheduler.end_use("detector")
        self.report(now)
        self.start_gpu(now)
        self.try_form(now)

    def on_tick(self, now: float, _payload: Any) -> None:
        """A telemetry sample: the board advances; the scheduler and the controller set the depth."""
        sim, w, board, res = self.sim, self.w, self.board, self.res
        self.push(now + sim.dt, "tick")
        busy = min(1.0, self.gpu_busy_accum / sim.dt)
        self.gpu_busy_accum = 0.0
        daemon_bytes = self.daemon_bytes(now)
        board.report_load(
            busy_fraction=busy,
            inflight_bytes=self.inflight_frames * w.bytes_per_frame + self.queued() * w.queued_frame_bytes,
            resident_bytes=self.resident if now >= self.down_until else 0,
            bandwidth_gbs=self.completed_window * w.dram_bytes_per_frame / sim.dt / 1e9,
            cpu_busy_cores=min(w.cpu_workers, self.completed_window * w.pre_ms / 1000 / sim.dt),
        )
        self.completed_window = 0
        sample: Sample = board.advance(sim.dt)
        if now >= self.down_until and self.oom_check(now):  # others grew into our memory
            sample = board.advance(1e-6)
        q95 = _pct(self.waits_window, 95) if self.waits_window else 0.0
        pw95 = _pct(self.pwaits_window, 95) if self.pwaits_window else 0.0
        exec_ms = sum(self.exec_window) / len(self.exec_window) if self.exec_window else None
        pre_batch_ms = sum(self.pre_window) / len(self.pre_window) if self.pre_window else None
        self.waits_window, self.pwaits_window, self.exec_window, self.pre_window = [], [], [], []
        blocked_pct = 100 * min(1.0, self.blocked_accum / sim.dt)
        self.blocked_accum = 0.0
        level = self.decide_depth(sample, busy, q95, pw95, exec_ms, pre_batch_ms, blocked_pct)
        self.depth_sum += sim.depth
        self.depth_n += 1
        self.peak_tick_bytes = max(self.peak_tick_bytes, daemon_bytes)
        res.peak_daemon_mb = max(res.peak_daemon_mb, self.peak_tick_bytes / MiB)
        res.peak_inflight_mb = max(res.peak_inflight_mb, self.inflight_frames * w.bytes_per_frame / MiB)
        res.peak_board_used_mb = max(res.peak_board_used_mb, board.ram_used_mb)
        res.trace.append({
            "t": round(now, 3), "depth": sim.depth, "gpu_util": sample.gpu_util_pct,
            "emc_util": sample.emc_util_pct, "queue_p95_ms": round(q95, 2), "prefetch_wait_p95_ms": round(pw95, 2),
            "blocked_pct": round(blocked_pct, 1), "free_mb": sample.ram_free_mb,
            "daemon_mb": round(daemon_bytes / MiB, 1), "peak_daemon_mb": round(self.peak_tick_bytes / MiB, 1),
            "level": level, "speed": round(board.speed_factor, 3),
            "temp_c": sample.max_temp_c,
        })
        self.peak_tick_bytes = daemon_bytes
        self.try_form(now)

    def decide_depth(self, sample: Sample, busy: float, q95: float, pw95: float, exec_ms: float | None,
                     pre_batch_ms: float | None, blocked_pct: float) -> int:
        """Feed the sample to the scheduler and the controller; set the depth; return the pressure level."""
        sim, w, res = self.sim, self.w, self.res
        level = 0
        if self.scheduler is not None:
            self.scheduler.set_dynamic_bytes(self.inflight_frames * w.bytes_per_frame)
            level = int(self.scheduler.update(sample))
            if self.scheduler.used_bytes > self.scheduler.budget_bytes + self.scheduler.reserve_bytes:
                res.budget_overruns += 1
        if self.controller is not None:
            want = self.controller.step(sample, DepthInputs(
                q95, w.latency_target_ms, memory_level=level, gpu_busy_pct=100 * busy,
                prefetch_wait_p95_ms=pw95, exec_ms=exec_ms,
                depth_blocked_pct=blocked_pct,
                pre_ms=pre_batch_ms if w.pre_parallel else None,
                pre_workers=w.cpu_workers if w.pre_parallel else None,
            ))
            if self.scheduler is not None:
                batch_bytes = self.scheduler.batch_cap(w.max_batch, w.bytes_per_frame) * w.bytes_per_frame
                cap = self.scheduler.prefetch_cap(self.controller.max_depth, batch_bytes=batch_bytes)
            else:
                cap = want
            sim.depth = max(1, min(want, cap))
        elif self.scheduler is not None and sim.fixed_depth is not None:
            sim.depth = sim.fixed_depth
        return level
