"""Telemetry sources: tegrastats process, sysfs, replay, simulator, jtop conversion, open_source."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from telemetry_helpers import DATA, bump_proc_stat, recorded_lines

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry import (
    LogFileSource,
    ReplaySource,
    SimulatedBoard,
    SourceExhausted,
    SysfsSource,
    TegrastatsSource,
    check_spec,
    open_source,
    sample_from_jtop,
)


class TestTegrastatsSource:
    def test_reads_lines_until_the_process_exits(self, fake_tegrastats) -> None:
        lines = recorded_lines("orin_jp6.log")
        exe = fake_tegrastats(lines, exit_code=3, stderr="nvpmodel: permission denied")
        src = TegrastatsSource(interval_s=0.02, path=str(exe))
        try:
            got = [src.read(timeout=5) for _ in lines]
            assert [s.ram_used_mb for s in got] == [29114, 2448, 4321]
            assert all(s.source == "tegrastats" for s in got)
            with pytest.raises(SourceExhausted, match="status 3.*permission denied"):
                src.read(timeout=5)
        finally:
            src.close()
        assert src.get_status()["running"] is False

    def test_passes_interval_in_milliseconds(self, fake_tegrastats) -> None:
        exe = fake_tegrastats(recorded_lines("tx2_jp4.log"), repeat=100)
        src = TegrastatsSource(interval_s=0.05, path=str(exe))
        try:
            t0 = time.monotonic()
            for _ in range(5):
                src.read(timeout=5)
            elapsed = time.monotonic() - t0
        finally:
            src.close()
        assert 0.15 < elapsed < 3.0  # 4 gaps of 50 ms, not 1 s

    def test_skips_unparsable_lines(self, fake_tegrastats) -> None:
        exe = fake_tegrastats(["tegrastats: warning", recorded_lines("nano_jp4.log")[0]])
        with TegrastatsSource(interval_s=0.01, path=str(exe)) as src:
            assert src.read(timeout=5).ram_used_mb == 534
            assert src.get_status()["parse_errors"] == 1

    def test_missing_executable(self, tmp_path: Path) -> None:
        with pytest.raises(TelemetryError, match="not found"):
            TegrastatsSource(path=str(tmp_path / "nope"))


class TestSysfsSource:
    def test_recorded_orin_tree(self, orin_sysfs: Path) -> None:
        src = SysfsSource(orin_sysfs, interval_s=0.01)
        first = src.read()
        assert round(first.ram_total_mb) == 7620 and round(first.ram_used_mb) == 7620 - 2737
        assert round(first.swap_used_mb) == 98
        assert first.cpus[4] is None and first.cpus[5] is None
        assert first.cpus[0] == {"load_pct": None, "freq_mhz": 1510.4}  # no load before a second read
        assert first.gpu_util_pct == 45.3 and round(first.gpu_freq_mhz, 2) == 624.75
        assert first.temps_c == {"cpu": 47.687, "gpu": 48.625, "tj": 48.625}  # cv0 reads -256 C: off
        assert first.power_mw["VDD_IN"] == {"cur": 4500.0, "avg": 4500.0}
        assert first.emc_util_pct is None and first.lfb_count is None  # not in sysfs: None
        bump_proc_stat(orin_sysfs, busy=30, idle=70)
        second = src.read()
        assert second.cpus[0]["load_pct"] == 30.0

    def test_this_machine(self) -> None:
        s = SysfsSource("/", interval_s=0.01).read()
        assert s.ram_total_mb > 0 and 0 < s.ram_used_mb < s.ram_total_mb
        assert s.source == "sysfs"

    def test_wrong_root(self, tmp_path: Path) -> None:
        with pytest.raises(TelemetryError, match="meminfo"):
            SysfsSource(tmp_path)


class TestReplaySource:
    def test_paces_by_recorded_timestamps_and_speed(self, tmp_path: Path) -> None:
        log = tmp_path / "log.txt"
        base = recorded_lines("orin_jp6.log")[2]  # has a timestamp: 04-11-2025 10:36:27
        log.write_text("\n".join([base, base.replace("10:36:27", "10:36:28"), base.replace("10:36:27", "10:36:30")]))
        src = ReplaySource(log, speed=10.0)
        t0 = time.monotonic()
        got = list(src)
        elapsed = time.monotonic() - t0
        assert len(got) == 3
        assert 0.25 < elapsed < 2.5  # 3 recorded seconds at 10x
        assert got[2].timestamp - got[0].timestamp == pytest.approx(0.3, abs=0.15)

    def test_original_timestamps_and_end(self) -> None:
        src = ReplaySource(DATA / "thor_jp7.log", speed=0, retime=False)
        a, b = src.read(), src.read()
        assert b.timestamp - a.timestamp == 6 * 3600 + 55 * 60 + 55
        with pytest.raises(SourceExhausted):
            src.read()

    def test_loop_and_json_lines(self, tmp_path: Path) -> None:
        log = tmp_path / "rec.jsonl"
        sim = SimulatedBoard("orin-nano-8gb", noise_pct=0)
        log.write_text("\n".join(__import__("json").dumps(sim.advance().to_dict()) for _ in range(2)))
        src = ReplaySource(log, speed=0, loop=True)
        got = [src.read() for _ in range(5)]
        assert all(s.ram_total_mb == 8192 for s in got)
        assert src.get_status()["laps"] == 2

    def test_skips_bad_lines_and_rejects_empty(self, tmp_path: Path) -> None:
        log = tmp_path / "mixed.log"
        log.write_text("junk\n" + recorded_lines("tx1_jp4.log")[0] + "\n")
        assert ReplaySource(log, speed=0).samples[0].extra["replay_skipped_lines"] == 1
        empty = tmp_path / "empty.log"
        empty.write_text("junk only\n")
        with pytest.raises(TelemetryError, match="no readable"):
            ReplaySource(empty)


class TestLogFileSource:
    """``logfile:FILE``: what tegrastats --logfile appends after the source opened, as it comes."""

    def test_only_lines_written_after_opening_and_whole_lines_only(self, tmp_path: Path) -> None:
        lines = recorded_lines("orin_jp6.log")
        log = tmp_path / "tegrastats.log"
        log.write_text(lines[0] + "\n")  # history: not a sample of now
        src = LogFileSource(log, interval_s=0.05)
        try:
            with pytest.raises(TelemetryError, match="no new line in 0.2 s"):
                src.read(timeout=0.2)
            with log.open("a") as fh:
                fh.write(lines[1][:20])  # the writer is mid-line: nothing yet
                fh.flush()
                with pytest.raises(TelemetryError, match="no new line"):
                    src.read(timeout=0.2)
                fh.write(lines[1][20:] + "\nnot a tegrastats line\n" + lines[2] + "\n")
            before = time.time()
            got = [src.read(timeout=2), src.read(timeout=2)]
            assert [s.ram_used_mb for s in got] == [2448, 4321]
            assert all(s.timestamp >= before and s.source == "logfile:tegrastats.log" for s in got)
            assert src.get_status()["lines_skipped"] == 1
        finally:
            src.close()

    def test_rotated_or_truncated_log_is_read_from_its_start(self, tmp_path: Path) -> None:
        lines = recorded_lines("orin_jp6.log")
        log = tmp_path / "tegrastats.log"
        log.write_text(lines[0] + "\n" + lines[0] + "\n")
        src = LogFileSource(log, interval_s=0.05)
        try:
            log.write_text(lines[1] + "\n")  # copytruncate: shorter than where we are
            assert src.read(timeout=2).ram_used_mb == 2448
            log.rename(tmp_path / "tegrastats.log.1")  # rotation: a new file takes the name
            (tmp_path / "tegrastats.log").write_text(lines[2] + "\n")
            assert src.read(timeout=2).ram_used_mb == 4321
            assert src.get_status()["reopened"] == 2
        finally:
            src.close()

    def test_missing_file_is_one_clear_error(self, tmp_path: Path) -> None:
        with pytest.raises(TelemetryError, match="cannot read telemetry log .*missing.log"):
            LogFileSource(tmp_path / "missing.log")
        with pytest.raises(TelemetryError, match="does not exist.*tegrastats --logfile"):
            check_spec(f"logfile:{tmp_path / 'missing.log'}")


class TestSimulatedBoard:
    def test_responds_to_reported_load(self) -> None:
        sim = SimulatedBoard("orin-nano-8gb", noise_pct=0)
        idle = sim.advance()
        sim.report_load(busy_fraction=0.8, resident_bytes=1 << 30, inflight_bytes=256 << 20, batch=8)
        busy = sim.advance()
        assert idle.gpu_util_pct == 0 and busy.gpu_util_pct == 80
        assert busy.ram_used_mb - idle.ram_used_mb == pytest.approx(1024 + 256)
        assert busy.emc_util_pct > idle.emc_util_pct
        assert busy.input_power_mw > idle.input_power_mw
        assert busy.extra["batch"] == 8

    def test_gpu_saturation_by_another_process(self) -> None:
        sim = SimulatedBoard("orin-nano-8gb", noise_pct=0)
        sim.gpu_saturation(start=5, duration=10, fraction=0.9)
        sim.report_load(busy_fraction=1.0)
        before = sim.advance(4.0)
        assert sim.gpu_share == 1.0
        during = sim.advance()
        assert sim.gpu_share == pytest.approx(0.1)
        assert during.gpu_util_pct == 100 and sim.speed_factor < 0.11
        sim.advance(10.0)
        assert sim.gpu_share == 1.0 and before.extra["other_gpu_fraction"] == 0

    def test_memory_squeeze_and_oom(self) -> None:
        sim = SimulatedBoard("orin-nano-4gb", noise_pct=0)
        sim.memory_squeeze(start=0, duration=60, mb=2500, ramp_s=5)
        s = [sim.advance() for _ in range(6)]
        assert s[-1].ram_used_mb == pytest.approx(1100 + 2500)
        assert s[-1].lfb_count < s[0].lfb_count
        sim.report_load(resident_bytes=1 << 30)
        over = sim.advance()
        assert over.extra["oom"] is True and sim.oom_events == 1
        assert over.swap_used_mb > 0 and over.ram_used_mb < over.ram_total_mb

    def test_thermal_throttle_lowers_gpu_clock(self) -> None:
        sim = SimulatedBoard("orin-nano-8gb", noise_pct=0)
        sim.thermal_throttle(start=0, duration=600, ambient_rise_c=60)
        sim.report_load(busy_fraction=1.0)
        samples = [sim.advance() for _ in range(240)]
        assert max(samples[-1].temps_c.values()) >= 90
        assert samples[-1].gpu_freq_mhz < samples[0].gpu_freq_mhz
        assert sim.speed_factor < 1.0

    def test_thor_reports_no_gpu_utilization(self) -> None:
        s = SimulatedBoard("agx-thor").advance()
        assert s.gpu_util_pct is None and s.gpu_freq_mhz == 1575 and "VIN" in s.power_mw

    def test_real_time_read_at_speed(self) -> None:
        sim = SimulatedBoard("orin-nano-8gb", interval_s=1.0, speed=20.0)
        t0 = time.monotonic()
        for _ in range(5):
            sim.read()
        assert 0.15 < time.monotonic() - t0 < 3.0
        assert sim.t == 5.0

    def test_unknown_scenario_and_board(self) -> None:
        with pytest.raises(TelemetryError, match="unknown scenario"):
            SimulatedBoard().add_scenario("meteor", 0, 1)
        with pytest.raises(TelemetryError, match="unknown target"):
            open_source("sim:orin-nano-3gb")


class TestJtopConversion:
    def test_recorded_structures(self) -> None:
        # Shapes as jetson-stats 4.x documents them (jtop/jtop.py): kB, kHz, mW, 4 MB lfb blocks.
        s = sample_from_jtop(
            memory={"RAM": {"tot": 7802900, "used": 2147000, "lfb": 2}, "SWAP": {"tot": 3901440, "used": 1511424},
                    "EMC": {"cur": 2133000, "val": 12}},
            cpu={"cpu": [{"online": True, "idle": 75.0, "freq": {"cur": 1510400}}, {"online": False}]},
            gpu={"ga10b": {"status": {"load": 33.3}, "freq": {"cur": 624750}}},
            temperature={"cpu": {"temp": 47.7, "online": True}, "cv0": {"temp": -256, "online": False}},
            power={"rail": {"VDD_IN": {"power": 4556, "avg": 4500}}, "tot": {"power": 6490, "avg": 6400}},
            timestamp=1.0,
        )
        assert round(s.ram_used_mb) == 2097 and (s.lfb_count, s.lfb_size_kb) == (2, 4096)
        assert s.cpus == [{"load_pct": 25.0, "freq_mhz": 1510.4}, None]
        assert (s.gpu_util_pct, s.gpu_freq_mhz, s.emc_util_pct, s.emc_freq_mhz) == (33.3, 624.75, 12, 2133)
        assert s.temps_c == {"cpu": 47.7} and s.power_mw["VDD_IN"] == {"cur": 4556, "avg": 4500}

    def test_empty_gives_none_fields(self) -> None:
        s = sample_from_jtop(None, None, None, None, None)
        assert s.ram_used_mb is None and s.cpus is None and s.gpu_util_pct is None

    def test_source_without_jetson_stats(self) -> None:
        try:
            import jtop  # noqa: F401
        except ImportError:
            with pytest.raises(TelemetryError, match="jetson-stats"):
                open_source("jtop")
        else:
            with pytest.raises(TelemetryError):  # installed, but no jtop.service socket here
                open_source("jtop")


class TestOpenSource:
    def test_specs(self, tmp_path: Path, orin_sysfs: Path) -> None:
        assert isinstance(open_source(f"sysfs:{orin_sysfs}"), SysfsSource)
        assert open_source(f"replay:{DATA / 'tx2_jp4.log'}@0").speed == 0
        assert open_source("sim:agx-orin-64gb@5").speed == 5
        weird = tmp_path / "we@rd.log"
        weird.write_text(recorded_lines("tx1_jp4.log")[0])
        assert open_source(f"replay:{weird}").path == weird

    def test_auto_falls_back_to_sysfs_here(self) -> None:
        src = open_source("auto")  # no tegrastats, no jtop service on this machine
        assert isinstance(src, SysfsSource)

    def test_errors_name_the_choices(self) -> None:
        with pytest.raises(TelemetryError, match="unknown telemetry source 'nvml'.*sysfs"):
            open_source("nvml")
        with pytest.raises(TelemetryError, match="no telemetry source could be opened"):
            open_source("tegrastats:/nonexistent,replay:/nonexistent")
        with pytest.raises(TelemetryError, match="empty"):
            open_source(" , ")
