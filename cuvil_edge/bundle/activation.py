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
import logging
import math
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil_edge._atomic import fsync_dir
from cuvil_edge.bundle import layout as _layout
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.bundle.names import is_safe_component
from cuvil_edge.errors import BundleError

__all__ = [
    "DEFAULT_DEADLINE_S",
    "MAX_STATE_BYTES",
    "Recovered",
    "Reverted",
    "StateFileError",
    "boot_id",
    "can_write_state",
    "current_version",
    "expired_pending",
    "expired_reason",
    "now_iso",
    "parse_state",
    "quarantine_version",
    "read_state",
    "recover_store",
    "remove_current",
    "revert_expired",
    "revert_pending",
    "state_lock",
    "state_path",
    "switch_current",
    "validate_state",
    "verify_version",
    "write_state",
]

log = logging.getLogger("cuvil_edge.deploy.state")

DEFAULT_DEADLINE_S = 120.0
MAX_EVENTS = 50
# A state file holds a few records and at most MAX_EVENTS events: a few KiB. Anything past this
# is not ours (or a disk error) and is never read, so a huge file costs one stat.
MAX_STATE_BYTES = 1 << 20
MAX_STATE_DEPTH = 6  # object nesting of a valid file: state > versions > record > field


class StateFileError(BundleError, ValueError):
    """A state file that is too big, not JSON, or whose fields have the wrong types (the message names the field)."""


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


def _depth(value: Any, limit: int, level: int = 1) -> None:
    if level > limit:
        raise StateFileError(f"nested deeper than {limit} levels")
    if isinstance(value, dict):
        for v in value.values():
            _depth(v, limit, level + 1)
    elif isinstance(value, list):
        for v in value:
            _depth(v, limit, level + 1)


def _version_field(data: dict[str, Any], key: str, where: str) -> None:
    value = data.get(key)
    if value is not None and not (isinstance(value, str) and is_safe_component(value)):
        raise StateFileError(f"field '{where}{key}' must be a plain version name or null, got {value!r:.60}")


def _number(data: dict[str, Any], key: str, where: str) -> None:
    value = data.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise StateFileError(f"field '{where}{key}' must be a finite number, got {value!r:.60}")


def validate_state(data: Any, name: str) -> dict[str, Any]:
    """``data`` (a parsed state file of ``name``) when every field the rules read has its type.

    Checked before anything acts on it: a pending version of ``"../.."`` or a ``"pending": "yes"``
    must not reach a path or a revert (issue 26, finding 7).

    Raises:
        StateFileError: the first field of the wrong type, named.
    """
    if not isinstance(data, dict):
        raise StateFileError(f"not a JSON object but {type(data).__name__}")
    _depth(data, MAX_STATE_DEPTH)
    for key, default in empty_state(name).items():
        data.setdefault(key, default)
    if data["name"] != name:
        raise StateFileError(f"field 'name' is {data['name']!r:.60}, expected {name!r}")
    _version_field(data, "previous", "")
    versions = data["versions"]
    if not isinstance(versions, dict):
        raise StateFileError(f"field 'versions' must be an object, got {type(versions).__name__}")
    for v, rec in versions.items():
        if not is_safe_component(v) or not isinstance(rec, dict):
            raise StateFileError(f"field 'versions.{v:.60}' must be a plain version name holding an object")
        if not isinstance(rec.get("healthy", False), bool):
            raise StateFileError(f"field 'versions.{v}.healthy' must be true or false")
    if not isinstance(data["events"], list) or not all(isinstance(e, dict) for e in data["events"]):
        raise StateFileError("field 'events' must be a list of objects")
    pending = data["pending"]
    if pending is not None:
        if not isinstance(pending, dict):
            raise StateFileError(f"field 'pending' must be an object or null, got {type(pending).__name__}")
        if not (isinstance(pending.get("version"), str) and is_safe_component(pending["version"])):
            raise StateFileError(f"field 'pending.version' must be a plain version name, "
                                 f"got {pending.get('version')!r:.60}")
        _version_field(pending, "previous", "pending.")
        _number(pending, "deadline", "pending.")
        if not isinstance(pending.get("txn"), str):
            raise StateFileError("field 'pending.txn' must be a string")
        if pending.get("boot_id") is not None and not isinstance(pending["boot_id"], str):
            raise StateFileError("field 'pending.boot_id' must be a string or null")
    outcome = data["outcome"]
    if outcome is not None and not isinstance(outcome, dict):
        raise StateFileError(f"field 'outcome' must be an object or null, got {type(outcome).__name__}")
    return data


_WARNED: set[tuple[str, int, int]] = set()


def _warn_once(path: str, st: os.stat_result | None, message: str) -> None:
    key = (path, st.st_mtime_ns if st else 0, st.st_size if st else 0)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s", message)


def _quarantine_state_file(store: str | os.PathLike[str], path: str) -> str | None:
    """Move a bad state file aside (``deploy/quarantine/.state/<file>.<unix>``); None when we may not."""
    layout = StoreLayout.of(store)
    dest_dir = os.path.join(layout.deploy_dir, "quarantine", ".state")
    dest = os.path.join(dest_dir, f"{os.path.basename(path)}.{int(time.time())}-{os.urandom(3).hex()}")
    try:
        os.makedirs(dest_dir, exist_ok=True)
        os.replace(path, dest)
        fsync_dir(os.path.dirname(path))
    except OSError:
        return None
    return dest


def _load_state_file(path: str, name: str) -> tuple[dict[str, Any] | None, os.stat_result | None]:
    """The validated state at ``path`` (None when missing) and its stat.

    Raises:
        StateFileError: too big, not UTF-8 JSON, too deep, or fields of the wrong type.
        OSError: it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError("not a regular file")
        if st.st_size > MAX_STATE_BYTES:
            raise StateFileError(f"{st.st_size} bytes, more than the {MAX_STATE_BYTES} a state file may hold")
        raw = f.read(MAX_STATE_BYTES + 1)
    return parse_state(raw, name), st


def parse_state(raw: bytes, name: str) -> dict[str, Any]:
    """The validated state of ``name`` in ``raw`` (a state file's bytes).

    Raises:
        StateFileError: too big, not JSON, too deep, or fields of the wrong type; nothing else.
    """
    if len(raw) > MAX_STATE_BYTES:
        raise StateFileError(f"more than the {MAX_STATE_BYTES} bytes a state file may hold")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise StateFileError(f"not JSON ({str(exc)[:80]})") from None
    return validate_state(data, name)


def read_state(store: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The state of ``name``; an empty one when the file is missing, a rebuilt one when it is unreadable.

    A file that is too big, not JSON or has fields of the wrong type (:func:`validate_state`) is
    never acted on: it is moved to ``deploy/quarantine/.state/`` where this process may write (the
    root device step; the daemon of a stock install may not) and logged once; the state read is
    a rebuilt empty one carrying a note.
    """
    path = state_path(store, name)
    try:
        state, _ = _load_state_file(path, name)
    except (OSError, StateFileError) as exc:
        st = None
        with contextlib.suppress(OSError):
            st = os.stat(path)
        moved = _quarantine_state_file(store, path) if isinstance(exc, StateFileError) else None
        where = f"; moved to {moved}" if moved else ""
        _warn_once(path, st, f"deploy state file {path} ignored: {exc}{where}")
        state = empty_state(name)
        state["notes"] = [f"state file unreadable ({str(exc)[:120]}); rebuilt{where}"]
        return state
    return state if state is not None else empty_state(name)


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

    ``state`` was validated (:func:`read_state`): the versions it names are plain names, so
    nothing here raises half-way for a field of the wrong type.

    Returns:
        dict: the outcome recorded (status ``reverted``).
    """
    pending = state.get("pending") or {}
    version, previous = pending.get("version"), pending.get("previous")
    current = current_version(store, name)
    if previous and os.path.isfile(StoreLayout.of(store).manifest_path(name, previous)):
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


def can_write_state(store: str | os.PathLike[str]) -> bool:
    """Whether this process may change the store's deploy state (the state directory and its lock).

    On a stock install the daemon runs as the unit's dynamic user and may not: root owns the
    revert there (the unit's ``ExecStartPre=+`` and the deploy step's revert timer; docs/deploy.md).
    """
    layout = StoreLayout.of(store)
    if not os.access(layout.state_dir, os.W_OK | os.X_OK):
        return False
    return not os.path.exists(layout.state_lock_path) or os.access(layout.state_lock_path, os.R_OK | os.W_OK)


def _state_names(store: str | os.PathLike[str]) -> list[str]:
    layout = StoreLayout.of(store)
    try:
        return layout.state_names(os.listdir(layout.state_dir))
    except OSError:
        return []


def expired_pending(store: str | os.PathLike[str], now: float | None = None) -> list[tuple[str, str]]:
    """``(name, reason)`` of every pending switch past its deadline; reads only (the daemon's view)."""
    this_boot = boot_id()
    due = []
    for name in _state_names(store):
        pending = read_state(store, name).get("pending")
        if pending:
            reason = expired_reason(pending, now, this_boot)
            if reason is not None:
                due.append((name, reason))
    return due


def revert_expired(store: str | os.PathLike[str], by: str = "cuvil-edged", now: float | None = None
                   ) -> list[Reverted]:
    """Revert every pending switch of the store whose deadline passed (or whose boot is over).

    Cheap when nothing is pending: one directory listing and a read of each small state file.

    Raises:
        OSError: the state lock or a state file cannot be written (the caller may not write the store).
    """
    this_boot = boot_id()
    done: list[Reverted] = []
    for name in _state_names(store):
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


@dataclass
class Recovered:
    """What :func:`recover_store` changed."""

    reverted: list[Reverted] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # "<name> <version>: why"
    repointed: list[str] = field(default_factory=list)  # "<name>: current a -> b"
    cleaned: list[str] = field(default_factory=list)  # staging leftovers of steps that are gone

    @property
    def changed(self) -> bool:
        return bool(self.reverted or self.quarantined or self.repointed)

    def lines(self) -> list[str]:
        return ([f"reverted unconfirmed switch of {r.name} {r.version}: {r.reason}" for r in self.reverted]
                + [f"quarantined {q}" for q in self.quarantined] + [f"repointed {p}" for p in self.repointed]
                + [f"removed staging leftover {c}" for c in self.cleaned])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verify_version(layout: StoreLayout, name: str, version: str) -> str | None:
    """Why the files of ``name`` ``version`` fail verification against its manifest, or None.

    Only what the bytes say: ``manifest.json`` must be a JSON object and every file its ``files``
    list names must be there with its sha256 (a 0-byte manifest or member is what a power cut
    leaves of files renamed into place before they were fsynced). Whether the manifest has what
    serving needs is the daemon's parser's business, not a reason to move a version away.
    """
    import hashlib

    vdir = layout.version_dir(name, version)
    try:
        with open(os.path.join(vdir, _layout.MANIFEST_FILE), "rb") as f:
            raw = f.read(16 << 20)
        manifest = json.loads(raw)
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, list):
            return f"{_layout.MANIFEST_FILE} ({len(raw)} bytes) is not a manifest"
        for entry in files:
            rel = entry.get("path") if isinstance(entry, dict) else None
            want = entry.get("sha256") if isinstance(entry, dict) else None
            if not isinstance(rel, str) or not isinstance(want, str) or rel.startswith("/") or \
                    ".." in rel.split("/"):
                return f"{_layout.MANIFEST_FILE} lists a malformed file entry"
            path = os.path.join(vdir, rel)
            if os.path.islink(path) or not os.path.isfile(path):
                return f"{rel} is missing"
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 - f is this iteration's
                    digest.update(block)
            if digest.hexdigest() != want:
                return f"{rel} does not match its sha256 ({os.path.getsize(path)} bytes)"
    except (OSError, ValueError, RecursionError) as exc:
        return f"{_layout.MANIFEST_FILE}: {str(exc)[:200]}"
    return None


def verify_version(store: str | os.PathLike[str], name: str, version: str) -> str | None:
    """Why the files of ``name`` ``version`` in ``store`` fail verification, or None (they match)."""
    return _verify_version(StoreLayout.of(store), name, version)


def _quarantine_corrupt(layout: StoreLayout, name: str, version: str) -> None:
    """Move a version whose files fail verification to ``deploy/quarantine/.corrupt/<name>/<version>``:
    out of the daemon's sight, kept for a look, never restored by a later deploy (that sends it again)."""
    dest = os.path.join(layout.deploy_dir, "quarantine", ".corrupt", name, version)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.rename(layout.version_dir(name, version), dest)
    fsync_dir(layout.bundle_dir(name))


def _clean_staging(layout: StoreLayout, min_age_s: float = 60.0) -> list[str]:
    """Remove what an unpack or a prune cut short left in ``deploy/staging/`` (names end in the
    pid of their step: ``<name>-<version>.<pid>``, ``.prune-<name>-<version>.<pid>``) once that
    process is gone and the entry is ``min_age_s`` old; never anything in use."""
    def pid_alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # EPERM: alive under another user
            return True
        return True

    removed: list[str] = []
    try:
        entries = os.listdir(layout.staging_root)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        pid = entry.rsplit(".", 1)[-1]
        path = os.path.join(layout.staging_root, entry)
        try:
            if not pid.isdigit() or pid_alive(int(pid)) or now - os.lstat(path).st_mtime < min_age_s:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(entry)
    return removed


def _newest_healthy(layout: StoreLayout, name: str, state: dict[str, Any], present: list[str]) -> str | None:
    """The served version to fall back to: ``previous`` when it is healthy and present, else the
    healthy present version installed last."""
    versions = state.get("versions") or {}
    prev = state.get("previous")
    if prev in present and (versions.get(prev) or {}).get("healthy"):
        return str(prev)
    healthy = [(str((versions.get(v) or {}).get("activated") or (versions.get(v) or {}).get("installed") or ""), v)
               for v in present if (versions.get(v) or {}).get("healthy")]
    return max(healthy)[1] if healthy else None


def recover_store(store: str | os.PathLike[str], by: str = "recover", now: float | None = None) -> Recovered:
    """Put the store back on a gated, verified version after a crash or power cut (root runs it at
    the daemon's start and at boot, before anything is served).

    1. revert pending switches past their deadline or from an earlier boot (:func:`revert_expired`);
    2. verify every version's files against its manifest; move one that fails to quarantine and
       mark it unhealthy (a power cut before the fsyncs of an older release leaves 0-byte files);
    3. when ``current`` names a version that is gone, or one recorded unhealthy with no switch
       pending, point it at ``previous`` or the newest healthy version (or remove it);
    4. remove staging leftovers of unpack and prune steps that are gone.
    """
    layout = StoreLayout.of(store)
    report = Recovered(reverted=revert_expired(store, by, now), cleaned=_clean_staging(layout))
    try:
        names = sorted(n for n in os.listdir(layout.bundles_dir) if is_safe_component(n))
    except OSError:
        return report
    for name in names:
        folder = layout.bundle_dir(name)
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        with state_lock(store):
            state = read_state(store, name)
            before = len(report.quarantined) + len(report.repointed)
            present = []
            for v in sorted(os.listdir(folder)):
                vdir = os.path.join(folder, v)
                if not is_safe_component(v) or os.path.islink(vdir) or not os.path.isdir(vdir):
                    continue
                why = _verify_version(layout, name, v)
                if why is None:
                    present.append(v)
                    continue
                _quarantine_corrupt(layout, name, v)
                if v in state["versions"]:
                    state["versions"][v]["healthy"] = False
                add_event(state, "quarantine", v, f"files fail verification: {why} ({by})")
                report.quarantined.append(f"{name} {v}: {why}")
            current = current_version(store, name)
            record = (state.get("versions") or {}).get(current or "")
            gone = current is not None and current not in present
            unhealthy = record is not None and not record.get("healthy") and not state.get("pending")
            if gone or unhealthy:
                target = _newest_healthy(layout, name, state, [v for v in present if v != current])
                if target is not None:
                    switch_current(store, name, target)
                elif gone:
                    remove_current(store, name)
                if target is not None or gone:
                    why = "its files are gone" if gone else "it never passed its health gate"
                    report.repointed.append(f"{name}: current {current} -> {target or 'none'} ({why})")
                    add_event(state, "repoint", target, f"from {current}: {why} ({by})")
            if len(report.quarantined) + len(report.repointed) > before:
                write_state(store, name, state)
    return report
