"""parse_tegrastats_line on real lines of every Jetson generation (tests/data/tegrastats)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from telemetry_helpers import DATA, recorded_lines

from cuvil_edge.errors import TelemetryError
from cuvil_edge.telemetry import Sample, parse_tegrastats_line

CONTRACT_FIELDS = [
    "timestamp", "ram_used_mb", "ram_total_mb", "lfb_count", "lfb_size_kb", "swap_used_mb", "swap_total_mb",
    "cpus", "emc_util_pct", "emc_freq_mhz", "gpu_util_pct", "gpu_freq_mhz", "temps_c", "power_mw", "extra",
    "source",
]


def all_recorded() -> list[tuple[str, str]]:
    return [(p.name, line) for p in sorted(DATA.glob("*.log")) for line in recorded_lines(p.name)]


class TestEveryRecordedLine:
    @pytest.mark.parametrize(("name", "line"), all_recorded(), ids=lambda v: v if len(v) < 30 else None)
    def test_parses_to_contract_dict(self, name: str, line: str) -> None:
        s = parse_tegrastats_line(line)
        d = s.to_dict()
        assert list(d) == CONTRACT_FIELDS
        json.dumps(d)  # JSON-ready
        assert d["ram_used_mb"] > 0 and d["ram_total_mb"] >= d["ram_used_mb"]
        assert Sample.from_dict(json.loads(json.dumps(d))) == s

    def test_every_generation_is_covered(self) -> None:
        names = {p.name for p in DATA.glob("*.log")}
        for gen in ("tx1", "tx2", "nano", "xavier", "orin_jp5", "orin_jp6", "orin_jp7", "thor"):
            assert any(n.startswith(gen) for n in names), gen
        for p in DATA.glob("*.log"):
            assert "source: https://" in p.read_text(), f"{p.name} lacks its source URL"


class TestTX1:
    def test_l4t28_old_spelling(self) -> None:
        a, b = (parse_tegrastats_line(x) for x in recorded_lines("tx1_jp3_l4t28.log"))
        assert a.cpus == [{"load_pct": v, "freq_mhz": 408} for v in (17, 13, 29, 5)]
        assert (a.emc_util_pct, a.emc_freq_mhz, a.gpu_util_pct, a.gpu_freq_mhz) == (1, 408, 3, 76)
        assert (b.gpu_util_pct, b.cpus[2]) == (39, {"load_pct": 65, "freq_mhz": 1734})
        assert (a.swap_used_mb, a.swap_total_mb, a.extra["swap_cached_mb"]) == (873, 8192, 295)
        assert a.temps_c == {} and a.power_mw == {}  # that release printed neither

    def test_jp4_iram_and_unitless_rails(self) -> None:
        (s,) = (parse_tegrastats_line(x) for x in recorded_lines("tx1_jp4.log"))
        assert s.extra["IRAM"] == {"used_kb": 0, "total_kb": 252, "lfb_kb": 252}
        assert s.power_mw["VDD_IN"] == {"cur": 2532, "avg": 2698}
        assert s.swap_used_mb is None and s.swap_total_mb is None  # no SWAP token: absent, not 0


class TestTX2:
    def test_offline_denver_cores_are_none(self) -> None:
        s = parse_tegrastats_line(recorded_lines("tx2_jp4.log")[0])
        assert s.cpus[1] is None and s.cpus[2] is None
        assert s.cpus[0] == {"load_pct": 1, "freq_mhz": 345}
        assert (s.lfb_count, s.lfb_size_kb) == (1154, 4096)
        assert set(s.power_mw) == {"VDD_SYS_GPU", "VDD_SYS_SOC", "VDD_4V0_WIFI", "VDD_IN", "VDD_SYS_CPU", "VDD_SYS_DDR"}

    def test_emc_without_frequency_is_none_not_zero(self) -> None:
        s = parse_tegrastats_line(recorded_lines("tx2_jp4.log")[1])
        assert s.emc_util_pct == 0 and s.emc_freq_mhz is None
        assert s.gpu_util_pct == 0 and s.gpu_freq_mhz is None

    def test_mts_kept_in_extra(self) -> None:
        s = parse_tegrastats_line(recorded_lines("tx2_jp4.log")[2])
        assert s.extra["MTS"] == {"fg": "1%", "bg": "1%"}
        assert s.temps_c["PMIC"] == 50.0 and s.max_temp_c == 50.0


class TestNano:
    def test_pom_rails_and_input_power(self) -> None:
        s = parse_tegrastats_line(recorded_lines("nano_jp4.log")[1])
        assert s.power_mw["POM_5V_IN"] == {"cur": 4520, "avg": 4680}
        assert s.input_power_mw == 4520
        assert (s.lfb_count, s.lfb_size_kb) == (1, 2048)
        assert s.extra["NVENC"] == 716 and s.extra["APE"] == 25


class TestXavier:
    def test_rails_without_vdd_prefix(self) -> None:
        s = parse_tegrastats_line(recorded_lines("xavier_jp4.log")[0])
        assert s.power_mw["GPU"] == {"cur": 463, "avg": 463}
        assert s.power_mw["SYS5V"] == {"cur": 3306, "avg": 3306}
        assert s.temps_c["GPU"] == 30.5  # the GPU sensor and the GPU rail do not collide
        assert s.input_power_mw == sum(r["cur"] for r in s.power_mw.values())

    def test_xavier_nx(self) -> None:
        s = parse_tegrastats_line(recorded_lines("xavier_jp4.log")[2])
        assert (s.gpu_util_pct, s.gpu_freq_mhz, s.emc_util_pct) == (62, 306, 10)
        assert s.cpus[5] == {"load_pct": 8, "freq_mhz": 1267}


class TestOrin:
    def test_jp5_mw_rails(self) -> None:
        (s,) = (parse_tegrastats_line(x) for x in recorded_lines("orin_jp5.log"))
        assert s.power_mw["VDD_IN"] == {"cur": 5299, "avg": 5299}
        assert s.extra["VIC_FREQ"] == 729
        assert s.cpus[4:] == [None] * 4

    def test_jp6_pressure_line_engines_and_gpcs(self) -> None:
        s = parse_tegrastats_line(recorded_lines("orin_jp6.log")[0])
        assert (s.ram_used_mb, s.ram_total_mb, s.lfb_count, s.swap_used_mb) == (29114, 30697, 3, 4915)
        assert s.gpu_freq_mhz == 305 and s.extra["gpc_freq_mhz"] == [305, 305]
        assert s.extra["NVDLA0"] == "off" and s.extra["PVA0_FREQ"] == "off"
        assert s.cpus[5] == {"load_pct": 100, "freq_mhz": 2201}
        assert "unparsed" not in s.extra

    def test_without_sudo_emc_absent(self) -> None:
        s = parse_tegrastats_line(recorded_lines("orin_jp6.log")[1])
        assert s.emc_util_pct is None and s.emc_freq_mhz is None
        assert s.gpu_util_pct == 0 and s.gpu_freq_mhz is None

    def test_timestamp_sensors_off_and_duplicate_rails(self) -> None:
        s = parse_tegrastats_line(recorded_lines("orin_jp6.log")[2])
        assert s.timestamp == datetime(2025, 4, 11, 10, 36, 27).timestamp()
        assert "GPU" not in s.temps_c and set(s.extra["temps_off"]) == {"CV0", "CV1", "CV2", "GPU"}
        assert "NC" in s.power_mw and "NC_2" in s.power_mw

    def test_jp7_excerpt_keeps_unknown_tokens(self) -> None:
        (s,) = (parse_tegrastats_line(x) for x in recorded_lines("orin_jp7_excerpt.log"))
        assert (s.gpu_util_pct, s.gpu_freq_mhz, s.emc_util_pct, s.emc_freq_mhz) == (0, 1300, 3, 3199)
        assert s.temps_c == {"cpu": 52.968} and s.extra["temps_max_c"] == {"cpu": 52.968}
        assert s.cpus is None  # the quoted CPU list is elided with "...": not guessed
        assert "..." in s.extra["unparsed"]
        assert s.extra["NVENC0"] == "off"


class TestThor:
    def test_no_gpu_utilization_three_valued_rails(self) -> None:
        s = parse_tegrastats_line(recorded_lines("thor_jp7.log")[0])
        assert s.gpu_util_pct is None and s.gpu_freq_mhz is None  # no GR3D_FREQ token at all
        assert s.emc_util_pct is None
        assert s.power_mw["VIN"] == {"cur": 87426, "avg": 43713}
        assert s.extra["power_max_mw"]["VIN"] == 87426
        assert len(s.cpus) == 14 and s.temps_c["tj"] == 63.281

    def test_temperature_with_max_suffix(self) -> None:
        s = parse_tegrastats_line(recorded_lines("thor_jp7.log")[1])
        assert s.temps_c["gpu"] == 41.843 and s.extra["temps_max_c"]["gpu"] == 41.843

    def test_gpc_array_without_utilization(self) -> None:
        s = parse_tegrastats_line("RAM 3429/125749MB (lfb 120x4MB) EMC_FREQ @4266 GR3D_FREQ @[1574,off,1574]")
        assert s.gpu_util_pct is None and s.gpu_freq_mhz == 1574
        assert s.extra["gpc_freq_mhz"] == [1574, None, 1574]
        assert (s.emc_util_pct, s.emc_freq_mhz) == (None, 4266)


class TestErrors:
    @pytest.mark.parametrize("bad", ["", "   ", "hello world", "RAM x/yMB", "Segmentation fault (core dumped)"])
    def test_garbage_raises(self, bad: str) -> None:
        with pytest.raises(TelemetryError):
            parse_tegrastats_line(bad)

    def test_bad_timestamp_raises(self) -> None:
        with pytest.raises(TelemetryError, match="timestamp"):
            parse_tegrastats_line("13-45-2025 10:00:00 RAM 1/2MB")

    def test_unknown_tokens_are_kept_not_fatal(self) -> None:
        s = parse_tegrastats_line("RAM 100/200MB FUTURE_ENGINE 12%@300 weird-token VDD_NEW 5mW/6mW")
        assert s.extra["FUTURE_ENGINE"] == {"util_pct": 12, "freq_mhz": 300}
        assert s.extra["unparsed"] == ["weird-token"]
        assert s.power_mw["VDD_NEW"] == {"cur": 5, "avg": 6}

    def test_line_without_timestamp_uses_now(self) -> None:
        assert parse_tegrastats_line("RAM 1/2MB", now=123.0).timestamp == 123.0

    def test_from_dict_rejects_unknown_fields(self) -> None:
        with pytest.raises(TelemetryError, match="unknown fields"):
            Sample.from_dict({"timestamp": 1.0, "bogus": 1})


class TestGenerations:
    """The generation table: each entry's recorded log parses and shows what the entry says it adds."""

    def test_each_generation_has_its_recorded_log_and_its_tokens(self):
        from cuvil_edge.telemetry.tegrastats import _BY_NAME, GENERATIONS

        for gen in GENERATIONS:
            lines = recorded_lines(gen.log)
            assert lines, gen.name
            samples = [parse_tegrastats_line(x) for x in lines]
            assert all(s.ram_total_mb or s.cpus or s.power_mw for s in samples), gen.name
            for token in gen.tokens:
                assert any(token in x.split() for x in lines), f"{gen.name}: {token} not in {gen.log}"
        claimed = {t for gen in GENERATIONS for t in gen.tokens}
        # Every token the parser knows by name was brought by a generation (GR3D2/EMC aliases included).
        assert set(_BY_NAME) <= claimed | {"GR3D2_FREQ"}, sorted(set(_BY_NAME) - claimed)

    def test_thor_prints_no_gpu_utilization_and_orin_a_timestamp(self):
        thor = [parse_tegrastats_line(x) for x in recorded_lines("thor_jp7.log")]
        assert all(s.gpu_util_pct is None for s in thor)
        assert all("power_max_mw" in s.extra for s in thor)  # current/average/maximum rails
        stamped = [x for x in recorded_lines("orin_jp6.log") if x[:2].isdigit()]
        assert stamped and parse_tegrastats_line(stamped[0], now=0.0).timestamp > 1e9  # the line's own time
