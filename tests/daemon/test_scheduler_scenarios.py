"""The schedulers driven by replayed real tegrastats logs and by the simulator's scenarios.

The simulator (``cuvil_edge.telemetry.sim`` + ``pipeline_sim``) models a board and a camera pipeline
from documented figures and stated assumptions; these tests check the schedulers' *behaviour* in
it (no budget overrun, no OOM, depth settles), not performance claims.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil_edge.daemon.scheduler import MemoryScheduler, PrefetchController, PressureLevel
from cuvil_edge.telemetry import ReplaySource, SimulatedBoard
from cuvil_edge.telemetry.pipeline_sim import PipelineSim, Workload

DATA = Path(__file__).resolve().parents[1] / "data" / "tegrastats"
MiB = 1024 * 1024


def adaptive(board: SimulatedBoard, **kw) -> tuple[PipelineSim, MemoryScheduler, PrefetchController]:
    sched = MemoryScheduler(target=board.target, reserve_mb=256)
    ctl = PrefetchController(1, 8)
    return PipelineSim(board, kw.pop("workload", None), controller=ctl, scheduler=sched, seed=3, **kw), sched, ctl


def direction_changes(depths: list[int]) -> int:
    dirs = [(b > a) - (b < a) for a, b in zip(depths, depths[1:]) if b != a]
    return sum(1 for a, b in zip(dirs, dirs[1:]) if a != b)


class TestReplayedRealLogs:
    def test_ladder_follows_recorded_lines(self) -> None:
        """Replay the recorded AGX Orin lines: the 95%-full one climbs the ladder, the idle ones
        bring it down step by step."""
        src = ReplaySource(DATA / "orin_jp6.log", speed=0, loop=True)
        pressured = src.read()
        s = MemoryScheduler(int(pressured.ram_total_mb * MiB), reserve_mb=1024)
        steps: list[str] = []
        for lvl in PressureLevel:
            if lvl:
                s.on_step(lvl, lambda lvl=lvl, **_: steps.append(lvl.name))
        assert s.update(pressured) == PressureLevel.RELEASE_IDLE  # 5.2% free, lfb 3x4MB
        assert steps == ["SHRINK_PREFETCH", "CAP_BATCH", "RELEASE_IDLE"]
        levels = []
        for i in range(40):  # then the idle AGX Orin line, again and again
            sample = src.read()
            if sample.ram_used_mb != 2448:
                continue
            sample.ram_total_mb = pressured.ram_total_mb  # same board size, idle load
            sample.timestamp = pressured.timestamp + i  # one line a second
            levels.append(s.update(sample))
        assert levels[-1] == PressureLevel.NORMAL
        assert all(a >= b for a, b in zip(levels, levels[1:]))

    def test_prefetch_on_thor_log_uses_own_busy_time(self) -> None:
        """Thor lines carry no GPU utilization: the controller relies on the daemon's busy time."""
        ctl = PrefetchController(1, 8)
        for sample in ReplaySource(DATA / "thor_jp7.log", speed=0, loop=False).samples * 5:
            ctl.update(sample, 10, 100, gpu_busy_pct=70, depth_blocked_pct=60)
        assert ctl.depth > 2 and ctl.last_decision.gpu_util_pct == pytest.approx(70, abs=1)

    def test_replay_through_the_tegrastats_parser_at_speed(self) -> None:
        src = ReplaySource(DATA / "tx1_jp3_l4t28.log", speed=0)
        s = MemoryScheduler(int(3983 * MiB), reserve_mb=256)
        # 12.9% then 9.4% free on a 4 GB TX1 (two consecutive recorded lines).
        assert [s.update(x) for x in src] == [PressureLevel.NORMAL, PressureLevel.SHRINK_PREFETCH]


class TestSimulatedScenarios:
    def test_gpu_saturation_by_another_process(self) -> None:
        board = SimulatedBoard("orin-nano-8gb", seed=1, noise_pct=3)
        board.gpu_saturation(start=20, duration=40, fraction=0.5)
        sim, sched, ctl = adaptive(board)
        res = sim.run(80)
        fixed8 = PipelineSim(_board_gpu_sat(), depth=8, seed=3).run(80)
        assert res.oom_events == 0 and res.budget_overruns == 0
        assert res.p99_ms < fixed8.p99_ms
        assert res.throughput_fps >= 0.9 * fixed8.throughput_fps
        depths = [x["depth"] for x in res.trace]
        assert direction_changes(depths) <= 6
        during = depths[int(30 / sim.dt):int(60 / sim.dt)]
        assert max(during) <= 3  # overload: double buffering, not a deep queue

    def test_memory_squeeze_by_another_process(self) -> None:
        def board() -> SimulatedBoard:
            b = SimulatedBoard("orin-nano-8gb", seed=2, noise_pct=3)
            b.gpu_saturation(start=10, duration=50, fraction=0.4)
            b.memory_squeeze(start=20, duration=40, mb=6400, ramp_s=10)
            return b

        fixed = PipelineSim(board(), depth=8, seed=3).run(70)
        sim, sched, ctl = adaptive(board())
        res = sim.run(70)
        assert fixed.oom_events >= 1  # the deep fixed pipeline is killed by the OOM killer
        assert res.oom_events == 0 and res.budget_overruns == 0
        assert res.peak_board_used_mb < board().total_mb
        assert sched.steps_total["SHRINK_PREFETCH"] >= 1
        squeezed = [x for x in res.trace if 32 <= x["t"] < 60]
        assert max(x["depth"] for x in squeezed) <= 2
        assert res.throughput_fps > fixed.throughput_fps

    def test_thermal_throttle(self) -> None:
        board = SimulatedBoard("orin-nano-8gb", seed=4, noise_pct=3)
        board.thermal_throttle(start=0, duration=200, ambient_rise_c=50)
        sim, sched, ctl = adaptive(board)
        res = sim.run(200)
        hot = [x for x in res.trace if x["temp_c"] >= ctl.temp_limit_c]
        assert hot, "the scenario must reach the throttling temperature"
        first_hot = hot[0]["t"]
        later = [x["depth"] for x in res.trace if x["t"] >= first_hot + 10]
        assert max(later) <= ctl.throttle_depth
        assert direction_changes([x["depth"] for x in res.trace]) <= 6
        assert res.oom_events == 0

    def test_no_deeper_than_pays(self) -> None:
        """60 fps on a cool, idle board: double buffering already keeps up, so the controller stays at
        2 (a third slot would only hold a batch waiting for the device) and loses nothing to depth 4."""
        def board() -> SimulatedBoard:
            return SimulatedBoard("orin-nano-8gb", seed=6, noise_pct=3)

        sim, sched, ctl = adaptive(board())
        res = sim.run(60)
        fixed4 = PipelineSim(board(), depth=4, seed=3).run(60)
        assert max(x["depth"] for x in res.trace) == 2
        assert res.throughput_fps >= 0.99 * fixed4.throughput_fps
        assert res.p99_ms <= 1.1 * fixed4.p99_ms

    def test_depth_converges_in_steady_load(self) -> None:
        board = SimulatedBoard("orin-nano-8gb", seed=5, noise_pct=5)
        sim, sched, ctl = adaptive(board, workload=Workload(fps=36.0))  # 72 fps: just over capacity
        res = sim.run(120)
        depths = [x["depth"] for x in res.trace]
        tail = depths[len(depths) // 2:]
        assert max(tail) - min(tail) <= 1
        assert direction_changes(depths) <= 4


def _board_gpu_sat() -> SimulatedBoard:
    b = SimulatedBoard("orin-nano-8gb", seed=1, noise_pct=3)
    b.gpu_saturation(start=20, duration=40, fraction=0.5)
    return b
