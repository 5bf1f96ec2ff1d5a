"""The bundle store on a device and the operations deploy does on it, all through SFTP.

The paths are the store layout's (:class:`cuvil_edge.bundle.layout.StoreLayout`, the rules the
daemon's store and the device-side deploy step use too); this module only reaches them over SSH.
Layout (docs/bundle-format.md; ``<store>`` defaults to ``/var/lib/cuvil-edge``)::

    <store>/bundles/<name>/<version>/        an extracted, verified bundle (what the daemon serves)
    <store>/bundles/<name>/current -> <version>
    <store>/deploy/uploads/<sha256>.cvb.part a partial upload, continued from its size
    <store>/deploy/uploads/<sha256>.cvb      a complete upload whose sha256 the device checked
    <store>/deploy/staging/<name>-<version>.<pid>/   extraction in progress (same file system)
    <store>/deploy/state/<name>.json         previous version, install records, recent events,
                                             the pending switch and the last outcome
    <store>/deploy/quarantine/<name>/<version>/  a version that failed a fresh install's gate
    <store>/deploy/lock                      held by the deploy or rollback in progress

The host only reads the state file: every change to it (and every switch of ``current``) is made
on the device, by the deploy step or the daemon (``cuvil_edge/bundle/activation.py``), with
:func:`cuvil_edge.bundle.layout.point_current`. Deploy state
lives outside ``bundles/`` so the daemon never mistakes it for a version. A version that fails
its health gate with no previous version to return to leaves ``bundles/`` too (to quarantine),
because the daemon serves the only version of a model that has no ``current`` link; deploying
the same bundle again moves it back without sending it.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from cuvil_edge.bundle.layout import StoreLayout, version_of_link
from cuvil_edge.bundle.names import check_component as _check_component
from cuvil_edge.bundle.names import is_safe_component
from cuvil_edge.deploy.lockfile import (
    holder_pid,
    lock_record,
    other_boot,
    parse_record,
    pid_alive,
    record_expired,
)
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.errors import DeployError

__all__ = ["DeviceActivating", "DeviceBusy", "DeviceLock", "DeviceStore", "check_component"]



def check_component(kind: str, value: str) -> str:
    """A bundle name or version must be one safe path component (the bundle contract's rule,
    :func:`cuvil_edge.bundle.names.check_component`); raise DeployError otherwise."""
    return _check_component(kind, value, DeployError)


@dataclass
class DeviceStore:
    """Paths and operations of one device's bundle store."""

    tr: Transport

    @property
    def root(self) -> str:
        return self.tr.address.store_root

    @property
    def layout(self) -> StoreLayout:
        """The device's store paths (unsafe names raise DeployError)."""
        return StoreLayout(self.root, DeployError)

    def bundle_dir(self, name: str) -> str:
        return self.layout.bundle_dir(name)

    def version_dir(self, name: str, version: str) -> str:
        return self.layout.version_dir(name, version)

    def current_link(self, name: str) -> str:
        return self.layout.current_link(name)

    def upload_path(self, sha256: str) -> str:
        return self.layout.upload_path(sha256)

    def staging_dir(self, name: str, version: str) -> str:
        return self.layout.staging_dir(name, version)

    def quarantine_dir(self, name: str, version: str) -> str:
        """Where a version that failed its gate on a fresh install waits, out of the daemon's sight."""
        return self.layout.quarantine_dir(name, version)

    def state_path(self, name: str) -> str:
        return self.layout.state_path(name)

    # -- reading ----------------------------------------------------------------------------

    async def names(self) -> list[str]:
        return [n for n in await self.tr.listdir(self.layout.bundles_dir) if is_safe_component(n)]

    async def versions(self, name: str) -> list[str]:
        """Installed versions of ``name``, oldest install first."""
        base = self.bundle_dir(name)
        found: list[tuple[float, str]] = []
        for entry in await self.tr.listdir(base):
            if not is_safe_component(entry):
                continue
            st = await self.tr.stat(os.path.join(base, entry))
            if st is not None and st.is_dir:
                found.append((st.mtime, entry))
        state = await self.read_state(name)
        installed = state.get("versions", {})
        found.sort(key=lambda mv: (installed.get(mv[1], {}).get("installed", ""), mv[0], mv[1]))
        return [v for _, v in found]

    async def current(self, name: str) -> str | None:
        target = await self.tr.readlink(self.current_link(name))
        if target is None:
            return None
        return version_of_link(target)

    async def manifest_bytes(self, name: str, version: str) -> bytes | None:
        return await self.tr.read_bytes(self.layout.manifest_path(name, version), 16 << 20)

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


class DeviceBusy(DeployError):
    """Another deploy or rollback holds the device's lock."""


class DeviceActivating(DeviceBusy):
    """The device's own deploy step (of an earlier run) holds the lock: it ends by ``expires``."""

    def __init__(self, message: str, txn: str, expires: float) -> None:
        super().__init__(message)
        self.txn = txn
        self.expires = expires


@dataclass
class DeviceLock:
    """``<store>/deploy/lock``: one deploy or rollback at a time per device.

    Created with an exclusive SFTP open. A lock is taken over when its lease has expired, or when
    it was left by this host (same host name) by a process that is gone or by this very process
    (a run whose link died before it could unlock), or by a device-side deploy step whose process
    is gone from the device's ``/proc``. Otherwise the device is busy. The record carries a random
    token: the device-side step takes the lock over by it, and :meth:`release` removes the file
    only while it still holds this run's token.
    """

    tr: Transport
    lease_s: float = 1800.0
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def path(self) -> str:
        return StoreLayout(self.tr.address.store_root, DeployError).lock_path

    def _record(self) -> bytes:
        import time

        return json.dumps(lock_record("host", time.time() + self.lease_s, self.token)).encode()

    async def acquire(self) -> None:
        await self.tr.makedirs(os.path.dirname(self.path))
        for _ in range(2):
            if await self.tr.create_exclusive(self.path, self._record()):
                return
            if not await self._stale():
                raise DeviceBusy(f"{self.tr.address.label}: busy: {self.path} is held")
            await self.tr.remove(self.path)
        raise DeviceBusy(f"{self.tr.address.label}: could not take {self.path}")

    async def _stale(self) -> bool:
        import socket

        holder = parse_record(await self.tr.read_bytes(self.path, 65536))
        if not holder:
            return True  # gone, or half-written by a run that died
        if record_expired(holder):
            return True
        if holder.get("where") == "device":
            boot = (await self.tr.read_bytes("/proc/sys/kernel/random/boot_id", 256) or b"").decode().strip()
            if other_boot(holder, boot or None):
                return True  # the device rebooted (or lost power) since: that step is gone
            pid = holder_pid(holder)
            if pid <= 0 or not await self.tr.exists(f"/proc/{pid}"):
                return True  # the device-side step died (its pid is gone from the device)
            raise DeviceActivating(
                f"{self.tr.address.label}: busy: the device is still running the deploy step of an earlier run "
                f"(txn {holder.get('txn')}, pid {pid}) since {holder.get('at')}",
                str(holder.get("txn")), float(holder.get("expires", 0)))
        if holder.get("host") == socket.gethostname():
            pid = holder_pid(holder)
            if pid == os.getpid() or not pid_alive(pid):
                return True
        raise DeviceBusy(
            f"{self.tr.address.label}: busy: a deploy from {holder.get('host')} (pid {holder.get('pid')}) holds "
            f"{self.path} since {holder.get('at')}; retry later, or remove the file if that run is gone"
        )

    async def held(self) -> bool:
        """True while the lock file still carries this run's token (not handed over, not taken)."""
        holder = parse_record(await self.tr.read_bytes(self.path, 65536))
        return holder is not None and holder.get("token") == self.token

    async def release(self) -> None:
        """Remove the lock unless the device-side step took it over (it releases it itself)."""
        if await self.held():
            await self.tr.remove(self.path)
