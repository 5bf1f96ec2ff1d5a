"""Listening sockets and an accept loop that survives running out of file descriptors.

asyncio's own accept loop (CPython 3.11, ``BaseSelectorEventLoop._accept_connection``) handles
``EMFILE`` by logging a traceback and scheduling a retry *for every attempt of its batch* (the
backlog, 512 here): with a 128-file limit and 200 idle clients that was a core spent in the accept
loop, about 2 MB of log a second, and new clients that never got an answer. This loop instead:

* stops watching the listening socket for ``--tick``-scale moments and tries again;
* answers one waiting client ``503`` each time, using a file descriptor kept in reserve for it
  (the "spare fd" habit of event loops such as libev), so a client learns the daemon is busy
  within the retry interval instead of hanging;
* logs one line per interval, with the count of clients refused since the last line.

The daemon also keeps its connection cap below the open-file limit (:func:`connection_cap`), so
this path is the backstop for descriptors taken elsewhere (model files, telemetry, threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Acceptor", "BUSY_ANSWER", "FULL_ANSWER", "connection_cap", "listen_tcp", "listen_unix"]

log = logging.getLogger("cuvil_edge.daemon.accept")



def _answer_503(message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nretry-after: 1\r\nconnection: close\r\n\r\n" + body)


BUSY_ANSWER = _answer_503("the daemon is out of file descriptors; retry later")
FULL_ANSWER = _answer_503("too many connections (--max-connections); retry later")
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_BATCH = 64  # connections accepted per readiness event before other callbacks run
_SPARE_FDS = 16  # descriptors kept free for the daemon's own files beyond those open at start
_LINGER_S = 0.5  # longest a refused client keeps its descriptor
_MAX_LINGERING = 8  # refused clients lingering at once; beyond, closed as soon as answered


def connection_cap(configured: int) -> int:
    """``configured``, lowered so connections cannot take the process's last file descriptors.

    Counts the descriptors open now (sockets, logs, libraries) plus a margin for the model files
    and telemetry a load or tick opens, against the soft ``RLIMIT_NOFILE``.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    return max(1, min(configured, soft - open_now - _SPARE_FDS))


def listen_tcp(host: str, port: int, backlog: int = 512) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address ``host`` resolves to."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def listen_unix(path: str, backlog: int = 512) -> socket.socket:
    """A bound, listening, non-blocking Unix socket at ``path`` (which must not exist)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Acceptor:
    """Accepts clients on one listening socket and hands each to ``factory()``'s protocol.

    Args:
        loop (asyncio.AbstractEventLoop): the serving loop.
        sock (socket.socket): a listening, non-blocking socket (owned from now on).
        factory (Callable[[], asyncio.Protocol]): makes the protocol of a connection.
        retry_s (float): pause after running out of descriptors. Defaults to 0.25.
        log_interval_s (float): at most one log line per this many seconds about it. Defaults to 10.
        admit (Callable[[int], bool] | None): asked for each new client with the number of
            connections accepted but not started yet; False answers the client 503 at once and
            closes it, so a refused client holds no descriptor. Defaults to admitting all.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 factory: Callable[[], asyncio.Protocol], retry_s: float = 0.25,
                 log_interval_s: float = 10.0, admit: Callable[[int], bool] | None = None) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.admit = admit
        self.full_answers = 0  # clients answered 503 over the connection cap
        self.retry_s = retry_s
        self.log_interval_s = log_interval_s
        self.exhausted_total = 0  # times accept failed for lack of descriptors
        self.busy_answers = 0  # clients answered 503 from the spare descriptor
        self._spare: int | None = self._open_spare()
        self._tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self._watching = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_log = -1e9
        self._unlogged = 0
        self._lingering = 0

    @staticmethod
    def _open_spare() -> int | None:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def start(self) -> None:
        """Watch the socket for clients."""
        if not self._watching and not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True

    def _stop_watching(self) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections already made stay)."""
        if self._closed:
            return
        self._closed = True
        self._stop_watching()
        if self._retry is not None:
            self._retry.cancel()
        self.sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def _on_readable(self) -> None:
        for _ in range(_BATCH):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    self._exhausted(exc)
                else:
                    log.warning("accepting a connection failed: %s", exc)
                return
            if self.admit is not None and not self.admit(len(self._tasks)):
                # A burst of refused clients must not take the descriptors the cap keeps free:
                # only a few linger, the rest are closed as soon as they are answered.
                self._answer_busy(conn, FULL_ANSWER, _LINGER_S if self._lingering < _MAX_LINGERING else 0.0)
                self.full_answers += 1
                continue
            self._start(conn)

    def _start(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if self._tcp:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = self.loop.create_task(self._connect(conn))
        self._tasks.add(task)  # keep a hard reference until done
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, sock=conn)
        except (OSError, RuntimeError) as exc:
            log.debug("a connection failed to start: %s", exc)
            conn.close()

    def _exhausted(self, exc: OSError) -> None:
        """Out of descriptors: answer one client 503 with the spare, pause, log once per interval."""
        self.exhausted_total += 1
        self._stop_watching()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                conn = None
            if conn is not None:
                # The spare comes back once this client is done (or the linger ends).
                self._answer_busy(conn, BUSY_ANSWER, self.retry_s, self._reopen_spare)
                self.busy_answers += 1
            else:
                self._reopen_spare()
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            log.warning("out of file descriptors (%s): pausing accept for %.2f s at a time and answering "
                        "new clients 503; %d refused since the last report. Raise LimitNOFILE or lower "
                        "--max-connections", errno.errorcode.get(exc.errno or 0, exc), self.retry_s,
                        self._unlogged + 1)
            self._last_log = now
            self._unlogged = 0
        else:
            self._unlogged += 1
        self._retry = self.loop.call_later(self.retry_s, self._resume)

    def _reopen_spare(self) -> None:
        if self._spare is None and not self._closed:
            self._spare = self._open_spare()

    def _answer_busy(self, conn: socket.socket, answer: bytes, linger_s: float,
                     then: Callable[[], None] | None = None) -> None:
        """Answer 503, shut the write side, read and drop what the client sends, then close.

        Closing while the client's request is still arriving would reset the connection, and a
        reset can destroy the answer before the client reads it; so the socket stays open until
        the client hangs up or ``linger_s`` passes, whichever is first.
        """
        fd = conn.fileno()
        done = False

        def finish() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._lingering -= 1
            with contextlib.suppress(Exception):
                self.loop.remove_reader(fd)
            conn.close()
            if then is not None:
                then()

        def drain() -> None:
            try:
                while True:
                    if not conn.recv(65536):
                        finish()  # the client hung up: nothing can reset it now
                        return
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                finish()

        self._lingering += 1
        try:
            conn.setblocking(False)
            conn.send(answer)
            conn.shutdown(socket.SHUT_WR)
            self.loop.add_reader(fd, drain)
        except OSError:
            finish()
            return
        drain()
        if not done:
            if linger_s > 0:
                self.loop.call_later(linger_s, finish)
            else:
                finish()

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self.start()
