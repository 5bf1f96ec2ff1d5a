"""The bundle store on a device and the operations deploy does on it, all through SFTP.

Layout (docs/bundle-format.md; ``<store>`` defaults to ``/var/lib/cuvil-edge``)::

    <store>/bundles/<name>/<version>/        an extracted, verified bundle (what the daemon serves)
    <store>/bundles/<name>/current -> <version>
    <store>/deploy/uploads/<sha256>.cvb.part a partial upload, continued from its size
    <store>/deploy/uploads/<sha256>.cvb      a complete upload whose sha256 the device checked
    <store>/deploy/staging/<name>-<version>.<pid>/   extraction in progress (same file system)
    <store>/deploy/state/<name>.json         previous version, install records, recent events
    <store>/deploy/quarantine/<name>/<version>/  a version that failed a fresh install's gate
    <store>/deploy/lock                      held by the deploy or rollback in progress

The switch is one atomic step: a ``current.new`` symlink renamed over ``current``. Deploy state
lives outside ``bundles/`` so the daemon never mistakes it for a version. A version that fails
its health gate with no previous version to return to leaves ``bundles/`` too (to quarantine),
because the daemon serves the only version of a model that has no ``current`` link; deploying
the same bundle again moves it back without sending it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import asyncssh

from cuvil_edge.deploy.transport import SSHTransport
from cuvil_edge.errors import DeployError

__all__ = ["DeviceBusy", "DeviceLock", "DeviceStore", "check_component"]

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_RESERVED = {"current", "current.new", "previous"}
MAX_EVENTS = 50


def check_component(kind: str, value: str) -> str:
    """A bundle name or version must be one safe path component; raise DeployError otherwise."""
    if not _SAFE.fullmatch(value or "") or value in _RESERVED or value.endswith(".part"):
        raise DeployError(
            f"bundle {kind} '{value}' cannot be a directory name on the device; use letters, digits, '.', "
            "'_', '+' or '-' (not 'current' or 'previous')"
        )
    return value


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class DeviceStore:
    """Paths and operations of one device's bundle store."""

    tr: SSHTransport

    @property
    def root(self) -> str:
        return self.tr.address.store_root

    def bundle_dir(self, name: str) -> str:
        return os.path.join(self.root, "bundles", check_component("name", name))

    def version_dir(self, name: str, version: str) -> str:
        return os.path.join(self.bundle_dir(name), check_component("version", version))

    def current_link(self, name: str) -> str:
        return os.path.join(self.bundle_dir(name), "current")

    def upload_path(self, sha256: str) -> str:
        return os.path.join(self.root, "deploy", "uploads", f"{sha256}.cvb")

    def staging_dir(self, name: str, version: str) -> str:
        return os.path.join(self.root, "deploy", "staging", f"{name}-{version}.{os.getpid()}")

    def quarantine_dir(self, name: str, version: str) -> str:
        """Where a version that failed its gate on a fresh install waits, out of the daemon's sight."""
        return os.path.join(self.root, "deploy", "quarantine", check_component("name", name),
                            check_component("version", version))

    def state_path(self, name: str) -> str:
        return os.path.join(self.root, "deploy", "state", f"{check_component('name', name)}.json")

    # -- reading ----------------------------------------------------------------------------

    async def names(self) -> list[str]:
        return [n for n in await self.tr.listdir(os.path.join(self.root, "bundles")) if _SAFE.fullmatch(n)]

    async def versions(self, name: str) -> list[str]:
        """Installed versions of ``name``, oldest install first."""
        base = self.bundle_dir(name)
        found: list[tuple[float, str]] = []
        for entry in await self.tr.listdir(base):
            if entry in _RESERVED or not _SAFE.fullmatch(entry):
                continue
            st = await self.tr.stat(os.path.join(base, entry))
            if st is not None and st.type == 2:  # SFTP file type 2: directory
                found.append((float(st.mtime or 0), entry))
        state = await self.read_state(name)
        installed = state.get("versions", {})
        found.sort(key=lambda mv: (installed.get(mv[1], {}).get("installed", ""), mv[0], mv[1]))
        return [v for _, v in found]

    async def current(self, name: str) -> str | None:
        target = await self.tr.readlink(self.current_link(name))
        if target is None:
            return None
        return os.path.basename(target.rstrip("/"))

    async def manifest_bytes(self, name: str, version: str) -> bytes | None:
        return await self.tr.read_bytes(os.path.join(self.version_dir(name, version), "manifest.json"), 16 << 20)

    async def read_state(self, name: str) -> dict[str, Any]:
        raw = await self.tr.read_bytes(self.state_path(name), 4 << 20)
        if not raw:
            return {"name": name, "previous": None, "versions": {}, "events": []}
        try:
            state = json.loads(raw)
        except ValueError:
            return {"name": name, "previous": None, "versions": {}, "events": [],
                    "notes": ["state file unreadable; rebuilt"]}
        state.setdefault("versions", {})
        state.setdefault("events", [])
        state.setdefault("previous", None)
        return state

    # -- writing ----------------------------------------------------------------------------

    async def write_state(self, name: str, state: dict[str, Any]) -> None:
        state["events"] = state.get("events", [])[-MAX_EVENTS:]
        path = self.state_path(name)
        await self.tr.makedirs(os.path.dirname(path))
        await self.tr.write_bytes_atomic(path, json.dumps(state, indent=1, sort_keys=True).encode())

    async def record(self, name: str, event: str, version: str | None, detail: str = "",
                     **changes: Any) -> dict[str, Any]:
        """Append an event to the state file and apply ``changes`` (``previous=``, ``versions=``)."""
        state = await self.read_state(name)
        state.update(changes)
        state["events"].append({"at": now_iso(), "event": event, "version": version, "detail": detail})
        await self.write_state(name, state)
        return state

    async def switch(self, name: str, version: str) -> None:
        """Point ``current`` at ``version`` in one atomic rename (``current.new`` → ``current``)."""
        link = self.current_link(name)
        tmp = link + ".new"
        await self.tr.remove(tmp)
        await self.tr.symlink(check_component("version", version), tmp)
        await self.tr.rename(tmp, link)

    async def remove_current(self, name: str) -> None:
        await self.tr.remove(self.current_link(name))

    async def prune(self, name: str, keep: int) -> list[str]:
        """Delete the oldest versions beyond ``keep``; never the current or previous one.

        Returns:
            list[str]: the versions removed.
        """
        keep = max(int(keep), 1)
        versions = await self.versions(name)
        current = await self.current(name)
        state = await self.read_state(name)
        protected = {v for v in (current, state.get("previous")) if v}
        removable = [v for v in versions if v not in protected]
        excess = len(versions) - keep
        removed: list[str] = []
        for v in removable:
            if excess <= 0:
                break
            await self.tr.rmtree(self.version_dir(name, v))
            state["versions"].pop(v, None)
            removed.append(v)
            excess -= 1
        if removed:
            state["events"].append({"at": now_iso(), "event": "prune", "version": None,
                                    "detail": ", ".join(removed)})
            await self.write_state(name, state)
        return removed


class DeviceBusy(DeployError):
    """Another deploy or rollback holds the device's lock."""


@dataclass
class DeviceLock:
    """``<store>/deploy/lock``: one deploy or rollback at a time per device.

    Created with an exclusive SFTP open. A lock is taken over when its lease has expired, or when
    it was left by this host (same host name) by a process that is gone or by this very process
    (a run whose link died before it could unlock). Otherwise the device is busy.
    """

    tr: SSHTransport
    lease_s: float = 1800.0

    @property
    def path(self) -> str:
        return os.path.join(self.tr.address.store_root, "deploy", "lock")

    def _record(self) -> bytes:
        import socket
        import time

        now = time.time()
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": now,
                           "expires": now + self.lease_s, "at": now_iso()}).encode()

    async def acquire(self) -> None:
        await self.tr.makedirs(os.path.dirname(self.path))
        for _ in range(2):
            try:
                f = await self.tr.sftp.open(self.path, "xb")  # type: ignore[union-attr]
            except asyncssh.SFTPFailure:
                if not await self._stale():
                    raise
                await self.tr.remove(self.path)
                continue
            except asyncssh.Error as exc:
                raise self.tr._error("lock", self.path, exc) from exc
            try:
                await f.write(self._record())
            finally:
                await f.close()
            return
        raise DeviceBusy(f"{self.tr.address.label}: could not take {self.path}")

    async def _stale(self) -> bool:
        import socket
        import time

        raw = await self.tr.read_bytes(self.path, 65536)
        if raw is None:
            return True
        try:
            holder = json.loads(raw)
        except ValueError:
            return True  # half-written by a run that died
        if float(holder.get("expires", 0)) < time.time():
            return True
        if holder.get("host") == socket.gethostname():
            pid = int(holder.get("pid", -1))
            if pid == os.getpid() or not _pid_alive(pid):
                return True
        raise DeviceBusy(
            f"{self.tr.address.label}: busy: a deploy from {holder.get('host')} (pid {holder.get('pid')}) holds "
            f"{self.path} since {holder.get('at')}; retry later, or remove the file if that run is gone"
        )

    async def release(self) -> None:
        await self.tr.remove(self.path)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
