"""The packager's module layout: one job per module, one CLI module, no private names across modules.

Also: engine plans read the bundle's typed manifest and give the plan the bundle carries.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import typer
from onnx import TensorProto, helper

import cuvil_edge
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.errors import ModelError, RecipeError
from cuvil_edge.packager.engine_plan import PlanRequest, make_build_plan, make_build_plans
from cuvil_edge.targets import JetPackRelease, get_target

PACKAGE = Path(cuvil_edge.__file__).resolve().parent
PACKAGER = PACKAGE / "packager"


def test_the_inspect_report_reexports_the_answers_it_is_made_of():
    """Callers of ``packager.inspect`` from before the split get the very same objects."""
    from cuvil_edge.packager import dla_rules, inspect, profiles, trt_support

    assert inspect.trt_op_status is trt_support.trt_op_status
    assert inspect.parser_snapshot is trt_support.parser_snapshot
    assert inspect.dla_available is dla_rules.dla_available
    assert inspect.optimization_profiles is profiles.optimization_profiles
    assert inspect.DynamicInput is profiles.DynamicInput


@pytest.mark.parametrize("gone", ["cuvil_edge.packager.engine", "cuvil_edge.packager.engine_store",
                                  "cuvil_edge.packager.engine_cli"])
def test_split_and_shim_modules_are_gone(gone):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


def _imports(path: Path) -> list[ast.ImportFrom]:
    return [n for n in ast.walk(ast.parse(path.read_text("utf-8"))) if isinstance(n, ast.ImportFrom)]


def test_no_private_name_crosses_a_module_border():
    """A ``_name`` is its module's own: the packager neither imports others' nor lends its own."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _imports(path):
            module = node.module or ""
            into_packager = module.startswith("cuvil_edge.packager")
            from_packager = path.is_relative_to(PACKAGER)
            if not module.startswith("cuvil_edge") or not (into_packager or from_packager):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: from {module} import {alias.name}")
    assert found == []


def test_only_the_cli_module_speaks_typer():
    """Every packager command lives in packager/cli.py; the other modules are plain functions."""
    speaking = []
    for path in sorted(PACKAGER.glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                 for a in n.names} | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                                      if isinstance(n, ast.ImportFrom)}
        if "typer" in names or "click" in names:
            speaking.append(path.name)
    assert speaking == ["cli.py"]


def test_one_register_adds_every_packager_command():
    from cuvil_edge import cli as entry
    from cuvil_edge.packager.cli import register

    app = typer.Typer()
    register(app)
    assert [c.name for c in app.registered_commands] == ["package", "inspect", "quantize", "validate"]
    assert [g.name for g in app.registered_groups] == ["engine"]
    group = app.registered_groups[0].typer_instance
    assert [c.name for c in group.registered_commands] == ["plan", "build"]
    assert [m for m in entry._COMMAND_MODULES if m.startswith("cuvil_edge.packager")] == ["cuvil_edge.packager.cli"]


# ------------------------------------------------------------------------------ plans from a manifest


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    """A Conv model with a dynamic batch and dynamic H/W: its plan needs the manifest's shapes."""
    x = helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], [0.1] * 108)
    graph = helper.make_graph([helper.make_node("Conv", ["img", "w"], ["y"], pads=[1, 1, 1, 1])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("plans") / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _manifest(**fields) -> Manifest:
    data = {"format": "cuvil-bundle/1", "name": "m", "version": "1.0.0", "target": {"name": "orin-nano-8gb"},
            "precision": "fp16", "format_kind": "tensorrt", "model": "model.onnx",
            "inputs": [{"name": "img", "dtype": "float32", "shape": [-1, 3, 96, 128]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [-1, 4, 96, 128]}],
            "files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 1}], "max_batch": 4}
    data.update(fields)
    return Manifest.from_dict(data)


class TestPlanRequest:
    def test_a_typed_manifest_gives_the_plan_its_fields_say(self, dynamic_model):
        target = get_target("orin-nano-8gb")
        release = target.releases[-1]
        plan = make_build_plan(dynamic_model, _manifest(), target, release)
        assert plan["precision"] == "fp16" and plan["max_batch"] == 4
        assert plan["profiles"] == [{"img": {"min": [1, 3, 96, 128], "opt": [4, 3, 96, 128], "max": [4, 3, 96, 128]}}]
        assert plan["unresolved_inputs"] == []
        # The same request from manifest-shaped fields (scripts, tests) plans the same engine.
        same = make_build_plan(dynamic_model, _manifest().to_dict(), target, release)
        assert json.dumps(same, sort_keys=True) == json.dumps(plan, sort_keys=True)

    def test_the_mixed_searchs_tiers_reach_the_plan(self, dynamic_model):
        target = get_target("orin-nano-8gb")
        trt10 = next(r for r in target.releases if r.tensorrt.startswith("10."))
        request = PlanRequest.from_manifest(_manifest(precision="mixed"), layer_fp16=["b", "a"], layer_fp32=["c"])
        assert (request.layer_fp16, request.layer_fp32) == (("a", "b"), ("c",))
        plan = make_build_plan(dynamic_model, request, target, trt10)
        assert plan["layer_precisions"] == {"fp32": ["c"]} and "OBEY_PRECISION_CONSTRAINTS" in plan["builder_flags"]

    def test_bad_values_are_refused_naming_the_field(self, dynamic_model):
        target = get_target("orin-nano-8gb")
        release = target.releases[-1]
        with pytest.raises(RecipeError, match="precision 'int4'"):
            make_build_plan(dynamic_model, PlanRequest(precision="int4"), target, release)
        with pytest.raises(RecipeError, match="max_batch"):
            make_build_plan(dynamic_model, PlanRequest(max_batch=0), target, release)
        with pytest.raises(ModelError, match="dla_core"):
            make_build_plan(dynamic_model, PlanRequest(precision="fp16", dla_core=-2), target, release)

    def test_a_dla_request_is_dropped_only_where_tensorrt_has_no_dla(self, dynamic_model):
        # An AGX Orin given a TensorRT 11 release (no DLA through 11.4.0) besides its own.
        orin = get_target("agx-orin-64gb")
        trt11 = JetPackRelease(jetpack="7.x-hypothetical", l4t="38.4.0", tensorrt="11.2.0", cuda="13.0")
        target = dataclasses.replace(orin, releases=(*orin.releases, trt11))
        request = PlanRequest(precision="fp16", max_batch=2, dla_core=1, input_shapes={"img": [1, 3, 96, 128]})
        plans = make_build_plans(dynamic_model, request, target)
        assert [(p["tensorrt"], p["dla"]) for p in plans] == [
            ("8.5.2", {"core": 1, "gpu_fallback": True}), ("8.6.2", {"core": 1, "gpu_fallback": True}),
            ("10.3.0", {"core": 1, "gpu_fallback": True}), ("11.2.0", None)]
        assert plans[-1]["engine_key"]["dla_core"] is None
