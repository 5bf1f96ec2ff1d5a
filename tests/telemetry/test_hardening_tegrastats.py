"""Issue #13, item 12: a bad tegrastats line never aborts the stream nor leaves strict JSON.

The mutation test takes every recorded line of every board generation and breaks it the ways a
corrupt log, a hostile pipe or a truncated write does: long digit runs, flipped and deleted
characters, duplicated and shuffled tokens, non-ASCII bytes. The parser may refuse a line
(TelemetryError, an error record); it may never raise anything else, and every record it prints
must be JSON that a strict parser accepts.
"""

from __future__ import annotations

import io
import json
import time

import numpy as np
from telemetry_helpers import DATA

from cuvil_edge.telemetry.cli import parse_stream
from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line

ORIN = ("12-03-2026 10:00:00 RAM 2020/7852MB (lfb 1164x4MB) SWAP 0/3926MB (cached 0MB) CPU [9%@729,off] "
        "EMC_FREQ 0%@2133 GR3D_FREQ 0%@611 CPU@47.9C GPU@45.8C VDD_IN 5299mW/5299mW")


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"bare {name} in a record: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def _recorded_lines() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("*.log")):
        lines += [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return lines


def _mutate(line: str, rng: np.random.Generator) -> str:
    chars = list(line)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 7))
        pos = int(rng.integers(0, len(chars) + 1))
        if kind == 0:  # a run of digits: 4,300-digit counts, 400-digit rails
            chars[pos:pos] = list("9" * int(rng.choice([20, 400, 4400])))
        elif kind == 1 and chars:  # flip a character
            chars[min(pos, len(chars) - 1)] = chr(int(rng.choice([32, 37, 47, 64, 91, 93, 40, 41, 45, 46, 120])))
        elif kind == 2 and chars:  # delete a stretch
            del chars[pos:pos + int(rng.integers(1, 12))]
        elif kind == 3:  # duplicate tokens many times
            toks = "".join(chars).split()
            if toks:
                t = toks[int(rng.integers(0, len(toks)))]
                chars[pos:pos] = list(" " + " ".join([t] * int(rng.integers(2, 200))) + " ")
        elif kind == 4:  # shuffle tokens
            toks = "".join(chars).split()
            rng.shuffle(toks)
            chars = list(" ".join(toks))
        elif kind == 5:  # non-ASCII and control bytes
            chars[pos:pos] = list("\u00e9\u2603\x00\x7f")
        else:  # exponents and signs where digits were
            chars[pos:pos] = list(rng.choice(["e308", "e-400", "-", ".", "nan", "inf", "1e999"]))
    return "".join(chars)


def test_huge_numbers_are_bounded_and_strict_json():
    line = ORIN.replace("1164x4MB", "9" * 4300 + "x4MB").replace("5299mW/5299mW", "9" * 400 + "mW/5299mW")
    sample = parse_tegrastats_line(line)
    record = _strict(json.dumps(sample.to_dict(), allow_nan=False))
    assert record["ram_total_mb"] == 7852  # type: ignore[index]
    assert "VDD_IN" not in sample.power_mw and sample.lfb_count is None


def test_one_bad_line_does_not_stop_the_stream():
    lines = [ORIN] * 5000
    lines[2500] = ORIN.replace("1164x4MB", "9" * 4300 + "x4MB")
    lines[2501] = "RAM 1/2MB " + "VDD_X " + "9" * 400 + "/1"
    out = io.StringIO()
    ok, bad = parse_stream(io.StringIO("\n".join(lines) + "\n"), out)
    records = [_strict(r) for r in out.getvalue().splitlines()]
    assert len(records) == 5000 and ok + bad == 5000 and ok >= 4999


def test_cli_parse_survives_and_exits_0(tmp_path, cli):
    log = tmp_path / "t.log"
    lines = [ORIN] * 3000
    lines[10] = ORIN.replace("1164x4MB", "9" * 4300 + "x4MB")
    log.write_text("\n".join(lines) + "\n")
    result = cli("telemetry", "parse", str(log), timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    out = result.stdout.splitlines()
    assert len(out) == 3000 and all(_strict(r) for r in out)


def test_duplicate_rail_names_take_linear_time():
    dup = "RAM 1/2MB " + " ".join(["NC 0mW/0mW"] * 8000)
    distinct = "RAM 1/2MB " + " ".join(f"R{i} 0mW/0mW" for i in range(8000))
    t0 = time.perf_counter()
    s = parse_tegrastats_line(dup)
    t_dup = time.perf_counter() - t0
    t0 = time.perf_counter()
    parse_tegrastats_line(distinct)
    t_distinct = time.perf_counter() - t0
    assert len(s.power_mw) == 8000 and "NC_8000" in s.power_mw
    assert t_dup < 1.0 and t_dup < 5 * t_distinct + 0.05, (t_dup, t_distinct)  # was 7.7 s vs 0.023 s


def test_rail_suffixes_never_collide():
    s = parse_tegrastats_line("RAM 1/2MB NC 1mW/1mW NC_2 2mW/2mW NC 3mW/3mW NC 4mW/4mW")
    assert {k: v["cur"] for k, v in s.power_mw.items()} == {"NC": 1, "NC_2": 2, "NC_3": 3, "NC_4": 4}


def test_random_mutations_never_crash_nor_print_non_json():
    rng = np.random.default_rng(13)
    base = _recorded_lines()
    assert len(base) >= 9
    lines = [_mutate(base[i % len(base)], rng).replace("\n", " ") for i in range(8_000)]
    out = io.StringIO()
    ok, bad = parse_stream(io.StringIO("\n".join(lines) + "\n"), out)
    records = out.getvalue().splitlines()
    # parse_stream contains any exception as an "unreadable line" record: those are the crashes.
    crashes = sum("unreadable line" in r for r in records)
    non_json = 0
    for r in records:
        try:
            _strict(r)
        except (AssertionError, ValueError):
            non_json += 1
    assert crashes == 0 and non_json == 0, (crashes, non_json)
    assert ok > 2_500 and len(records) == ok + bad
