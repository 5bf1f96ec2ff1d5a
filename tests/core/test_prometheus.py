"""The one Prometheus text parser: what top shows and what loadgen keeps come from the same reading."""

from __future__ import annotations

from cuvil_edge._prometheus import flatten, parse_prometheus, series_key

TEXT = """# HELP cuvil_board_power_milliwatts Power per rail
# TYPE cuvil_board_power_milliwatts gauge
cuvil_board_power_milliwatts{rail="VDD_IN"} 4500
cuvil_board_power_milliwatts{rail="VDD_CPU_GPU_CV"} 1200.5
cuvil_prefetch_depth{model="d,{x}",version="1.0.0"} 2
nv_inference_count{model="d",version="1"} 10
a line that is not a sample
cuvil_memory_budget_bytes 7e9
"""


def test_labels_with_braces_and_commas_and_odd_lines():
    samples = parse_prometheus(TEXT)
    assert samples["cuvil_board_power_milliwatts"] == [({"rail": "VDD_IN"}, 4500.0),
                                                       ({"rail": "VDD_CPU_GPU_CV"}, 1200.5)]
    assert samples["cuvil_prefetch_depth"] == [({"model": "d,{x}", "version": "1.0.0"}, 2.0)]
    assert samples["cuvil_memory_budget_bytes"] == [({}, 7e9)]
    assert "a" not in samples


def test_loadgen_keeps_the_series_it_names_as_written():
    from cuvil_edge.loadgen import _KEEP, _parse_metrics

    kept = _parse_metrics(TEXT)
    assert kept == flatten(parse_prometheus(TEXT), _KEEP)
    assert kept['cuvil_board_power_milliwatts{rail="VDD_IN"}'] == 4500.0
    assert "nv_inference_count" not in "".join(kept)
    assert series_key("x", {"k": 'a"b'}) == 'x{k="a\\"b"}'
