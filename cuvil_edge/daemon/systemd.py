"""systemd integration without libsystemd: ``sd_notify`` over ``$NOTIFY_SOCKET`` and the watchdog.

The protocol (``sd_notify(3)``): newline-separated ``KEY=VALUE`` assignments sent as one datagram
to the ``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (a path, or an abstract name written with a
leading ``@``). The daemon sends

* ``READY=1`` once models are loaded and warmed (``Type=notify`` waits for it),
* ``STATUS=...`` lines that ``systemctl status`` shows,
* ``WATCHDOG=1`` only while the serving loop makes progress (:class:`Watchdog`), at half the
  interval systemd gives in ``$WATCHDOG_USEC`` (``WatchdogSec=`` in the unit),
* ``RELOADING=1`` around a SIGHUP store reload and ``STOPPING=1`` when SIGTERM starts the drain.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op returning False.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

__all__ = [
    "Watchdog",
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog_interval_s",
    "watchdog_ping",
]

log = logging.getLogger(__name__)


def _address(path: str) -> str | bytes:
    # "@name" is an abstract socket: the name starts with a NUL byte on the wire.
    return b"\0" + path[1:].encode() if path.startswith("@") else path


def notify(*lines: str, unset_environment: bool = False) -> bool:
    """Send ``lines`` (``"READY=1"``, ``"STATUS=..."``) to systemd as one datagram.

    Args:
        *lines (str): ``KEY=VALUE`` assignments; newlines inside a value are not allowed.
        unset_environment (bool): drop ``$NOTIFY_SOCKET`` afterwards so child processes do not
            notify on our behalf. Defaults to False.

    Returns:
        bool: True when a datagram was sent; False outside systemd or on a socket error (which is
        logged at debug level: notification must never break serving).
    """
    path = os.environ.get("NOTIFY_SOCKET", "")
    if unset_environment:
        os.environ.pop("NOTIFY_SOCKET", None)
    if not path or not lines:
        return False
    if path[0] not in "/@":
        log.debug("sd_notify: ignoring NOTIFY_SOCKET=%r (not a path or abstract name)", path)
        return False
    for line in lines:
        if "\n" in line or "=" not in line:
            raise ValueError(f"sd_notify assignment must be one 'KEY=VALUE' line, got {line!r}")
    payload = "\n".join(lines).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(payload, _address(path))
        return True
    except OSError as exc:
        log.debug("sd_notify to %s failed: %s", path, exc)
        return False


def ready(status_text: str | None = None) -> bool:
    """``READY=1`` (plus ``STATUS=`` and ``MAINPID=``): tell systemd the daemon serves."""
    lines = ["READY=1", f"MAINPID={os.getpid()}"]
    if status_text:
        lines.append(f"STATUS={_one_line(status_text)}")
    return notify(*lines)


def status(text: str) -> bool:
    """``STATUS=text``: shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}")


def reloading(status_text: str | None = None) -> bool:
    """``RELOADING=1`` with ``MONOTONIC_USEC`` (needed by ``Type=notify-reload``); send
    ``ready()`` when done."""
    lines = ["RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"]
    if status_text:
        lines.append(f"STATUS={_one_line(status_text)}")
    return notify(*lines)


def stopping(status_text: str | None = None) -> bool:
    """``STOPPING=1``: the drain has started."""
    lines = ["STOPPING=1"]
    if status_text:
        lines.append(f"STATUS={_one_line(status_text)}")
    return notify(*lines)


def watchdog_ping() -> bool:
    """``WATCHDOG=1`` unconditionally (prefer :class:`Watchdog`, which pings only on progress)."""
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """The watchdog timeout systemd set for *this* process, in seconds, or None.

    Reads ``$WATCHDOG_USEC``; honours ``$WATCHDOG_PID`` (the timeout belongs to that PID only).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1e6


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Watchdog:
    """Pings the systemd watchdog only while the serving loop makes progress.

    The serving loop calls :meth:`progress` every tick it completes (and may pass how long the
    oldest in-flight batch has run); a background tick or the loop itself calls :meth:`tick`, which
    sends ``WATCHDOG=1`` at most every ``interval_s`` and only if progress was recorded since the
    last ping and no batch is stuck. A wedged loop or a hung inference therefore stops the pings
    and systemd restarts the service (``Restart=on-failure``).

    Args:
        interval_s (float | None): ping period. Defaults to half of :func:`watchdog_interval_s`;
            None there means no watchdog (every call is a no-op).
        stuck_after_s (float | None): a batch running longer than this counts as no progress.
            Defaults to the full watchdog timeout.
        clock (Callable[[], float]): monotonic clock. Defaults to ``time.monotonic``.
        send (Callable[..., bool]): the notifier. Defaults to :func:`notify`.
    """

    def __init__(
        self,
        interval_s: float | None = None,
        *,
        stuck_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        send: Callable[..., bool] = notify,
    ) -> None:
        timeout = watchdog_interval_s()
        self.interval_s = interval_s if interval_s is not None else (timeout / 2 if timeout else None)
        self.stuck_after_s = stuck_after_s if stuck_after_s is not None else (timeout or None)
        self._clock = clock
        self._send = send
        self._last_ping = -1e18
        self._progress = False
        self._oldest_batch_s = 0.0
        self.pings = 0
        self.skipped = 0

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def progress(self, oldest_batch_s: float = 0.0) -> None:
        """Record that the serving loop completed a tick; ``oldest_batch_s`` is how long the
        longest-running batch has been executing (0 when none)."""
        self._progress = True
        self._oldest_batch_s = max(0.0, float(oldest_batch_s))

    def tick(self) -> bool:
        """Ping if due and healthy; returns True when ``WATCHDOG=1`` was sent."""
        if self.interval_s is None:
            return False
        now = self._clock()
        if now - self._last_ping < self.interval_s:
            return False
        stuck = self.stuck_after_s is not None and self._oldest_batch_s > self.stuck_after_s
        if not self._progress or stuck:
            self.skipped += 1
            if stuck:
                log.error("watchdog: a batch has run %.1f s (> %.1f s); not pinging systemd",
                          self._oldest_batch_s, self.stuck_after_s)
            return False
        self._progress = False
        self._last_ping = now
        sent = bool(self._send("WATCHDOG=1"))
        self.pings += sent
        return sent
