"""The daemon feeds its measured stage times to the prefetch controller (Little's law in serving).

A real :class:`Batcher` and :class:`ModelStats` run a model whose batches take 30 ms of CPU work
(preparing, done in parallel by the workers) and 10 ms on a device that runs one batch at a time
(a lock). The device is fed once ``depth >= 1 + 30/10``, so the controller must read a ratio near 3
and settle at ``need = 1 + ceil(3 + 0.25) = 5`` and stay there (4 when a loaded machine stretches
the 10 ms sleep past 10.9 ms: the depth must not swing either way). The execution time the daemon measures includes
the wait for the device when batches contend; taken as is, it would read a deeper pipeline as a
slower device and swing the depth up and down.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from types import SimpleNamespace

from cuvil_edge.daemon.batcher import Batcher, Pending
from cuvil_edge.daemon.metrics import ModelStats
from cuvil_edge.daemon.resources import Resources

PRE_S = 0.030
EXEC_S = 0.010


async def _serve(seconds: float, tick_s: float = 0.25) -> tuple[Resources, Batcher, list[int], ModelStats]:
    loop = asyncio.get_running_loop()
    stats, device = ModelStats("m", "1"), threading.Lock()

    def execute(batch: list[Pending]) -> None:
        t0 = time.perf_counter_ns()
        time.sleep(PRE_S)  # CPU: prepare and concatenate (workers in parallel)
        t1 = time.perf_counter_ns()
        with device:  # the device: one batch at a time; the wait counts as inference, as in the daemon
            time.sleep(EXEC_S)
        t2 = time.perf_counter_ns()
        stats.record_batch(sum(p.n for p in batch), (p.queue_ns for p in batch), t1 - t0, t2 - t1, 0, len(batch))

    batcher = Batcher("m:1", execute, loop, max_batch=4, max_depth=8)
    batcher.set_depth(2)
    inst = SimpleNamespace(name="m", version="1", stats=stats, batcher=batcher, max_batch=4,
                           spec=SimpleNamespace(latency_p95_ms=None))
    res = Resources(SimpleNamespace())
    depths: list[int] = []
    end = time.monotonic() + seconds
    next_tick = time.monotonic() + tick_s
    try:
        while time.monotonic() < end:
            while batcher.queued < 40:  # always more work than the pipeline takes
                batcher.submit(Pending({}, 1, "k", None, lambda p: None))
            if time.monotonic() >= next_tick:
                res.tick([inst])
                depths.append(batcher.depth)
                next_tick += tick_s
            await asyncio.sleep(0.005)
    finally:
        with batcher._cond:
            batcher._queue.clear()
        batcher.stop(2.0)
    return res, batcher, depths, stats


def test_depth_follows_the_measured_stage_times_and_holds() -> None:
    res, batcher, depths, stats = asyncio.run(_serve(4.0))
    ctl = res.prefetch["m:1"]
    reasons = [d.reason for d in ctl.decisions]
    # The ratio read is the device's own time, not the wait for it: with the wait counted, the
    # execution would read 2-3x longer and the ratio near 1.
    ratio = ctl._pre / ctl._exec
    assert 2.4 < ratio < 3.4, (ratio, depths, reasons)
    assert ctl.need == 1 + math.ceil(ratio + ctl.need_slack) and ctl.need in (4, 5), (ctl.need, ratio, reasons)
    # There in one step once the stage times are measured (the controller may keep one spare slot
    # while the device reads under its target), and it stays there: no swing.
    settled = depths[len(depths) // 3:]
    assert settled and len(set(settled)) == 1 and ctl.need <= settled[0] <= 6, (depths, reasons)
    assert ctl.direction_changes == 0, reasons
    assert "keeps the device fed" in (ctl.last_change_reason or ""), ctl.last_change_reason
    # Fed, the device runs back to back: near 1 / EXEC_S batches a second over the settled part.
    assert stats.execution_count > 0.6 * (4.0 / EXEC_S), stats.execution_count


def test_blocked_time_counts_only_requests_waiting_for_a_full_pipeline() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        batcher = Batcher("m:1", lambda batch: gate.wait(2.0), loop, max_batch=1, max_depth=1)
        try:
            batcher.submit(Pending({}, 1, "k", None, lambda p: None))
            await asyncio.sleep(0.1)  # one batch running, nothing queued: not blocked
            idle = batcher.blocked_seconds()
            batcher.submit(Pending({}, 1, "k", None, lambda p: None))
            await asyncio.sleep(0.2)  # queued behind the only slot: blocked
            blocked = batcher.blocked_seconds() - idle
        finally:
            gate.set()
            batcher.stop(2.0)
        return idle, blocked

    idle, blocked = asyncio.run(main())
    assert idle < 0.02
    assert 0.15 < blocked < 1.0
