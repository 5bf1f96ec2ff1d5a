"""One table per vocabulary: the code that dispatches, the recipe parser, the CLI help and the docs agree.

Each vocabulary has one table (``recipes.CALIBRATION_METHODS``, ``recipes.QUANTIZERS``,
``telemetry.monitor.SOURCE_KINDS``); these tests fail when a name exists in one place only: in the
table but not in the dispatch, in the docs but not in the code, or the other way round.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.errors import QuantizationError, RecipeError, TelemetryError
from cuvil_edge.packager import calibrate
from cuvil_edge.packager.package import QUANTIZER_STEPS
from cuvil_edge.recipes import CALIBRATION_METHODS, QUANTIZERS, load_recipe, recipe_from_dict
from cuvil_edge.telemetry.monitor import SOURCE_KINDS, check_spec, open_source

REPO = Path(__file__).resolve().parents[2]


def docs_table(page: str, vocabulary: str) -> dict[str, str]:
    """First column (backticks stripped) -> second column of the table under the vocabulary's marker."""
    text = (REPO / "docs" / page).read_text("utf-8")
    marker = f"<!-- vocabulary: {vocabulary} "
    assert marker in text, f"docs/{page} lacks the table of {vocabulary}"
    rows = {}
    for line in text[text.index(marker):].splitlines()[3:]:
        if not line.startswith("|"):
            break
        first, second = (cell.strip() for cell in line.strip("|").split(" | ", 1))
        rows[first.strip("`")] = second
    return rows


def _help(cli, *args: str) -> str:
    """The help as a user reads it, one line per option (a terminal wide enough not to wrap)."""
    result = cli(*args, "--help", env={"COLUMNS": "1000"})
    assert result.returncode == 0, result.stderr
    return re.sub(r"\s+", " ", result.stdout)


class TestCalibrationMethods:
    def test_table_dispatch_and_docs_name_the_same_methods(self):
        assert set(calibrate.RANGE_METHODS) == set(CALIBRATION_METHODS)
        assert set(calibrate.ORT_CACHE_METHOD) == set(CALIBRATION_METHODS)
        assert list(docs_table("packager.md", "CALIBRATION_METHODS")) == list(CALIBRATION_METHODS)

    @pytest.mark.parametrize("method", list(CALIBRATION_METHODS))
    def test_every_method_gives_a_range_the_recipe_accepts(self, method):
        rec = recipe_from_dict({"name": "m", "model": {"source": "m.onnx"}, "calibration": {"method": method},
                                "target": {"board": "generic-arm64", "precision": "int8"}}, "test")
        assert rec.calibration_method == method
        collector = calibrate.RangeCollector()
        collector.add("x", np.random.default_rng(0).standard_normal(4096).astype(np.float32))
        lo, hi = collector.ranges(method, symmetric=True)["x"]
        assert -5 < lo < 0 < hi < 5, (method, lo, hi)
        assert collector.tensors_data(method, symmetric=True) is not None

    def test_unknown_method_is_refused_everywhere_with_the_known_ones(self):
        with pytest.raises(RecipeError, match="method must be percentile, mse, minmax or entropy, got 'l2'"):
            recipe_from_dict({"name": "m", "model": {"source": "m.onnx"}, "calibration": {"method": "l2"},
                              "target": {"board": "generic-arm64"}}, "t")
        with pytest.raises(QuantizationError, match="unknown calibration method 'l2'"):
            calibrate.check_method("l2")

    def test_a_recipe_with_mse_packages(self, tmp_path, keypair):
        """``method = "mse"`` was refused by the recipe parser though quantize.py offered it."""
        from cuvil_edge.bundle import verify_bundle
        from cuvil_edge.packager.package import package

        text = (REPO / "recipes" / "digits-cnn-orin-nano.toml").read_text("utf-8")
        text = text.replace('samples = 256', 'samples = 64\nmethod = "mse"').replace("samples = 500", "samples = 100")
        text = text.replace('board = "orin-nano-8gb"', 'board = "generic-arm64"')
        path = tmp_path / "digits-mse.toml"
        path.write_text(text, "utf-8")
        recipe = load_recipe(path)
        assert recipe.calibration_method == "mse"
        result = package(recipe, tmp_path / "d.cvb", keypair[0])
        assert result.report["validation"]["passed"]
        assert verify_bundle(tmp_path / "d.cvb", keypair[1]).precision == "int8"


class TestQuantizers:
    def test_table_dispatch_docs_and_help_name_the_same_quantizers(self, cli):
        assert set(QUANTIZER_STEPS) == set(QUANTIZERS)
        assert list(docs_table("packager.md", "QUANTIZERS")) == list(QUANTIZERS)
        for command in ("package", "quantize"):
            shown = _help(cli, command)
            for name, what in QUANTIZERS.items():
                assert f"{name}: {what}" in shown, (command, name)


class TestTelemetrySources:
    def test_table_docs_and_help_name_the_same_sources(self, cli):
        docs = docs_table("daemon.md", "SOURCE_KINDS")
        assert list(docs) == [kind.usage for kind in SOURCE_KINDS.values()]
        assert list(docs.values()) == [kind.what for kind in SOURCE_KINDS.values()]
        shown = _help(cli, "telemetry", "watch")
        for kind in SOURCE_KINDS.values():
            assert kind.usage in shown

    def test_every_kind_opens_and_unknown_ones_are_refused(self, tmp_path):
        log = tmp_path / "t.log"
        log.write_text((REPO / "tests" / "data" / "tegrastats" / "orin_jp6.log").read_text("utf-8"))
        specs = {"sim": "sim:orin-nano-8gb@0", "replay": f"replay:{log}@0", "sysfs": "sysfs:/"}
        for kind, spec in specs.items():
            check_spec(spec)
            with open_source(spec, interval_s=0.01) as source:
                assert source.read() is not None, kind
        live = tmp_path / "live.log"
        live.write_text("")
        check_spec(f"logfile:{live}")
        with open_source(f"logfile:{live}", interval_s=0.01) as source:
            with live.open("a") as fh:
                fh.write(next(ln for ln in log.read_text("utf-8").splitlines() if ln.startswith("RAM")) + "\n")
            assert source.read(timeout=5) is not None, "logfile"
        with pytest.raises(TelemetryError, match="unknown telemetry source 'nvml'.*sim:BOARD"):
            check_spec("nvml")
        with pytest.raises(TelemetryError, match="does not exist"):
            check_spec(f"replay:{tmp_path / 'missing.log'}")


class TestAddingANameIsOneEntry:
    """The CONTRIBUTING walkthroughs: a new calibration method or telemetry source is one table entry
    (plus its implementation), and every reader of the vocabulary picks it up."""

    def test_a_new_calibration_method(self, monkeypatch):
        from cuvil_edge import recipes

        def p999(stats, symmetric, percentile):
            return calibrate.RANGE_METHODS["percentile"](stats, symmetric, 99.9)

        monkeypatch.setitem(recipes.CALIBRATION_METHODS, "p999", "the 99.9th percentile of |x|")
        monkeypatch.setitem(calibrate.RANGE_METHODS, "p999", p999)
        monkeypatch.setitem(calibrate.ORT_CACHE_METHOD, "p999", "Percentile")
        rec = recipe_from_dict({"name": "m", "model": {"source": "m.onnx"}, "calibration": {"method": "p999"},
                                "target": {"board": "generic-arm64", "precision": "int8"}}, "test")
        assert rec.calibration_method == "p999"
        collector = calibrate.RangeCollector()
        x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
        collector.add("x", x)
        lo, hi = collector.ranges("p999", symmetric=True)["x"]
        assert abs(hi - np.percentile(np.abs(x), 99.9)) < 0.05 and lo == -hi
        assert "p999" in recipes.choices(recipes.CALIBRATION_METHODS)

    def test_a_new_telemetry_source(self, monkeypatch, tmp_path):
        from cuvil_edge.telemetry import monitor
        from cuvil_edge.telemetry.replay import ReplaySource

        log = REPO / "tests" / "data" / "tegrastats" / "xavier_jp4.log"
        kind = monitor.SourceKind("xavier-demo", "a recorded Xavier at full speed",
                                  lambda arg, interval, kw: ReplaySource(str(log), speed=0, interval_s=interval))
        monkeypatch.setitem(monitor.SOURCE_KINDS, "xavier-demo", kind)
        assert "xavier-demo" in monitor.source_usage()
        check_spec("xavier-demo")
        with open_source("xavier-demo") as source:
            assert source.read().ram_total_mb > 0
