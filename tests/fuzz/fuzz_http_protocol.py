"""Fuzz target: the daemon's HTTP/1.1 connection (httptools parser, limits, framing, pipelining).

Bytes arrive in fuzzer-chosen chunks on one ``HttpProtocol`` over a recording transport (a
stand-in for asyncio's socket transport: it keeps what is written and the pause/close calls).
The application answers each request at once (200 with a small body). Promise: no exception
escapes the protocol; every answer written is a whole HTTP/1.1 response; nothing is written after
the connection is closed; the buffered-bytes count returns to zero once the connection is lost.
"""

from __future__ import annotations

import sys

import atheris
from _harness import main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.daemon.http import HttpProtocol
    from cuvil_edge.daemon.limits import Limits
    from cuvil_edge.daemon.server import ServerState


LIMITS = Limits(max_body=4096, max_buffered=8192, max_header=2048, max_pipeline=4, max_connections=8,
                write_high_water=1024)


class RecordingTransport:
    """Stand-in for an asyncio socket transport: records writes, pauses and closes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.eof = False
        self.paused = False
        self.protocol: HttpProtocol | None = None

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof, "write after close"
        self.out += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                self.protocol.connection_lost(None)

    abort = close

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0  # the peer reads everything at once

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


_DEFERRED: list = []  # requests answered after the next chunk arrives (as the batcher answers)


def _answer(req) -> None:  # type: ignore[no-untyped-def]
    if req.path.endswith("/later"):
        return  # answered never: the pipeline must stay bounded
    if req.path.endswith("/async"):
        _DEFERRED.append(req)
        return
    req.respond(200, b'{"ok": true}')


def test_one_input(data: bytes) -> None:
    # Byte 0: bit 0 asks for a token, the rest seeds the chunk sizes; the remaining bytes arrive
    # in those chunks, so real requests stay intact in the seeds.
    if not data:
        return
    state = ServerState(LIMITS, "tok" if data[0] & 1 else None)
    proto = HttpProtocol(_answer, state)
    transport = RecordingTransport()
    transport.protocol = proto
    proto.connection_made(transport)  # type: ignore[arg-type]
    stream, pos, step = data[1:], 0, data[0] >> 1
    while pos < len(stream) and not transport.closed and not transport.paused:  # paused: asyncio delivers nothing
        size = 1 + (step * 37 + pos) % 97 if step else len(stream)
        chunk = stream[pos:pos + size]
        pos += size
        if (pos + step) % 13 == 0:
            proto.pause_writing()
            proto.resume_writing()
        proto.data_received(chunk)
        while _DEFERRED:  # answers that arrive after the connection was refused or closed go nowhere
            _DEFERRED.pop().respond(200, b"{}")
        # Reading pauses at max_pipeline; requests already in the chunk being parsed still queue
        # (httptools cannot stop mid-buffer), so the bound is the limit plus one chunk's worth.
        assert len(proto.pipeline) <= LIMITS.max_pipeline + len(chunk) // 16 + 1
        assert 0 <= state.buffered <= LIMITS.max_buffered
    out = bytes(transport.out)
    if out:
        assert out.startswith(b"HTTP/1.1 "), out[:40]
    transport.close()
    _DEFERRED.clear()
    assert state.buffered == 0, state.buffered


def seeds() -> list[bytes]:
    reqs = [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nAuthorization: Bearer tok\r\n\r\nhello",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nHEAD /v2 HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nPRI * HTTP/2.0\r\n",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /later HTTP/1.1\r\n\r\n" * 6,
        b"POST /async HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /async HTTP/1.1\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 9000\r\nExpect: 100-continue\r\n\r\n" + b"x" * 100,
    ]
    return [bytes([flags]) + r for r in reqs for flags in (0, 1, 6, 7)]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
