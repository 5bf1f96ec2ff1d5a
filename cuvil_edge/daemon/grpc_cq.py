"""gRPC's transport: grpcio's core completion queue, its events handled on the daemon's event loop.

grpcio's own servers cost more per call than the work they carry: ``grpc.aio`` turns each call
into three asyncio tasks, three futures resolved from its poller thread and about sixteen loop
callbacks; the sync server into a thread-pool hand-off and several locks and condition variables.
Measured here (2 cores, tritonclient.grpc, canned answers, ``bench/bench_serving.py``'s floors):
about 0.21 ms of the loop thread per call for ``grpc.aio``, 0.05 to 0.08 ms for the same calls
driven straight from the completion queue, as here. The C core (HTTP/2, HPACK, flow control,
message size limits, keep-alive) is grpcio's either way; only the Python around it is ours.

How it runs: one poller thread blocks in :meth:`CompletionQueue.poll` (the GIL released), re-arms
the server's request for new calls itself, and hands events to the loop in bursts (one
``call_soon_threadsafe`` for whatever arrived while the loop was busy). Every decision about a
call is taken on the loop thread, as every other request of the daemon is, so the inference core,
the budget of buffered bytes and the counters stay single-threaded. Batches are started from the
loop (grpc core's calls are thread-safe). With :func:`choose_io` ``poller`` (the daemon's default)
the core reads the sockets on that poller thread too, inside ``poll``, instead of on its
EventEngine threads, which would hand each call over to it: two thread wake-ups fewer per call.

The core allows one operation of each kind in flight per call (one receive, one send); callers of
:class:`ServerCall` keep to that. grpcio marks ``grpc._cython.cygrpc`` internal: the names used
here are those its own sync server (``grpc/_server.py``) has used since 1.x; :func:`check_core`
says at start when an installed grpcio lacks one, and pyproject pins the tested range.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from cuvil_edge.errors import DaemonError

__all__ = ["IO_MODES", "CompletionQueueServer", "OnPoller", "ServerCall", "check_core", "choose_io"]

log = logging.getLogger("cuvil_edge.daemon.grpc")

_CORE_NAMES = ("CompletionQueue", "Server", "CompletionType", "ReceiveMessageOperation",
               "SendInitialMetadataOperation", "SendMessageOperation", "SendStatusFromServerOperation",
               "ReceiveCloseOnServerOperation", "StatusCode")
_REQUEST_CALL = "request-call"
_SHUTDOWN = "shutdown"
_CALLS_REQUESTED = 32  # new-call requests kept open at once (grpcio's sync server keeps one)


# Where grpc core reads and writes the sockets (``--grpc-io``). ``engine``: its EventEngine's own
# threads (the core's default since 1.6x), which then hand each call to the thread polling the
# completion queue: two more thread wake-ups per call. ``poller``: the experiments below turned
# off, the core's iomgr path, whose reads run on the thread that polls the queue (the transport's
# poller). Each name is known to every grpcio of the range pyproject pins (checked in the 1.76,
# 1.80 and 1.85 wheels; the core logs an error for a name it does not know).
IO_MODES = ("poller", "engine")
_ENGINE_IO_EXPERIMENTS = ("event_engine_listener", "event_engine_client", "event_engine_for_all_other_endpoints")
_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
_NAMES_CHECKED = ((1, 76), (1, 85))  # grpcio minor releases whose core was seen to know every name above


def _grpcio_release() -> tuple[int, int] | None:
    """grpcio's (major, minor) from its metadata, without importing it (None: unknown)."""
    from importlib import metadata

    try:
        major, minor = metadata.version("grpcio").split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def choose_io(mode: str, environ: dict[str, str] | None = None) -> bool:
    """Set where grpc core does this process's socket I/O; call it before grpc is imported.

    The core reads ``GRPC_EXPERIMENTS`` once, when it starts (at ``import grpc``). A value the
    user set that names any of these experiments is theirs and stays as it is. Returns whether
    the choice takes effect (False, with the reason logged: grpc had started already in this
    process, as in a test that runs the daemon beside its own gRPC clients, or the installed
    grpcio is not a release these names were checked in).
    """
    env = os.environ if environ is None else environ
    if mode == "engine":
        return True  # the core's default
    release = _grpcio_release()
    if release is None or not _NAMES_CHECKED[0] <= release <= _NAMES_CHECKED[1]:
        log.info("--grpc-io poller: grpcio %s is not a release whose core these experiment names were "
                 "checked in; its EventEngine keeps the sockets", ".".join(map(str, release or ("?",))))
        return False
    current = env.get(_EXPERIMENTS_ENV, "")
    named = {part.strip().lstrip("-") for part in current.split(",") if part.strip()}
    if not named & set(_ENGINE_IO_EXPERIMENTS):
        off = ",".join("-" + name for name in _ENGINE_IO_EXPERIMENTS)
        env[_EXPERIMENTS_ENV] = f"{current},{off}" if current else off
    if "grpc" in sys.modules:
        log.info("--grpc-io poller: grpc core started earlier in this process; it keeps its threads")
        return False
    return True


def _core() -> Any:
    from grpc._cython import cygrpc

    return cygrpc


def check_core() -> None:
    """Raise DaemonError when the installed grpcio lacks a part of its core this transport uses."""
    try:
        cygrpc = _core()
    except ImportError as exc:
        raise DaemonError(f"gRPC needs the grpcio package ({exc}); install it or run with --grpc 0") from exc
    missing = [n for n in _CORE_NAMES if not hasattr(cygrpc, n)]
    if missing:
        import grpc

        raise DaemonError(f"grpcio {grpc.__version__} lacks {', '.join(missing)} in its core module; install "
                          "a grpcio release within the range cuvil-edge pins, or run with --grpc 0")


class ServerCall:
    """One call as the core has it: its method, metadata, and the batches started on it.

    ``on_done`` callbacks run on the loop thread with the core's event (``success``, and the
    operations with their results).
    """

    __slots__ = ("call", "method", "metadata", "route", "admitted", "overdue", "deadline", "posted", "_metadata_sent",
                 "_ops", "_early", "_early_event")

    def __init__(self, call: Any, method: bytes, metadata: tuple[tuple[str, Any], ...], ops: Any) -> None:
        self.call = call
        self.method = method
        self.metadata = metadata
        self.route: Any = None  # what ``admit`` resolved ``method`` to, kept so ``on_call`` need not look again
        self.admitted = False  # the transport's ``admit`` took it (and armed its first receive)
        self.overdue = False  # admitted, and its message did not come within the transport's timeout
        self.deadline = 0.0  # when an admitted call's message is overdue (time.time())
        self.posted = False  # handed to the loop: set and read by the transport's poller thread only
        self._metadata_sent = False
        self._ops = ops
        self._early = False  # a first receive started before the loop saw the call
        self._early_event: Any = None

    def _start(self, ops: tuple[Any, ...], on_done: Callable[[Any], None] | None) -> bool:
        try:
            error = self.call.start_server_batch(ops, on_done or _ignore)
        except ValueError:  # the core released the call already
            return False
        return error == 0

    def _initial(self, ops: list[Any]) -> None:
        if not self._metadata_sent:
            self._metadata_sent = True
            ops.append(self._ops.SendInitialMetadataOperation((), 0))

    def receive(self, on_done: Callable[[Any], None]) -> bool:
        """Ask for the next request message; ``on_done(event)``: see :func:`message_of`.

        The first one may have been read already (:meth:`arm_receive`): the transport hands such a
        call over only once it has arrived, and ``on_done`` takes its event at once.
        """
        if self._early:
            self._early = False
            event, self._early_event = self._early_event, None
            on_done(event)
            return True
        return self._start((self._ops.ReceiveMessageOperation(0),), on_done)

    @property
    def message_waiting(self) -> bool:
        """Whether the first receive, started early, has completed and waits for its reader."""
        return self._early and self._early_event is not None

    def arm_receive(self, on_arrival: Callable[[Any], None]) -> bool:
        """Start the first receive now, before the loop takes the call (the poller thread calls this
        for a call its ``admit`` let in); ``on_arrival(event)`` on the poller thread hands the call
        over with its message, one loop wake-up for the whole request instead of two."""
        self._early = self._start((self._ops.ReceiveMessageOperation(0),), OnPoller(on_arrival))
        return self._early

    def took_early(self, event: Any) -> None:
        """Keep the early receive's event for :meth:`receive` (poller thread, before the hand-over)."""
        self._early_event = event

    def watch_close(self, on_done: Callable[[Any], None]) -> bool:
        """``on_done(event)`` once the call is over; :func:`cancelled_of` says if the client cancelled."""
        return self._start((self._ops.ReceiveCloseOnServerOperation(0),), on_done)

    def send(self, message: bytes, on_done: Callable[[Any], None] | None) -> bool:
        """Send one answer message of a stream (its initial metadata first, once)."""
        ops: list[Any] = []
        self._initial(ops)
        ops.append(self._ops.SendMessageOperation(message, 0))
        return self._start(tuple(ops), on_done)

    def finish(self, code: int, details: str = "", trailing: tuple[tuple[str, str], ...] = (),
               message: bytes | None = None, on_done: Callable[[Any], None] | None = None,
               close: bool = True) -> bool:
        """End the call with ``code`` (and ``message`` before the status, for a unary answer).

        ``close`` adds the receive-close operation, so ``on_done`` runs once the call is over
        (leave it off when :meth:`watch_close` has it already).
        """
        ops: list[Any] = []
        self._initial(ops)
        if message is not None:
            ops.append(self._ops.SendMessageOperation(message, 0))
        ops.append(self._ops.SendStatusFromServerOperation(trailing, code, details, 0))
        if close:
            ops.append(self._ops.ReceiveCloseOnServerOperation(0))
        return self._start(tuple(ops), on_done)

    def cancel(self, code: int | None = None, details: str = "") -> None:
        """Reset the call; with ``code``, the client gets that status and ``details``."""
        try:
            if code is None:
                self.call.cancel()
            else:
                self.call.cancel(code, details)
        except ValueError:  # released already
            pass


def _ignore(_event: Any) -> None:
    pass


class OnPoller:
    """A batch's completion callback that runs on the poller thread instead of the loop.

    For the end of a call whose last work is thread-safe and tiny (leaving the call gate, which
    counts under a lock): the call's last event then costs no loop wake-up. It must not touch the
    loop's state, and must not raise.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn

    def __call__(self, event: Any) -> None:
        self.fn(event)


def message_of(event: Any) -> bytes | None:
    """The message a receive got; None at the end of the stream or when the call failed."""
    if not event.success:
        return None
    return event.batch_operations[0].message()


def cancelled_of(event: Any) -> bool:
    """Whether a call whose receive-close completed was cancelled (by the client or the core)."""
    for op in event.batch_operations:
        cancelled = getattr(op, "cancelled", None)
        if cancelled is not None:
            return bool(cancelled())
    return not event.success


class CompletionQueueServer:
    """A gRPC server on grpc core's completion queue, its calls handed to ``on_call`` on the loop.

    Args:
        loop (asyncio.AbstractEventLoop): the daemon's loop; every callback runs on it.
        options (Sequence[tuple[str, Any]]): core channel arguments (limits, keep-alive).
        on_call (Callable[[ServerCall], None]): a new call, on the loop thread.
        admit (Callable[[ServerCall], bool] | None): on the poller thread, whether a new call's
            first message is read before ``on_call`` gets it (the call then comes with it).
        message_timeout (Callable[[], float]): seconds an admitted call's message may take; past
            them ``on_call`` gets the call ``overdue``, unread (a half-open call holds its place
            no longer than one the loop reads itself).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, options: Sequence[tuple[str, Any]],
                 on_call: Callable[[ServerCall], None],
                 admit: Callable[[ServerCall], bool] | None = None,
                 message_timeout: Callable[[], float] = lambda: 30.0) -> None:
        cygrpc = _core()
        self._cygrpc = cygrpc
        self._loop = loop
        self._on_call = on_call
        self._admit = admit
        self._message_timeout = message_timeout
        self._half_open: OrderedDict[ServerCall, None] = OrderedDict()  # admitted, message awaited, oldest first
        self._cq = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(tuple(options), False)
        self._server.register_completion_queue(self._cq)
        self._events: deque[Any] = deque()
        self._scheduled = False
        # While an event is handled: whether others of the same burst wait behind it. A request
        # that finds more behind it joins a batch formed in this loop iteration instead of
        # running at once (tiny CNN, 8 gRPC clients: mean batch 1.0 -> batches, +44% req/s).
        self.more = False
        self._thread: threading.Thread | None = None
        self._serving = False
        self._stopped: asyncio.Event | None = None
        self._timeout_type = cygrpc.CompletionType.queue_timeout
        self._shutdown_type = cygrpc.CompletionType.queue_shutdown

    def bind(self, address: str) -> int:
        """Listen on ``address`` (``host:port`` or ``unix:PATH``); the port (0: not bound)."""
        return int(self._server.add_http2_port(address.encode()))

    def start(self) -> None:
        self._server.start()
        self._serving = True
        for _ in range(_CALLS_REQUESTED):
            self._server.request_call(self._cq, self._cq, _REQUEST_CALL)
        self._thread = threading.Thread(target=self._poll, name="grpc-cq", daemon=True)
        self._thread.start()

    async def stop(self, grace: float | None) -> None:
        """Take no new calls, give those in progress ``grace`` seconds, cancel the rest, close."""
        if self._thread is None:
            return
        self._stopped = asyncio.Event()
        self._serving = False
        self._server.shutdown(self._cq, _SHUTDOWN)
        try:
            await asyncio.wait_for(self._stopped.wait(), grace or 0.001)
        except asyncio.TimeoutError:
            self._server.cancel_all_calls()
            await self._stopped.wait()
        self._server.destroy()
        self._cq.shutdown()
        thread, self._thread = self._thread, None
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)

    # ------------------------------------------------------------------ poller thread

    def _poll(self) -> None:
        cq, half_open = self._cq, self._half_open
        timeout_type, shutdown_type = self._timeout_type, self._shutdown_type
        while True:
            if half_open:
                first = next(iter(half_open))
                if first.deadline <= time.time():
                    self._expire()
                    continue
                event = cq.poll(first.deadline)
            else:
                event = cq.poll()
            kind = event.completion_type
            if kind == shutdown_type:
                return
            if kind == timeout_type:
                continue
            tag = event.tag
            if tag is _ignore:
                continue
            if type(tag) is OnPoller:
                try:
                    tag(event)
                except Exception:  # as on the loop: one call's bug stops no other call
                    log.exception("gRPC event handler failed")
                continue
            if tag is _REQUEST_CALL:
                if self._serving:
                    self._server.request_call(cq, cq, _REQUEST_CALL)
                if event.success:
                    event = self._new_call(event)
                    if event is None:
                        continue  # its message comes first (``_arrived``)
            if not self._post(event):
                return

    def _post(self, event: Any) -> bool:
        """Queue ``event`` for the loop, waking it unless a drain is scheduled; False once the loop
        has closed under a daemon that is exiting."""
        self._events.append(event)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                return False
        return True

    def _new_call(self, event: Any) -> ServerCall | None:
        """The call, for the loop now; None when ``admit`` took it and its first receive is armed:
        the loop then gets it once the message is in."""
        call = ServerCall(event.call, event.call_details.method, event.invocation_metadata, self._cygrpc)
        admit = self._admit
        if admit is not None and admit(call):
            call.admitted = True
            call.deadline = time.time() + self._message_timeout()
            if call.arm_receive(lambda ev: self._arrived(call, ev)):
                self._half_open[call] = None
                return None
        call.posted = True
        return call

    def _arrived(self, call: ServerCall, event: Any) -> None:
        if call.posted:
            return  # overdue, handed over already: the loop has cancelled it
        self._half_open.pop(call, None)
        call.posted = True
        call.took_early(event)
        self._post(call)

    def _expire(self) -> None:
        """Hand every admitted call whose message is overdue to the loop, unread."""
        now, half_open = time.time(), self._half_open
        while half_open:
            call = next(iter(half_open))
            if call.deadline > now:
                return
            half_open.popitem(last=False)
            call.posted = call.overdue = True
            self._post(call)

    # ------------------------------------------------------------------ loop thread

    def _drain(self) -> None:
        self._scheduled = False  # before taking events: one that arrives meanwhile schedules again
        events = self._events
        while events:
            event = events.popleft()
            self.more = bool(events)
            try:
                if type(event) is ServerCall:
                    self._on_call(event)
                    continue
                tag = event.tag
                if tag is _REQUEST_CALL:
                    pass  # a new-call request that failed: the server is shutting down
                elif tag is _SHUTDOWN:
                    if self._stopped is not None:
                        self._stopped.set()
                else:
                    tag(event)
            except Exception:  # one call's bug must not stop every other call's events
                log.exception("gRPC event handler failed")
