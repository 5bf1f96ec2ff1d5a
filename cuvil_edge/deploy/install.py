"""Install the daemon's systemd unit on a device and enable it, as ``systemctl enable`` would.

The unit goes to ``<root>/etc/systemd/system/cuvil-edged.service`` (written through a temp file
and a rename) and is enabled with a symlink in ``<root>/etc/systemd/system/<target>.wants/`` for
each ``WantedBy=`` target of its ``[Install]`` section. Where the board has a ``jtop`` group
(jetson-stats installed), a drop-in ``cuvil-edged.service.d/jtop.conf`` adds it to the unit's
groups so the daemon may open jtop's socket (root:jtop 0660); elsewhere no drop-in, since a
missing group would fail the unit. ``systemctl daemon-reload`` (and a start
or restart) runs only where systemd is running on the device (``/run/systemd/system`` exists and
the device root is ``/``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from cuvil_edge.deploy.transport import DeviceAddress, Unreachable
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.deploy.transports import open_transport
from cuvil_edge.errors import DeployError

__all__ = ["InstallResult", "default_unit", "install_daemon", "wanted_by"]

UNIT_NAME = "cuvil-edged.service"


@dataclass
class InstallResult:
    device: str
    status: str  # installed | unchanged | unreachable | failed
    unit_path: str = ""
    enabled: list[str] = field(default_factory=list)
    systemd_running: bool = False
    reason: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("installed", "unchanged")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_unit() -> bytes:
    """The unit shipped with the package (``cuvil_edge/daemon/units/cuvil-edged.service``)."""
    res = resources.files("cuvil_edge").joinpath("daemon/units").joinpath(UNIT_NAME)
    try:
        return res.read_bytes()
    except (FileNotFoundError, OSError):
        raise DeployError(f"the package has no daemon unit ({UNIT_NAME}); pass --unit FILE") from None


def wanted_by(unit: bytes) -> list[str]:
    """Targets named by ``WantedBy=`` in the unit's ``[Install]`` section."""
    section = ""
    targets: list[str] = []
    for raw in unit.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Install" and line.startswith("WantedBy="):
            targets += line.split("=", 1)[1].split()
    return targets


async def install_daemon(address: DeviceAddress, unit: bytes | None = None, start: bool = True,
                         connect_timeout: float = 15.0) -> InstallResult:
    """Put the unit on the device and enable it; start it where systemd runs.

    Args:
        address (DeviceAddress): the device.
        unit (bytes): unit file contents. Defaults to the packaged unit.
        start (bool): after enabling, restart the service where systemd runs. Defaults to True.
        connect_timeout (float): SSH connect timeout, seconds. Defaults to 15.
    """
    unit = unit if unit is not None else default_unit()
    targets = wanted_by(unit)
    if not targets:
        raise DeployError(f"{UNIT_NAME}: no WantedBy= in its [Install] section; it cannot be enabled")
    res = InstallResult(device=address.label, status="failed")
    t0 = time.monotonic()
    try:
        async with open_transport(address, connect_timeout) as tr:
            unit_dir = address.sys_path("etc/systemd/system")
            dest = os.path.join(unit_dir, UNIT_NAME)
            res.unit_path = dest
            same = await tr.read_bytes(dest) == unit
            await tr.makedirs(unit_dir)
            if not same:
                await tr.write_bytes_atomic(dest, unit)
            changed = not same
            for target in targets:
                wants = os.path.join(unit_dir, f"{target}.wants")
                await tr.makedirs(wants)
                link = os.path.join(wants, UNIT_NAME)
                # The link names the unit as the running system sees it, whatever the root.
                want = f"/etc/systemd/system/{UNIT_NAME}"
                if await tr.readlink(link) != want:
                    await tr.remove(link + ".new")
                    await tr.symlink(want, link + ".new")
                    await tr.rename(link + ".new", link)
                    changed = True
                res.enabled.append(target)
            changed |= await _jtop_dropin(tr, address, unit_dir)
            res.systemd_running = address.root in ("", "/") and await tr.exists("/run/systemd/system")
            if res.systemd_running:
                for argv in (["systemctl", "daemon-reload"],
                             ["systemctl", "restart", UNIT_NAME] if start else None):
                    if argv is None:
                        continue
                    out = await tr.run(argv)
                    if out.exit_status != 0:
                        raise DeployError(f"{address.label}: {' '.join(argv)} failed: {out.stderr.strip()[:300]}")
            res.status = "installed" if changed else "unchanged"
    except Unreachable as exc:
        res.status, res.reason = "unreachable", str(exc)
    except DeployError as exc:
        res.status, res.reason = "failed", str(exc)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


JTOP_DROPIN = "[Service]\n# jtop's socket /run/jtop.sock is root:jtop 0660 (jetson-stats); this board has the group.\n" \
              "SupplementaryGroups=jtop\n"


def has_group(group_file: bytes | None, name: str) -> bool:
    """Whether an ``/etc/group`` text names group ``name``."""
    return any(line.split(":", 1)[0] == name for line in (group_file or b"").decode("utf-8", "replace").splitlines())


async def _jtop_dropin(tr: Transport, address: DeviceAddress, unit_dir: str) -> bool:
    """Write ``cuvil-edged.service.d/jtop.conf`` adding the ``jtop`` group where that group exists,
    remove it where it does not (``SupplementaryGroups=`` with a missing group fails the unit); True
    when something changed."""
    dropin_dir = os.path.join(unit_dir, f"{UNIT_NAME}.d")
    dest = os.path.join(dropin_dir, "jtop.conf")
    present = await tr.read_bytes(dest)
    if has_group(await tr.read_bytes(address.sys_path("etc/group")), "jtop"):
        if present == JTOP_DROPIN.encode():
            return False
        await tr.makedirs(dropin_dir)
        await tr.write_bytes_atomic(dest, JTOP_DROPIN.encode())
        return True
    if present is not None:
        await tr.remove(dest)
        return True
    return False


def read_unit(path: Path | None) -> bytes:
    if path is None:
        return default_unit()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DeployError(f"--unit {path}: cannot read it ({exc.strerror})") from None
