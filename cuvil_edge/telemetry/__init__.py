"""Telemetry: one normalized :class:`Sample` from tegrastats, jtop, sysfs, a replayed or followed log
or a simulated board, and a monitor thread that keeps the daemon supplied (issue #4).

Quick use::

    from cuvil_edge.telemetry import TelemetryMonitor, parse_tegrastats_line, open_source

    sample = parse_tegrastats_line("RAM 2020/7852MB (lfb 1164x4MB) CPU [9%@345,off] ...")
    with open_source("sim:orin-nano-8gb@0") as sim:
        print(sim.read().to_dict())
    mon = TelemetryMonitor("auto").start()      # tegrastats -> jtop -> sysfs, with fallback

Sources other than the parser import their dependencies lazily (jetson-stats for ``jtop``).
"""

from __future__ import annotations

from cuvil_edge.telemetry.base import SourceExhausted, TelemetrySource
from cuvil_edge.telemetry.jtop_source import JtopSource, sample_from_jtop
from cuvil_edge.telemetry.logfile import LogFileSource
from cuvil_edge.telemetry.monitor import (
    AUTO_CHAIN,
    SOURCE_KINDS,
    SourceKind,
    TelemetryMonitor,
    check_spec,
    expand_spec,
    open_source,
    source_usage,
)
from cuvil_edge.telemetry.replay import ReplaySource, load_log
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.sim import BOARD_FIGURES, Scenario, SimulatedBoard
from cuvil_edge.telemetry.sysfs import SysfsSource
from cuvil_edge.telemetry.tegrastats import NON_DIE_SENSORS, TegrastatsSource, parse_tegrastats_line

__all__ = [
    "AUTO_CHAIN",
    "BOARD_FIGURES",
    "JtopSource",
    "LogFileSource",
    "NON_DIE_SENSORS",
    "ReplaySource",
    "Sample",
    "Scenario",
    "SOURCE_KINDS",
    "SimulatedBoard",
    "SourceExhausted",
    "SourceKind",
    "SysfsSource",
    "TegrastatsSource",
    "TelemetryMonitor",
    "TelemetrySource",
    "check_spec",
    "expand_spec",
    "load_log",
    "open_source",
    "parse_tegrastats_line",
    "sample_from_jtop",
    "source_usage",
]
