"""Helpers shared by the telemetry tests (imported by name; conftest holds the fixtures)."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "tegrastats"


def recorded_lines(name: str) -> list[str]:
    """The tegrastats lines of a recorded file (comments dropped)."""
    text = (DATA / name).read_text("utf-8")
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]



def bump_proc_stat(root: Path, busy: int, idle: int) -> None:
    """Advance every core's counters in ``proc/stat`` by ``busy`` user and ``idle`` idle ticks."""
    p = root / "proc" / "stat"
    out = []
    for line in p.read_text().splitlines():
        parts = line.split()
        vals = [int(v) for v in parts[1:]]
        vals[0] += busy
        vals[3] += idle
        out.append(" ".join([parts[0], *map(str, vals)]))
    p.write_text("\n".join(out) + "\n")
    os.utime(p)
