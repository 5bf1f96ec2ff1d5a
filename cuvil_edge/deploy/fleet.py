"""Fleet rollout: a canary first, then batches with bounded concurrency and a failure-share stop.

Order of work:

1. **Canary.** Devices are tried one at a time, in inventory order, until ``canary`` of them
   are serving the bundle. An unreachable device does not count: the next device becomes the
   canary. A canary that is refused, fails or rolls back stops the rollout; the rest are skipped.
2. **Batches** of ``batch_size`` devices, at most ``concurrency`` at once. When more than
   ``max_fail_share`` of a batch failed (unreachable devices count as failed), the following
   batches are skipped.

A failing device never stops the others of its batch. Running the same rollout again finishes
only what is left: a device already serving the bundle (same signed manifest, health gate
passed) answers ``unchanged`` without a byte sent.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge._atomic import atomic_write_text
from cuvil_edge._device_options import DeviceSelection
from cuvil_edge._toml import loads_toml
from cuvil_edge.deploy.device import DeployOptions, DeviceResult, PreparedBundle, Progress, deploy_device
from cuvil_edge.deploy.transport import DeviceAddress, parse_address
from cuvil_edge.errors import DeployError

__all__ = ["FleetReport", "RolloutPolicy", "load_inventory", "rollout", "select_devices"]


@dataclass
class RolloutPolicy:
    """How a rollout proceeds.

    Args:
        concurrency (int): devices deployed at once. Defaults to 8.
        canary (int): devices that must succeed, one at a time, before the rest. Defaults to 1.
        batch_size (int): devices per batch after the canary. Defaults to ``concurrency``.
        max_fail_share (float): stop after a batch in which more than this share failed.
            Defaults to 0.25.
    """

    concurrency: int = 8
    canary: int = 1
    batch_size: int | None = None
    max_fail_share: float = 0.25

    def check(self) -> None:
        if self.concurrency < 1:
            raise DeployError(f"--concurrency {self.concurrency}: use 1 or more")
        if self.canary < 0:
            raise DeployError(f"--canary {self.canary}: use 0 or more")
        if self.batch_size is not None and self.batch_size < 1:
            raise DeployError(f"--batch-size {self.batch_size}: use 1 or more")
        if not 0.0 <= self.max_fail_share <= 1.0:
            raise DeployError(f"--max-fail-share {self.max_fail_share}: use a share between 0 and 1")


@dataclass
class FleetReport:
    """Per-device results of a rollout, plus why it stopped (if it did)."""

    bundle: dict[str, Any]
    policy: dict[str, Any]
    results: list[DeviceResult] = field(default_factory=list)
    stopped: str = ""
    started: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "policy": self.policy,
            "started": self.started,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "stopped": self.stopped,
            "counts": self.counts(),
            "devices": [r.to_dict() for r in self.results],
        }

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")


async def rollout(
    bundle: PreparedBundle,
    devices: list[DeviceAddress],
    options: DeployOptions | None = None,
    policy: RolloutPolicy | None = None,
    progress: Progress | None = None,
    on_result: Callable[[DeviceResult], None] | None = None,
) -> FleetReport:
    """Deploy ``bundle`` to ``devices`` under ``policy``; returns the report (never raises per device)."""
    options = options or DeployOptions()
    policy = policy or RolloutPolicy()
    policy.check()
    labels = [d.label for d in devices]
    if len(set(labels)) != len(labels):
        dup = sorted({x for x in labels if labels.count(x) > 1})
        raise DeployError(f"device listed twice: {', '.join(dup)}; give each device one entry")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    report = FleetReport(
        bundle={"path": str(bundle.path), "name": bundle.name, "version": bundle.version,
                "sha256": bundle.sha256, "size": bundle.size},
        policy={"concurrency": policy.concurrency, "canary": policy.canary,
                "batch_size": policy.batch_size or policy.concurrency, "max_fail_share": policy.max_fail_share},
        started=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    by_label: dict[str, DeviceResult] = {}

    def done(r: DeviceResult) -> None:
        by_label[r.device] = r
        if on_result:
            on_result(r)

    queue = list(devices)
    canaries = 0
    while queue and canaries < policy.canary:
        dev = queue.pop(0)
        r = await deploy_device(bundle, dev, options, progress)
        r.notes.insert(0, "canary")
        done(r)
        if r.ok:
            canaries += 1
        elif r.status != "unreachable":
            report.stopped = f"canary {r.device} {r.status}: {r.reason}"
            break
    sem = asyncio.Semaphore(policy.concurrency)

    async def one(dev: DeviceAddress) -> DeviceResult:
        async with sem:
            return await deploy_device(bundle, dev, options, progress)

    size = policy.batch_size or policy.concurrency
    batch_no = 0
    while queue and not report.stopped:
        batch, queue = queue[:size], queue[size:]
        batch_no += 1
        tasks = [asyncio.ensure_future(one(d)) for d in batch]
        for fut in asyncio.as_completed(tasks):
            done(await fut)
        failed = [d.label for d in batch if not by_label[d.label].ok]
        if len(failed) > policy.max_fail_share * len(batch):
            report.stopped = (f"batch {batch_no}: {len(failed)} of {len(batch)} devices failed "
                              f"({', '.join(failed)}), more than the allowed share {policy.max_fail_share:g}")
    for dev in queue:
        done(DeviceResult(device=dev.label, status="skipped", version=bundle.version,
                          reason=f"rollout stopped: {report.stopped}"))
    report.results = [by_label[d.label] for d in devices]
    report.seconds = loop.time() - t0
    return report


def select_devices(selection: DeviceSelection) -> list[DeviceAddress]:
    """The devices a command's device options name: the inventory's, then each ``--to``.

    Raises:
        DeployError: no device named, or an address or inventory that does not parse.
    """
    common: dict[str, Any] = {
        "identity": str(selection.identity.expanduser()) if selection.identity else None,
        "known_hosts": "" if selection.no_host_key_check else (
            str(selection.known_hosts.expanduser()) if selection.known_hosts else None),
        "root": selection.root,
        "store": selection.store,
        "daemon_port": selection.daemon_port,
        "python": selection.device_python,
    }
    devices = []
    if selection.inventory is not None:
        devices += load_inventory(selection.inventory, **common)
    given = {k: v for k, v in common.items() if v is not None}
    for text in selection.to:
        devices.append(parse_address(text, **given))
    if not devices:
        raise DeployError("no devices: pass --to [user@]host[:port] or --inventory FILE")
    return devices


def load_inventory(path: Path, **defaults: Any) -> list[DeviceAddress]:
    """Devices from a TOML inventory.

    Format::

        [defaults]              # optional; any device field
        user = "root"
        identity = "~/.ssh/fleet_ed25519"
        known_hosts = "~/.ssh/known_hosts"
        store = "/var/lib/cuvil-edge"
        daemon_port = 8000

        [[device]]
        address = "root@10.0.0.5:22"   # or host = "...", port = 22, user = "..."
        name = "orin-01"                # optional label
        root = "/"                      # optional per-device field
        python = "/opt/cuvil/bin/python" # the device Python that has cuvil_edge (default python3)

    Args:
        path (Path): the inventory file.
        **defaults: fields that apply where the file sets none (command-line options).
    """
    try:
        data = loads_toml(Path(path).read_text())
    except FileNotFoundError:
        raise DeployError(f"--inventory {path}: no such file") from None
    except Exception as exc:
        raise DeployError(f"--inventory {path}: not valid TOML ({exc})") from None
    base = {k: v for k, v in defaults.items() if v is not None}
    base.update(data.get("defaults") or {})
    devices = data.get("device") or data.get("devices") or []
    if not isinstance(devices, list) or not devices:
        raise DeployError(f"--inventory {path}: no [[device]] entries")
    allowed = {"name", "root", "store", "daemon_port", "identity", "known_hosts", "user", "port", "python"}
    out = []
    for i, entry in enumerate(devices):
        if not isinstance(entry, dict):
            raise DeployError(f"--inventory {path}: device[{i}] must be a table")
        fields = dict(base)
        fields.update(entry)
        text = fields.pop("address", None) or fields.pop("host", None)
        if not text:
            raise DeployError(f"--inventory {path}: device[{i}] needs 'address' or 'host'")
        unknown = set(fields) - allowed
        if unknown:
            raise DeployError(f"--inventory {path}: device[{i}] has unknown field(s) {', '.join(sorted(unknown))}")
        for key in ("identity", "known_hosts"):
            if fields.get(key):
                fields[key] = str(Path(str(fields[key])).expanduser())
        out.append(parse_address(str(text), **fields))
    return out
