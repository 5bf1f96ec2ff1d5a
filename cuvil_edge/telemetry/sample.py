"""The normalized telemetry record every source yields (docs/architecture.md, "Telemetry → daemon").

A field the source does not carry is ``None``, never ``0``: tegrastats without sudo drops EMC and
GR3D, Thor prints GPU frequencies without a utilization, x86 has no GPU rail. Consumers must test
for ``None`` before comparing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from cuvil_edge.errors import TelemetryError

__all__ = ["CpuCore", "PowerRail", "Sample"]

# ``cpus`` entries and ``power_mw`` values are plain dicts so that ``to_dict`` is the identity on
# them; these aliases only document their keys.
CpuCore = dict  # {"load_pct": float | None, "freq_mhz": float | None}
PowerRail = dict  # {"cur": float | None, "avg": float | None}


@dataclass
class Sample:
    """One telemetry reading, whatever the source.

    Attributes:
        timestamp (float): seconds since the epoch when the reading was taken.
        ram_used_mb (float | None): RAM in use, MB (tegrastats' "RAM X/Y").
        ram_total_mb (float | None): RAM the kernel manages, MB.
        lfb_count (int | None): number of free blocks of the largest size ("lfb NxZ": N).
        lfb_size_kb (float | None): size of the largest free block, kB ("lfb NxZ": Z).
        swap_used_mb (float | None): swap (zram on JetPack) in use, MB.
        swap_total_mb (float | None): swap size, MB.
        cpus (list[dict | None] | None): per core ``{"load_pct", "freq_mhz"}``; ``None`` for an
            offline core.
        emc_util_pct (float | None): memory controller (EMC) utilization, percent.
        emc_freq_mhz (float | None): EMC frequency, MHz.
        gpu_util_pct (float | None): GPU (GR3D) utilization, percent.
        gpu_freq_mhz (float | None): GPU frequency, MHz (the highest GPC clock on multi-GPC parts).
        temps_c (dict[str, float]): sensor name to °C; sensors reading "off" (-256 °C) are left out.
        power_mw (dict[str, dict]): rail to ``{"cur": mW, "avg": mW}``.
        extra (dict[str, Any]): everything else the source reported (engines, IRAM, unknown
            tokens), kept verbatim or lightly parsed.
        source (str): which source produced the sample (``tegrastats``, ``sysfs``, ``sim:...``).
    """

    timestamp: float
    ram_used_mb: float | None = None
    ram_total_mb: float | None = None
    lfb_count: int | None = None
    lfb_size_kb: float | None = None
    swap_used_mb: float | None = None
    swap_total_mb: float | None = None
    cpus: list[dict[str, float | None] | None] | None = None
    emc_util_pct: float | None = None
    emc_freq_mhz: float | None = None
    gpu_util_pct: float | None = None
    gpu_freq_mhz: float | None = None
    temps_c: dict[str, float] = field(default_factory=dict)
    power_mw: dict[str, dict[str, float | None]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    # ---- derived figures (not fields: to_dict() carries exactly the contract's fields) ----

    @property
    def ram_free_mb(self) -> float | None:
        """``ram_total_mb - ram_used_mb`` when both are known."""
        if self.ram_used_mb is None or self.ram_total_mb is None:
            return None
        return self.ram_total_mb - self.ram_used_mb

    @property
    def lfb_total_mb(self) -> float | None:
        """Memory in largest free blocks, MB (``lfb_count * lfb_size_kb / 1024``)."""
        if self.lfb_count is None or self.lfb_size_kb is None:
            return None
        return self.lfb_count * self.lfb_size_kb / 1024.0

    @property
    def max_temp_c(self) -> float | None:
        """The hottest sensor, or None without temperatures."""
        return max(self.temps_c.values()) if self.temps_c else None

    @property
    def input_power_mw(self) -> float | None:
        """Board input power (``VDD_IN``/``VIN``/``POM_5V_IN``), else the sum of the rails."""
        for rail in ("VDD_IN", "VIN", "POM_5V_IN", "VIN_SYS_5V0"):
            value = self.power_mw.get(rail, {}).get("cur")
            if value is not None:
                return value
        values = [r.get("cur") for r in self.power_mw.values() if r.get("cur") is not None]
        return float(sum(values)) if values else None  # type: ignore[arg-type]

    @property
    def cpu_load_pct(self) -> float | None:
        """Mean load of the online cores with a known load."""
        if not self.cpus:
            return None
        loads = [c["load_pct"] for c in self.cpus if c is not None and c.get("load_pct") is not None]
        return sum(loads) / len(loads) if loads else None  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with exactly the contract's fields (copies, safe to mutate)."""
        return {
            "timestamp": self.timestamp,
            "ram_used_mb": self.ram_used_mb,
            "ram_total_mb": self.ram_total_mb,
            "lfb_count": self.lfb_count,
            "lfb_size_kb": self.lfb_size_kb,
            "swap_used_mb": self.swap_used_mb,
            "swap_total_mb": self.swap_total_mb,
            "cpus": None if self.cpus is None else [None if c is None else dict(c) for c in self.cpus],
            "emc_util_pct": self.emc_util_pct,
            "emc_freq_mhz": self.emc_freq_mhz,
            "gpu_util_pct": self.gpu_util_pct,
            "gpu_freq_mhz": self.gpu_freq_mhz,
            "temps_c": dict(self.temps_c),
            "power_mw": {k: dict(v) for k, v in self.power_mw.items()},
            "extra": _jsonable(self.extra),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Rebuild a sample from :meth:`to_dict` output; raises TelemetryError on bad data."""
        if not isinstance(data, dict):
            raise TelemetryError(f"telemetry record must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise TelemetryError(f"telemetry record has unknown fields {sorted(unknown)}")
        if not isinstance(data.get("timestamp"), (int, float)) or not math.isfinite(data["timestamp"]):
            raise TelemetryError("telemetry record needs a numeric 'timestamp' (epoch seconds)")
        kw = {k: data[k] for k in names if k in data}
        for key in ("temps_c", "power_mw", "extra"):
            if kw.get(key) is None:
                kw[key] = {}
        return cls(**kw)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
