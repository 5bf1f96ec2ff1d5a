"""A simulated board: telemetry of a named profile that responds to the daemon's own load.

This is a *model*, for development and tests on machines without a Jetson; nothing here is a
measurement. It is built from documented figures and a few stated assumptions:

* RAM, memory bandwidth, CPU cores come from the board profile (``cuvil_edge.targets``, data
  sheets cited in ``data/targets.toml``). Swap is JetPack's zram, sized at half the RAM
  (``nvzramconfig``). The OS and desktop baseline is ``os_used_mb`` (assumption: 1.1 GB, a
  JetPack 6 image after boot).
* GPU and CPU maximum clocks and the power range per board (``BOARD_FIGURES``) come from the
  board profile too (``clocks_power`` in ``data/targets.toml``): the module data sheets'
  power-mode tables (Orin Nano DS-11105-001, Orin NX DS-10712-001, AGX Orin DS-10662-001,
  Xavier DS-09654-001/DS-09693-001, Thor product page).
* Power = idle + (max − idle) × (0.6 GPU + 0.25 CPU + 0.15 EMC utilization) × clock scale
  (assumption: a linear split, not a measurement).
* Temperature follows a first-order model toward ``ambient + 55 °C × power / max power`` with a
  20 s time constant (assumption); above ``throttle_c`` (95 °C, near the Jetson software-throttle
  trip) the GPU clock steps down 10% a second to half, and comes back 5 °C below.
* EMC utilization = (daemon traffic + other traffic) / peak bandwidth. The daemon's traffic is
  what it reports, or ``busy_fraction`` × 30% of peak when it reports none (assumption).

The daemon (or the benchmark) calls :meth:`SimulatedBoard.report_load` with its busy fraction,
resident and in-flight bytes; the next sample shows them in RAM, GPU and EMC figures. Scenario
hooks inject what other processes do: :meth:`~SimulatedBoard.gpu_saturation`,
:meth:`~SimulatedBoard.memory_squeeze`, :meth:`~SimulatedBoard.thermal_throttle`. Time is the
simulator's own: :meth:`~SimulatedBoard.advance` steps it (tests, benchmarks); :meth:`read`
steps it in real time, ``speed`` times faster.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.targets import BoardFigures, Target, all_targets, get_target
from cuvil_edge.telemetry.base import TelemetrySource
from cuvil_edge.telemetry.sample import Sample

__all__ = ["BOARD_FIGURES", "BoardFigures", "Scenario", "SimulatedBoard"]

MiB = 1024 * 1024


# By board name, read from the board profiles; BoardFigures itself now lives in cuvil_edge.targets
# and is re-exported here, where the simulator's users have always found it.
BOARD_FIGURES: dict[str, BoardFigures] = {
    name: target.figures for name, target in all_targets().items() if target.figures is not None
}


@dataclass
class Scenario:
    """Something another process does between ``start`` and ``end`` (simulator seconds)."""

    kind: str  # "gpu_saturation" | "memory_squeeze" | "thermal_throttle"
    start: float
    end: float
    params: dict[str, float] = field(default_factory=dict)

    def active(self, t: float) -> bool:
        return self.start <= t < self.end

    def ramp(self, t: float) -> float:
        """0..1 progress through the ramp-in (``ramp_s``), 1 once ramped."""
        r = self.params.get("ramp_s", 0.0)
        return 1.0 if r <= 0 else max(0.0, min(1.0, (t - self.start) / r))


class SimulatedBoard(TelemetrySource):
    """Telemetry of a simulated board that answers the daemon's load.

    Args:
        board (str | Target): board profile name (``cuvil-edge targets``) or profile.
        interval_s (float): sampling interval in simulator seconds. Defaults to 1.0.
        speed (float): real-time factor for :meth:`read` (0: no waiting). Defaults to 1.0.
        seed (int): noise seed. Defaults to 0.
        noise_pct (float): standard deviation of the utilization noise, percent. Defaults to 2.
        os_used_mb (float): RAM the OS uses before the daemon starts. Defaults to 1100.
        ambient_c (float): ambient temperature. Defaults to 25.
        throttle_c (float): GPU throttling trip. Defaults to 95.
        start_epoch (float | None): wall-clock time of simulator second 0. Defaults to now.

    Raises:
        TargetError: unknown board name.
    """

    name = "sim"

    def __init__(
        self,
        board: str | Target = "orin-nano-8gb",
        interval_s: float = 1.0,
        *,
        speed: float = 1.0,
        seed: int = 0,
        noise_pct: float = 2.0,
        os_used_mb: float = 1100.0,
        ambient_c: float = 25.0,
        throttle_c: float = 95.0,
        start_epoch: float | None = None,
    ) -> None:
        super().__init__(interval_s)
        self.target = board if isinstance(board, Target) else get_target(board)
        self.figures = self.target.figures or BOARD_FIGURES["generic-arm64"]
        if speed < 0:
            raise TelemetryError(f"simulator speed must be >= 0, got {speed}")
        self.name = f"sim:{self.target.name}"
        self.speed = float(speed)
        self._rng = random.Random(seed)
        self.noise_pct = float(noise_pct)
        self.total_mb = self.target.ram_bytes / MiB
        self.swap_total_mb = self.total_mb / 2
        self.os_used_mb = float(os_used_mb)
        self.ambient_c = float(ambient_c)
        self.throttle_c = float(throttle_c)
        self.peak_bw_gbs = self.target.mem_bandwidth_gbs or 25.0
        self.start_epoch = time.time() if start_epoch is None else float(start_epoch)
        self.t = 0.0
        self.temp_c = self.ambient_c + 10.0
        self.clock_scale = 1.0  # GPU clock / max, < 1 while throttled
        self.swap_used_mb = 0.0
        self.scenarios: list[Scenario] = []
        # Recorded GPU clock and temperatures replayed over a window (replay_clock).
        self._clock_trace: list[tuple[float, float, dict[str, float]]] = []
        # What the daemon reported last.
        self.busy_fraction = 0.0
        self.resident_bytes = 0
        self.inflight_bytes = 0
        self.batch = 0
        self.bandwidth_gbs: float | None = None
        self.cpu_busy_cores = 0.0
        self.oom_events = 0
        self.samples_made = 0
        self._next_wall: float | None = None
        self._closed = False

    # ------------------------------------------------------------------ daemon side

    def report_load(
        self,
        busy_fraction: float | None = None,
        inflight_bytes: int | None = None,
        batch: int | None = None,
        *,
        resident_bytes: int | None = None,
        bandwidth_gbs: float | None = None,
        cpu_busy_cores: float | None = None,
    ) -> None:
        """Tell the board what the daemon does; unspecified figures keep their last value.

        Args:
            busy_fraction (float | None): fraction of the last interval the GPU ran our work.
            inflight_bytes (int | None): bytes of request/batch buffers in flight (prefetch).
            batch (int | None): the current batch size (reported in ``extra``).
            resident_bytes (int | None): models and runtimes loaded (weights, workspaces).
            bandwidth_gbs (float | None): DRAM traffic our work causes, GB/s.
            cpu_busy_cores (float | None): CPU cores kept busy by pre/post-processing.
        """
        if busy_fraction is not None:
            self.busy_fraction = max(0.0, min(1.0, float(busy_fraction)))
        if inflight_bytes is not None:
            self.inflight_bytes = max(0, int(inflight_bytes))
        if batch is not None:
            self.batch = int(batch)
        if resident_bytes is not None:
            self.resident_bytes = max(0, int(resident_bytes))
        if bandwidth_gbs is not None:
            self.bandwidth_gbs = max(0.0, float(bandwidth_gbs))
        if cpu_busy_cores is not None:
            self.cpu_busy_cores = max(0.0, float(cpu_busy_cores))

    # ------------------------------------------------------------------ scenario hooks

    def add_scenario(self, kind: str, start: float, duration: float, **params: float) -> Scenario:
        """Schedule ``kind`` at simulator time ``start`` for ``duration`` seconds."""
        if kind not in ("gpu_saturation", "memory_squeeze", "thermal_throttle"):
            raise TelemetryError(
                f"unknown scenario '{kind}'; use gpu_saturation, memory_squeeze or thermal_throttle"
            )
        sc = Scenario(kind, float(start), float(start) + float(duration), dict(params))
        self.scenarios.append(sc)
        return sc

    def gpu_saturation(self, start: float, duration: float, fraction: float = 0.9, emc_gbs: float | None = None) -> Scenario:
        """Another process keeps the GPU ``fraction`` busy (time-sliced with ours) and moves
        ``emc_gbs`` GB/s (default 30% of peak bandwidth)."""
        emc = 0.3 * self.peak_bw_gbs if emc_gbs is None else emc_gbs
        return self.add_scenario("gpu_saturation", start, duration, fraction=fraction, emc_gbs=emc)

    def memory_squeeze(self, start: float, duration: float, mb: float, ramp_s: float = 5.0) -> Scenario:
        """Another process allocates ``mb`` MB over ``ramp_s`` seconds and holds it."""
        return self.add_scenario("memory_squeeze", start, duration, mb=mb, ramp_s=ramp_s)

    def thermal_throttle(self, start: float, duration: float, ambient_rise_c: float = 45.0) -> Scenario:
        """The enclosure heats up (fan blocked): ambient rises by ``ambient_rise_c``."""
        return self.add_scenario("thermal_throttle", start, duration, ambient_rise_c=ambient_rise_c)

    def replay_clock(self, start: float, samples: list[Sample], gpu_max_mhz: float | None = None) -> float:
        """Replay recorded GPU clocks and temperatures from ``start`` (simulator seconds).

        Each recorded sample sets the clock scale (its GPU frequency over ``gpu_max_mhz``, the
        board's maximum by default) and the temperatures until the next one, at the recorded
        spacing; the thermal model takes over again after the last. Samples without a GPU
        frequency keep the previous scale. Returns the replay's end time.

        Raises:
            TelemetryError: no sample carries a GPU frequency.
        """
        top = float(gpu_max_mhz or self.figures.gpu_max_mhz or 0.0)
        if top <= 0 or not any(s.gpu_freq_mhz for s in samples):
            raise TelemetryError("replay_clock: the recorded samples carry no GPU frequency to replay")
        t0 = samples[0].timestamp
        scale = 1.0
        for s in samples:
            if s.gpu_freq_mhz:
                scale = max(0.05, min(1.0, float(s.gpu_freq_mhz) / top))
            self._clock_trace.append((float(start) + (s.timestamp - t0), scale, dict(s.temps_c or {})))
        self._clock_trace.sort(key=lambda x: x[0])
        return self._clock_trace[-1][0]

    def _replayed(self) -> tuple[float, dict[str, float]] | None:
        """The recorded (clock scale, temperatures) in force now, or None outside a replay."""
        cur = None
        for t, scale, temps in self._clock_trace:
            if t > self.t:
                break
            cur = (scale, temps)
        if cur is None or self.t > self._clock_trace[-1][0] + self.interval_s:
            return None
        return cur

    def _active(self, kind: str) -> list[Scenario]:
        return [s for s in self.scenarios if s.kind == kind and s.active(self.t)]

    # ------------------------------------------------------------------ model

    @property
    def other_gpu_fraction(self) -> float:
        return max((s.params.get("fraction", 0.9) for s in self._active("gpu_saturation")), default=0.0)

    @property
    def gpu_share(self) -> float:
        """Fraction of GPU time our work gets now (time-slicing with other processes)."""
        return 1.0 - self.other_gpu_fraction

    @property
    def other_mb(self) -> float:
        return sum(s.params.get("mb", 0.0) * s.ramp(self.t) for s in self._active("memory_squeeze"))

    @property
    def ram_used_mb(self) -> float:
        """RAM in use now: OS + other processes + daemon (before swapping)."""
        return self.os_used_mb + self.other_mb + (self.resident_bytes + self.inflight_bytes) / MiB

    @property
    def emc_util(self) -> float:
        ours = self.bandwidth_gbs if self.bandwidth_gbs is not None else 0.3 * self.peak_bw_gbs * self.busy_fraction
        other = sum(s.params.get("emc_gbs", 0.0) for s in self._active("gpu_saturation"))
        return min(1.0, (ours + other) / self.peak_bw_gbs)

    @property
    def emc_slowdown(self) -> float:
        """Factor (>= 1) by which memory-bound work slows under EMC contention: queueing on the
        memory controller grows sharply past ~70% utilization (assumption: 1 + 2·(u − 0.7)⁺/0.3)."""
        return 1.0 + 2.0 * max(0.0, self.emc_util - 0.7) / 0.3

    @property
    def speed_factor(self) -> float:
        """Relative speed of our GPU work now (1 = full clock, own GPU, free memory bus)."""
        return self.gpu_share * self.clock_scale / self.emc_slowdown

    def _noise(self, value: float) -> float:
        return value + self._rng.gauss(0.0, self.noise_pct) if self.noise_pct else value

    def advance(self, dt: float | None = None) -> Sample:
        """Step the simulator by ``dt`` seconds (default ``interval_s``) and return a sample."""
        dt = self.interval_s if dt is None else float(dt)
        if dt <= 0:
            raise TelemetryError(f"simulator step must be > 0 s, got {dt}")
        self.t += dt
        fig = self.figures
        gpu_util = min(1.0, self.other_gpu_fraction + self.busy_fraction * self.gpu_share)
        cpu_util = min(1.0, 0.05 + self.cpu_busy_cores / max(1, self.target.cores))
        emc = self.emc_util
        power = fig.idle_mw + (fig.max_mw - fig.idle_mw) * (0.6 * gpu_util + 0.25 * cpu_util + 0.15 * emc) * (
            0.5 + 0.5 * self.clock_scale
        )
        ambient = self.ambient_c + sum(s.params.get("ambient_rise_c", 0.0) for s in self._active("thermal_throttle"))
        target_t = ambient + 55.0 * power / fig.max_mw
        self.temp_c += (target_t - self.temp_c) * (1.0 - math.exp(-dt / 20.0))
        replayed = self._replayed() if self._clock_trace else None
        if replayed is not None:
            self.clock_scale = replayed[0]
            rec_temps = [v for v in replayed[1].values() if v is not None]
            if rec_temps:
                self.temp_c = max(rec_temps)
        elif self.temp_c >= self.throttle_c:
            self.clock_scale = max(0.5, self.clock_scale - 0.1 * dt)
        elif self.temp_c < self.throttle_c - 5.0:
            self.clock_scale = min(1.0, self.clock_scale + 0.1 * dt)
        used = self.ram_used_mb
        oom = used > self.total_mb
        if oom:
            self.oom_events += 1
        # zram takes what does not fit above 90% of RAM; it drains slowly when pressure goes.
        over = max(0.0, used - 0.9 * self.total_mb)
        if over > self.swap_used_mb:
            self.swap_used_mb = min(self.swap_total_mb, over)
        else:
            self.swap_used_mb = max(over, self.swap_used_mb - 20.0 * dt)
        shown_used = min(used, self.total_mb - 1.0)
        free = self.total_mb - shown_used
        lfb_size = 4096.0 if free > 256 else (2048.0 if free > 64 else 1024.0)
        lfb_count = max(0, int(free * 0.8 * 1024 / lfb_size))
        cores = self.target.cores
        cpus = [
            {"load_pct": round(max(0.0, min(100.0, self._noise(100 * cpu_util))), 1), "freq_mhz": fig.cpu_max_mhz}
            for _ in range(cores)
        ]
        gpu_freq = round(fig.gpu_max_mhz * self.clock_scale) if fig.gpu_max_mhz else None
        gpu_pct = round(max(0.0, min(100.0, self._noise(100 * gpu_util))), 1)
        rails = fig.rails
        power_mw: dict[str, dict[str, float | None]] = {rails[0]: {"cur": round(power), "avg": round(power)}}
        if len(rails) > 1:
            power_mw[rails[1]] = {"cur": round(power * 0.45 * gpu_util + 300), "avg": None}
        if len(rails) > 2:
            power_mw[rails[2]] = {"cur": round(power * 0.2 + 200), "avg": None}
        for v in power_mw.values():
            v["avg"] = v["cur"]
        temps = {"CPU": round(self.temp_c - 2.0, 3), "SOC0": round(self.temp_c - 3.0, 3), "tj": round(self.temp_c, 3)}
        if self.target.has_gpu:
            temps["GPU"] = round(self.temp_c - 1.0, 3)
        self.samples_made += 1
        return Sample(
            timestamp=self.start_epoch + self.t,
            ram_used_mb=round(shown_used, 1),
            ram_total_mb=round(self.total_mb, 1),
            lfb_count=lfb_count,
            lfb_size_kb=lfb_size,
            swap_used_mb=round(self.swap_used_mb, 1),
            swap_total_mb=round(self.swap_total_mb, 1),
            cpus=cpus,
            emc_util_pct=round(max(0.0, min(100.0, self._noise(100 * emc))), 1),
            emc_freq_mhz=fig.emc_max_mhz,
            gpu_util_pct=gpu_pct if (self.target.has_gpu and fig.gpu_util_reported) else None,
            gpu_freq_mhz=gpu_freq,
            temps_c=temps,
            power_mw=power_mw,
            extra={
                "sim_t": round(self.t, 3),
                "oom": oom,
                "batch": self.batch,
                "other_gpu_fraction": self.other_gpu_fraction,
                "other_mb": round(self.other_mb, 1),
                "clock_scale": round(self.clock_scale, 3),
            },
            source=self.name,
        )

    # ------------------------------------------------------------------ TelemetrySource

    def read(self, timeout: float | None = None) -> Sample:
        if self._closed:
            raise TelemetryError(f"{self.name} is closed")
        if self.speed > 0:
            now = time.monotonic()
            if self._next_wall is None:
                self._next_wall = now
            wait = self._next_wall - now
            if wait > 0:
                if timeout is not None and wait > timeout:
                    time.sleep(timeout)
                    raise TelemetryError(f"{self.name}: next sample {wait:.1f} s away, beyond the timeout")
                time.sleep(wait)
            self._next_wall = max(self._next_wall, now) + self.interval_s / self.speed
        return self.advance()

    def close(self) -> None:
        self._closed = True

    def get_status(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "t": self.t,
            "speed": self.speed,
            "ram_used_mb": round(self.ram_used_mb, 1),
            "temp_c": round(self.temp_c, 2),
            "clock_scale": self.clock_scale,
            "oom_events": self.oom_events,
            "scenarios": [f"{s.kind}@{s.start:g}-{s.end:g}" for s in self.scenarios],
        }
