"""The device lock's record (``<store>/deploy/lock``): what it holds and when its holder is gone.

One record format for both writers: the host's deploy run takes the lock over SFTP
(:class:`cuvil_edge.deploy.layout.DeviceLock`), the device-side deploy step takes it, or the
host's run hands it over by token, with plain file calls (:func:`cuvil_edge.deploy.activate.take_lock`).
So both read the same fields the same way. Pure: the device-side step imports it without asyncssh.

A record::

    {"host": "...", "pid": 1234, "since": <unix s>, "expires": <unix s>, "at": "<iso>",
     "where": "host" | "device", "token": "<hex>", "txn": "..." (device only),
     "boot_id": "..." (device only: a record of an earlier boot is stale whatever its pid)}
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import time
import uuid
from typing import Any

__all__ = ["holder_pid", "lock_record", "other_boot", "parse_record", "pid_alive", "record_expired"]


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this machine (one we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_record(where: str, expires: float, token: str | None = None, txn: str | None = None) -> dict[str, Any]:
    """A fresh record for this process, leased until ``expires`` (unix seconds)."""
    now = time.time()
    record: dict[str, Any] = {
        "host": socket.gethostname(), "pid": os.getpid(), "since": now, "expires": expires,
        "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "where": where,
        "token": token or uuid.uuid4().hex}
    if txn is not None:
        record["txn"] = txn
    if where == "device":
        from cuvil_edge.bundle.activation import boot_id

        record["boot_id"] = boot_id()
    return record


def holder_pid(holder: dict[str, Any]) -> int:
    """The holder's pid; -1 when the record carries none or garbage."""
    pid = holder.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else -1


def other_boot(holder: dict[str, Any], this_boot: str | None) -> bool:
    """Whether ``holder`` was written by a device-side step of an earlier boot (a power cut or a
    reboot ended it; its pid may belong to another process now)."""
    recorded = holder.get("boot_id")
    return isinstance(recorded, str) and bool(recorded) and bool(this_boot) and recorded != this_boot


def parse_record(raw: bytes | None) -> dict[str, Any] | None:
    """The record in ``raw``: None when there is no lock file, ``{}`` when it is half-written
    (a run died while writing it) or not a JSON object."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def record_expired(holder: dict[str, Any], now: float | None = None) -> bool:
    """Whether the lease of ``holder`` is over (an empty or unreadable record counts as over)."""
    try:
        expires = float(holder.get("expires", 0))
    except (TypeError, ValueError):
        expires = 0.0
    return expires < (time.time() if now is None else now)
