"""Telemetry from procfs and sysfs, for boards (and hosts) without tegrastats.

Everything is read under a root passed in (``/`` on a device, a recorded tree in tests), as jtop's
``core/*.py`` read the same files but with the root fixed. Files read:

* ``proc/meminfo``: RAM (``MemTotal - MemAvailable`` in use) and swap.
* ``proc/stat``: per-core load (from the difference between two reads: the first sample has
  ``load_pct`` None); ``sys/devices/system/cpu/cpuN/online`` and ``cpufreq/scaling_cur_freq``.
* ``sys/class/devfreq/*``: the GPU node (name with ``gpu``, ``gv11b``, ``ga10b``, ``gp10b``,
  ``gb10b``): ``cur_freq`` (Hz) and ``device/load`` (0..1000, Jetson's nvgpu); a node with
  ``emc`` in its name gives the EMC frequency. ``sys/kernel/actmon_avg_activity/mc_all`` (kHz of
  memory-controller activity) over the EMC frequency gives EMC utilization where readable.
* ``sys/class/thermal/thermal_zone*/{type,temp}``: °C (millidegrees in the file; ``-256000``
  and failures mean off).
* ``sys/class/hwmon/hwmon*``: INA3221-style rails ``inN_label``/``inN_input`` (mV) with
  ``currN_input`` (mA), or ``powerN_input`` (µW). ``avg`` is the mean since the source opened,
  as tegrastats reports it.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.base import TelemetrySource
from cuvil_edge.telemetry.sample import Sample

__all__ = ["SysfsSource"]

_GPU_NAMES = ("gpu", "gv11b", "ga10b", "gp10b", "gb10b", "gm20b")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _read_num(path: str) -> float | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


class SysfsSource(TelemetrySource):
    """Samples ``/proc`` and ``/sys`` under ``root`` every ``interval_s``.

    Args:
        root (str | PathLike): file system root. Defaults to ``/``.
        interval_s (float): sampling interval. Defaults to 1.0.

    Raises:
        TelemetryError: ``root/proc/meminfo`` cannot be read (nothing useful would come).
    """

    name = "sysfs"

    def __init__(self, root: str | os.PathLike[str] = "/", interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.root = str(Path(root))
        if _read(self._p("proc/meminfo")) is None:
            raise TelemetryError(f"sysfs telemetry: cannot read '{self._p('proc/meminfo')}' (wrong root?)")
        self._prev_stat: dict[int, tuple[float, float]] = {}
        self._power_sum: dict[str, float] = {}
        self._power_n: dict[str, int] = {}
        self._next_due: float | None = None
        self.samples_read = 0
        self._closed = False

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    # ---- one reader per subsystem, each returning plain data (jtop's get_status() habit) ----

    def _memory(self) -> dict[str, float | None]:
        info: dict[str, float] = {}
        text = _read(self._p("proc/meminfo")) or ""
        for line in text.splitlines():
            parts = line.replace(":", " ").split()
            if len(parts) >= 2:
                try:
                    info[parts[0]] = float(parts[1])  # kB
                except ValueError:
                    continue
        total = info.get("MemTotal")
        avail = info.get("MemAvailable")
        if avail is None and total is not None:
            avail = info.get("MemFree", 0.0) + info.get("Buffers", 0.0) + info.get("Cached", 0.0)
        out: dict[str, float | None] = {"ram_total_mb": None, "ram_used_mb": None, "swap_total_mb": None, "swap_used_mb": None}
        if total is not None:
            out["ram_total_mb"] = total / 1024.0
            out["ram_used_mb"] = (total - (avail or 0.0)) / 1024.0
        if "SwapTotal" in info:
            out["swap_total_mb"] = info["SwapTotal"] / 1024.0
            out["swap_used_mb"] = (info["SwapTotal"] - info.get("SwapFree", 0.0)) / 1024.0
        return out

    def _cpus(self) -> list[dict[str, float | None] | None] | None:
        stat = _read(self._p("proc/stat"))
        counters: dict[int, tuple[float, float]] = {}
        for line in (stat or "").splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                parts = line.split()
                vals = [float(v) for v in parts[1:]]
                idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
                counters[int(parts[0][3:])] = (sum(vals), idle)
        cpu_dirs = sorted(
            (int(os.path.basename(d)[3:]) for d in glob.glob(self._p("sys/devices/system/cpu/cpu[0-9]*"))),
        )
        ids = sorted(set(cpu_dirs) | set(counters))
        if not ids:
            return None
        cores: list[dict[str, float | None] | None] = []
        for cid in ids:
            base = self._p(f"sys/devices/system/cpu/cpu{cid}")
            online = _read(os.path.join(base, "online"))
            if online == "0":
                cores.append(None)
                continue
            freq = _read_num(os.path.join(base, "cpufreq/scaling_cur_freq"))
            load = None
            if cid in counters and cid in self._prev_stat:
                dt = counters[cid][0] - self._prev_stat[cid][0]
                di = counters[cid][1] - self._prev_stat[cid][1]
                if dt > 0:
                    load = round(max(0.0, min(100.0, 100.0 * (1.0 - di / dt))), 1)
            cores.append({"load_pct": load, "freq_mhz": None if freq is None else freq / 1000.0})
        self._prev_stat = counters
        return cores

    def _devfreq(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for node in sorted(glob.glob(self._p("sys/class/devfreq/*"))):
            name = os.path.basename(node).lower()
            freq = _read_num(os.path.join(node, "cur_freq"))
            if any(g in name for g in _GPU_NAMES) and "gpu_freq_mhz" not in out:
                if freq is not None:
                    out["gpu_freq_mhz"] = freq / 1e6
                load = _read_num(os.path.join(node, "device/load"))
                if load is not None:
                    out["gpu_util_pct"] = load / 10.0
            elif "emc" in name and freq is not None:
                out["emc_freq_mhz"] = freq / 1e6
        if "gpu_util_pct" not in out:
            for rel in ("sys/devices/gpu.0/load", "sys/devices/platform/gpu.0/load"):
                load = _read_num(self._p(rel))
                if load is not None:
                    out["gpu_util_pct"] = load / 10.0
                    break
        if "emc_freq_mhz" not in out:
            rate = _read_num(self._p("sys/kernel/debug/bpmp/debug/clk/emc/rate"))
            if rate is not None:
                out["emc_freq_mhz"] = rate / 1e6
        activity = _read_num(self._p("sys/kernel/actmon_avg_activity/mc_all"))
        if activity is not None and out.get("emc_freq_mhz"):
            out["emc_util_pct"] = round(min(100.0, 100.0 * activity / (out["emc_freq_mhz"] * 1000.0)), 1)
        return out

    def _thermal(self) -> dict[str, float]:
        temps: dict[str, float] = {}
        for zone in sorted(glob.glob(self._p("sys/class/thermal/thermal_zone*"))):
            kind = _read(os.path.join(zone, "type"))
            value = _read_num(os.path.join(zone, "temp"))
            if not kind or value is None or value <= -256000:
                continue
            name = kind.removesuffix("-therm").removesuffix("-thermal")
            if name in temps:
                name = f"{name}_{os.path.basename(zone)[12:]}"
            temps[name] = round(value / 1000.0, 3)
        return temps

    def _power(self) -> dict[str, dict[str, float | None]]:
        rails: dict[str, float] = {}
        for hw in sorted(glob.glob(self._p("sys/class/hwmon/hwmon*"))):
            for label_file in sorted(glob.glob(os.path.join(hw, "in*_label"))):
                idx = os.path.basename(label_file)[2:-6]
                label = _read(label_file)
                mv = _read_num(os.path.join(hw, f"in{idx}_input"))
                ma = _read_num(os.path.join(hw, f"curr{idx}_input"))
                if label and mv is not None and ma is not None:
                    rails[label] = mv * ma / 1000.0
            for pw in sorted(glob.glob(os.path.join(hw, "power*_input"))):
                idx = os.path.basename(pw)[5:-6]
                uw = _read_num(pw)
                label = _read(os.path.join(hw, f"power{idx}_label")) or f"{_read(os.path.join(hw, 'name')) or 'hwmon'}_{idx}"
                if uw is not None and label not in rails:
                    rails[label] = uw / 1000.0
        out: dict[str, dict[str, float | None]] = {}
        for label, mw in rails.items():
            self._power_sum[label] = self._power_sum.get(label, 0.0) + mw
            self._power_n[label] = self._power_n.get(label, 0) + 1
            out[label] = {"cur": round(mw, 1), "avg": round(self._power_sum[label] / self._power_n[label], 1)}
        return out

    def get_sample(self) -> Sample:
        """Read everything now (no waiting)."""
        mem = self._memory()
        if mem["ram_total_mb"] is None:
            raise TelemetryError(f"sysfs telemetry: '{self._p('proc/meminfo')}' vanished or has no MemTotal")
        dev = self._devfreq()
        self.samples_read += 1
        return Sample(
            timestamp=time.time(),
            ram_used_mb=mem["ram_used_mb"],
            ram_total_mb=mem["ram_total_mb"],
            swap_used_mb=mem["swap_used_mb"],
            swap_total_mb=mem["swap_total_mb"],
            cpus=self._cpus(),
            emc_util_pct=dev.get("emc_util_pct"),
            emc_freq_mhz=dev.get("emc_freq_mhz"),
            gpu_util_pct=dev.get("gpu_util_pct"),
            gpu_freq_mhz=dev.get("gpu_freq_mhz"),
            temps_c=self._thermal(),
            power_mw=self._power(),
            source=self.name,
        )

    def read(self, timeout: float | None = None) -> Sample:
        if self._closed:
            raise TelemetryError("sysfs source is closed")
        now = time.monotonic()
        if self._next_due is not None and self._next_due > now:
            wait = self._next_due - now
            if timeout is not None and wait > timeout:
                time.sleep(timeout)
                raise TelemetryError(f"sysfs: next sample due in {wait:.1f} s, beyond the timeout")
            time.sleep(wait)
        self._next_due = max(now, self._next_due or now) + self.interval_s
        return self.get_sample()

    def close(self) -> None:
        self._closed = True

    def get_status(self) -> dict[str, Any]:
        return {"source": self.name, "root": self.root, "interval_s": self.interval_s, "samples": self.samples_read}
