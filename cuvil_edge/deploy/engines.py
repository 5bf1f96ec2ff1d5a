"""Engines for devices, from the host: build once per key on a device, upload to the rest.

:func:`ensure_engine` gives one device the engine of one bundle:

1. probe the device over SSH (module, L4T, TensorRT, SM of its board:
   :func:`~cuvil_edge.bundle.engine_store.device_identity`);
2. pick the bundle's build plan for it (TensorRT, SM, DLA core; the host verified the bundle
   first) and derive the engine key from both
   (:func:`~cuvil_edge.bundle.engine_store.key_for_facts`): the key names the module and the
   plan's digest, so the host cache never hands one module's engine (or timing cache) to another;
3. if the device's engine store already holds a verified engine for that key and model: nothing
   to do (``present``);
4. if the host cache (``~/.cache/cuvil-edge/engines``) holds one: upload plan, log and record,
   the device computes the plan's sha256 before the record is written (``uploaded``);
5. otherwise upload the plan and the model to a scratch directory in the device's store and run
   the device's ``cuvil-edge engine build --store`` there, streaming its log lines to
   ``on_line`` as they come. Cancelling (Ctrl-C) kills the build's process group on the device.
   The result is downloaded into the host cache, sha256-checked (``built``);
6. ask the daemon to reload the model when it serves this bundle, so it picks the engine.

Counts of builds and bytes each way are in the :class:`EngineOutcome` (the bench sums them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.bundle.engine_key import EngineKey
from cuvil_edge.bundle.engine_plan import validate_plan
from cuvil_edge.bundle.engine_store import (
    DeviceIdentity,
    EngineError,
    EngineRecord,
    EngineStore,
    device_identity,
    host_engine_cache,
    key_for_facts,
    plan_matches_device,
    sha256_bytes,
)
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.deploy._asyncssh import asyncssh
from cuvil_edge.deploy.transport import DeviceAddress
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.deploy.transports import open_transport
from cuvil_edge.errors import DeployError

__all__ = ["BundleEngineSource", "EngineOutcome", "choose_plan", "ensure_engine", "ensure_engines"]

_RECORD_PREFIX = "CUVIL-ENGINE-RECORD "
_PGID = re.compile(r"engine build: pid (\d+) pgid (\d+)")
_GIB = 1 << 30

LineSink = Callable[[str, str], None]  # (device label, line)


@dataclass
class EngineOutcome:
    """What happened for one device."""

    device: str
    status: str = "failed"  # built | uploaded | present | failed | cancelled
    key: str = ""
    model_sha256: str = ""
    plan_sha256: str = ""
    builder: str = ""
    builds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    reloaded: bool = False
    reason: str = ""
    log_lines: int = 0

    @property
    def ok(self) -> bool:
        return self.status in ("built", "uploaded", "present")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BundleEngineSource:
    """What the host needs from a verified bundle: name, version, model bytes and build plans."""

    name: str
    version: str
    model: bytes
    plans: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_bundle(cls, path: Path, public_key: Path | None) -> BundleEngineSource:
        """Verify the bundle (signature when a key is given, every checksum) and read its plans."""
        from cuvil_edge.bundle import verify_bundle
        from cuvil_edge.bundle.container import iter_member_bytes

        manifest = verify_bundle(Path(path), public_key)
        wanted = {str(p.get("path")) for p in manifest.build_plans} | {manifest.model}
        members = dict(iter_member_bytes(Path(path), wanted))
        if manifest.model not in members:
            raise DeployError(f"{path}: the bundle has no {manifest.model}")
        plans = []
        for entry in manifest.build_plans:
            raw = members.get(str(entry.get("path")))
            if raw is None:
                raise DeployError(f"{path}: build plan {entry.get('path')} is listed but missing")
            plans.append(validate_plan(json.loads(raw), f"{path}:{entry.get('path')}"))
        if not plans:
            raise DeployError(f"{path}: bundle {manifest.name} {manifest.version} has no engine build plans "
                              f"(target format {manifest.format_kind}); package it for a Jetson target")
        return cls(manifest.name, manifest.version, members[manifest.model], plans)


def choose_plan(plans: Sequence[dict[str, Any]], device: DeviceIdentity, dla_core: int | None = None,
                label: str = "device") -> dict[str, Any]:
    """The plan for a device (TensorRT major.minor, SM, DLA core); DeployError naming what the bundle has otherwise."""
    for plan in plans:
        if plan_matches_device(plan, device, dla_core):
            return plan
    have = ", ".join(sorted({f"TensorRT {p['engine_key']['tensorrt']} SM {p['engine_key']['sm']} DLA "
                             f"{p['engine_key'].get('dla_core')}" for p in plans})) or "none"
    raise DeployError(f"{label}: the bundle has no build plan for this device ({device.module}, TensorRT "
                      f"{device.tensorrt}, SM {device.sm}, DLA {dla_core}; it has {have}); package for the "
                      "device's JetPack release")


async def ensure_engine(
    address: DeviceAddress,
    source: BundleEngineSource,
    *,
    cache: EngineStore | None = None,
    device_cli: Sequence[str] = ("cuvil-edge",),
    builder: str | None = None,
    dla_core: int | None = None,
    rebuild: bool = False,
    reload: bool = True,
    on_line: LineSink | None = None,
    connect_timeout: float = 15.0,
    build_timeout: float = 3600.0,
    daemon_token: str | None = None,
    key_locks: dict[str, asyncio.Lock] | None = None,
) -> EngineOutcome:
    """Give one device the bundle's engine for its key (see the module docstring).

    Args:
        address (DeviceAddress): the device.
        source (BundleEngineSource): the verified bundle's model and plans.
        cache (EngineStore | None): host engine cache. Defaults to :func:`host_engine_cache`.
        device_cli (Sequence[str]): how to run ``cuvil-edge`` on the device. Defaults to ``cuvil-edge``.
        builder (str | None): ``tensorrt`` or ``standin`` on the device. Defaults to the device's
            default (TensorRT).
        dla_core (int | None): build for this DLA core. Defaults to the GPU.
        rebuild (bool): build on the device even when an engine is cached. Defaults to False.
        reload (bool): ask the daemon to reload the model afterwards. Defaults to True.
        on_line (LineSink | None): receives ``(device, line)`` for every builder log line.
        connect_timeout (float): SSH connect timeout, seconds. Defaults to 15.
        build_timeout (float): seconds the device build may take. Defaults to an hour.
        daemon_token (str | None): the daemon's bearer token. Defaults to None.
        key_locks (dict[str, asyncio.Lock] | None): one lock per engine key, shared by the devices
            handled at once, so two devices of a key never both build. Defaults to a private dict.
    """
    cache = cache or host_engine_cache()
    out = EngineOutcome(device=address.label)
    t0 = time.monotonic()
    try:
        async with open_transport(address, connect_timeout) as tr:
            await _ensure(tr, source, cache, list(device_cli), builder, dla_core, rebuild, on_line, build_timeout,
                          out, key_locks if key_locks is not None else {})
            if reload and out.ok:
                out.reloaded = await _reload(tr, source, daemon_token)
    except asyncio.CancelledError:
        out.status, out.reason = "cancelled", "stopped by the user; the device build was killed"
        out.seconds = time.monotonic() - t0
        raise
    except (DeployError, EngineError) as exc:
        out.status, out.reason = "failed", str(exc)
    out.seconds = round(time.monotonic() - t0, 3)
    return out


async def ensure_engines(addresses: Sequence[DeviceAddress], source: BundleEngineSource, concurrency: int = 8,
                         **kwargs: Any) -> list[EngineOutcome]:
    """:func:`ensure_engine` on every device, ``concurrency`` at a time; results in device order.

    The first device of each key builds while the others of that key wait for it (one lock per
    key), then they get the cached engine, in parallel.
    """
    sem = asyncio.Semaphore(max(1, concurrency))
    locks: dict[str, asyncio.Lock] = kwargs.pop("key_locks", None) or {}

    async def one(address: DeviceAddress) -> EngineOutcome:
        async with sem:
            return await ensure_engine(address, source, key_locks=locks, **kwargs)

    return list(await asyncio.gather(*(one(a) for a in addresses)))


async def _ensure(tr: Transport, source: BundleEngineSource, cache: EngineStore, device_cli: list[str],
                  builder: str | None, dla_core: int | None, rebuild: bool, on_line: LineSink | None,
                  build_timeout: float, out: EngineOutcome, key_locks: dict[str, asyncio.Lock]) -> None:
    from cuvil_edge.deploy.probe import probe_device

    label = tr.address.label
    facts = await probe_device(tr)
    try:
        device = device_identity(facts)
    except EngineError as exc:
        raise DeployError(f"{label}: {exc}") from None
    plan = choose_plan(source.plans, device, dla_core, label)
    key = key_for_facts(facts, plan)
    model_sha = str(plan["model"]["sha256"])
    if sha256_bytes(source.model) != model_sha:
        raise DeployError(f"{label}: the bundle's model does not hash to its plan's model sha256; repackage")
    out.key, out.model_sha256 = key.slug, model_sha
    remote = EngineStore(Path(StoreLayout(tr.address.store_root, DeployError).engines_dir))
    if not rebuild:
        rec = await _remote_verified(tr, remote, key, model_sha)
        if rec is not None:
            out.status, out.plan_sha256, out.builder = "present", rec.plan_sha256, rec.builder
            return
    lock = key_locks.setdefault(f"{key.slug}/{model_sha}", asyncio.Lock())
    async with lock:  # a twin of this key building now fills the cache for us
        rec = None
        if not rebuild:
            try:
                rec = cache.verify(key, model_sha)
            except EngineError:
                rec = None
        if rec is None:
            await _build_and_fetch(tr, source, plan, key, remote, cache, device_cli, builder, on_line,
                                   build_timeout, out)
            return
    await _upload(tr, cache, remote, rec, out)
    out.status, out.plan_sha256, out.builder = "uploaded", rec.plan_sha256, rec.builder


async def _build_and_fetch(tr: Transport, source: BundleEngineSource, plan: dict[str, Any], key: EngineKey,
                           remote: EngineStore, cache: EngineStore, device_cli: list[str], builder: str | None,
                           on_line: LineSink | None, build_timeout: float, out: EngineOutcome) -> None:
    """Build on the device, then download plan, log and timing cache into the host cache."""
    label = tr.address.label
    model_sha = str(plan["model"]["sha256"])
    rec = await _build(tr, source, plan, key, remote, device_cli, builder, on_line, build_timeout, out)
    plan_bytes = await tr.read_bytes(str(remote.plan_path(key, model_sha)), limit=4 * _GIB) or b""
    log = await tr.read_bytes(str(remote.log_path(key, model_sha))) or b""
    timing = await tr.read_bytes(str(remote.timing_cache_path(key)), limit=1 << 30)
    out.bytes_received += len(plan_bytes) + len(log) + len(timing or b"")
    try:
        cache.put(rec, plan_bytes, log, timing)  # refuses bytes that do not match the record
    except EngineError as exc:
        raise DeployError(f"{label}: downloaded engine does not match its record ({exc})") from None
    out.status, out.plan_sha256, out.builder, out.builds = "built", rec.plan_sha256, rec.builder, 1


async def _remote_verified(tr: Transport, remote: EngineStore, key: EngineKey, model_sha: str
                           ) -> EngineRecord | None:
    """The device's record for key + model when its plan hashes (on the device) to the record's."""
    raw = await tr.read_bytes(str(remote.record_path(key, model_sha)), 1 << 20)
    if not raw:
        return None
    try:
        rec = EngineRecord.from_dict(json.loads(raw), f"{tr.address.label}:{remote.record_path(key, model_sha)}")
    except (ValueError, EngineError):
        return None
    if rec.key != key or rec.model_sha256 != model_sha:
        return None
    plan_path = str(remote.plan_path(key, model_sha))
    if not await tr.exists(plan_path):
        return None
    return rec if await tr.sha256(plan_path) == rec.plan_sha256 else None


async def _upload(tr: Transport, cache: EngineStore, remote: EngineStore, rec: EngineRecord,
                  out: EngineOutcome) -> None:
    """Cached engine -> device: plan, log, timing cache, then (sha256 checked there) the record."""
    key, sha = rec.key, rec.model_sha256
    await tr.makedirs(str(remote.key_dir(key)))
    rec_path = str(remote.record_path(key, sha))
    await tr.remove(rec_path)
    plan = cache.plan_path(key, sha).read_bytes()
    files = [(remote.plan_path(key, sha), plan)]
    log = cache.log_path(key, sha)
    if log.is_file():
        files.append((remote.log_path(key, sha), log.read_bytes()))
    timing = cache.timing_cache_path(key)
    if timing.is_file():
        files.append((remote.timing_cache_path(key), timing.read_bytes()))
    for path, data in files:
        await tr.write_bytes_atomic(str(path), data)
        out.bytes_sent += len(data)
    got = await tr.sha256(str(remote.plan_path(key, sha)))
    if got != rec.plan_sha256:
        await tr.remove(str(remote.plan_path(key, sha)))
        raise DeployError(f"{tr.address.label}: uploaded engine hashes to {got[:12]}... on the device, not "
                          f"{rec.plan_sha256[:12]}...; removed")
    record = (json.dumps(rec.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    await tr.write_bytes_atomic(rec_path, record)
    out.bytes_sent += len(record)


async def _build(tr: Transport, source: BundleEngineSource, plan: dict[str, Any], key: EngineKey,
                 remote: EngineStore, device_cli: list[str], builder: str | None, on_line: LineSink | None,
                 build_timeout: float, out: EngineOutcome) -> EngineRecord:
    label = tr.address.label
    model_sha = str(plan["model"]["sha256"])
    work = f"{remote.root}/.upload/{model_sha[:16]}-{key.slug}"
    r_plan, r_onnx = f"{work}/plan.json", f"{work}/model.onnx"
    await tr.makedirs(work)
    pgid: int | None = None
    try:
        plan_bytes = json.dumps(plan, indent=2).encode()
        await tr.write_bytes_atomic(r_plan, plan_bytes)
        await tr.write_bytes_atomic(r_onnx, source.model)
        out.bytes_sent += len(plan_bytes) + len(source.model)
        argv = [*device_cli, "engine", "build", "--plan", r_plan, "--onnx", r_onnx,
                "--store", tr.address.store_root, "--root", tr.address.root]
        if builder:
            argv += ["--builder", builder]
        record: EngineRecord | None = None
        tail: list[str] = []
        try:
            async with await tr.process(argv, merge_stderr=True) as proc:
                async def pump() -> None:
                    nonlocal pgid, record
                    async for raw in proc.stdout:
                        line = str(raw).rstrip("\n")
                        m = _PGID.search(line)
                        if m and pgid is None:
                            pgid = int(m.group(2))
                        if line.startswith(_RECORD_PREFIX):
                            record = EngineRecord.from_dict(json.loads(line[len(_RECORD_PREFIX):]),
                                                            f"{label}: build output")
                            continue
                        out.log_lines += 1
                        tail.append(line)
                        del tail[:-5]
                        if on_line is not None:
                            on_line(label, line)
                    await proc.wait()

                # Stop the device build before the channel closes: closing it alone leaves the build
                # running until its next log line meets a closed pipe.
                try:
                    await asyncio.wait_for(pump(), timeout=build_timeout)
                except asyncio.CancelledError:
                    await asyncio.shield(_kill_group(tr, pgid))
                    raise
                except asyncio.TimeoutError:
                    await _kill_group(tr, pgid)
                    raise DeployError(f"{label}: engine build ran past {build_timeout:.0f} s; stopped") from None
                status = proc.exit_status
        except (OSError, asyncssh.Error) as exc:
            raise DeployError(f"{label}: engine build: {exc}") from exc
        if status != 0 or record is None:
            why = next((ln for ln in reversed(tail) if ln.strip()), f"exit status {status}")
            raise DeployError(f"{label}: engine build failed: {why}")
        if record.key != key or record.model_sha256 != model_sha:
            raise DeployError(f"{label}: the device built for {record.key.slug}, expected {key.slug}")
        return record
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(tr.rmtree(work))


async def _kill_group(tr: Transport, pgid: int | None) -> None:
    """Stop the device build: SIGTERM to its process group (the CLI and the builder it runs)."""
    if pgid is None or pgid <= 1:
        return
    with contextlib.suppress(Exception):
        await tr.run(["kill", "-TERM", "--", f"-{pgid}"], timeout=15)


async def _reload(tr: Transport, source: BundleEngineSource, token: str | None) -> bool:
    """Ask the daemon to reload the model when the device serves this bundle (picks the engine up)."""
    from cuvil_edge.deploy.health import daemon_load
    from cuvil_edge.deploy.layout import DeviceStore

    store = DeviceStore(tr)
    if await store.current(source.name) != source.version:
        return False
    async with tr.forward_local(tr.address.daemon_port) as port:
        try:
            err = await asyncio.to_thread(daemon_load, f"http://127.0.0.1:{port}", source.name, 120.0, token)
        except Exception:  # noqa: BLE001 - a daemon that is down loads the engine when it starts
            return False
    return err is None
