"""The cheap checks of ``cuvil_edge.daemon.limits`` and their options, without a daemon."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from cuvil_edge.daemon.config import load
from cuvil_edge.daemon.limits import (
    JsonRefused,
    Limits,
    bearer_ok,
    finite_json_list,
    json_depth,
    loads_limited,
)
from cuvil_edge.errors import DaemonError


class TestJsonDepth:
    @pytest.mark.parametrize("text, depth", [
        (b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": []}]}', 4), (b'"[[[[["', 0), (b'["\\"[[[", [1]]', 2),
        (b'{"k\\\\": "[", "v": [[]]}', 3),
    ])
    def test_depth_outside_strings(self, text, depth):
        assert json_depth(text) == depth

    def test_linear_on_deep_and_large_input(self):
        deep = b"[" * 1_000_000 + b"]" * 1_000_000
        t0 = time.perf_counter()
        assert json_depth(deep) == 1_000_000
        assert json_depth(b"[" + b"0.125," * 2_000_000 + b"1]") == 1
        assert time.perf_counter() - t0 < 5.0


class TestLoadsLimited:
    def test_size_depth_and_constants(self):
        limits = Limits(max_json=100, max_json_depth=3)
        assert loads_limited(b'{"a": [[1]]}', limits) == {"a": [[1]]}
        with pytest.raises(JsonRefused) as big:
            loads_limited(b"[" + b"1," * 60 + b"1]", limits)
        assert big.value.status == 413
        with pytest.raises(JsonRefused, match="4 levels deep") as deep:
            loads_limited(b"[[[[1]]]]", limits)
        assert deep.value.status == 400
        for literal in (b"[NaN]", b"[Infinity]", b"[-Infinity]"):
            with pytest.raises(JsonRefused, match="not a JSON number"):
                loads_limited(literal, limits)
        with pytest.raises(JsonRefused, match="malformed JSON"):
            loads_limited(b"{", limits)
        with pytest.raises(JsonRefused, match="malformed JSON"):
            loads_limited(b"\xff\xfe", limits)


def test_finite_json_list_is_strict_json_and_reads_back():
    arr = np.array([1.5, np.nan, np.inf, -np.inf], np.float32)
    out = finite_json_list(arr)
    text = json.dumps(out, allow_nan=False)
    assert out[1:] == ["NaN", "Infinity", "-Infinity"]
    back = np.array(json.loads(text), dtype=np.float32)
    np.testing.assert_array_equal(back, arr)
    assert finite_json_list(np.arange(3)) == [0, 1, 2]


@pytest.mark.parametrize("header, ok", [
    (b"Bearer tok", True), (b"bearer tok", True), (b"BEARER  tok ", True), (b"Bearer tok2", False),
    (b"Basic tok", False), (b"tok", False), (b"", False), (None, False), (b"Bearertok", False),
])
def test_bearer_scheme(header, ok):
    assert bearer_ok(header, b"tok") is ok
    assert bearer_ok(header, None) is True


class TestOptions:
    def test_defaults_and_environment(self):
        cfg = load([], environ={"CUVIL_EDGED_MAX_CONNECTIONS": "64", "CUVIL_EDGED_MAX_JSON_DEPTH": "8"})
        limits = cfg.limits()
        assert limits.max_connections == 64 and limits.max_json_depth == 8
        assert limits.max_buffered == 256 << 20 and limits.max_json == 16 << 20
        assert limits.write_high_water == 256 << 10 and limits.max_header == 64 << 10
        assert limits.max_buffered >= limits.max_body

    @pytest.mark.parametrize("flag, value", [("--max-connections", "0"), ("--max-json-depth", "-1"),
                                             ("--max-buffered-mb", "0"), ("--max-json-mb", "-2"),
                                             ("--max-pipeline", "0"), ("--max-connections", "many")])
    def test_bad_values_name_the_option(self, flag, value):
        with pytest.raises(DaemonError, match=flag):
            load([flag, value], environ={})
