"""``Batcher.run_now``: the gRPC unary fast path runs a request before ``submit`` returns only when
that cannot change batching: the model is fast enough for the loop (``inline_ok``), no inline
batch is forming, nothing is queued or running. Otherwise the request takes the usual way."""

from __future__ import annotations

import asyncio
import threading

from cuvil_edge.daemon.batcher import Batcher, Pending


def _pending(log: list[str], name: str) -> Pending:
    return Pending({}, 1, "k", None, lambda p: log.append(f"delivered {name}"))


def test_run_now_runs_and_delivers_before_returning_on_an_idle_batcher() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran: list[list[str]] = []
        log: list[str] = []
        batcher = Batcher("m:1", lambda batch: ran.append([p.ctx for p in batch]), loop, max_batch=4)
        try:
            p = _pending(log, "a")
            p.ctx = "a"
            assert not batcher.run_now(p)  # inline_ok off (a slow model): never on the loop
            assert ran == [] and log == []
            batcher.inline_ok = True
            q = _pending(log, "b")
            q.ctx = "b"
            assert batcher.run_now(q)
            assert ran == [["b"]] and log == ["delivered b"]  # done before run_now returned
            assert batcher.active == 0  # the slot is free again
        finally:
            batcher.stop(2.0)

    asyncio.run(main())


def test_run_now_leaves_a_forming_batch_or_a_busy_batcher_alone() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        sizes: list[int] = []

        def execute(batch: list[Pending]) -> None:
            sizes.append(len(batch))
            gate.wait(2.0)

        batcher = Batcher("m:1", execute, loop, max_batch=4)
        batcher.inline_ok = True
        log: list[str] = []
        try:
            # An inline batch is forming (run_inline took the first request): join it, not run alone.
            gate.set()
            assert batcher.run_inline(_pending(log, "a"))
            assert not batcher.run_now(_pending(log, "b"))
            await asyncio.sleep(0.05)
            assert sizes == [1] and log == ["delivered a"]
            # A batch running on a worker: run_now refuses, the request queues behind it.
            gate.clear()
            batcher.inline_ok = False
            batcher.submit(_pending(log, "c"))
            for _ in range(200):
                if batcher.active:
                    break
                await asyncio.sleep(0.005)
            batcher.inline_ok = True
            assert batcher.active == 1
            assert not batcher.run_now(_pending(log, "d"))
        finally:
            gate.set()
            batcher.stop(2.0)

    asyncio.run(main())
