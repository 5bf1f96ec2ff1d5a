"""What a gRPC call may cost, from its headers to its last answer: the four kinds of call.

The transport (:mod:`cuvil_edge.daemon.grpc_cq`) hands every new call here, on the loop thread,
before a byte of its message is read. The rules, the same as over HTTP where HTTP has them:

* ``ServerLive``/``ServerReady`` are answered from their headers; the request message (empty by
  definition) is never read, so a half-open or oversized health call costs one small answer,
  never a buffer or a call slot;
* a call without the token is refused from its headers (``UNAUTHENTICATED``);
* authenticated calls in progress are counted (``--grpc-max-rpcs``; over it, ``RESOURCE_EXHAUSTED``
  at once, naming the option), apart from health calls;
* the first request message must arrive within ``--request-timeout`` (a half-open call ends with
  ``DEADLINE_EXCEEDED``) and is counted in ``--max-buffered-mb`` from its arrival: while it is
  parsed, and for an inference until its answer exists;
* an inference answer is counted before it is computed (``ANSWER_COPIES`` times the model's output
  bytes), so answers nobody reads cannot pile up past the budget; a full budget answers
  ``RESOURCE_EXHAUSTED`` with ``retry-after`` instead of queueing;
* an answer larger than an HTTP/2 window (64 KiB) stays counted until the client has taken it, and
  must be taken within ``--request-timeout``, else the call is reset and its memory freed (the heap
  is trimmed at the next tick: freed answers of a few MiB stay in glibc's arenas otherwise);
* a ``ModelStreamInfer`` stream has at most ``STREAM_MAX_INFLIGHT`` requests and
  ``STREAM_MAX_BYTES`` of their messages in flight, and its answers waiting for the client plus
  those in flight stay within ``STREAM_MAX_ANSWER_BYTES``; beyond that it is not read, and HTTP/2
  flow control holds the client back.

The bounds grpc core keeps itself (message size from the length prefix, streams per connection,
connections, keep-alive and the reset budget) are channel arguments set by
:meth:`~cuvil_edge.daemon.grpc_server.GrpcFrontend.server_options`; docs/hardening.md has the
C-core functions they rest on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from cuvil_edge.daemon.batcher import Pending
from cuvil_edge.daemon.grpc_cq import OnPoller, ServerCall, cancelled_of, message_of
from cuvil_edge.daemon.limits import ANSWER_WINDOW as WINDOW
from cuvil_edge.daemon.limits import ANSWERS_FULL, MAX_ERROR, answer_bytes, printable
from cuvil_edge.errors import DaemonError

__all__ = ["ANSWER_COPIES", "BUFFERED_FULL", "CallGate", "CallPolicy", "Frontend", "Malformed", "Method", "RpcFailure",
           "STREAM_MAX_ANSWER_BYTES", "STREAM_MAX_BYTES", "STREAM_MAX_INFLIGHT", "WINDOW", "code_of",
           "parser_for"]

# What one gRPC answer costs the daemon at its peak, in answer sizes: while it is built, the
# runtime's output, the response message and its serialized bytes; while it waits for the client,
# the serialized bytes (referenced by the core's send operation until written out) and the core's
# own copy in its transport. Measured: 60 unread 4 MiB answers counted once (240 MiB of 256) grew
# the daemon by 634 MiB; counted twice (32 admitted), by 330 MiB.
ANSWER_COPIES = 3
STREAM_MAX_INFLIGHT = 64  # requests of one ModelStreamInfer stream in flight at once
STREAM_MAX_BYTES = 64 << 20  # and their request bytes (at least one message always fits)
STREAM_MAX_ANSWER_BYTES = 16 << 20  # answers of one stream waiting for the client, with those in flight
BUFFERED_FULL = "the daemon holds its limit of request bytes already (--max-buffered-mb); retry later"
UNAUTHENTICATED = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"
_RETRY = (("retry-after", "1"),)


def code_of(status: grpc.StatusCode) -> int:
    """The core's integer for a ``grpc.StatusCode``."""
    return int(status.value[0])


_OK = code_of(grpc.StatusCode.OK)


class RpcFailure(DaemonError):
    """An RPC answered with a gRPC error status (``code``), message and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 trailing: tuple[tuple[str, str], ...] = ()) -> None:
        # Messages quote what the client sent (a shape, a name): bounded, so a 2M-dimension shape
        # is a short error and not a 6 MB trailer the client refuses to read.
        super().__init__(printable(message, MAX_ERROR))
        self.code = code
        self.trailing = trailing


class Malformed:
    """Stands for a request message that does not parse (answered INVALID_ARGUMENT, not UNKNOWN)."""

    def __init__(self, type_name: str, exc: Exception) -> None:
        self.message = f"malformed {type_name} message: {exc}"


def parser_for(message_type: Any) -> Callable[[bytes], Any]:
    """``message_type.FromString``, with a :class:`Malformed` for bytes that do not parse."""
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # protobuf's DecodeError, or worse on hostile bytes
            return Malformed(message_type.DESCRIPTOR.name, exc)

    return parse


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its name, its kind and what serves it.

    ``kind``: ``open`` (answered from the headers: ``handle(empty_request)``), ``unary``
    (``handle(request)`` returns a message or a coroutine of one, or raises :class:`RpcFailure`),
    ``infer`` (one ``ModelInferRequest``, one answer) or ``stream`` (``ModelStreamInfer``).
    """

    name: str
    kind: str
    parse: Callable[[bytes], Any]
    handle: Callable[[Any], Any] | None = None


class Frontend(Protocol):
    """What the calls need of the gRPC front end (:class:`~cuvil_edge.daemon.grpc_server.GrpcFrontend`)."""

    state: Any  # the daemon's ServerState: reserve/release/hold of --max-buffered-mb, limits, counters
    registry: Any  # the ModelRegistry

    def authorized(self, metadata: Any) -> bool: ...

    def count(self, method: str, code: grpc.StatusCode) -> None: ...

    def submit(self, req: Any, deliver: Callable[[Pending], None], received: float,
               at_once: bool = False) -> Pending: ...

    def finish_request(self, p: Pending) -> tuple[bytes | None, RpcFailure | None]: ...


def _never() -> bool:
    return False


class CallGate:
    """Authenticated gRPC calls in progress, at most ``limit`` (``--grpc-max-rpcs``).

    Entered from the transport's poller thread too (:meth:`CallPolicy.admit`), so it counts under
    a lock; ``refused`` is counted on the loop only.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.refused = 0
        self._lock = threading.Lock()

    def enter(self, count_refusal: bool = True) -> bool:
        with self._lock:
            if self.active >= self.limit:
                if count_refusal:
                    self.refused += 1
                return False
            self.active += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


class CallPolicy:
    """Takes every new call from the transport and runs it by its method's kind.

    Args:
        frontend (Frontend): authorization, counting, the inference path and the methods.
        methods (dict[bytes, Method]): by full method path (``b"/inference.GRPCInferenceService/X"``).
        max_rpcs (int): authenticated calls in progress at once.
    """

    def __init__(self, frontend: Frontend, methods: dict[bytes, Method], max_rpcs: int) -> None:
        self.frontend = frontend
        self.state = frontend.state
        self.methods = methods
        self.gate = CallGate(max_rpcs)
        self.write_timeouts = 0
        self.loop = asyncio.get_running_loop()
        # Whether more calls' events wait in the transport's current burst (set once it exists).
        self.burst: Callable[[], bool] = _never

    @property
    def timeout(self) -> float:
        return float(self.state.limits.request_timeout)

    def admit(self, call: ServerCall) -> bool:
        """Whether a new call's message may be read before the loop sees the call (poller thread).

        Only what needs neither the loop's state nor the body decides: a unary or inference method,
        authorized metadata, a place under ``--grpc-max-rpcs``. A call let in holds its place;
        any other call goes to :meth:`on_call` unread, which refuses it or reads it later.
        """
        method = call.route = self.methods.get(call.method)
        if method is None or method.kind not in ("unary", "infer"):
            return False
        return self.frontend.authorized(call.metadata) and self.gate.enter(count_refusal=False)

    def on_call(self, call: ServerCall) -> None:
        """A new call, before its message is read (loop thread)."""
        # ``admit`` (when the transport has one) looked the method up already: one lookup a call.
        method: Method | None = call.route if call.route is not None else self.methods.get(call.method)
        if method is None:
            call.finish(code_of(grpc.StatusCode.UNIMPLEMENTED), "Method not found!")
            return
        if call.admitted:
            _Unary(self, call, method).start()
            return
        frontend = self.frontend
        if method.kind == "open":
            assert method.handle is not None
            frontend.count(method.name, grpc.StatusCode.OK)
            call.finish(_OK, message=method.handle(None).SerializeToString())
            return
        if not frontend.authorized(call.metadata):
            frontend.count(method.name, grpc.StatusCode.UNAUTHENTICATED)
            call.finish(code_of(grpc.StatusCode.UNAUTHENTICATED), UNAUTHENTICATED)
            return
        if not self.gate.enter():
            frontend.count(method.name, grpc.StatusCode.RESOURCE_EXHAUSTED)
            call.finish(code_of(grpc.StatusCode.RESOURCE_EXHAUSTED),
                        f"too many gRPC calls in progress (--grpc-max-rpcs {self.gate.limit}); retry later", _RETRY)
            return
        if method.kind == "stream":
            _Stream(self, call, method).start()
        else:
            _Unary(self, call, method).start()

    # ------------------------------------------------------------------ budget

    def reserve(self, n: int) -> bool:
        """Count ``n`` bytes in ``--max-buffered-mb`` unless that passes it; when nothing else is
        counted, ``n`` passes anyway, so a model whose one answer costs more than the budget is
        still served, one call at a time."""
        if self.state.reserve(n):
            return True
        if self.state.buffered == 0:
            self.state.hold(n)
            return True
        return False

    def expected_answer(self, request: Any) -> int:
        """What a ``ModelInferRequest``'s answer will cost until taken: ``ANSWER_COPIES`` times its
        outputs' bytes, from the model's specs (0: unknown model, or sizes not known in advance)."""
        inputs = getattr(request, "inputs", None)
        if not inputs or not isinstance(getattr(request, "model_name", None), str):
            return 0
        try:
            inst = self.frontend.registry.get(request.model_name, request.model_version or None)
        except Exception:  # unknown model: the handler answers NOT_FOUND
            return 0
        shape = inputs[0].shape
        batch = int(shape[0]) if inst.max_batch and len(shape) else 1
        return ANSWER_COPIES * answer_bytes(inst.output_specs, max(1, batch))

    def trim(self) -> None:
        """An answer was dropped untaken: have the heap trimmed at the next tick."""
        dropped = getattr(self.state, "dropped_slow_client", None)
        if dropped is not None:
            dropped()

    def refuse_buffered(self) -> None:
        self.state.refused["buffered"] = self.state.refused.get("buffered", 0) + 1


class _Unary:
    """A call with one request message and one answer (``unary`` and ``infer`` methods)."""

    __slots__ = ("policy", "call", "method", "timer", "expired", "request_bytes", "held", "big", "ended")

    def __init__(self, policy: CallPolicy, call: ServerCall, method: Method) -> None:
        self.policy = policy
        self.call = call
        self.method = method
        self.timer: asyncio.TimerHandle | None = None
        self.expired = False
        self.request_bytes = 0  # counted from arrival until the answer exists
        self.held = 0  # the answer's count in --max-buffered-mb
        self.big = False
        self.ended = False

    def start(self) -> None:
        if self.call.overdue:  # admitted on the poller thread; its message never came
            self._no_message()
            return
        if not self.call.message_waiting:
            self.timer = self.policy.loop.call_later(self.policy.timeout, self._no_message)
        if not self.call.receive(self._received):
            self._closed(None)

    def _no_message(self) -> None:
        self.timer = None
        self.expired = True
        self.policy.frontend.count(self.method.name, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.call.cancel(code_of(grpc.StatusCode.DEADLINE_EXCEEDED),
                         f"the request message did not arrive within {self.policy.timeout:g} s (--request-timeout)")
        self._closed(None)

    def _end(self, code: grpc.StatusCode, message: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        self.policy.frontend.count(self.method.name, code)
        if not self.call.finish(code_of(code), message, trailing, on_done=self._closed):
            self._closed(None)

    def _received(self, event: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.expired:
            return
        raw = message_of(event)
        policy = self.policy
        if raw is None:
            if event.success:  # the client half-closed without a message
                self._end(grpc.StatusCode.INVALID_ARGUMENT, "the call ended before its request message")
            else:  # it left, or its message was over the size limit (the core has answered)
                policy.frontend.count(self.method.name, grpc.StatusCode.CANCELLED)
                self._closed(None)
            return
        size = len(raw)
        if not policy.state.reserve(size):
            policy.refuse_buffered()
            self._end(grpc.StatusCode.RESOURCE_EXHAUSTED, BUFFERED_FULL, _RETRY)
            return
        self.request_bytes = size
        request = self.method.parse(raw)
        del raw
        if self.method.kind == "infer":
            self._infer(request)
            return
        self._release_request()
        if isinstance(request, Malformed):
            self._end(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return
        handle = self.method.handle
        assert handle is not None
        try:
            result = handle(request)
        except RpcFailure as exc:
            self._end(exc.code, str(exc), exc.trailing)
            return
        if asyncio.iscoroutine(result):
            asyncio.ensure_future(result).add_done_callback(self._handled)
        else:
            self._answer_message(result)

    def _handled(self, task: asyncio.Future[Any]) -> None:
        exc = task.exception()
        if isinstance(exc, RpcFailure):
            self._end(exc.code, str(exc), exc.trailing)
        elif exc is not None:
            self._end(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
        else:
            self._answer_message(task.result())

    def _answer_message(self, message: Any) -> None:
        self.policy.frontend.count(self.method.name, grpc.StatusCode.OK)
        self._answer(message.SerializeToString())

    def _release_request(self) -> None:
        if self.request_bytes:
            self.policy.state.release(self.request_bytes)
            self.request_bytes = 0

    # ------------------------------------------------------------------ inference

    def _infer(self, request: Any) -> None:
        policy, frontend = self.policy, self.policy.frontend
        if isinstance(request, Malformed):
            self._release_request()
            self._end(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return
        expected = policy.expected_answer(request)
        if expected and not policy.reserve(expected):
            self._release_request()
            policy.refuse_buffered()
            self._end(grpc.StatusCode.RESOURCE_EXHAUSTED, ANSWERS_FULL, _RETRY)
            return
        self.held = expected
        policy.state.inflight += 1
        try:
            # Alone, it runs at once (on an idle batcher, before submit returns); with other calls'
            # messages waiting in the same burst, it joins the batch they form (run_inline).
            frontend.submit(request, self._delivered, time.perf_counter(), at_once=not policy.burst())
        except RpcFailure as exc:
            policy.state.inflight -= 1
            self._release_request()
            self._release_answer()
            self._end(exc.code, str(exc), exc.trailing)

    def _delivered(self, p: Pending) -> None:
        self.policy.state.inflight -= 1
        self._release_request()
        body, failure = self.policy.frontend.finish_request(p)
        if failure is not None:
            self._release_answer()
            self._end(failure.code, str(failure), failure.trailing)
            return
        self.policy.frontend.count(self.method.name, grpc.StatusCode.OK)
        self._answer(body)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ the answer

    def _answer(self, blob: bytes) -> None:
        """Send the answer and the status; over a window it stays counted until taken, in time."""
        policy = self.policy
        size = len(blob)
        if size <= WINDOW:
            self._release_answer()  # a window goes out whatever the client does
            # Nothing of the loop's is left to settle when the call ends: only its place under
            # --grpc-max-rpcs, given back from the poller thread (no loop wake-up for it).
            self.ended = True
            if not self.call.finish(_OK, message=blob, on_done=OnPoller(self._left)):
                self._left(None)
            return
        extra = max(0, ANSWER_COPIES * size - self.held)
        if extra:
            if not policy.state.reserve(extra):
                self._release_answer()
                policy.refuse_buffered()
                self._end(grpc.StatusCode.RESOURCE_EXHAUSTED, ANSWERS_FULL, _RETRY)
                return
            self.held += extra
        self.big = True
        self.timer = policy.loop.call_later(policy.timeout, self._not_taken)
        if not self.call.finish(_OK, message=blob, on_done=self._closed):
            self._closed(None)

    def _left(self, _event: Any) -> None:
        self.policy.gate.leave()

    def _not_taken(self) -> None:
        self.timer = None
        self.policy.write_timeouts += 1
        self.policy.frontend.count(self.method.name, grpc.StatusCode.CANCELLED)
        self.call.cancel()

    def _release_answer(self) -> None:
        if self.held:
            self.policy.state.release(self.held)
            self.held = 0

    def _closed(self, event: Any) -> None:
        """The call is over (``event`` None: it ended without a batch of ours to complete)."""
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._release_request()
        self._release_answer()
        self.policy.gate.leave()
        if self.big and (event is None or cancelled_of(event)):
            self.policy.trim()  # dropped untaken: the client reset the call, left, or timed out


class _Stream:
    """A ``ModelStreamInfer`` stream: answers in completion order, each carrying its request's id.

    An error answers that request with ``error_message`` and the stream goes on, as Triton. One
    message is read at a time, and none while the stream is full (see the module docstring); one
    answer is written at a time, the rest queue here, counted in the daemon's budget.
    """

    def __init__(self, policy: CallPolicy, call: ServerCall, method: Method) -> None:
        self.policy = policy
        self.frontend = policy.frontend
        self.state = policy.state
        self.call = call
        self.method = method
        self.timer: asyncio.TimerHandle | None = None  # the first message's, then a big answer's
        self.live: dict[Pending, tuple[int, int]] = {}  # in flight -> its message bytes, its answer's count
        self.held = 0  # message bytes in flight
        self.queued = 0  # answer bytes waiting for the client
        self.largest = 0  # the largest answer so far
        self.answers: deque[bytes] = deque()
        self.outstanding = 0  # admitted requests whose answer has not gone to the core
        self.paused: bytes | None = None  # a message read while the stream was full
        self.sending = 0  # bytes counted for the answer the core is sending (0: none in flight)
        self.writing = False
        self.half_closed = False
        self.finished = False
        self.ended = False

    def start(self) -> None:
        if not self.call.watch_close(self._closed):
            self._closed(None)
            return
        self.timer = self.policy.loop.call_later(self.policy.timeout, self._no_message)
        self._read()

    def _read(self) -> None:
        if not (self.half_closed or self.ended) and not self.call.receive(self._received):
            self.half_closed = True

    def _no_message(self) -> None:
        self.timer = None
        self.finished = True  # ended here: not counted again as CANCELLED when it closes
        self.frontend.count(self.method.name, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.call.cancel(code_of(grpc.StatusCode.DEADLINE_EXCEEDED),
                         f"the request message did not arrive within {self.policy.timeout:g} s (--request-timeout)")

    def _received(self, event: Any) -> None:
        if self.ended:
            return
        if self.timer is not None and not self.writing:
            self.timer.cancel()
            self.timer = None
        raw = message_of(event)
        if raw is None:
            self.half_closed = True
            self._maybe_finish()
            return
        self._admit(raw)

    def _full(self, size: int) -> bool:
        if self.queued >= STREAM_MAX_ANSWER_BYTES:
            return True
        if not self.live:
            return False
        if len(self.live) >= STREAM_MAX_INFLIGHT or self.held + size > STREAM_MAX_BYTES or not self.largest:
            return True
        return self.queued + (len(self.live) + 1) * self.largest > STREAM_MAX_ANSWER_BYTES

    def _admit(self, raw: bytes) -> None:
        size = len(raw)
        if self._full(size):
            self.paused = raw  # read on when there is room (_room)
            return
        state, policy = self.state, self.policy
        if not state.reserve(size):  # counted while it is parsed
            policy.refuse_buffered()
            self.finished = True
            self.frontend.count(self.method.name, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.call.cancel(code_of(grpc.StatusCode.RESOURCE_EXHAUSTED), BUFFERED_FULL)
            return
        try:
            req = self.method.parse(raw)
        finally:
            state.release(size)
        del raw
        expect = 0 if isinstance(req, Malformed) else policy.expected_answer(req)
        self.outstanding += 1
        state.inflight += 1
        if not policy.reserve(size + expect):  # --max-buffered-mb
            policy.refuse_buffered()
            self.frontend.count(self.method.name, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self._error(BUFFERED_FULL)
        else:
            try:
                p = self.frontend.submit(req, self._delivered, time.perf_counter())
                self.live[p] = (size, expect)
                self.held += size
            except RpcFailure as exc:
                state.release(size + expect)
                self.frontend.count(self.method.name, exc.code)
                self._error(str(exc))
        self._read()

    def _error(self, message: str) -> None:
        from cuvil_edge.daemon.proto import grpc_service_pb2 as pb

        self._queue(pb.ModelStreamInferResponse(error_message=message).SerializeToString())

    def _delivered(self, p: Pending) -> None:
        size, expect = self.live.pop(p, (0, 0))  # nothing after the stream ended: released then
        self.held -= size
        self.state.release(size + expect)
        body, failure = self.frontend.finish_request(p)
        if failure is not None:
            self.frontend.count(self.method.name, failure.code)
            self._error(str(failure))
        else:
            self.frontend.count(self.method.name, grpc.StatusCode.OK)
            self._queue(_as_stream_response(body))  # type: ignore[arg-type]
        self._room()

    def _queue(self, item: bytes) -> None:
        if self.ended:
            return  # a late delivery: nobody will take it
        self.state.hold(len(item))  # counted until it is handed to the core (counted again there)
        self.queued += len(item)
        self.largest = max(self.largest, len(item))
        self.answers.append(item)
        self._write()

    def _write(self) -> None:
        if self.writing or not self.answers or self.ended:
            self._maybe_finish()
            return
        item = self.answers.popleft()
        size = len(item)
        self.outstanding -= 1
        self.state.inflight -= 1
        self.queued -= size
        self.state.release(size)
        if size > WINDOW:  # counted until the client has taken it, which it must do in time
            self.sending = ANSWER_COPIES * size
            self.state.hold(self.sending)
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.policy.loop.call_later(self.policy.timeout, self._not_taken)
        self.writing = True
        if not self.call.send(item, self._sent):
            self.writing = False
            self._release_sending()
        self._room()

    def _not_taken(self) -> None:
        self.timer = None
        self.finished = True
        self.policy.write_timeouts += 1
        self.frontend.count(self.method.name, grpc.StatusCode.CANCELLED)
        self.policy.trim()
        self.call.cancel()

    def _release_sending(self) -> None:
        if self.sending:
            self.state.release(self.sending)
            self.sending = 0

    def _sent(self, event: Any) -> None:
        self.writing = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._release_sending()
        if not event.success or self.ended:
            return  # the client left: _closed releases the rest
        self._write()

    def _room(self) -> None:
        if self.paused is not None and not self.ended and not self._full(len(self.paused)):
            raw, self.paused = self.paused, None
            self._admit(raw)

    def _maybe_finish(self) -> None:
        if (self.half_closed and not self.finished and not self.ended and not self.outstanding
                and not self.writing and not self.answers and self.paused is None):
            self.finished = True
            self.call.finish(_OK, close=False)

    def _closed(self, event: Any) -> None:
        """The stream is over (the client cancelled or left, a timeout reset it, or it finished)."""
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.policy.gate.leave()
        state = self.state
        for p, (size, expect) in self.live.items():
            p.cancelled = True
            state.release(size + expect)
        self.live.clear()  # a late deliver() finds nothing to release twice
        dropped = bool(self.answers) or bool(self.sending)
        while self.answers:
            state.release(len(self.answers.popleft()))
        self._release_sending()
        if self.outstanding:
            state.inflight -= self.outstanding
            state.client_gone += self.outstanding
            self.outstanding = 0
        if dropped and (event is None or cancelled_of(event)):
            self.policy.trim()
        if not self.finished and event is not None and cancelled_of(event):
            self.frontend.count(self.method.name, grpc.StatusCode.CANCELLED)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _as_stream_response(infer_response: bytes) -> bytes:
    """``ModelStreamInferResponse{infer_response: <bytes>}`` without parsing them again (field 2)."""
    return b"\x12" + _varint(len(infer_response)) + infer_response
