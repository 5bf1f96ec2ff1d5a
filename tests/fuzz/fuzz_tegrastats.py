"""Fuzz target: the tegrastats line parser (every Jetson generation's format).

Promise: a line parses to a Sample whose record is strict JSON, or raises TelemetryError.
"""

from __future__ import annotations

import json
import sys

import atheris
from _harness import REPO, main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.errors import TelemetryError
    from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line



def test_one_input(data: bytes) -> None:
    line = data.decode("utf-8", "replace")
    try:
        sample = parse_tegrastats_line(line, now=0.0)
    except TelemetryError:
        return
    json.dumps(sample.to_dict(), allow_nan=False)  # ValueError here is a finding: not JSON


def seeds() -> list[bytes]:
    out = []
    for path in sorted((REPO / "tests" / "data" / "tegrastats").glob("*.log")):
        out += [ln.encode() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return out


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
