"""Telemetry from jetson-stats' ``jtop`` service (``/run/jtop.sock``), when it runs on the board.

``jetson-stats`` is optional (``sudo pip3 install jetson-stats`` into the system Python, which also
runs its service; a venv made with ``--system-site-packages`` sees it) and imported only when this
source opens. The conversion from jtop's properties to a :class:`Sample` is a pure function,
:func:`sample_from_jtop`, following the structures jetson-stats 4.x documents in ``jtop/jtop.py``:
``memory['RAM'] = {'tot', 'used', 'lfb', ...}`` in kB with ``lfb`` counted in 4 MB blocks,
``memory['EMC'] = {'cur': kHz, 'val': %}``, ``cpu['cpu'] = [{'online', 'freq': {'cur': kHz},
'idle', ...}]``, ``gpu[name] = {'status': {'load': %}, 'freq': {'cur': kHz}}``,
``temperature[name] = {'temp': °C, 'online': bool}``,
``power = {'rail': {name: {'power': mW, 'avg': mW}}, 'tot': {...}}``.
"""

from __future__ import annotations

import time
from typing import Any

from cuvil_edge._optional import optional_import
from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.base import TelemetrySource
from cuvil_edge.telemetry.sample import Sample

__all__ = ["JtopSource", "sample_from_jtop"]


def _f(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def sample_from_jtop(
    memory: dict[str, Any] | None,
    cpu: dict[str, Any] | None,
    gpu: dict[str, Any] | None,
    temperature: dict[str, Any] | None,
    power: dict[str, Any] | None,
    *,
    timestamp: float | None = None,
) -> Sample:
    """Build a :class:`Sample` from jtop's ``memory``, ``cpu``, ``gpu``, ``temperature`` and
    ``power`` properties (plain dicts); absent parts give None fields."""
    s = Sample(timestamp=time.time() if timestamp is None else timestamp, source="jtop")
    memory = memory or {}
    ram = memory.get("RAM") or {}
    if ram.get("tot") is not None:
        s.ram_total_mb = _f(ram["tot"]) / 1024.0  # type: ignore[operator]
    if ram.get("used") is not None:
        s.ram_used_mb = _f(ram["used"]) / 1024.0  # type: ignore[operator]
    if ram.get("lfb") is not None:
        s.lfb_count = int(ram["lfb"])
        s.lfb_size_kb = 4096.0
    swap = memory.get("SWAP") or {}
    if swap.get("tot") is not None:
        s.swap_total_mb = _f(swap["tot"]) / 1024.0  # type: ignore[operator]
        s.swap_used_mb = (_f(swap.get("used")) or 0.0) / 1024.0
    emc = memory.get("EMC") or {}
    if emc:
        s.emc_util_pct = _f(emc.get("val"))
        cur = _f(emc.get("cur"))
        s.emc_freq_mhz = None if cur is None else cur / 1000.0
    if cpu and isinstance(cpu.get("cpu"), list):
        cores: list[dict[str, float | None] | None] = []
        for core in cpu["cpu"]:
            if not core.get("online", True):
                cores.append(None)
                continue
            idle = _f(core.get("idle"))
            freq = _f((core.get("freq") or {}).get("cur"))
            cores.append({
                "load_pct": None if idle is None else round(100.0 - idle, 1),
                "freq_mhz": None if freq is None else freq / 1000.0,
            })
        s.cpus = cores
    for name, g in (gpu or {}).items():
        status = g.get("status") or {}
        freq = _f((g.get("freq") or {}).get("cur"))
        s.gpu_util_pct = _f(status.get("load"))
        s.gpu_freq_mhz = None if freq is None else freq / 1000.0
        s.extra["gpu_name"] = name
        break
    for name, t in (temperature or {}).items():
        if t.get("online", True) and _f(t.get("temp")) is not None and _f(t.get("temp")) > -256:  # type: ignore[operator]
            s.temps_c[name] = _f(t["temp"])  # type: ignore[assignment]
    rails = (power or {}).get("rail") or {}
    for name, r in rails.items():
        s.power_mw[name] = {"cur": _f(r.get("power")), "avg": _f(r.get("avg"))}
    tot = (power or {}).get("tot")
    if tot:
        s.extra["power_total_mw"] = {"cur": _f(tot.get("power")), "avg": _f(tot.get("avg"))}
    return s


class JtopSource(TelemetrySource):
    """Reads the ``jtop`` service through jetson-stats' client.

    Args:
        interval_s (float): sampling interval asked from the service. Defaults to 1.0.

    Raises:
        TelemetryError: jetson-stats is not installed or the service does not answer.
    """

    name = "jtop"

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        jtop = optional_import("jtop", needed_for="the jtop source (jetson-stats)",
                               install="sudo pip3 install jetson-stats (the system Python; it runs jtop's service)",
                               error=TelemetryError).jtop
        try:
            self._jetson = jtop(interval=interval_s)
            self._jetson.start()
        except Exception as exc:  # jtop raises its own JtopException and OSError subclasses
            raise TelemetryError(f"jtop service not reachable (is jtop.service running?): {exc}") from exc
        self.samples_read = 0

    def read(self, timeout: float | None = None) -> Sample:
        try:
            if not self._jetson.ok(spin=True):
                raise TelemetryError("jtop service closed the connection")
            j = self._jetson
            sample = sample_from_jtop(dict(j.memory), dict(j.cpu), dict(j.gpu), dict(j.temperature), dict(j.power))
        except TelemetryError:
            raise
        except Exception as exc:
            raise TelemetryError(f"jtop read failed: {exc}") from exc
        self.samples_read += 1
        return sample

    def close(self) -> None:
        try:
            self._jetson.close()
        except Exception:  # closing a dead connection must not raise
            pass

    def get_status(self) -> dict[str, Any]:
        return {"source": self.name, "interval_s": self.interval_s, "samples": self.samples_read}
