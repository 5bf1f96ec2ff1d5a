"""MemoryScheduler: budget, admission, measurement, pressure ladder; placement policy."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.daemon.scheduler import (
    MemoryBudgetError,
    MemoryScheduler,
    PressureLevel,
    placement_policy,
)
from cuvil_edge.errors import DaemonError
from cuvil_edge.targets import get_target
from cuvil_edge.telemetry import Sample, load_log

DATA = Path(__file__).resolve().parents[1] / "data" / "tegrastats"
MiB = 1024 * 1024


def sample(used_mb: float, total_mb: float = 8192, **kw) -> Sample:
    kw.setdefault("lfb_count", 500)
    kw.setdefault("lfb_size_kb", 4096)
    return Sample(timestamp=kw.pop("t", 0.0), ram_used_mb=used_mb, ram_total_mb=total_mb, **kw)


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    """A real ONNX model with a 1 MiB weight (Gemm 512x512 float32)."""
    w = numpy_helper.from_array(np.zeros((512, 512), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 512])], [w],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


class TestBudget:
    def test_budget_is_ram_minus_reserve_minus_others(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.admit("a", 1000 * MiB)
        s.measure("a", 1000 * MiB)
        s.update(sample(used_mb=5000))  # 1000 of the 5000 MB are ours
        assert s.other_bytes == 4000 * MiB
        assert s.budget_bytes == (8192 - 512 - 4000) * MiB
        assert s.headroom_bytes == s.budget_bytes - 1000 * MiB

    def test_unmeasured_reservations_do_not_count_as_resident(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.admit("loading", 1000 * MiB)  # reserved, not loaded yet: not in ram_used
        s.update(sample(used_mb=3000))
        assert s.other_bytes == 3000 * MiB and s.used_bytes == 1000 * MiB

    def test_defaults_from_target(self) -> None:
        s = MemoryScheduler(target=get_target("orin-nano-4gb"))
        assert s.total_bytes == 4 * 1024 * MiB and s.reserve_bytes == 512 * MiB

    def test_bad_reserve(self) -> None:
        with pytest.raises(DaemonError, match="reserve"):
            MemoryScheduler(1024 * MiB, reserve_mb=2048)


class TestAdmission:
    def test_refuses_what_does_not_fit_with_the_figures(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.update(sample(used_mb=6000))
        s.admit("small", 500 * MiB)
        with pytest.raises(MemoryBudgetError, match=r"cannot load 'big': needs 2000.0 MiB but 1180.0 MiB") as ei:
            s.admit("big", 2000 * MiB)
        assert isinstance(ei.value, DaemonError)
        assert ei.value.needed == 2000 * MiB and ei.value.available == 1180 * MiB
        assert s.rejected_admissions == 1 and "big" not in s.snapshot()["models"]

    def test_measure_then_release(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.admit("m", 800 * MiB)
        s.measure("m", 650 * MiB)
        assert s.used_bytes == 650 * MiB
        s.release("m")
        assert s.used_bytes == 0
        s.release("m")  # idempotent
        with pytest.raises(DaemonError, match="no memory reservation named 'x'"):
            s.measure("x", 1)

    def test_readmission_replaces_the_old_figure(self) -> None:
        s = MemoryScheduler(4096 * MiB, reserve_mb=512)
        s.admit("m", 3000 * MiB)
        s.admit("m", 3500 * MiB)  # a new version of the same name replaces the old one
        assert s.used_bytes == 3500 * MiB

    def test_real_pressure_line_refuses_a_load(self) -> None:
        # AGX Orin 32GB at 95% RAM, lfb 3x4MB, 4.9 GB swap (DataDog's recorded r36 line).
        pressured, idle, _ = load_log(DATA / "orin_jp6.log")
        s = MemoryScheduler(int(pressured.ram_total_mb * MiB), reserve_mb=1024)
        assert s.update(pressured) >= PressureLevel.CAP_BATCH
        with pytest.raises(MemoryBudgetError):
            s.admit("detector", 2048 * MiB)
        s2 = MemoryScheduler(int(idle.ram_total_mb * MiB), reserve_mb=1024)
        assert s2.update(idle) == PressureLevel.NORMAL
        s2.admit("detector", 2048 * MiB)

    def test_estimate_footprint_of_a_real_model(self, tiny_onnx: Path) -> None:
        weights = tiny_onnx.stat().st_size
        est = MemoryScheduler.estimate_footprint(tiny_onnx, max_batch=8, prefetch_depth=3, io_bytes_per_item=4096)
        expected_io = 4096 * 8 * 4
        expected_ws = 48 * MiB + weights // 2 + int(4.0 * 4096 * 8)
        assert est == weights + expected_ws + expected_io
        deeper = MemoryScheduler.estimate_footprint(tiny_onnx, max_batch=8, prefetch_depth=7, io_bytes_per_item=4096)
        assert deeper - est == 4096 * 8 * 4

    def test_estimate_footprint_of_a_bundle_dir(self, tiny_onnx: Path) -> None:
        (tiny_onnx.parent / "manifest.json").write_text(json.dumps(
            {"name": "tiny", "version": "1", "inputs": [], "outputs": [], "model": tiny_onnx.name}))
        a = MemoryScheduler.estimate_footprint(tiny_onnx.parent, 1, 1, 10, workspace_bytes=0)
        assert a == tiny_onnx.stat().st_size + 20
        with pytest.raises(DaemonError, match="no such model file"):
            MemoryScheduler.estimate_footprint(tiny_onnx.parent / "nope.onnx", 1, 1, 1)
        with pytest.raises(DaemonError, match="max_batch"):
            MemoryScheduler.estimate_footprint(tiny_onnx, 0, 1, 1)


class TestPressureLadder:
    def test_levels_from_free_ram(self) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        total = 10000
        for free_pct, level in [(50, 0), (9, 1), (6, 2), (4.5, 3), (3, 4), (1.5, 5)]:
            s2 = MemoryScheduler(10000 * MiB, reserve_mb=0)
            assert s2.update(sample(used_mb=total * (1 - free_pct / 100), total_mb=total)) == level, free_pct
        assert s.update(sample(used_mb=1000, total_mb=total)) == PressureLevel.NORMAL

    def test_fragmentation_and_swap_growth_raise_the_level(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=0)
        # Alone, few large blocks mean nothing (an idle Orin reports "lfb 2x4MB")...
        assert s.update(sample(4000, lfb_count=3, lfb_size_kb=4096)) == PressureLevel.NORMAL
        # ... but with RAM short they make it worse by one step.
        s = MemoryScheduler(8192 * MiB, reserve_mb=0)
        assert s.update(sample(8192 * 0.92, lfb_count=3, lfb_size_kb=4096)) == PressureLevel.CAP_BATCH
        s = MemoryScheduler(8192 * MiB, reserve_mb=0)
        s.update(sample(4000, swap_used_mb=0, t=0.0))
        assert s.update(sample(4000, swap_used_mb=100, t=1.0)) == PressureLevel.SHRINK_PREFETCH
        assert s.swap_growth_mb_s == 100

    def test_rises_at_once_falls_one_step_after_calm_samples(self) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        assert s.update(sample(9850, total_mb=10000)) == PressureLevel.REJECT
        levels = [s.update(sample(1000, total_mb=10000)) for _ in range(16)]
        assert levels[:2] == [PressureLevel.REJECT] * 2
        assert levels[2] == PressureLevel.UNLOAD_LRU
        assert levels[-1] == PressureLevel.NORMAL
        assert all(a >= b for a, b in zip(levels, levels[1:]))  # never back up on calm samples

    def test_exit_needs_a_margin(self) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        s.update(sample(9100, total_mb=10000))  # 9% free: SHRINK_PREFETCH
        for _ in range(10):
            assert s.update(sample(8950, total_mb=10000)) == PressureLevel.SHRINK_PREFETCH  # 10.5% < 10+2
        for _ in range(3):
            s.update(sample(8700, total_mb=10000))  # 13% free
        assert s.level == PressureLevel.NORMAL

    def test_steps_call_back_and_count(self, caplog: pytest.LogCaptureFixture) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        calls: list[tuple[str, object]] = []
        for lvl in PressureLevel:
            if lvl:
                s.on_step(lvl, lambda lvl=lvl, **kw: calls.append((lvl.name, kw)))
        s.on_level_change(lambda new, old, why: calls.append(("change", (old.name, new.name))))
        s.admit("old", 100 * MiB)
        s.admit("busy", 100 * MiB)
        s.admit("new", 100 * MiB)
        s.touch("new")
        with caplog.at_level(logging.WARNING, logger="cuvil_edge.daemon.scheduler.memory"), s.using("busy"):
            s.update(sample(9850, total_mb=10000))
        names = [c[0] for c in calls]
        assert names == ["change", "SHRINK_PREFETCH", "CAP_BATCH", "RELEASE_IDLE", "UNLOAD_LRU", "REJECT"]
        assert dict(calls)["RELEASE_IDLE"] == {"names": ["old", "new"]}
        assert dict(calls)["UNLOAD_LRU"] == {"name": "old"}  # least recently used, and not the busy one
        assert s.snapshot()["steps_total"] == {k: 1 for k in ("SHRINK_PREFETCH", "CAP_BATCH", "RELEASE_IDLE", "UNLOAD_LRU", "REJECT")}
        assert "memory pressure NORMAL -> REJECT" in caplog.text
        assert s.should_reject() and s.retry_after_s >= 1
        with pytest.raises(MemoryBudgetError, match="REJECT"):
            s.admit("more", 1)

    def test_over_budget_unloads_until_it_fits(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        unloaded: list[str] = []

        def unload(name: str) -> None:
            unloaded.append(name)
            s.release(name)

        s.on_step(PressureLevel.UNLOAD_LRU, unload)
        for n in ("a", "b", "c"):
            s.admit(n, 1000 * MiB)
            s.measure(n, 1000 * MiB)
        # Another process takes 4.5 GB: budget 8192-512-4500 = 3180 MiB < our 3000+... then more.
        s.update(sample(3000 + 4500))
        s.update(sample(3000 + 5500))
        assert unloaded and unloaded[0] == "a"
        assert s.headroom_bytes >= 0 or len(unloaded) == 3

    def test_a_model_that_just_served_is_not_unloaded(self) -> None:
        """Over budget, the ladder unloads the idle models, never the one whose traffic it serves
        (idle only between requests): that one is kept until it has been quiet for
        ``unload_served_within_s``."""
        now = [1000.0]
        s = MemoryScheduler(8192 * MiB, reserve_mb=512, clock=lambda: now[0])
        unloaded: list[str] = []

        def unload(name: str) -> None:
            unloaded.append(name)
            s.release(name)

        s.on_step(PressureLevel.UNLOAD_LRU, unload)
        for n in ("hot", "cold"):
            s.admit(n, 1000 * MiB)
            s.measure(n, 1000 * MiB)
        with s.using("hot"):
            pass  # one batch at t=1000: "hot" has served and is idle again
        now[0] += 1.0
        assert s.lru_idle() == "hot"  # plain LRU would take it: admitted first, idle right now
        s.update(sample(2000 + 6500))  # another process takes 6.5 GB: far over budget
        s.update(sample(2000 + 6500))
        assert unloaded == ["cold"]
        assert "hot" not in unloaded and s.lru_idle(served_within_s=10) is None
        now[0] += 10.0  # quiet for 11 s: now it may go
        assert s.lru_idle(served_within_s=10) == "hot"

    def test_a_load_in_progress_is_not_counted_twice(self) -> None:
        """While a model loads, the board's growth is the load's (up to its estimate), not another
        process's: counted twice, it put the daemon over budget and unloaded an idle model, which
        reloaded once calm and unloaded the first, over and over (seen on the emulated board). A
        neighbour that grows beyond the load's estimate during the load still counts."""
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        unloaded: list[str] = []
        s.on_step(PressureLevel.UNLOAD_LRU, lambda name: (unloaded.append(name), s.release(name)))
        s.admit("idle", 1000 * MiB)
        s.measure("idle", 1000 * MiB)
        s.update(sample(2000))  # 1000 MiB of others
        s.admit("loading", 3000 * MiB)
        for grown in (1000, 2900, 2900):  # the load's own growth, within its estimate
            assert s.update(sample(2000 + grown)) == PressureLevel.NORMAL
        assert unloaded == [] and s.other_bytes == 1000 * MiB
        assert s.update(sample(2000 + 2900 + 3000)) >= PressureLevel.UNLOAD_LRU  # a neighbour's 3 GB
        assert unloaded == ["idle"] and s.other_bytes >= 3900 * MiB
        s.measure("loading", 2900 * MiB)  # measured: the growth from now on is others' again
        s.update(sample(2000 + 2900 + 3000))
        assert s.other_bytes == (2000 + 2900 + 3000 - 2900) * MiB  # all but the measured load

    def test_reserved_capacity_is_not_a_load(self) -> None:
        """Request buffers reserved ahead of use (``loading=False``) never hide others' growth."""
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.update(sample(2000))
        s.admit("http:request-buffers", 256 * MiB, loading=False)
        s.update(sample(2200))
        assert s.other_bytes == 2200 * MiB

    def test_a_failing_callback_does_not_stop_the_ladder(self) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        s.on_step(PressureLevel.SHRINK_PREFETCH, lambda: 1 / 0)
        assert s.update(sample(9850, total_mb=10000)) == PressureLevel.REJECT

    def test_caps(self) -> None:
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        assert (s.prefetch_cap(8), s.batch_cap(8)) == (8, 8)
        s.update(sample(9200, total_mb=10000))
        assert (s.prefetch_cap(8), s.batch_cap(8)) == (4, 8)
        s.update(sample(9450, total_mb=10000))
        assert (s.prefetch_cap(8), s.batch_cap(8)) == (1, 4)
        s.update(sample(9600, total_mb=10000))
        assert (s.prefetch_cap(8), s.batch_cap(8)) == (1, 4)
        assert s.batch_cap(1) == 1

    def test_snapshot_is_plain_data(self) -> None:
        s = MemoryScheduler(8192 * MiB, reserve_mb=512)
        s.admit("m", 10 * MiB)
        snap = s.snapshot()
        json.dumps(snap)
        assert snap["budget_bytes"] == (8192 - 512) * MiB and snap["level_name"] == "NORMAL"


class TestBufferPool:
    def test_idle_pooled_bytes_count_and_release_idle_empties_the_pool(self) -> None:
        from cuvil_edge.runtime.buffers import BufferPool

        pool = BufferPool(max_bytes=64 * MiB)
        s = MemoryScheduler(10000 * MiB, reserve_mb=0)
        s.attach_pool(pool)
        a = pool.acquire((1024, 1024), np.float32)  # 4 MiB
        pool.release(a)
        assert s.used_bytes == 4 * MiB
        b = pool.acquire((1024, 1024), np.float32)
        assert b is a and s.used_bytes == 0  # reused, now in use (counted by the server as in flight)
        pool.release(b)
        s.update(sample(9560, total_mb=10000))  # 4.4% free: up to RELEASE_IDLE
        assert s.level >= PressureLevel.RELEASE_IDLE
        assert pool.idle_bytes == 0 and s.used_bytes == 0


class TestPlacementPolicy:
    @pytest.mark.parametrize("name", ["orin-nano-8gb", "agx-orin-64gb", "agx-xavier", "agx-thor"])
    def test_integrated_gpus_map_host_memory(self, name: str) -> None:
        p = placement_policy(get_target(name))
        assert (p.kind, p.zero_copy, p.device_buffers) == ("mapped", True, False)

    def test_no_gpu_is_pageable(self) -> None:
        assert placement_policy(get_target("generic-arm64")).kind == "pageable"
        assert placement_policy(get_target("x86-host")).kind == "pageable"

    def test_discrete_gpu_is_pinned_with_device_buffers(self) -> None:
        from dataclasses import replace

        dgpu = replace(get_target("agx-orin-64gb"), name="dgpu", integrated_gpu=False)
        p = placement_policy(dgpu)
        assert (p.kind, p.device_buffers, p.async_copies) == ("pinned", True, True)

    def test_kinds_match_the_runtime_buffer_pool(self) -> None:
        from cuvil_edge.runtime.buffers import Placement

        kinds = {placement_policy(get_target(n)).kind for n in ("orin-nano-8gb", "x86-host")}
        assert kinds <= {Placement.MAPPED, Placement.PINNED, Placement.PAGEABLE}
