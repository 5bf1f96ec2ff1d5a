"""One device: deploy a bundle (check, send, then the device switches, gates and commits), roll back, status.

:func:`deploy_device` leaves a device serving the new version marked healthy, or still serving
the old one, whatever happens to the link:

1. probe the device (architecture, board, L4T, TensorRT) and refuse a bundle that does not fit;
2. take the device lock; unless that exact bundle (same signed manifest) is already installed,
   send the ``.cvb`` to ``deploy/uploads/`` (resumable; sha256 checked on the device), then the
   device unpacks it (``ondevice unpack``, ``deploy/unpack.py``): extract, fsync every file and
   directory, check every file's sha256, rename to ``bundles/<name>/<version>``, fsync the parents;
3. start the device-side step (``python -m cuvil_edge.deploy.ondevice activate``, detached from
   the SSH session, the lock handed over to it): it records a pending switch with a confirm
   deadline, switches ``current``, has the daemon load the model, runs the health gate with the
   bundle's sample and either marks the version healthy (pruning old versions) or switches back;
   the outcome goes to the state file atomically (``deploy/activate.py``);
4. read the outcome; when the link drops, reconnect and read it then. A pending switch that
   nobody confirms by its deadline is reverted by the device itself (the daemon, at start and on
   its tick; ``bundle/activation.py``), and a later run reports an outcome its host never saw.

The host verified the bundle's signature and checksums before any of this; the device only
ever uses files whose sha256 it computed itself. The host never writes the state file.
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

from cuvil_edge.bundle import Manifest, verify_bundle
from cuvil_edge.bundle.container import MANIFEST_NAME, iter_member_bytes
from cuvil_edge.deploy._asyncssh import asyncssh
from cuvil_edge.deploy.activate import GATE_MARGIN_S
from cuvil_edge.deploy.layout import DeviceActivating, DeviceBusy, DeviceLock, DeviceStore, check_component
from cuvil_edge.deploy.probe import DeviceFacts, IncompatibleDevice, check_compatible, probe_device
from cuvil_edge.deploy.transport import DeviceAddress, Unreachable
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.deploy.transports import open_transport
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
    manifest: Manifest
    manifest_bytes: bytes
    sha256: str
    size: int
    sample_inputs: bytes | None
    sample_expected: bytes | None

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version


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
    samples = {kind: manifest.sample_member(kind) for kind in ("sample_inputs", "sample_expected")}
    want = {MANIFEST_NAME, *samples.values()}
    members = dict(iter_member_bytes(path, want))
    return PreparedBundle(
        path=path,
        manifest=manifest,
        manifest_bytes=members[MANIFEST_NAME],
        sha256=file_sha256(path),
        size=path.stat().st_size,
        sample_inputs=members.get(samples["sample_inputs"]),
        sample_expected=members.get(samples["sample_expected"]),
    )


@dataclass
class DeployOptions:
    """Knobs of a deployment.

    Args:
        keep (int): versions to keep on the device (current and previous always stay). Defaults to 3.
        health_timeout (float): seconds for the health gate. Defaults to 60.
        daemon_token (str): bearer token of the daemon. Defaults to None.
        connect_timeout (float): SSH connect timeout in seconds. Defaults to 15.
        confirm_deadline (float): seconds a switch may stay unconfirmed on the device; past it the
            device reverts it by itself (daemon start and tick). Defaults to 120.
        reconnect_for (float): seconds the host keeps trying to reach a device whose link dropped
            during its deploy step. Defaults to the confirm deadline plus 30 s.
    """

    keep: int = 3
    health_timeout: float = 60.0
    daemon_token: str | None = None
    connect_timeout: float = 15.0
    confirm_deadline: float = 120.0
    reconnect_for: float | None = None

    def check(self) -> None:
        """Raise DeployError when the gate could outlast the confirm deadline."""
        if self.health_timeout <= 0:
            raise DeployError(f"--health-timeout {self.health_timeout:g}: must be positive")
        if self.health_timeout + GATE_MARGIN_S >= self.confirm_deadline:
            raise DeployError(
                f"--health-timeout {self.health_timeout:g} s must end at least {GATE_MARGIN_S:g} s before "
                f"--confirm-deadline {self.confirm_deadline:g} s; raise the deadline or shorten the gate")


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
    txn: str | None = None
    serving: str | None = None  # the version the device's ``current`` named when it last answered

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[str, str, int, int], None]  # (device, stage, done, total)


def _noop(device: str, stage: str, done: int, total: int) -> None:
    pass


def _translate(res: DeviceResult, address: DeviceAddress, exc: BaseException) -> None:
    if isinstance(exc, Unreachable):
        res.status, res.reason = "unreachable", str(exc)
    elif isinstance(exc, (IncompatibleDevice, DeviceBusy)):
        res.status, res.reason = "refused", str(exc)
    elif isinstance(exc, DeployError):
        res.status, res.reason = "failed", str(exc)
    else:  # a link that dies between the transport's own checks; one device never stops a fleet
        res.status, res.reason = "unreachable", f"{address.label}: {type(exc).__name__}: {exc}"


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
        options.check()
        async with open_transport(address, options.connect_timeout) as tr:
            await _deploy(tr, bundle, options, res, progress)
    except (DeployError, asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        _translate(res, address, exc)
    res.seconds = round(time.monotonic() - t0, 3)
    progress(address.label, res.status, 1, 1)
    return res


async def _take_lock(tr: Transport, progress: Progress, total: int) -> DeviceLock:
    """The device lock; while the device still runs an earlier run's deploy step, wait for it."""
    lock = DeviceLock(tr)
    waited = False
    while True:
        try:
            await lock.acquire()
            return lock
        except DeviceActivating as exc:
            if time.time() > exc.expires:
                raise
            if not waited:
                progress(tr.address.label, "waiting for an earlier deploy step", 0, total)
                waited = True
            await asyncio.sleep(1.0)


async def _deploy(tr: Transport, bundle: PreparedBundle, options: DeployOptions, res: DeviceResult,
                  progress: Progress) -> None:
    label = tr.address.label
    store = DeviceStore(tr)
    res.stage = "probe"
    progress(label, "probe", 0, bundle.size)
    facts = await probe_device(tr)
    res.facts = facts.to_dict()
    res.notes += check_compatible(bundle.manifest, facts, label)
    # Nothing on the device changes before this point: a refused device keeps no trace.
    lock = await _take_lock(tr, progress, bundle.size)
    try:
        await _deploy_locked(tr, store, bundle, options, res, progress, lock)
    finally:
        with contextlib.suppress(DeployError, asyncssh.Error, OSError):
            await lock.release()  # a no-op once the device-side step took the lock over


async def _deploy_locked(tr: Transport, store: DeviceStore, bundle: PreparedBundle, options: DeployOptions,
                         res: DeviceResult, progress: Progress, lock: DeviceLock) -> None:
    label = tr.address.label
    name, version = bundle.name, bundle.version
    current = await store.current(name)
    state = await store.read_state(name)
    res.previous = current
    res.serving = current
    if await _adopt(tr, state, bundle, current, res):
        return
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
    if installed and current == version and record.get("healthy") and not state.get("pending"):
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
    res.stage = "activate"
    progress(label, "activate", bundle.size, bundle.size)
    outcome = await _activate_on_device(tr, name, version, bundle.sha256, options, res, progress, lock)
    _apply_outcome(res, outcome)


def _apply_outcome(res: DeviceResult, outcome: dict[str, Any]) -> None:
    status = outcome.get("status")
    res.serving = outcome.get("serving", res.serving)
    res.previous = outcome.get("previous", res.previous)
    res.health = outcome.get("health") or res.health
    res.notes += [n for n in outcome.get("notes") or [] if n not in res.notes]
    if status == "deployed":
        res.status, res.stage = "deployed", "done"
        return
    res.reason = str(outcome.get("reason") or status)
    if status == "rolled-back":
        res.status, res.stage = "rolled-back", "rollback"
    elif status == "reverted":
        res.status, res.stage = "rolled-back", "reverted"
        res.reason = f"the device reverted the switch: {res.reason}"
    elif status == "refused":
        res.status = "refused"
    else:
        res.status = "failed"


async def _adopt(tr: Transport, state: dict[str, Any], bundle: PreparedBundle, current: str | None,
                 res: DeviceResult) -> bool:
    """Report the device's outcome of an earlier run of this bundle that its host never read (its
    link dropped during the device step); True when that outcome answers this run."""
    last = state.get("outcome") or {}
    if (not last or last.get("seen") or not last.get("complete") or last.get("version") != bundle.version
            or last.get("sha256") != bundle.sha256 or state.get("pending")):
        return False
    status = last.get("status")
    healthy = (state.get("versions", {}).get(bundle.version) or {}).get("healthy")
    if status == "deployed" and not (current == bundle.version and healthy):
        return False  # changed since; deploy again
    if status not in ("deployed", "rolled-back", "reverted"):
        return False
    res.txn = last.get("txn")
    res.notes.append(f"adopted the outcome of an earlier run that lost its link (txn {res.txn}, {last.get('at')})")
    _apply_outcome(res, last)
    await _ondevice(tr, ["ack", "--store", tr.address.store_root, "--name", bundle.name, "--txn", str(res.txn)], 60)
    return True


async def _ondevice(tr: Transport, args: list[str], timeout: float, stdin: str | None = None) -> dict[str, Any]:
    """Run ``python -m cuvil_edge.deploy.ondevice ARGS`` on the device; its JSON answer."""
    import json

    a = tr.address
    out = await tr.run([a.python, "-m", "cuvil_edge.deploy.ondevice", *args], timeout=timeout, input=stdin)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("{")]
    if not lines:
        hint = out.stderr.strip().splitlines()[-1:] or [f"exit {out.exit_status}"]
        raise DeployError(
            f"{a.label}: the device step `{a.python} -m cuvil_edge.deploy.ondevice {args[0]}` failed: {hint[0][:300]}; "
            "the device needs cuvil-edge in that Python (pass --device-python PATH)")
    try:
        answer = json.loads(lines[-1])
    except ValueError as exc:
        raise DeployError(f"{a.label}: the device step printed something that is not JSON: {lines[-1][:200]}") from exc
    return dict(answer)


async def _ondevice_acked(tr: Transport, args: list[str], timeout: float, first_line: str | None = None
                          ) -> dict[str, Any]:
    """Run an ``ondevice`` step that answers with an outcome, and acknowledge the outcome once read.

    The step prints one JSON line and, when it reports a finished outcome, waits for ``ack`` on its
    stdin before it marks the outcome seen: if the link drops before that, the outcome stays
    unseen and the next deploy reports it.
    """
    import json

    a = tr.address
    argv = [a.python, "-m", "cuvil_edge.deploy.ondevice", *args, "--ack-stdin"]
    try:
        proc = await tr.process(argv)
        try:
            if first_line is not None:
                proc.stdin.write(first_line + "\n")
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            if not line:
                await asyncio.wait_for(proc.wait(check=False), 10)
                if proc.exit_status is None and proc.exit_signal is None:
                    raise Unreachable(f"{a.label}: the connection closed during the device step")
                err = (await proc.stderr.read()).strip().splitlines()[-1:] or [f"exit {proc.exit_status}"]
                raise DeployError(
                    f"{a.label}: the device step `{a.python} -m cuvil_edge.deploy.ondevice {args[0]}` failed: "
                    f"{err[0][:300]}; the device needs cuvil-edge in that Python (pass --device-python PATH)")
            try:
                answer = dict(json.loads(line))
            except ValueError as exc:
                raise DeployError(f"{a.label}: the device step printed something that is not JSON: "
                                  f"{line[:200]}") from exc
            if answer.get("state") == "done":
                proc.stdin.write("ack\n")
            proc.stdin.write_eof()
            await asyncio.wait_for(proc.wait(check=False), 30)
            return answer
        finally:
            proc.close()
    except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        raise tr.error("run", f"ondevice {args[0]}", exc) from exc


async def _activate_on_device(tr: Transport, name: str, version: str, sha256: str | None,
                              options: DeployOptions, res: DeviceResult, progress: Progress,
                              lock: DeviceLock | None) -> dict[str, Any]:
    """Start the device-side transaction and return its outcome, reconnecting when the link drops.

    Raises:
        Unreachable: the link stayed down longer than ``options.reconnect_for``; the device
            finishes by itself (it confirms or reverts by its deadline).
        DeviceBusy / DeployError: the device refused or could not start the step.
    """
    import socket
    import uuid

    a = tr.address
    txn = uuid.uuid4().hex[:16]
    res.txn = txn
    deadline_at = time.time() + options.confirm_deadline
    wait = options.confirm_deadline + GATE_MARGIN_S
    argv = ["activate", "--store", a.store_root, "--root", a.root, "--name", name, "--version", version,
            "--txn", txn, "--deadline", f"{options.confirm_deadline:g}", "--url", f"http://127.0.0.1:{a.daemon_port}",
            "--health-timeout", f"{options.health_timeout:g}", "--keep", str(options.keep),
            "--by", f"cuvil-edge deploy from {socket.gethostname()}", "--wait", f"{wait:g}", "--token-stdin"]
    if sha256:
        argv += ["--sha256", sha256]
    if lock is not None:
        argv += ["--lock-token", lock.token]
    try:
        answer = await _ondevice_acked(tr, argv, wait + 60, first_line=options.daemon_token or "")
        while answer.get("state") == "pending":
            await _revert_if_overdue(tr, deadline_at)
            answer = await _ondevice_acked(tr, ["wait", "--store", a.store_root, "--name", name, "--txn", txn,
                                                "--timeout", "20"], 80)
    except Unreachable as exc:
        progress(a.label, "link lost; reconnecting", 0, 0)
        answer = await _reconnect_and_wait(a, name, txn, options, exc, deadline_at, lock)
        res.notes.append("the link dropped during the device step; reconnected and read the device's outcome")
    state = answer.get("state")
    if state == "refused":
        reason = str((answer.get("outcome") or {}).get("reason"))
        raise DeviceBusy(f"{a.label}: {reason}") if "busy" in reason else DeployError(f"{a.label}: {reason}")
    res.serving = answer.get("current", res.serving)
    if state == "unknown":
        raise Unreachable(f"{a.label}: the link dropped before the device step started; nothing was switched "
                          f"(current: {answer.get('current')}); deploy again")
    return dict(answer.get("outcome") or {})


async def _revert_if_overdue(tr: Transport, deadline_at: float) -> bool:
    """Revert the device's unconfirmed switches once the deadline of ours has passed (the host
    logs in as root or through sudo, so it may, whatever the daemon may); True when it ran.

    The device reverts by itself too (a root timer at the deadline, the daemon unit's start), but
    the host that is connected now need not wait for either: what it reports is then what the
    device serves.
    """
    if time.time() < deadline_at + 1.0:
        return False
    with contextlib.suppress(DeployError):
        await _ondevice(tr, ["revert-expired", "--store", tr.address.store_root, "--reload", "cuvil-edged.service"],
                        120)
    return True


async def _reconnect_and_wait(address: DeviceAddress, name: str, txn: str, options: DeployOptions,
                              first: BaseException, deadline_at: float, lock: DeviceLock | None) -> dict[str, Any]:
    """Reconnect until the device reports the outcome of ``txn``, or ``options.reconnect_for`` passes."""
    span = options.reconnect_for if options.reconnect_for is not None else options.confirm_deadline + 30.0
    give_up = time.monotonic() + span
    delay, last = 0.5, first
    seen: dict[str, Any] | None = None  # the last answer of a device we did reach
    while True:
        left = give_up - time.monotonic()
        if left <= 0:
            break
        try:
            async with open_transport(address, max(1.0, min(options.connect_timeout, left))) as tr:
                first_round = True
                while True:
                    # Once per reconnection whatever the clock says: the device may have rebooted
                    # (a power cut), which makes its pending switch due at once (boot id rule).
                    await _revert_if_overdue(tr, 0.0 if first_round else deadline_at)
                    first_round = False
                    answer = await _ondevice_acked(tr, ["wait", "--store", address.store_root, "--name", name,
                                                        "--txn", txn, "--timeout", f"{max(1.0, min(20.0, left)):g}"],
                                                   80)
                    seen = answer
                    if answer.get("state") != "pending":
                        if answer.get("state") == "unknown" and lock is not None:
                            with contextlib.suppress(DeployError, asyncssh.Error, OSError):
                                await DeviceLock(tr, token=lock.token).release()
                        return answer
                    left = give_up - time.monotonic()
                    if left <= 0:
                        break
        except Unreachable as exc:
            last = exc
        await asyncio.sleep(min(delay, max(0.0, give_up - time.monotonic())))
        delay = min(delay * 2, 5.0)
    from cuvil_edge.bundle.activation import now_iso as _iso

    if seen is not None:  # reachable, but the switch stayed pending: say so, not "cannot connect"
        raise DeployError(
            f"{address.label}: reconnected, but the device's deploy step still had {name} pending after "
            f"{span:.0f} s (serving {seen.get('current')}); the device reverts an unconfirmed switch by "
            f"{_iso(deadline_at)}: `cuvil-edge status` shows the outcome")
    raise Unreachable(
        f"{address.label}: link lost during the device's deploy step ({last}); the device finishes it by itself "
        f"and reverts an unconfirmed switch by {_iso(deadline_at)}: `cuvil-edge status` or a re-run shows the outcome")


async def _install(tr: Transport, store: DeviceStore, bundle: PreparedBundle, res: DeviceResult,
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
    # On the device, in one step: extract, fsync every file and directory, check each sha256,
    # rename into bundles/ and fsync the parents (deploy/unpack.py): a power cut at any moment
    # leaves no version directory or a complete, durable one.
    answer = await _ondevice(tr, ["unpack", "--store", tr.address.store_root, "--name", name, "--version", version,
                                  "--sha256", bundle.sha256, "--manifest-sha256",
                                  hashlib.sha256(bundle.manifest_bytes).hexdigest()], 1800)
    if not answer.get("ok"):
        reason = str(answer.get("reason") or "unknown reason")
        if "do not match" in reason:
            raise CorruptUpload(f"{label}: {reason[:400]}")
        raise DeployError(f"{label}: the device could not unpack {name} {version}: {reason[:400]}")
    # The install record (sha256, time) is written on the device by the deploy step.


@contextlib.asynccontextmanager
async def _daemon_forward(tr: Transport) -> AsyncIterator[str]:
    """The daemon's base URL, through an SSH port forward that lasts as long as the block."""
    async with tr.forward_local(tr.address.daemon_port) as port:
        yield f"http://127.0.0.1:{port}"


async def rollback_device(
    address: DeviceAddress,
    name: str,
    version: str | None = None,
    options: DeployOptions | None = None,
) -> DeviceResult:
    """Switch ``name`` on a device back to ``version`` (default: the recorded previous version).

    The switch runs as the same device-side transaction as a deploy: health-gated, switched back
    when the gate fails, reverted by the device when it is not confirmed by the deadline.
    """
    options = options or DeployOptions()
    res = DeviceResult(device=address.label, status="failed")
    t0 = time.monotonic()
    try:
        options.check()
        async with open_transport(address, options.connect_timeout) as tr:
            lock = await _take_lock(tr, _noop, 0)
            try:
                await _rollback(tr, res, name, version, options, lock)
            finally:
                with contextlib.suppress(DeployError, asyncssh.Error, OSError):
                    await lock.release()
    except (DeployError, asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        _translate(res, address, exc)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


async def _rollback(tr: Transport, res: DeviceResult, name: str, version: str | None,
                    options: DeployOptions, lock: DeviceLock) -> None:
    address = tr.address
    store = DeviceStore(tr)
    check_component("name", name)
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
    outcome = await _activate_on_device(tr, name, target, None, options, res, _noop, lock)
    _apply_outcome(res, outcome)
    res.previous = current
    if res.status == "rolled-back" and outcome.get("status") == "rolled-back":
        res.reason = f"health gate failed on {target}: {outcome.get('health', {}).get('reason') or res.reason}"


async def device_status(address: DeviceAddress, name: str | None = None, options: DeployOptions | None = None,
                        ) -> dict[str, Any]:
    """Versions present, current and previous per bundle name, daemon health and device facts."""
    options = options or DeployOptions()
    out: dict[str, Any] = {"device": address.label, "reachable": False}
    try:
        async with open_transport(address, options.connect_timeout) as tr:
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
                    pending = state.get("pending") or None
                    outcome = state.get("outcome") or None
                    models.append({"name": n, "versions": await store.versions(n), "current": cur,
                                   "previous": state.get("previous"), "ready": ready,
                                   "healthy": bool((state.get("versions", {}).get(cur or "") or {}).get("healthy")),
                                   "pending": pending and {k: pending.get(k) for k in
                                                           ("txn", "version", "previous", "deadline_at", "by")},
                                   "last_outcome": outcome and {k: outcome.get(k) for k in
                                                                ("txn", "status", "version", "serving", "reason",
                                                                 "at", "seen")},
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
    from cuvil_edge.deploy.health import DaemonHTTPFailure, daemon_request

    try:
        return daemon_request(base, "GET", path, timeout=5.0, token=token)
    except DaemonHTTPFailure as exc:
        raise DeployError(exc.message) from None
