"""PrefetchController: the rules of issue #4, hysteresis against noise, decision log."""

from __future__ import annotations

import json
import logging
import random

import pytest

from cuvil_edge.daemon.scheduler import PrefetchController
from cuvil_edge.errors import DaemonError
from cuvil_edge.telemetry import Sample


def s(gpu: float | None = 50.0, emc: float | None = 20.0, temp: float = 50.0, freq: float | None = 625.0,
      power: float | None = None, t: float = 0.0) -> Sample:
    return Sample(
        timestamp=t, gpu_util_pct=gpu, emc_util_pct=emc, gpu_freq_mhz=freq, temps_c={"tj": temp, "PMIC": 100.0},
        power_mw={} if power is None else {"VDD_IN": {"cur": power, "avg": power}},
    )


def run(ctl: PrefetchController, n: int, **kw) -> list[int]:
    sample = kw.pop("sample", None) or s()
    return [ctl.update(sample, **kw) for _ in range(n)]


def world(ctl: PrefetchController, n: int, fps, queue_ms=lambda d: 5.0, target: float = 100, **kw) -> list[int]:
    """Drive ``ctl`` for ``n`` samples against a pipeline whose completed throughput and queue delay
    are functions of the depth the controller chose (a toy, deterministic world)."""
    sample = kw.pop("sample", None) or s()
    depths = []
    for _ in range(n):
        d = ctl.depth
        depths.append(ctl.update(sample, queue_ms(d), target, completed_per_s=fps(d), **kw))
    return depths


class TestDeeper:
    def test_goes_deeper_while_gpu_under_target_and_blocked(self) -> None:
        ctl = PrefetchController(1, 8)
        depths = world(ctl, 120, fps=lambda d: 10.0 * d, depth_blocked_pct=50)
        assert depths[-1] == 8 and depths == sorted(depths)
        assert ctl.direction_changes == 0 and ctl.trials == ctl.trials_kept == 6

    def test_stops_at_the_knee(self) -> None:
        """Throughput grows up to depth 4 and is flat beyond: the controller tries 5 once, steps back
        and sits at 4 (the shallowest depth within gain_min of the best), re-trying 5 rarely."""
        ctl = PrefetchController(1, 8)
        depths = world(ctl, 400, fps=lambda d: 10.0 * min(d, 4), depth_blocked_pct=50)
        assert max(depths) == 5 and depths[-1] == 4
        assert sum(1 for d in depths if d == 5) < 0.1 * len(depths)
        trials_of_5 = sum(1 for a, b in zip(depths, depths[1:]) if b == 5 > a)
        assert 1 <= trials_of_5 <= 4  # the ceiling's lifetime doubles each time 5 buys nothing
        assert "depth 5 bought too little over 4" in "".join(x.reason for x in ctl.decisions)

    def test_a_small_gain_is_not_worth_a_slot(self) -> None:
        ctl = PrefetchController(1, 8)
        depths = world(ctl, 200, fps=lambda d: 100.0 + 2.0 * d, depth_blocked_pct=50)  # +2% per step
        assert depths[-1] == 2 and max(depths) == 3

    def test_a_step_that_lowers_queue_delay_is_kept(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=1)
        depths = world(ctl, 200, fps=lambda d: 60.0, queue_ms=lambda d: {1: 24.0, 2: 8.0}.get(d, 7.5),
                       depth_blocked_pct=50)
        assert depths[-1] == 2 and max(depths) == 3

    def test_not_deeper_when_a_prepared_batch_already_waits_for_the_device(self) -> None:
        # Double buffering works (a ready batch waits ~one execution): a third slot adds only waiting.
        ctl = PrefetchController(1, 8)
        depths = run(ctl, 40, sample=s(gpu=80), queue_delay_p95_ms=50, latency_target_ms=400,
                     depth_blocked_pct=100, prefetch_wait_p95_ms=19.0, exec_ms=20.0)
        assert set(depths) == {2}
        # The same with a starving device (batches start the moment they are ready): deeper.
        ctl = PrefetchController(1, 8)
        depths = run(ctl, 5, sample=s(gpu=80), queue_delay_p95_ms=50, latency_target_ms=400,
                     depth_blocked_pct=100, prefetch_wait_p95_ms=0.0, exec_ms=20.0)
        assert depths[-1] == 3

    def test_patience_one_step_at_a_time(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=2)
        depths = run(ctl, 3, queue_delay_p95_ms=5, latency_target_ms=100)
        assert depths == [2, 2, 3]

    def test_not_deeper_when_nothing_waits(self) -> None:
        ctl = PrefetchController(1, 8)
        assert run(ctl, 30, depth_blocked_pct=0.0)[-1] == 2  # GPU idle for lack of load, not of depth

    def test_not_deeper_when_idle(self) -> None:
        ctl = PrefetchController(1, 8)
        assert run(ctl, 30, sample=s(gpu=0.0))[-1] == 2  # no load at all: depth is irrelevant

    def test_not_deeper_when_gpu_at_target(self) -> None:
        ctl = PrefetchController(1, 8)
        assert run(ctl, 30, sample=s(gpu=99), depth_blocked_pct=100)[-1] == 2

    def test_uses_the_daemons_own_busy_time_when_given(self) -> None:
        ctl = PrefetchController(1, 8)
        thor = s(gpu=None)  # Thor's tegrastats prints no GPU utilization
        assert run(ctl, 10, sample=thor)[-1] == 2  # unknown: hold
        assert run(ctl, 10, sample=thor, gpu_busy_pct=60, depth_blocked_pct=80)[-1] > 2
        # GR3D at 100% because of another process, our own occupancy 80%: ours decides.
        ctl2 = PrefetchController(1, 8)
        assert run(ctl2, 10, sample=s(gpu=100), gpu_busy_pct=80, depth_blocked_pct=80)[-1] > 2


class TestShallower:
    def test_memory_pressure_halves_at_once(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=8)
        assert ctl.update(s(), memory_level=1) == 4
        assert ctl.update(s(), memory_level=2) == 2
        assert ctl.update(s(), memory_level=3) == 1
        assert ctl.update(s(), memory_level=3) == 1
        assert ctl.last_decision.reason.startswith("at minimum")

    def test_queue_over_target_cuts_when_depth_is_to_blame(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=8)
        assert ctl.update(s(), 120, 100, prefetch_wait_p95_ms=90, exec_ms=20) == 4

    def test_queue_over_target_from_overload_upstream_does_not_cut(self) -> None:
        # Batches start as soon as they are ready: depth is not what makes requests wait.
        ctl = PrefetchController(1, 8, initial_depth=2)
        depths = run(ctl, 20, sample=s(gpu=100), queue_delay_p95_ms=500, latency_target_ms=100,
                     prefetch_wait_p95_ms=1.0, exec_ms=40)
        assert set(depths) == {2}

    def test_queue_threatening_target_steps_down_after_patience(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=6)
        depths = run(ctl, 6, sample=s(gpu=99), queue_delay_p95_ms=70, latency_target_ms=100)
        assert depths[0] == 6 and depths[1] == 5 and depths[-1] < 5

    def test_emc_saturation(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=6)
        depths = run(ctl, 12, sample=s(gpu=60, emc=95), depth_blocked_pct=100)
        assert depths[-1] < 6 and "EMC" in ctl.decisions[1].reason

    def test_thermal_throttle_caps_at_double_buffering(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=6)
        depths = run(ctl, 20, sample=s(gpu=60, temp=96.0), depth_blocked_pct=100)
        assert depths[-1] == 2 and all(d >= 2 for d in depths)
        assert ctl.last_decision.throttled

    def test_throttled_the_latency_objective_comes_first(self) -> None:
        # Hot board, queue delay over the objective even with double buffering working: one slot.
        ctl = PrefetchController(1, 8, initial_depth=2)
        hot = s(gpu=95, temp=96.0)
        depths = run(ctl, 20, sample=hot, queue_delay_p95_ms=480, latency_target_ms=400, depth_blocked_pct=100,
                     prefetch_wait_p95_ms=200, exec_ms=210)
        assert depths[0] == 1 and set(depths) == {1} and "queue p95" in ctl.decisions[0].reason
        # At depth 1 the device starves (no prepared batch waits) but the queue delay is still 70% of
        # the objective: no deeper while throttled ...
        depths = run(ctl, 20, sample=hot, queue_delay_p95_ms=280, latency_target_ms=400, depth_blocked_pct=100,
                     prefetch_wait_p95_ms=0, exec_ms=210)
        assert set(depths) == {1}
        # ... whereas a cool board with the same figures goes back to double buffering (and keeps it:
        # the second slot buys 10% throughput).
        ctl = PrefetchController(1, 8, initial_depth=1)
        depths = world(ctl, 30, fps=lambda d: 34.0 if d == 1 else 37.4, queue_ms=lambda d: 280.0 if d == 1 else 480.0,
                       target=400, sample=s(gpu=85), depth_blocked_pct=100, prefetch_wait_p95_ms=0, exec_ms=210)
        assert depths[-1] == 2 and ctl.trials_kept == 1

    def test_pmic_placeholder_is_not_a_temperature(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=6)
        run(ctl, 5, sample=s(gpu=99, temp=50.0))  # PMIC@100C in every sample
        assert not ctl.last_decision.throttled

    def test_clock_pulled_down_while_busy_is_throttling(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=4)
        ctl.update(s(gpu=99, freq=625))
        assert run(ctl, 6, sample=s(gpu=99, freq=312))[-1] == 2

    def test_power_limit(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=5, power_limit_mw=15000)
        assert run(ctl, 12, sample=s(gpu=99, power=14900))[-1] == 2


class TestHysteresis:
    def test_noisy_samples_around_the_target_do_not_oscillate(self) -> None:
        rng = random.Random(7)
        ctl = PrefetchController(1, 8)
        depths = []
        for i in range(600):
            # GPU hovers around the target; EMC and queue noisy but comfortable.
            sample = s(gpu=min(100, max(0, rng.gauss(95, 4))), emc=rng.gauss(50, 10), t=float(i))
            depths.append(ctl.update(sample, rng.uniform(5, 45), 100, depth_blocked_pct=rng.uniform(0, 40)))
        # Deeper buys nothing here: every trial is stepped back from (noise is not a gain) ...
        assert ctl.trials >= 1 and ctl.trials_kept == 0
        assert all(d in (2, 3) for d in depths)
        # ... and the same edge is re-tried less and less often (its ceiling lifetime doubles).
        ups = [i for i, (a, b) in enumerate(zip(depths, depths[1:])) if b > a]
        gaps = [b - a for a, b in zip(ups, ups[1:])]
        assert all(g >= ctl.ceiling_ttl * 2**k for k, g in enumerate(gaps)) and len(ups) <= 5, depths
        assert ctl.direction_changes <= 2 * len(ups)
        assert len(set(depths[-200:])) <= 2

    def test_edge_is_not_probed_again_and_again(self) -> None:
        """Each depth up to 4 buys throughput, depth 5 puts the queue over target (depth to blame):
        the controller settles at 4 and re-tests 5 less and less often."""
        ctl = PrefetchController(1, 8, initial_depth=4)
        depths = []
        for i in range(300):
            d = ctl.depth
            q = 150 if d >= 5 else 20
            depths.append(ctl.update(s(gpu=80, t=float(i)), q, 100, depth_blocked_pct=50, completed_per_s=10.0 * d,
                                     prefetch_wait_p95_ms=32.0 if d >= 5 else 2.0, exec_ms=20))
        probes = sum(1 for a, b in zip(depths, depths[1:]) if b >= 5 > a)
        assert 1 <= probes <= 4  # the edge is re-tested, less and less often (ceiling lifetime doubles)
        assert sum(1 for d in depths if d >= 5) < 0.03 * len(depths)
        assert depths[-1] == 4 and min(depths) == 4

    def test_queue_over_target_cuts_to_the_depth_that_keeps_one_batch_waiting(self) -> None:
        # Depth 8, a prepared batch waits ~7 executions: 2 slots keep the device fed (shrink fast).
        ctl = PrefetchController(1, 8, initial_depth=8)
        assert ctl.update(s(gpu=99), 900, 400, prefetch_wait_p95_ms=7.0 * 100, exec_ms=100) == 2
        # Without the prefetch wait the cut halves.
        ctl = PrefetchController(1, 8, initial_depth=8)
        assert ctl.update(s(gpu=99), 900, 400) == 4


class TestLogAndMetrics:
    def test_each_change_is_logged_with_its_inputs(self, caplog: pytest.LogCaptureFixture) -> None:
        ctl = PrefetchController(1, 8, initial_depth=8)
        with caplog.at_level(logging.INFO, logger="cuvil_edge.daemon.scheduler.prefetch"):
            ctl.update(s(gpu=42.0), 10, 100, memory_level=2)
        assert "prefetch depth 8 -> 4: cut: memory pressure level 2" in caplog.text
        assert "'gpu_util_pct': 42.0" in caplog.text and "'memory_level': 2" in caplog.text
        d = ctl.last_decision.to_dict()
        assert d["previous"] == 8 and d["depth"] == 4 and d["direction"] == -1

    def test_snapshot(self) -> None:
        ctl = PrefetchController(2, 6)
        ctl.update(None, 10, 100)
        snap = ctl.snapshot()
        json.dumps(snap)
        assert snap["depth"] == 2 and snap["min_depth"] == 2 and snap["max_depth"] == 6 and snap["updates"] == 1

    def test_no_telemetry_still_works(self) -> None:
        ctl = PrefetchController(1, 8, initial_depth=4)
        assert ctl.update(None, 200, 100) == 2  # queue over target, blamed on depth: cut

    def test_bad_arguments(self) -> None:
        with pytest.raises(DaemonError, match="min_depth"):
            PrefetchController(3, 2)
        with pytest.raises(DaemonError, match="alpha"):
            PrefetchController(alpha=0)
