"""The device-side deploy step: switch, health gate, confirm or switch back, as one transaction.

Runs on the device (``python -m cuvil_edge.deploy.ondevice activate``), started over SSH and
detached from the SSH session, so the host's link is never part of the transaction (as RAUC and
Mender commit on the device). In order:

1. take the device lock (``<store>/deploy/lock``), handed over from the host's deploy run by its
   token, or fresh; a live holder makes the step refuse;
2. under the state lock, revert an orphaned pending switch (its step died), record the install
   and write ``pending`` with the confirm deadline (``bundle/activation.py``);
3. point ``current`` at the new version (one rename);
4. ask the local daemon to load it (``systemctl reload-or-restart`` where systemd runs and the
   daemon is down), run the health gate with the bundle's validation sample;
5. under the state lock: when the gate passed and the switch is still ours (not reverted by the
   daemon for its deadline), mark the version healthy, prune old versions and write the outcome;
   otherwise point ``current`` back at the previous version (or quarantine the new one), write the
   outcome, have the daemon load the previous version and check it too;
6. release the device lock.

Nothing here needs the SSH side of deploy: the module imports the store rules and, for the gate,
``deploy/health.py``. The steps call the test-only pause hook of ``cuvil_edge/_test_hooks.py`` (off
unless its variable is set) at ``before-switch``, ``after-switch``, ``gate`` and ``outcome`` (between
the fsync of the new state file and its rename).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cuvil_edge._atomic import atomic_write_bytes, fsync_dir
from cuvil_edge._test_hooks import PAUSE_ENV, pause  # test-only; see _test_hooks.py
from cuvil_edge.bundle.activation import (
    add_event,
    current_version,
    now_iso,
    quarantine_version,
    read_state,
    remove_current,
    revert_pending,
    state_lock,
    switch_current,
    write_state,
)
from cuvil_edge.bundle.activation import boot_id as _boot_id
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.bundle.names import is_safe_component
from cuvil_edge.deploy.lockfile import (
    holder_pid,
    lock_record,
    other_boot,
    parse_record,
    pid_alive,
    record_expired,
)
from cuvil_edge.errors import CuvilEdgeError, DeployError

__all__ = ["ActivateRequest", "LockBusy", "launch", "release_lock", "run_activate", "take_lock", "wait_outcome"]

GATE_MARGIN_S = 5.0  # the gate ends this long before the deadline, so the step, not the daemon, decides
LOCK_GRACE_S = 60.0
LOG_KEEP = 20
START_GRACE_S = 5.0


@dataclass
class ActivateRequest:
    """What one activation does; every field maps to a flag of ``ondevice activate``."""

    store: str
    name: str
    version: str
    txn: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    deadline_s: float = 120.0
    url: str = "http://127.0.0.1:8000"
    health_timeout: float = 60.0
    token: str | None = None
    keep: int = 3
    sha256: str | None = None
    root: str = "/"
    unit: str = "cuvil-edged.service"
    by: str = "cuvil-edge deploy"

    def argv(self) -> list[str]:
        """Flags that recreate this request (the token travels in the environment, not in argv)."""
        out = ["--store", self.store, "--name", self.name, "--version", self.version, "--txn", self.txn,
               "--deadline", f"{self.deadline_s:g}", "--url", self.url, "--health-timeout",
               f"{self.health_timeout:g}", "--keep", str(self.keep), "--root", self.root, "--unit", self.unit,
               "--by", self.by]
        if self.sha256:
            out += ["--sha256", self.sha256]
        return out


# ---------------------------------------------------------------------------------------------- lock


class LockBusy(DeployError):
    """Another deploy holds the device lock."""


def _layout(store: str) -> StoreLayout:
    return StoreLayout.of(store, DeployError)


def _lock_path(store: str) -> str:
    return _layout(store).lock_path


def _read_lock(store: str) -> dict[str, Any] | None:
    """The device lock's record (:func:`cuvil_edge.deploy.lockfile.parse_record`)."""
    try:
        with open(_lock_path(store), "rb") as f:
            return parse_record(f.read(65536))
    except FileNotFoundError:
        return None
    except OSError:
        return {}


def _write_json_atomic(path: str, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(data).encode(), 0o644)


@contextlib.contextmanager
def _lock_guard(store: str) -> Iterator[None]:
    """flock ``deploy/.lock.guard``: device-side takers of the device lock judge and write one at a
    time, so two that both find an expired or garbage lock cannot both take it (one wins, the
    other then finds a live holder and reports busy; issue 26, finding 9)."""
    path = os.path.join(os.path.dirname(_lock_path(store)), ".lock.guard")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def take_lock(store: str, txn: str, expires: float, handover_token: str | None = None) -> str:
    """Take ``<store>/deploy/lock`` for ``txn``; returns a note ("" or how it was taken).

    The host's deploy run holds the lock while it uploads and hands it over with its token. A lock
    is also taken when its lease expired, when its record is garbage, when a device-side step of an
    earlier boot wrote it, or when a process of this machine held it and is gone. Judging the
    holder and writing the new record happen under one flock, so taking a stale lock has one winner.

    Raises:
        LockBusy: a live holder (message names it).
    """
    path = _lock_path(store)
    makedirs = os.path.dirname(path)
    os.makedirs(makedirs, exist_ok=True)
    record = lock_record("device", expires, txn=txn)
    with _lock_guard(store):
        holder = _read_lock(store)
        note = ""
        if holder is None:
            pass
        elif handover_token and holder.get("token") == handover_token:
            pass
        elif holder.get("txn") == txn:
            pass
        elif not holder or record_expired(holder):
            note = "took over an expired device lock"
        elif other_boot(holder, _boot_id()):
            note = "took over the device lock of a deploy step from before the last boot"
        elif holder.get("host") == socket.gethostname() and not pid_alive(holder_pid(holder)):
            note = f"took over the device lock of a process that is gone (pid {holder.get('pid')})"
        else:
            raise LockBusy(f"busy: {holder.get('where', 'host')} {holder.get('host')} (pid {holder.get('pid')}) "
                           f"holds {path} since {holder.get('at')}")
        _write_json_atomic(path, record)
        return note


def adopt_lock(store: str, txn: str) -> bool:
    """The detached step makes the lock its own (its pid); False when the lock is not for ``txn``."""
    path = _lock_path(store)
    holder = _read_lock(store)
    if not holder or holder.get("txn") != txn:
        return False
    holder.update(pid=os.getpid(), host=socket.gethostname())
    _write_json_atomic(path, holder)
    return True


def release_lock(store: str, txn: str) -> None:
    holder = _read_lock(store)
    if holder is not None and holder.get("txn") == txn:
        try:
            os.unlink(_lock_path(store))
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(_lock_path(store)))


# ---------------------------------------------------------------------------------------------- gate


def _systemd_running(root: str) -> bool:
    # sd_booted(3): systemd is PID 1 when /run/systemd/system exists.
    return root in ("", "/") and os.path.isdir("/run/systemd/system")


def _gate(req: ActivateRequest, version: str, deadline: float) -> Any:
    """Load ``version`` (what ``current`` points at now) in the daemon and run the health gate."""
    from cuvil_edge.bundle.manifest import Manifest
    from cuvil_edge.deploy.health import HealthResult, check_health, daemon_load, sample_member

    vdir = _layout(req.store).version_dir(req.name, version)
    try:
        manifest = Manifest.load(vdir, complete=False)
    except CuvilEdgeError as exc:
        return HealthResult(False, str(exc))

    start = time.monotonic()
    budget = max(1.0, min(req.health_timeout, deadline - time.time() - GATE_MARGIN_S))
    err = daemon_load(req.url, req.name, budget, req.token)
    if err and "not reachable" in err and _systemd_running(req.root):
        out = subprocess.run(["systemctl", "reload-or-restart", req.unit], capture_output=True, text=True,
                             timeout=budget)
        err = None if out.returncode == 0 else f"{err}; systemctl reload-or-restart {req.unit} failed: " \
                                               f"{out.stderr.strip()[:200]}"
    pause("gate")
    if err:
        return HealthResult(False, err, time.monotonic() - start)
    left = max(1.0, budget - (time.monotonic() - start))
    return check_health(req.url, manifest, sample_member(vdir, manifest, "sample_inputs"),
                        sample_member(vdir, manifest, "sample_expected"), left, req.token)


# ---------------------------------------------------------------------------------------------- steps


def _versions_by_age(store: str, name: str, state: dict[str, Any]) -> list[str]:
    layout = _layout(store)
    try:
        entries = os.listdir(layout.bundle_dir(name))
    except OSError:
        return []
    found = []
    for v in entries:
        if not is_safe_component(v):  # current, a swap link, a staging leftover
            continue
        p = layout.version_dir(name, v)
        if os.path.islink(p) or not os.path.isdir(p):
            continue
        rec = state.get("versions", {}).get(v, {})
        found.append((rec.get("installed", ""), os.stat(p).st_mtime, v))
    return [v for *_, v in sorted(found)]


def _prune(store: str, name: str, state: dict[str, Any], keep: int, protect: set[str]) -> list[str]:
    """Remove old versions beyond ``keep``: never one in ``protect`` (the new and the previous
    version) nor the newest version that passed its gate; unhealthy ones go first.

    Each version leaves the daemon's sight in one durable rename (to ``deploy/staging/``) before
    its files are deleted, so a power cut half-way through never leaves a half-deleted version
    under ``bundles/``.
    """
    versions = _versions_by_age(store, name, state)
    records = state.get("versions", {})
    healthy = [v for v in versions if (records.get(v) or {}).get("healthy")]
    keep_too = set(protect) | set(healthy[-1:])
    excess = len(versions) - max(int(keep), 1)
    order = [v for v in versions if not (records.get(v) or {}).get("healthy")] + \
        [v for v in versions if (records.get(v) or {}).get("healthy")]
    layout = _layout(store)
    removed = []
    for v in order:
        if excess <= 0:
            break
        if v in keep_too:
            continue
        trash = os.path.join(layout.staging_root, f".prune-{name}-{v}.{os.getpid()}")
        os.makedirs(layout.staging_root, exist_ok=True)
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(layout.version_dir(name, v), trash)
        fsync_dir(layout.bundle_dir(name))
        pause("prune")
        shutil.rmtree(trash, ignore_errors=True)
        state.get("versions", {}).pop(v, None)
        removed.append(v)
        excess -= 1
    if removed:
        add_event(state, "prune", None, ", ".join(removed))
    return removed


def _finish(req: ActivateRequest, state: dict[str, Any], outcome: dict[str, Any]) -> None:
    outcome.setdefault("txn", req.txn)
    outcome.setdefault("version", req.version)
    outcome.setdefault("sha256", req.sha256)
    outcome.setdefault("at", now_iso())
    outcome.setdefault("seen", False)
    outcome["serving"] = current_version(req.store, req.name)
    state["outcome"] = outcome
    write_state(req.store, req.name, state, before_rename=lambda: pause("outcome"))


def run_activate(req: ActivateRequest) -> dict[str, Any]:
    """The transaction (see the module docstring); returns the outcome it recorded.

    The caller holds the device lock for ``req.txn``.
    """
    store, name, version = req.store, req.name, req.version
    started = time.time()
    deadline = started + req.deadline_s
    notes: list[str] = []
    with state_lock(store):
        state = read_state(store, name)
        orphan = state.get("pending")
        if orphan and orphan.get("txn") != req.txn:
            done = revert_pending(store, name, state, f"its deploy step is gone (txn {orphan.get('txn')})",
                                  "activate")
            notes.append(f"reverted an unfinished switch first: {done['reason']}")
        current = current_version(store, name)
        previous = current if current != version else state.get("previous")
        if previous == version:
            previous = None
        if not os.path.isfile(_layout(store).manifest_path(name, version)):
            outcome = {"status": "failed", "previous": previous, "complete": True, "notes": notes,
                       "reason": f"{name} {version} is not in the store {store}; nothing switched"}
            _finish(req, state, outcome)
            return outcome
        rec = state["versions"].get(version)
        if req.sha256 and (not rec or rec.get("sha256") != req.sha256):
            state["versions"][version] = {"sha256": req.sha256, "installed": now_iso(), "healthy": False}
            add_event(state, "install", version, req.sha256[:16])
        state["pending"] = {"txn": req.txn, "version": version, "previous": previous, "deadline": deadline,
                            "deadline_at": now_iso(deadline), "boot_id": _boot_id(), "started_at": now_iso(started),
                            "pid": os.getpid(), "by": req.by}
        add_event(state, "switch", version, f"from {previous}; confirm by {now_iso(deadline)}")
        write_state(store, name, state)
    timer = _schedule_revert(req, deadline)
    if timer:
        notes.append(timer)
    pause("before-switch")
    switch_current(store, name, version)
    pause("after-switch")
    health = _gate(req, version, deadline)
    if health.ok:
        with state_lock(store):
            state = read_state(store, name)
            if (state.get("pending") or {}).get("txn") != req.txn:
                return _lost(req, state)
            state["versions"].setdefault(version, {}).update(healthy=True, activated=now_iso())
            state["previous"] = previous
            state["pending"] = None
            removed = _prune(store, name, state, req.keep, {version, previous} - {None})  # type: ignore[arg-type]
            if removed:
                notes.append(f"pruned {', '.join(removed)}")
            add_event(state, "healthy", version, f"gate passed in {health.seconds:.1f} s ({req.by})")
            outcome = {"status": "deployed", "previous": previous, "reason": "", "health": health.to_dict(),
                       "notes": notes, "complete": True}
            _finish(req, state, outcome)
        return outcome
    reason = f"health gate failed: {health.reason}"
    with state_lock(store):
        state = read_state(store, name)
        if (state.get("pending") or {}).get("txn") != req.txn:
            return _lost(req, state)
        if previous:
            switch_current(store, name, previous)
            back = f"switched back to {previous}"
        else:
            remove_current(store, name)
            quarantine_version(store, name, version)
            back = f"no previous version: removed current, moved {version} to quarantine"
        state["pending"] = None
        state["versions"].setdefault(version, {})["healthy"] = False
        add_event(state, "rollback", previous, f"{version} failed: {health.reason}; {back}")
        outcome = {"status": "rolled-back", "previous": previous, "reason": reason, "health": health.to_dict(),
                   "notes": [*notes, back], "complete": False}
        _finish(req, state, outcome)
    # The device serves files of the previous version now; have the daemon serve it and say so.
    if previous:
        check = _gate(req, previous, time.time() + req.health_timeout + GATE_MARGIN_S)
        note = (f"{previous} serves and passes its health gate" if check.ok
                else f"{previous} fails its health gate too: {check.reason}")
    else:
        from cuvil_edge.deploy.health import daemon_unload

        err = daemon_unload(req.url, name, 30.0, req.token)
        note = f"unloaded {name}" if not err else f"could not unload {name}: {err}"
    with state_lock(store):
        state = read_state(store, name)
        last = state.get("outcome") or {}
        if last.get("txn") == req.txn:
            last.setdefault("notes", []).append(note)
            last["complete"] = True
            outcome = last
            write_state(store, name, state)
    return outcome


def _revert_timer_unit(txn: str) -> str:
    return f"cuvil-edge-revert-{txn}"


def _schedule_revert(req: ActivateRequest, deadline: float) -> str:
    """Have systemd run ``ondevice revert-expired`` as root just after the confirm deadline
    (a transient timer, ``systemd-run --on-active``): the revert then needs neither this step nor
    the daemon, which on a stock install may not write the store (docs/deploy.md, "Who owns the
    store"). A reboot drops the timer; the daemon unit's ``ExecStartPre=+…recover`` covers that.
    Returns a note when the timer could not be set (the daemon's own tick still reverts where it
    may write)."""
    if not (_systemd_running(req.root) and os.geteuid() == 0 and shutil.which("systemd-run")):
        return ""
    delay = max(1, int(deadline - time.time()) + 2)
    env = [f"--setenv=PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
    try:
        out = subprocess.run(["systemd-run", f"--unit={_revert_timer_unit(req.txn)}", f"--on-active={delay}s",
                              "--timer-property=AccuracySec=1s", "--collect", "--quiet", *env, "--",
                              sys.executable, "-m", "cuvil_edge.deploy.ondevice", "revert-expired",
                              "--store", req.store, "--reload", req.unit],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no revert timer: {exc}"
    return "" if out.returncode == 0 else f"no revert timer: {out.stderr.strip()[:200]}"


def _cancel_revert(req: ActivateRequest) -> None:
    """Stop the revert timer of a switch that was confirmed or switched back (best effort)."""
    if _systemd_running(req.root) and os.geteuid() == 0 and shutil.which("systemctl"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["systemctl", "stop", f"{_revert_timer_unit(req.txn)}.timer"], capture_output=True,
                           timeout=30)


def _lost(req: ActivateRequest, state: dict[str, Any]) -> dict[str, Any]:
    """The switch was reverted under us (the deadline passed): report the recorded outcome."""
    outcome = dict(state.get("outcome") or {})
    if outcome.get("txn") != req.txn:
        outcome = {"txn": req.txn, "status": "reverted", "version": req.version,
                   "reason": "the pending switch disappeared before it was confirmed", "complete": True}
    return outcome


# ---------------------------------------------------------------------------------------------- launch / wait


def _log_path(store: str, txn: str) -> str:
    layout = _layout(store)
    directory = layout.log_dir
    os.makedirs(directory, exist_ok=True)
    logs = sorted((os.path.getmtime(os.path.join(directory, n)), n) for n in os.listdir(directory)
                  if n.startswith("activate-"))
    for _, n in logs[:-LOG_KEEP]:
        try:
            os.unlink(os.path.join(directory, n))
        except OSError:
            pass
    return layout.log_path(txn)


def launch(req: ActivateRequest, python: str | None = None, launcher: str = "auto") -> dict[str, Any]:
    """Start the transaction detached from this process's session; returns how it was started.

    ``auto`` uses a transient systemd unit (``systemd-run``) where systemd is PID 1 and we are root,
    so logind's session cleanup cannot kill it; otherwise this process forks a child that starts a
    new session (``setsid``) with its own log and runs the transaction: no second interpreter to
    start, which a loaded small board feels. The caller holds the device lock for ``req.txn``.
    """
    use_systemd = launcher == "systemd-run" or (
        launcher == "auto" and _systemd_running(req.root) and os.geteuid() == 0 and shutil.which("systemd-run"))
    if use_systemd:
        python = python or sys.executable
        cmd = [python, "-m", "cuvil_edge.deploy.ondevice", "activate", "--foreground", *req.argv()]
        env = dict(os.environ)
        if req.token:
            env["CUVIL_EDGE_DAEMON_TOKEN"] = req.token
        unit = f"cuvil-edge-activate-{req.txn}"
        pass_env = [f"--setenv={k}={env[k]}" for k in ("CUVIL_EDGE_DAEMON_TOKEN", PAUSE_ENV, "PYTHONPATH") if k in env]
        out = subprocess.run(["systemd-run", f"--unit={unit}", "--collect", "--quiet", "--service-type=exec",
                              *pass_env, "--", *cmd], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise OSError(f"systemd-run failed: {out.stderr.strip()[:300]}")
        return {"launcher": "systemd-run", "unit": unit}
    log_path = _log_path(req.store, req.txn)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the detached step
        code = 1
        try:
            os.setsid()
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            null_fd = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null_fd, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            code = run_detached(req)
        except BaseException:  # noqa: BLE001 - the log is the only place left to say it
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return {"launcher": "setsid", "pid": pid, "log": log_path}


def run_detached(req: ActivateRequest) -> int:
    """The detached step's body: make the launcher's lock its own, run, release; exit code."""
    if not adopt_lock(req.store, req.txn):
        print(f"txn {req.txn}: the device lock is not held for this transaction; nothing done", file=sys.stderr)
        return 1
    try:
        outcome = run_activate(req)
    finally:
        release_lock(req.store, req.txn)
    if outcome.get("complete"):
        _cancel_revert(req)
    print(json.dumps(outcome), flush=True)
    return 0 if outcome.get("status") == "deployed" else 1


def wait_outcome(store: str, name: str, txn: str, timeout: float, poll: float = 0.05, ack: bool = True
                 ) -> dict[str, Any]:
    """Wait until the outcome of ``txn`` is recorded and complete, or ``timeout`` passes.

    Returns:
        dict: ``{"txn", "state": "done" | "pending" | "unknown", "outcome", "pending", "current"}``;
        ``unknown`` when the device has neither a pending switch nor an outcome for ``txn`` and no
        live step holds the lock for it (it never started).
    """
    begin = time.monotonic()
    end = begin + max(0.0, timeout)
    while True:
        state = read_state(store, name)
        outcome = state.get("outcome") or {}
        pending = state.get("pending") or {}
        mine = outcome.get("txn") == txn
        if mine and (outcome.get("complete") or pending.get("txn") != txn and time.monotonic() >= end):
            if ack and not outcome.get("seen"):
                mark_seen(store, name, txn)
                outcome["seen"] = True
            return {"txn": txn, "state": "done", "outcome": outcome, "pending": None,
                    "current": current_version(store, name)}
        if not mine and pending.get("txn") != txn:
            # Not started, or starting: the launcher wrote the lock for txn and the detached step
            # has not written its pending record yet (a few seconds of interpreter start at most).
            holder = _read_lock(store) or {}
            starting = holder.get("txn") == txn and (pid_alive(holder_pid(holder))
                                                      or time.monotonic() < begin + START_GRACE_S)
            if not starting:
                return {"txn": txn, "state": "unknown", "outcome": None, "pending": None,
                        "current": current_version(store, name)}
        if time.monotonic() >= end:
            return {"txn": txn, "state": "pending", "outcome": outcome if mine else None,
                    "pending": pending or None, "current": current_version(store, name)}
        time.sleep(poll)


def mark_seen(store: str, name: str, txn: str) -> bool:
    """Record that the host read the outcome of ``txn`` (a later deploy then does not adopt it again)."""
    with state_lock(store):
        state = read_state(store, name)
        outcome = state.get("outcome") or {}
        if outcome.get("txn") != txn or outcome.get("seen"):
            return False
        outcome["seen"] = True
        write_state(store, name, state)
        return True
