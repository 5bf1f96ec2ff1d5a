"""The counters, flags and limits every connection of the daemon shares (:class:`ServerState`).

Its own module so that the front ends (``kserve.App``, gRPC) can name its type without importing
the server that wires them together.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cuvil_edge.daemon.http import HttpProtocol
from cuvil_edge.daemon.limits import Limits, printable

__all__ = ["ServerState"]

log = logging.getLogger("cuvil_edge.daemon")
access = logging.getLogger("cuvil_edge.daemon.access").info  # --access-log


class ServerState:
    """Counters, flags and limits shared by the connections and the server.

    Args:
        limits (Limits): what one client may cost (:meth:`Config.limits`).
        token (str | None): the bearer token every endpoint but ``/v2/health/*`` requires.
    """

    def __init__(self, limits: Limits | int, token: str | None = None, access_log: bool = False) -> None:
        if isinstance(limits, int):  # the former signature: ServerState(max_body)
            limits = Limits(max_body=limits, max_buffered=max(limits, Limits.max_buffered))
        self.limits = limits
        self.max_body = limits.max_body
        self.token = token.encode() if token else None
        self.max_connections = limits.max_connections  # lowered to fit the open-file limit at bind
        self.buffered = 0  # request bytes held by every connection now
        self.buffered_peak = 0
        self.refused: dict[str, int] = {"connections": 0, "auth": 0, "buffered": 0}
        self._refusal_logged = -1e9
        self._refusals_unlogged = 0
        self.connections: set[HttpProtocol] = set()
        self.inflight = 0
        self.total_requests = 0
        self.protocol_errors = 0
        self.failed_unknown = 0
        self.rejected = 0
        self.client_gone = 0
        self.decoded_off_loop = 0  # inference bodies decoded on a worker thread (kserve.App)
        self.ready = False
        self.shutting_down = False
        self.stopped = False
        self.phase = "starting"
        self.access_log = access_log  # --access-log: one line per request answered
        self.trim_wanted = False  # large answers were dropped: return freed heap to the system

    def on_request_done(self, req: Any, status: int) -> None:
        self.inflight -= 1
        self.total_requests += 1
        if self.access_log:
            access(f"HTTP {req.method.decode('latin-1')} {printable(req.path)} {status} "
                   f"{(time.perf_counter() - req.received) * 1000:.1f} ms")

    def on_client_gone(self, req: Any) -> None:
        self.inflight -= 1
        self.client_gone += 1
        pending = getattr(req, "state", None)
        if pending is not None and hasattr(pending, "cancelled"):
            pending.cancelled = True  # the batcher skips it if it has not run yet

    def on_protocol_error(self, status: int) -> None:
        self.protocol_errors += 1

    def reserve(self, n: int) -> bool:
        """Count ``n`` more buffered request bytes, unless that passes ``limits.max_buffered``."""
        if self.buffered + n > self.limits.max_buffered:
            return False
        self.buffered += n
        self.buffered_peak = max(self.buffered_peak, self.buffered)
        return True

    def release(self, n: int) -> None:
        """Forget ``n`` buffered bytes (the request was answered or its client left)."""
        self.buffered = max(0, self.buffered - n)

    def hold(self, n: int) -> None:
        """Count ``n`` bytes that exist already (an answer a client has not read yet), even past the
        limit: requests are then refused until they are read or their client is dropped."""
        self.buffered += n
        self.buffered_peak = max(self.buffered_peak, self.buffered)

    def dropped_slow_client(self) -> None:
        """A client that did not read its answers was dropped: give the memory back at the next tick."""
        self.trim_wanted = True

    def on_refused(self, kind: str) -> None:
        """Count a refusal (``connections``, ``auth``, ``buffered``); log at most one line per 10 s."""
        self.refused[kind] = self.refused.get(kind, 0) + 1
        if kind == "auth":
            return  # a client error, counted in /metrics; not worth a log line each
        now = time.monotonic()
        if now - self._refusal_logged >= 10.0:
            log.warning("refusing clients with 503: %s (%d open connections, limit %d; %d bytes buffered, "
                        "limit %d); %d more refusal(s) since the last report", kind, len(self.connections),
                        self.max_connections, self.buffered, self.limits.max_buffered, self._refusals_unlogged)
            self._refusal_logged = now
            self._refusals_unlogged = 0
        else:
            self._refusals_unlogged += 1
