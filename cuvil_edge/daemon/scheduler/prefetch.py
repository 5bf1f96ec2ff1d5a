"""Adaptive prefetch depth: how many batches the pipeline keeps in flight.

Depth is the number of batches pre-processed ahead or executing. Deeper keeps the GPU fed;
shallower holds less memory and keeps queueing delay (and so tail latency) down. The controller
follows the issue's rules:

* **deeper** while the GPU is under its utilization target, EMC is not saturated, memory is
  comfortable and the queue delay is well inside the latency objective;
* **shallower** when EMC saturates, memory pressure rises (any ladder step of
  :class:`~cuvil_edge.daemon.scheduler.memory.MemoryScheduler`), the board throttles (hot sensor,
  GPU clock pulled down while busy, input power at its limit) or the p95 queue delay threatens the
  model's p95 latency target.

Against noisy samples it smooths inputs with an EWMA, asks for ``patience_up`` agreeing samples
before going deeper (additive increase, one step) but cuts at once on a hard signal
(multiplicative decrease, halving), waits ``cooldown`` samples after any change, and after a cut
remembers the depth that hurt as a ceiling for ``ceiling_ttl`` samples (doubled, up to 8x, each
time the same edge hurts again) so it does not probe the same edge again and again. Every decision is logged with its inputs and kept in
:attr:`PrefetchController.decisions`; :meth:`PrefetchController.snapshot` feeds ``/metrics``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from cuvil_edge.errors import DaemonError
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.tegrastats import NON_DIE_SENSORS

__all__ = ["PrefetchController", "PrefetchDecision"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefetchDecision:
    """One controller step: the depth chosen, why, and the inputs it saw."""

    timestamp: float
    depth: int
    previous: int
    direction: int  # -1 shallower, 0 hold, +1 deeper
    reason: str
    gpu_util_pct: float | None
    emc_util_pct: float | None
    queue_delay_p95_ms: float | None
    latency_target_ms: float | None
    memory_level: int
    throttled: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ewma(prev: float | None, value: float | None, alpha: float) -> float | None:
    if value is None:
        return prev
    if prev is None:
        return float(value)
    return alpha * float(value) + (1.0 - alpha) * prev


class PrefetchController:
    """Chooses the prefetch depth from telemetry, queue delay and memory pressure.

    Args:
        min_depth (int): shallowest depth. Defaults to 1.
        max_depth (int): deepest depth. Defaults to 8.
        gpu_util_target (float): GPU utilization (percent) the controller aims for; below it by
            more than ``deadband_pct`` it goes deeper. Defaults to 97.
        emc_high_pct (float): EMC utilization (percent) counted as saturated. Defaults to 85.
        temp_limit_c (float): a die sensor at or above this counts as throttling. Defaults to 90
            (Jetson software throttling starts in the mid 90s; acting earlier keeps the clocks up).
        throttle_depth (int): deepest depth while the board throttles. Defaults to 2 (double
            buffering: pre-processing overlaps execution, nothing more queues).
        blocked_min_pct (float): ``depth_blocked_pct`` needed before going deeper. Defaults to 10.
        idle_pct (float): at or below this GPU use the daemon is idle: no reason to go deeper.
            Defaults to 5.
        power_limit_mw (float | None): board input power budget; at 97% of it counts as
            throttling. Defaults to None (not checked).
        queue_fraction (float): the p95 queue delay may use this fraction of the p95 latency
            target before the controller backs off. Defaults to 0.5.
        alpha (float): EWMA weight of the newest sample. Defaults to 0.3.
        deadband_pct (float): utilization band under the target where depth holds. Defaults to 2.
        patience_up (int): agreeing samples needed before going deeper. Defaults to 3.
        patience_down (int): agreeing samples needed for a soft cut (one step). Defaults to 2.
        cooldown (int): samples to wait after any change. Defaults to 2.
        ceiling_ttl (int): samples a depth that caused a cut stays off limits. Defaults to 30.
        initial_depth (int | None): starting depth. Defaults to ``min(2, max_depth)`` clamped.
        history (int): decisions kept in :attr:`decisions`. Defaults to 256.
    """

    def __init__(
        self,
        min_depth: int = 1,
        max_depth: int = 8,
        gpu_util_target: float = 97.0,
        *,
        emc_high_pct: float = 85.0,
        temp_limit_c: float = 90.0,
        throttle_depth: int = 2,
        blocked_min_pct: float = 10.0,
        idle_pct: float = 5.0,
        power_limit_mw: float | None = None,
        queue_fraction: float = 0.5,
        alpha: float = 0.3,
        deadband_pct: float = 2.0,
        patience_up: int = 3,
        patience_down: int = 2,
        cooldown: int = 2,
        ceiling_ttl: int = 30,
        initial_depth: int | None = None,
        history: int = 256,
    ) -> None:
        if not 1 <= min_depth <= max_depth:
            raise DaemonError(f"prefetch: need 1 <= min_depth ({min_depth}) <= max_depth ({max_depth})")
        if not 0 < alpha <= 1:
            raise DaemonError(f"prefetch: alpha must be in (0, 1], got {alpha}")
        self.min_depth = int(min_depth)
        self.max_depth = int(max_depth)
        self.gpu_util_target = float(gpu_util_target)
        self.emc_high_pct = float(emc_high_pct)
        self.temp_limit_c = float(temp_limit_c)
        self.throttle_depth = int(throttle_depth)
        self.blocked_min_pct = float(blocked_min_pct)
        self.idle_pct = float(idle_pct)
        self.power_limit_mw = power_limit_mw
        self.queue_fraction = float(queue_fraction)
        self.alpha = float(alpha)
        self.deadband_pct = float(deadband_pct)
        self.patience_up = int(patience_up)
        self.patience_down = int(patience_down)
        self.cooldown = int(cooldown)
        self.ceiling_ttl = int(ceiling_ttl)
        start = initial_depth if initial_depth is not None else 2
        self.depth = min(self.max_depth, max(self.min_depth, int(start)))
        self.decisions: deque[PrefetchDecision] = deque(maxlen=history)
        self.direction_changes = 0
        self.changes = 0
        self.updates = 0
        self._last_dir = 0
        self._up_votes = 0
        self._down_votes = 0
        self._since_change = 10**9
        self._ceiling: int | None = None
        self._ceiling_left = 0
        self._ttl_mult = 1
        self._last_cut_from: int | None = None
        self._gpu: float | None = None
        self._emc: float | None = None
        self._qratio: float | None = None
        self._gpu_freq_max: float | None = None

    # ------------------------------------------------------------------ signals

    def _throttled(self, sample: Sample) -> str | None:
        die = [v for k, v in sample.temps_c.items() if k not in NON_DIE_SENSORS]
        if die and max(die) >= self.temp_limit_c:
            return f"temperature {max(die):.1f} C >= {self.temp_limit_c:.0f} C"
        if sample.gpu_freq_mhz:
            self._gpu_freq_max = max(self._gpu_freq_max or 0.0, float(sample.gpu_freq_mhz))
            busy = sample.gpu_util_pct is not None and sample.gpu_util_pct >= 50
            if busy and sample.gpu_freq_mhz < 0.8 * self._gpu_freq_max:
                return f"GPU clock {sample.gpu_freq_mhz:.0f} MHz < 80% of {self._gpu_freq_max:.0f} MHz while busy"
        if self.power_limit_mw:
            p = sample.input_power_mw
            if p is not None and p >= 0.97 * self.power_limit_mw:
                return f"input power {p:.0f} mW at its limit {self.power_limit_mw:.0f} mW"
        return None

    # ------------------------------------------------------------------ step

    def update(
        self,
        sample: Sample | None,
        queue_delay_p95_ms: float | None = None,
        latency_target_ms: float | None = None,
        *,
        memory_level: int = 0,
        gpu_busy_pct: float | None = None,
        prefetch_wait_p95_ms: float | None = None,
        exec_ms: float | None = None,
        depth_blocked_pct: float | None = None,
    ) -> int:
        """Take one control step and return the depth to use.

        Args:
            sample (Sample | None): the latest telemetry (None when no source works: only queue
                delay and memory pressure are used then).
            queue_delay_p95_ms (float | None): p95 of the time requests waited in the queue over
                the last interval.
            latency_target_ms (float | None): the model's p95 latency objective (manifest
                ``latency_target_ms.p95``).
            memory_level (int): the memory scheduler's ladder level (0 = comfortable).
            gpu_busy_pct (float | None): the daemon's own device occupancy (percent of wall time a
                batch of ours was executing). Preferred over the sample's GPU utilization when
                given: GR3D counts other processes too, and Thor or tegrastats without sudo print
                none.
            prefetch_wait_p95_ms (float | None): p95 of the time a prepared batch waited for the
                device. It tells whether depth causes the queue delay: when batches are ready long
                before the device takes them, depth only adds latency and memory; when they wait
                for nothing the device is starving and depth can help. Without it every queue delay
                is blamed on depth.
            exec_ms (float | None): mean execution time of a batch over the interval; the yardstick
                for ``prefetch_wait_p95_ms``. Defaults to a tenth of the latency target.
            depth_blocked_pct (float | None): percent of the interval the batcher had requests
                waiting but no free slot (depth was the limit). Going deeper only helps then: an
                under-used GPU with nothing waiting is short of load, not of depth. Without it
                an under-used GPU is always taken as a reason to go deeper.

        Returns:
            int: the new depth, within ``[min_depth, max_depth]``.
        """
        self.updates += 1
        self._since_change += 1
        if self._ceiling_left > 0:
            self._ceiling_left -= 1
            if self._ceiling_left == 0:
                self._ceiling = None
        if gpu_busy_pct is not None:
            gpu_raw: float | None = gpu_busy_pct
        else:
            gpu_raw = sample.gpu_util_pct if sample is not None else None
        emc_raw = sample.emc_util_pct if sample is not None else None
        self._gpu = _ewma(self._gpu, gpu_raw, self.alpha)
        self._emc = _ewma(self._emc, emc_raw, self.alpha)
        qratio = None
        if queue_delay_p95_ms is not None and latency_target_ms and latency_target_ms > 0:
            qratio = queue_delay_p95_ms / latency_target_ms
            self._qratio = _ewma(self._qratio, qratio, self.alpha)
        throttle = self._throttled(sample) if sample is not None else None
        # Is depth to blame for the queueing? Yes when prepared batches sit waiting for the device
        # (or when we cannot tell); no when the device takes them at once (overload upstream).
        if prefetch_wait_p95_ms is None:
            depth_hurts = True
            starving = False
        else:
            yardstick = exec_ms if exec_ms else 0.1 * (latency_target_ms or 100.0)
            # One batch waiting behind the running one is what double buffering means (up to one
            # execution time); more than that is depth adding latency.
            depth_hurts = prefetch_wait_p95_ms >= 1.2 * yardstick
            starving = prefetch_wait_p95_ms < 0.25 * yardstick

        prev = self.depth
        # While throttled the pipeline keeps at most double buffering (``throttle_depth``): the
        # clocks are down, deeper would only queue more work and hold more memory.
        limit = self.max_depth if self._ceiling is None else min(self.max_depth, self._ceiling - 1)
        if throttle:
            limit = min(limit, max(self.min_depth, self.throttle_depth))
        hard: str | None = None
        soft: str | None = None
        up: str | None = None
        if memory_level > 0:
            hard = f"memory pressure level {memory_level}"
        elif qratio is not None and qratio >= 1.0 and depth_hurts:
            hard = f"queue p95 {queue_delay_p95_ms:.1f} ms >= target {latency_target_ms:.1f} ms"
        elif throttle and prev > limit:
            soft = throttle
        elif self._emc is not None and self._emc >= self.emc_high_pct:
            soft = f"EMC {self._emc:.0f}% >= {self.emc_high_pct:.0f}%"
        elif self._qratio is not None and self._qratio >= self.queue_fraction and depth_hurts:
            soft = f"queue p95 at {100 * self._qratio:.0f}% of the target"
        elif (
            self._gpu is not None
            and self.idle_pct < self._gpu < self.gpu_util_target - self.deadband_pct
            and (self._emc is None or self._emc < self.emc_high_pct - 10.0)
            and (starving or self._qratio is None or self._qratio < self.queue_fraction / 2)
            and (depth_blocked_pct is None or depth_blocked_pct >= self.blocked_min_pct)
        ):
            up = f"GPU {self._gpu:.0f}% under target {self.gpu_util_target:.0f}%"

        new = prev
        reason = "hold"
        if hard:
            self._up_votes = 0
            self._down_votes = 0
            if prev > self.min_depth:
                new = max(self.min_depth, prev // 2)
                reason = f"cut: {hard}"
            else:
                reason = f"at minimum: {hard}"
        elif soft:
            self._up_votes = 0
            self._down_votes += 1
            if self._down_votes >= self.patience_down and self._since_change > self.cooldown and prev > self.min_depth:
                new = prev - 1
                reason = f"shallower: {soft}"
                self._down_votes = 0
            else:
                reason = f"hold ({soft}, {self._down_votes}/{self.patience_down})"
        elif up:
            self._down_votes = 0
            self._up_votes += 1
            if prev >= limit:
                reason = f"hold at limit {limit}{' (throttled)' if throttle else ''} ({up})"
            elif self._up_votes >= self.patience_up and self._since_change > self.cooldown:
                new = prev + 1
                reason = f"deeper: {up}"
                self._up_votes = 0
            else:
                reason = f"hold ({up}, {self._up_votes}/{self.patience_up})"
        else:
            self._up_votes = 0
            self._down_votes = 0

        direction = (new > prev) - (new < prev)
        if direction:
            if direction < 0:
                # Hitting the same edge again doubles how long it stays off limits (up to 8x).
                self._ttl_mult = min(8, self._ttl_mult * 2) if prev == self._last_cut_from else 1
                self._last_cut_from = prev
                self._ceiling = prev
                self._ceiling_left = self.ceiling_ttl * self._ttl_mult
            if self._last_dir and direction != self._last_dir:
                self.direction_changes += 1
            self._last_dir = direction
            self._since_change = 0
            self.changes += 1
            self.depth = new
        decision = PrefetchDecision(
            timestamp=sample.timestamp if sample is not None else math.nan,
            depth=new,
            previous=prev,
            direction=direction,
            reason=reason,
            gpu_util_pct=None if self._gpu is None else round(self._gpu, 2),
            emc_util_pct=None if self._emc is None else round(self._emc, 2),
            queue_delay_p95_ms=queue_delay_p95_ms,
            latency_target_ms=latency_target_ms,
            memory_level=int(memory_level),
            throttled=throttle is not None,
        )
        self.decisions.append(decision)
        if direction:
            log.info("prefetch depth %d -> %d: %s (inputs %s)", prev, new, reason, decision.to_dict())
        else:
            log.debug("prefetch depth %d: %s", new, reason)
        return new

    @property
    def last_decision(self) -> PrefetchDecision | None:
        return self.decisions[-1] if self.decisions else None

    def snapshot(self) -> dict[str, Any]:
        """Plain figures for ``/metrics``."""
        last = self.last_decision
        return {
            "depth": self.depth,
            "min_depth": self.min_depth,
            "max_depth": self.max_depth,
            "updates": self.updates,
            "changes": self.changes,
            "direction_changes": self.direction_changes,
            "ceiling": self._ceiling,
            "gpu_util_ewma": self._gpu,
            "emc_util_ewma": self._emc,
            "queue_ratio_ewma": self._qratio,
            "last_reason": last.reason if last else None,
        }
