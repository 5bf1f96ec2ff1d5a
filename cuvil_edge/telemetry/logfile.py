"""Follow a telemetry log that another process writes as it goes (``tegrastats --logfile FILE``).

Why: on a stock JetPack board ``tegrastats`` is often run once, as root, by a unit of its own
(``tegrastats --interval 1000 --logfile /run/tegrastats.log``), because some of its figures need
root and the daemon's dynamic user has none. The daemon then reads the log, not the process.

Reading starts at the end of the file: only lines written after the source opened are samples
(a live consumer must not mistake the history for the present). Each complete line is parsed as
:func:`~cuvil_edge.telemetry.replay.load_log` parses a line (tegrastats, with or without its
timestamp, or a JSON sample) and stamped with the time it was read. A truncated or replaced file
(``logrotate``'s ``copytruncate`` or a new inode) is read again from its start. A file that stays
silent longer than the read's timeout is a dead source (the monitor moves on and comes back).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.base import TelemetrySource
from cuvil_edge.telemetry.sample import Sample
from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line

__all__ = ["LogFileSource"]

#: A line longer than this is not telemetry (tegrastats lines are a few hundred bytes): skipped.
MAX_LINE_BYTES = 64 * 1024


class LogFileSource(TelemetrySource):
    """Yields a sample for each line appended to ``path`` after the source opened.

    Args:
        path (str | PathLike): the log another process appends to.
        interval_s (float): the interval the writer uses; the file is polled ten times as often.
            Defaults to 1.0.

    Raises:
        TelemetryError: the file cannot be opened.
    """

    name = "logfile"

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.path = Path(path)
        self._poll_s = min(0.1, self.interval_s / 10)
        self._fh = self._open()
        self._fh.seek(0, os.SEEK_END)
        self._partial = b""
        self.lines_read = 0
        self.lines_skipped = 0
        self.reopened = 0

    def _open(self) -> Any:
        try:
            return open(self.path, "rb")  # noqa: SIM115 - held open across reads, closed in close()
        except OSError as exc:
            raise TelemetryError(f"cannot read telemetry log '{self.path}': {exc.strerror or exc}") from exc

    def _replaced_or_truncated(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # gone for now: keep what is open, the writer may recreate it
        own = os.fstat(self._fh.fileno())
        return (st.st_ino, st.st_dev) != (own.st_ino, own.st_dev) or st.st_size < self._fh.tell()

    def _next_line(self) -> bytes | None:
        chunk = self._fh.readline(MAX_LINE_BYTES + 1)
        if not chunk:
            if self._replaced_or_truncated():
                self._fh.close()
                self._fh = self._open()
                self._partial = b""
                self.reopened += 1
            return None
        self._partial += chunk
        if not self._partial.endswith(b"\n"):
            if len(self._partial) > MAX_LINE_BYTES:
                self._partial = b""  # an endless line: drop it, resynchronise at the next newline
                self.lines_skipped += 1
            return None  # the writer is mid-line
        line, self._partial = self._partial, b""
        return line

    def _parse(self, raw: bytes) -> Sample | None:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line or line.startswith("#"):
            return None
        now = time.time()
        try:
            if line.startswith("{"):
                sample = Sample.from_dict(json.loads(line))
            else:
                sample = parse_tegrastats_line(line, now=now, source=self.name)
        except (TelemetryError, ValueError, TypeError):
            self.lines_skipped += 1
            return None
        sample.timestamp = now
        sample.source = f"{self.name}:{self.path.name}"
        return sample

    def read(self, timeout: float | None = None) -> Sample:
        if self._fh.closed:
            raise TelemetryError(f"telemetry log '{self.path}' is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            raw = self._next_line()
            if raw is not None:
                sample = self._parse(raw)
                if sample is not None:
                    self.lines_read += 1
                    return sample
                continue
            if deadline is not None and time.monotonic() >= deadline:
                raise TelemetryError(f"telemetry log '{self.path}' got no new line in {timeout:.1f} s")
            time.sleep(self._poll_s)

    def close(self) -> None:
        self._fh.close()

    def get_status(self) -> dict[str, Any]:
        return {"source": self.name, "path": str(self.path), "lines_read": self.lines_read,
                "lines_skipped": self.lines_skipped, "reopened": self.reopened}
