"""Dynamic batching per model: max batch, preferred sizes, max queue delay, batches in flight.

The event loop thread calls :meth:`Batcher.submit`; worker threads (one per allowed batch in
flight, ``depth``) take the oldest compatible requests, up to the batch cap, and run the model's
``execute(batch)`` off the loop. One ``call_soon_threadsafe`` per batch hands the answers back.

Policy (as Triton's dynamic batcher): a worker that finds requests waiting starts at once with
what is there, unless ``max_queue_delay_us`` is set and fewer than the target size (largest
preferred size under the cap, else the cap) are queued, in which case it waits until the oldest
request has waited that long or enough arrive. So at concurrency 1 a request never waits, and
under load requests that queue behind a running batch form the next one ("natural batching").
Requests whose non-batch shapes differ are never mixed. ``cap`` and ``depth`` can change at run
time (memory pressure ladder, prefetch controller).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Batcher", "Pending"]

log = logging.getLogger("cuvil_edge.daemon.batcher")


class Pending:
    """One request waiting for (or in) a batch.

    Attributes:
        inputs (dict): input arrays by name (batch first), as the client sent them.
        n (int): the request's batch size.
        key (Hashable): requests are only batched with requests of the same key (shapes).
        outputs (list[str] | None): outputs asked for; None for all.
        deliver (Callable[[Pending], None]): called on the event loop with the outcome.
        encode (Callable | None): run in the worker to turn ``result`` into the answer body.
    """

    __slots__ = ("inputs", "n", "key", "outputs", "deliver", "encode", "enqueued", "cancelled",
                 "result", "error", "body", "queue_ns", "ctx")

    def __init__(self, inputs: dict[str, Any], n: int, key: Hashable, outputs: list[str] | None,
                 deliver: Callable[[Pending], None], encode: Callable[[Pending], Any] | None = None,
                 ctx: Any = None) -> None:
        self.inputs = inputs
        self.n = n
        self.key = key
        self.outputs = outputs
        self.deliver = deliver
        self.encode = encode
        self.enqueued = time.perf_counter_ns()
        self.cancelled = False
        self.result: dict[str, Any] | None = None
        self.error: tuple[int, str] | None = None
        self.body: Any = None
        self.queue_ns = 0
        self.ctx = ctx


class Batcher:
    """Groups requests into batches and runs them on worker threads.

    Args:
        name (str): model label, for thread names and logs.
        execute (Callable[[list[Pending]], None]): runs one batch; sets ``result``/``error``/``body``
            of each entry. Called from a worker thread.
        loop (asyncio.AbstractEventLoop): where ``deliver`` callbacks run.
        max_batch (int): the model's largest batch; 0 for a model that does not batch (one
            request per execution).
        preferred (list[int] | None): preferred batch sizes. Defaults to none.
        max_queue_delay_us (int): longest wait for a batch to fill. Defaults to 0.
        max_depth (int): worker threads, the bound of batches in flight. Defaults to 2.
    """

    def __init__(self, name: str, execute: Callable[[list[Pending]], None],
                 loop: asyncio.AbstractEventLoop, max_batch: int, preferred: list[int] | None = None,
                 max_queue_delay_us: int = 0, max_depth: int = 2) -> None:
        self.name = name
        self.execute = execute
        self.loop = loop
        self.max_batch = max(0, int(max_batch))
        self.preferred = sorted(p for p in (preferred or []) if p >= 1)
        self.max_delay_ns = int(max_queue_delay_us) * 1000
        self.max_depth = max(1, int(max_depth))
        self.cap = max(1, self.max_batch)  # current batch cap (pressure ladder lowers it)
        self.depth = 1  # batches allowed in flight now (prefetch controller sets it)
        self.inline_ok = False  # see run_inline
        self._inline: list[Pending] | None = None  # the batch forming for the next inline flush
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._stopping = False
        self.busy_since: float | None = None  # monotonic start of the oldest running batch
        self._running: dict[int, float] = {}
        # Time requests waited with every slot taken (depth was the limit): the prefetch
        # controller's sign that a deeper pipeline would help.
        self._blocked_since: int | None = None
        self._blocked_ns = 0
        self._threads = [threading.Thread(target=self._worker, name=f"batch-{name}-{i}", daemon=True)
                         for i in range(self.max_depth)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ loop side

    @property
    def queued(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    @property
    def active(self) -> int:
        """Batches running now."""
        return self._active

    def set_depth(self, depth: int) -> None:
        """Allow ``depth`` batches in flight (clamped to 1..max_depth)."""
        with self._cond:
            self.depth = max(1, min(int(depth), self.max_depth))
            self._mark_blocked()
            self._cond.notify_all()

    def blocked_seconds(self) -> float:
        """Seconds so far that requests waited while every allowed slot was running a batch.

        Cumulative, like the statistics counters: the owner takes differences per tick. Time a
        worker spends waiting for a batch to fill (``max_queue_delay_us``) does not count.
        """
        with self._cond:
            ns = self._blocked_ns
            if self._blocked_since is not None:
                ns += time.perf_counter_ns() - self._blocked_since
        return ns / 1e9

    def _mark_blocked(self) -> None:
        """Start or end a blocked stretch after a change of queue, slots or depth (lock held)."""
        blocked = bool(self._queue) and self._active >= self.depth
        if blocked and self._blocked_since is None:
            self._blocked_since = time.perf_counter_ns()
        elif not blocked and self._blocked_since is not None:
            self._blocked_ns += time.perf_counter_ns() - self._blocked_since
            self._blocked_since = None

    def set_cap(self, cap: int | None) -> None:
        """Cap the batch size (None: back to max_batch)."""
        with self._cond:
            top = max(1, self.max_batch)
            self.cap = top if cap is None else max(1, min(int(cap), top))
            self._cond.notify_all()

    def run_inline(self, p: Pending) -> bool:
        """Run ``p`` on the event loop if the batcher is idle; True if taken (ran or will run).

        The fast path for models whose batch takes less than the two thread hand-offs it would
        save (``inline_ok``, set by the owner from measured execution times). The first request
        finding the batcher idle reserves it and schedules one flush with ``call_soon``; requests
        parsed in the same loop iteration (other connections' data arrived together) join that
        batch while they fit the cap. So at low load a request neither queues nor wakes a
        worker, and under load requests still batch without a thread hand-off. Whatever does not
        fit takes the worker path.
        """
        if not self.inline_ok:
            return False
        group = self._inline
        if group is not None:
            if self.max_batch and p.key == group[0].key and sum(x.n for x in group) + p.n <= self.cap:
                group.append(p)
                return True
            return False
        with self._cond:
            if self._queue or self._active or self._stopping:
                return False
            self._active += 1  # reserved until the flush: workers leave it alone
        self._inline = [p]
        self.loop.call_soon(self._flush_inline)
        return True

    def run_now(self, p: Pending) -> bool:
        """Run ``p`` at once on the calling (loop) thread if the batcher is idle; True if it ran,
        and then ``p.deliver`` has been called already, before this returns.

        :meth:`run_inline` without its flush: for a caller that awaits its own request (a gRPC
        unary call) and can take the answer synchronously, it saves the loop iteration of the
        ``call_soon`` and the wake-up of a future (the tiny CNN over gRPC: about a tenth of the
        daemon's time per call). A request that finds a batch forming or queued work takes
        :meth:`run_inline` or the workers, as before, so batching under load is unchanged.
        """
        if not self.inline_ok or self._inline is not None:
            return False
        with self._cond:
            if self._queue or self._active or self._stopping:
                return False
            self._active += 1
        self._run_here([p])
        return True

    def _flush_inline(self) -> None:
        batch, self._inline = self._inline or [], None
        self._run_here(batch)

    def _run_here(self, batch: list[Pending]) -> None:
        """Execute a batch reserved on the loop thread (``_active`` taken), free it, deliver."""
        now_ns = time.perf_counter_ns()
        for p in batch:
            p.queue_ns = now_ns - p.enqueued
        try:
            self.execute(batch)
        except Exception as exc:
            log.exception("inline execution failed for %s", self.name)
            for p in batch:
                if p.error is None and p.body is None:
                    p.error = (500, f"internal error running {self.name}: {exc}")
        finally:
            with self._cond:
                self._active -= 1
                self._mark_blocked()
                if self._queue:
                    self._cond.notify()
        _deliver_all(batch)

    def submit(self, p: Pending) -> None:
        """Queue a request; its ``deliver`` runs on the loop when done."""
        with self._cond:
            if self._stopping:
                p.error = (503, f"model {self.name} is unloading; retry")
                self.loop.call_soon(p.deliver, p)
                return
            self._queue.append(p)
            self._mark_blocked()
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Finish queued work, then end the worker threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    # ------------------------------------------------------------------ worker side

    def _target(self) -> int:
        cap = self.cap
        fitting = [p for p in self.preferred if p <= cap]
        return fitting[-1] if fitting else cap

    def _take(self, dropped: list[Pending]) -> list[Pending]:
        """Pop the next batch (lock held): oldest request plus compatible ones up to the cap.

        Requests whose client went away are moved to ``dropped`` (still delivered, so the owner's
        bookkeeping sees them) instead of being run.
        """
        q = self._queue
        while q and q[0].cancelled:
            dropped.append(q.popleft())
        if not q:
            return []
        first = q.popleft()
        batch = [first]
        if self.max_batch == 0:
            return batch
        size = first.n
        cap = self.cap
        if size >= cap or not q:
            return batch
        keep: list[Pending] = []
        while q and size < cap:
            p = q.popleft()
            if p.cancelled:
                dropped.append(p)
                continue
            if p.key == first.key and size + p.n <= cap:
                batch.append(p)
                size += p.n
            else:
                keep.append(p)
                if len(keep) > 64:  # do not scan a long queue of other shapes
                    break
        if keep:
            q.extendleft(reversed(keep))
        return batch

    def _worker(self) -> None:
        cond = self._cond
        ident = threading.get_ident()
        while True:
            with cond:
                while True:
                    if self._queue and self._active < self.depth:
                        break
                    if self._stopping and not self._queue:
                        return
                    cond.wait(0.5)
                if self.max_delay_ns and self.max_batch:
                    target = self._target()
                    deadline = self._queue[0].enqueued + self.max_delay_ns
                    while not self._stopping:
                        queued = sum(p.n for p in self._queue)
                        now = time.perf_counter_ns()
                        if queued >= target or now >= deadline or not self._queue:
                            break
                        cond.wait((deadline - now) / 1e9)
                    if not self._queue:
                        continue
                dropped: list[Pending] = []
                batch = self._take(dropped)
                if dropped:
                    try:
                        self.loop.call_soon_threadsafe(_deliver_all, dropped)
                    except RuntimeError:  # loop closed during shutdown
                        return
                if not batch:
                    continue
                self._active += 1
                self._running[ident] = time.monotonic()
                self._mark_blocked()
            now_ns = time.perf_counter_ns()
            for p in batch:
                p.queue_ns = now_ns - p.enqueued
            try:
                self.execute(batch)
            except Exception as exc:  # execute reports per request; this is a bug guard
                log.exception("batch execution failed for %s", self.name)
                for p in batch:
                    if p.error is None and p.body is None:
                        p.error = (500, f"internal error running {self.name}: {exc}")
            finally:
                with cond:
                    self._active -= 1
                    self._running.pop(ident, None)
                    self._mark_blocked()
                    cond.notify()
            try:
                self.loop.call_soon_threadsafe(_deliver_all, batch)
            except RuntimeError:  # loop closed during shutdown
                return

    def oldest_running(self) -> float | None:
        """Monotonic start time of the longest-running batch, or None when idle."""
        running = list(self._running.values())
        return min(running) if running else None


def _deliver_all(batch: list[Pending]) -> None:
    for p in batch:
        try:
            p.deliver(p)
        except Exception:
            log.exception("delivering a result failed")
