"""A device's facts (architecture, board profile, L4T, TensorRT, RAM), read below a system root.

Facts come from the files the board itself carries, below the device's system root (``/`` on a
real board): ``/proc/sys/kernel/arch`` (else ``platform.machine()``), ``/proc/device-tree/model``,
``/proc/meminfo``, ``/etc/nv_tegra_release`` (L4T) and the dpkg database (``tensorrt`` /
``libnvinfer*`` packages). Host and board read them the same way: deploy over SSH
(:func:`cuvil_edge.deploy.probe.probe_device`), the board's daemon and engine builder locally
(:func:`probe_local`), and a device's engine key is made from them
(:func:`cuvil_edge.bundle.engine_store.key_for_facts`). So they live in the bundle contract, below
the runtime, the packager and deploy; ``cuvil_edge.deploy.probe`` re-exports these names.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil_edge.targets import profile_for_device_tree

__all__ = ["DeviceFacts", "parse_dpkg_status", "parse_nv_tegra_release", "probe_local", "profile_from_model"]


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
