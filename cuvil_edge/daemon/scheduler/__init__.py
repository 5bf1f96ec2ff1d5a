"""Memory co-scheduler and adaptive prefetch for the daemon (issue #4).

``MemoryScheduler`` keeps the daemon inside a RAM budget re-evaluated from telemetry and runs the
pressure ladder; ``PrefetchController`` picks the pipeline depth. Both are plain objects driven by
:meth:`update` calls, so the server, the simulator and the tests use them the same way.
"""

from __future__ import annotations

from cuvil_edge.daemon.scheduler.kernel import KernelMemory
from cuvil_edge.daemon.scheduler.memory import (
    MemoryBudgetError,
    MemoryScheduler,
    PlacementPolicy,
    PressureLevel,
    PressureThresholds,
    Reservation,
    placement_policy,
)
from cuvil_edge.daemon.scheduler.prefetch import PrefetchController, PrefetchDecision

__all__ = [
    "KernelMemory",
    "MemoryBudgetError",
    "MemoryScheduler",
    "PlacementPolicy",
    "PrefetchController",
    "PrefetchDecision",
    "PressureLevel",
    "PressureThresholds",
    "Reservation",
    "placement_policy",
]
