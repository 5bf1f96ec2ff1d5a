"""Switch rules of a device's bundle store: the state file, a pending switch and its confirm deadline.

Both sides of a device import this module and nothing of the deploy host side: the device-side
deploy step (``python -m cuvil_edge.deploy.ondevice activate``) records a switch as *pending*
before it points ``current`` at the new version, and the daemon (``cuvil-edged``) reverts a
pending switch whose deadline has passed, at start and on its tick. So a lost SSH link, a killed
deploy step, a daemon crash or a reboot never leaves an unconfirmed version serving for longer
than the deadline, as RAUC and Mender do with their "mark good" step.

The paths (``deploy/state/<name>.json`` and its ``.lock``, ``deploy/quarantine/``, the
``current`` link and how it is switched) are the store layout's (:mod:`cuvil_edge.bundle.layout`).
A state file holds the previous version, install records, events, ``pending`` (a switch not yet
confirmed) and ``outcome`` (how the last switch ended).

A ``pending`` record::

    {"txn": "...", "version": "1.1.0", "previous": "1.0.0" | null, "deadline": <unix s>,
     "deadline_at": "<iso>", "boot_id": "...", "started_at": "<iso>", "pid": 1234}

It is expired when its deadline has passed, or when the device booted since it was written
(its ``boot_id`` differs): the step that wrote it cannot still be running. Reverting points
``current`` back at ``previous``; with no previous version it removes ``current`` and moves the
unconfirmed version to quarantine (the daemon serves the only version of a model that has no
``current`` link). Every write is atomic: a temp file, ``fsync``, ``rename``, ``fsync`` of the
directory, so a power cut leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cuvil_edge.bundle import layout as _layout
from cuvil_edge.bundle.layout import StoreLayout, fsync_dir
from cuvil_edge.bundle.names import is_safe_component

__all__ = [
    "DEFAULT_DEADLINE_S",
    "Reverted",
    "boot_id",
    "current_version",
    "expired_reason",
    "now_iso",
    "quarantine_version",
    "read_state",
    "remove_current",
    "revert_expired",
    "revert_pending",
    "state_lock",
    "state_path",
    "switch_current",
    "write_state",
]

DEFAULT_DEADLINE_S = 120.0
MAX_EVENTS = 50


def now_iso(ts: float | None = None) -> str:
    when = _dt.datetime.now(_dt.timezone.utc) if ts is None else _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return when.isoformat(timespec="seconds")


def boot_id() -> str | None:
    """The kernel's id of this boot (changes at every boot); None where the kernel does not show it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def state_path(store: str | os.PathLike[str], name: str) -> str:
    return StoreLayout.of(store).state_path(name)


def empty_state(name: str) -> dict[str, Any]:
    return {"name": name, "previous": None, "versions": {}, "events": [], "pending": None, "outcome": None}


def read_state(store: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The state of ``name``; an empty one when the file is missing, a rebuilt one when it is unreadable."""
    try:
        with open(state_path(store, name), "rb") as f:
            state = json.loads(f.read())
        if not isinstance(state, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        return empty_state(name)
    except (OSError, ValueError):
        state = empty_state(name)
        state["notes"] = ["state file unreadable; rebuilt"]
        return state
    for key, default in empty_state(name).items():
        state.setdefault(key, default)
    return state


def write_state(store: str | os.PathLike[str], name: str, state: dict[str, Any],
                before_rename: Callable[[], None] | None = None) -> None:
    """Write the state file atomically (temp file, fsync, rename, fsync of the directory).

    Args:
        before_rename (Callable[[], None]): called between the fsync of the temp file and the
            rename (the deploy step's test hook pauses there). Defaults to None.
    """
    state["events"] = list(state.get("events") or [])[-MAX_EVENTS:]
    path = state_path(store, name)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(json.dumps(state, indent=1, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def add_event(state: dict[str, Any], event: str, version: str | None, detail: str = "") -> None:
    state.setdefault("events", []).append({"at": now_iso(), "event": event, "version": version, "detail": detail})


@contextlib.contextmanager
def state_lock(store: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``<store>/deploy/state/.lock`` (flock): the deploy step and the daemon never change a
    state file at the same time, so a confirmation and a deadline revert cannot both win."""
    layout = StoreLayout.of(store)
    os.makedirs(layout.state_dir, exist_ok=True)
    fd = os.open(layout.state_lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def current_version(store: str | os.PathLike[str], name: str) -> str | None:
    return _layout.read_current(StoreLayout.of(store), name)


def switch_current(store: str | os.PathLike[str], name: str, version: str) -> None:
    """Point ``current`` at ``version`` (:func:`cuvil_edge.bundle.layout.point_current`)."""
    _layout.point_current(StoreLayout.of(store), name, version)


def remove_current(store: str | os.PathLike[str], name: str) -> None:
    _layout.remove_current(StoreLayout.of(store), name)


def quarantine_version(store: str | os.PathLike[str], name: str, version: str) -> str:
    """Move ``version`` out of the daemon's sight to ``deploy/quarantine/<name>/<version>``; returns that path."""
    import shutil

    layout = StoreLayout.of(store)
    dest = layout.quarantine_dir(name, version)
    src = layout.version_dir(name, version)
    if not os.path.isdir(src):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.rename(src, dest)
    fsync_dir(layout.bundle_dir(name))
    return dest


def expired_reason(pending: dict[str, Any], now: float | None = None, this_boot: str | None = None) -> str | None:
    """Why ``pending`` must be reverted now, or None while it may still be confirmed."""
    now = time.time() if now is None else now
    this_boot = boot_id() if this_boot is None else this_boot
    recorded = pending.get("boot_id")
    if recorded and this_boot and recorded != this_boot:
        return "the device rebooted before the switch was confirmed"
    try:
        deadline = float(pending.get("deadline", 0))
    except (TypeError, ValueError):
        deadline = 0.0
    if now >= deadline:
        return f"not confirmed by its deadline {pending.get('deadline_at') or now_iso(deadline)}"
    return None


def revert_pending(store: str | os.PathLike[str], name: str, state: dict[str, Any], reason: str,
                   by: str) -> dict[str, Any]:
    """Undo ``state['pending']`` on disk and in ``state`` (the caller holds :func:`state_lock` and writes).

    Returns:
        dict: the outcome recorded (status ``reverted``).
    """
    pending = state.get("pending") or {}
    version, previous = pending.get("version"), pending.get("previous")
    current = current_version(store, name)
    if previous and is_safe_component(previous) and os.path.isfile(StoreLayout.of(store).manifest_path(name, previous)):
        if current != previous:
            switch_current(store, name, previous)
        done = f"current back to {previous}"
    elif previous:
        done = f"previous version {previous} is gone from the store; left current at {current}"
    else:
        remove_current(store, name)
        if version:
            quarantine_version(store, name, version)
        done = f"no previous version: removed current, moved {version} to quarantine"
    outcome = {"txn": pending.get("txn"), "status": "reverted", "version": version, "previous": previous,
               "serving": current_version(store, name), "reason": f"{reason}; {done}", "by": by,
               "at": now_iso(), "complete": True, "seen": False}
    state["pending"] = None
    state["outcome"] = outcome
    if version and version in state.get("versions", {}):
        state["versions"][version]["healthy"] = False
    add_event(state, "revert", previous, f"{version}: {outcome['reason']} ({by})")
    return outcome


@dataclass
class Reverted:
    """A pending switch that :func:`revert_expired` undid."""

    name: str
    version: str | None
    previous: str | None
    reason: str


def revert_expired(store: str | os.PathLike[str], by: str = "cuvil-edged", now: float | None = None
                   ) -> list[Reverted]:
    """Revert every pending switch of the store whose deadline passed (or whose boot is over).

    Cheap when nothing is pending: one directory listing and a read of each small state file.
    """
    layout = StoreLayout.of(store)
    try:
        names = layout.state_names(os.listdir(layout.state_dir))
    except OSError:
        return []
    this_boot = boot_id()
    done: list[Reverted] = []
    for name in names:
        if not read_state(store, name).get("pending"):
            continue
        with state_lock(store):
            state = read_state(store, name)  # again, under the lock: the deploy step may have confirmed it
            pending = state.get("pending")
            if not pending:
                continue
            reason = expired_reason(pending, now, this_boot)
            if reason is None:
                continue
            outcome = revert_pending(store, name, state, reason, by)
            write_state(store, name, state)
        done.append(Reverted(name, outcome["version"], outcome["previous"], outcome["reason"]))
    return done
