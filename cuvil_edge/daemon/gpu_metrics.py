"""Triton's GPU metric names from Jetson telemetry, so a Triton Grafana dashboard works on a board.

Triton reads these from NVML, which Jetson does not have; here they come from the telemetry
samples (tegrastats, jtop, sysfs, replay, sim) with Triton's names, units and label::

    nv_gpu_utilization{gpu_uuid}          GR3D busy fraction, 0.0 - 1.0 (Triton's unit, not %)
    nv_gpu_memory_total_bytes{gpu_uuid}   the board's RAM: CPU and GPU share it (unified memory)
    nv_gpu_memory_used_bytes{gpu_uuid}    RAM in use by everything on the board, CPU and GPU alike
    nv_gpu_power_usage{gpu_uuid}          the GPU power rail, watts (see RAIL_PREFERENCE)
    nv_gpu_power_limit{gpu_uuid}          the module's power in its highest power mode, watts (the board
                                          profile's power figures; absent without --board or figures)
    nv_energy_consumption{gpu_uuid}       joules since the daemon started: the integral of the GPU
                                          rail's power over time (trapezoids between samples)

On an integrated GPU there is no separate video memory: "total" is the shared LPDDR and "used" is
what the whole board uses, so ``total - used`` is what the GPU could still allocate. Jetson has no
NVML UUID either; ``gpu_uuid`` is a stable UUID derived from the machine id and the board name,
in NVML's ``GPU-xxxxxxxx-...`` form. A figure the telemetry lacks is left out, never zero.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = ["RAIL_PREFERENCE", "GpuMetrics", "gpu_rail", "gpu_uuid", "power_limit_w"]

# The rail whose power is "the GPU's", most specific first; then any rail naming the GPU
# (VDD_CPU_GPU_CV on Orin NX/Nano powers CPU, GPU and CV engines together).
RAIL_PREFERENCE = ("VDD_GPU", "GPU", "VDD_GPU_SOC", "POM_5V_GPU", "VDD_SYS_GPU")

Gauges = dict[str, tuple[str, list[tuple[dict[str, str], Any]]]]


def gpu_rail(rails: dict[str, Any]) -> str | None:
    """The name of the rail that carries the GPU's power in a sample, or None."""
    for name in RAIL_PREFERENCE:
        if name in rails:
            return name
    for name in sorted(rails):
        if "GPU" in name.upper():
            return name
    return None


def power_limit_w(target: Any) -> float | None:
    """The power limit to report for a board profile: its highest power mode, watts, or None.

    Read from the profile's clock and power figures (``clocks_power.max_mw`` in targets.toml, the
    data sheets' power-mode tables) when the profile carries them.
    """
    figures = getattr(target, "figures", None)
    max_mw = getattr(figures, "max_mw", None)
    return None if max_mw is None else float(max_mw) / 1000.0


def gpu_uuid(board: str | None, machine_id_path: Path = Path("/etc/machine-id")) -> str:
    """A stable ``GPU-<uuid>`` for this machine and board (Jetson has no NVML UUID)."""
    try:
        machine = machine_id_path.read_text().strip()
    except OSError:
        machine = ""
    seed = f"cuvil-edge:{machine or socket.gethostname()}:{board or 'gpu0'}"
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, seed)}"


class GpuMetrics:
    """Triton's ``nv_gpu_*`` and ``nv_energy_consumption`` series from telemetry samples.

    Feed it every sample (:meth:`update`, from the telemetry thread); :meth:`gauges` and
    :meth:`counters` give the series for ``/metrics``.

    Args:
        board (str | None): the board profile name (label seed and power budget). Defaults to none.
        power_budget_w (float | None): the power limit to report. Defaults to none (left out).
    """

    def __init__(self, board: str | None = None, power_budget_w: float | None = None) -> None:
        self.uuid = gpu_uuid(board)
        self.power_budget_w = power_budget_w
        self.energy_j = 0.0
        self.rail: str | None = None
        self._last: tuple[float, float] | None = None  # (monotonic time, rail watts)
        self._sample: Any = None
        self._lock = threading.Lock()

    def update(self, sample: Any, now: float | None = None) -> None:
        """Take one sample: keep it, and add the rail's energy since the previous one."""
        now = time.monotonic() if now is None else now
        rails = getattr(sample, "power_mw", None) or {}
        rail = gpu_rail(rails)
        reading = rails.get(rail, {}).get("cur") if rail else None
        with self._lock:
            self._sample = sample
            if reading is None:
                self._last = None  # a gap: no energy is invented across it
                return
            watts = float(reading) / 1000.0
            self.rail = rail
            if self._last is not None:
                t0, w0 = self._last
                dt = now - t0
                if 0 < dt < 60:  # a longer silence is a gap, not a plateau
                    self.energy_j += (w0 + watts) / 2.0 * dt
            self._last = (now, watts)

    def gauges(self) -> Gauges:
        """The Triton GPU gauges (absent figures left out)."""
        with self._lock:
            sample, last = self._sample, self._last
        label = {"gpu_uuid": self.uuid}
        g: Gauges = {}
        if sample is not None:
            util = getattr(sample, "gpu_util_pct", None)
            total = getattr(sample, "ram_total_mb", None)
            used = getattr(sample, "ram_used_mb", None)
            g["nv_gpu_utilization"] = ("GPU utilization rate [0.0 - 1.0)",
                                       [(label, None if util is None else float(util) / 100.0)])
            g["nv_gpu_memory_total_bytes"] = (
                "GPU total memory, in bytes (unified memory: the board's RAM, shared with the CPU)",
                [(label, None if total is None else int(total * 1048576))])
            g["nv_gpu_memory_used_bytes"] = (
                "GPU used memory, in bytes (unified memory: RAM used on the board by CPU and GPU)",
                [(label, None if used is None else int(used * 1048576))])
            if last is not None:
                g["nv_gpu_power_usage"] = ("GPU power usage in watts", [(label, last[1])])
                g["cuvil_gpu_power_rail_info"] = ("The power rail reported as the GPU's",
                                                  [({**label, "rail": str(self.rail)}, 1)])
        if self.power_budget_w is not None:
            g["nv_gpu_power_limit"] = ("GPU power management limit in watts (the module's power budget)",
                                       [(label, float(self.power_budget_w))])
        return g

    def counters(self) -> Gauges:
        """``nv_energy_consumption`` (joules since the daemon started)."""
        with self._lock:
            if self.rail is None:
                return {}
            energy = self.energy_j
        return {"nv_energy_consumption": ("GPU energy consumption in joules since the daemon started",
                                          [({"gpu_uuid": self.uuid}, energy)])}
