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
        w = self.w
        mode = f"fixed-{self.fixed_depth}" if self.fixed_depth is not None else "adaptive"
        res = PipelineResult(mode=mode, duration_s=duration_s)
        events: list[tuple[float, int, str, Any]] = []
        seq = 0

        def push(t: float, kind: str, payload: Any = None) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(events, (t, seq, kind, payload))

        period = 1.0 / w.fps
        for s in range(w.streams):
            push(self.rng.uniform(0, period), "arrive", s)
        push(self.dt, "tick")
        rings: list[deque[float]] = [deque() for _ in range(w.streams)]
        in_flight = 0  # batches
        inflight_frames = 0
        cpu_free_at = 0.0
        workers_free_at = [0.0] * max(1, w.cpu_workers)
        pre_window: list[float] = []  # processing time of each batch formed (not its wait for a worker)
        peak_tick_bytes = 0  # daemon memory peak since the last tick, tracked at every change
        gpu_queue: deque[tuple[list[float], float]] = deque()  # (arrivals, ready_time)
        gpu_busy_until = 0.0
        gpu_busy_accum = 0.0
        gpu_running = False
        down_until = -1.0
        epoch = 0  # bumped by an OOM kill; stale events are ignored
        latencies: list[float] = []
        waits_window: list[float] = []
        pwaits_window: list[float] = []
        exec_window: list[float] = []
        depth_sum = 0.0
        depth_n = 0
        completed_window = 0
        board = self.board
        resident = w.resident_bytes
        if self.scheduler is not None:
            self.scheduler.admit("detector", resident)
            self.scheduler.measure("detector", resident)

        def queued() -> int:
            return sum(len(r) for r in rings)

        def oldest() -> float | None:
            heads = [r[0] for r in rings if r]
            return min(heads) if heads else None

        def report(now: float) -> None:
            nonlocal peak_tick_bytes
            daemon = (resident if now >= down_until else 0) + inflight_frames * w.bytes_per_frame
            peak_tick_bytes = max(peak_tick_bytes, daemon)
            board.report_load(inflight_bytes=inflight_frames * w.bytes_per_frame + queued() * w.queued_frame_bytes,
                              resident_bytes=resident if now >= down_until else 0)

        def oom_check(now: float) -> bool:
            nonlocal in_flight, inflight_frames, down_until, epoch, gpu_running
            report(now)
            if board.ram_used_mb <= board.total_mb:
                return False
            res.oom_events += 1
            res.oom_times.append(round(now, 3))
            res.lost_to_oom += inflight_frames + queued()
            for r in rings:
                r.clear()
            gpu_queue.clear()
            if self.scheduler is not None:
                for _ in range(in_flight):
                    self.scheduler.end_use("detector")
            in_flight = inflight_frames = 0
            gpu_running = False
            down_until = now + w.restart_s
            epoch += 1
            report(now)
            return True

        def try_form(now: float) -> None:
            nonlocal in_flight, inflight_frames, cpu_free_at
            if now < down_until:
                return
            while in_flight < self.depth and queued() > 0:
                old = oldest()
                batch_cap = (self.scheduler.batch_cap(w.max_batch, w.bytes_per_frame) if self.scheduler is not None
                             else w.max_batch)
                if queued() < batch_cap and old is not None and (now - old) * 1000 < w.max_queue_delay_ms:
                    push(old + w.max_queue_delay_ms / 1000 + 1e-9, "form")
                    return
                frames: list[float] = []
                while len(frames) < batch_cap and queued() > 0:
                    i = min((k for k in range(len(rings)) if rings[k]), key=lambda k: rings[k][0])
                    frames.append(rings[i].popleft())
                in_flight += 1
                inflight_frames += len(frames)
                if self.scheduler is not None:
                    self.scheduler.begin_use("detector")
                if oom_check(now):
                    return
                pre = sum(_lognormal(self.rng, w.pre_ms, w.pre_cv) for _ in frames) / 1000
                if w.pre_parallel:
                    k = min(range(len(workers_free_at)), key=workers_free_at.__getitem__)
                    start = max(now, workers_free_at[k])
                    workers_free_at[k] = start + pre
                    done = start + pre
                else:
                    pre /= w.cpu_workers
                    start = max(now, cpu_free_at)
                    cpu_free_at = start + pre
                    done = cpu_free_at
                pre_window.append(pre * 1000)
                push(done, "pre_done", (epoch, frames))

        def start_gpu(now: float) -> None:
            nonlocal gpu_running, gpu_busy_until
            if gpu_running or not gpu_queue:
                return
            frames, ready = gpu_queue.popleft()
            # Queue delay as Triton counts it: from the request's arrival to the start of its execution;
            # prefetch wait: how long the prepared batch waited for the device.
            waits_window.extend((now - a) * 1000 for a in frames)
            pwaits_window.append((now - ready) * 1000)
            speed = max(0.05, board.speed_factor)
            t = _lognormal(self.rng, (w.gpu_t0_ms + w.gpu_t1_ms * len(frames)) / 1000, w.gpu_cv) / speed
            gpu_running = True
            gpu_busy_until = now + t
            push(gpu_busy_until, "gpu_done", (epoch, frames, t))

        last_t = 0.0
        blocked_accum = 0.0
        while events:
            now, _, kind, payload = heapq.heappop(events)
            if now > duration_s:
                break
            # Time the batcher had frames but no free slot: depth was the limit.
            if now >= down_until and in_flight >= self.depth and queued() > 0:
                blocked_accum += now - last_t
            last_t = now
            if kind == "arrive":
                s = payload
                push(now + period * (1 + self.rng.uniform(-w.arrival_jitter, w.arrival_jitter)), "arrive", s)
                res.arrived += 1
                if now < down_until:
                    res.dropped += 1
                    continue
                if self.scheduler is not None and self.scheduler.should_reject():
                    res.rejected += 1
                    continue
                if len(rings[s]) >= w.ring_frames:
                    rings[s].popleft()
                    res.dropped += 1
                rings[s].append(now)
                try_form(now)
            elif kind == "form":
                try_form(now)
            elif kind == "pre_done":
                ep, frames = payload
                if ep != epoch:
                    continue
                gpu_queue.append((frames, now))
                start_gpu(now)
            elif kind == "gpu_done":
                ep, frames, t = payload
                if ep != epoch:
                    continue
                gpu_running = False
                gpu_busy_accum += t
                exec_window.append(t * 1000)
                for a in frames:
                    latencies.append((now - a) * 1000)
                    res.completions.append((now, (now - a) * 1000))
                res.completed += len(frames)
                completed_window += len(frames)
                in_flight -= 1
                inflight_frames -= len(frames)
                if self.scheduler is not None:
                    self.scheduler.end_use("detector")
                report(now)
                start_gpu(now)
                try_form(now)
            elif kind == "tick":
                push(now + self.dt, "tick")
                busy = min(1.0, gpu_busy_accum / self.dt)
                gpu_busy_accum = 0.0
                daemon_bytes = (resident if now >= down_until else 0) + inflight_frames * w.bytes_per_frame
                board.report_load(
                    busy_fraction=busy,
                    inflight_bytes=inflight_frames * w.bytes_per_frame + queued() * w.queued_frame_bytes,
                    resident_bytes=resident if now >= down_until else 0,
                    bandwidth_gbs=completed_window * w.dram_bytes_per_frame / self.dt / 1e9,
                    cpu_busy_cores=min(w.cpu_workers, completed_window * w.pre_ms / 1000 / self.dt),
                )
                completed_window = 0
                sample: Sample = board.advance(self.dt)
                if now >= down_until and oom_check(now):  # others grew into our memory
                    sample = board.advance(1e-6)
                q95 = _pct(waits_window, 95) if waits_window else 0.0
                pw95 = _pct(pwaits_window, 95) if pwaits_window else 0.0
                exec_ms = sum(exec_window) / len(exec_window) if exec_window else None
                pre_batch_ms = sum(pre_window) / len(pre_window) if pre_window else None
                waits_window, pwaits_window, exec_window, pre_window = [], [], [], []
                blocked_pct = 100 * min(1.0, blocked_accum / self.dt)
                blocked_accum = 0.0
                level = 0
                if self.scheduler is not None:
                    self.scheduler.set_dynamic_bytes(inflight_frames * w.bytes_per_frame)
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
                        cap = self.scheduler.prefetch_cap(self.controller.max_depth,
                                                          batch_bytes=batch_bytes)
                    else:
                        cap = want
                    self.depth = max(1, min(want, cap))
                elif self.scheduler is not None and self.fixed_depth is not None:
                    self.depth = self.fixed_depth
                depth_sum += self.depth
                depth_n += 1
                peak_tick_bytes = max(peak_tick_bytes, daemon_bytes)
                res.peak_daemon_mb = max(res.peak_daemon_mb, peak_tick_bytes / MiB)
                res.peak_inflight_mb = max(res.peak_inflight_mb, inflight_frames * w.bytes_per_frame / MiB)
                res.peak_board_used_mb = max(res.peak_board_used_mb, board.ram_used_mb)
                res.trace.append({
                    "t": round(now, 3), "depth": self.depth, "gpu_util": sample.gpu_util_pct,
                    "emc_util": sample.emc_util_pct, "queue_p95_ms": round(q95, 2), "prefetch_wait_p95_ms": round(pw95, 2),
                    "blocked_pct": round(blocked_pct, 1), "free_mb": sample.ram_free_mb,
                    "daemon_mb": round(daemon_bytes / MiB, 1), "peak_daemon_mb": round(peak_tick_bytes / MiB, 1),
                    "level": level, "speed": round(board.speed_factor, 3),
                    "temp_c": sample.max_temp_c,
                })
                peak_tick_bytes = daemon_bytes
                try_form(now)
        res.throughput_fps = res.completed / duration_s
        res.p50_ms = _pct(latencies, 50)
        res.p95_ms = _pct(latencies, 95)
        res.p99_ms = _pct(latencies, 99)
        res.mean_depth = depth_sum / depth_n if depth_n else float(self.depth)
        if self.controller is not None:
            res.depth_changes = self.controller.changes
            res.direction_changes = self.controller.direction_changes
        if self.scheduler is not None:
            res.pressure_steps = dict(self.scheduler.steps_total)
        return res
