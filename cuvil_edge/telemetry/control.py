"""What a simulation needs from the daemon's schedulers, as Protocols (telemetry sits below the daemon).

:class:`~cuvil_edge.telemetry.pipeline_sim.PipelineSim` drives the daemon's memory co-scheduler
and prefetch controller exactly as the daemon wires them, but telemetry may not import the daemon
(the daemon imports telemetry). These protocols name the members the simulation calls, with the
daemon's own signatures; ``cuvil_edge.daemon.scheduler.MemoryScheduler`` and
``PrefetchController`` satisfy them structurally, which a test checks parameter by parameter and
mypy checks where the simulation is built (bench, tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cuvil_edge.telemetry.sample import Sample

__all__ = ["DepthControl", "DepthInputs", "MemoryControl"]


@dataclass(frozen=True)
class DepthInputs:
    """One interval's measurements for a prefetch depth step, as one value (not eleven arguments).

    The daemon builds it each tick from a model's stage counters (``daemon/resources.py``); the
    pipeline simulation from its simulated stages.

    Args:
        queue_delay_p95_ms (float | None): p95 of the time requests waited in the queue over the
            interval.
        latency_target_ms (float | None): the model's p95 latency objective (manifest
            ``latency_target_ms.p95``).
        memory_level (int): the memory scheduler's ladder level (0 = comfortable).
        gpu_busy_pct (float | None): the daemon's own device occupancy (percent of wall time a batch
            of ours was executing). Preferred over the sample's GPU utilization: GR3D counts other
            processes too, and Thor or tegrastats without sudo print none.
        prefetch_wait_p95_ms (float | None): p95 of the time a prepared batch waited for the device.
            It tells whether depth causes the queue delay: when batches are ready long before the
            device takes them, depth only adds latency and memory; when they wait for nothing the
            device is starving and depth can help. Without it every queue delay is blamed on depth.
        exec_ms (float | None): mean execution time of a batch; the yardstick for
            ``prefetch_wait_p95_ms``. Defaults to a tenth of the latency target.
        depth_blocked_pct (float | None): percent of the interval the batcher had requests waiting
            but no free slot (depth was the limit). Going deeper only helps then. Without it an
            under-used GPU is always taken as a reason to go deeper.
        completed_per_s (float | None): requests (items) completed per second (the rate of
            ``nv_inference_count``): what a deeper step is judged by; without it the device
            occupancy stands in for it.
        pre_ms (float | None): mean time preparing one batch took (its own processing, not its wait
            for a worker). With ``exec_ms`` it gives the depth that keeps the device fed (Little's
            law); without it the controller probes instead.
        pre_workers (int | None): batches that can be prepared at once (worker threads); one more
            than this is the deepest depth that can still help.
    """

    queue_delay_p95_ms: float | None = None
    latency_target_ms: float | None = None
    memory_level: int = 0
    gpu_busy_pct: float | None = None
    prefetch_wait_p95_ms: float | None = None
    exec_ms: float | None = None
    depth_blocked_pct: float | None = None
    completed_per_s: float | None = None
    pre_ms: float | None = None
    pre_workers: int | None = None


@runtime_checkable
class DepthControl(Protocol):
    """Adaptive prefetch depth (the daemon's ``PrefetchController``): one control step per sample."""

    depth: int
    max_depth: int
    changes: int
    direction_changes: int

    def step(self, sample: Sample | None, inputs: DepthInputs) -> int:
        """Take one control step and return the depth to use."""
        ...


@runtime_checkable
class MemoryControl(Protocol):
    """Memory budget and pressure ladder (the daemon's ``MemoryScheduler``)."""

    @property
    def used_bytes(self) -> int:
        """Bytes reserved, in flight and pooled now."""
        ...

    @property
    def budget_bytes(self) -> int:
        """Bytes the daemon may hold now."""
        ...

    @property
    def reserve_bytes(self) -> int:
        """Bytes kept free for the system."""
        ...

    @property
    def steps_total(self) -> Mapping[str, int]:
        """How often each pressure step was taken, by level name."""
        ...

    def admit(self, name: str, nbytes: int) -> object:
        """Reserve ``nbytes`` for model ``name``; raises when it does not fit."""
        ...

    def measure(self, name: str, actual_bytes: int) -> None:
        """Replace the estimate for ``name`` with its measured size."""
        ...

    def begin_use(self, name: str) -> None:
        """Mark ``name`` busy (a batch is in flight)."""
        ...

    def end_use(self, name: str) -> None:
        """Undo one :meth:`begin_use`."""
        ...

    def set_dynamic_bytes(self, nbytes: int) -> None:
        """Report the bytes held by in-flight requests and batches."""
        ...

    def update(self, sample: Sample | None) -> int:
        """Re-evaluate the ladder from a sample; returns the pressure level (0 = normal)."""
        ...

    def should_reject(self) -> bool:
        """True while new requests must be refused."""
        ...

    def batch_cap(self, max_batch: int, item_bytes: int | None = None) -> int:
        """The largest batch allowed now."""
        ...

    def prefetch_cap(self, max_depth: int, min_depth: int = 1, batch_bytes: int | None = None) -> int:
        """The deepest prefetch allowed now."""
        ...
