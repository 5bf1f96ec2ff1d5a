"""Public names of the telemetry and scheduler packages are pinned; every submodule imports."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import cuvil_edge.daemon.scheduler as scheduler
import cuvil_edge.telemetry as telemetry

TELEMETRY = {
    "AUTO_CHAIN", "BOARD_FIGURES", "JtopSource", "NON_DIE_SENSORS", "ReplaySource", "Sample", "Scenario",
    "SimulatedBoard", "SourceExhausted", "SysfsSource", "TegrastatsSource", "TelemetryMonitor",
    "TelemetrySource", "expand_spec", "load_log", "open_source", "parse_tegrastats_line", "sample_from_jtop",
}
SCHEDULER = {
    "KernelMemory",
    "MemoryBudgetError", "MemoryScheduler", "PlacementPolicy", "PrefetchController", "PrefetchDecision",
    "PressureLevel", "PressureThresholds", "Reservation", "placement_policy",
}


@pytest.mark.parametrize(("module", "names"), [(telemetry, TELEMETRY), (scheduler, SCHEDULER)])
def test_exported_names(module, names: set[str]) -> None:
    assert set(module.__all__) == names
    for name in names:
        assert getattr(module, name) is not None


@pytest.mark.parametrize("package", [telemetry, scheduler])
def test_every_submodule_imports_without_extras(package) -> None:
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        mod = importlib.import_module(info.name)
        assert hasattr(mod, "__all__"), info.name


def test_systemd_module_imports() -> None:
    mod = importlib.import_module("cuvil_edge.daemon.systemd")
    assert {"notify", "Watchdog", "ready", "status", "stopping"} <= set(mod.__all__)
