"""``cuvil-edge telemetry``: parse tegrastats logs, read samples from any source."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

import typer
from rich.markup import escape

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.monitor import source_usage

__all__ = ["parse_stream", "register"]

telemetry_app = typer.Typer(
    name="telemetry",
    help="Board telemetry: parse tegrastats lines of any Jetson generation, read live or simulated samples.",
    no_args_is_help=True,
)


def parse_stream(stream: TextIO, out: TextIO) -> tuple[int, int]:
    """Parse each line of ``stream``; write one JSON object per line to ``out``.

    Blank lines and ``#`` comments are skipped. A line that does not parse gives
    ``{"line": N, "error": "..."}``; whatever a line holds, the stream goes on and every record
    written is strict JSON (no ``NaN``/``Infinity``).

    Returns:
        tuple[int, int]: (lines parsed, lines with an error).
    """
    from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line

    ok = bad = 0
    for number, raw in enumerate(stream, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            text = json.dumps(parse_tegrastats_line(line).to_dict(), allow_nan=False)
            ok += 1
        except TelemetryError as exc:
            text = json.dumps({"line": number, "error": str(exc)})
            bad += 1
        except Exception as exc:  # a parser defect must cost one line, not the other 98,000
            text = json.dumps({"line": number, "error": f"unreadable line ({type(exc).__name__}: {exc})"[:300]})
            bad += 1
        out.write(text + "\n")
    out.flush()
    return ok, bad


@telemetry_app.command("parse")
def parse_cmd(
    file: str = typer.Argument("-", help="tegrastats log to parse; '-' reads standard input."),
) -> None:
    """Print each tegrastats line of FILE as a JSON telemetry record, one per line.

    A line that cannot be read gives {"line": N, "error": "..."}; the exit status is non-zero only
    when no line parsed.
    """
    if file == "-":
        ok, bad = parse_stream(sys.stdin, sys.stdout)
        source = "standard input"
    else:
        path = Path(file)
        try:
            with path.open("r", encoding="utf-8", errors="replace") as f:
                ok, bad = parse_stream(f, sys.stdout)
        except OSError as exc:
            raise TelemetryError(f"cannot read '{path}': {exc.strerror or exc}") from exc
        source = str(path)
    if ok == 0:
        # A CuvilEdgeError, not typer.Exit: cli.main() turns it into one line and exit status 1.
        raise TelemetryError(f"no tegrastats line parsed from {source} ({bad} unreadable)")


@telemetry_app.command("watch")
def watch_cmd(
    source: str = typer.Argument(
        "auto", help=escape(f"{source_usage()}.")  # rich would take [@SPEED] for markup
    ),
    count: int = typer.Option(5, "--count", "-n", min=1, help="Samples to print."),
    interval: float = typer.Option(1.0, "--interval", min=0.01, help="Sampling interval in seconds."),
) -> None:
    """Print COUNT samples from a telemetry SOURCE as JSON lines."""
    from cuvil_edge.telemetry.monitor import open_source

    with open_source(source, interval_s=interval) as src:
        for _ in range(count):
            print(json.dumps(src.read(timeout=max(5.0, 3 * interval)).to_dict()), flush=True)


def register(app: typer.Typer) -> None:
    """Add the ``telemetry`` command group to the main CLI."""
    app.add_typer(telemetry_app, name="telemetry")
