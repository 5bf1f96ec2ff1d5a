"""What one client may cost the daemon, and the cheap checks that enforce it before work is done.

Untrusted bytes are judged before they are buffered or parsed: the bearer token on the request
headers (before the body is read and before ``100 Continue``), the declared body size against the
per-request limit and the total of bytes buffered by every connection, the size and nesting depth
of a JSON document before ``json.loads`` sees it. Every front end (HTTP here, gRPC beside it) takes
the same :class:`Limits` from :meth:`Config.limits <cuvil_edge.daemon.config.Config.limits>`, so one
set of documented options bounds them all.

Non-finite numbers: RFC 8259 JSON has no ``NaN`` or ``Infinity``, yet Python's ``json`` reads and
writes them. A request carrying them is refused with 400 (:func:`loads_limited`); a model output
that is not finite is written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
(:func:`finite_json_list`), which ``tritonclient``'s ``as_numpy`` turns back into the IEEE values
and any strict JSON parser accepts. Binary outputs carry the exact bits.
"""

from __future__ import annotations

import hmac
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil_edge.errors import DaemonError

__all__ = [
    "ANSWERS_FULL",
    "ANSWER_WINDOW",
    "JsonRefused",
    "Limits",
    "answer_bytes",
    "MAX_ECHO",
    "MAX_ERROR",
    "bearer_ok",
    "finite_json_list",
    "json_depth",
    "loads_limited",
    "printable",
]

MAX_ECHO = 256  # characters of client input an error message or log line repeats, at most
MAX_ERROR = 1024  # characters of one error message sent to a client, at most
# An answer up to one HTTP/2 window (and a small HTTP answer) goes out at once; a larger one is
# counted in --max-buffered-mb from before it is computed until its client has taken it.
ANSWER_WINDOW = 65535
ANSWERS_FULL = ("the daemon holds its limit of bytes (--max-buffered-mb) in requests and in answers its "
                "clients have not read yet; retry later")


@dataclass(frozen=True)
class Limits:
    """Per-client and total bounds, in bytes and counts; see the daemon's options for each.

    Attributes:
        max_body (int): largest request body (413 beyond it).
        max_buffered (int): request bytes all connections may hold at once (503 beyond it).
        max_json (int): largest JSON document parsed (413 beyond it).
        max_json_depth (int): deepest nesting of arrays and objects in a JSON document (400).
        max_connections (int): open client connections (503 beyond it).
        max_pipeline (int): requests one connection may have waiting for their answers; reading
            that connection pauses beyond it.
        write_high_water (int): answer bytes queued for one client that does not read before the
            daemon stops serving it more.
        max_header (int): request line plus headers (431 beyond it).
        keep_alive (float): seconds an idle connection stays open.
        request_timeout (float): seconds a client may take to send one request, or to read one
            answer once the daemon waits on it.
    """

    max_body: int = 64 << 20
    max_buffered: int = 256 << 20
    max_json: int = 16 << 20
    max_json_depth: int = 32
    max_connections: int = 512
    max_pipeline: int = 8
    write_high_water: int = 256 << 10
    max_header: int = 64 << 10
    keep_alive: float = 30.0
    request_timeout: float = 60.0


class JsonRefused(DaemonError, ValueError):
    """A JSON document was refused before or while parsing; ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# A JSON string, escapes included; removed before counting brackets so "[[[" inside one is no depth.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes | bytearray | memoryview) -> int:
    """Deepest nesting of ``[`` and ``{`` in ``data``, outside strings; linear time, no recursion.

    A vectorized pass (about 10 ms for 16 MiB) instead of the parser's recursion: ``json.loads``
    on 30,000 nested brackets raises RecursionError, deeper still it can exhaust the C stack.
    """
    raw = bytes(data)
    if b'"' in raw:
        raw = _STRING.sub(b"", raw)
    if not raw:
        return 0
    steps = _OPEN[np.frombuffer(raw, np.uint8)]
    brackets = steps[steps != 0].astype(np.int32)  # only brackets move the depth
    if not brackets.size:
        return 0
    return max(0, int(brackets.cumsum().max()))


def _no_constant(name: str) -> Any:
    raise JsonRefused(f"'{name}' is not a JSON number (RFC 8259); send finite values, or binary tensor data")


def loads_limited(data: bytes | bytearray | memoryview, limits: Limits, what: str = "request") -> Any:
    """``json.loads`` after the size and depth checks; refuses ``NaN``/``Infinity`` literals.

    Raises:
        JsonRefused: 413 over ``limits.max_json``; 400 too deep, malformed or non-finite.
    """
    size = len(data)
    if size > limits.max_json:
        raise JsonRefused(f"the JSON {what} of {size} bytes exceeds the limit of {limits.max_json} bytes "
                          "(--max-json-mb); send large tensors as binary data", 413)
    depth = json_depth(data)
    if depth > limits.max_json_depth:
        raise JsonRefused(f"the JSON {what} nests {depth} levels deep; the limit is {limits.max_json_depth} "
                          "(--max-json-depth)")
    try:
        return json.loads(bytes(data), parse_constant=_no_constant)
    except JsonRefused:
        raise
    except RecursionError:  # a backstop: the depth check should have refused it
        raise JsonRefused(f"the JSON {what} nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonRefused(f"malformed JSON in the {what}: {exc}") from None


def finite_json_list(arr: np.ndarray) -> list[Any]:
    """``arr.ravel().tolist()`` with non-finite floats as ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
    values = arr.ravel()
    out = values.tolist()
    if values.dtype.kind in "fc" and values.size and not np.isfinite(values).all():
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            v = out[i]
            out[i] = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return out


def bearer_ok(header: bytes | None, token: bytes | None) -> bool:
    """Whether an ``Authorization`` header carries ``token`` in the Bearer scheme.

    The scheme name is case-insensitive (RFC 7235 section 2.1); the credential is compared in
    constant time.
    """
    if token is None:
        return True
    if not header:
        return False
    scheme, _, credential = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credential.strip(), token)


def printable(value: Any, limit: int = MAX_ECHO) -> str:
    """``value`` as text for an error message or log line, cut to ``limit`` characters.

    Errors name what the client sent (a path, a shape, a model name) so it can fix it; a client
    that sends 2 million dimensions must not get a 6 MB message back (gRPC carries it in a
    trailer, which the client then refuses as too large) nor fill the log.
    """
    text = value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def answer_bytes(output_specs: Any, batch: int) -> int:
    """Bytes of a model's outputs for a batch of ``batch``, from its specs, before it runs.

    The first dynamic dimension is the batch; an output with another dynamic dimension has no
    size known in advance and counts 0 (its answer is counted once it exists). Lets a front end
    refuse a request whose answer would not fit in ``--max-buffered-mb`` before computing it.
    """
    total = 0
    for spec in output_specs.values():
        count = np.dtype(spec.dtype).itemsize
        for i, d in enumerate(spec.shape):
            if d is None or d < 0:
                if i:
                    count = 0
                    break
                d = batch
            count *= int(d)
        total += count
    return total
