"""tegrastats: one parser for the lines of every Jetson generation, and the process source.

The parser is a table of token handlers (``_BY_NAME``, ``_BY_SHAPE``), one small function per kind
of field; :data:`GENERATIONS` says which generation brought which format, with its recorded log. A
new generation is an entry there and, where it prints something new, one handler.

Formats seen in recorded lines (``tests/data/tegrastats/`` has them, each with its source URL):

* TX1 on L4T 28 (JetPack 3): ``cpu [17%,13%]@408 EMC 1%@408 GR3D 3%@76``.
* TX1/TX2/Nano, JetPack 4: ``RAM 2020/7852MB (lfb 1164x4MB) SWAP 149/1024MB (cached 7MB)
  IRAM 0/252kB(lfb 252kB) CPU [9%@345,off,...] EMC_FREQ 0%@1600 GR3D_FREQ 0%@76 ...
  PLL@42.5C ... VDD_IN 3140/3208`` (rails in mW without a unit; Nano names them ``POM_5V_*``);
  older releases print ``CPU [X%,Y%]@Z`` with one frequency for the cluster.
* Xavier, JetPack 4.2: rails without the ``VDD_`` prefix (``GPU 463/463 CPU 618/618``).
* Orin, JetPack 5/6: a leading ``MM-DD-YYYY HH:MM:SS`` timestamp, rails with ``mW``,
  ``GR3D_FREQ 0%@[0,0]`` (one frequency per GPC) or ``GR3D_FREQ 0%@1300`` plus
  ``GR3D2_FREQ``; sensors that are off read ``-256C``.
* Thor and Orin on JetPack 7: ``GR3D_FREQ @[1574,1574,1574]`` (no utilization),
  ``EMC_FREQ @4266``, ``cpu@52.9C/52.9C`` (current/maximum), three-valued rails
  ``VDD_GPU 37939mW/8660mW/37939mW`` (current/average/maximum).
* Without sudo tegrastats leaves out EMC and GR3D: those fields stay ``None``.

Units follow tegrastats: MB, kB, MHz, °C, mW. Unknown tokens are kept in ``Sample.extra`` and
never fatal; a line with none of RAM, CPU, EMC, GR3D, a temperature or a rail is not tegrastats
and raises :class:`~cuvil_edge.errors.TelemetryError`.

Hostile or corrupt lines cost little and never escape: a number beyond ``±1e12`` (or not finite)
is no reading, so its token lands in ``extra["unparsed"]`` (never ``Infinity`` in the JSON, never
Python's 4,300-digit ``int`` error); duplicate rail names are numbered in linear time; any other
``ValueError`` a token raises is contained to that token.
"""

from __future__ import annotations

import math
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry.base import SourceExhausted, TelemetrySource
from cuvil_edge.telemetry.sample import Sample

__all__ = ["GENERATIONS", "NON_DIE_SENSORS", "Generation", "TegrastatsSource", "parse_tegrastats_line"]

# Sensors whose value is a fixed trip point rather than a die reading (PMIC prints 100C or 50C on
# TX2/Xavier whatever the load); they stay in temps_c but throttling logic ignores them.
NON_DIE_SENSORS = frozenset({"PMIC", "pmic"})

_TS_RE = re.compile(r"^\s*(\d{2})-(\d{2})-(\d{4})\s+(\d{2}):(\d{2}):(\d{2})\s+")
_USED_TOTAL_RE = re.compile(r"^(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)(kB|MB|GB)(.*)$")
_LFB_RE = re.compile(r"^(\d+)x(\d+(?:\.\d+)?)(kB|MB|GB)\)?$")
_SIZE_RE = re.compile(r"^\(?(\d+(?:\.\d+)?)(kB|MB|GB)\)?$")
_TEMP_RE = re.compile(r"^([A-Za-z][\w\-]*)@(-?\d+(?:\.\d+)?)C(?:/(-?\d+(?:\.\d+)?)C)?$")
_RAIL_RE = re.compile(r"^(\d+(?:\.\d+)?)(?:mW)?/(\d+(?:\.\d+)?)(?:mW)?(?:/(\d+(?:\.\d+)?)(?:mW)?)?$")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# "N%", "N%@F", "N%@[F,F]", "@F", "@[F,F]"
_ENGINE_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)%)?(?:@(?:(\d+(?:\.\d+)?)|\[([^\]]*)\]))?$")
_VALUE_RE = re.compile(r"^(?:off|on|-?\d+(?:\.\d+)?%?(?:@\S+)?|@\S+)$")
_CPU_CORE_RE = re.compile(r"^(\d+(?:\.\d+)?)%(?:@(\d+(?:\.\d+)?))?$")
# L4T 28 printed "EMC 1%@408" and "GR3D 3%@76"; later releases add "_FREQ".
_ENGINE_ALIASES = {"EMC_FREQ": "EMC_FREQ", "EMC": "EMC_FREQ", "GR3D_FREQ": "GR3D_FREQ", "GR3D": "GR3D_FREQ",
                   "GR3D2_FREQ": "GR3D2_FREQ"}
_OFF_TEMP_C = -256.0  # tegrastats prints this for a powered-down sensor (CV, GPU when railgated)

_UNIT_MB = {"kB": 1.0 / 1024.0, "MB": 1.0, "GB": 1024.0}
_UNIT_KB = {"kB": 1.0, "MB": 1024.0, "GB": 1024.0 * 1024.0}


_MAX_READING = 1e12  # larger than any MB, kB, MHz, mW or °C figure a board prints
_MAX_DIGITS = 16


def _num(text: str) -> float:
    """A reading as int or float; ValueError when absurd (too long, not finite, beyond ±1e12)."""
    if len(text) > 2 * _MAX_DIGITS:
        raise ValueError(f"number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value) or abs(value) > _MAX_READING:
        raise ValueError(f"reading out of range: {text}")
    return int(value) if value.is_integer() else value  # type: ignore[return-value]


def _count(text: str) -> int:
    """A non-negative count (``lfb`` blocks); ValueError beyond 16 digits."""
    if len(text) > _MAX_DIGITS:
        raise ValueError(f"count of {len(text)} digits")
    return int(text)


def _freqs(text: str) -> list[float | None]:
    out: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        try:
            out.append(_num(part))
        except ValueError:
            out.append(None)  # "off", "N/A"
    return out


def _parse_engine(token: str) -> tuple[float | None, float | None, list[float | None] | None] | None:
    """``(util_pct, freq_mhz, per_gpc_freqs)`` of ``N%@F`` style tokens; None when it is not one."""
    m = _ENGINE_RE.match(token)
    if not m or token in ("", "@"):
        return None
    util = _num(m.group(1)) if m.group(1) is not None else None
    if m.group(2) is not None:
        return util, _num(m.group(2)), None
    if m.group(3) is not None:
        gpcs = _freqs(m.group(3))
        known = [f for f in gpcs if f is not None]
        return util, (max(known) if known else None), gpcs
    return util, None, None


def _parse_cpus(token: str) -> list[dict[str, float | None] | None]:
    m = re.match(r"^\[([^\]]*)\](?:@(\d+(?:\.\d+)?))?$", token)
    if not m:
        raise ValueError(token)
    cluster_freq = _num(m.group(2)) if m.group(2) else None
    cores: list[dict[str, float | None] | None] = []
    for part in m.group(1).split(","):
        part = part.strip()
        if part == "off":
            cores.append(None)
            continue
        cm = _CPU_CORE_RE.match(part)
        if not cm:
            raise ValueError(part)
        freq = _num(cm.group(2)) if cm.group(2) else cluster_freq
        cores.append({"load_pct": _num(cm.group(1)), "freq_mhz": freq})
    return cores


@dataclass(frozen=True)
class Generation:
    """One Jetson generation's tegrastats format: the boards, the recorded log, what it adds.

    ``tokens`` are the token names whose handler this generation brought (a handler stays for all
    later generations that print the token). The table is what ``tests/telemetry`` checks against the
    recorded logs, and what a new generation adds to (jetson-stats keeps one module per generation).
    """

    name: str
    boards: str
    log: str
    adds: str
    tokens: tuple[str, ...] = ()


# Oldest first. A line does not say its generation, so every handler is tried on every line.
GENERATIONS: tuple[Generation, ...] = (
    Generation("l4t28", "TX1 on L4T 28 (JetPack 3)", "tx1_jp3_l4t28.log",
               "RAM and SWAP; lower-case cpu [X%,Y%]@F with one cluster frequency; EMC and GR3D without _FREQ",
               ("RAM", "SWAP", "cpu", "EMC", "GR3D")),
    Generation("jp4", "TX1, TX2, Nano (JetPack 4)", "tx1_jp4.log",
               "IRAM, CPU [X%@F,...] with a frequency per core, EMC_FREQ, GR3D_FREQ, NAME@T C, rails in mW "
               "without a unit (Nano: POM_5V_*)", ("IRAM", "CPU", "EMC_FREQ", "GR3D_FREQ")),
    Generation("xavier", "AGX Xavier, Xavier NX (JetPack 4.2+)", "xavier_jp4.log",
               "rails without the VDD_ prefix (GPU 463/463), MTS fg/bg, PMIC trip points", ("MTS",)),
    Generation("orin", "Orin AGX, NX, Nano (JetPack 5, 6)", "orin_jp6.log",
               "a leading MM-DD-YYYY HH:MM:SS timestamp, rails in mW, GR3D_FREQ per GPC [F,F], GR3D2_FREQ, "
               "-256C for a sensor that is off (GR3D2_FREQ is documented, in no recorded line yet)"),
    Generation("thor", "Thor, Orin on JetPack 7", "thor_jp7.log",
               "no GPU utilization (GR3D_FREQ @[F,F,F]), EMC_FREQ @F, temperatures current/maximum, rails "
               "current/average/maximum"),
)


class _Line:
    """The parse of one line in progress: its tokens, the position, what was read so far."""

    def __init__(self, text: str, sample: Sample) -> None:
        self.toks = text.split()
        self.i = 0
        self.sample = sample
        self.extra: dict[str, Any] = {}
        self.unparsed: list[str] = []
        self.core_fields = 0
        self.gpc_freqs: list[float | None] = []
        self.rail_next: dict[str, int] = {}  # next suffix to try per duplicated rail name (linear time)

    def peek(self, k: int = 1) -> str:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ""


# A handler reads the token at ``line.i`` (and maybe the next ones), advances ``line.i`` and returns
# True; False leaves the token to the next handler. ValueError and OverflowError mark the token
# unparsed (an absurd number), never the line.

def _ram(line: _Line, tok: str, nxt: str) -> bool:
    m = _USED_TOTAL_RE.match(nxt)
    if not m:
        return False
    used, total, unit, _ = m.groups()
    line.sample.ram_used_mb = _num(used) * _UNIT_MB[unit]
    line.sample.ram_total_mb = _num(total) * _UNIT_MB[unit]
    line.core_fields += 1
    line.i += 2
    if line.peek(0) == "(lfb":
        lm = _LFB_RE.match(line.peek(1))
        if lm:
            line.sample.lfb_count = _count(lm.group(1))
            line.sample.lfb_size_kb = _num(lm.group(2)) * _UNIT_KB[lm.group(3)]
            line.i += 2
    return True


def _swap(line: _Line, tok: str, nxt: str) -> bool:
    m = _USED_TOTAL_RE.match(nxt)
    if not m:
        return False
    used, total, unit, _ = m.groups()
    line.sample.swap_used_mb = _num(used) * _UNIT_MB[unit]
    line.sample.swap_total_mb = _num(total) * _UNIT_MB[unit]
    line.i += 2
    if line.peek(0) == "(cached":
        sm = _SIZE_RE.match(line.peek(1))
        if sm:
            line.extra["swap_cached_mb"] = _num(sm.group(1)) * _UNIT_MB[sm.group(2)]
            line.i += 2
    return True


def _iram(line: _Line, tok: str, nxt: str) -> bool:
    m = _USED_TOTAL_RE.match(nxt)
    if not m:
        return False
    used, total, unit, rest = m.groups()
    iram: dict[str, Any] = {"used_kb": _num(used) * _UNIT_KB[unit], "total_kb": _num(total) * _UNIT_KB[unit]}
    line.i += 2
    if rest.startswith("(lfb"):
        sm = _SIZE_RE.match(line.peek(0))
        if sm:
            iram["lfb_kb"] = _num(sm.group(1)) * _UNIT_KB[sm.group(2)]
            line.i += 1
    line.extra["IRAM"] = iram
    return True


def _cpu(line: _Line, tok: str, nxt: str) -> bool:
    if not nxt.startswith("["):
        return False
    try:
        line.sample.cpus = _parse_cpus(nxt)
        line.core_fields += 1
    except ValueError:
        line.unparsed.extend([tok, nxt])
    line.i += 2
    return True


def _engine(line: _Line, tok: str, nxt: str) -> bool:
    tok = _ENGINE_ALIASES[tok]
    eng = _parse_engine(nxt)
    if eng is None:
        line.unparsed.append(tok)
        line.i += 1
        return True
    util, freq, gpcs = eng
    sample = line.sample
    if tok == "EMC_FREQ":
        sample.emc_util_pct, sample.emc_freq_mhz = util, freq
    else:
        if tok == "GR3D_FREQ" or sample.gpu_util_pct is None:
            sample.gpu_util_pct = util if tok == "GR3D_FREQ" else sample.gpu_util_pct
        if gpcs is not None:
            line.gpc_freqs.extend(gpcs)
        elif freq is not None:
            line.gpc_freqs.append(freq)
        if tok == "GR3D2_FREQ":
            line.extra["GR3D2_FREQ"] = nxt
    line.core_fields += 1
    line.i += 2
    return True


def _mts(line: _Line, tok: str, nxt: str) -> bool:
    if nxt != "fg" or line.i + 4 >= len(line.toks) + 1:
        return False
    line.extra["MTS"] = {"fg": line.peek(2), "bg": line.peek(4)}
    line.i += 5
    return True


def _temperature(line: _Line, tok: str, nxt: str) -> bool:
    tm = _TEMP_RE.match(tok)
    if not tm:
        return False
    name, cur, peak = tm.group(1), float(_num(tm.group(2))), tm.group(3)
    if cur <= _OFF_TEMP_C:
        line.extra.setdefault("temps_off", []).append(name)
    else:
        line.sample.temps_c[name] = cur
        if peak is not None:
            line.extra.setdefault("temps_max_c", {})[name] = float(_num(peak))
    line.core_fields += 1
    line.i += 1
    return True


def _rail(line: _Line, tok: str, nxt: str) -> bool:
    if not (_NAME_RE.match(tok) and nxt):
        return False
    rm = _RAIL_RE.match(nxt)
    if not rm:
        return False
    power = line.sample.power_mw
    rail = tok
    if rail in power:  # duplicated rail names ("NC 0mW/0mW" twice on Orin)
        k = line.rail_next.get(tok, 2)
        while f"{tok}_{k}" in power:
            k += 1
        line.rail_next[tok] = k + 1
        rail = f"{tok}_{k}"
    cur_mw, avg_mw = _num(rm.group(1)), _num(rm.group(2))
    max_mw = _num(rm.group(3)) if rm.group(3) is not None else None
    power[rail] = {"cur": cur_mw, "avg": avg_mw}
    if max_mw is not None:
        line.extra.setdefault("power_max_mw", {})[rail] = max_mw
    line.core_fields += 1
    line.i += 2
    return True


def _named_value(line: _Line, tok: str, nxt: str) -> bool:
    """``NAME value`` that no other handler knows (APE 150, NVENC 1600, VIC_FREQ 0%@115): kept in extra."""
    if not (_NAME_RE.match(tok) and nxt and _VALUE_RE.match(nxt)):
        return False
    eng = _parse_engine(nxt)
    if eng is not None and (eng[0] is not None or eng[1] is not None):
        util, freq, gpcs = eng
        val: Any = {"util_pct": util, "freq_mhz": freq}
        if util is None and gpcs is None:
            val = freq
        elif gpcs is not None:
            val["gpc_freq_mhz"] = gpcs
    elif re.fullmatch(r"-?\d+(?:\.\d+)?", nxt):
        val = _num(nxt)
    else:
        val = nxt
    line.extra[tok] = val
    line.i += 2
    return True


# Token name -> handler; then the handlers that recognise a token by its shape, in order.
_BY_NAME: dict[str, Any] = {"RAM": _ram, "SWAP": _swap, "IRAM": _iram, "CPU": _cpu, "cpu": _cpu, "MTS": _mts,
                            **{alias: _engine for alias in _ENGINE_ALIASES}}
_BY_SHAPE = (_temperature, _rail, _named_value)


def parse_tegrastats_line(line: str, *, now: float | None = None, source: str = "tegrastats") -> Sample:
    """Parse one tegrastats line of any Jetson generation (:data:`GENERATIONS`) into a :class:`Sample`.

    Args:
        line (str): one line of tegrastats output (trailing newline allowed).
        now (float | None): timestamp to use when the line carries none. Defaults to the time of
            the call.
        source (str): the ``Sample.source`` label. Defaults to ``"tegrastats"``.

    Returns:
        Sample: missing fields are None; unknown tokens land in ``extra``.

    Raises:
        TelemetryError: the line is empty or has nothing tegrastats prints.
    """
    text, timestamp = _split_timestamp(line, now)
    state = _Line(text, Sample(timestamp=timestamp, source=source))
    while state.i < len(state.toks):
        tok, nxt, start = state.toks[state.i], state.peek(), state.i
        try:
            named = _BY_NAME.get(tok)
            if named is not None and named(state, tok, nxt):
                continue
            if any(handler(state, tok, nxt) for handler in _BY_SHAPE):
                continue
            state.unparsed.append(tok)
            state.i += 1
        except (ValueError, OverflowError):
            # An absurd number in this token: no reading; the rest of the line still parses.
            state.unparsed.append(tok)
            state.i = start + 1
    return _finish(state, text)


def _split_timestamp(line: str, now: float | None) -> tuple[str, float]:
    """The line without Orin's leading ``MM-DD-YYYY HH:MM:SS``, and the time it stands for."""
    text = line.strip()
    if not text:
        raise TelemetryError("empty line: expected a tegrastats line such as 'RAM 2020/7852MB ...'")
    timestamp = time.time() if now is None else now
    m = _TS_RE.match(text)
    if m:
        month, day, year, hh, mm, ss = (int(g) for g in m.groups())
        try:
            timestamp = datetime(year, month, day, hh, mm, ss).timestamp()
        except ValueError as exc:
            raise TelemetryError(f"bad tegrastats timestamp '{m.group(0).strip()}': {exc}") from exc
        text = text[m.end():]
    return text, timestamp


def _finish(state: _Line, text: str) -> Sample:
    """The GPU clock from the GPC clocks, the leftovers in ``extra``; a line with nothing known fails."""
    sample, extra = state.sample, state.extra
    if state.gpc_freqs:
        known = [f for f in state.gpc_freqs if f is not None]
        sample.gpu_freq_mhz = max(known) if known else None
        if len(state.gpc_freqs) > 1:
            extra["gpc_freq_mhz"] = state.gpc_freqs
    if state.core_fields == 0:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise TelemetryError(
            f"not a tegrastats line (no RAM, CPU, EMC_FREQ, GR3D_FREQ, temperature or power rail): '{shown}'"
        )
    if state.unparsed:
        extra["unparsed"] = state.unparsed
    sample.extra = extra
    return sample


class TegrastatsSource(TelemetrySource):
    """Runs ``tegrastats --interval MS`` and parses each line it prints.

    Args:
        interval_s (float): sampling interval. Defaults to 1.0.
        path (str | None): the tegrastats executable. Defaults to the one on ``PATH``, then
            ``/usr/bin/tegrastats``.
        extra_args (list[str] | None): more arguments (for example ``["--verbose"]``).

    Raises:
        TelemetryError: tegrastats is not installed or does not start.
    """

    name = "tegrastats"

    def __init__(self, interval_s: float = 1.0, path: str | None = None, extra_args: list[str] | None = None) -> None:
        super().__init__(interval_s)
        exe = path or shutil.which("tegrastats") or "/usr/bin/tegrastats"
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise TelemetryError(f"tegrastats not found at '{exe}': not a Jetson, or use --telemetry sysfs|jtop|sim")
        self.path = exe
        interval_ms = max(1, int(round(interval_s * 1000)))
        cmd = [exe, "--interval", str(interval_ms), *(extra_args or [])]
        try:
            self._proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
            )
        except OSError as exc:
            raise TelemetryError(f"cannot start '{exe}': {exc}") from exc
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        self.lines_read = 0
        self.parse_errors = 0
        self._reader = threading.Thread(target=self._pump, name="tegrastats-reader", daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._pump_err, name="tegrastats-stderr", daemon=True)
        self._err_reader.start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            self._lines.put(raw)
        self._lines.put(None)

    def _pump_err(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._stderr.append(raw.rstrip())

    def read(self, timeout: float | None = None) -> Sample:
        """The next parsed line; skips (and counts) unparsable ones.

        Raises:
            TelemetryError: tegrastats exited or printed nothing within ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                raw = self._lines.get(timeout=remaining)
            except queue.Empty:
                raise TelemetryError(f"tegrastats printed nothing for {timeout:.1f} s") from None
            if raw is None:
                self._lines.put(None)  # keep reporting the end to later calls
                code = self._proc.wait(timeout=5)
                tail = "; ".join(self._stderr) or "no stderr"
                raise SourceExhausted(f"tegrastats exited with status {code} ({tail})")
            self.lines_read += 1
            try:
                return parse_tegrastats_line(raw, source=self.name)
            except TelemetryError:
                self.parse_errors += 1
                if self.parse_errors > 10 and self.parse_errors > self.lines_read // 2:
                    raise

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=3)
        # Let the readers reach EOF before closing the pipes under them.
        self._reader.join(timeout=2)
        self._err_reader.join(timeout=2)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def get_status(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "path": self.path,
            "pid": self._proc.pid,
            "running": self._proc.poll() is None,
            "lines_read": self.lines_read,
            "parse_errors": self.parse_errors,
        }
