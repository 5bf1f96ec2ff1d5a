"""Opening sources by name, and the monitor thread that keeps the daemon supplied with samples.

Source specs (``cuvil-edged --telemetry SPEC``; several separated by commas form a fallback
chain) are ``auto`` (``tegrastats``, then ``jtop``, then ``sysfs:/``, the first that opens) or one
kind of :data:`SOURCE_KINDS`, the one table of them (``cuvil-edge telemetry watch --help`` prints
it; ``docs/telemetry.md`` lists it).

:class:`TelemetryMonitor` runs the chain in a thread: it keeps the latest sample, calls
subscribers, and when a source dies (raises, ends, goes silent) it logs the reason, records an
event and moves to the next spec; after the last it waits ``retry_s`` and starts over. While a
fallback serves, the sources above it that died are tried again in the background (after 30 s, then
at doubling intervals up to 10 min) and take over once they yield a sample. It never
raises into the daemon: without telemetry ``latest`` just stays ``None`` (or stale — see
:attr:`TelemetryMonitor.age_s`) and serving goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuvil_edge.errors import TargetError, TelemetryError
from cuvil_edge.targets import get_target
from cuvil_edge.telemetry.base import SourceExhausted, TelemetrySource
from cuvil_edge.telemetry.sample import Sample

__all__ = ["AUTO_CHAIN", "SOURCE_KINDS", "SourceKind", "TelemetryMonitor", "check_spec", "expand_spec",
           "open_source", "source_usage"]

log = logging.getLogger(__name__)

AUTO_CHAIN: tuple[str, ...] = ("tegrastats", "jtop", "sysfs:/")
#: Samples a source that died must yield in a row before it takes over again (one line and a
#: stall again would make the monitor flap between it and its fallback).
PROBE_SAMPLES = 3


def _split_speed(arg: str) -> tuple[str, float | None]:
    """``"FILE@2.5"`` -> ``("FILE", 2.5)``; an ``@`` not followed by a number stays in the name."""
    if "@" in arg:
        head, tail = arg.rsplit("@", 1)
        try:
            return head, float(tail)
        except ValueError:
            pass
    return arg, None


@dataclass(frozen=True)
class SourceKind:
    """One kind of telemetry source: how its spec is written, what it reads, how it opens.

    ``open(arg, interval_s, kw)`` gets the text after ``KIND:``; ``check(arg)`` refuses at start a
    spec that can never work (a missing log file), so the monitor does not retry it forever.
    """

    usage: str
    what: str
    open: Callable[[str, float, dict[str, Any]], TelemetrySource]
    check: Callable[[str], None] | None = None


def _open_tegrastats(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.tegrastats import TegrastatsSource

    return TegrastatsSource(interval_s=interval, path=arg or kw.pop("path", None), **kw)


def _open_jtop(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.jtop_source import JtopSource

    return JtopSource(interval_s=interval)


def _open_sysfs(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.sysfs import SysfsSource

    return SysfsSource(root=arg or "/", interval_s=interval)


def _open_replay(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.replay import ReplaySource

    path, speed = _split_speed(arg)
    if not path:
        raise TelemetryError("replay needs a file: replay:FILE[@SPEED]")
    return ReplaySource(path, speed=1.0 if speed is None else speed, interval_s=interval, **kw)


def _check_replay(arg: str) -> None:
    path, _ = _split_speed(arg)
    if not path or not Path(path).is_file():
        raise TelemetryError(f"telemetry log {path!r} does not exist (replay:FILE[@SPEED])")


def _open_logfile(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.logfile import LogFileSource

    if not arg:
        raise TelemetryError("logfile needs a file: logfile:FILE")
    return LogFileSource(arg, interval_s=interval)


def _check_logfile(arg: str) -> None:
    if not arg or not Path(arg).is_file():
        raise TelemetryError(f"telemetry log {arg!r} does not exist (logfile:FILE, the file tegrastats --logfile writes)")


def _open_sim(arg: str, interval: float, kw: dict[str, Any]) -> TelemetrySource:
    from cuvil_edge.telemetry.sim import SimulatedBoard

    board, speed = _split_speed(arg or "orin-nano-8gb")
    try:
        return SimulatedBoard(board, interval_s=interval, speed=1.0 if speed is None else speed, **kw)
    except TargetError as exc:
        raise TelemetryError(f"sim: {exc}") from exc


def _check_sim(arg: str) -> None:
    board, _ = _split_speed(arg)
    if board:
        try:
            get_target(board)
        except TargetError as exc:
            raise TelemetryError(f"sim: {exc}") from exc


# The one table of source kinds: open_source dispatches on it, the daemon checks specs with it, the
# CLI's help and the docs check (tests/core/test_vocabularies.py) read it. A new source is one entry.
SOURCE_KINDS: dict[str, SourceKind] = {
    "tegrastats": SourceKind("tegrastats[:PATH]", "the tegrastats process (PATH: the executable)", _open_tegrastats),
    "jtop": SourceKind("jtop", "jetson-stats' service", _open_jtop),
    "sysfs": SourceKind("sysfs[:ROOT]", "/proc and /sys under ROOT (default /)", _open_sysfs),
    "replay": SourceKind("replay:FILE[@SPEED]", "a recorded log at SPEED times real time (default 1; 0 = no "
                         "waiting)", _open_replay, _check_replay),
    "logfile": SourceKind("logfile:FILE", "the lines another process appends to FILE (tegrastats --logfile "
                          "FILE run as root by a unit of its own)", _open_logfile, _check_logfile),
    "sim": SourceKind("sim:BOARD[@SPEED]", "the simulator of a board profile at SPEED times real time",
                      _open_sim, _check_sim),
}


def source_usage() -> str:
    """How specs are written, for messages and help: ``auto, tegrastats[:PATH], ... or sim:BOARD[@SPEED]``."""
    usages = ["auto", *(kind.usage for kind in SOURCE_KINDS.values())]
    return f"{', '.join(usages[:-1])} or {usages[-1]}"


def expand_spec(spec: str | Sequence[str]) -> list[str]:
    """Split a comma-separated spec and expand ``auto`` into :data:`AUTO_CHAIN`."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        out.extend(AUTO_CHAIN if part == "auto" else [part])
    if not out:
        raise TelemetryError(f"empty telemetry spec; use {source_usage()}")
    return out


def check_spec(item: str) -> None:
    """Refuse one spec that can never work: an unknown kind, a missing log, an unknown board.

    Raises:
        TelemetryError: naming the spec and the forms that work.
    """
    kind, _, arg = item.partition(":")
    if kind not in SOURCE_KINDS:
        raise TelemetryError(f"unknown telemetry source {item!r}; use {source_usage()}")
    check = SOURCE_KINDS[kind].check
    if check is not None:
        check(arg)


def open_source(spec: str, **kw: Any) -> TelemetrySource:
    """Open one source from its spec (see the module docstring).

    Args:
        spec (str): the spec; ``auto`` (or a comma chain) returns the first one that opens.
        **kw: passed to the source: ``interval_s`` for all; ``seed``, ``noise_pct``,
            ``os_used_mb`` for ``sim``; ``loop``, ``retime`` for ``replay``.

    Raises:
        TelemetryError: unknown spec, or no source of the chain could be opened (the message
            lists why each failed).
    """
    chain = expand_spec(spec)
    if len(chain) > 1:
        errors = []
        for item in chain:
            try:
                return open_source(item, **kw)
            except TelemetryError as exc:
                errors.append(f"{item}: {exc}")
        raise TelemetryError("no telemetry source could be opened: " + "; ".join(errors))
    item = chain[0]
    kind, _, arg = item.partition(":")
    interval = kw.pop("interval_s", 1.0)
    if kind not in SOURCE_KINDS:
        raise TelemetryError(f"unknown telemetry source '{item}'; use {source_usage()}")
    return SOURCE_KINDS[kind].open(arg, interval, kw)


Subscriber = Callable[[Sample], Any]


class TelemetryMonitor:
    """Reads a chain of sources in a background thread; the daemon never waits on it.

    Args:
        spec (str | Sequence[str | TelemetrySource]): a spec string (``"auto"``,
            ``"tegrastats,sysfs"``) or a list of specs and already-open sources, tried in order.
        interval_s (float): sampling interval. Defaults to 1.0.
        retry_s (float): pause before trying the chain again once every source failed.
            Defaults to 5.0.
        silence_s (float | None): a source that yields nothing this long is considered dead.
            Defaults to ``max(3 * interval_s, 2.0)``.
        start_s (float | None): how long a source may take for its first sample (a process such
            as tegrastats starting on a board busy loading models). Defaults to
            ``max(silence_s, 10.0)``.
        source_kw (dict | None): extra keyword arguments for :func:`open_source`.
        probe_first_s (float): while a fallback serves, how long before a source above it that
            died is tried again (in a thread of its own; the fallback keeps serving). Defaults to 30.
        probe_max_s (float): the longest wait between two such tries; each failed try doubles
            the wait up to it. Defaults to 600.

    Example::

        mon = TelemetryMonitor("auto", interval_s=1.0)
        mon.subscribe(scheduler.update)
        mon.start()
        ... mon.latest ... mon.report_load(busy_fraction=0.7) ...
        mon.stop()
    """

    def __init__(
        self,
        spec: str | Sequence[str | TelemetrySource] = "auto",
        *,
        interval_s: float = 1.0,
        retry_s: float = 5.0,
        silence_s: float | None = None,
        source_kw: dict[str, Any] | None = None,
        start_s: float | None = None,
        probe_first_s: float = 30.0,
        probe_max_s: float = 600.0,
    ) -> None:
        if isinstance(spec, str):
            self._chain: list[str | TelemetrySource] = list(expand_spec(spec))
        else:
            self._chain = []
            for item in spec:
                self._chain.extend(expand_spec(item) if isinstance(item, str) else [item])
        if not self._chain:
            raise TelemetryError("telemetry monitor needs at least one source")
        self.interval_s = float(interval_s)
        self.retry_s = float(retry_s)
        self.silence_s = float(silence_s) if silence_s is not None else max(3 * self.interval_s, 2.0)
        self.start_s = float(start_s) if start_s is not None else max(self.silence_s, 10.0)
        self._source_kw = dict(source_kw or {})
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._new_sample = threading.Condition(self._lock)
        self.latest: Sample | None = None
        self.latest_monotonic: float | None = None
        self.source: TelemetrySource | None = None
        self.active: str | None = None
        self.samples_total = 0
        self.failures_total = 0
        self.switches_total = 0
        self.events: deque[dict[str, Any]] = deque(maxlen=100)
        self._pending_load: dict[str, Any] = {}
        self.probe_first_s = float(probe_first_s)
        self.probe_max_s = max(float(probe_max_s), self.probe_first_s)
        self._died: set[int] = set()  # ranks in the chain that opened and later died

    # ------------------------------------------------------------------ public API

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(sample)`` from the monitor thread for every sample; returns an
        unsubscribe function. A subscriber that raises is logged and kept."""
        with self._lock:
            self._subs.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subs:
                    self._subs.remove(callback)

        return unsubscribe

    def start(self) -> TelemetryMonitor:
        """Start the thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="cuvil-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the current source."""
        self._stop.set()
        src = self.source
        if src is not None:
            try:
                src.close()
            except Exception:  # closing must not fail the daemon's shutdown
                log.debug("closing %s failed", src.name, exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> TelemetryMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for_sample(self, timeout: float | None = None, after: int | None = None) -> Sample | None:
        """Block until a sample newer than number ``after`` (default: any) arrives."""
        after = self.samples_total if after is None else after
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._new_sample:
            while self.samples_total <= after:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._new_sample.wait(remaining)
            return self.latest

    @property
    def age_s(self) -> float | None:
        """Seconds since the latest sample arrived (None before the first)."""
        return None if self.latest_monotonic is None else time.monotonic() - self.latest_monotonic

    def report_load(self, **load: Any) -> None:
        """Forward the daemon's load to a source that models it (the simulator); kept and
        re-applied when the source changes. Ignored by real sources."""
        self._pending_load.update({k: v for k, v in load.items() if v is not None})
        src = self.source
        if src is not None and hasattr(src, "report_load"):
            src.report_load(**load)

    def get_status(self) -> dict[str, Any]:
        """Plain figures for ``/metrics`` and ``/v2`` debugging."""
        src = self.source
        return {
            "active": self.active,
            "chain": [c if isinstance(c, str) else c.name for c in self._chain],
            "samples_total": self.samples_total,
            "failures_total": self.failures_total,
            "switches_total": self.switches_total,
            "age_s": self.age_s,
            "source": src.get_status() if src is not None else None,
            "last_event": self.events[-1] if self.events else None,
        }

    # ------------------------------------------------------------------ thread

    def _event(self, kind: str, source: str, reason: str) -> None:
        self.events.append({"t": time.time(), "kind": kind, "source": source, "reason": reason})

    def _open(self, item: str | TelemetrySource) -> TelemetrySource:
        if isinstance(item, TelemetrySource):
            return item
        return open_source(item, interval_s=self.interval_s, **self._source_kw)

    def _run(self) -> None:
        while not self._stop.is_set():
            rank = 0
            handed: _Handover | None = None
            while rank < len(self._chain) and not self._stop.is_set():
                item = self._chain[rank]
                label = item if isinstance(item, str) else item.name
                first: Sample | None = None
                if handed is not None:
                    src, rank, label, first = handed.source, handed.rank, handed.label, handed.sample
                    handed = None
                else:
                    try:
                        src = self._open(item)
                    except Exception as exc:
                        self.failures_total += 1
                        self._event("open_failed", label, str(exc))
                        log.info("telemetry source %s unavailable: %s", label, exc)
                        rank += 1
                        continue
                if self.active is not None and self.active != label:
                    self.switches_total += 1
                self.source, self.active = src, label
                if self._pending_load and hasattr(src, "report_load"):
                    src.report_load(**self._pending_load)
                self._event("opened", label, src.name)
                log.info("telemetry from %s", label)
                if first is not None:
                    self._publish(first)
                outcome = self._pump(src, rank)
                try:
                    src.close()
                except Exception:
                    log.debug("closing %s failed", label, exc_info=True)
                self.source = None
                if self._stop.is_set():
                    if isinstance(outcome, _Handover):
                        _close_quietly(outcome.source)
                    return
                if isinstance(outcome, _Handover):
                    self._died.discard(outcome.rank)
                    self._event("promoted", outcome.label, f"back from {label}")
                    log.info("telemetry source %s is back; leaving %s", outcome.label, label)
                    handed = outcome
                    continue
                self.failures_total += 1
                self._died.add(rank)
                self._event("died", label, outcome)
                log.warning("telemetry source %s stopped: %s; trying the next one", label, outcome)
                rank += 1
            self.active = None
            if self._stop.wait(self.retry_s):
                return

    def _publish(self, sample: Sample) -> None:
        with self._new_sample:
            self.latest = sample
            self.latest_monotonic = time.monotonic()
            self.samples_total += 1
            subs = list(self._subs)
            self._new_sample.notify_all()
        for cb in subs:
            try:
                cb(sample)
            except Exception:
                log.exception("telemetry subscriber %r failed", cb)

    def _pump(self, src: TelemetrySource, rank: int) -> str | _Handover:
        """Read ``src`` until it dies (the reason) or a source above it that died is back (the
        handover): while a fallback serves, the sources above it that died are probed in a thread
        of their own, first after :data:`PROBE_FIRST_S`, then at doubling intervals up to
        :data:`PROBE_MAX_S`, so a tegrastats that stalled once on a busy board is not replaced by
        sysfs for the daemon's lifetime, and no sample is missed while probing."""
        timeout = self.start_s  # the first sample may take a process start; later ones an interval
        probe: _Probe | None = None
        wait_s = self.probe_first_s
        next_probe = time.monotonic() + wait_s
        # Only _run changes which sources died, between pumps: the ranks to probe are fixed here.
        above = [r for r in sorted(self._died) if r < rank and isinstance(self._chain[r], str)]
        try:
            while not self._stop.is_set():
                if probe is not None and probe.done.is_set():
                    if probe.found is not None:
                        found, probe = probe.found, None
                        return found
                    probe = None
                    wait_s = min(2 * wait_s, self.probe_max_s)
                    next_probe = time.monotonic() + wait_s
                if probe is None and above and time.monotonic() >= next_probe:
                    probe = _Probe(self, above)
                try:
                    sample = src.read(timeout=timeout)
                    timeout = self.silence_s
                except SourceExhausted as exc:
                    return f"ended: {exc}"
                except TelemetryError as exc:
                    return str(exc)
                except Exception as exc:  # a broken source must never take the daemon down
                    return f"{type(exc).__name__}: {exc}"
                self._publish(sample)
            return "stopped"
        finally:
            if probe is not None:
                probe.abandon()


@dataclass
class _Handover:
    """A source above the serving one that is back: open, with its first sample read."""

    rank: int
    label: str
    source: TelemetrySource
    sample: Sample


class _Probe:
    """Tries the given ranks of a monitor's chain in a thread: the first that opens and yields
    :data:`PROBE_SAMPLES` samples (the first within the monitor's ``start_s``, the others each within
    ``silence_s``) is ``found``; an abandoned probe closes what it found."""

    def __init__(self, monitor: TelemetryMonitor, ranks: list[int]) -> None:
        self._monitor = monitor
        self._ranks = ranks
        self._lock = threading.Lock()
        self._abandoned = False
        self.found: _Handover | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="cuvil-telemetry-probe", daemon=True).start()

    def _run(self) -> None:
        mon = self._monitor
        try:
            for rank in self._ranks:
                label = str(mon._chain[rank])
                try:
                    src = mon._open(mon._chain[rank])
                except Exception as exc:
                    log.debug("telemetry probe of %s: %s", label, exc)
                    continue
                try:  # back means steady: its first sample, then more at its interval
                    sample = src.read(timeout=mon.start_s)
                    for _ in range(PROBE_SAMPLES - 1):
                        sample = src.read(timeout=mon.silence_s)
                except Exception as exc:
                    log.debug("telemetry probe of %s: %s", label, exc)
                    _close_quietly(src)
                    continue
                with self._lock:
                    if self._abandoned:
                        _close_quietly(src)
                    else:
                        self.found = _Handover(rank, label, src, sample)
                return
        finally:
            self.done.set()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            found, self.found = self.found, None
        if found is not None:
            _close_quietly(found.source)


def _close_quietly(src: TelemetrySource) -> None:
    try:
        src.close()
    except Exception:
        log.debug("closing %s failed", src.name, exc_info=True)
