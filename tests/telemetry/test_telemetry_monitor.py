"""TelemetryMonitor: latest sample, subscribers, fallback when a source dies; the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from telemetry_helpers import DATA, recorded_lines

from cuvil_edge.telemetry import SimulatedBoard, TelemetryMonitor


def wait_until(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


class TestTelemetryMonitor:
    def test_dying_source_is_reported_and_replaced(self, fake_tegrastats) -> None:
        exe = fake_tegrastats(recorded_lines("orin_jp6.log"), exit_code=1)
        mon = TelemetryMonitor([f"tegrastats:{exe}", "sim:orin-nano-8gb@50"], interval_s=0.02, retry_s=0.1)
        seen: list[str] = []
        mon.subscribe(lambda s: seen.append(s.source))
        with mon:
            assert wait_until(lambda: any(src.startswith("sim:") for src in seen))
        assert seen[:3] == ["tegrastats"] * 3
        died = [e for e in mon.events if e["kind"] == "died"]
        assert died and "status 1" in died[0]["reason"]
        assert mon.failures_total >= 1 and mon.switches_total >= 1
        assert mon.latest is not None and mon.latest.source == "sim:orin-nano-8gb"

    def test_no_source_at_all_never_raises(self) -> None:
        mon = TelemetryMonitor(["tegrastats:/nonexistent", "replay:/nonexistent"], interval_s=0.05, retry_s=0.05)
        with mon:
            assert mon.wait_for_sample(timeout=0.5) is None
            assert wait_until(lambda: mon.failures_total >= 4)  # retried the chain
        assert mon.latest is None and mon.active is None
        assert mon.get_status()["last_event"]["kind"] == "open_failed"

    def test_silent_source_counts_as_dead(self, tmp_path: Path) -> None:
        log = tmp_path / "slow.log"
        line = recorded_lines("orin_jp6.log")[2]
        log.write_text(line + "\n" + line.replace("10:36:27", "10:40:27") + "\n")  # 4 min gap
        mon = TelemetryMonitor([f"replay:{log}", "sim:orin-nano-8gb@50"], interval_s=0.05, silence_s=0.2)
        with mon:
            assert wait_until(lambda: mon.latest is not None and mon.latest.source.startswith("sim:"))
        assert any("timeout" in e["reason"] for e in mon.events if e["kind"] == "died")

    def test_a_source_slow_to_start_is_not_dead(self, tmp_path: Path) -> None:
        """A tegrastats that needs a while for its first line (a busy board) is kept; silence after
        its first line still counts."""
        line = recorded_lines("orin_jp6.log")[2]
        exe = tmp_path / "tegrastats"
        exe.write_text(f"#!/bin/sh\nsleep 0.6\nwhile :; do echo '{line}'; sleep 0.05; done\n")
        exe.chmod(0o755)
        mon = TelemetryMonitor([f"tegrastats:{exe}", "sim:orin-nano-8gb@50"], interval_s=0.05, silence_s=0.2,
                               start_s=3.0)
        with mon:
            assert mon.wait_for_sample(timeout=5) is not None
            assert mon.latest is not None and mon.latest.source == "tegrastats"
        assert not [e for e in mon.events if e["kind"] == "died"]

    def test_a_source_that_stalled_once_takes_over_again(self, tmp_path: Path) -> None:
        """tegrastats silent once (a busy emulated board) sends the monitor to the fallback; a probe
        in the background finds it back and it serves again, with no gap in the samples."""
        line = recorded_lines("orin_jp6.log")[2]
        exe, mark = tmp_path / "tegrastats", tmp_path / "stalled-once"
        exe.write_text(f"#!/bin/sh\nif [ ! -e {mark} ]; then touch {mark}; echo '{line}'; echo '{line}'; "
                       f"exec sleep 60; fi\nwhile :; do echo '{line}'; sleep 0.05; done\n")
        exe.chmod(0o755)
        mon = TelemetryMonitor([f"tegrastats:{exe}", "sim:orin-nano-8gb@50"], interval_s=0.05, silence_s=0.3,
                               start_s=3.0, probe_first_s=0.5)
        stamps: list[tuple[float, str]] = []
        mon.subscribe(lambda s: stamps.append((time.monotonic(), s.source)))
        with mon:
            assert wait_until(lambda: any(src.startswith("sim:") for _, src in stamps), 5)
            assert wait_until(lambda: stamps[-1][1] == "tegrastats" and mon.active == f"tegrastats:{exe}", 10)
        kinds = [e["kind"] for e in mon.events]
        assert "died" in kinds and "promoted" in kinds
        fallback = [t for t, src in stamps if src.startswith("sim:")]
        back = next(t for t, src in stamps if src == "tegrastats" and t > fallback[0])
        gaps = [b - a for a, b in zip([t for t, _ in stamps], [t for t, _ in stamps][1:]) if a >= fallback[0]]
        assert max(gaps) < 0.5 and back > fallback[-1] - 0.2

    def test_a_source_still_broken_is_probed_less_and_less(self, tmp_path: Path) -> None:
        line = recorded_lines("orin_jp6.log")[2]
        exe, starts = tmp_path / "tegrastats", tmp_path / "starts"
        exe.write_text(f"#!/bin/sh\necho x >> {starts}\necho '{line}'\nexec sleep 60\n")
        exe.chmod(0o755)
        mon = TelemetryMonitor([f"tegrastats:{exe}", "sim:orin-nano-8gb@50"], interval_s=0.05, silence_s=0.2,
                               start_s=0.2, probe_first_s=0.2, probe_max_s=0.8)
        with mon:
            time.sleep(3.0)
            assert mon.active == "sim:orin-nano-8gb@50" and mon.latest is not None
        # first start, then probes after ~0.2, 0.4, 0.8, 0.8 ... s (each adds its own 0.2 s read)
        n = len(starts.read_text().split())
        assert 3 <= n <= 6, n

    def test_subscriber_errors_do_not_stop_the_stream(self) -> None:
        mon = TelemetryMonitor("sim:xavier-nx@100", interval_s=0.01)
        good: list[float] = []

        def bad(_sample) -> None:
            raise RuntimeError("subscriber bug")

        mon.subscribe(bad)
        unsubscribe = mon.subscribe(lambda s: good.append(s.timestamp))
        with mon:
            assert wait_until(lambda: len(good) >= 5)
            unsubscribe()
            n = len(good)
            mon.wait_for_sample(timeout=2, after=mon.samples_total + 3)
        assert len(good) in (n, n + 1)

    def test_report_load_reaches_the_simulator_and_survives_a_switch(self) -> None:
        sim = SimulatedBoard("orin-nano-8gb", interval_s=0.02, speed=1.0, noise_pct=0)
        mon = TelemetryMonitor([sim], interval_s=0.02)
        mon.report_load(busy_fraction=0.5, resident_bytes=512 << 20)
        with mon:
            s = mon.wait_for_sample(timeout=5)
            s = mon.wait_for_sample(timeout=5)
        assert s is not None and s.gpu_util_pct == 50
        assert s.ram_used_mb == 1100 + 512

    def test_stop_is_prompt(self) -> None:
        mon = TelemetryMonitor("sim:orin-nano-8gb", interval_s=0.5).start()
        mon.wait_for_sample(timeout=2)
        t0 = time.monotonic()
        mon.stop()
        assert time.monotonic() - t0 < 2.0
        assert not any(t.name == "cuvil-telemetry" for t in threading.enumerate())


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuvil_edge.cli", "telemetry", *args],
        input=stdin, capture_output=True, text=True, timeout=60,
    )


class TestTelemetryCli:
    def test_parse_file_one_json_per_line(self) -> None:
        r = run_cli("parse", str(DATA / "orin_jp6.log"))
        assert r.returncode == 0, r.stderr
        records = [json.loads(x) for x in r.stdout.splitlines()]
        assert [rec["ram_used_mb"] for rec in records] == [29114, 2448, 4321]
        assert records[1]["emc_util_pct"] is None

    def test_unreadable_line_gives_error_object_with_line_number(self) -> None:
        good = recorded_lines("nano_jp4.log")[0]
        r = run_cli("parse", "-", stdin=f"{good}\n\nnot telemetry\n{good}\n")
        assert r.returncode == 0
        records = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(records) == 3
        assert records[1]["line"] == 3 and "not a tegrastats line" in records[1]["error"]

    def test_exit_status_nonzero_only_when_nothing_parsed(self, tmp_path: Path) -> None:
        r = run_cli("parse", "-", stdin="junk\nmore junk\n")
        assert r.returncode == 1
        assert [json.loads(x)["line"] for x in r.stdout.splitlines()] == [1, 2]
        assert "no tegrastats line parsed" in r.stderr
        r = run_cli("parse", str(tmp_path / "missing.log"))
        assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr

    def test_watch_sim(self) -> None:
        r = run_cli("watch", "sim:agx-thor@0", "-n", "2")
        assert r.returncode == 0, r.stderr
        assert [json.loads(x)["source"] for x in r.stdout.splitlines()] == ["sim:agx-thor"] * 2
