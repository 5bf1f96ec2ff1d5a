"""The server's link to the board: telemetry, memory co-scheduler, prefetch controller, systemd.

:class:`Resources` wires part A's objects into serving:

* :class:`~cuvil_edge.telemetry.TelemetryMonitor` (``--telemetry SPEC``) supplies samples; the
  daemon reports its own load back (``report_load``: the simulator answers it).
* :class:`~cuvil_edge.daemon.scheduler.MemoryScheduler` admits each model version's footprint
  before it loads (a refusal is HTTP 507 on a repository load), learns the measured size after,
  and runs the pressure ladder from each sample: the server applies ``batch_cap`` to every
  batcher, ``prefetch_cap`` to the depth, unloads the least recently used idle model at
  ``UNLOAD_LRU`` and answers 503 + ``Retry-After`` while ``should_reject``.
* :class:`~cuvil_edge.daemon.scheduler.PrefetchController` picks the batches in flight per model
  from the measured stage times (CPU preparing and answering a batch against the device
  executing it: Little's law), the share of the tick requests waited for a free slot, the
  completed rate, GPU/EMC utilization, throttling, memory level and the p95 queue delay against
  the model's ``latency_target_ms.p95``.
* ``sd_notify`` (``READY=1``, ``STATUS=``, ``RELOADING=1``, ``STOPPING=1``) and the progress-gated
  watchdog through :mod:`cuvil_edge.daemon.systemd` (a built-in datagram sender if it is absent).
* One :class:`~cuvil_edge.runtime.buffers.BufferPool` for batch buffers, placed per the board's
  policy and accounted by the scheduler (emptied at ``RELEASE_IDLE``).

Everything here degrades: no telemetry means no ladder steps (admission still uses the board's
RAM), and a failing piece is logged, never fatal to serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.daemon.infer import MemoryRefused
from cuvil_edge.daemon.models import io_bytes_per_item
from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime.buffers import BufferPool, Placement

if TYPE_CHECKING:
    from cuvil_edge.daemon.batcher import Batcher
    from cuvil_edge.daemon.config import Config
    from cuvil_edge.daemon.metrics import ModelStats
    from cuvil_edge.daemon.models import ModelInstance, ModelRegistry
    from cuvil_edge.daemon.scheduler import KernelMemory, MemoryScheduler, PrefetchController
    from cuvil_edge.daemon.systemd import Watchdog
    from cuvil_edge.targets import Target
    from cuvil_edge.telemetry import TelemetryMonitor
    from cuvil_edge.telemetry.control import DepthInputs

__all__ = ["Resources"]

log = logging.getLogger("cuvil_edge.daemon.resources")


def _builtin_notify(*lines: str) -> bool:
    """sd_notify without libsystemd: one datagram to ``$NOTIFY_SOCKET``."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto("\n".join(lines).encode(), addr)
        return True
    except OSError as exc:
        log.debug("sd_notify failed: %s", exc)
        return False


@dataclass(frozen=True)
class _StageTimes:
    """One tick's figures for the prefetch controller (None where the tick ran no batch)."""

    busy_pct: float
    pre_ms: float | None
    exec_ms: float | None
    blocked_pct: float | None
    completed_per_s: float | None

    def inputs(self, queue_p95_ms: float | None, target_ms: float | None, memory_level: int,
               pre_workers: int) -> DepthInputs:
        """The prefetch controller's inputs for this tick."""
        from cuvil_edge.telemetry.control import DepthInputs

        return DepthInputs(queue_p95_ms, target_ms, memory_level=memory_level, gpu_busy_pct=self.busy_pct,
                           pre_ms=self.pre_ms, exec_ms=self.exec_ms, depth_blocked_pct=self.blocked_pct,
                           completed_per_s=self.completed_per_s, pre_workers=pre_workers)


@dataclass(frozen=True)
class _StageCounters:
    """Cumulative counters of one model, read once per tick; differences give the stage times.

    A worker prepares a batch (``compute_input``: pre-processing, concatenation) and answers it
    (``compute_output``: post-processing, encoding) on the CPU; ``compute_infer`` is the device.
    While one batch executes the others in flight are prepared or answered, so the CPU stages
    together are what the controller's Little's law calls preparing.
    """

    executions: int
    cpu_ns: int
    infer_ns: int
    inferences: int
    blocked_s: float

    @classmethod
    def read(cls, stats: ModelStats, batcher: Batcher | None) -> _StageCounters:
        with stats.lock:
            counters = (stats.execution_count, stats.compute_input.ns + stats.compute_output.ns,
                        stats.compute_infer.ns, stats.inference_count)
        return cls(*counters, batcher.blocked_seconds() if batcher is not None else 0.0)

    def since(self, prev: _StageCounters | None, dt: float) -> _StageTimes:
        if prev is None:
            return _StageTimes(0.0, None, None, None, None)
        # Share of the tick the model computed (batches in flight add up, hence the cap).
        busy = min(100.0, 100.0 * (self.infer_ns - prev.infer_ns) / 1e9 / dt)
        runs = self.executions - prev.executions
        blocked = 100.0 * min(1.0, max(0.0, self.blocked_s - prev.blocked_s) / dt)
        completed = max(0, self.inferences - prev.inferences) / dt
        if runs <= 0:
            return _StageTimes(busy, None, None, blocked, completed)
        # A batch's inference time includes its wait for the device while others execute, so a
        # deeper pipeline would read as a slower device. The device cannot spend more than the
        # wall time per batch, which is its true execution time once it is saturated.
        infer_ms = min((self.infer_ns - prev.infer_ns) / runs / 1e6, 1000.0 * dt / runs)
        return _StageTimes(busy, (self.cpu_ns - prev.cpu_ns) / runs / 1e6, infer_ms if infer_ms > 0 else None,
                           blocked, completed)


class Resources:
    """Telemetry + memory co-scheduler + prefetch + systemd for the server.

    Args:
        config (Config): the daemon's settings (``telemetry``, ``board``, ``memory_reserve_mb``,
            ``max_depth``, ``tick``).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.monitor: TelemetryMonitor | None = None
        self.scheduler: MemoryScheduler | None = None
        self.prefetch: dict[str, PrefetchController] = {}
        self.target: Target | None = None
        self.registry: ModelRegistry | None = None
        self._notify: Callable[..., Any] = _builtin_notify
        self._seen = 0
        self._last_tick = time.monotonic()
        self._last_stages: dict[str, _StageCounters] = {}
        self.depths: dict[str, int] = {}
        self.unloaded_by_pressure: set[str] = set()
        self.busy_pct = 0.0
        self.watchdog: Watchdog | None = None
        # Batch buffers (concatenated inputs) come from one reused pool the scheduler accounts.
        self.pool = BufferPool(placement=Placement.PAGEABLE)
        usec = os.environ.get("WATCHDOG_USEC")
        # systemd kills at WATCHDOG_USEC without a ping; a batch stuck for half of that stops pings.
        self.stuck_after_s = max(1.0, int(usec) / 2e6) if usec and usec.isdigit() else 60.0

    @property
    def has_scheduler(self) -> bool:
        """Whether a memory scheduler runs (so the pressure check is worth calling)."""
        return self.scheduler is not None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open telemetry, create the scheduler. Raises DaemonError for a bad board or spec."""
        cfg = self.config
        from cuvil_edge.daemon import systemd

        self._notify = systemd.notify
        self.watchdog = systemd.Watchdog(stuck_after_s=self.stuck_after_s)
        if cfg.board:
            from cuvil_edge.targets import get_target

            try:
                self.target = get_target(cfg.board)
            except CuvilEdgeError as exc:
                raise DaemonError(f"--board {cfg.board!r}: {exc}") from exc
            from cuvil_edge.daemon.scheduler import placement_policy

            policy = placement_policy(self.target)
            # Pinned/mapped buffers need pycuda and a GPU; host_allocator falls back otherwise.
            self.pool = BufferPool(placement=policy.kind)
            log.info("I/O placement: %s", policy.reason)
        from cuvil_edge.daemon.scheduler import MemoryScheduler, PressureLevel

        self.scheduler = MemoryScheduler(target=self.target, reserve_mb=cfg.memory_reserve_mb,
                                         kernel=self._kernel_memory())
        self.scheduler.attach_pool(self.pool)
        self.scheduler.on_step(PressureLevel.UNLOAD_LRU, self._unload_lru)
        self.scheduler.on_step(PressureLevel.RELEASE_IDLE, self._release_idle)
        self.scheduler.on_level_change(self._reload_after_pressure)
        if cfg.telemetry:
            from cuvil_edge.telemetry import TelemetryMonitor, check_spec, expand_spec

            try:
                for item in expand_spec(cfg.telemetry):
                    check_spec(item)  # a spec that can never work: the monitor would retry it forever
                self.monitor = TelemetryMonitor(cfg.telemetry, interval_s=max(0.1, min(1.0, cfg.tick)))
            except CuvilEdgeError as exc:
                raise DaemonError(f"--telemetry {cfg.telemetry!r}: {exc}") from exc
            self.monitor.start()

    @staticmethod
    def _kernel_memory() -> KernelMemory | None:
        """The kernel's memory signals (meminfo, PSI, this unit's cgroup), where /proc has them."""
        if os.environ.get("CUVIL_EDGED_KERNEL_MEMORY", "1") == "0":
            return None
        try:
            from cuvil_edge.daemon.scheduler import KernelMemory

            kernel = KernelMemory()
            kernel.read()
        except Exception as exc:  # not Linux, or /proc unreadable: telemetry alone drives the ladder
            log.info("kernel memory signals unavailable: %s", exc)
            return None
        if not os.path.exists("/proc/meminfo"):
            return None
        return kernel

    def bind(self, registry: ModelRegistry) -> None:
        """Give the ladder access to the registry (for UNLOAD_LRU)."""
        self.registry = registry

    def close(self) -> None:
        """Stop telemetry."""
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None

    def watchdog_tick(self, oldest_batch_s: float) -> None:
        """Record serving progress and ping the systemd watchdog when due (see systemd.Watchdog)."""
        wd = self.watchdog
        if wd is None:
            if oldest_batch_s <= self.stuck_after_s:
                if os.environ.get("WATCHDOG_USEC"):
                    self.notify("WATCHDOG=1")
            return
        wd.progress(oldest_batch_s)
        wd.tick()

    def notify(self, *lines: str) -> None:
        """sd_notify; a no-op outside systemd."""
        try:
            self._notify(*lines)
        except Exception as exc:  # notification must never break serving
            log.debug("sd_notify %s failed: %s", lines, exc)

    # ------------------------------------------------------------------ admission

    @staticmethod
    def key(name: str, version: str) -> str:
        """Reservation name of a model version (both versions are resident during a swap)."""
        return f"{name}:{version}"

    def admit(self, name: str, version: str, bundle_dir: Path, manifest: Manifest, estimate: int) -> None:
        """Reserve a model version's footprint; raises MemoryRefused when it does not fit."""
        if self.scheduler is None:
            return
        from cuvil_edge.daemon.scheduler import MemoryBudgetError

        max_batch = max(1, int(self.config.max_batch or manifest.max_batch or 1))
        try:
            need = self.scheduler.estimate_footprint(bundle_dir, max_batch, self.config.max_depth,
                                                     io_bytes_per_item(manifest))
        except CuvilEdgeError:
            need = estimate
        try:
            self.scheduler.admit(self.key(name, version), max(need, estimate))
        except MemoryBudgetError as exc:
            raise MemoryRefused(str(exc)) from exc

    def measured(self, name: str, version: str, nbytes: int) -> None:
        """Replace the estimate with the measured size."""
        if self.scheduler is None:
            return
        if nbytes <= 0:
            self.scheduler.loaded(self.key(name, version))
            return
        try:
            self.scheduler.measure(self.key(name, version), nbytes)
        except CuvilEdgeError as exc:
            log.debug("measure: %s", exc)

    def release(self, name: str, version: str) -> None:
        """Forget a retired version's reservation."""
        if self.scheduler is not None:
            self.scheduler.release(self.key(name, version))

    def pressure(self) -> tuple[bool, float]:
        """(reject new requests?, Retry-After seconds)."""
        s = self.scheduler
        if s is None or not s.should_reject():
            return False, 0.0
        return True, float(s.retry_after_s)

    # ------------------------------------------------------------------ ladder actions

    def _unload_lru(self, name: str) -> None:
        reg, sched = self.registry, self.scheduler
        if reg is None or sched is None:
            return
        model, _, version = name.rpartition(":")
        entry = reg.entries.get(model)
        if entry is None or entry.instance is None or entry.instance.version != version:
            sched.release(name)
            return
        log.warning("memory pressure: unloading the least recently used idle model %s", name)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        # Remember it: once the ladder is back to NORMAL it is loaded again, so a squeeze that
        # passes does not leave the daemon without the model it was serving.
        self.unloaded_by_pressure.add(model)
        retry = max(1, int(sched.retry_after_s))
        task = loop.create_task(reg.unload(model, "unloaded under memory pressure", retry))
        task.add_done_callback(lambda t: t.exception())

    def _reload_after_pressure(self, new: Any, old: Any, reason: str) -> None:
        """Level listener: back at NORMAL, load again what the ladder unloaded, one at a time.

        One after another, so each load is admitted against what the previous ones really took
        and measured alone (loads side by side each counted the others' growth as their own, and
        pushed the daemon over its budget again on the emulated board); a level that rises again
        stops the rest, which wait for the next return to NORMAL.
        """
        if int(new) != 0 or not self.unloaded_by_pressure or self.registry is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        pending = sorted(self.unloaded_by_pressure)
        self.unloaded_by_pressure.clear()
        registry, scheduler = self.registry, self.scheduler

        async def reload_in_turn() -> None:
            for i, model in enumerate(pending):
                if scheduler is not None and int(scheduler.level) != 0:
                    self.unloaded_by_pressure.update(pending[i:])
                    log.warning("memory pressure again: %s wait for the next calm", ", ".join(pending[i:]))
                    return
                log.warning("memory pressure over: loading %s again", model)
                try:
                    await registry.load(model)
                except MemoryRefused as exc:  # it does not fit yet: try again at the next calm
                    self.unloaded_by_pressure.add(model)
                    log.warning("loading %s again refused, it waits for the next calm: %s", model, exc)
                except Exception as exc:  # a load error, logged by the registry
                    log.warning("loading %s again failed: %s", model, exc)

        task = loop.create_task(reload_in_turn())
        task.add_done_callback(lambda t: t.exception())

    def _release_idle(self, names: list[str]) -> None:
        # ONNX Runtime keeps its arena; what the daemon can drop are pooled host buffers. The
        # scheduler counts the step; idle contexts come back on the next request.
        log.warning("memory pressure: releasing idle contexts of %s", ", ".join(names) or "no model")
        import sys

        trt = sys.modules.get("cuvil_edge.runtime.trt")  # loaded only where a TensorRT engine serves
        if trt is not None:
            freed = trt.trim_shared_arena()
            if freed:
                log.warning("memory pressure: freed %.1f MiB of idle TensorRT scratch", freed / 1048576)

    # ------------------------------------------------------------------ tick

    def tick(self, instances: list[ModelInstance]) -> None:
        """Feed the latest sample to the scheduler and prefetch, apply their decisions, report load."""
        now = time.monotonic()
        dt = max(1e-3, now - self._last_tick)
        self._last_tick = now
        sample = None
        if self.monitor is not None:
            latest = self.monitor.latest
            if latest is not None and self.monitor.samples_total != self._seen:
                self._seen = self.monitor.samples_total
                sample = latest
        level = 0
        if self.scheduler is not None:
            inflight = 0
            for inst in instances:
                if inst.batcher is not None:
                    inflight += (inst.batcher.queued + inst.batcher.active * max(1, inst.max_batch)) * \
                        inst.io_bytes_per_item
                if inst.inflight:
                    self.scheduler.touch(self.key(inst.name, inst.version))
            self.scheduler.set_dynamic_bytes(inflight)
            if sample is not None or self.scheduler.kernel is not None:
                self.scheduler.update(sample)
            level = int(self.scheduler.level)
        busy_total = 0.0
        for inst in instances:
            key = self.key(inst.name, inst.version)
            b = inst.batcher
            counters = _StageCounters.read(inst.stats, b)
            stages = counters.since(self._last_stages.get(key), dt)
            self._last_stages[key] = counters
            busy_total += stages.busy_pct
            if b is None:
                continue
            if self.scheduler is not None:
                b.set_cap(inst.batch_cap(self.scheduler.batch_cap(max(1, inst.max_batch))))
            ctl = self.prefetch.get(key)
            if ctl is None:
                from cuvil_edge.daemon.scheduler import PrefetchController

                ctl = self.prefetch[key] = PrefetchController(1, b.max_depth, initial_depth=min(2, b.max_depth))
            target = inst.spec.latency_p95_ms
            depth = ctl.step(sample, stages.inputs(inst.stats.queue_p95_ms(), target or None, level,
                                                   pre_workers=max(1, b.max_depth - 1)))
            if self.scheduler is not None:
                depth = min(depth, self.scheduler.prefetch_cap(b.max_depth))
            b.set_depth(depth)
            self.depths[key] = b.depth
        live = {self.key(i.name, i.version) for i in instances}
        for key in list(self.prefetch):
            if key not in live:
                self.prefetch.pop(key, None)
                self.depths.pop(key, None)
        for key in list(self._last_stages):
            if key not in live:
                del self._last_stages[key]
        self.busy_pct = min(100.0, busy_total)
        if self.monitor is not None:
            resident = sum(i.footprint_bytes for i in instances)
            try:
                self.monitor.report_load(busy_fraction=self.busy_pct / 100.0, resident_bytes=resident,
                                         inflight_bytes=self.scheduler.dynamic_bytes if self.scheduler else 0)
            except Exception as exc:
                log.debug("report_load failed: %s", exc)

    # ------------------------------------------------------------------ metrics

    def gauges(self, instances: list[ModelInstance]) -> dict[str, tuple[str, list[tuple[dict[str, str], Any]]]]:
        """Board and scheduler gauges for /metrics (absent figures are left out, never 0)."""
        g: dict[str, tuple[str, list[tuple[dict[str, str], Any]]]] = {}
        sample = self.monitor.latest if self.monitor is not None else None
        if sample is not None:
            g["cuvil_board_gpu_utilization_percent"] = ("GPU (GR3D) utilization", [({}, sample.gpu_util_pct)])
            g["cuvil_board_gpu_frequency_mhz"] = ("GPU frequency", [({}, sample.gpu_freq_mhz)])
            g["cuvil_board_emc_utilization_percent"] = ("Memory controller (EMC) utilization",
                                                        [({}, sample.emc_util_pct)])
            g["cuvil_board_ram_used_bytes"] = ("RAM in use on the board",
                                               [({}, None if sample.ram_used_mb is None
                                                 else int(sample.ram_used_mb * 1048576))])
            g["cuvil_board_ram_total_bytes"] = ("RAM of the board",
                                                [({}, None if sample.ram_total_mb is None
                                                  else int(sample.ram_total_mb * 1048576))])
            g["cuvil_board_swap_used_bytes"] = ("Swap in use",
                                                [({}, None if sample.swap_used_mb is None
                                                  else int(sample.swap_used_mb * 1048576))])
            rails = sample.power_mw or {}
            g["cuvil_board_power_milliwatts"] = ("Power rail, current reading",
                                                 [({"rail": r}, v.get("cur")) for r, v in rails.items()])
            temps = sample.temps_c or {}
            g["cuvil_board_temperature_celsius"] = ("Temperature by sensor",
                                                    [({"sensor": k}, v) for k, v in temps.items()])
        if self.monitor is not None:
            st = self.monitor
            g["cuvil_telemetry_sample_age_seconds"] = ("Age of the latest telemetry sample", [({}, st.age_s)])
            g["cuvil_telemetry_source_up"] = ("Telemetry source in use", [({"source": str(st.active)}, 1)])
        g["cuvil_daemon_busy_percent"] = ("Share of the last tick the models computed", [({}, self.busy_pct)])
        g["cuvil_prefetch_depth"] = (
            "Batches allowed in flight (prefetch depth)",
            [({"model": k.rpartition(":")[0], "version": k.rpartition(":")[2]}, v) for k, v in self.depths.items()])
        g.update(self._view_gauges(instances))
        if self.scheduler is not None:
            snap = self.scheduler.snapshot()
            for key, help_text in (("budget_bytes", "Memory budget: RAM - reserve - other processes"),
                                   ("used_bytes", "Memory the daemon accounts for"),
                                   ("headroom_bytes", "Budget left"),
                                   ("reserve_bytes", "RAM reserved for the system"),
                                   ("other_bytes", "RAM used by other processes"),
                                   ("total_bytes", "Board RAM"),
                                   ("dynamic_bytes", "In-flight request and batch buffers"),
                                   ("peak_used_bytes", "Peak memory the daemon accounted for")):
                g[f"cuvil_memory_{key}"] = (help_text, [({}, snap[key])])
            g["cuvil_memory_pressure_level"] = (
                "Pressure ladder step (0 normal .. 5 reject)", [({"step": snap["level_name"]}, snap["level"])])
        return g

    def _view_gauges(self, instances: list[ModelInstance]) -> dict[str, tuple[str, list[tuple[dict[str, str], Any]]]]:
        """What ``cuvil-edge top`` shows beyond the counters: latency percentiles per model, the
        prefetch depth's Little's-law need and why it last changed, the pressure step's reason."""
        g: dict[str, tuple[str, list[tuple[dict[str, str], Any]]]] = {}

        def lab(inst: ModelInstance) -> dict[str, str]:
            return {"model": inst.name, "version": inst.version}

        g["cuvil_model_latency_p50_ms"] = ("Median request duration over the last 1024 requests",
                                           [(lab(i), i.stats.latency_ms(50)) for i in instances])
        g["cuvil_model_latency_p99_ms"] = ("p99 request duration over the last 1024 requests",
                                           [(lab(i), i.stats.latency_ms(99)) for i in instances])
        need, info = [], []
        for inst in instances:
            ctl = self.prefetch.get(self.key(inst.name, inst.version))
            if ctl is None:
                continue
            need.append((lab(inst), ctl.need))
            reason = ctl.last_change_reason or f"unchanged ({ctl.last_decision.reason if ctl.last_decision else '-'})"
            info.append(({**lab(inst), "reason": reason[:200]}, 1))
        g["cuvil_prefetch_need"] = ("Depth that keeps the device fed (prepare/execute times)", need)
        g["cuvil_prefetch_info"] = ("Why the prefetch depth last changed (reason label)", info)
        if self.scheduler is not None:
            g["cuvil_memory_pressure_info"] = ("Why the pressure ladder is at its step (reason label)",
                                               [({"reason": str(self.scheduler.reason)[:200]}, 1)])
            k = self.scheduler.kernel_reading
            if k is not None:
                psi, cg = k.pressure, k.cgroup
                g["cuvil_memory_available_bytes"] = ("Kernel: MemAvailable, or the cgroup's limit - usage if less",
                                                     [({}, k.available_bytes)])
                if psi is not None:
                    g["cuvil_memory_psi_some_avg10"] = ("Kernel PSI: % of the last 10 s some task stalled on memory",
                                                        [({}, psi.some_avg10)])
                    g["cuvil_memory_psi_full_avg10"] = ("Kernel PSI: % of the last 10 s all tasks stalled on memory",
                                                        [({}, psi.full_avg10)])
                if cg is not None:
                    g["cuvil_memory_cgroup_current_bytes"] = ("Memory charged to the daemon's cgroup",
                                                              [({}, cg.current)])
                    g["cuvil_memory_cgroup_limit_bytes"] = ("The cgroup's memory limit (MemoryMax)", [({}, cg.limit)])
                    g["cuvil_memory_cgroup_oom_kill_total"] = ("OOM kills inside the daemon's cgroup",
                                                               [({}, cg.oom_kills)])
        return g

    def counters(self) -> dict[str, tuple[str, list[tuple[dict[str, str], Any]]]]:
        """Scheduler and telemetry counters for /metrics."""
        c: dict[str, tuple[str, list[tuple[dict[str, str], Any]]]] = {}
        if self.scheduler is not None:
            snap = self.scheduler.snapshot()
            c["cuvil_memory_pressure_steps_total"] = (
                "Pressure ladder steps entered", [({"step": k}, v) for k, v in snap["steps_total"].items()])
            c["cuvil_memory_rejected_admissions_total"] = (
                "Model loads refused by the memory budget", [({}, snap["rejected_admissions"])])
        if self.prefetch:
            c["cuvil_prefetch_changes_total"] = (
                "Prefetch depth changes",
                [({"model": k.rpartition(":")[0], "version": k.rpartition(":")[2]}, v.changes)
                 for k, v in self.prefetch.items()])
        if self.monitor is not None:
            c["cuvil_telemetry_samples_total"] = ("Telemetry samples read", [({}, self.monitor.samples_total)])
            c["cuvil_telemetry_failures_total"] = ("Telemetry source failures", [({}, self.monitor.failures_total)])
        return c
