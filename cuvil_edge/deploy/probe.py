"""What a device is, read from the device, and whether a bundle fits it.

Facts come from the files the board itself carries, below the device's system root (``/`` on a
real board): ``/proc/sys/kernel/arch`` (else the running kernel's, else ``uname -m``), ``/proc/device-tree/model``,
``/proc/meminfo``, ``/etc/nv_tegra_release`` (L4T) and the dpkg database (``tensorrt`` /
``libnvinfer*`` packages). Reading through a root lets tests give a loopback device the files
of a board we lack.

The facts themselves and the local reading (:mod:`cuvil_edge.bundle.device_facts`) are shared with
the board's runtime and engine builder, so they live below deploy; this module reads them over SSH
and checks a bundle against them, and re-exports the shared names.
"""

from __future__ import annotations

import re

from cuvil_edge.bundle.device_facts import (
    DeviceFacts,
    parse_dpkg_status,
    parse_nv_tegra_release,
    probe_local,
    profile_from_model,
)
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.errors import DeployError
from cuvil_edge.targets import get_target

__all__ = ["DeviceFacts", "IncompatibleDevice", "PackageOnlyDevice", "check_compatible", "parse_dpkg_status",
           "parse_nv_tegra_release", "probe_device", "probe_local", "profile_from_model", "refuse_package_only"]


class IncompatibleDevice(DeployError):
    """The bundle was built for another architecture, board or JetPack release than the device's."""


class PackageOnlyDevice(IncompatibleDevice):
    """The device runs a JetPack cuvil-edge cannot run on (Python older than 3.10: JetPack 4 and 5)."""


def refuse_package_only(facts: DeviceFacts, label: str = "device") -> None:
    """Raise :class:`PackageOnlyDevice` when the device's L4T belongs to a package-only JetPack.

    JetPack 5 (L4T 35) ships Python 3.8 and TensorRT bindings for 3.8 only; cuvil-edge needs
    Python >= 3.10 on the device, so deploy, the daemon and ``engine build --on`` cannot work
    there. Bundles for it are still packaged: each TensorRT 8.x plan carries the ``trtexec``
    command line that builds its engine by hand (``trtexec_command``).
    """
    from cuvil_edge.targets import all_targets

    if not facts.l4t:
        return
    major = facts.l4t.split(".")[0]
    for target in all_targets().values():
        for release in target.releases:
            if release.l4t.split(".")[0] == major and release.package_only:
                raise PackageOnlyDevice(
                    f"{label}: L4T {facts.l4t} is JetPack {release.jetpack.split('.')[0]}, whose Python "
                    f"{release.python} is older than the 3.10 cuvil-edge needs: JetPack {release.jetpack.split('.')[0]} "
                    "boards are package-only (build the engine by hand with the plan's trtexec_command, or "
                    "upgrade the board to JetPack 6)")


async def probe_device(tr: Transport) -> DeviceFacts:
    """Read a device's facts over its SSH transport.

    Raises:
        PackageOnlyDevice: the device runs JetPack 4 or 5 (:func:`refuse_package_only`).
    """
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
    refuse_package_only(facts, a.label)
    return facts


def _ver3(v: str | None) -> str | None:
    if not v:
        return None
    parts = v.split(".")
    return ".".join(parts[:3])


def check_compatible(manifest: Manifest, facts: DeviceFacts, label: str = "device") -> list[str]:
    """Raise :class:`IncompatibleDevice` when the bundle cannot run on the device.

    Rules: the CPU architecture must equal the bundle target's. A TensorRT bundle also needs a
    GPU of the target's SM, the device's L4T and TensorRT versions among the target's releases
    (or a build plan for the device's TensorRT version). A different board of the same SM is
    allowed and noted.

    Returns:
        list[str]: notes (allowed differences).
    """
    target = manifest.board
    name = f"bundle {manifest.name} {manifest.version}"
    want_arch = target.arch
    notes: list[str] = []
    if want_arch and want_arch != facts.arch:
        raise IncompatibleDevice(
            f"{label}: {name} is built for {want_arch} (target {manifest.target_name}) but the device is "
            f"{facts.arch}; package the model for this device's target"
        )
    if manifest.format_kind != "tensorrt":
        if manifest.target_name and facts.profile and manifest.target_name != facts.profile:
            notes.append(f"bundle target {manifest.target_name}, device profile {facts.profile}")
        return notes
    want_sm = target.gpu_sm
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
            f"{label}: {name} targets GPU SM {want_sm} ({manifest.target_name}) but the device "
            f"{facts.profile} has SM {dev_sm}"
        )
    if manifest.target_name and manifest.target_name != facts.profile:
        notes.append(f"bundle target {manifest.target_name}, device {facts.profile} (same SM {dev_sm})")
    releases = target.releases
    if not facts.l4t or not facts.tensorrt:
        raise IncompatibleDevice(
            f"{label}: {name} needs TensorRT but the device shows "
            f"L4T {facts.l4t or 'none'} and TensorRT {facts.tensorrt or 'none'} "
            "(/etc/nv_tegra_release, dpkg tensorrt); install JetPack"
        )
    dev_trt = _ver3(facts.tensorrt)
    ok_release = any(
        _ver3(r.tensorrt) == dev_trt and r.l4t.split(".")[0] == facts.l4t.split(".")[0]
        for r in releases
    )
    plans = [_ver3(str(p.get("tensorrt"))) for p in manifest.build_plans]
    if not ok_release and dev_trt not in plans:
        supported = ", ".join(f"L4T {r.l4t}/TensorRT {r.tensorrt}" for r in releases) or "none"
        raise IncompatibleDevice(
            f"{label}: {name} supports {supported}; the device has L4T {facts.l4t} with TensorRT "
            f"{facts.tensorrt}; package for the device's JetPack release or upgrade the device"
        )
    return notes
