"""What a device is, read from the device, and whether a bundle fits it.

Facts come from the files the board itself carries, below the device's system root (``/`` on a
real board): ``/proc/sys/kernel/arch`` (else the running kernel's, else ``uname -m``), ``/proc/device-tree/model``,
``/proc/meminfo``, ``/etc/nv_tegra_release`` (L4T) and the dpkg database (``tensorrt`` /
``libnvinfer*`` packages). Reading through a root lets tests give a loopback device the files
of a board we lack.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil_edge.deploy.transport import SSHTransport
from cuvil_edge.errors import DeployError
from cuvil_edge.targets import get_target, profile_for_device_tree

__all__ = ["DeviceFacts", "IncompatibleDevice", "check_compatible", "parse_dpkg_status", "probe_local",
           "parse_nv_tegra_release", "probe_device", "profile_from_model"]


class IncompatibleDevice(DeployError):
    """The bundle was built for another architecture, board or JetPack release than the device's."""


@dataclass
class DeviceFacts:
    """Hardware and software facts of one device; a fact the device does not show is None."""

    arch: str
    model: str | None = None
    profile: str | None = None
    l4t: str | None = None
    tensorrt: str | None = None
    ram_mb: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_L4T_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")


def parse_nv_tegra_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 4.3, ...`` → ``36.4.3``; None when the line is not there."""
    m = _L4T_RE.search(text)
    if not m:
        return None
    return f"{m.group(1)}.{m.group(2)}"


def parse_dpkg_status(text: str) -> str | None:
    """TensorRT version (``10.3.0``) from a dpkg status database, or None when not installed.

    Looks for the ``tensorrt`` meta package first, then ``libnvinfer<major>``/``libnvinfer-bin``,
    counting only packages whose status is ``install ok installed``.
    """
    found: dict[str, str] = {}
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in para.splitlines():
            if ":" in line and not line.startswith(" "):
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
        pkg = fields.get("Package", "")
        if fields.get("Status", "").endswith("installed") and "not-installed" not in fields.get("Status", ""):
            if pkg == "tensorrt" or re.fullmatch(r"libnvinfer\d*|libnvinfer-bin", pkg):
                found[pkg] = fields.get("Version", "")
    for pkg in ["tensorrt", *sorted(k for k in found if k != "tensorrt")]:
        version = found.get(pkg)
        if version:
            m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
            if m:
                return ".".join(m.groups())
    return None


def profile_from_model(model: str | None, arch: str, ram_mb: int | None) -> str | None:
    """Board profile name from the device tree model string (``device_tree_model`` in the board
    profiles), architecture and RAM."""
    if model and (name := profile_for_device_tree(model, ram_mb)):
        return name
    if arch == "x86_64":
        return "x86-host"
    if arch == "aarch64":
        return "generic-arm64"
    return None


async def probe_device(tr: SSHTransport) -> DeviceFacts:
    """Read a device's facts over its SSH transport."""
    a = tr.address
    raw_arch = await tr.read_bytes(a.sys_path("proc/sys/kernel/arch"), 256)
    if not (raw_arch or b"").strip() and a.sys_path("proc") != "/proc":
        # The root does not say: the running kernel's answer is the device's (no exec needed).
        raw_arch = await tr.read_bytes("/proc/sys/kernel/arch", 256)
    if raw_arch is not None and raw_arch.strip():
        arch = raw_arch.decode(errors="replace").strip()
    else:
        res = await tr.run(["uname", "-m"])
        if res.exit_status != 0:
            raise DeployError(f"{a.label}: cannot read the architecture (uname -m: {res.stderr.strip()})")
        arch = res.stdout.strip()
    if arch == "arm64":
        arch = "aarch64"
    facts = DeviceFacts(arch=arch)
    model = await tr.read_bytes(a.sys_path("proc/device-tree/model"), 4096)
    if model:
        facts.model = model.rstrip(b"\x00\n").decode(errors="replace")
    meminfo = await tr.read_bytes(a.sys_path("proc/meminfo"), 65536)
    if meminfo:
        m = re.search(rb"MemTotal:\s+(\d+)\s*kB", meminfo)
        if m:
            facts.ram_mb = int(m.group(1)) // 1024
    rel = await tr.read_bytes(a.sys_path("etc/nv_tegra_release"), 4096)
    if rel:
        facts.l4t = parse_nv_tegra_release(rel.decode(errors="replace"))
    status = await tr.read_bytes(a.sys_path("var/lib/dpkg/status"))
    if status:
        facts.tensorrt = parse_dpkg_status(status.decode(errors="replace"))
    facts.profile = profile_from_model(facts.model, arch, facts.ram_mb)
    return facts


def _ver3(v: str | None) -> str | None:
    if not v:
        return None
    parts = v.split(".")
    return ".".join(parts[:3])


def check_compatible(manifest: Any, facts: DeviceFacts, label: str = "device") -> list[str]:
    """Raise :class:`IncompatibleDevice` when the bundle cannot run on the device.

    Rules: the CPU architecture must equal the bundle target's. A TensorRT bundle also needs a
    GPU of the target's SM, the device's L4T and TensorRT versions among the target's releases
    (or a build plan for the device's TensorRT version). A different board of the same SM is
    allowed and noted.

    Returns:
        list[str]: notes (allowed differences).
    """
    target = manifest.target if isinstance(manifest.target, dict) else dict(manifest.target)
    name = f"bundle {manifest.name} {manifest.version}"
    want_arch = target.get("arch")
    notes: list[str] = []
    if want_arch and want_arch != facts.arch:
        raise IncompatibleDevice(
            f"{label}: {name} is built for {want_arch} (target {target.get('name')}) but the device is "
            f"{facts.arch}; package the model for this device's target"
        )
    if manifest.format_kind != "tensorrt":
        if target.get("name") and facts.profile and target.get("name") != facts.profile:
            notes.append(f"bundle target {target.get('name')}, device profile {facts.profile}")
        return notes
    want_sm = str(target.get("gpu_sm") or "")
    dev_sm = ""
    if facts.profile:
        try:
            dev_sm = get_target(facts.profile).gpu_sm
        except Exception:
            dev_sm = ""
    if not dev_sm:
        raise IncompatibleDevice(
            f"{label}: {name} is a TensorRT bundle for SM {want_sm} but the device shows no Jetson GPU "
            f"(profile {facts.profile}, model {facts.model!r}); package for ort-cpu instead"
        )
    if want_sm and dev_sm != want_sm:
        raise IncompatibleDevice(
            f"{label}: {name} targets GPU SM {want_sm} ({target.get('name')}) but the device "
            f"{facts.profile} has SM {dev_sm}"
        )
    if target.get("name") and target.get("name") != facts.profile:
        notes.append(f"bundle target {target.get('name')}, device {facts.profile} (same SM {dev_sm})")
    releases = target.get("releases") or []
    if not facts.l4t or not facts.tensorrt:
        raise IncompatibleDevice(
            f"{label}: {name} needs TensorRT but the device shows "
            f"L4T {facts.l4t or 'none'} and TensorRT {facts.tensorrt or 'none'} "
            "(/etc/nv_tegra_release, dpkg tensorrt); install JetPack"
        )
    dev_trt = _ver3(facts.tensorrt)
    ok_release = any(
        _ver3(str(r.get("tensorrt"))) == dev_trt and str(r.get("l4t", "")).split(".")[0] == facts.l4t.split(".")[0]
        for r in releases
    )
    plans = [_ver3(str(p.get("tensorrt"))) for p in (getattr(manifest, "build_plans", None) or [])]
    if not ok_release and dev_trt not in plans:
        supported = ", ".join(f"L4T {r.get('l4t')}/TensorRT {r.get('tensorrt')}" for r in releases) or "none"
        raise IncompatibleDevice(
            f"{label}: {name} supports {supported}; the device has L4T {facts.l4t} with TensorRT "
            f"{facts.tensorrt}; package for the device's JetPack release or upgrade the device"
        )
    return notes


def probe_local(root: str = "/") -> DeviceFacts:
    """The facts of the machine this runs on (the device side of the Ansible role)."""
    import platform

    def read(rel: str) -> bytes | None:
        try:
            with open(os.path.join(root, rel), "rb") as f:
                return f.read()
        except OSError:
            return None

    raw_arch = read("proc/sys/kernel/arch")
    arch = raw_arch.decode(errors="replace").strip() if raw_arch and raw_arch.strip() else platform.machine()
    facts = DeviceFacts(arch="aarch64" if arch == "arm64" else arch)
    model = read("proc/device-tree/model")
    if model:
        facts.model = model.rstrip(b"\x00\n").decode(errors="replace")
    meminfo = read("proc/meminfo")
    m = re.search(rb"MemTotal:\s+(\d+)\s*kB", meminfo or b"")
    if m:
        facts.ram_mb = int(m.group(1)) // 1024
    rel = read("etc/nv_tegra_release")
    if rel:
        facts.l4t = parse_nv_tegra_release(rel.decode(errors="replace"))
    status = read("var/lib/dpkg/status")
    if status:
        facts.tensorrt = parse_dpkg_status(status.decode(errors="replace"))
    facts.profile = profile_from_model(facts.model, facts.arch, facts.ram_mb)
    return facts

