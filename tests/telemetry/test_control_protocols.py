"""The simulator's scheduler protocols match the daemon's schedulers, and telemetry never imports the daemon."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from cuvil_edge.daemon.scheduler import MemoryScheduler, PrefetchController
from cuvil_edge.telemetry.control import DepthControl, MemoryControl
from cuvil_edge.telemetry.pipeline_sim import PipelineSim
from cuvil_edge.telemetry.sim import SimulatedBoard

MiB = 1024 * 1024


def _protocol_methods(proto: type) -> dict[str, object]:
    return {name: member for name, member in vars(proto).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def _protocol_properties(proto: type) -> list[str]:
    return [name for name, member in vars(proto).items() if isinstance(member, property)]


@pytest.mark.parametrize(("proto", "impl"), [(DepthControl, PrefetchController), (MemoryControl, MemoryScheduler)])
def test_the_daemon_class_takes_every_call_the_protocol_allows(proto: type, impl: type) -> None:
    """Each protocol parameter exists on the daemon's method with the same kind and default.

    Extra optional parameters on the daemon's side are fine (the simulation does not pass them); a
    renamed, removed or re-defaulted one fails here before it fails in a simulation run.
    """
    methods = _protocol_methods(proto)
    assert methods, proto
    for name, member in methods.items():
        want = inspect.signature(member)
        have = inspect.signature(getattr(impl, name))
        for pname, param in want.parameters.items():
            assert pname in have.parameters, f"{impl.__name__}.{name} lacks parameter {pname!r}"
            got = have.parameters[pname]
            assert got.kind == param.kind, f"{impl.__name__}.{name}({pname}) is {got.kind}, protocol {param.kind}"
            assert got.default == param.default, f"{impl.__name__}.{name}({pname}) default differs"
        extra = [p for n, p in have.parameters.items() if n not in want.parameters]
        assert all(p.default is not inspect.Parameter.empty for p in extra), (impl.__name__, name, extra)


def test_instances_satisfy_the_protocols() -> None:
    sched = MemoryScheduler(8000 * MiB, reserve_mb=256)
    ctl = PrefetchController(1, 8)
    assert isinstance(sched, MemoryControl) and isinstance(ctl, DepthControl)
    for name in _protocol_properties(MemoryControl):
        assert isinstance(getattr(sched, name), (int, dict)), name
    assert not isinstance(object(), MemoryControl) and not isinstance(object(), DepthControl)


def test_an_adaptive_run_drives_both_through_the_protocols() -> None:
    board = SimulatedBoard("orin-nano-8gb", seed=0)
    sched = MemoryScheduler(target=board.target, reserve_mb=256)
    ctl = PrefetchController(1, 8)
    res = PipelineSim(board, controller=ctl, scheduler=sched, seed=3).run(6)
    assert res.mode == "adaptive" and res.completed > 0
    assert res.pressure_steps == dict(sched.steps_total)
    assert res.depth_changes == ctl.changes
    with pytest.raises(ValueError, match="fixed depth or a controller"):
        PipelineSim(board)


def test_telemetry_imports_no_daemon_module() -> None:
    code = ("import sys, cuvil_edge.telemetry, cuvil_edge.telemetry.pipeline_sim, cuvil_edge.telemetry.control; "
            "print(sorted(m for m in sys.modules if m.startswith('cuvil_edge.daemon')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
