"""HTTP/1.1 for the daemon: one asyncio ``Protocol`` per connection over ``httptools``.

Modelled on uvicorn's ``protocols/http/httptools_impl.py`` but leaner: no ASGI, no per-request
task. A complete request goes to ``app.handle(request)``, which answers synchronously or later
through ``request.respond(...)`` (the infer path answers from the batcher's completion callback).
Keep-alive and pipelining are honoured: pipelined requests wait in a short queue and are served
in order; reading pauses when that queue is full.

Limits: a ``Content-Length`` (or a chunked body) over ``max_body`` gets 413 and the connection
closes; malformed HTTP gets 400 and closes. A client that disconnects mid-request loses its
buffers at once; a request of its already queued for inference is marked ``cancelled`` so the
batcher skips it. Idle and slow connections are closed by :meth:`HttpProtocol.sweep`, which the
server calls from its tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

__all__ = ["HttpProtocol", "Request", "STATUS_LINES", "json_error"]

log = logging.getLogger("cuvil_edge.daemon.http")

_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large", 499: "Client Closed Request",
    500: "Internal Server Error", 503: "Service Unavailable", 507: "Insufficient Storage",
}
STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}\r\n".encode() for code, reason in _REASONS.items()}

_JSON = b"application/json"
_OCTET = b"application/octet-stream"


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
        state (Any): room for the handler (the infer path keeps its pending entry here).
    """

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "received",
                 "cancelled", "state", "_conn", "_done")

    def __init__(self, conn: HttpProtocol, method: bytes, url: bytes, headers: dict[bytes, bytes],
                 body: bytes, keep_alive: bool) -> None:
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
        """Answer ``{"error": message}`` with ``status``."""
        self.respond(status, json_error(message), _JSON, headers)

    @property
    def done(self) -> bool:
        """Whether an answer was sent (or the client is gone)."""
        return self._done


class HttpProtocol(asyncio.Protocol):
    """One client connection.

    Args:
        handle (Callable[[Request], None]): the application; answers through ``request.respond``.
        server (Any): object with ``connections`` (set), ``max_body`` (int), ``on_request_done(req)``
            and ``shutting_down`` (bool) attributes; the daemon's ServerState.
    """

    MAX_PIPELINE = 8
    MAX_HEADER_BYTES = 64 * 1024

    def __init__(self, handle: Callable[[Request], None], server: Any) -> None:
        self.handle = handle
        self.server = server
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
        self._body: list[bytes] = []
        self._body_size = 0
        self._rejected = False  # 413 sent; ignore the rest of this message, then close
        self._reading_paused = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        # Drop everything this connection holds; an in-flight request is skipped by the batcher.
        if self.current is not None and not self.current.done:
            self.current.cancelled = True
            self.current._done = True
            self.server.on_client_gone(self.current)
        for req in self.pipeline:
            req.cancelled = True
            req._done = True
        self.pipeline.clear()
        self._body = []
        self.current = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrade is not supported")
        except httptools.HttpParserError as exc:
            if not self._rejected:
                self._fatal(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool | None:
        return None  # close the transport

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_size = 0
        self.message_started = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.MAX_HEADER_BYTES:
            raise httptools.HttpParserError("request headers larger than 64 KiB")
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > self.server.max_body:
                self._reject_too_large(n)
                return
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            # curl sends this for bodies over 1 KiB and waits a second for the go-ahead.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._body_size += len(body)
        if self._body_size > self.server.max_body:
            self._reject_too_large(self._body_size)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.message_started = None
        if self._rejected or self.closed:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        req = Request(self, self.parser.get_method(), self._url, self._headers, body,
                      self.parser.should_keep_alive())
        if self.current is None:
            self._dispatch(req)
        else:
            self.pipeline.append(req)
            if len(self.pipeline) >= self.MAX_PIPELINE and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]

    # ------------------------------------------------------------------ serving

    def _dispatch(self, req: Request) -> None:
        self.current = req
        self.server.inflight += 1
        try:
            self.handle(req)
        except Exception as exc:  # a handler bug must not kill the connection silently
            log.exception("handler failed for %s %s", req.method.decode(), req.path)
            req.error(500, f"internal error: {type(exc).__name__}: {exc}")

    def send_response(self, req: Request, status: int, body: bytes | list[bytes] | bytearray,
                      content_type: bytes, headers: list[tuple[bytes, bytes]] | None) -> None:
        """Write the answer to ``req`` and move on to the next pipelined request."""
        transport = self.transport
        self.server.on_request_done(req, status)
        if transport is None or self.closed:
            return
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
        if isinstance(body, list):
            transport.write(b"".join(head + body))
        else:
            head.append(body)  # type: ignore[arg-type]
            transport.write(b"".join(head))
        self.last_activity = time.monotonic()
        if req is self.current:
            self.current = None
        if not keep:
            self.pipeline.clear()
            transport.close()
            return
        if self.pipeline and self.current is None:
            nxt = self.pipeline.popleft()
            if self._reading_paused and len(self.pipeline) < self.MAX_PIPELINE // 2:
                self._reading_paused = False
                transport.resume_reading()
            self._dispatch(nxt)

    def _reject_too_large(self, size: int) -> None:
        self._rejected = True
        self._body = []
        limit = self.server.max_body
        self._fatal(413, f"request body of {size} bytes exceeds the limit of {limit} bytes "
                         f"({limit / 1048576:g} MiB); raise it with --max-body-mb")

    def _fatal(self, status: int, message: str) -> None:
        """Answer an error outside any request and close the connection."""
        if self.transport is None or self.closed:
            return
        self.server.on_protocol_error(status)
        body = json_error(message)
        self.transport.write(STATUS_LINES[status] + b"content-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        self.transport.close()
        self.closed = True

    # ------------------------------------------------------------------ housekeeping

    @property
    def idle(self) -> bool:
        """No request in progress, queued or partially received."""
        return self.current is None and not self.pipeline and self.message_started is None

    def sweep(self, now: float, keep_alive: float, request_timeout: float) -> None:
        """Close the connection if idle past ``keep_alive`` or a request is slower than allowed."""
        if self.closed or self.transport is None:
            return
        if self.message_started is not None and now - self.message_started > request_timeout:
            self._fatal(408, f"request not received within {request_timeout:g} s")
        elif self.idle and now - self.last_activity > keep_alive:
            self.transport.close()

    def shutdown(self) -> None:
        """Close now if idle; otherwise the answer in progress closes it (shutting_down)."""
        if self.transport is not None and self.idle:
            self.transport.close()
