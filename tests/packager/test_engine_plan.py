"""Engine build plans per target and TensorRT version, keys and the builder (remote builds: tests/engines)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.bundle.engine_key import EngineKey, engine_cache_key, plan_digest
from cuvil_edge.bundle.engine_plan import PLAN_FORMAT, load_plan, validate_plan
from cuvil_edge.bundle.engine_store import EngineStore
from cuvil_edge.errors import CuvilEdgeError, ModelError, RecipeError
from cuvil_edge.packager.engine_build import EngineFromOnnx, build_engine
from cuvil_edge.packager.engine_plan import (
    make_build_plan,
    make_build_plans,
    plan_member_name,
    workspace_bytes,
)
from cuvil_edge.targets import JetPackRelease, get_target

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
TRT11 = JetPackRelease(jetpack="7.x-hypothetical", l4t="38.4.0", tensorrt="11.2.0", cuda="13.0")


def _release(target: str, jetpack: str) -> JetPackRelease:
    return next(r for r in get_target(target).releases if r.jetpack == jetpack)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A real float model (EfficientNet-Lite0), a symmetric Q/DQ digits CNN and an FP16-cast model."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from cuvil_edge.models import build_digits_cnn, build_efficientnet_lite0

    d = tmp_path_factory.mktemp("models")
    effnet = build_efficientnet_lite0(d / "effnet.onnx")
    digits = build_digits_cnn(d / "digits.onnx")
    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"input": rng.random((1, 1, 8, 8), dtype=np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    qdq = d / "digits-int8.onnx"
    quantize_static(str(digits), str(qdq), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    # FP16 inside, FP32 at the boundary (what an FP16 conversion keeping IO types produces).
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])
    w = numpy_helper.from_array(np.eye(4, dtype=np.float16), "W")
    nodes = [helper.make_node("Cast", ["input"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["h", "W"], ["m"]),
             helper.make_node("Cast", ["m"], ["out"], to=TensorProto.FLOAT)]
    fp16 = d / "fp16.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "fp16", [x], [y], [w]),
                                opset_imports=[helper.make_opsetid("", 17)]), str(fp16))
    return {"effnet": effnet, "qdq": qdq, "fp16": fp16, "digits": digits}


class TestPlans:
    def test_orin_nano_jetpack62_trt103_fp16(self, models):
        target = get_target("orin-nano-8gb")
        plan = make_build_plan(models["effnet"], {"precision": "fp16", "max_batch": 8}, target,
                               _release("orin-nano-8gb", "6.2"))
        assert plan["format"] == PLAN_FORMAT
        assert (plan["tensorrt"], plan["l4t"], plan["sm"]) == ("10.3.0", "36.4.3", "8.7")
        assert plan["precision_mode"] == "builder_flags"
        assert plan["builder_flags"] == ["FP16"] and plan["network_flags"] == []
        assert plan["workspace"] == {"bytes": 1 << 30, "api": "set_memory_pool_limit"}  # 8 GB / 8
        assert plan["profiles"] == [{"input": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224],
                                               "max": [8, 3, 224, 224]}}]
        assert plan["dla"] is None
        digest = plan_digest(plan)
        assert plan["engine_key"] == {"module": "orin-nano-8sm-8gb", "l4t": "36.4.3", "tensorrt": "10.3.0",
                                      "sm": "8.7", "dla_core": None, "plan": digest}
        slug = f"orin-nano-8sm-8gb_l4t-36.4.3_trt-10.3.0_sm8.7_dlanone_plan-{digest}"
        assert plan["engine_file"] == f"{slug}.engine" and plan["timing_cache"] == f"{slug}.timing.cache"
        assert "trtexec_command" not in plan  # TensorRT 10 on JetPack 6: cuvil-edge builds it on the board
        assert plan["model"]["sha256"] == __import__("hashlib").sha256(models["effnet"].read_bytes()).hexdigest()
        assert plan["build_command"][:4] == ["cuvil-edge", "engine", "build", "--plan"]
        assert plan["model"]["path"] == "model.onnx" and plan["unresolved_inputs"] == []
        assert plan_member_name(plan) == "engine/plan-trt10.3.0.json"
        assert plan["warnings"] == []
        json.dumps(plan)  # JSON-able

    def test_xavier_trt85_int8_on_dla(self, models):
        target = get_target("agx-xavier")
        plan = make_build_plan(models["qdq"], {"precision": "int8", "max_batch": 4}, target,
                               _release("agx-xavier", "5.1.3"), dla_core=1)
        assert plan["tensorrt"] == "8.5.2"
        assert plan["network_flags"] == ["EXPLICIT_BATCH"]
        assert plan["builder_flags"] == ["FP16", "INT8"]
        assert plan["dla"] == {"core": 1, "gpu_fallback": True}
        # DLA takes fixed shapes: min = opt = max
        assert plan["profiles"] == [{"input": {"min": [4, 1, 8, 8], "opt": [4, 1, 8, 8], "max": [4, 1, 8, 8]}}]
        assert plan["engine_file"].startswith("agx-xavier-8sm-32gb_l4t-35.5.0_trt-8.5.2_sm7.2_dla1_plan-")
        assert any("Q/DQ on DLA" in w for w in plan["warnings"])
        # JetPack 5 is package-only: the plan says how to build the engine by hand.
        assert plan["trtexec_command"] == [
            "/usr/src/tensorrt/bin/trtexec", "--onnx=model.onnx", f"--saveEngine={plan['engine_file']}",
            f"--timingCacheFile={plan['timing_cache']}", "--memPoolSize=workspace:4096", "--fp16", "--int8",
            "--minShapes=input:4x1x8x8", "--optShapes=input:4x1x8x8", "--maxShapes=input:4x1x8x8",
            "--useDLACore=1", "--allowGPUFallback"]

    def test_xavier_trt82_uses_the_old_workspace_api(self, models):
        plan = make_build_plan(models["digits"], {"precision": "fp16"}, get_target("xavier-nx"),
                               _release("xavier-nx", "4.6.4"))
        assert plan["workspace"]["api"] == "max_workspace_size"

    def test_thor_trt1013(self, models):
        target = get_target("agx-thor")
        plan = make_build_plan(models["effnet"], {"precision": "fp32", "max_batch": 2}, target,
                               _release("agx-thor", "7.0"))
        assert (plan["tensorrt"], plan["sm"], plan["cuda"]) == ("10.13.3", "11.0", "13.0")
        assert plan["builder_flags"] == [] and plan["network_flags"] == []
        assert plan["workspace"]["bytes"] == 4 << 30  # capped
        with pytest.raises(ModelError, match="0 DLA core"):
            make_build_plan(models["effnet"], {"precision": "fp16"}, target, _release("agx-thor", "7.0"), dla_core=0)

    def test_hypothetical_trt11_is_strongly_typed(self, models):
        target = get_target("agx-thor")
        plan = make_build_plan(models["qdq"], {"precision": "int8", "max_batch": 8}, target, TRT11)
        assert plan["precision_mode"] == "strongly_typed"
        assert plan["builder_flags"] == [] and plan["network_flags"] == []
        assert plan["warnings"] == []
        fp16 = make_build_plan(models["fp16"], {"precision": "fp16"}, target, TRT11)
        assert fp16["warnings"] == []
        # FP32 ONNX asked to run in FP16 on 11.x: no flag can do it, the plan says so.
        plain = make_build_plan(models["effnet"], {"precision": "fp16"}, target, TRT11)
        assert any("no float16 tensors" in w for w in plain["warnings"])
        with pytest.raises(ModelError, match="places no layers on DLA"):
            make_build_plan(models["qdq"], {"precision": "int8"}, get_target("agx-orin-64gb"), TRT11, dla_core=0)

    def test_trt10_strongly_typed_on_request(self, models):
        plan = make_build_plan(models["qdq"], {"precision": "int8", "engine": {"strongly_typed": True}},
                               get_target("orin-nx-16gb"), _release("orin-nx-16gb", "6.2"))
        assert plan["precision_mode"] == "strongly_typed"
        assert plan["network_flags"] == ["STRONGLY_TYPED"] and plan["builder_flags"] == []

    def test_no_trt8_plan_is_strongly_typed(self, models):
        """TensorRT 8.x has no NetworkDefinitionCreationFlag.STRONGLY_TYPED (new in 10.0)."""
        plans = make_build_plans(models["qdq"], {"precision": "int8", "engine": {"strongly_typed": True}},
                                 get_target("agx-orin-64gb"))
        by_trt = {p["tensorrt"]: p for p in plans}
        for trt in ("8.5.2", "8.6.2"):
            assert "STRONGLY_TYPED" not in by_trt[trt]["network_flags"], trt
            assert by_trt[trt]["precision_mode"] == "builder_flags"
            assert any("need TensorRT >= 10" in w for w in by_trt[trt]["warnings"])
            assert by_trt[trt]["trtexec_command"][0].endswith("trtexec")
            assert "--stronglyTyped" not in by_trt[trt]["trtexec_command"]
        assert by_trt["10.3.0"]["network_flags"] == ["STRONGLY_TYPED"]
        edited = {**by_trt["8.6.2"], "network_flags": ["EXPLICIT_BATCH", "STRONGLY_TYPED"]}
        with pytest.raises(ModelError, match="STRONGLY_TYPED needs TensorRT >= 10"):
            validate_plan(edited)

    def test_qdq_model_gets_int8_even_when_labelled_mixed(self, models):
        plan = make_build_plan(models["qdq"], {"precision": "mixed"}, get_target("orin-nano-8gb"),
                               _release("orin-nano-8gb", "6.2"))
        assert plan["builder_flags"] == ["INT8"]  # layers kept in FP32 stay FP32

    def test_plans_for_every_release(self, models):
        plans = make_build_plans(models["effnet"], {"precision": "fp16", "max_batch": 2},
                                 get_target("agx-orin-64gb"), dla_core=0)
        assert [p["tensorrt"] for p in plans] == ["8.5.2", "8.6.2", "10.3.0"]
        assert all(p["dla"] == {"core": 0, "gpu_fallback": True} for p in plans)
        assert len({p["engine_file"] for p in plans}) == 3
        assert ["trtexec_command" in p for p in plans] == [True, True, False]

    def test_bad_inputs(self, models, tmp_path):
        nano, rel = get_target("orin-nano-8gb"), _release("orin-nano-8gb", "6.2")
        with pytest.raises(ModelError, match="no NVIDIA GPU"):
            make_build_plan(models["effnet"], {}, get_target("x86-host"), rel)
        with pytest.raises(RecipeError, match="precision 'int4'"):
            make_build_plan(models["effnet"], {"precision": "int4"}, nano, rel)
        with pytest.raises(RecipeError, match="max_batch"):
            make_build_plan(models["effnet"], {"max_batch": 0}, nano, rel)
        with pytest.raises(ModelError, match="DLA runs FP16 or INT8"):
            make_build_plan(models["effnet"], {"precision": "fp32"}, get_target("orin-nx-16gb"),
                            _release("orin-nx-16gb", "6.2"), dla_core=0)
        junk = tmp_path / "junk.onnx"
        junk.write_bytes(b"not onnx at all")
        with pytest.raises(ModelError, match="junk.onnx"):
            make_build_plan(junk, {}, nano, rel)

    def test_dynamic_spatial_dims_take_the_manifest_shape(self, tmp_path):
        x = helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, "H", "W"])
        y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3, "H", "W"])
        path = tmp_path / "dyn.onnx"
        onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["img"], ["out"])], "d", [x], [y]),
                                    opset_imports=[helper.make_opsetid("", 17)]), str(path))
        nano, rel = get_target("orin-nano-8gb"), _release("orin-nano-8gb", "6.2")
        open_plan = make_build_plan(path, {"max_batch": 2}, nano, rel)
        assert open_plan["unresolved_inputs"] == ["img"] and open_plan["profiles"] == []
        assert any("'H'" in w for w in open_plan["warnings"])
        plan_file = tmp_path / "open.json"
        plan_file.write_text(json.dumps(open_plan))
        with pytest.raises(ModelError, match=r"\['img'\] have dynamic dimensions"):
            build_engine(plan_file, path, tmp_path / "e.engine")
        plan = make_build_plan(path, {"max_batch": 2, "inputs": [{"name": "img", "dtype": "float32",
                                                                  "shape": [-1, 3, 480, 640]}]}, nano, rel)
        assert plan["profiles"] == [{"img": {"min": [1, 3, 480, 640], "opt": [2, 3, 480, 640],
                                             "max": [2, 3, 480, 640]}}]

    def test_plugins_used_by_the_model_are_listed(self, tmp_path, monkeypatch):
        x = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
        vals = helper.make_tensor_value_info("values", TensorProto.FLOAT, ["N", 3])
        idx = helper.make_tensor_value_info("indices", TensorProto.INT32, ["N", 3])
        node = helper.make_node("topk", ["logits"], ["values", "indices"], domain="cuvil", k=3,
                                plugin_namespace="cuvil", plugin_version="1")
        path = tmp_path / "topk.onnx"
        onnx.save(helper.make_model(helper.make_graph([node], "p", [x], [vals, idx]),
                                    opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("cuvil", 1)]),
                  str(path))
        # JetPack 6.2's TensorRT 10.3 has no tensorrt.plugin and no C++ plugin library is shipped:
        # refused at package time, with the reason.
        with pytest.raises(ModelError, match=r"cuvil::topk.*TensorRT 10.3.0 \(JetPack 6.2\) has no tensorrt.plugin"):
            make_build_plan(path, {"max_batch": 4}, get_target("orin-nano-8gb"), _release("orin-nano-8gb", "6.2"))
        plan = make_build_plan(path, {"max_batch": 4}, get_target("agx-thor"), _release("agx-thor", "7.0"))
        assert plan["plugins"] == ["cuvil::topk"]
        # The builder registers the plugins before parsing; without tensorrt.plugin that fails clearly.
        from trt_recorder import make_tensorrt

        monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt("10.13.3")[0])
        with pytest.raises(ModelError, match=r"tensorrt >= 10.6 with tensorrt.plugin"):
            EngineFromOnnx(path, plan)()

    def test_workspace_bounds(self):
        assert workspace_bytes(get_target("orin-nano-4gb")) == 512 << 20
        assert workspace_bytes(get_target("agx-orin-64gb")) == 4 << 30


class TestKeysAndCache:
    def test_key_is_stable(self, models):
        key = engine_cache_key("orin-nano-8sm-8gb", "36.4.3", "10.3.0", "8.7", None, "0123456789ab")
        assert str(key) == "orin-nano-8sm-8gb_l4t-36.4.3_trt-10.3.0_sm8.7_dlanone_plan-0123456789ab"
        assert key == EngineKey("orin-nano-8sm-8gb", "36.4.3", "10.3.0", "8.7", None, "0123456789ab")
        assert EngineKey.from_dict(key.to_dict()) == key
        with pytest.raises(ModelError, match="lacks field 'module'"):
            EngineKey.from_dict({"l4t": "36.4.3", "tensorrt": "10.3.0", "sm": "8.7", "dla_core": None})
        target, rel = get_target("orin-nano-8gb"), _release("orin-nano-8gb", "6.2")
        a = make_build_plan(models["effnet"], {"precision": "fp16"}, target, rel)
        b = make_build_plan(models["effnet"], {"precision": "fp16"}, target, rel)
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        assert a["engine_key"]["plan"] == plan_digest(a)
        # Another module of the same SM: another key for the same bundle.
        agx = make_build_plan(models["effnet"], {"precision": "fp16"}, get_target("agx-orin-64gb"), rel)
        assert agx["engine_key"]["module"] == "agx-orin-16sm-64gb" and agx["engine_file"] != a["engine_file"]
        # Same board and shapes, different model -> same key, different cache entry.
        c = make_build_plan(models["digits"], {"precision": "fp16"}, target, rel)
        d = make_build_plan(models["digits"], {"precision": "fp16", "max_batch": 1}, target, rel)
        assert c["engine_key"] == d["engine_key"]
        store, key = EngineStore(Path("/nonexistent-root")), EngineKey.from_dict(c["engine_key"])
        assert store.plan_path(key, c["model"]["sha256"]) != store.plan_path(key, a["model"]["sha256"])
        e = make_build_plan(models["digits"], {"precision": "fp16", "max_batch": 4}, target, rel)
        assert e["engine_key"]["plan"] != c["engine_key"]["plan"]

    @pytest.mark.parametrize("bad", [("", "36.4.3", "10.3.0", "8.7", None, "ab"),
                                     ("m", "36.4.3", "10_3", "8.7", None, "ab"),
                                     ("m", "36.4.3", "10.3.0", "../x", None, "ab"),
                                     ("m", "36.4.3", "10.3.0", "8.7", None, "")])
    def test_key_rejects_ambiguous_parts(self, bad):
        with pytest.raises(ModelError, match="engine key"):
            engine_cache_key(*bad)
        with pytest.raises(ModelError, match="dla_core"):
            engine_cache_key("m", "36.4.3", "10.3.0", "8.7", -1, "ab")

    def test_plan_files_validate(self, models, tmp_path):
        plan = make_build_plan(models["digits"], {}, get_target("orin-nano-8gb"), _release("orin-nano-8gb", "6.2"))
        p = tmp_path / "plan.json"
        p.write_text(json.dumps(plan))
        assert load_plan(p) == plan
        with pytest.raises(ModelError, match="no such plan"):
            load_plan(tmp_path / "missing.json")
        p.write_text("{not json")
        with pytest.raises(ModelError, match="not a JSON engine plan"):
            load_plan(p)
        with pytest.raises(ModelError, match="format"):
            validate_plan({**plan, "format": "other/1"})
        with pytest.raises(ModelError, match="engine_file"):
            validate_plan({**plan, "engine_file": "x.engine"})
        with pytest.raises(ModelError, match="edited after packaging"):
            validate_plan({**plan, "max_batch": 64})
        broken = dict(plan)
        del broken["profiles"]
        with pytest.raises(ModelError, match="'profiles'"):
            validate_plan(broken)


class TestBuilder:
    def _plan(self, models, model="effnet", release=None, **manifest):
        release = release or _release("orin-nano-8gb", "6.2")
        return make_build_plan(models[model], {"precision": "fp16", "max_batch": 4, **manifest},
                               get_target("agx-orin-64gb"), release)

    @pytest.mark.skipif(HAVE_TRT, reason="checks the error raised where TensorRT is missing")
    def test_missing_tensorrt_names_the_extra(self, models, tmp_path):
        plan = self._plan(models)
        p = tmp_path / "plan.json"
        p.write_text(json.dumps(plan))
        with pytest.raises(CuvilEdgeError, match=r"pip install cuvil-edge\[jetson\]"):
            build_engine(p, models["effnet"], tmp_path / "out.engine")
        assert not (tmp_path / "out.engine").exists()
        with pytest.raises(CuvilEdgeError, match=r"cuvil-edge\[jetson\]"):
            EngineFromOnnx(models["effnet"], plan)()

    def test_model_must_match_the_plan(self, models, tmp_path):
        p = tmp_path / "plan.json"
        p.write_text(json.dumps(self._plan(models)))
        with pytest.raises(ModelError, match="not the model the plan was made for"):
            build_engine(p, models["digits"], tmp_path / "out.engine")

    def test_trt10_call_order(self, models, tmp_path, monkeypatch):
        from trt_recorder import make_tensorrt, names

        trt, calls = make_tensorrt("10.3.0")
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        plan = self._plan(models, precision="int8", model="qdq")
        engine = EngineFromOnnx(models["qdq"], plan, timing_cache=tmp_path / "t.cache")()
        assert engine == b"serialized-by-recorder"
        assert (tmp_path / "t.cache").read_bytes() == b"timing-bytes"
        assert names(calls) == [
            "Logger", "Builder", "builder.create_network", "OnnxParser", "parser.parse_from_file",
            "builder.create_builder_config", "config.set_memory_pool_limit",
            "config.set_flag", "config.set_flag",
            "builder.create_optimization_profile", "profile.set_shape", "config.add_optimization_profile",
            "config.create_timing_cache", "config.set_timing_cache",
            "builder.build_serialized_network", "config.get_timing_cache", "timing_cache.serialize",
        ]
        by_name = {c[0]: c for c in calls}
        assert by_name["builder.create_network"][1] == (0,)
        assert [c[1][0] for c in calls if c[0] == "config.set_flag"] == ["BuilderFlag.FP16", "BuilderFlag.INT8"]
        assert by_name["config.set_memory_pool_limit"][1] == ("MemoryPoolType.WORKSPACE", 4 << 30)  # AGX Orin 64 GB: capped
        assert by_name["profile.set_shape"][1] == ("input", (1, 1, 8, 8), (4, 1, 8, 8), (4, 1, 8, 8))

    def test_a_refused_timing_cache_starts_fresh(self, models, tmp_path, monkeypatch, caplog):
        from trt_recorder import make_tensorrt

        trt, calls = make_tensorrt("10.3.0", cache_refused=True)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        cache = tmp_path / "t.cache"
        cache.write_bytes(b"cache from another TensorRT")
        EngineFromOnnx(models["qdq"], self._plan(models, precision="int8", model="qdq"), timing_cache=cache)()
        lines = [r.getMessage() for r in caplog.records]
        made = [c[1][0] for c in calls if c[0] == "config.create_timing_cache"]
        assert made == [b"cache from another TensorRT", b""]
        assert [c[0] for c in calls].count("config.set_timing_cache") == 2
        assert any("refused by TensorRT 10.3.0; starting a fresh one" in ln for ln in lines)
        assert cache.read_bytes() == b"timing-bytes"

    def test_trt11_builds_strongly_typed_without_flags(self, models, monkeypatch):
        from trt_recorder import make_tensorrt, names

        trt, calls = make_tensorrt("11.2.0")
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        plan = make_build_plan(models["qdq"], {"precision": "int8"}, get_target("agx-thor"), TRT11)
        EngineFromOnnx(models["qdq"], plan)()
        assert "config.set_flag" not in names(calls)
        assert dict((c[0], c[1]) for c in calls)["builder.create_network"] == (0,)

    def test_trt8_dla_build(self, models, monkeypatch):
        from trt_recorder import make_tensorrt

        trt, calls = make_tensorrt("8.5.2")
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        plan = make_build_plan(models["qdq"], {"precision": "int8"}, get_target("agx-xavier"),
                               _release("agx-xavier", "5.1.3"), dla_core=0)
        EngineFromOnnx(models["qdq"], plan)()
        recorded = [(c[0], c[1]) for c in calls]
        assert ("builder.create_network", (1 << 0,)) in recorded  # EXPLICIT_BATCH
        assert ("set config.default_device_type", ("DeviceType.DLA",)) in recorded
        assert ("set config.DLA_core", (0,)) in recorded
        assert ("config.set_flag", ("BuilderFlag.GPU_FALLBACK",)) in recorded

    def test_version_mismatch_and_parse_failure(self, models, monkeypatch):
        from trt_recorder import make_tensorrt

        monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt("10.7.0")[0])
        with pytest.raises(ModelError, match="plan is for TensorRT 10.3.0 but this machine has 10.7.0"):
            EngineFromOnnx(models["effnet"], self._plan(models))()
        monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt("10.3.0", parse_ok=False)[0])
        with pytest.raises(ModelError, match="No importer registered for op: Unique"):
            EngineFromOnnx(models["effnet"], self._plan(models))()
        monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt("10.3.0", build_ok=False)[0])
        with pytest.raises(ModelError, match="failed to build"):
            EngineFromOnnx(models["effnet"], self._plan(models))()


class TestCli:
    def test_plan_and_build_commands(self, models, tmp_path, capsys):
        from cuvil_edge.cli import main

        rc = main(["engine", "plan", str(models["effnet"]), "--target", "agx-orin-32gb", "--precision", "fp16",
                   "--max-batch", "2", "--dla-core", "1", "--out-dir", str(tmp_path)])
        assert rc == 0
        files = sorted(p.name for p in tmp_path.glob("plan-trt*.json"))
        assert files == ["plan-trt10.3.0.json", "plan-trt8.5.2.json", "plan-trt8.6.2.json"]
        plan = load_plan(tmp_path / "plan-trt10.3.0.json")
        assert plan["dla"]["core"] == 1
        if not HAVE_TRT:
            rc = main(["engine", "build", "--plan", str(tmp_path / "plan-trt10.3.0.json"), "--onnx",
                       str(models["effnet"]), "--out", str(tmp_path / "e.engine")])
            err = capsys.readouterr().err
            # (cli.main prints through rich markup, which drops "[jetson]"; the exception text has it)
            assert rc == 1 and "pip install cuvil-edge" in err and "Traceback" not in err
            assert not (tmp_path / "e.engine").exists()

    def test_plan_for_cpu_target_fails_cleanly(self, models, capsys, tmp_path):
        from cuvil_edge.cli import main

        assert main(["engine", "plan", str(models["digits"]), "--target", "generic-arm64",
                     "--out-dir", str(tmp_path)]) == 1
        assert "no NVIDIA GPU" in capsys.readouterr().err
        assert list(tmp_path.iterdir()) == []
