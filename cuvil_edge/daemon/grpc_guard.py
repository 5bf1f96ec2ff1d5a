"""What a gRPC call may cost before and after the inference core sees it: the transport's guard.

grpcio reads a unary call's whole request message, up to ``grpc.max_receive_message_length``,
before the handler runs, and keeps the answer of a call whose client does not read for as long
as the connection lives; its ``maximum_concurrent_rpcs`` counts a stream that sent headers and
nothing else like any other call, until the client goes away. So a client without the token
could hold every call slot with half-open health streams, or make the daemon buffer and parse
60 MB health messages, and a token holder that never reads could make it hold gigabytes of
answers. This module wraps every method handler of :class:`~cuvil_edge.daemon.grpc_server.GrpcFrontend`
(the wire format is unchanged: server-side, a unary call and a stream of one message are the
same HTTP/2 frames) so that:

* ``ServerLive``/``ServerReady`` are answered as soon as their headers arrive, without reading
  the request message (it is empty by definition): a half-open or oversized health call costs
  one small answer, never a buffer or a call slot;
* a call without the token is refused from its headers (``UNAUTHENTICATED``), as before;
* authenticated calls in progress are counted here (``--grpc-max-rpcs``; over it,
  ``RESOURCE_EXHAUSTED`` at once, never grpcio's ``INTERNAL``), apart from health calls;
* the first request message must arrive within ``--request-timeout`` (a half-open stream ends
  with ``DEADLINE_EXCEEDED``) and is counted in ``--max-buffered-mb`` before it is parsed;
* an answer larger than an HTTP/2 window (64 KiB) is counted in ``--max-buffered-mb`` until the
  client has taken it, twice (``ANSWER_COPIES``: the serialized bytes stay referenced by
  grpcio's send operation while its transport holds a copy of them), must be taken within
  ``--request-timeout`` (else the call is cancelled and its memory freed), and a full budget
  answers ``RESOURCE_EXHAUSTED`` instead of queueing; once such a call ends without its answer
  taken, the heap is trimmed at the next tick (freed answers of a few MiB stay in glibc's
  arenas otherwise: 478 MiB of 60 unread 4 MiB answers stayed resident after the client left).

What grpcio (1.85) does not let the daemon do, and the bound that holds instead, is in
docs/hardening.md with the C-core functions it rests on: count a message before grpcio has
assembled it (the length prefix is checked against ``--grpc-max-message-mb`` before a byte is
kept, and one message per call is read at a time), close one connection from a handler, and a
reset budget (the server options answer every reset with a PING and close, with GOAWAY, a
connection that does not answer it within ``--request-timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from cuvil_edge.daemon.limits import ANSWER_WINDOW as WINDOW
from cuvil_edge.daemon.limits import ANSWERS_FULL, answer_bytes
from cuvil_edge.errors import DaemonError

# What one gRPC answer costs the daemon at its peak, in answer sizes: while it is built, the
# runtime's output, the response message and its serialized bytes; while it waits for the client,
# the serialized bytes (grpcio's send operation keeps a reference until the message is written
# out) and grpcio's own copy in its transport. Measured: 60 unread 4 MiB answers counted once
# (240 MiB of 256) grew the daemon by 634 MiB; counted twice (32 admitted), by 330 MiB.
ANSWER_COPIES = 3

__all__ = ["ANSWER_COPIES", "BUFFERED_FULL", "CallGate", "GuardedHandlers", "WINDOW"]

log = logging.getLogger("cuvil_edge.daemon.grpc")


class CallGate:
    """Authenticated gRPC calls in progress, at most ``limit`` (``--grpc-max-rpcs``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.refused = 0

    def enter(self) -> bool:
        if self.active >= self.limit:
            self.refused += 1
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active -= 1


class _ClientGone(logging.Filter):
    """grpcio's ERROR for a unary answer whose send failed, as the DEBUG line it is here.

    grpcio sends a unary call's answer after the handler returned it, and logs ``ExecuteBatchError
    raised in core by servicer method`` at ERROR when that send fails. The guard's handlers catch
    the error of every read and write they make themselves (:meth:`GuardedHandlers._gone`), so the
    only send that can fail in grpcio's hands is that last one, and it fails because the client
    reset the call or hung up: no error of the daemon's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("ExecuteBatchError raised in core"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)
        return True


_CLIENT_GONE = _ClientGone()


class _Slot:
    """A call slot of the gate for one call (``async with``): refused over ``--grpc-max-rpcs``.

    A module-level class with slots: defined inside ``_slot`` it was a new type on every call
    (about 17 us of the tiny CNN's gRPC call)."""

    __slots__ = ("guard", "name", "context")

    def __init__(self, guard: GuardedHandlers, name: str, context: grpc.aio.ServicerContext) -> None:
        self.guard = guard
        self.name = name
        self.context = context

    async def __aenter__(self) -> None:
        guard = self.guard
        if not guard.gate.enter():
            await guard._end(self.name, self.context, _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many gRPC calls in progress (--grpc-max-rpcs {guard.gate.limit}); retry later"))

    async def __aexit__(self, *exc: Any) -> None:
        self.guard.gate.leave()


class _Refused(DaemonError):
    """A call the guard ends with ``code`` and ``message`` (never raised: passed to ``_end``)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class GuardedHandlers:
    """Wraps the front end's method handlers; see the module docstring.

    Args:
        frontend (Any): the :class:`~cuvil_edge.daemon.grpc_server.GrpcFrontend`: its ``state``
            (``reserve``/``release`` of ``--max-buffered-mb``, ``limits``), ``count(method, code)``.
        max_rpcs (int): authenticated calls in progress at once.
    """

    def __init__(self, frontend: Any, max_rpcs: int) -> None:
        self.frontend = frontend
        self.state = frontend.state
        self.gate = CallGate(max_rpcs)
        self.write_timeouts = 0
        cygrpc_log = logging.getLogger("grpc._cython.cygrpc")
        if _CLIENT_GONE not in cygrpc_log.filters:
            cygrpc_log.addFilter(_CLIENT_GONE)

    @property
    def timeout(self) -> float:
        return float(self.state.limits.request_timeout)

    # ------------------------------------------------------------------ the three kinds

    def open_call(self, name: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A health call answered from its headers; the request message is never read."""
        inner = handler.unary_unary
        empty = handler.request_deserializer(b"")
        serialize = handler.response_serializer

        async def call(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
            return serialize(await inner(empty, context))

        return grpc.stream_unary_rpc_method_handler(call)

    def unary_call(self, name: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """An authenticated unary call with a counted message in and a timed, counted answer out."""
        inner = handler.unary_unary
        parse = handler.request_deserializer
        serialize = handler.response_serializer

        async def call(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
            async with self._slot(name, context):
                raw = await self._read(name, context, self.timeout)
                if raw is None:
                    await self._end(name, context, _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                                                            "the call ended before its request message"))
                request = await self._parse(name, context, raw, parse)  # type: ignore[arg-type]
                # An inference answer is counted before it is computed, from the model's output
                # sizes, so that answers nobody reads cannot pile up past --max-buffered-mb.
                expected = self.expected_answer(request)
                if expected and not self.reserve(expected):
                    await self._refuse_buffered(name, context, ANSWERS_FULL)
                held = [expected]
                handed = False
                try:
                    answer = serialize(await inner(request, context))
                    handed = await self._hand_over(name, context, answer, held)
                    return answer
                finally:
                    if not handed:
                        self.state.release(held[0])

        # A stream of requests, one response: grpcio sends the answer and the status in one batch
        # (a stream handler's write and status are two), and the request is still read by the
        # guard. Measured with canned answers (bench_serving's floors): 0.33 ms of server CPU per
        # call instead of 0.42 at one client.
        return grpc.stream_unary_rpc_method_handler(call)

    def stream_call(self, name: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """An authenticated bidirectional stream: messages counted in, answers timed out."""
        inner = handler.stream_stream
        parse = handler.request_deserializer
        serialize = handler.response_serializer

        async def call(_requests: Any, context: grpc.aio.ServicerContext) -> None:
            async with self._slot(name, context):
                async def requests() -> AsyncIterator[Any]:
                    timeout: float | None = self.timeout  # the first message; later ones may pause
                    while True:
                        raw = await self._read(name, context, timeout)
                        if raw is None:
                            return
                        timeout = None
                        yield await self._parse(name, context, raw, parse)

                answers = inner(requests(), context)
                try:
                    async for answer in answers:
                        held = [0]
                        try:
                            await self._write(name, context, serialize(answer), held, exists=True)
                        finally:
                            self.state.release(held[0])
                finally:
                    await answers.aclose()

        return grpc.stream_stream_rpc_method_handler(call)

    # ------------------------------------------------------------------ steps

    def _slot(self, name: str, context: grpc.aio.ServicerContext) -> _Slot:
        return _Slot(self, name, context)

    async def _end(self, name: str, context: grpc.aio.ServicerContext, refusal: _Refused) -> None:
        self.frontend.count(name, refusal.code)
        retry = (("retry-after", "1"),) if refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED else ()
        await context.abort(refusal.code, refusal.message, retry)

    async def _read(self, name: str, context: grpc.aio.ServicerContext, timeout: float | None) -> bytes | None:
        """The next request message (raw bytes), None at the end of the stream."""
        timer: asyncio.TimerHandle | None = None
        expired = [False]
        if timeout is not None:
            # A timer that cancels this task, not asyncio.wait_for: wait_for wraps the read in a
            # task of its own, two more loop iterations on every call (measured on the tiny CNN:
            # wait_for's task and wake-ups were a tenth of the daemon's time per gRPC call).
            task = asyncio.current_task()
            assert task is not None

            def expire() -> None:
                expired[0] = True
                task.cancel()

            timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            raw = await context.read()
        except asyncio.CancelledError:
            if not expired[0]:
                raise
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation is handled
            if uncancel is not None:
                uncancel()
            await self._end(name, context, _Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message did not arrive within {timeout:g} s (--request-timeout)"))
            return None
        except Exception as exc:  # noqa: BLE001 - the client left mid-read
            self._gone(name, exc)
        finally:
            if timer is not None:
                timer.cancel()
        if raw is grpc.aio.EOF:
            return None
        return raw  # type: ignore[no-any-return,unused-ignore]

    async def _parse(self, name: str, context: grpc.aio.ServicerContext, raw: bytes,
                     parse: Callable[[bytes], Any]) -> Any:
        """Count ``raw`` in ``--max-buffered-mb`` while it is parsed (the handler counts what it keeps)."""
        size = len(raw)
        if not self.state.reserve(size):
            await self._refuse_buffered(name, context, BUFFERED_FULL)
        try:
            return parse(raw)
        finally:
            self.state.release(size)

    def _dropped(self, size: int) -> None:
        self.state.release(size)
        self._trim()

    def _trim(self) -> None:
        """An answer was dropped untaken: have the heap trimmed at the next tick."""
        dropped = getattr(self.state, "dropped_slow_client", None)
        if dropped is not None:
            dropped()

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

    async def _refuse_buffered(self, name: str, context: grpc.aio.ServicerContext, message: str) -> None:
        self.state.refused["buffered"] = self.state.refused.get("buffered", 0) + 1
        await self._end(name, context, _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, message))

    async def _hand_over(self, name: str, context: grpc.aio.ServicerContext, answer: bytes,
                         held: list[int]) -> bool:
        """Prepare a unary call's answer for grpcio to send once the handler returns it.

        An answer within a window goes out whatever the client does: nothing to do (False: the
        caller releases ``held[0]`` now). A larger one is counted (``ANSWER_COPIES`` times its
        size; a full budget refuses the call instead) until the call ends, and must be taken within
        ``--request-timeout``: a timer cancels the call's task, which is grpcio's send of the
        answer by then, so the stream is reset and grpcio frees its copy. True: the call's end
        releases ``held[0]``.
        """
        size = len(answer)
        if size <= WINDOW:
            return False
        extra = max(0, ANSWER_COPIES * size - held[0])
        if extra:
            if not self.state.reserve(extra):
                await self._refuse_buffered(name, context, ANSWERS_FULL)
            held[0] += extra
        task = asyncio.current_task()
        assert task is not None
        expired = [False]

        def expire() -> None:
            expired[0] = True
            self.write_timeouts += 1
            self.frontend.count(name, grpc.StatusCode.CANCELLED)
            log.debug("gRPC %s: the client did not take a %d-byte answer within %g s; call cancelled",
                      name, size, self.timeout)
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self.timeout, expire)

        def ended(ctx: Any) -> None:
            timer.cancel()
            self.state.release(held[0])
            if expired[0] or ctx.cancelled():
                self._trim()  # dropped untaken: the client reset the call, left, or timed out

        context.add_done_callback(ended)
        return True

    async def _write(self, name: str, context: grpc.aio.ServicerContext, answer: bytes, held: list[int],
                     exists: bool = False) -> None:
        """Send one answer; over a window it is counted until taken and must be taken in time.

        ``held[0]`` bytes are counted for it already (``ANSWER_COPIES`` times the expected size of
        an inference answer); the caller releases ``held[0]`` afterwards. A stream's answer
        ``exists`` already (its handler admitted the request against the budget): it is counted
        even past the limit instead of refused. An answer not taken
        within the timeout stays counted until the call ends (the cancelled call's stream is
        reset and grpcio frees its copy then).
        """
        size = len(answer)
        if size <= WINDOW:
            try:
                await context.write(answer)
            except Exception as exc:  # noqa: BLE001 - the client left mid-write (see below)
                self._gone(name, exc)
            return
        extra = max(0, ANSWER_COPIES * size - held[0])
        if extra:
            if exists:
                self.state.hold(extra)
            elif not self.state.reserve(extra):
                await self._refuse_buffered(name, context, ANSWERS_FULL)
            held[0] += extra
        try:
            await asyncio.wait_for(context.write(answer), self.timeout)
        except asyncio.CancelledError:
            self._trim()  # the client reset the call or left with the answer untaken
            raise
        except asyncio.TimeoutError:
            self.write_timeouts += 1
            self.frontend.count(name, grpc.StatusCode.CANCELLED)
            stuck, held[0] = held[0], 0
            context.add_done_callback(lambda _ctx: self._dropped(stuck))
            log.debug("gRPC %s: the client did not take a %d-byte answer within %g s; call cancelled",
                      name, size, self.timeout)
            raise asyncio.CancelledError() from None
        except Exception as exc:  # noqa: BLE001 - the client left mid-write
            self._trim()
            self._gone(name, exc)

    def _gone(self, name: str, exc: Exception) -> NoReturn:
        """End a call whose client left while it was written to or read from.

        grpcio raises its ``ExecuteBatchError`` then, and logs every one that leaves a handler at
        ERROR; a client that hangs up is no error of the daemon's, so the call ends cancelled.
        """
        self.frontend.count(name, grpc.StatusCode.CANCELLED)
        log.debug("gRPC %s: the client left: %s", name, exc)
        raise asyncio.CancelledError() from None


BUFFERED_FULL = "the daemon holds its limit of request bytes already (--max-buffered-mb); retry later"
