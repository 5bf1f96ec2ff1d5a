"""The kernel's own memory signals: ``/proc/meminfo``, pressure-stall information, the unit's cgroup.

tegrastats (or any telemetry source) says how much RAM the board uses; the kernel says more, and
says it first:

* ``/proc/meminfo`` ``MemAvailable``: what can be allocated without swapping, page cache counted
  as reclaimable (the kernel's estimate; ``MemFree`` alone understates it);
* ``/proc/pressure/memory`` (PSI, Linux >= 4.20, on in L4T 36 kernels): the share of the last 10 s
  in which *some* task (``some``) or *every* task (``full``) stalled waiting for memory. It rises
  while reclaim struggles, before the OOM killer acts;
* the daemon's cgroup (systemd puts a unit in its own): v2 ``memory.current``, ``memory.max``
  (``MemoryMax=`` in the unit) and ``memory.events`` (``oom_kill`` counts kills inside the unit);
  v1 ``memory.usage_in_bytes``, ``memory.limit_in_bytes`` and ``memory.oom_control``. A limit
  lower than the board's RAM *is* the RAM the daemon has; what is left of it is the limit less the
  working set (usage less inactive page cache, ``memory.stat``), since the kernel reclaims that
  cache before it OOM-kills anything.

:class:`KernelMemory` reads them (under a ``root``, so tests pass a fixture tree) and
:meth:`KernelMemory.sample` turns one reading into a telemetry :class:`~cuvil_edge.telemetry.Sample`
whose RAM figures are the tighter of the machine's and the cgroup's, so the
:class:`~cuvil_edge.daemon.scheduler.MemoryScheduler` ladder works from the kernel alone when no
telemetry source runs. Missing files mean the field is absent (None), never zero.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.telemetry.sample import Sample

__all__ = ["CgroupMemory", "KernelMemory", "KernelMemoryReading", "Pressure", "find_memory_cgroup",
           "read_cgroup_memory", "read_meminfo", "read_pressure"]

MiB = 1024 * 1024
_UNLIMITED = 1 << 60  # v1 reports "no limit" as a huge page-rounded number


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def read_meminfo(root: str | os.PathLike[str] = "/") -> dict[str, int]:
    """``/proc/meminfo`` as bytes by field (``MemTotal``, ``MemAvailable``, ...); {} if unreadable."""
    text = _text(Path(root, "proc/meminfo"))
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[name.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


@dataclass(frozen=True)
class Pressure:
    """Memory pressure-stall information: percent of wall time stalled, and total stall time."""

    some_avg10: float
    some_avg60: float
    full_avg10: float | None
    full_avg60: float | None
    some_total_us: int
    full_total_us: int | None


def read_pressure(root: str | os.PathLike[str] = "/", cgroup: Path | None = None) -> Pressure | None:
    """``memory.pressure`` of ``cgroup`` (v2) when given and present, else ``/proc/pressure/memory``.

    None when the kernel has no PSI (built without it, or booted with ``psi=0``).
    """
    text = None
    if cgroup is not None:
        text = _text(cgroup / "memory.pressure")
    if text is None:
        text = _text(Path(root, "proc/pressure/memory"))
    if not text:
        return None
    rows: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        vals: dict[str, float] = {}
        for item in rest.split():
            k, _, v = item.partition("=")
            try:
                vals[k] = float(v)
            except ValueError:
                continue
        rows[kind] = vals
    some = rows.get("some")
    if some is None or "avg10" not in some:
        return None
    full = rows.get("full")
    return Pressure(
        some_avg10=some["avg10"], some_avg60=some.get("avg60", 0.0),
        full_avg10=full.get("avg10") if full else None, full_avg60=full.get("avg60") if full else None,
        some_total_us=int(some.get("total", 0)), full_total_us=int(full["total"]) if full and "total" in full else None,
    )


def find_memory_cgroup(root: str | os.PathLike[str] = "/", pid: int | str = "self") -> Path | None:
    """The memory cgroup directory of ``pid``: v2 (``0::/path``) first, else v1's ``memory`` line.

    Returns None when neither hierarchy is mounted where expected.
    """
    text = _text(Path(root, f"proc/{pid}/cgroup"))
    if text is None:
        return None
    v1: str | None = None
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    base = Path(root, "sys/fs/cgroup")
    if v2 is not None:
        d = base / v2.lstrip("/")
        if (d / "memory.current").exists():
            return d
        d = base / "unified" / v2.lstrip("/")
        if (d / "memory.current").exists():
            return d
    if v1 is not None:
        d = base / "memory" / v1.lstrip("/")
        if (d / "memory.usage_in_bytes").exists():
            return d
    return None


@dataclass(frozen=True)
class CgroupMemory:
    """One reading of a memory cgroup (v1 or v2)."""

    path: str
    version: int
    current: int | None  # charged, page cache included
    limit: int | None  # None: no limit
    oom_kills: int | None
    oom_events: int | None  # v2 "oom" (allocations that hit the limit); v1 under_oom
    high_events: int | None
    inactive_file: int | None = None  # page cache the kernel reclaims first, before any OOM

    @property
    def working_set(self) -> int | None:
        """What the cgroup cannot give back without swapping: usage less inactive page cache (the
        figure the kubelet and ``docker stats`` use). The cache a hog leaves behind is not pressure."""
        if self.current is None:
            return None
        return max(0, self.current - (self.inactive_file or 0))


def _stat(cgroup: Path, key: str) -> int | None:
    for line in (_text(cgroup / "memory.stat") or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


def read_cgroup_memory(cgroup: Path) -> CgroupMemory | None:
    """Read ``cgroup`` (v2 when ``memory.current`` is there, else v1); None if it is neither."""
    if (cgroup / "memory.current").exists():
        events: dict[str, int] = {}
        for line in (_text(cgroup / "memory.events") or "").splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                events[k] = int(v)
        return CgroupMemory(str(cgroup), 2, _int(cgroup / "memory.current"), _int(cgroup / "memory.max"),
                            events.get("oom_kill"), events.get("oom"), events.get("high"),
                            _stat(cgroup, "inactive_file"))
    if (cgroup / "memory.usage_in_bytes").exists():
        ctl: dict[str, int] = {}
        for line in (_text(cgroup / "memory.oom_control") or "").splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                ctl[k] = int(v)
        return CgroupMemory(str(cgroup), 1, _int(cgroup / "memory.usage_in_bytes"),
                            _int(cgroup / "memory.limit_in_bytes"), ctl.get("oom_kill"), ctl.get("under_oom"), None,
                            _stat(cgroup, "total_inactive_file"))
    return None


@dataclass(frozen=True)
class KernelMemoryReading:
    """The kernel's view, merged: what the daemon can count on now."""

    timestamp: float
    total_bytes: int | None  # the tighter of MemTotal and the cgroup limit
    available_bytes: int | None  # the tighter of MemAvailable and limit - current
    swap_total_bytes: int | None
    swap_used_bytes: int | None
    pressure: Pressure | None
    cgroup: CgroupMemory | None
    limited_by_cgroup: bool = False
    meminfo: dict[str, int] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("meminfo")
        return d


class KernelMemory:
    """Reads ``/proc/meminfo``, PSI and the memory cgroup of this process (or ``cgroup``).

    Args:
        root (str | PathLike): file-system root the files are read under. Defaults to ``/``.
        cgroup (str | PathLike | None): the cgroup directory to read. Defaults to this process's
            (found from ``proc/self/cgroup``); ``""`` disables the cgroup.
    """

    def __init__(self, root: str | os.PathLike[str] = "/", cgroup: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root)
        if cgroup == "":
            self.cgroup_dir: Path | None = None
        elif cgroup is not None:
            self.cgroup_dir = Path(cgroup)
        else:
            self.cgroup_dir = find_memory_cgroup(self.root)

    def read(self) -> KernelMemoryReading:
        info = read_meminfo(self.root)
        cg = read_cgroup_memory(self.cgroup_dir) if self.cgroup_dir is not None else None
        total = info.get("MemTotal")
        avail = info.get("MemAvailable", info.get("MemFree"))
        limited = False
        if cg is not None and cg.limit is not None and cg.working_set is not None:
            if total is None or cg.limit < total:
                total, limited = cg.limit, True
            left = max(0, cg.limit - cg.working_set)
            if avail is None or left < avail:
                avail = left
        swap_total = info.get("SwapTotal")
        swap_free = info.get("SwapFree")
        swap_used = swap_total - swap_free if swap_total is not None and swap_free is not None else None
        pressure = read_pressure(self.root, self.cgroup_dir if cg is not None and cg.version == 2 else None)
        return KernelMemoryReading(time.time(), total, avail, swap_total, swap_used, pressure, cg, limited, info)

    def sample(self, reading: KernelMemoryReading | None = None) -> Sample:
        """A telemetry sample with the kernel's RAM and swap figures (the rest absent)."""
        r = reading or self.read()
        total_mb = None if r.total_bytes is None else r.total_bytes / MiB
        used_mb = None if total_mb is None or r.available_bytes is None else total_mb - r.available_bytes / MiB
        extra: dict[str, Any] = {"source": "kernel"}
        if r.pressure is not None:
            extra["psi_some_avg10"] = r.pressure.some_avg10
            extra["psi_full_avg10"] = r.pressure.full_avg10
        return Sample(
            timestamp=r.timestamp, ram_used_mb=used_mb, ram_total_mb=total_mb,
            swap_used_mb=None if r.swap_used_bytes is None else r.swap_used_bytes / MiB,
            swap_total_mb=None if r.swap_total_bytes is None else r.swap_total_bytes / MiB,
            extra=extra, source="kernel",
        )
