"""Adaptive prefetch depth: how many batches the pipeline keeps in flight.

Depth is the number of batches pre-processed ahead or executing. Deeper keeps the GPU fed;
shallower holds less memory and keeps queueing delay (and so tail latency) down. The controller
follows the issue's rules:

* **deeper** while the GPU is under its utilization target, EMC is not saturated, memory is
  comfortable and the queue delay is well inside the latency objective;
* **shallower** when EMC saturates, memory pressure rises (any ladder step of
  :class:`~cuvil_edge.daemon.scheduler.memory.MemoryScheduler`), the board throttles (hot sensor,
  GPU clock pulled down while busy, input power at its limit: at most ``throttle_depth``, and one
  step less while the queue delay is over the target) or the p95 queue delay threatens the
  model's p95 latency target.

Depth only pays while it buys something, so going deeper is a *trial* judged on measurement (a
hill climb that stops at the knee of the throughput-vs-depth curve):

* it is tried only when the device starves for prepared batches (``prefetch_wait_p95_ms`` small
  against ``exec_ms``) while requests wait for a free slot; when a prepared batch already waits for
  the device, one more slot can only add a batch to that wait (latency and memory, no throughput);
* after ``dwell`` samples at the new depth the controller compares the completed throughput
  (``completed_per_s``; the daemon's own device occupancy when not given) and the queue delay with
  those just before the step. Unless throughput rose by ``gain_min`` or the queue delay fell by
  ``queue_gain``, it steps back: the shallowest depth within tolerance of the best is kept, and the
  depth that bought nothing is off limits for a while (the same ceiling as after a cut).

When the stage times are known (``pre_ms``: how long preparing one batch takes, ``exec_ms``: how
long the device runs one), the depth that keeps the device fed follows from Little's law instead
of a probe: while one batch executes the next ones must be in preparation, so the device never
starves once ``depth >= 1 + pre_ms / exec_ms`` (at most one more than the ``pre_workers`` that
prepare batches in parallel). That depth (:attr:`PrefetchController.need`) is where the
controller goes when requests wait for a slot, in one step and without a trial, and where it
comes back to when a prepared batch waits for the device (one slot too many: latency and memory,
no throughput). It tracks the board: a GPU shared with another process or throttled lengthens
``exec_ms`` and so lowers the depth needed; a light model on a free GPU raises it. The throttle
ceiling (``throttle_depth``) then yields to it, since the slowed execution time is already in the
figure. Memory pressure and a queue delay over the objective still cut below it.

Against noisy samples it smooths inputs with an EWMA, asks for ``patience_up`` agreeing samples
before going deeper (additive increase, one step) but cuts at once on a hard signal. A queue delay
over the target that depth causes is cut straight to the depth that leaves one prepared batch
waiting for the device (``prefetch_wait_p95_ms`` / ``exec_ms`` says how many wait), halving when
that is unknown; memory pressure halves. It waits ``cooldown`` samples after any change, and after a
cut (or a trial that bought nothing) remembers the depth as a ceiling for ``ceiling_ttl`` samples
(doubled, up to 8x, each time the same edge is hit again) so it does not probe the same edge again
and again. Every decision is logged with its inputs and kept in
:attr:`PrefetchController.decisions`; :meth:`PrefetchController.snapshot` feeds ``/metrics``.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from cuvil_edge.errors import DaemonError
from cuvil_edge.telemetry.control import DepthInputs
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.tegrastats import NON_DIE_SENSORS

__all__ = ["DepthInputs", "PrefetchController", "PrefetchDecision"]

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
    need: int | None = None  # Little's-law depth, when the stage times are known

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ewma(prev: float | None, value: float | None, alpha: float) -> float | None:
    if value is None:
        return prev
    if prev is None:
        return float(value)
    return alpha * float(value) + (1.0 - alpha) * prev


@dataclass(frozen=True)
class _Signals:
    """What one step derived from its inputs (see ``PrefetchController._observe``)."""

    prev: int
    gpu_raw: float | None
    qratio: float | None
    throttle: str | None
    waiting_batches: float | None
    depth_hurts: bool
    starving: bool
    need: int | None
    need_down: int | None
    limit: int
    blocked: bool


@dataclass
class _Move:
    """The reason a step found to move, strongest first (see ``PrefetchController._propose``)."""

    hard: str | None = None
    hard_to: int | None = None
    soft: str | None = None
    up: str | None = None
    knee: str | None = None
    fit: str | None = None
    fit_to: int | None = None


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
            buffering: pre-processing overlaps execution, nothing more queues). While throttled,
            a p95 queue delay over the latency target cuts one step at once even when depth is
            not to blame, and no step deeper is taken until it is under ``queue_fraction`` of the
            target: with the clocks down the objective comes before throughput.
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
        gain_min (float): fraction by which a deeper step must raise completed throughput to be
            kept. Defaults to 0.05 (the shallowest depth within 5% of the best is kept).
        queue_gain (float): fraction by which a deeper step may instead lower the p95 queue delay
            to be kept. Defaults to 0.25.
        dwell (int): samples at a new depth before the trial is judged (the first two are left
            out: the pipeline is still filling). Defaults to 8.
        need_slack (float): slack, in execution times, the Little's-law depth keeps for the spread
            of preparation times (``need = 1 + ceil(pre/exec + slack)``): when preparing a batch
            takes about as long as executing one, the slower half of the preparations would
            starve the device at ``1 + pre/exec`` exactly. Defaults to 0.25.
        need_band (float): hysteresis, in execution times: the depth comes down only to
            ``1 + ceil(pre/exec + slack + band)``, so a ratio near an integer does not make the
            depth flap. Defaults to 0.25.
        stage_alpha (float): EWMA weight of the newest stage times. Each is already a mean over
            the interval's batches, and a board change (another process takes the GPU, the
            clock drops) shows in them at once: they are smoothed less than the utilizations.
            Defaults to 0.6.
        throttle_clock_fraction (float): the GPU clock a hot board is expected to throttle to, as a
            fraction of its maximum; while hot with the clock still up the depth is planned for
            it. Defaults to 0.5 (the simulator's floor; Jetson thermal throttling steps the GPU
            clock down through several levels).
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
        gain_min: float = 0.05,
        queue_gain: float = 0.25,
        dwell: int = 8,
        need_slack: float = 0.25,
        need_band: float = 0.25,
        stage_alpha: float = 0.6,
        throttle_clock_fraction: float = 0.5,
        initial_depth: int | None = None,
        history: int = 256,
    ) -> None:
        if not 1 <= min_depth <= max_depth:
            raise DaemonError(f"prefetch: need 1 <= min_depth ({min_depth}) <= max_depth ({max_depth})")
        if not 0 < alpha <= 1:
            raise DaemonError(f"prefetch: alpha must be in (0, 1], got {alpha}")
        if dwell < 3:
            raise DaemonError(f"prefetch: dwell must be at least 3 samples, got {dwell}")
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
        self.gain_min = float(gain_min)
        self.queue_gain = float(queue_gain)
        self.dwell = int(dwell)
        self.need_slack = float(need_slack)
        self.need_band = float(need_band)
        self.stage_alpha = float(stage_alpha)
        self.throttle_clock_fraction = float(throttle_clock_fraction)
        self.need: int | None = None
        self._last_change_reason: str | None = None
        self._memory_level = 0
        self._hot = False
        self._pre: float | None = None
        self._exec: float | None = None
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
        # Recent (depth, throughput, queue p95) per sample, and the trial of a deeper step.
        self._recent: deque[tuple[int, float | None, float | None]] = deque(maxlen=self.dwell)
        self._trial: dict[str, Any] | None = None
        self.trials = 0
        self.trials_kept = 0

    # ------------------------------------------------------------------ signals

    def _throttled(self, sample: Sample) -> str | None:
        die = [v for k, v in sample.temps_c.items() if k not in NON_DIE_SENSORS]
        # Hysteresis of 3 C: a die hovering at the limit does not flip the flag every sample.
        hot_line = self.temp_limit_c - (3.0 if self._hot else 0.0)
        self._hot = bool(die) and max(die) >= hot_line
        if self._hot:
            return f"temperature {max(die):.1f} C >= {hot_line:.0f} C"
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

    def _start_trial(self, base_depth: int) -> None:
        """Remember throughput and queue delay at ``base_depth`` before stepping deeper."""
        base = [(t, q) for d, t, q in self._recent if d == base_depth]
        self.trials += 1
        self._trial = {
            "at": self.updates,
            "from": base_depth,
            "thr": [t for t, _ in base if t is not None],
            "q": [q for _, q in base if q is not None],
        }

    @staticmethod
    def _gain(before: list[float], after: list[float], higher_is_better: bool) -> tuple[float, float] | None:
        """Relative change of the mean (positive = better) and its noise: two standard errors of
        the difference of the means, relative to the mean before. None without data."""
        if len(before) < 2 or len(after) < 2:
            return None
        m0, m1 = statistics.fmean(before), statistics.fmean(after)
        if m0 <= 0:
            return None
        se = math.sqrt(statistics.variance(before) / len(before) + statistics.variance(after) / len(after))
        g = (m1 - m0) / m0 if higher_is_better else (m0 - m1) / m0
        return g, 2.0 * se / m0

    def _judge_trial(self, depth: int) -> str | None:
        """After ``dwell`` samples at a trial depth: None to keep it, else why to step back.

        The step is kept when it raised the mean completed throughput by ``gain_min`` or lowered
        the mean queue delay by ``queue_gain``, each by more than the noise (two standard errors
        of the difference of the means), so a lucky run of noisy samples does not count as a gain.
        """
        tr = self._trial
        if tr is None or self.updates - tr["at"] < self.dwell:
            return None
        self._trial = None
        # Leave out the samples while the pipeline was still filling to the new depth.
        now = [(t, q) for d, t, q in list(self._recent)[2:] if d == depth]
        judged: list[str] = []
        kept = False
        for label, before, after, higher, need in (
            ("throughput", tr["thr"], [t for t, _ in now if t is not None], True, self.gain_min),
            ("queue delay", tr["q"], [q for _, q in now if q is not None], False, self.queue_gain),
        ):
            res = self._gain(before, after, higher)
            if res is None:
                continue
            g, noise = res
            sign = 1 if higher else -1
            judged.append(f"{label} {sign * 100 * g:+.1f}% (noise {100 * noise:.1f}%)")
            kept |= g >= need and g > noise
        if not judged:
            kept = True  # nothing to judge by: keep the step the signals asked for
        if kept:
            self.trials_kept += 1
            log.debug("prefetch depth %d kept (%s)", depth, ", ".join(judged))
            return None
        return (f"depth {depth} bought too little over {tr['from']} ({', '.join(judged)}; "
                f"needs throughput +{100 * self.gain_min:.0f}% or queue delay -{100 * self.queue_gain:.0f}%)")

    def update(
        self,
        sample: Sample | None,
        queue_delay_p95_ms: float | None = None,
        latency_target_ms: float | None = None,
        **inputs: Any,
    ) -> int:
        """One control step from keyword arguments: ``step(sample, DepthInputs(...))``, spelled out.

        Args:
            sample (Sample | None): the latest telemetry.
            queue_delay_p95_ms (float | None): see :class:`~cuvil_edge.telemetry.control.DepthInputs`.
            latency_target_ms (float | None): see :class:`~cuvil_edge.telemetry.control.DepthInputs`.
            **inputs: the other fields of :class:`~cuvil_edge.telemetry.control.DepthInputs`.
        """
        return self.step(sample, DepthInputs(queue_delay_p95_ms, latency_target_ms, **inputs))

    def step(self, sample: Sample | None, inputs: DepthInputs) -> int:
        """Take one control step and return the depth to use.

        The step has four jobs, one method each: smooth and derive the signals (:meth:`_observe`),
        pick the strongest reason to move (:meth:`_propose`), weigh it against patience and cooldown
        (:meth:`_vote`), and record the decision (:meth:`_commit`).

        Args:
            sample (Sample | None): the latest telemetry (None when no source works: only queue
                delay and memory pressure are used then).
            inputs (DepthInputs): the daemon's measurements of the interval (queue delay, stage
                times, blocked share, completed rate, memory level).

        Returns:
            int: the new depth, within ``[min_depth, max_depth]``.
        """
        self.updates += 1
        self._since_change += 1
        if self._ceiling_left > 0:
            self._ceiling_left -= 1
            if self._ceiling_left == 0:
                self._ceiling = None
        sig = self._observe(sample, inputs)
        move = self._propose(sig, inputs)
        new, reason = self._vote(sig, move)
        return self._commit(sample, inputs, sig, move, new, reason)

    def _observe(self, sample: Sample | None, inputs: DepthInputs) -> _Signals:
        """Smooth the readings and derive what the decision needs: queue ratio, throttle, whether depth
        causes the queueing, the depth that keeps the device fed (Little's law) and the depth limit."""
        gpu_busy_pct, exec_ms, pre_ms = inputs.gpu_busy_pct, inputs.exec_ms, inputs.pre_ms
        queue_delay_p95_ms, latency_target_ms = inputs.queue_delay_p95_ms, inputs.latency_target_ms
        pre_workers = inputs.pre_workers
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
        waiting_batches: float | None = None
        if inputs.prefetch_wait_p95_ms is None:
            depth_hurts = True
            starving = False
        else:
            yardstick = exec_ms if exec_ms else 0.1 * (latency_target_ms or 100.0)
            waiting_batches = inputs.prefetch_wait_p95_ms / yardstick
            # One batch waiting behind the running one is what double buffering means (up to one
            # execution time, a little more with the spread of execution times); a p95 wait
            # halfway to a second execution is depth adding latency.
            depth_hurts = waiting_batches >= 1.5
            starving = waiting_batches < 0.25
        # What a deeper step is judged by: completed throughput, else our device occupancy.
        thr = inputs.completed_per_s if inputs.completed_per_s is not None else gpu_raw
        if pre_ms is not None and exec_ms:
            self._pre = _ewma(self._pre, pre_ms, self.stage_alpha)
            self._exec = _ewma(self._exec, exec_ms, self.stage_alpha)
        need: int | None = None
        need_down: int | None = None
        ratio_pe: float | None = None
        if self._pre is not None and self._exec:
            # A band against noise: deeper up to the depth that the ratio less the margin asks
            # for, shallower only down to the one the ratio plus the margin asks for.
            ratio_pe = self._pre / self._exec
            need = 1 + max(0, math.ceil(ratio_pe + self.need_slack))
            need_down = 1 + max(0, math.ceil(ratio_pe + self.need_slack + self.need_band))
            if pre_workers:
                need = min(need, int(pre_workers) + 1)
                need_down = min(need_down, int(pre_workers) + 1)
            need = min(self.max_depth, max(self.min_depth, need))
            need_down = min(self.max_depth, max(self.min_depth, need_down))
        self.need = need
        self._recent.append((self.depth, None if thr is None else float(thr), queue_delay_p95_ms))

        prev = self.depth
        # While throttled the pipeline keeps at most double buffering (``throttle_depth``): the
        # clocks are down, deeper would only queue more work and hold more memory. Double
        # buffering itself is kept only while the queue delay stays inside the latency objective.
        # The ceiling guards probes; with the stage times known nothing is probed, so none applies.
        limit = self.max_depth if (self._ceiling is None or need is not None) else min(self.max_depth, self._ceiling - 1)
        if throttle:
            # Hot, plan for the throttled clock before it falls: a slot kept for today's clock
            # would fill with one more full batch (memory, latency) as throughput falls under the
            # load, and the measured execution time lags the falling clock.
            hot_need: int | None = None
            if ratio_pe is not None:
                # Execution at the throttled clock f takes c/f times as long as at today's clock c
                # (as fractions of the maximum); below f the measured ratio stands.
                freq = sample.gpu_freq_mhz if sample is not None else None
                c = freq / self._gpu_freq_max if freq and self._gpu_freq_max else self.throttle_clock_fraction
                r = ratio_pe * min(1.0, self.throttle_clock_fraction / max(c, 1e-3))
                hot_need = 1 + max(0, math.ceil(r + self.need_slack))
            cap = self.throttle_depth if hot_need is None else max(self.throttle_depth, hot_need)
            limit = min(limit, max(self.min_depth, cap))
        if inputs.memory_level > 0:
            # No deeper while memory is short. With the stage times known there is no blind cut
            # either: the scheduler's cap (the depth whose batches fit in free RAM,
            # ``MemoryScheduler.prefetch_cap`` with ``batch_bytes``) bounds the depth applied, so a
            # level that holds does not halve again and again down to a starving pipeline.
            limit = min(limit, prev)
        blocked = inputs.depth_blocked_pct is None or inputs.depth_blocked_pct >= self.blocked_min_pct
        return _Signals(prev, gpu_raw, qratio, throttle, waiting_batches, depth_hurts, starving, need, need_down,
                        limit, blocked)

    def _propose(self, sig: _Signals, inputs: DepthInputs) -> _Move:
        """The strongest reason to move, in order: a hard cut (memory, queue over the target, heat),
        a soft step back (EMC, queue near the target), the depth the stage times ask for, a trial
        that bought nothing, or a probe deeper while the device starves."""
        move = _Move()
        prev, need, need_down, limit, throttle = sig.prev, sig.need, sig.need_down, sig.limit, sig.throttle
        qratio, depth_hurts, waiting_batches = sig.qratio, sig.depth_hurts, sig.waiting_batches
        memory_level = inputs.memory_level
        queue_delay_p95_ms, latency_target_ms = inputs.queue_delay_p95_ms, inputs.latency_target_ms
        if memory_level > 0 and need is None:
            move.hard = f"memory pressure level {memory_level}"
        elif qratio is not None and qratio >= 1.0 and depth_hurts and (need_down is None or prev > need_down):
            move.hard = f"queue p95 {queue_delay_p95_ms:.1f} ms >= target {latency_target_ms:.1f} ms"
            if waiting_batches is not None:
                # Keep one prepared batch waiting for the device, no more: that many slots too many.
                move.hard_to = prev - max(1, int(math.floor(waiting_batches - 1.0 + 0.5)))
                if need_down is not None:
                    # Under the depth that feeds the device the queue only grows (overload).
                    move.hard_to = max(move.hard_to, need_down)
        elif throttle and qratio is not None and qratio >= 1.0 and (need_down is None or prev > need_down):
            # Throttled, the latency objective comes before throughput: with the clocks down each
            # batch held ready behind the running one costs a (slowed) execution of latency.
            move.hard = f"{throttle}, queue p95 {queue_delay_p95_ms:.1f} ms >= target {latency_target_ms:.1f} ms"
            move.hard_to = min(prev - 1, limit)
        elif throttle and prev > limit and need is not None:
            move.hard, move.hard_to = throttle, limit
        elif throttle and prev > limit:
            move.soft = throttle
        elif self._emc is not None and self._emc >= self.emc_high_pct:
            move.soft = f"EMC {self._emc:.0f}% >= {self.emc_high_pct:.0f}%"
        elif self._qratio is not None and self._qratio >= self.queue_fraction and depth_hurts and (
                need_down is None or prev > need_down):
            move.soft = f"queue p95 at {100 * self._qratio:.0f}% of the target"
        elif need is not None:
            self._trial = None
            self._fit(sig, inputs, move)
        else:
            move.knee = self._judge_trial(prev)
            if move.knee is None and self._trial is None and (
                self._gpu is not None
                and self.idle_pct < self._gpu < self.gpu_util_target - self.deadband_pct
                and (self._emc is None or self._emc < self.emc_high_pct - 10.0)
                # With the prefetch wait known, only a starving device gains from one more slot: a
                # prepared batch that already waits for the device would just have company.
                and (sig.starving if inputs.prefetch_wait_p95_ms is not None
                     else (self._qratio is None or self._qratio < self.queue_fraction / 2))
                and (inputs.depth_blocked_pct is None or inputs.depth_blocked_pct >= self.blocked_min_pct)
                # Throttled, deeper only while the queue delay is well inside the objective.
                and not (throttle and self._qratio is not None and self._qratio >= self.queue_fraction)
            ):
                move.up = f"GPU {self._gpu:.0f}% under target {self.gpu_util_target:.0f}%"
        if move.hard or move.soft:
            self._trial = None
        return move

    def _fit(self, sig: _Signals, inputs: DepthInputs, move: _Move) -> None:
        """With the stage times known: move to the depth that keeps the device fed (Little's law)."""
        prev, need, limit, throttle = sig.prev, sig.need, sig.limit, sig.throttle
        assert need is not None
        ratio = f"prepare {self._pre:.1f} ms / execute {self._exec:.1f} ms"
        # Light load: the device has time to spare, so requests that wait for a slot wait for
        # preparation, and one slot past ``need`` prepares one more batch at once (lower
        # latency; the batches stay small, so it holds little memory). Never while memory is
        # short, the board is hot or the memory bus is busy.
        # The spare slot is taken while requests wait for a slot and kept while the load stays
        # light (a slot that stops requests waiting must not be given back for doing so).
        # The raw reading too, not only the smoothed one: the smoothing lags a sudden overload.
        light = (self._gpu is not None and self._gpu < self.gpu_util_target - self.deadband_pct
                 and sig.gpu_raw is not None and sig.gpu_raw < self.gpu_util_target - self.deadband_pct
                 and (self._emc is None or self._emc < self.emc_high_pct - 10.0)
                 and inputs.memory_level == 0 and not throttle
                 # and requests are served well inside the objective (an overloaded device
                 # sharing its time with another process can read under the target too)
                 and (sig.qratio is None or sig.qratio < self.queue_fraction)
                 and (self._qratio is None or self._qratio < self.queue_fraction))
        spare = light and sig.blocked
        pre_workers = inputs.pre_workers
        workers_cap = int(pre_workers) + 1 if pre_workers else self.max_depth
        top = max(need, min(need + 1 if spare else need, workers_cap, limit, self.max_depth))
        keep = max(need, min(need + 1 if light else need, workers_cap, limit, self.max_depth))
        down_to = max(sig.need_down or need, keep)
        if prev < min(top, limit) and sig.blocked and (self._emc is None or self._emc < self.emc_high_pct) \
                and not (throttle and self._qratio is not None and self._qratio >= self.queue_fraction):
            move.fit_to = min(top, limit)
            extra = ", light load: one spare slot" if move.fit_to > need else ""
            move.fit = f"depth {move.fit_to} keeps the device fed ({ratio}{extra})"
        elif prev > down_to and (spare or (sig.waiting_batches is not None and sig.depth_hurts)):
            move.fit_to = down_to
            move.fit = f"depth {down_to} keeps the device fed, a prepared batch waits ({ratio})"

    def _vote(self, sig: _Signals, move: _Move) -> tuple[int, str]:
        """Weigh the proposal: hard cuts at once, other moves after ``patience`` agreeing samples and
        ``cooldown`` samples since the last change. Returns the new depth and why."""
        prev, limit = sig.prev, sig.limit
        new = prev
        reason = "hold"
        if move.hard:
            self._up_votes = 0
            self._down_votes = 0
            if prev > self.min_depth:
                target = prev // 2 if move.hard_to is None else move.hard_to
                new = min(prev - 1, max(self.min_depth, target))
                reason = f"cut: {move.hard}"
            else:
                reason = f"at minimum: {move.hard}"
        elif move.soft:
            self._up_votes = 0
            self._down_votes += 1
            if self._down_votes >= self.patience_down and self._since_change > self.cooldown and prev > self.min_depth:
                new = prev - 1
                reason = f"shallower: {move.soft}"
                self._down_votes = 0
            else:
                reason = f"hold ({move.soft}, {self._down_votes}/{self.patience_down})"
        elif move.fit:
            want = move.fit_to if move.fit_to is not None else prev
            if want > prev:
                self._down_votes = 0
                self._up_votes += 1
                # Measured stage times, not a guess: one sample suffices (requests wait meanwhile).
                if self._since_change > self.cooldown:
                    new, reason, self._up_votes = want, f"deeper: {move.fit}", 0
                else:
                    reason = f"hold ({move.fit}, cooldown)"
            else:
                self._up_votes = 0
                self._down_votes += 1
                if self._down_votes >= self.patience_down and self._since_change > self.cooldown:
                    new, reason, self._down_votes = max(self.min_depth, want), f"shallower: {move.fit}", 0
                else:
                    reason = f"hold ({move.fit}, {self._down_votes}/{self.patience_down})"
        elif move.knee:
            self._up_votes = 0
            self._down_votes = 0
            new = max(self.min_depth, prev - 1)
            reason = f"back: {move.knee}"
        elif move.up:
            self._down_votes = 0
            self._up_votes += 1
            if prev >= limit:
                reason = f"hold at limit {limit}{' (throttled)' if sig.throttle else ''} ({move.up})"
            elif self._up_votes >= self.patience_up and self._since_change > self.cooldown:
                new = prev + 1
                reason = f"deeper: {move.up}"
                self._up_votes = 0
                self._start_trial(prev)
            else:
                reason = f"hold ({move.up}, {self._up_votes}/{self.patience_up})"
        else:
            self._up_votes = 0
            self._down_votes = 0
            if self._trial is not None:
                reason = f"hold (trial of depth {prev}, {self.updates - self._trial['at']}/{self.dwell})"
        return new, reason

    def _commit(self, sample: Sample | None, inputs: DepthInputs, sig: _Signals, move: _Move, new: int,
                reason: str) -> int:
        """Apply the new depth, remember a cut edge as a ceiling, log and keep the decision."""
        prev = sig.prev
        self._memory_level = int(inputs.memory_level)
        direction = (new > prev) - (new < prev)
        if direction:
            if direction < 0 and not move.fit:
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
            self._recent.clear()
            self._last_change_reason = reason
        decision = PrefetchDecision(
            timestamp=sample.timestamp if sample is not None else math.nan,
            depth=new,
            previous=prev,
            direction=direction,
            reason=reason,
            gpu_util_pct=None if self._gpu is None else round(self._gpu, 2),
            emc_util_pct=None if self._emc is None else round(self._emc, 2),
            queue_delay_p95_ms=inputs.queue_delay_p95_ms,
            latency_target_ms=inputs.latency_target_ms,
            memory_level=int(inputs.memory_level),
            throttled=sig.throttle is not None,
            need=sig.need,
        )
        self.decisions.append(decision)
        if direction:
            log.info("prefetch depth %d -> %d: %s (inputs %s)", prev, new, reason, decision.to_dict())
        else:
            log.debug("prefetch depth %d: %s", new, reason)
        return new

    @property
    def last_change_reason(self) -> str | None:
        """Why the depth last changed (None before the first change)."""
        for d in reversed(self.decisions):
            if d.direction:
                return d.reason
        return self._last_change_reason

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
            "trials": self.trials,
            "trials_kept": self.trials_kept,
            "need": self.need,
            "last_reason": last.reason if last else None,
            "last_change_reason": self.last_change_reason,
        }
