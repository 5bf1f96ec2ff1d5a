"""Triton's nv_gpu_* and nv_energy_consumption series from Jetson telemetry.

The scrape test runs the real daemon on a replayed AGX Orin tegrastats log and parses ``/metrics``
with prometheus_client's parser (the reference for the text format), so a malformed exposition
fails too.
"""

from __future__ import annotations

import http.client
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cuvil_edge.daemon.gpu_metrics import GpuMetrics, gpu_rail, gpu_uuid, power_limit_w
from cuvil_edge.targets import get_target
from cuvil_edge.telemetry import load_log

DATA = Path(__file__).resolve().parents[1] / "data" / "tegrastats"


class TestGpuMetrics:
    def test_rail_choice_per_generation(self):
        rails = {name: {"cur": 1.0} for name in ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")}
        assert gpu_rail(rails) == "VDD_GPU_SOC"  # AGX Orin
        assert gpu_rail({"VDD_IN": {}, "VDD_CPU_GPU_CV": {}, "VDD_SOC": {}}) == "VDD_CPU_GPU_CV"  # Orin NX/Nano
        assert gpu_rail({"VDD_GPU": {}, "VDD_CPU_SOC_MSS": {}}) == "VDD_GPU"  # Thor
        assert gpu_rail({"POM_5V_IN": {}, "POM_5V_GPU": {}, "POM_5V_CPU": {}}) == "POM_5V_GPU"  # Nano
        assert gpu_rail({"VDD_IN": {}}) is None

    def test_every_recorded_board_with_rails_has_a_gpu_rail(self):
        checked = 0
        for log in sorted(DATA.glob("*.log")):
            # TX1 on L4T 28 and the elided JetPack 7 excerpt print no rails at all.
            for s in load_log(log):
                if s.power_mw:
                    assert gpu_rail(s.power_mw), (log.name, sorted(s.power_mw))
                    checked += 1
        assert checked >= 12

    def test_energy_is_the_trapezoid_integral_of_rail_power(self):
        samples = load_log(DATA / "orin_jp6.log")
        with_rail = [s for s in samples if s.power_mw.get("VDD_GPU_SOC")]
        watts = [s.power_mw["VDD_GPU_SOC"]["cur"] / 1000 for s in with_rail]
        m = GpuMetrics("agx-orin-32gb", 40)
        for i, s in enumerate(with_rail):
            m.update(s, now=100.0 + 0.5 * i)
        want = sum((a + b) / 2 * 0.5 for a, b in zip(watts, watts[1:], strict=False))
        assert m.energy_j == pytest.approx(want)
        assert m.energy_j > 0
        g = m.gauges()
        assert g["nv_gpu_power_usage"][1][0][1] == pytest.approx(watts[-1])
        assert g["nv_gpu_power_limit"][1][0][1] == 40.0
        # A sample without the rail is a gap: no energy across it, none invented after it.
        m.update(samples[0].__class__(timestamp=0.0), now=200.0)
        m.update(with_rail[0], now=201.0)
        assert m.energy_j == pytest.approx(want)

    def test_absent_figures_are_left_out(self):
        m = GpuMetrics()
        assert m.gauges() == {} and m.counters() == {}
        from cuvil_edge.telemetry.sample import Sample

        m.update(Sample(timestamp=0.0, gpu_util_pct=None, ram_total_mb=8000.0))
        g = m.gauges()
        assert g["nv_gpu_utilization"][1][0][1] is None  # rendered as absent
        assert "nv_gpu_power_usage" not in g and "nv_gpu_power_limit" not in g

    def test_power_limit_comes_from_the_board_figures(self):
        class Figures:
            max_mw = 25000

        class Board:
            figures = Figures()

        assert power_limit_w(Board()) == 25.0
        assert power_limit_w(None) is None
        assert power_limit_w(object()) is None  # a profile without power figures: absent

    def test_uuid_is_stable_and_shaped_like_nvml(self, tmp_path):
        mid = tmp_path / "machine-id"
        mid.write_text("0123456789abcdef0123456789abcdef\n")
        a = gpu_uuid("agx-orin-32gb", mid)
        assert a == gpu_uuid("agx-orin-32gb", mid) != gpu_uuid("orin-nano-8gb", mid)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", a)


def _scrape(d) -> dict[str, list]:
    conn = http.client.HTTPConnection(*d.host_port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.slow
def test_prometheus_scrape_of_a_replayed_orin_log(store, daemon_factory):
    log = DATA / "orin_jp6.log"
    recorded = load_log(log)
    d = daemon_factory(store, "--board", "agx-orin-32gb", "--telemetry", f"replay:{log}@4", "--tick", "0.2")
    deadline = time.monotonic() + 30
    families = _scrape(d)
    while time.monotonic() < deadline and "nv_energy_consumption" not in families:
        time.sleep(0.3)
        families = _scrape(d)
    uuid_label = None
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                 "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
        if name == "nv_gpu_power_limit" and name not in families:
            continue  # checked below
        assert name in families, f"{name} missing from /metrics"
        samples = families[name].samples
        assert len(samples) == 1 and set(samples[0].labels) == {"gpu_uuid"}, samples
        uuid_label = uuid_label or samples[0].labels["gpu_uuid"]
        assert samples[0].labels["gpu_uuid"] == uuid_label  # one GPU, one label, as Triton
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", uuid_label)

    def value(name: str) -> float:
        return families[name].samples[0].value

    assert 0.0 <= value("nv_gpu_utilization") <= 1.0
    totals = {int(s.ram_total_mb * 1048576) for s in recorded}
    assert int(value("nv_gpu_memory_total_bytes")) in totals  # the board's RAM (unified memory)
    assert 0 < value("nv_gpu_memory_used_bytes") <= value("nv_gpu_memory_total_bytes")
    rail_watts = {s.power_mw["VDD_GPU_SOC"]["cur"] / 1000 for s in recorded if "VDD_GPU_SOC" in s.power_mw}
    assert value("nv_gpu_power_usage") in rail_watts  # 2.3 to 4.9 W on the recorded AGX Orin
    # The limit is the board profile's highest power mode, where the profile carries power figures.
    figures = getattr(get_target("agx-orin-32gb"), "figures", None)
    if figures is not None:
        assert value("nv_gpu_power_limit") == figures.max_mw / 1000  # AGX Orin 32GB: MAXN 40 W
    else:
        assert "nv_gpu_power_limit" not in families  # absent, never a made-up figure
    assert families["nv_energy_consumption"].type == "counter"  # as Triton's
    energy = value("nv_energy_consumption")
    # Joules: at most the highest recorded rail power over the time the daemon has run.
    assert 0 < energy <= max(rail_watts) * 40
    # The board series stay beside Triton's.
    assert "cuvil_board_ram_total_bytes" in families and "cuvil_board_power_milliwatts" in families
    assert families["cuvil_gpu_power_rail_info"].samples[0].labels["rail"] == "VDD_GPU_SOC"
