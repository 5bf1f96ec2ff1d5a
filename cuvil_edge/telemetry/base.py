"""The interface every telemetry source implements.

A source is a blocking iterator of :class:`~cuvil_edge.telemetry.sample.Sample`: ``read()``
waits for the next reading; it raises :class:`~cuvil_edge.errors.TelemetryError` when the source
has died (process exited, socket closed, files vanished) and :class:`SourceExhausted` (a subclass)
when it simply ended (a replayed log reached its end). :class:`TelemetryMonitor` turns either into
a switch to the next source.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.sample import Sample

__all__ = ["SourceExhausted", "TelemetrySource"]


class SourceExhausted(TelemetryError):
    """The source ended normally (end of a replayed log, tegrastats exited)."""


class TelemetrySource(abc.ABC):
    """A producer of samples. Use as a context manager or call :meth:`close`.

    Args:
        interval_s (float): the sampling interval the source aims for. Defaults to 1.0.
    """

    #: Short label, also the ``Sample.source`` of what it yields.
    name: str = "source"

    def __init__(self, interval_s: float = 1.0) -> None:
        if not interval_s > 0:
            raise TelemetryError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.interval_s = float(interval_s)

    @abc.abstractmethod
    def read(self, timeout: float | None = None) -> Sample:
        """Block until the next sample and return it.

        Args:
            timeout (float | None): seconds to wait at most. Defaults to no limit.

        Raises:
            TelemetryError: the source died or gave nothing within ``timeout``.
            SourceExhausted: the source ended.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the source holds (processes, sockets). Idempotent."""

    def get_status(self) -> dict[str, Any]:
        """Plain data describing the source, for logs and ``/metrics``."""
        return {"source": self.name, "interval_s": self.interval_s}

    def __iter__(self) -> Iterator[Sample]:
        while True:
            try:
                yield self.read()
            except SourceExhausted:
                return

    def __enter__(self) -> TelemetrySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
