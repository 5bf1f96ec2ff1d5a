"""Raw HTTP/2 frames for the gRPC attack tests: what a hostile client sends, byte by byte.

A real gRPC client does not open a stream and stop after its headers, reset streams as fast as it
can, or never read its answers; these tests need a client that does. HPACK here uses only
"literal header field without indexing, new name" (RFC 7541 section 6.2.2) with plain strings,
which every decoder must accept.
"""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SERVICE = "/inference.GRPCInferenceService/"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(n), 7) + n + _hpack_int(len(v), 7) + v


def grpc_headers(stream: int, method: str, token: str | None = None, end_stream: bool = False) -> bytes:
    """A HEADERS frame starting a gRPC call to ``method`` (e.g. ``ServerLive``) on ``stream``."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers")]
    if token:
        fields.append(("authorization", f"Bearer {token}"))
    block = b"".join(_literal(k, v) for k, v in fields)
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, block)


def grpc_data(stream: int, message: bytes, end_stream: bool = False, max_frame: int = 16384) -> bytes:
    """DATA frames carrying one length-prefixed gRPC message."""
    payload = b"\x00" + struct.pack(">I", len(message)) + message
    out = bytearray()
    for i in range(0, len(payload), max_frame):
        last = i + max_frame >= len(payload)
        out += frame(DATA, END_STREAM if (end_stream and last) else 0, stream, payload[i:i + max_frame])
    return bytes(out)


def rst(stream: int, code: int = 0x8) -> bytes:
    """RST_STREAM (CANCEL by default)."""
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def connect(address: str, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to ``host:port`` past the preface, with the server's SETTINGS acknowledged."""
    host, _, port = address.rpartition(":")
    s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
    return s


def read_frames(sock: socket.socket, timeout: float) -> list[tuple[int, int, int, bytes]]:
    """Frames the server sends within ``timeout`` seconds (or until it closes): (type, flags, stream, payload)."""
    import time

    buf = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            break
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        buf += chunk
    frames = []
    i = 0
    while i + 9 <= len(buf):
        length = int.from_bytes(buf[i:i + 3], "big")
        if i + 9 + length > len(buf):
            break
        frames.append((buf[i + 3], buf[i + 4], int.from_bytes(buf[i + 5:i + 9], "big") & 0x7FFFFFFF,
                       bytes(buf[i + 9:i + 9 + length])))
        i += 9 + length
    return frames
