"""Replay a recorded telemetry log: tegrastats lines or JSON lines of samples.

Each line is either a tegrastats line (with or without its leading ``MM-DD-YYYY HH:MM:SS``) or a
JSON object as ``cuvil-edge telemetry parse`` prints it. Samples are paced by the differences
between their timestamps divided by ``speed`` (``speed=0`` means as fast as possible); lines
without a timestamp are spaced by ``interval_s``. The replayed samples keep their recorded
content; their ``timestamp`` is the original one unless ``retime=True`` (then: replay start +
elapsed recorded time / speed, which is what a live consumer expects).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.base import SourceExhausted, TelemetrySource
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line

__all__ = ["ReplaySource", "load_log"]


def load_log(path: str | os.PathLike[str], interval_s: float = 1.0) -> list[Sample]:
    """Parse a whole log into samples; lines without a timestamp get ``interval_s`` spacing.

    Blank lines and ``#`` comments are skipped; unreadable lines are skipped and counted in the
    first sample's ``extra["replay_skipped_lines"]``.

    Raises:
        TelemetryError: the file is missing or has no readable line.
    """
    p = Path(path)
    try:
        text = p.read_text("utf-8", errors="replace")
    except OSError as exc:
        raise TelemetryError(f"cannot read telemetry log '{p}': {exc.strerror or exc}") from exc
    samples: list[Sample] = []
    skipped = 0
    synthetic_t = 0.0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("{"):
                sample = Sample.from_dict(json.loads(line))
            else:
                has_ts = line[:2].isdigit() and line[2:3] == "-"
                sample = parse_tegrastats_line(line, now=synthetic_t, source="replay")
                if not has_ts:
                    synthetic_t += interval_s
        except (TelemetryError, ValueError, TypeError):
            skipped += 1
            continue
        samples.append(sample)
    if not samples:
        raise TelemetryError(f"telemetry log '{p}' has no readable tegrastats or JSON line")
    if skipped:
        samples[0].extra["replay_skipped_lines"] = skipped
    return samples


class ReplaySource(TelemetrySource):
    """Yields the samples of a recorded log at ``speed`` times real time.

    Args:
        path (str | PathLike): the log file.
        speed (float): replay speed factor; 0 replays without waiting. Defaults to 1.0.
        loop (bool): start again at the end instead of ending. Defaults to False.
        retime (bool): stamp samples with replay time instead of recorded time. Defaults to True.
        interval_s (float): spacing of lines without timestamps. Defaults to 1.0.

    Raises:
        TelemetryError: unreadable log, or a negative speed.
    """

    name = "replay"

    def __init__(
        self,
        path: str | os.PathLike[str],
        speed: float = 1.0,
        *,
        loop: bool = False,
        retime: bool = True,
        interval_s: float = 1.0,
    ) -> None:
        super().__init__(interval_s)
        if speed < 0:
            raise TelemetryError(f"replay speed must be >= 0 (0 = no waiting), got {speed}")
        self.path = Path(path)
        self.speed = float(speed)
        self.loop = loop
        self.retime = retime
        self.samples = load_log(self.path, interval_s)
        self._index = 0
        self._laps = 0
        self._start_wall: float | None = None
        self._start_rec = self.samples[0].timestamp
        self._lap_offset = 0.0
        self._closed = False

    def read(self, timeout: float | None = None) -> Sample:
        if self._closed:
            raise TelemetryError(f"replay of '{self.path}' is closed")
        if self._index >= len(self.samples):
            if not self.loop:
                raise SourceExhausted(f"replay of '{self.path}' reached its end ({len(self.samples)} samples)")
            self._laps += 1
            span = self.samples[-1].timestamp - self._start_rec + self.interval_s
            self._lap_offset += span
            self._index = 0
        rec = self.samples[self._index]
        elapsed_rec = rec.timestamp - self._start_rec + self._lap_offset
        now = time.time()
        if self._start_wall is None:
            self._start_wall = now
        due = self._start_wall + (elapsed_rec / self.speed if self.speed > 0 else 0.0)
        wait = due - now
        if wait > 0:
            if timeout is not None and wait > timeout:
                time.sleep(timeout)
                raise TelemetryError(f"replay: next sample is {wait:.1f} s away, longer than the {timeout:.1f} s timeout")
            time.sleep(wait)
        self._index += 1
        out = Sample.from_dict(rec.to_dict())
        out.source = f"replay:{self.path.name}"
        if self.retime:
            out.timestamp = max(due, now) if self.speed > 0 else time.time()
        return out

    def close(self) -> None:
        self._closed = True

    def get_status(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "path": str(self.path),
            "speed": self.speed,
            "position": self._index,
            "samples": len(self.samples),
            "laps": self._laps,
        }
