"""One device: deploy a bundle (check, send, switch, health gate, roll back), roll back, status.

:func:`deploy_device` leaves a device serving the new version, or still serving the old one:

1. probe the device (architecture, board, L4T, TensorRT) and refuse a bundle that does not fit;
2. unless that exact bundle (same signed manifest) is already installed, send the ``.cvb`` to
   ``deploy/uploads/`` (resumable; sha256 checked on the device), extract it with ``tar`` into
   ``deploy/staging/``, check every file's sha256 on the device and rename the directory to
   ``bundles/<name>/<version>``;
3. switch ``current`` in one atomic rename, ask the daemon to load the model
   (``POST /v2/repository/models/{m}/load``, or ``systemctl reload-or-restart`` where the daemon
   is down under systemd);
4. run the health gate through an SSH port forward to the daemon; on failure switch back to the
   previous version (or remove ``current`` when there was none), reload, and report why;
5. record the previous version and prune old versions (never current or previous).

The host verified the bundle's signature and checksums before any of this; the device only
ever uses files whose sha256 it computed itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from cuvil_edge.bundle import verify_bundle
from cuvil_edge.bundle.container import MANIFEST_NAME, SIGNATURE_NAME, iter_member_bytes
from cuvil_edge.deploy.health import HealthResult, check_health, daemon_load, daemon_unload
from cuvil_edge.deploy.layout import DeviceBusy, DeviceLock, DeviceStore, check_component, now_iso
from cuvil_edge.deploy.probe import DeviceFacts, IncompatibleDevice, check_compatible, probe_device
from cuvil_edge.deploy.transport import DeviceAddress, SSHTransport, Unreachable
from cuvil_edge.deploy.upload import CorruptUpload, file_sha256, upload_resumable
from cuvil_edge.errors import BundleError, DeployError

__all__ = [
    "DeployOptions",
    "DeviceResult",
    "PreparedBundle",
    "deploy_device",
    "device_status",
    "prepare_bundle",
    "rollback_device",
]

# Result statuses. "deployed" and "unchanged" are successes.
OK_STATUSES = ("deployed", "unchanged")


@dataclass
class PreparedBundle:
    """A bundle verified on the host, with what deploy needs from it."""

    path: Path
    manifest: Any
    manifest_bytes: bytes
    sha256: str
    size: int
    sample_inputs: bytes | None
    sample_expected: bytes | None

    @property
    def name(self) -> str:
        return str(self.manifest.name)

    @property
    def version(self) -> str:
        return str(self.manifest.version)


def prepare_bundle(path: Path, public_key: Path | None) -> PreparedBundle:
    """Verify the bundle (signature when ``public_key`` is given, every checksum) before any upload.

    Raises:
        SignatureError: the signature does not verify with ``public_key``.
        BundleError: a member is missing, extra, a link, or its checksum differs.
    """
    path = Path(path)
    if public_key is not None and not Path(public_key).is_file():
        raise BundleError(f"--pub {public_key}: no such public key file")
    manifest = verify_bundle(path, public_key)
    check_component("name", manifest.name)
    check_component("version", manifest.version)
    val = manifest.validation or {}
    want = {MANIFEST_NAME, val.get("sample_inputs", "sample/inputs.npz"),
            val.get("sample_expected", "sample/expected.npz")}
    members = dict(iter_member_bytes(path, want))
    return PreparedBundle(
        path=path,
        manifest=manifest,
        manifest_bytes=members[MANIFEST_NAME],
        sha256=file_sha256(path),
        size=path.stat().st_size,
        sample_inputs=members.get(val.get("sample_inputs", "sample/inputs.npz")),
        sample_expected=members.get(val.get("sample_expected", "sample/expected.npz")),
    )


@dataclass
class DeployOptions:
    """Knobs of a deployment.

    Args:
        keep (int): versions to keep on the device (current and previous always stay). Defaults to 3.
        health_timeout (float): seconds for the health gate. Defaults to 60.
        daemon_token (str): bearer token of the daemon. Defaults to None.
        connect_timeout (float): SSH connect timeout in seconds. Defaults to 15.
    """

    keep: int = 3
    health_timeout: float = 60.0
    daemon_token: str | None = None
    connect_timeout: float = 15.0


@dataclass
class DeviceResult:
    """What happened on one device."""

    device: str
    status: str  # deployed | unchanged | rolled-back | refused | unreachable | failed | skipped
    version: str | None = None
    previous: str | None = None
    reason: str = ""
    bytes_sent: int = 0
    resumed_from: int = 0
    seconds: float = 0.0
    stage: str = ""
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] | None = None
    health: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[str, str, int, int], None]  # (device, stage, done, total)


def _noop(device: str, stage: str, done: int, total: int) -> None:
    pass


async def deploy_device(
    bundle: PreparedBundle,
    address: DeviceAddress,
    options: DeployOptions | None = None,
    progress: Progress | None = None,
) -> DeviceResult:
    """Deploy ``bundle`` to one device; never raises for device-side failures (see the result)."""
    options = options or DeployOptions()
    progress = progress or _noop
    res = DeviceResult(device=address.label, status="failed", version=bundle.version)
    t0 = time.monotonic()
    try:
        async with SSHTransport(address, options.connect_timeout) as tr:
            await _deploy(tr, bundle, options, res, progress)
    except Unreachable as exc:
        res.status, res.reason = "unreachable", str(exc)
    except (IncompatibleDevice, DeviceBusy) as exc:
        res.status, res.reason = "refused", str(exc)
    except DeployError as exc:
        res.status, res.reason = "failed", str(exc)
    except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        # A link that dies between the transport's own checks; one device never stops a fleet.
        res.status, res.reason = "unreachable", f"{address.label}: {type(exc).__name__}: {exc}"
    res.seconds = round(time.monotonic() - t0, 3)
    progress(address.label, res.status, 1, 1)
    return res


async def _deploy(tr: SSHTransport, bundle: PreparedBundle, options: DeployOptions, res: DeviceResult,
                  progress: Progress) -> None:
    label = tr.address.label
    store = DeviceStore(tr)
    res.stage = "probe"
    progress(label, "probe", 0, bundle.size)
    facts = await probe_device(tr)
    res.facts = facts.to_dict()
    res.notes += check_compatible(bundle.manifest, facts, label)
    # Nothing on the device changes before this point: a refused device keeps no trace.
    lock = DeviceLock(tr)
    await lock.acquire()
    try:
        await _deploy_locked(tr, store, bundle, options, res, progress)
    finally:
        with contextlib.suppress(DeployError):
            await lock.release()


async def _deploy_locked(tr: SSHTransport, store: DeviceStore, bundle: PreparedBundle, options: DeployOptions,
                         res: DeviceResult, progress: Progress) -> None:
    label = tr.address.label
    name, version = bundle.name, bundle.version
    current = await store.current(name)
    state = await store.read_state(name)
    res.previous = current
    on_device = await store.manifest_bytes(name, version)
    if on_device is None:
        quarantined = store.quarantine_dir(name, version)
        if await tr.read_bytes(os.path.join(quarantined, MANIFEST_NAME)) == bundle.manifest_bytes:
            await tr.makedirs(store.bundle_dir(name))
            await tr.rename(quarantined, store.version_dir(name, version))
            on_device = bundle.manifest_bytes
            res.notes.append("restored from quarantine (failed an earlier gate)")
    installed = on_device == bundle.manifest_bytes
    record = state["versions"].get(version, {})
    if installed and current == version and record.get("healthy"):
        res.status, res.stage, res.previous = "unchanged", "done", state.get("previous")
        res.reason = f"{name} {version} is already current and passed its health gate"
        return
    if on_device is not None and not installed:
        if current == version:
            raise DeployError(
                f"{label}: {name} {version} on the device is a different build (other manifest) and it is "
                "current; give the new bundle a new version"
            )
        await tr.rmtree(store.version_dir(name, version))
    if not installed:
        res.stage = "upload"
        await _install(tr, store, bundle, res, progress)
    else:
        res.notes.append("bundle already on the device; nothing sent")
    if current == version:
        # A run that switched but did not finish its gate: the previous version is in the state.
        previous = (state.get("pending") or {}).get("previous") or state.get("previous")
        if previous == version:
            previous = None
    else:
        previous = current
    res.previous = previous
    await store.record(name, "switch", version, f"from {previous}",
                       pending={"version": version, "previous": previous})
    res.stage = "switch"
    progress(label, "switch", bundle.size, bundle.size)
    await store.switch(name, version)
    res.stage = "health"
    progress(label, "health", bundle.size, bundle.size)
    health = await _activate_and_check(tr, bundle.manifest.to_dict(), bundle.sample_inputs,
                                       bundle.sample_expected, options)
    res.health = health.to_dict()
    state = await store.read_state(name)
    if health.ok:
        state["versions"].setdefault(version, {})["healthy"] = True
        state["versions"][version]["activated"] = now_iso()
        await store.record(name, "healthy", version, "", previous=previous, pending=None,
                           versions=state["versions"])
        removed = await store.prune(name, options.keep)
        if removed:
            res.notes.append(f"pruned {', '.join(removed)}")
        res.status, res.stage = "deployed", "done"
        return
    res.stage = "rollback"
    res.reason = f"health gate failed: {health.reason}"
    back = await _switch_back(tr, store, name, version, previous, options)
    res.status = "rolled-back"
    res.notes.append(back)
    await store.record(name, "rollback", previous, f"{version} failed: {health.reason}; {back}", pending=None)


async def _install(tr: SSHTransport, store: DeviceStore, bundle: PreparedBundle, res: DeviceResult,
                   progress: Progress) -> None:
    label = tr.address.label
    name, version = bundle.name, bundle.version
    final = store.upload_path(bundle.sha256)
    up = await upload_resumable(tr, bundle.path, final, bundle.sha256,
                                progress=lambda done, total: progress(label, "upload", done, total))
    res.bytes_sent += up.sent
    res.resumed_from = up.resumed_from
    if up.resumed_from:
        res.notes.append(f"resumed upload at {up.resumed_from} bytes")
    if up.restarted:
        res.notes.append("partial upload on the device did not match; sent again from the start")
    res.stage = "extract"
    progress(label, "extract", bundle.size, bundle.size)
    staging = store.staging_dir(name, version)
    await tr.rmtree(staging)
    await tr.makedirs(staging)
    try:
        out = await tr.run(["tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", final, "-C", staging])
        if out.exit_status != 0:
            raise DeployError(f"{label}: tar could not extract {final}: {out.stderr.strip()[:300]}")
        expected = {f.path: f.sha256 for f in bundle.manifest.files}
        expected[MANIFEST_NAME] = hashlib.sha256(bundle.manifest_bytes).hexdigest()
        paths = [os.path.join(staging, p) for p in sorted(expected)]
        check = await tr.run(["sha256sum", "--", *paths])
        got: dict[str, str] = {}
        for line in check.stdout.splitlines():
            digest, _, path = line.partition("  ")
            got[os.path.relpath(path, staging)] = digest
        bad = sorted(p for p, d in expected.items() if got.get(p) != d)
        if check.exit_status != 0 or bad:
            raise CorruptUpload(f"{label}: extracted files do not match the manifest: {', '.join(bad)[:300]}")
        if not await tr.exists(os.path.join(staging, SIGNATURE_NAME)):
            raise DeployError(f"{label}: {SIGNATURE_NAME} missing after extraction")
        await tr.makedirs(store.bundle_dir(name))
        await tr.rename(staging, store.version_dir(name, version))
    except BaseException:
        with contextlib.suppress(Exception):
            await tr.rmtree(staging)
        raise
    await tr.remove(final)
    state = await store.read_state(name)
    state["versions"][version] = {"sha256": bundle.sha256, "installed": now_iso(), "healthy": False}
    await store.record(name, "install", version, f"{bundle.size} bytes, {res.bytes_sent} sent",
                       versions=state["versions"])


@contextlib.asynccontextmanager
async def _daemon_forward(tr: SSHTransport) -> AsyncIterator[str]:
    """The daemon's base URL, through an SSH port forward that lasts as long as the block."""
    async with tr.forward_local(tr.address.daemon_port) as port:
        yield f"http://127.0.0.1:{port}"


async def _tell_daemon(tr: SSHTransport, base: str, model: str, options: DeployOptions) -> str | None:
    """Ask the daemon to load ``model``; under systemd restart it when it is down. None when told."""
    err = await asyncio.to_thread(daemon_load, base, model, options.health_timeout, options.daemon_token)
    if err and "not reachable" in err and await tr.exists(tr.address.sys_path("run/systemd/system")):
        out = await tr.run(["systemctl", "reload-or-restart", "cuvil-edged.service"])
        if out.exit_status != 0:
            return f"{err}; systemctl reload-or-restart cuvil-edged failed: {out.stderr.strip()[:200]}"
        return None  # the daemon loads current at start; the gate waits for it
    return err


async def _activate_and_check(tr: SSHTransport, manifest: dict[str, Any], inputs: bytes | None,
                              expected: bytes | None, options: DeployOptions) -> HealthResult:
    # Messages name the daemon as the device sees it, not the local end of the forward.
    where = f"127.0.0.1:{tr.address.daemon_port} on the device"
    async with _daemon_forward(tr) as base:
        err = await _tell_daemon(tr, base, manifest["name"], options)
        if err:
            return HealthResult(False, err.replace(base, where))
        result = await asyncio.to_thread(check_health, base, manifest, inputs, expected,
                                         options.health_timeout, options.daemon_token)
        result.reason = result.reason.replace(base, where)
        return result


async def _read_sample(tr: SSHTransport, store: DeviceStore, name: str, version: str
                       ) -> tuple[dict[str, Any] | None, bytes | None, bytes | None]:
    import json

    raw = await store.manifest_bytes(name, version)
    if raw is None:
        return None, None, None
    manifest = json.loads(raw)
    val = manifest.get("validation") or {}
    vdir = store.version_dir(name, version)
    inputs = await tr.read_bytes(os.path.join(vdir, val.get("sample_inputs", "sample/inputs.npz")))
    expected = await tr.read_bytes(os.path.join(vdir, val.get("sample_expected", "sample/expected.npz")))
    return manifest, inputs, expected


async def _switch_back(tr: SSHTransport, store: DeviceStore, name: str, failed: str, previous: str | None,
                       options: DeployOptions) -> str:
    """Point ``current`` back at ``previous`` (or remove it) and have the daemon serve that again."""
    if previous is None:
        await store.remove_current(name)
        # The daemon serves the only version of a model without a current link: move it away.
        quarantine = store.quarantine_dir(name, failed)
        await tr.rmtree(quarantine)
        await tr.makedirs(os.path.dirname(quarantine))
        await tr.rename(store.version_dir(name, failed), quarantine)
        async with _daemon_forward(tr) as base:
            await asyncio.to_thread(daemon_unload, base, name, 30.0, options.daemon_token)
        return f"no previous version: removed current, moved {failed} to quarantine, unloaded {name}"
    await store.switch(name, previous)
    manifest, inputs, expected = await _read_sample(tr, store, name, previous)
    if manifest is None:
        return f"switched back to {previous} (its manifest is missing; not checked)"
    health = await _activate_and_check(tr, manifest, inputs, expected, options)
    if health.ok:
        return f"switched back to {previous}; it serves and passes its health gate"
    return f"switched back to {previous}, but it fails its health gate too: {health.reason}"


async def rollback_device(
    address: DeviceAddress,
    name: str,
    version: str | None = None,
    options: DeployOptions | None = None,
) -> DeviceResult:
    """Switch ``name`` on a device back to ``version`` (default: the recorded previous version)."""
    options = options or DeployOptions()
    res = DeviceResult(device=address.label, status="failed")
    t0 = time.monotonic()
    try:
        async with SSHTransport(address, options.connect_timeout) as tr:
            lock = DeviceLock(tr)
            await lock.acquire()
            try:
                await _rollback(tr, res, name, version, options)
            finally:
                with contextlib.suppress(DeployError):
                    await lock.release()
    except Unreachable as exc:
        res.status, res.reason = "unreachable", str(exc)
    except DeployError as exc:
        res.status, res.reason = "failed", str(exc)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


async def _rollback(tr: SSHTransport, res: DeviceResult, name: str, version: str | None,
                    options: DeployOptions) -> None:
    address = tr.address
    store = DeviceStore(tr)
    current = await store.current(name)
    state = await store.read_state(name)
    target = version or state.get("previous")
    if not target:
        older = [v for v in await store.versions(name) if v != current]
        target = older[-1] if older else None
    if not target:
        raise DeployError(f"{address.label}: {name} has no previous version to roll back to")
    check_component("version", target)
    if await store.manifest_bytes(name, target) is None:
        raise DeployError(f"{address.label}: {name} {target} is not on the device; "
                          f"present: {', '.join(await store.versions(name)) or 'none'}")
    res.version, res.previous = target, current
    await store.switch(name, target)
    manifest, inputs, expected = await _read_sample(tr, store, name, target)
    health = await _activate_and_check(tr, manifest or {"name": name, "version": target}, inputs,
                                       expected, options)
    res.health = health.to_dict()
    if not health.ok:
        res.reason = f"health gate failed on {target}: {health.reason}"
        if current and current != target:
            res.notes.append(await _switch_back(tr, store, name, target, current, options))
        res.status = "rolled-back"
    else:
        res.status = "deployed"
        await store.record(name, "rollback", target, f"from {current}",
                           previous=current if current != target else state.get("previous"),
                           pending=None)


async def device_status(address: DeviceAddress, name: str | None = None, options: DeployOptions | None = None,
                        ) -> dict[str, Any]:
    """Versions present, current and previous per bundle name, daemon health and device facts."""
    options = options or DeployOptions()
    out: dict[str, Any] = {"device": address.label, "reachable": False}
    try:
        async with SSHTransport(address, options.connect_timeout) as tr:
            out["reachable"] = True
            store = DeviceStore(tr)
            facts: DeviceFacts = await probe_device(tr)
            out["facts"] = facts.to_dict()
            names = [name] if name else await store.names()
            async with _daemon_forward(tr) as base:
                try:
                    status, _ = await asyncio.to_thread(_get, base, "/v2/health/ready", options.daemon_token)
                    out["daemon"] = "ready" if status == 200 else f"not ready (HTTP {status})"
                except Exception as exc:  # noqa: BLE001 - any failure is "down" for the report
                    where = f"127.0.0.1:{address.daemon_port} on the device"
                    out["daemon"] = f"down ({str(exc).replace(base, where)})"
                models = []
                for n in names:
                    state = await store.read_state(n)
                    cur = await store.current(n)
                    ready = None
                    if cur and out["daemon"] == "ready":
                        try:
                            st, _ = await asyncio.to_thread(_get, base, f"/v2/models/{n}/versions/{cur}/ready",
                                                            options.daemon_token)
                            ready = st == 200
                        except Exception:  # noqa: BLE001
                            ready = False
                    engine = await _serving_engine(base, n, options.daemon_token) if ready else {}
                    models.append({"name": n, "versions": await store.versions(n), "current": cur,
                                   "previous": state.get("previous"), "ready": ready,
                                   "last_event": (state.get("events") or [None])[-1], **engine})
                out["models"] = models
    except DeployError as exc:
        out["error"] = str(exc)
    return out


async def _serving_engine(base: str, name: str, token: str | None) -> dict[str, Any]:
    """Backend, engine key and reason the daemon reports in the model's /config (empty if unknown)."""
    try:
        status, cfg = await asyncio.to_thread(_get, base, f"/v2/models/{name}/config", token)
    except Exception:  # noqa: BLE001 - status reports what it can
        return {}
    if status != 200 or not isinstance(cfg, dict):
        return {}
    engine = cfg.get("engine") or {}
    return {"backend": cfg.get("backend"), "engine_key": cfg.get("engine_key"),
            "engine_reason": engine.get("reason", "") if isinstance(engine, dict) else ""}


def _get(base: str, path: str, token: str | None) -> tuple[int, Any]:
    from cuvil_edge.deploy.health import _HTTPFailure, daemon_request

    try:
        return daemon_request(base, "GET", path, timeout=5.0, token=token)
    except _HTTPFailure as exc:
        raise DeployError(exc.message) from None
