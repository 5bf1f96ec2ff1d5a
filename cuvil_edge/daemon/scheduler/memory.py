"""Memory co-scheduler: a budget on the board's shared RAM, admission, and a pressure ladder.

On a Jetson the CPU and the integrated GPU share one LPDDR pool, and cgroup limits may not count
GPU (nvmap) allocations, so ``MemoryMax`` in the unit is only a backstop. This module
keeps the daemon inside a budget itself:

* **Budget** = board RAM − configured reserve − what *other* processes use, where "other" is the
  RAM telemetry reports in use minus what this daemon has accounted for. Re-evaluated at each
  sample (:meth:`MemoryScheduler.update`).
* **Admission**: before a model loads its footprint is estimated
  (:meth:`MemoryScheduler.estimate_footprint`: weights + runtime workspace + I/O buffers at max
  batch and prefetch depth) and reserved (:meth:`MemoryScheduler.admit`); a load that does not fit
  raises :class:`MemoryBudgetError` instead of risking the kernel's OOM killer. After loading,
  :meth:`MemoryScheduler.measure` replaces the estimate with the measured figure.
* **I/O buffers** come from ``cuvil_edge.runtime.buffers.BufferPool`` (reused arrays keyed by
  shape and dtype); :meth:`MemoryScheduler.attach_pool` counts a pool's idle bytes and empties it
  at ``RELEASE_IDLE``. :func:`placement_policy` says where those buffers live on a board.
* **Pressure ladder** driven by telemetry (free RAM, largest free block, swap growth, and our own
  headroom): ``SHRINK_PREFETCH`` → ``CAP_BATCH`` → ``RELEASE_IDLE`` (idle contexts, pooled
  buffers) → ``UNLOAD_LRU`` (least recently used idle model) → ``REJECT`` (new requests get 503 and
  ``Retry-After``). The level rises at once and falls one step at a time after ``calm_samples``
  quiet samples (hysteresis). Each step entered is logged and counted; the server registers
  callbacks with :meth:`MemoryScheduler.on_step` and reads :attr:`level`, :meth:`prefetch_cap`,
  :meth:`batch_cap`, :meth:`should_reject`.

Typical use by the server::

    sched = MemoryScheduler(target=get_target("orin-nano-8gb"), reserve_mb=768)
    monitor.subscribe(sched.update)
    sched.on_step(PressureLevel.UNLOAD_LRU, lambda name: repo.unload(name))
    need = sched.estimate_footprint(bundle / "model.onnx", max_batch=8, prefetch_depth=4,
                                    io_bytes_per_item=3 * 224 * 224 * 4 + 1000 * 4)
    sched.admit("resnet", need)          # raises MemoryBudgetError when it does not fit
    ... load ...
    sched.measure("resnet", rss_delta)
    with sched.using("resnet"): run the batch   # marks it busy, updates LRU order
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.telemetry.sample import Sample

if TYPE_CHECKING:
    from cuvil_edge.daemon.scheduler.kernel import KernelMemory
    from cuvil_edge.targets import Target

__all__ = [
    "MemoryBudgetError",
    "MemoryScheduler",
    "PlacementPolicy",
    "PressureLevel",
    "PressureThresholds",
    "Reservation",
    "placement_policy",
]

log = logging.getLogger(__name__)

MiB = 1024 * 1024


class MemoryBudgetError(DaemonError):
    """A model or buffer does not fit in the memory budget; the message gives the figures."""

    def __init__(self, message: str, *, name: str = "", needed: int = 0, available: int = 0) -> None:
        super().__init__(message)
        self.name = name
        self.needed = needed
        self.available = available


class PressureLevel(enum.IntEnum):
    """Steps of the pressure ladder, in the order they are taken."""

    NORMAL = 0
    SHRINK_PREFETCH = 1
    CAP_BATCH = 2
    RELEASE_IDLE = 3
    UNLOAD_LRU = 4
    REJECT = 5


@dataclass(frozen=True)
class PressureThresholds:
    """When each ladder step starts, as free RAM in percent of board RAM (tegrastats' view).

    ``free_pct[k]`` is the free-RAM level below which step ``k+1`` applies. ``exit_margin_pct`` is
    added when testing whether a step may be left (hysteresis), at most half the gap to the line
    above. A largest free block smaller than
    ``lfb_min_kb`` (fragmentation: no 4 MB block left) or fewer than ``lfb_min_blocks`` free
    blocks raise the level by one when RAM is already short (``free_pct[0]``), and swap growing
    faster than ``swap_growth_mb_s`` raises it by one in any case.
    Headroom of our own budget below ``headroom_pct`` of the budget asks for at least
    ``CAP_BATCH``; a negative headroom (others grew into our share) for ``UNLOAD_LRU``.
    With ``inflight_is_free`` the free-RAM lines count the daemon's own in-flight buffers
    (``set_dynamic_bytes``) as free: the ladder measures the pressure *others* put on the board,
    while the daemon's own buffers are bounded by :meth:`MemoryScheduler.prefetch_cap`, which
    sheds them within one batch time. Without it the daemon's own prefetch could push the ladder
    up and the ladder then starve the pipeline that caused it. The room that cap leaves above its
    guard line grows by ``growth_lookahead_s`` seconds of other processes' RAM growth, so buffers
    are shed before a fast-growing neighbour reaches them, not after.
    From the kernel (``MemoryScheduler(kernel=KernelMemory())``): PSI ``some`` avg10 at or above
    ``psi_some_pct`` raises the level by one (at least SHRINK_PREFETCH), ``full`` avg10 at or above
    ``psi_full_pct`` asks for UNLOAD_LRU, and a new OOM kill in the daemon's cgroup holds REJECT for
    ``oom_kill_hold_s``.
    ``UNLOAD_LRU`` never picks a model that served within ``unload_served_within_s``: a model
    with traffic is idle only between its requests, and unloading it fails all of them until it is
    back (found on the emulated board, where the ladder unloaded the one model under load once the
    idle ones were gone). Its load is shed by ``REJECT`` instead, with a retry hint.
    """

    free_pct: tuple[float, float, float, float, float] = (10.0, 7.0, 5.0, 3.5, 2.0)
    exit_margin_pct: float = 2.0
    lfb_min_kb: float = 4096.0
    lfb_min_blocks: int = 16
    swap_growth_mb_s: float = 8.0
    headroom_pct: float = 5.0
    calm_samples: int = 3
    inflight_is_free: bool = True
    psi_some_pct: float = 10.0
    psi_full_pct: float = 5.0
    oom_kill_hold_s: float = 3.0
    growth_lookahead_s: float = 1.0
    unload_served_within_s: float = 10.0


@dataclass
class Reservation:
    """Memory admitted for one model (or other consumer)."""

    name: str
    estimated_bytes: int
    measured_bytes: int | None = None
    admitted_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    last_served: float | None = None  # the last time it ran a batch or had requests in flight
    busy: int = 0
    context_released: bool = False
    # Board RAM in use when a load was admitted (None: unknown, or not a load). Until the load is
    # measured, the board's growth since then is the load's, up to its estimate, not others'.
    ram_used_at_admit: int | None = None

    @property
    def bytes(self) -> int:
        """The measured figure once known, else the estimate."""
        return self.measured_bytes if self.measured_bytes is not None else self.estimated_bytes

    @property
    def idle(self) -> bool:
        return self.busy == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "estimated_bytes": self.estimated_bytes,
            "measured_bytes": self.measured_bytes,
            "busy": self.busy,
            "idle_s": round(time.monotonic() - self.last_used, 3),
            "context_released": self.context_released,
        }


@dataclass(frozen=True)
class PlacementPolicy:
    """Where I/O tensors live on a device.

    ``kind`` is one of ``runtime.buffers.Placement`` names: ``"mapped"`` (zero-copy host memory
    the integrated GPU reads directly), ``"pinned"`` (page-locked host buffers plus device buffers
    and asynchronous copies, for discrete GPUs) or ``"pageable"`` (no GPU).
    """

    kind: str
    zero_copy: bool
    device_buffers: bool
    async_copies: bool
    reason: str


def placement_policy(target: Target | None) -> PlacementPolicy:
    """The I/O placement for a board profile (``cuvil_edge.targets.Target``).

    Integrated GPUs (every Jetson) share LPDDR with the CPU: mapped host memory avoids a copy and
    a second buffer. Discrete GPUs get pinned host memory with device buffers and async copies
    (measured with pycuda on an H200: 55 GB/s pinned vs 6.7 GB/s pageable host-to-device). Without a
    GPU plain pageable numpy arrays.
    """
    if target is None or not target.has_gpu:
        return PlacementPolicy("pageable", False, False, False, f"{target.name if target else '?'}: no GPU")
    if target.integrated_gpu:
        return PlacementPolicy(
            "mapped", True, False, False, f"{target.name}: integrated GPU shares LPDDR, zero-copy mapped memory"
        )
    return PlacementPolicy(
        "pinned", False, True, True, f"{target.name}: discrete GPU, pinned host + device buffers, async copies"
    )


StepCallback = Callable[..., Any]


class MemoryScheduler:
    """Keeps the daemon's memory inside a budget re-evaluated from telemetry.

    Args:
        total_bytes (int | None): board RAM. Defaults to the target's RAM, else this machine's.
        target (Target | None): board profile (``cuvil_edge.targets``), used for RAM.
        reserve_bytes (int | None): RAM left to the system whatever happens. Defaults to
            ``reserve_mb`` MiB, else 10% of RAM but at least 512 MiB.
        reserve_mb (float | None): the reserve in MiB (convenience for config files).
        thresholds (PressureThresholds | None): ladder thresholds. Defaults to
            ``PressureThresholds()``.
        clock (Callable[[], float]): monotonic clock (tests and the simulator pass their own).
            Defaults to ``time.monotonic``.
        kernel (KernelMemory | None): the kernel's signals (``/proc/meminfo``, PSI, the cgroup),
            read at each update: RAM is the tighter of the sample's and the kernel's, and the
            ladder also answers PSI and OOM kills in the cgroup. ``update(None)`` then works
            without a telemetry source. Defaults to None.
    """

    def __init__(
        self,
        total_bytes: int | None = None,
        *,
        target: Target | None = None,
        reserve_bytes: int | None = None,
        reserve_mb: float | None = None,
        thresholds: PressureThresholds | None = None,
        clock: Callable[[], float] | None = None,
        kernel: KernelMemory | None = None,
    ) -> None:
        if total_bytes is None:
            if target is not None:
                total_bytes = int(target.ram_bytes)
            else:
                total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if total_bytes <= 0:
            raise DaemonError(f"memory scheduler: board RAM must be > 0 bytes, got {total_bytes}")
        self.total_bytes = int(total_bytes)
        if reserve_bytes is None:
            reserve_bytes = int(reserve_mb * MiB) if reserve_mb is not None else max(512 * MiB, self.total_bytes // 10)
        if not 0 <= reserve_bytes < self.total_bytes:
            raise DaemonError(
                f"memory scheduler: reserve {reserve_bytes / MiB:.0f} MiB must be between 0 and board RAM "
                f"{self.total_bytes / MiB:.0f} MiB; lower 'memory.reserve_mb'"
            )
        self.reserve_bytes = int(reserve_bytes)
        self.thresholds = thresholds or PressureThresholds()
        self._clock = clock or time.monotonic
        self._lock = threading.RLock()
        self._res: dict[str, Reservation] = {}
        self._pools: list[Any] = []
        self.dynamic_bytes = 0  # in-flight request/batch buffers the server reports
        self.other_bytes = 0
        self.level = PressureLevel.NORMAL
        self.reason = "no telemetry yet"
        self._calm = 0
        self._nothing_to_unload = False  # UNLOAD_LRU found nothing (logged once until that changes)
        self._last_sample: Sample | None = None
        self._swap_prev: tuple[float, float] | None = None
        self.swap_growth_mb_s: float | None = None
        self.kernel = kernel
        self.kernel_reading: Any = None
        self._oom_kills: int | None = None
        self._oom_kill_seen_at: float | None = None
        self._other_prev: tuple[float, int] | None = None
        self.other_growth_mb_s: float | None = None  # how fast other processes take RAM (sustained)
        self._other_rates: tuple[float, float] = (0.0, 0.0)
        self.steps_total: dict[str, int] = {lvl.name: 0 for lvl in PressureLevel if lvl}
        self.rejected_admissions = 0
        self.samples_seen = 0
        self.peak_used_bytes = 0
        self._callbacks: dict[PressureLevel, list[StepCallback]] = {lvl: [] for lvl in PressureLevel}
        self._level_listeners: list[Callable[[PressureLevel, PressureLevel, str], Any]] = []
        self.events: list[dict[str, Any]] = []  # last ladder transitions (bounded)

    # ------------------------------------------------------------------ budget

    @property
    def used_bytes(self) -> int:
        """What the daemon has accounted for: reservations, in-flight buffers, idle pooled buffers."""
        with self._lock:
            pooled = sum(int(getattr(p, "idle_bytes", 0)) for p in self._pools)
            return sum(r.bytes for r in self._res.values()) + self.dynamic_bytes + pooled

    def attach_pool(self, pool: Any) -> None:
        """Account an I/O buffer pool (``cuvil_edge.runtime.buffers.BufferPool``): its idle bytes
        count as ours, and the ``RELEASE_IDLE`` step empties it (``pool.clear()``)."""
        with self._lock:
            if pool not in self._pools:
                self._pools.append(pool)

    @property
    def budget_bytes(self) -> int:
        """Board RAM − reserve − other processes (never below 0)."""
        return max(0, self.total_bytes - self.reserve_bytes - self.other_bytes)

    @property
    def headroom_bytes(self) -> int:
        """Budget left for new admissions (negative when others grew into our share)."""
        return self.budget_bytes - self.used_bytes

    def set_dynamic_bytes(self, nbytes: int) -> None:
        """Report the bytes held by in-flight requests and batches (prefetch buffers)."""
        with self._lock:
            self.dynamic_bytes = max(0, int(nbytes))
            self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)

    # ------------------------------------------------------------------ admission

    @staticmethod
    def estimate_footprint(
        model_path: str | os.PathLike[str],
        max_batch: int,
        prefetch_depth: int,
        io_bytes_per_item: int,
        *,
        workspace_bytes: int | None = None,
        activation_factor: float = 4.0,
        runtime_overhead_bytes: int = 48 * MiB,
    ) -> int:
        """Estimate a model's resident memory before loading it.

        weights = size of the model file (``model.onnx`` or an engine; a bundle directory reads
        ``manifest.json``'s ``model``); workspace = ``workspace_bytes`` if given, else runtime
        overhead (session, allocator, kernels: 48 MiB) + half the weights (optimized/pre-packed
        copies ONNX Runtime keeps) + ``activation_factor`` × one item's I/O × ``max_batch``
        (intermediate activations scale with the batch); I/O = ``io_bytes_per_item`` ×
        ``max_batch`` × (``prefetch_depth`` + 1) (the batches prefetched plus the one running).
        :meth:`measure` replaces the estimate after loading.

        Raises:
            DaemonError: the model file is missing or the sizes are not positive.
        """
        path = Path(model_path)
        if path.is_dir():
            from cuvil_edge.bundle.manifest import DEFAULT_MODEL, Manifest

            model_name = DEFAULT_MODEL
            if (path / "manifest.json").is_file():
                try:
                    model_name = Manifest.load(path, complete=False).model
                except CuvilEdgeError as exc:
                    raise DaemonError(f"cannot estimate memory of '{path}': {exc}") from exc
            path = path / model_name
        if not path.is_file():
            raise DaemonError(f"cannot estimate memory of '{path}': no such model file")
        if max_batch < 1 or prefetch_depth < 0 or io_bytes_per_item < 0:
            raise DaemonError(
                f"estimate_footprint: max_batch ({max_batch}) must be >= 1, prefetch_depth ({prefetch_depth}) "
                f"and io_bytes_per_item ({io_bytes_per_item}) >= 0"
            )
        weights = path.stat().st_size
        if workspace_bytes is None:
            workspace_bytes = int(runtime_overhead_bytes + weights // 2 + activation_factor * io_bytes_per_item * max_batch)
        io = io_bytes_per_item * max_batch * (prefetch_depth + 1)
        return int(weights + workspace_bytes + io)

    def admit(self, name: str, nbytes: int, *, loading: bool = True) -> Reservation:
        """Reserve ``nbytes`` for ``name`` (replacing an earlier reservation of the same name).

        ``loading`` says the reservation is for something being loaded now (a model), whose
        growth until :meth:`measure` is counted as the daemon's, not as other processes'. Without
        it a load was counted twice (its estimate, and its real growth as "others"), pushed the
        daemon over its budget and unloaded another idle model, which was loaded again once calm
        and unloaded the first: a reload ping-pong found on the emulated board. Pass
        ``loading=False`` for capacity reserved ahead of use (request buffers).

        Raises:
            MemoryBudgetError: it does not fit the budget, or the ladder is at ``REJECT``.
        """
        nbytes = int(nbytes)
        if nbytes < 0:
            raise DaemonError(f"admit('{name}'): bytes must be >= 0, got {nbytes}")
        with self._lock:
            old = self._res.get(name)
            others = self.used_bytes - (old.bytes if old else 0)
            available = self.budget_bytes - others
            if nbytes > available or self.level >= PressureLevel.REJECT:
                self.rejected_admissions += 1
                why = "memory pressure is at REJECT" if self.level >= PressureLevel.REJECT else "it does not fit"
                msg = (
                    f"cannot load '{name}': needs {nbytes / MiB:.1f} MiB but {max(0, available) / MiB:.1f} MiB of the "
                    f"{self.budget_bytes / MiB:.1f} MiB budget is free ({why}; board {self.total_bytes / MiB:.0f} MiB, "
                    f"reserve {self.reserve_bytes / MiB:.0f} MiB, other processes {self.other_bytes / MiB:.0f} MiB, "
                    f"daemon {others / MiB:.1f} MiB); unload a model, lower max_batch/prefetch depth or the reserve"
                )
                log.warning(msg)
                raise MemoryBudgetError(msg, name=name, needed=nbytes, available=max(0, available))
            last = self._last_sample
            at = int(last.ram_used_mb * MiB) if loading and last is not None and last.ram_used_mb is not None else None
            res = Reservation(name, nbytes, admitted_at=self._clock(), last_used=self._clock(), ram_used_at_admit=at)
            self._res[name] = res
            self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
            log.info("admitted '%s': %.1f MiB (headroom now %.1f MiB)", name, nbytes / MiB, self.headroom_bytes / MiB)
            return res

    def measure(self, name: str, actual_bytes: int) -> None:
        """Replace the estimate for ``name`` with the measured resident size."""
        with self._lock:
            res = self._require(name)
            delta = int(actual_bytes) - res.estimated_bytes
            res.measured_bytes = int(actual_bytes)
            res.ram_used_at_admit = None
            self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
            log.info(
                "measured '%s': %.1f MiB (estimate %.1f MiB, %+.1f MiB)",
                name, actual_bytes / MiB, res.estimated_bytes / MiB, delta / MiB,
            )

    def loaded(self, name: str) -> None:
        """``name``'s load is over without a measurement: its estimate stands, and the board's
        growth from now on is others' again. Unknown names are ignored."""
        with self._lock:
            res = self._res.get(name)
            if res is not None:
                res.ram_used_at_admit = None

    def release(self, name: str) -> None:
        """Forget ``name``'s reservation (after unloading). Unknown names are ignored."""
        with self._lock:
            res = self._res.pop(name, None)
        if res is not None:
            log.info("released '%s': %.1f MiB", name, res.bytes / MiB)

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._res.values())

    def _require(self, name: str) -> Reservation:
        try:
            return self._res[name]
        except KeyError:
            raise DaemonError(f"no memory reservation named '{name}'; call admit() first") from None

    # ------------------------------------------------------------------ usage tracking (LRU)

    def touch(self, name: str) -> None:
        """Record a use of ``name`` (LRU order)."""
        with self._lock:
            res = self._res.get(name)
            if res is not None:
                res.last_used = res.last_served = self._clock()
                res.context_released = False

    def begin_use(self, name: str) -> None:
        """Mark ``name`` busy (a batch is in flight); busy models are never released or unloaded."""
        with self._lock:
            res = self._res.get(name)
            if res is not None:
                res.busy += 1
                res.last_used = res.last_served = self._clock()
                res.context_released = False

    def end_use(self, name: str) -> None:
        """Undo one :meth:`begin_use`."""
        with self._lock:
            res = self._res.get(name)
            if res is not None and res.busy > 0:
                res.busy -= 1
                res.last_used = res.last_served = self._clock()

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        """Mark ``name`` busy for the duration of the block (:meth:`begin_use`/:meth:`end_use`)."""
        self.begin_use(name)
        try:
            yield
        finally:
            self.end_use(name)

    def lru_idle(self, exclude: set[str] | None = None, served_within_s: float = 0.0) -> str | None:
        """The least recently used idle model, or None.

        With ``served_within_s``, a model that served within that many seconds is not a candidate:
        it is idle only between two requests of its traffic, and unloading it would fail every
        request until it loads again (the ladder's ``REJECT`` sheds that load with a retry hint).
        """
        now = self._clock()
        with self._lock:
            idle = [r for r in self._res.values() if r.idle and r.name not in (exclude or set())
                    and (r.last_served is None or now - r.last_served >= served_within_s)]
            return min(idle, key=lambda r: r.last_used).name if idle else None

    # ------------------------------------------------------------------ pressure ladder

    def on_step(self, level: PressureLevel, callback: StepCallback) -> None:
        """Call ``callback`` whenever the ladder enters ``level``.

        ``RELEASE_IDLE`` callbacks get ``names`` (idle models whose contexts may be dropped),
        ``UNLOAD_LRU`` callbacks get ``name`` (the model to unload; call :meth:`release` after),
        the others get no argument. Exceptions are logged, not raised.
        """
        self._callbacks[PressureLevel(level)].append(callback)

    def on_level_change(self, callback: Callable[[PressureLevel, PressureLevel, str], Any]) -> None:
        """Call ``callback(new, old, reason)`` on every level change."""
        self._level_listeners.append(callback)

    def _raw_level(self, sample: Sample, margin: float) -> tuple[PressureLevel, str]:
        th = self.thresholds
        level = PressureLevel.NORMAL
        reasons: list[str] = []
        free_mb = sample.ram_free_mb
        total_mb = sample.ram_total_mb or self.total_bytes / MiB
        if free_mb is not None and th.inflight_is_free:
            # Our own in-flight buffers are not pressure from others: the depth cap
            # (prefetch_cap with batch_bytes) gives them back within one batch time.
            free_mb += self.dynamic_bytes / MiB
        if free_mb is not None and total_mb:
            free_pct = 100.0 * free_mb / total_mb
            for k, limit in enumerate(th.free_pct):
                # The exit margin is capped at half the gap to the line above: a margin wider than
                # the spacing of the lines would hold a level two lines up after a brief spike
                # (swap growth, fragmentation) had raised it there.
                m = margin if k == 0 else min(margin, 0.5 * (th.free_pct[k - 1] - limit))
                if free_pct < limit + m:
                    level = PressureLevel(k + 1)
            if level:
                reasons.append(f"free RAM {free_pct:.1f}%")
        # A small largest-free-block only matters once RAM is short: recorded lines show an idle
        # AGX Orin 64GB at 4% RAM used reporting "lfb 2x4MB" (tests/data/tegrastats/orin_jp6.log).
        fragmented = (
            sample.lfb_size_kb is not None
            and sample.lfb_count is not None
            and (sample.lfb_size_kb < th.lfb_min_kb or sample.lfb_count < th.lfb_min_blocks)
        )
        if fragmented and level:
            level = PressureLevel(min(PressureLevel.REJECT, level + 1))
            reasons.append(f"largest free block {sample.lfb_count}x{sample.lfb_size_kb:.0f}kB")
        if self.swap_growth_mb_s is not None and self.swap_growth_mb_s > th.swap_growth_mb_s:
            level = PressureLevel(min(PressureLevel.REJECT, level + 1))
            reasons.append(f"swap growing {self.swap_growth_mb_s:.1f} MB/s")
        psi = self.kernel_reading.pressure if self.kernel_reading is not None else None
        if psi is not None:
            # Stalls are the kernel saying reclaim is not keeping up, before any OOM kill.
            if psi.full_avg10 is not None and psi.full_avg10 >= th.psi_full_pct - margin:
                level = max(level, PressureLevel.UNLOAD_LRU)
                reasons.append(f"PSI full {psi.full_avg10:.1f}%")
            elif psi.some_avg10 >= th.psi_some_pct - margin:
                level = PressureLevel(min(PressureLevel.REJECT, max(level + 1, PressureLevel.SHRINK_PREFETCH)))
                reasons.append(f"PSI some {psi.some_avg10:.1f}%")
        if self._oom_kill_seen_at is not None and self._clock() - self._oom_kill_seen_at < th.oom_kill_hold_s:
            level = PressureLevel.REJECT
            reasons.append("OOM kill in the daemon's cgroup")
        budget = self.budget_bytes
        headroom = self.headroom_bytes
        if headroom < 0 and self._res:
            level = max(level, PressureLevel.UNLOAD_LRU)
            reasons.append(f"daemon {-headroom / MiB:.0f} MiB over budget")
        elif budget > 0 and headroom < (th.headroom_pct + margin) / 100.0 * budget and self.used_bytes > 0:
            level = max(level, PressureLevel.CAP_BATCH)
            reasons.append(f"headroom {headroom / MiB:.0f} MiB")
        return level, ", ".join(reasons) or "ok"

    def _with_kernel(self, sample: Sample | None) -> Sample | None:
        """Read the kernel (when given) and tighten ``sample``'s RAM figures with it."""
        if self.kernel is None:
            return sample
        try:
            reading = self.kernel.read()
        except Exception as exc:  # a vanished cgroup must not stop the ladder
            log.debug("kernel memory signals unreadable: %s", exc)
            return sample
        self.kernel_reading = reading
        kills = reading.cgroup.oom_kills if reading.cgroup is not None else None
        if kills is not None:
            if self._oom_kills is not None and kills > self._oom_kills:
                self._oom_kill_seen_at = self._clock()
                log.warning("memory: %d OOM kill(s) in the daemon's cgroup", kills - self._oom_kills)
            self._oom_kills = kills
        ksample = self.kernel.sample(reading)
        if sample is None:
            return ksample
        free = sample.ram_free_mb
        kfree = ksample.ram_free_mb
        if kfree is not None and (free is None or kfree < free):
            return dataclasses.replace(sample, ram_used_mb=ksample.ram_used_mb, ram_total_mb=ksample.ram_total_mb)
        return sample

    def update(self, sample: Sample | None) -> PressureLevel:
        """Re-evaluate the budget and the ladder from a telemetry sample; returns the level.

        With a ``kernel`` reader the sample's RAM is tightened by the kernel's view, and ``None``
        (no telemetry source) uses the kernel's view alone. Safe to pass as a
        :class:`~cuvil_edge.telemetry.TelemetryMonitor` subscriber.
        """
        sample = self._with_kernel(sample)
        if sample is None:
            return self.level
        actions: list[tuple[PressureLevel, dict[str, Any]]] = []
        with self._lock:
            self.samples_seen += 1
            if sample.ram_used_mb is not None:
                ours = sum(r.bytes for r in self._res.values() if r.measured_bytes is not None) + self.dynamic_bytes
                ours += self._loading_growth(int(sample.ram_used_mb * MiB))
                self.other_bytes = max(0, int(sample.ram_used_mb * MiB) - ours)
                if self._other_prev is None or sample.timestamp - self._other_prev[0] >= 0.25:
                    if self._other_prev is not None:
                        dt = sample.timestamp - self._other_prev[0]
                        rate = (self.other_bytes - self._other_prev[1]) / MiB / dt
                        # Sustained growth only: the lesser of the last two rates, so buffers of
                        # others that come and go (capture rings, page cache) do not count.
                        self._other_rates = (self._other_rates[1], rate)
                        self.other_growth_mb_s = min(self._other_rates)
                    self._other_prev = (sample.timestamp, self.other_bytes)
            if sample.swap_used_mb is not None:
                # A rate needs a time base: samples closer than 0.25 s (a fast replay) keep the last one.
                if self._swap_prev is None or sample.timestamp - self._swap_prev[0] >= 0.25:
                    if self._swap_prev is not None:
                        dt = sample.timestamp - self._swap_prev[0]
                        self.swap_growth_mb_s = (sample.swap_used_mb - self._swap_prev[1]) / dt
                    self._swap_prev = (sample.timestamp, sample.swap_used_mb)
            self._last_sample = sample
            old = self.level
            raw, reason = self._raw_level(sample, 0.0)
            if raw > old:
                self.level, self.reason, self._calm = raw, reason, 0
            elif raw < old:
                # Leave a step only when the reading clears it with a margin, calm_samples times running.
                exit_raw, _ = self._raw_level(sample, self.thresholds.exit_margin_pct)
                if exit_raw < old:
                    self._calm += 1
                    if self._calm >= self.thresholds.calm_samples:
                        self.level, self.reason, self._calm = PressureLevel(old - 1), reason, 0
                else:
                    self._calm = 0
            else:
                self._calm = 0
                self.reason = reason
            new = self.level
            if new > old:
                for lvl in range(old + 1, new + 1):
                    actions.append((PressureLevel(lvl), {}))
            elif new >= PressureLevel.UNLOAD_LRU and self.headroom_bytes < 0:
                actions.append((PressureLevel.UNLOAD_LRU, {}))  # still over budget: unload another
            if new != old:
                self._nothing_to_unload = False
                self.events.append({"t": sample.timestamp, "from": old.name, "to": new.name, "reason": self.reason})
                del self.events[:-100]
                log.warning("memory pressure %s -> %s (%s)", old.name, new.name, self.reason)
        if new != old:
            for cb in list(self._level_listeners):
                self._safe(cb, new, old, self.reason)
        for lvl, _ in actions:
            self._take_step(lvl)
        return self.level

    def _loading_growth(self, ram_used: int) -> int:
        """Bytes of the board's growth that belong to loads in progress (caller holds the lock).

        The growth since the earliest unmeasured load was admitted, at most what those loads were
        admitted for; a neighbour growing during a load is thus counted as ours up to the
        estimate, which ``used_bytes`` holds in full anyway, so headroom never counts it twice.
        """
        pending = [r for r in self._res.values() if r.measured_bytes is None and r.ram_used_at_admit is not None]
        if not pending:
            return 0
        growth = max(0, ram_used - min(r.ram_used_at_admit for r in pending if r.ram_used_at_admit is not None))
        return min(growth, sum(r.estimated_bytes for r in pending))

    def _take_step(self, lvl: PressureLevel) -> None:
        kwargs: dict[str, Any] = {}
        with self._lock:
            if lvl == PressureLevel.RELEASE_IDLE:
                names = [r.name for r in self._res.values() if r.idle and not r.context_released]
                for r in self._res.values():
                    if r.name in names:
                        r.context_released = True
                kwargs = {"names": names}
                for pool in self._pools:
                    try:
                        pool.clear()
                    except Exception:  # a pool that cannot clear must not stop the ladder
                        log.exception("clearing buffer pool %r failed", pool)
            elif lvl == PressureLevel.UNLOAD_LRU:
                name = self.lru_idle(served_within_s=self.thresholds.unload_served_within_s)
                if name is None:
                    # Once per stay at this level: the step is retried every sample while over budget.
                    if not self._nothing_to_unload:
                        log.warning("memory pressure UNLOAD_LRU: no idle model to unload (models that served in "
                                    "the last %.0f s are kept)", self.thresholds.unload_served_within_s)
                    self._nothing_to_unload = True
                    return
                self._nothing_to_unload = False
                kwargs = {"name": name}
            self.steps_total[lvl.name] += 1
        log.warning("memory pressure step %s %s", lvl.name, kwargs or "")
        for cb in list(self._callbacks[lvl]):
            self._safe(cb, **kwargs)

    @staticmethod
    def _safe(cb: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            cb(*args, **kwargs)
        except Exception:  # a failing action must not stop the scheduler
            log.exception("memory scheduler callback %r failed", cb)

    # ------------------------------------------------------------------ what the server applies

    def prefetch_cap(self, max_depth: int, min_depth: int = 1, batch_bytes: int | None = None) -> int:
        """The deepest prefetch allowed now.

        Without ``batch_bytes``: ``max_depth`` normally, half at SHRINK_PREFETCH, ``min_depth``
        from CAP_BATCH up. With ``batch_bytes`` (what one batch in flight holds) the steps below
        UNLOAD_LRU cap the depth to what *fits*: the batches whose bytes, with those in flight now,
        leave free RAM above a guard line just over
        REJECT (:meth:`_room_bytes`). So a
        squeeze that leaves room for three batches keeps three, not one: halving blindly starves
        the device while the RAM it frees is not needed. From UNLOAD_LRU up: ``min_depth``.
        """
        if self.level >= PressureLevel.UNLOAD_LRU:
            return min_depth
        if self.level >= PressureLevel.SHRINK_PREFETCH:
            room = self._room_bytes() if batch_bytes and batch_bytes > 0 else None
            if room is not None and batch_bytes:
                return max(min_depth, min(max_depth, int(room // batch_bytes)))
            if self.level >= PressureLevel.CAP_BATCH:
                return min_depth
            return max(min_depth, max_depth // 2)
        return max_depth

    def batch_cap(self, max_batch: int, item_bytes: int | None = None) -> int:
        """The largest batch allowed now: half of ``max_batch`` from CAP_BATCH up (each later step
        adds its own measure rather than squeezing batches further).

        With ``item_bytes`` (what one request in flight holds) the depth cap of
        :meth:`prefetch_cap` already bounds the bytes in flight, so below UNLOAD_LRU the batch is
        cut only when one full batch does not fit in the room: halving it anyway costs throughput
        (each batch pays the fixed launch cost) and frees nothing the depth cap did not.
        """
        if self.level >= PressureLevel.CAP_BATCH:
            room = self._room_bytes() if item_bytes else None
            if room is not None and item_bytes and self.level < PressureLevel.UNLOAD_LRU:
                return max(1, min(max_batch, int(room // item_bytes)))
            return max(1, max_batch // 2)
        return max_batch

    def _room_bytes(self) -> float | None:
        """Bytes the daemon may hold in flight: those in flight now plus the free RAM above a guard
        line halfway between the UNLOAD_LRU and REJECT lines (2.75% of RAM by default), so the
        daemon's own buffers never push the board into rejecting requests. The sum does not change as the daemon's own
        buffers grow (free RAM falls by what they gain), so the cap it gives is stable. None
        without a free-RAM reading."""
        sample = self._last_sample
        free_mb = sample.ram_free_mb if sample is not None else None
        if free_mb is None:
            return None
        total_mb = sample.ram_total_mb if sample is not None and sample.ram_total_mb else self.total_bytes / MiB
        th = self.thresholds
        guard_mb = (th.free_pct[4] + 0.5 * (th.free_pct[3] - th.free_pct[4])) / 100.0 * total_mb
        # Others growing: keep free what they take before the next decisions can shed buffers.
        guard_mb += max(0.0, self.other_growth_mb_s or 0.0) * th.growth_lookahead_s
        return max(0.0, self.dynamic_bytes + (free_mb - guard_mb) * MiB)

    def should_reject(self) -> bool:
        """True while new requests must get 503 with ``Retry-After``."""
        return self.level >= PressureLevel.REJECT

    @property
    def retry_after_s(self) -> int:
        """Seconds a rejected client should wait: a few telemetry intervals."""
        return 2 if self.level >= PressureLevel.REJECT else 1

    # ------------------------------------------------------------------ metrics

    def snapshot(self) -> dict[str, Any]:
        """Plain figures for ``/metrics`` and logs."""
        with self._lock:
            return {
                "total_bytes": self.total_bytes,
                "reserve_bytes": self.reserve_bytes,
                "other_bytes": self.other_bytes,
                "budget_bytes": self.budget_bytes,
                "used_bytes": self.used_bytes,
                "dynamic_bytes": self.dynamic_bytes,
                "headroom_bytes": self.headroom_bytes,
                "peak_used_bytes": self.peak_used_bytes,
                "level": int(self.level),
                "level_name": self.level.name,
                "reason": self.reason,
                "steps_total": dict(self.steps_total),
                "rejected_admissions": self.rejected_admissions,
                "swap_growth_mb_s": self.swap_growth_mb_s,
                "kernel": self.kernel_reading.to_dict() if self.kernel_reading is not None else None,
                "models": {r.name: r.to_dict() for r in self._res.values()},
            }
