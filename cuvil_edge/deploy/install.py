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
import posixpath
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from cuvil_edge.deploy.transport import DeviceAddress, Unreachable
from cuvil_edge.deploy.transport_base import CommandResult, Transport
from cuvil_edge.deploy.transports import open_transport
from cuvil_edge.errors import DeployError

__all__ = ["DEFAULT_VENV", "InstallResult", "SudoNeedsPassword", "default_unit", "exec_start", "install_daemon",
           "sudo_message", "wanted_by", "with_exec_start"]

UNIT_NAME = "cuvil-edged.service"
DEFAULT_VENV = "/opt/cuvil-edge/venv"
CUDA_ROOT = "/usr/local/cuda"  # where JetPack installs CUDA


@dataclass
class InstallResult:
    device: str
    status: str  # installed | unchanged | unreachable | failed
    unit_path: str = ""
    enabled: list[str] = field(default_factory=list)
    systemd_running: bool = False
    sudo: bool = False
    venv: str = ""
    exec_start: str = ""
    tensorrt: str = ""
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


class SudoNeedsPassword(DeployError):
    """The login user is not root and ``sudo -n`` asks for a password."""


class _Privileged:
    """Root's file and command operations on the device: directly when the login user is root,
    through ``sudo -n`` otherwise (files staged in a private temp folder, then ``install``-ed)."""

    def __init__(self, tr: Transport, sudo: bool) -> None:
        self.tr, self.sudo = tr, sudo
        self._stage: str | None = None

    @classmethod
    async def open(cls, tr: Transport) -> _Privileged:
        res = await tr.run(["id", "-u"])
        if res.exit_status != 0:
            raise DeployError(f"{tr.address.label}: id -u failed: {res.stderr.strip()[:200]}")
        if res.stdout.strip() == "0":
            return cls(tr, False)
        check = await tr.run(["sudo", "-n", "true"])
        if check.exit_status != 0:
            raise SudoNeedsPassword(sudo_message(tr.address.label, check.stderr))
        return cls(tr, True)

    async def run(self, argv: list[str], timeout: float = 600.0) -> CommandResult:
        return await self.tr.run(["sudo", "-n", "--", *argv] if self.sudo else argv, timeout=timeout)

    async def check(self, argv: list[str], timeout: float = 600.0) -> CommandResult:
        res = await self.run(argv, timeout)
        if res.exit_status != 0:
            raise DeployError(f"{self.tr.address.label}: {' '.join(argv)} failed: "
                              f"{(res.stderr or res.stdout).strip()[-300:]}")
        return res

    async def makedirs(self, path: str) -> None:
        if self.sudo:
            await self.check(["mkdir", "-p", path])
        else:
            await self.tr.makedirs(path)

    async def write(self, path: str, data: bytes, mode: str = "0644") -> None:
        if not self.sudo:
            await self.tr.write_bytes_atomic(path, data)
            return
        if self._stage is None:
            res = await self.tr.run(["mktemp", "-d", "/tmp/cuvil-edge-install.XXXXXX"])
            if res.exit_status != 0:
                raise DeployError(f"{self.tr.address.label}: mktemp failed: {res.stderr.strip()[:200]}")
            self._stage = res.stdout.strip()
        staged = f"{self._stage}/{os.path.basename(path)}"
        await self.tr.write_bytes_atomic(staged, data)
        # install writes a new file and renames it into place: never a half-written unit.
        await self.check(["install", "-D", "-m", mode, "-o", "root", "-g", "root", staged, path])

    async def symlink(self, target: str, link: str) -> None:
        if self.sudo:
            await self.check(["ln", "-sfn", target, link])
        else:
            await self.tr.remove(link + ".new")
            await self.tr.symlink(target, link + ".new")
            await self.tr.rename(link + ".new", link)

    async def remove(self, path: str) -> None:
        if self.sudo:
            await self.check(["rm", "-f", path])
        else:
            await self.tr.remove(path)

    async def close(self) -> None:
        if self._stage is not None:
            await self.tr.run(["rm", "-rf", self._stage])
            self._stage = None


def sudo_message(label: str, stderr: str) -> str:
    """One line for a ``sudo -n`` refusal: a password is needed, or the user may not use sudo."""
    text = " ".join(stderr.split())
    if "password" in text.lower():
        return (f"{label}: sudo needs a password for this user; connect as root, or allow it without one "
                "(a sudoers rule with NOPASSWD), or run 'sudo -v' on the board first")
    return f"{label}: the login user is not root and cannot use sudo ({text[:200] or 'sudo -n true failed'})"


def with_exec_start(unit: bytes, executable: str) -> bytes:
    """The unit with ``ExecStart=`` running ``executable`` (same arguments), and the root
    ``ExecStartPre=`` step (``cuvil-edge-device recover``) from the same ``bin`` directory, so a
    venv install reverts and recovers with its own code (docs/deploy.md, "Who owns the store")."""
    device_tool = posixpath.join(posixpath.dirname(executable), "cuvil-edge-device")
    out = []
    for line in unit.decode("utf-8").splitlines(keepends=True):
        if line.startswith("ExecStart="):
            args = line[len("ExecStart="):].split(None, 1)
            rest = " " + args[1] if len(args) > 1 else "\n"
            line = f"ExecStart={executable}{rest}"
        elif line.startswith("ExecStartPre=") and "/cuvil-edge-device" in line:
            head, _, tail = line[len("ExecStartPre="):].partition("/")
            args = ("/" + tail).split(None, 1)
            rest = " " + args[1] if len(args) > 1 else "\n"
            line = f"ExecStartPre={head}{device_tool}{rest}"
        out.append(line)
    return "".join(out).encode("utf-8")


def exec_start(unit: bytes) -> str:
    """The executable of the unit's ``ExecStart=``."""
    for line in unit.decode("utf-8", "replace").splitlines():
        if line.startswith("ExecStart="):
            parts = line[len("ExecStart="):].split()
            return parts[0].lstrip("-@+!:") if parts else ""
    return ""


async def _install_venv(tr: Transport, priv: _Privileged, address: DeviceAddress, wheels: Path, venv: str,
                        no_deps: bool) -> None:
    """Copy the host's wheels to the board and install them, offline, into ``venv``.

    The venv sees the system site-packages: JetPack's TensorRT (``python3-libnvinfer``) lives
    there and is not on PyPI for Tegra. ``--without-pip`` plus the system's pip works where
    ``python3-venv``'s ensurepip is not installed.
    """
    files = sorted(Path(wheels).glob("*.whl"))
    if not any(f.name.startswith("cuvil_edge-") for f in files):
        raise DeployError(f"--wheels {wheels}: no cuvil_edge-*.whl there (build one: pip wheel --no-deps -w DIR .)")
    res = await tr.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    if res.exit_status != 0:
        raise DeployError(f"{address.label}: no python3 on the board ({res.stderr.strip()[:200]})")
    version = res.stdout.strip()
    if tuple(int(p) for p in version.split(".")) < (3, 10):
        raise DeployError(f"{address.label}: the board's Python is {version}; cuvil-edge needs 3.10 or later "
                          "(JetPack 5 boards are package-only)")
    where = address.sys_path(venv.lstrip("/"))
    stage = f"{where}.wheels"
    await priv.makedirs(stage)
    for f in files:
        await priv.write(f"{stage}/{f.name}", f.read_bytes())
    made = await priv.run(["python3", "-m", "venv", "--system-site-packages", where])
    if made.exit_status != 0:
        await priv.check(["python3", "-m", "venv", "--system-site-packages", "--without-pip", where])
    # pycuda (the jetson extra) builds from source on the board and finds CUDA by CUDA_ROOT: JetPack
    # leaves nvcc off PATH, and sudo resets PATH anyway.
    pip = ["env", f"CUDA_ROOT={CUDA_ROOT}", f"{where}/bin/python", "-m", "pip", "install", "-q", "--no-index",
           "--find-links", stage,
           "--upgrade", "--force-reinstall", "--no-compile"]
    await priv.check([*pip, *(["--no-deps"] if no_deps else []), "cuvil-edge"], timeout=1800)
    await priv.check(["rm", "-rf", "--", stage])


async def install_daemon(address: DeviceAddress, unit: bytes | None = None, start: bool = True,
                         connect_timeout: float = 15.0, wheels: Path | None = None,
                         venv: str = DEFAULT_VENV, no_deps: bool = False) -> InstallResult:
    """Put the unit on the device and enable it; start it where systemd runs.

    Works as root or as a login user with sudo (``sudo -n``; a user whose sudo asks for a password
    gets one line saying so).

    Args:
        address (DeviceAddress): the device.
        unit (bytes): unit file contents. Defaults to the packaged unit.
        start (bool): after enabling, restart the service where systemd runs. Defaults to True.
        connect_timeout (float): SSH connect timeout, seconds. Defaults to 15.
        wheels (Path | None): a folder of wheels the host prepared for the board's Python and
            architecture (``cuvil_edge-*.whl`` and its dependencies): installed offline into
            ``venv`` (with ``--system-site-packages``, where JetPack's TensorRT is), and the unit
            runs that venv's ``cuvil-edged``. Defaults to None: the unit's ``ExecStart`` must
            already exist on the board.
        venv (str): the board's virtual environment. Defaults to ``/opt/cuvil-edge/venv``.
        no_deps (bool): install only the wheels' own packages (dependencies already on the
            board). Defaults to False.
    """
    unit = unit if unit is not None else default_unit()
    targets = wanted_by(unit)
    if not targets:
        raise DeployError(f"{UNIT_NAME}: no WantedBy= in its [Install] section; it cannot be enabled")
    res = InstallResult(device=address.label, status="failed")
    t0 = time.monotonic()
    try:
        async with open_transport(address, connect_timeout) as tr:
            priv = await _Privileged.open(tr)
            res.sudo = priv.sudo or tr.sudo  # the transport itself may already work as root through sudo
            try:
                changed = False
                if wheels is not None:
                    await _install_venv(tr, priv, address, Path(wheels), venv, no_deps)
                    unit = with_exec_start(unit, f"{venv}/bin/cuvil-edged")
                    res.venv, changed = venv, True
                res.exec_start = exec_start(unit)
                if not await tr.exists(address.sys_path(res.exec_start.lstrip("/"))):
                    raise DeployError(f"{address.label}: the unit runs {res.exec_start}, which is not on the board; "
                                      "install the project: cuvil-edge install-daemon --wheels DIR")
                unit_dir = address.sys_path("etc/systemd/system")
                dest = os.path.join(unit_dir, UNIT_NAME)
                res.unit_path = dest
                same = await tr.read_bytes(dest) == unit
                await priv.makedirs(unit_dir)
                if not same:
                    await priv.write(dest, unit)
                changed |= not same
                for target in targets:
                    wants = os.path.join(unit_dir, f"{target}.wants")
                    await priv.makedirs(wants)
                    link = os.path.join(wants, UNIT_NAME)
                    # The link names the unit as the running system sees it, whatever the root.
                    want = f"/etc/systemd/system/{UNIT_NAME}"
                    if await tr.readlink(link) != want:
                        await priv.symlink(want, link)
                        changed = True
                    res.enabled.append(target)
                changed |= await _jtop_dropin(tr, priv, address, unit_dir)
                res.systemd_running = address.root in ("", "/") and await tr.exists("/run/systemd/system")
                if res.systemd_running:
                    await priv.check(["systemctl", "daemon-reload"])
                    if start:
                        # Type=notify: restart returns once the daemon sent READY=1 (or failed).
                        await priv.check(["systemctl", "restart", UNIT_NAME], timeout=900)
                        active = await tr.run(["systemctl", "is-active", UNIT_NAME])
                        if active.stdout.strip() != "active":
                            raise DeployError(f"{address.label}: {UNIT_NAME} is {active.stdout.strip()} after "
                                              "restart (journalctl -u cuvil-edged)")
                py = os.path.join(os.path.dirname(res.exec_start), "python")
                if await tr.exists(address.sys_path(py.lstrip("/"))):
                    trt = await tr.run([address.sys_path(py.lstrip("/")), "-c",
                                        "import tensorrt; print(tensorrt.__version__)"])
                    res.tensorrt = trt.stdout.strip() if trt.exit_status == 0 else "absent"
                res.status = "installed" if changed else "unchanged"
            finally:
                await priv.close()
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


async def _jtop_dropin(tr: Transport, priv: _Privileged, address: DeviceAddress, unit_dir: str) -> bool:
    """Write ``cuvil-edged.service.d/jtop.conf`` adding the ``jtop`` group where that group exists,
    remove it where it does not (``SupplementaryGroups=`` with a missing group fails the unit); True
    when something changed."""
    dropin_dir = os.path.join(unit_dir, f"{UNIT_NAME}.d")
    dest = os.path.join(dropin_dir, "jtop.conf")
    present = await tr.read_bytes(dest)
    if has_group(await tr.read_bytes(address.sys_path("etc/group")), "jtop"):
        if present == JTOP_DROPIN.encode():
            return False
        await priv.makedirs(dropin_dir)
        await priv.write(dest, JTOP_DROPIN.encode())
        return True
    if present is not None:
        await priv.remove(dest)
        return True
    return False


def read_unit(path: Path | None) -> bytes:
    if path is None:
        return default_unit()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DeployError(f"--unit {path}: cannot read it ({exc.strerror})") from None
