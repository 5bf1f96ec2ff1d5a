"""HTTP/1.1 for the daemon: one asyncio ``Protocol`` per connection over ``httptools``.

Modelled on uvicorn's ``protocols/http/httptools_impl.py`` but leaner: no ASGI, no per-request
task. A complete request goes to ``app.handle(request)``, which answers synchronously or later
through ``request.respond(...)`` (the infer path answers from the batcher's completion callback).
Keep-alive and pipelining are honoured: pipelined requests wait in a short queue and are served
in order; reading pauses when that queue is full.

Untrusted input costs little (the bounds are :class:`~cuvil_edge.daemon.limits.Limits`):

* a connection beyond ``max_connections`` gets 503 at once and is closed;
* on headers-complete, before one body byte is kept and before ``100 Continue``: the bearer
  token (401); a body on anything but a ``POST`` to an authenticated route (a ``GET``, a
  ``HEAD``, a health probe) is refused at once (400) and never reserved; the declared size against ``max_body`` (413) and against the bytes all connections
  buffer together, ``max_buffered`` (503 + ``Retry-After``); a chunked body is counted as it comes;
* request line plus headers over ``max_header`` get 431; ``CONNECT`` gets one 405; a request
  asking for a protocol ``Upgrade`` is answered as plain HTTP/1.1 once, then the connection closes;
* a client that does not read its answers: once ``write_high_water`` bytes wait in its send
  buffer (asyncio's ``pause_writing``) the daemon stops serving and reading it, and the unsent
  bytes count in ``max_buffered`` (an inference answer is counted from before it is computed,
  :mod:`~cuvil_edge.daemon.kserve`), so slow readers together hold at most that budget; at most
  ``max_pipeline`` parsed requests wait per connection; it is closed after ``request_timeout``
  and the heap it used is given back to the system at the next tick;
* every refusal is answered once, the write side is shut, further input is discarded, and the
  connection closes when the client hangs up or after a short linger: the client reads the answer
  instead of a reset, and a refused client cannot make the daemon buffer anything.

A ``HEAD`` answer carries the headers of the ``GET`` answer and no body. A client that disconnects
mid-request loses its buffers at once; a request of its already queued for inference is marked
``cancelled`` so the batcher skips it. Idle and slow connections are closed by
:meth:`HttpProtocol.sweep`, which the server calls from its tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

from cuvil_edge.daemon.limits import MAX_ERROR, bearer_ok, printable

__all__ = ["HttpProtocol", "Request", "STATUS_LINES", "json_error"]

log = logging.getLogger("cuvil_edge.daemon.http")

_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
    431: "Request Header Fields Too Large", 499: "Client Closed Request",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable", 507: "Insufficient Storage",
}
STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}\r\n".encode() for code, reason in _REASONS.items()}

_JSON = b"application/json"
_OCTET = b"application/octet-stream"
_LINGER_S = 2.0  # how long a refused connection may keep sending before it is closed
_OPEN_PATHS = b"/v2/health/"  # answered without the bearer token (probes); they take no body


def json_error(message: str) -> bytes:
    """``{"error": message}`` as bytes."""
    import json

    return json.dumps({"error": message}).encode()


class Request:
    """One parsed HTTP request and the way to answer it.

    Attributes:
        method (bytes): e.g. ``b"POST"``.
        path (str): the URL path (not decoded).
        query (bytes): the query string, possibly empty.
        headers (dict[bytes, bytes]): lower-case names.
        body (bytes): the whole body.
        received (float): ``time.perf_counter()`` when the body completed.
        cancelled (bool): the client went away before the answer.
        state (Any): room for the handler (the infer path keeps its pending entry here, and clears
            it when the entry is delivered: a cycle keeps the body alive until a full collection).
    """

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "received",
                 "cancelled", "state", "reserved", "_conn", "_done")

    def __init__(self, conn: HttpProtocol, method: bytes, url: bytes, headers: dict[bytes, bytes],
                 body: bytes | bytearray, keep_alive: bool) -> None:
        self._conn = conn
        self.method = method
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.received = time.perf_counter()
        self.cancelled = False
        self.state: Any = None
        self.reserved = 0  # bytes counted against the server's buffered total until answered
        self._done = False

    def respond(self, status: int, body: bytes | list[bytes] | bytearray = b"",
                content_type: bytes = _JSON, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Send the answer (once; later calls and calls after a disconnect are ignored)."""
        if self._done:
            return
        self._done = True
        self._conn.send_response(self, status, body, content_type, headers)

    def respond_json(self, status: int, payload: bytes) -> None:
        """Answer with an already-encoded JSON body."""
        self.respond(status, payload)

    def error(self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer ``{"error": message}`` with ``status`` (the message cut to ``MAX_ERROR`` characters)."""
        self.respond(status, json_error(printable(message, MAX_ERROR)), _JSON, headers)

    @property
    def done(self) -> bool:
        """Whether an answer was sent (or the client is gone)."""
        return self._done


class HttpProtocol(asyncio.Protocol):
    """One client connection.

    Args:
        handle (Callable[[Request], None]): the application; answers through ``request.respond``.
        server (Any): the daemon's ServerState: ``connections`` (set), ``limits`` (Limits),
            ``token`` (bytes | None), ``max_connections`` (int, the effective cap), ``buffered``
            (int) with ``reserve(n) -> bool`` and ``release(n)``, ``on_request_done(req, status)``,
            ``on_client_gone(req)``, ``on_protocol_error(status)``, ``on_refused(kind)`` and
            ``shutting_down`` (bool).
    """

    def __init__(self, handle: Callable[[Request], None], server: Any) -> None:
        self.handle = handle
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.last_activity = time.monotonic()
        self.message_started: float | None = None  # monotonic start of a partial request
        self.current: Request | None = None  # request being served
        self.pipeline: deque[Request] = deque()
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._header_overflow = False
        self._body: list[bytes] = []
        self._buf: bytearray | None = None  # the declared Content-Length, filled in place
        self._body_size = 0
        self._reserved = 0  # bytes of the message being received, counted in server.buffered
        self._upgrade = False
        self._rejected = False  # a refusal was sent: discard the rest, then close
        self._lingering: float | None = None  # monotonic time the refusal was sent
        self._reading_paused = False
        self._writing_paused: float | None = None  # monotonic time the send buffer filled up
        self._unsent = 0  # answer bytes waiting in the send buffer, counted in server.buffered

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        over = len(self.server.connections) >= self.server.max_connections
        self.server.connections.add(self)
        self.transport.set_write_buffer_limits(high=self.limits.write_high_water)  # type: ignore[union-attr]
        if over:
            self.server.on_refused("connections")
            self._refuse(503, f"too many connections (limit {self.server.max_connections}); retry later",
                         [(b"retry-after", b"1")], count=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._sent()
        # Drop everything this connection holds; an in-flight request is skipped by the batcher.
        if self.current is not None and not self.current.done:
            self.current.cancelled = True
            self.current._done = True
            self.server.on_client_gone(self.current)
            self._release(self.current)
        for req in self.pipeline:
            req.cancelled = True
            req._done = True
            self._release(req)
        self.pipeline.clear()
        self._drop_partial()
        self.current = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self._rejected:
            return  # refused: read and forget until the client hangs up or the linger ends
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request asking for the upgrade was answered (or refused) as plain HTTP; what
            # follows it is another protocol's bytes: no more requests on this connection.
            self._upgrade_tail()
        except httptools.HttpParserError as exc:
            if self._rejected or self.closed:
                return
            if self._header_overflow:
                self._refuse(431, f"request line and headers exceed {self.limits.max_header} bytes "
                                  "(--max-header-kb)")
            else:
                self._refuse(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def pause_writing(self) -> None:
        # The client does not read: its answers fill the send buffer. Serve it nothing more and
        # stop reading its requests until it catches up (sweep closes it if it never does).
        self._writing_paused = time.monotonic()
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = None
        self._sent()
        self._update_reading()
        self._next()

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._buf = None
        self._body_size = 0
        self._upgrade = False
        self.message_started = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.limits.max_header:
            self._header_overflow = True
            raise httptools.HttpParserError("request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.limits.max_header:
            self._header_overflow = True
            raise httptools.HttpParserError("request headers too large")
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        headers = self._headers
        if self.parser.get_method() == b"CONNECT":
            self._refuse(405, "CONNECT is not supported: cuvil-edged is not a proxy")
            return
        self._upgrade = b"upgrade" in headers.get(b"connection", b"").lower() and b"upgrade" in headers
        # Auth before the body: nothing of an unauthenticated client is buffered.
        token = self.server.token
        open_path = self._url.startswith(_OPEN_PATHS)
        if token is not None and not open_path:
            if not bearer_ok(headers.get(b"authorization"), token):
                self.server.on_refused("auth")
                self._refuse(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                             [(b"www-authenticate", b'Bearer realm="cuvil-edged"')])
                return
        length = headers.get(b"content-length")
        n = 0
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
        if (n > 0 or b"chunked" in headers.get(b"transfer-encoding", b"").lower()) and (
                open_path or self.parser.get_method() != b"POST"):
            # Only a POST to an authenticated route takes a body: a GET, a HEAD or a probe that
            # declares one is refused before a byte of it is counted, kept or waited for.
            method = self.parser.get_method()
            where = f"{method.decode('latin-1')} {printable(self._url.split(b'?', 1)[0])}"
            if method in (b"GET", b"HEAD"):
                self._refuse(400, f"{where}: a {method.decode()} request takes no body")
            else:
                self._refuse(405, f"{where} takes no request body" + (": use GET" if open_path else ""),
                             [(b"allow", b"GET, HEAD")] if open_path else None)
            return
        if length is not None:
            if n > self.limits.max_body:
                self._reject_too_large(n)
                return
        if n > 0:
            if not self._reserve(n):
                return
            # One buffer of the declared size, filled in place: a list of chunks joined at the end
            # would hold the body twice at the peak.
            self._buf = bytearray(n)
        if headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            # curl sends this for bodies over 1 KiB and waits a second for the go-ahead; only now,
            # with auth and limits passed, is the client told to send its body.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._body_size += len(body)
        if self._body_size > self.limits.max_body:
            self._reject_too_large(self._body_size)
            return
        buf = self._buf
        if buf is not None and self._body_size <= len(buf):
            buf[self._body_size - len(body):self._body_size] = body
            return
        if self._body_size > self._reserved and not self._reserve(self._body_size - self._reserved):
            return  # chunked (or longer than declared): counted as it arrives
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.message_started = None
        if self._rejected or self.closed:
            return
        if self._buf is not None:
            body: bytes | bytearray = self._buf
            self._buf = None
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        req = Request(self, self.parser.get_method(), self._url, self._headers, body,
                      self.parser.should_keep_alive() and not self._upgrade)
        req.reserved, self._reserved = self._reserved, 0
        if self.current is None and self._writing_paused is None:
            self._dispatch(req)
        else:
            self.pipeline.append(req)
            self._update_reading()

    # ------------------------------------------------------------------ serving

    def _dispatch(self, req: Request) -> None:
        self.current = req
        self.server.inflight += 1
        try:
            self.handle(req)
        except Exception as exc:  # a handler bug must not kill the connection silently
            log.exception("handler failed for %s %s", req.method.decode(), req.path)
            req.error(500, f"internal error: {type(exc).__name__}")

    def _next(self) -> None:
        """Serve the next pipelined request, unless one is being served or the client is not reading."""
        if self.closed or self.current is not None or self._writing_paused is not None:
            return
        if self.pipeline:
            nxt = self.pipeline.popleft()
            self._update_reading()
            self._dispatch(nxt)

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        pause = self._writing_paused is not None or len(self.pipeline) >= self.limits.max_pipeline
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused and not self._rejected:
            self._reading_paused = False
            transport.resume_reading()

    def send_response(self, req: Request, status: int, body: bytes | list[bytes] | bytearray,
                      content_type: bytes, headers: list[tuple[bytes, bytes]] | None) -> None:
        """Write the answer to ``req`` and move on to the next pipelined request."""
        transport = self.transport
        self.server.on_request_done(req, status)
        self._release(req)
        if transport is None or self.closed or self._rejected:
            return  # gone, or refused meanwhile (its write side is shut): the answer has nowhere to go
        if isinstance(body, list):
            size = sum(len(b) for b in body)
        else:
            size = len(body)
        keep = req.keep_alive and not self.server.shutting_down and status != 413
        head = [STATUS_LINES.get(status) or f"HTTP/1.1 {status} Status\r\n".encode(),
                b"content-type: ", content_type, b"\r\ncontent-length: ", str(size).encode(), b"\r\n"]
        if headers:
            for k, v in headers:
                head.append(k + b": " + v + b"\r\n")
        if not keep:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if req.method == b"HEAD":
            transport.write(b"".join(head))  # the GET answer's headers, its length, no body
        elif isinstance(body, list):
            transport.write(b"".join(head + body))
        else:
            head.append(body)  # type: ignore[arg-type]
            transport.write(b"".join(head))
        self.last_activity = time.monotonic()
        unsent = transport.get_write_buffer_size()
        if unsent > self.limits.write_high_water:
            # The client has not taken this answer yet: it counts in --max-buffered-mb until it
            # does (resume_writing) or it is dropped (sweep), so slow readers cannot pile up more.
            self._unsent += unsent
            self.server.hold(unsent)
        if req is self.current:
            self.current = None
        if not keep:
            for queued in self.pipeline:
                self._release(queued)
            self.pipeline.clear()
            transport.close()
            return
        self._next()

    # ------------------------------------------------------------------ limits

    def _sent(self) -> None:
        """The answers waiting in the send buffer were taken (or dropped with the connection)."""
        if self._unsent:
            self.server.release(self._unsent)
            self._unsent = 0

    def _reserve(self, n: int) -> bool:
        """Count ``n`` more bytes of this message against the server's total; refuse if over."""
        if self.server.reserve(n):
            self._reserved += n
            return True
        self.server.on_refused("buffered")
        self._drop_partial()
        self._refuse(503, f"the daemon is buffering {self.limits.max_buffered} bytes of requests already "
                          "(--max-buffered-mb); retry later", [(b"retry-after", b"1")])
        return False

    def _release(self, req: Request) -> None:
        if req.reserved:
            self.server.release(req.reserved)
            req.reserved = 0
        if req.body and req.cancelled:
            req.body = b""

    def _drop_partial(self) -> None:
        self._body = []
        self._buf = None
        if self._reserved:
            self.server.release(self._reserved)
            self._reserved = 0

    def _reject_too_large(self, size: int) -> None:
        limit = self.limits.max_body
        self._drop_partial()
        self._refuse(413, f"request body of {size} bytes exceeds the limit of {limit} bytes "
                          f"({limit / 1048576:g} MiB); raise it with --max-body-mb")

    def _upgrade_tail(self) -> None:
        if self._rejected or self.closed:
            return
        if self.current is None and not self.pipeline:
            self._close_when_flushed()
        # Otherwise the upgrade request's answer carries "connection: close" and closes.

    def _close_when_flushed(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _refuse(self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None,
                count: bool = True) -> None:
        """Answer once outside any request, shut the write side, then discard input until close.

        Closing at once would reset a client still sending its body, and it would see a reset
        instead of the answer; lingering a moment lets it read the answer, and costs nothing here.
        """
        transport = self.transport
        if transport is None or self.closed or self._rejected:
            return
        if count:
            self.server.on_protocol_error(status)
        self._rejected = True
        self._lingering = time.monotonic()
        self.message_started = None
        body = json_error(message)
        head = [STATUS_LINES[status], b"content-type: application/json\r\ncontent-length: ",
                str(len(body)).encode(), b"\r\nconnection: close\r\n"]
        for k, v in headers or ():
            head.append(k + b": " + v + b"\r\n")
        transport.write(b"".join(head) + b"\r\n" + body)
        for queued in self.pipeline:
            self._release(queued)
        self.pipeline.clear()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()  # to see the client hang up
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except (OSError, RuntimeError):
                transport.close()
        else:
            transport.close()

    def _fatal(self, status: int, message: str) -> None:
        """Answer an error outside any request and close the connection."""
        self._refuse(status, message)

    # ------------------------------------------------------------------ housekeeping

    @property
    def idle(self) -> bool:
        """No request in progress, queued or partially received."""
        return self.current is None and not self.pipeline and self.message_started is None

    def sweep(self, now: float, keep_alive: float | None = None, request_timeout: float | None = None) -> None:
        """Close the connection if idle past ``keep_alive``, a request is slower than allowed, the
        client has not read its answers for ``request_timeout``, or a refusal has lingered enough."""
        if self.closed or self.transport is None:
            return
        keep_alive = self.limits.keep_alive if keep_alive is None else keep_alive
        request_timeout = self.limits.request_timeout if request_timeout is None else request_timeout
        if self._lingering is not None:
            if now - self._lingering > _LINGER_S:
                self.transport.abort()
        elif self._writing_paused is not None and now - self._writing_paused > request_timeout:
            log.debug("closing a connection that has not read its answers for %.0f s", request_timeout)
            self.transport.abort()
            self.server.dropped_slow_client()
        elif self.message_started is not None and now - self.message_started > request_timeout:
            self._refuse(408, f"request not received within {request_timeout:g} s")
        elif self.idle and now - self.last_activity > keep_alive:
            self.transport.close()

    def shutdown(self) -> None:
        """Close now if idle; otherwise the answer in progress closes it (shutting_down)."""
        if self.transport is not None and self.idle:
            self.transport.close()
