"""Accuracy is the target's arithmetic, on any host; the TensorRT form is what TensorRT's parser takes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import QuantizationError
from cuvil_edge.packager.data import load_dataset
from cuvil_edge.packager.emulate import emulate_qdq, has_qdq
from cuvil_edge.packager.inspect import inspect_model
from cuvil_edge.packager.load import load_model, model_inputs
from cuvil_edge.packager.package import check_tensorrt_form, quantize_model
from cuvil_edge.packager.qdq_rules import check_qdq
from cuvil_edge.packager.quantize import Quantizer, target_arithmetic
from cuvil_edge.packager.validate import compare_outputs, make_session, run_model
from cuvil_edge.recipes import AccuracyGoal
from cuvil_edge.targets import get_target

NO_GOAL = AccuracyGoal(None, None, None)


@pytest.fixture(scope="module")
def digits(digits_model):
    model = load_model(digits_model)
    spec = model_inputs(model)
    calib = load_dataset("builtin:digits-calibration", spec, {}, 64, seed=0)
    evaluation = load_dataset("builtin:digits-evaluation", spec, {}, 300, seed=0)
    return model, calib, evaluation


@pytest.fixture(scope="module")
def digits_trt(digits):
    model, calib, _ = digits
    quantized, info = quantize_model(model, get_target("orin-nano-8gb"), "int8", calib, "classification", NO_GOAL)
    return quantized, info


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], **config: str) -> np.ndarray:
    opts = ort.SessionOptions()
    for key, value in config.items():
        opts.add_session_config_entry(key.replace("__", "."), value)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_emulation_computes_the_qdq_graph_as_written(digits, digits_trt):
    """The emulated model equals the Q/DQ model run node by node (no fused integer kernels)."""
    model, _, evaluation = digits
    quantized, _ = digits_trt
    emulated = emulate_qdq(quantized)
    assert not has_qdq(emulated)
    assert not any(i.data_type in (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32) for i in emulated.graph.initializer)
    feed = {k: v for k, v in evaluation.inputs.items()}
    as_written = _run(quantized, feed, session__disable_quant_qdq="1")
    np.testing.assert_allclose(_run(emulated, feed), as_written, rtol=0, atol=1e-4)
    # The packager's own sessions compute the same (they run Q/DQ as written).
    np.testing.assert_allclose(next(iter(run_model(make_session(quantized), evaluation).values())), as_written,
                               rtol=0, atol=1e-4)


def test_report_is_the_same_with_graph_optimizations_on_and_off(digits, monkeypatch):
    """Host independence: the packager's verdict does not move with ONNX Runtime's optimisation level."""
    model, calib, evaluation = digits
    figures = {}
    for level in ("all", "disable"):
        monkeypatch.setenv("CUVIL_EDGE_ORT_OPTIMIZATION", level)
        quantized, _ = quantize_model(model, get_target("orin-nano-8gb"), "int8", calib, "classification", NO_GOAL)
        ref = next(iter(run_model(make_session(model), evaluation).values()))
        got = next(iter(run_model(make_session(target_arithmetic(quantized)), evaluation).values()))
        figures[level] = compare_outputs(ref, got, "classification")
    assert figures["all"]["mean_kl"] == pytest.approx(figures["disable"]["mean_kl"], abs=1e-6)
    assert figures["all"]["top1_agreement"] == figures["disable"]["top1_agreement"] >= 0.97


def test_unknown_optimization_level_is_a_clear_error(monkeypatch, digits):
    monkeypatch.setenv("CUVIL_EDGE_ORT_OPTIMIZATION", "turbo")
    with pytest.raises(Exception, match="CUVIL_EDGE_ORT_OPTIMIZATION='turbo'"):
        make_session(digits[0])


def test_tensorrt_form_has_float_biases_and_passes_every_rule(digits_trt):
    quantized, info = digits_trt
    inits = {i.name: i for i in quantized.graph.initializer}
    dq_inputs = [inits[n.input[0]].data_type for n in quantized.graph.node
                 if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert dq_inputs and set(dq_inputs) == {TensorProto.INT8}
    convs = [n for n in quantized.graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2]
    assert convs and all(inits[n.input[2]].data_type == TensorProto.FLOAT for n in convs)
    assert check_qdq(quantized, ["8.5.2", "8.6.2", "10.3.0"], "8.7") == []
    assert info["int8_form"]["name"] == "s8s8-symmetric-float-bias"
    report = inspect_model(quantized, get_target("orin-nano-8gb"))
    assert report.unsupported == []


def test_cpu_form_on_x86_uses_seven_bit_weights(digits):
    model, calib, _ = digits
    with Quantizer(model, "ort-cpu", calib, arch="x86_64") as q:
        quantized = q.quantize()
        assert q.form.reduce_range and "VNNI" in q.form.why
    weights = [numpy_helper.to_array(i) for i in quantized.graph.initializer if i.data_type == TensorProto.INT8]
    assert weights and max(int(np.abs(w).max()) for w in weights) <= 64
    with Quantizer(model, "ort-cpu", calib, arch="aarch64") as q:
        assert not q.form.reduce_range


# ---------------------------------------------------------------- the rules, one hand-made node at a time


def _qdq_model(dq_type=TensorProto.INT8, zero_point=0, scale=0.1, per_channel_activation=False,
               weight_axis=0, opset=17, bias_int32=False):
    """x -> Q -> DQ -> Conv(W behind DQ[, bias]) -> y, with one knob per rule."""
    rng = np.random.default_rng(0)
    w = rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(w, "w_q"),
        numpy_helper.from_array(np.full(4, 0.01, np.float32), "w_s"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"),
        numpy_helper.from_array(np.full(3, scale, np.float32) if per_channel_activation else np.float32(scale), "x_s"),
        numpy_helper.from_array(np.full(3, zero_point, np.int8) if per_channel_activation else np.int8(zero_point), "x_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["xq"], name="q_x", axis=1),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_zp"], ["xd"], name="dq_x", axis=1),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dq_w", axis=weight_axis),
    ]
    conv_inputs = ["xd", "w"]
    if bias_int32:
        inits += [numpy_helper.from_array(np.arange(4, dtype=np.int32), "b_q"),
                  numpy_helper.from_array(np.full(4, 0.001, np.float32), "b_s"),
                  numpy_helper.from_array(np.zeros(4, np.int32), "b_zp")]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_zp"], ["b"], name="dq_bias", axis=0))
        conv_inputs.append("b")
    nodes.append(helper.make_node("Conv", conv_inputs, ["y"], name="conv"))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_clean_hand_made_model_passes():
    assert check_qdq(_qdq_model(), ["8.6.2", "10.3.0"], "8.7") == []


@pytest.mark.parametrize("knobs, node, words", [
    ({"bias_int32": True}, "dq_bias", "only activation types"),
    ({"zero_point": 3}, "q_x", "zero-point is not 0"),
    ({"scale": -0.5}, "q_x", "positive and finite"),
    ({"per_channel_activation": True}, "q_x", "activations per tensor"),
    ({"weight_axis": 1}, "dq_w", "output-channel axis 0"),
    ({"opset": 12}, "dq_w", "needs opset 13"),
])
def test_each_rule_names_the_node(knobs, node, words):
    found = check_qdq(_qdq_model(**knobs), ["10.3.0"], "8.7")
    assert found and found[0].node == node and words in found[0].rule, found


def test_fp8_needs_a_newer_gpu_than_orin():
    model = _qdq_model()
    fp8 = numpy_helper.from_array(np.zeros((), np.float32), "fp8_zp")
    fp8.data_type = TensorProto.FLOAT8E4M3FN
    del fp8.float_data[:]
    fp8.raw_data = b"\x00"
    model.graph.initializer.append(fp8)
    model.graph.node[0].input[2] = "fp8_zp"
    model.graph.node[1].input[2] = "fp8_zp"
    assert any("SM 8.9" in v.rule for v in check_qdq(model, ["10.3.0"], "8.7"))
    assert not [v for v in check_qdq(model, ["10.3.0"], "9.0") if v.node in ("q_x", "dq_x")]


def test_inspect_flags_an_int32_bias_dequantize():
    report = inspect_model(_qdq_model(bias_int32=True), get_target("orin-nano-8gb"))
    flagged = {n.name: n.reasons for n in report.unsupported}
    assert "dq_bias" in flagged and all("only activation types" in why for why in flagged["dq_bias"].values())


def test_package_refuses_a_model_trt_would_reject():
    with pytest.raises(QuantizationError, match="dq_bias.*only activation types.*TensorRT"):
        check_tensorrt_form(_qdq_model(bias_int32=True), get_target("orin-nano-8gb"))


# ---------------------------------------------------------------- three tiers reach the TensorRT plan


def test_plan_carries_the_fp16_tier_as_flags_or_casts(digits_trt, tmp_path):
    from cuvil_edge.packager.engine_build import _with_fp16_casts
    from cuvil_edge.packager.engine_plan import make_build_plan

    quantized, _ = digits_trt
    path = tmp_path / "m.onnx"
    onnx.save(quantized, str(path))
    float_nodes = [n.name for n in quantized.graph.node if n.op_type in ("Relu", "Flatten")]
    manifest = {"precision": "mixed", "max_batch": 4,
                "layer_precisions": {"fp16": float_nodes[:1], "fp32": float_nodes[1:2]}}
    target = get_target("orin-nano-8gb")
    trt10 = next(r for r in target.releases if r.tensorrt.startswith("10"))
    weak = make_build_plan(path, manifest, target, trt10)
    assert weak["precision_mode"] == "builder_flags"
    assert {"FP16", "INT8", "OBEY_PRECISION_CONSTRAINTS"} <= set(weak["builder_flags"])
    assert weak["layer_precisions"] == {"fp32": float_nodes[1:2]} and weak["fp16_casts"] == []
    typed = make_build_plan(path, manifest, target, trt10, strongly_typed=True)
    assert typed["precision_mode"] == "strongly_typed" and typed["builder_flags"] == []
    assert typed["fp16_casts"] == float_nodes[:1]
    cast = onnx.load(str(_with_fp16_casts(path, typed["fp16_casts"])))
    onnx.checker.check_model(cast)
    assert any(n.op_type == "Cast" for n in cast.graph.node)
    # Plain INT8 (no tiers): no FP16 flag appears from nowhere.
    plain = make_build_plan(path, {"precision": "int8", "max_batch": 4}, target, trt10)
    assert plain["fp16_casts"] == [] and plain["layer_precisions"] == {}


# ---------------------------------------------------------------- mixed search variants by surgery


def test_partial_variants_are_exact_at_both_ends(digits):
    """All nodes rewired to float computes the float model; none rewired computes the quantized one."""
    from cuvil_edge.packager.partial_quant import float_nodes_except, with_float_nodes

    _, calib, evaluation = digits
    with Quantizer(digits[0], "tensorrt", calib) as q:
        quantized, model = q.quantize(), q.float_model
    feed = dict(evaluation.inputs)
    every = {n.name for n in quantized.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")}
    as_float = with_float_nodes(quantized, model, every)
    assert not has_qdq(as_float)
    np.testing.assert_allclose(_run(as_float, feed), _run(model, feed), rtol=1e-5, atol=1e-5)
    untouched = with_float_nodes(quantized, model, set())
    np.testing.assert_array_equal(_run(emulate_qdq(untouched), feed), _run(emulate_qdq(quantized), feed))
    # "Only conv1 in INT8": conv1 still reads quantized inputs, nothing else does.
    only = with_float_nodes(quantized, model, float_nodes_except(quantized, ["conv1"]))
    readers = {n.name for n in only.graph.node for i in n.input
               if any(p.output[0] == i and p.op_type == "DequantizeLinear" for p in only.graph.node)}
    assert readers == {"conv1"}


def test_partial_variants_of_the_cpu_form_define_each_name_once(digits):
    """The CPU form's int32 biases sit behind DequantizeLinear nodes whose outputs may carry the bias's
    own name: a float copy for a rewired node must not define that name twice."""
    from cuvil_edge.packager.partial_quant import with_float_nodes

    _, calib, evaluation = digits
    with Quantizer(digits[0], "ort-cpu", calib) as q:
        quantized, model = q.quantize(), q.float_model
    every = {n.name for n in quantized.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")}
    for names in (every, {"conv1"}):
        variant = with_float_nodes(quantized, model, names)
        defined = [i.name for i in variant.graph.initializer] + [o for n in variant.graph.node for o in n.output]
        assert len(defined) == len(set(defined))
        run_model(make_session(variant), evaluation.slice(0, 8))


def test_modelopt_quantizer_missing_or_misused_is_one_clear_line(digits, monkeypatch, tmp_path):
    from cuvil_edge.packager.modelopt_quant import quantize_with_modelopt

    model, calib, _ = digits
    monkeypatch.setenv("CUVIL_EDGE_MODELOPT_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(QuantizationError, match=r"cuvil-edge\[modelopt\].*CUVIL_EDGE_MODELOPT_PYTHON"):
        quantize_with_modelopt(model, calib)
    with pytest.raises(QuantizationError, match="--precision int8"):
        quantize_model(model, get_target("orin-nano-8gb"), "mixed", calib, "classification", NO_GOAL,
                       quantizer="modelopt")
    with pytest.raises(QuantizationError, match="cuvil or modelopt"):
        quantize_model(model, get_target("orin-nano-8gb"), "int8", calib, "classification", NO_GOAL,
                       quantizer="tensorrt")


@pytest.mark.skipif(not __import__("os").environ.get("CUVIL_EDGE_MODELOPT_PYTHON"),
                    reason="NVIDIA Model Optimizer lives in its own venv: set CUVIL_EDGE_MODELOPT_PYTHON to run")
def test_modelopt_output_is_in_tensorrt_form(digits):
    from cuvil_edge.packager.modelopt_quant import quantize_with_modelopt

    model, calib, _ = digits
    quantized = quantize_with_modelopt(model, calib)
    assert check_qdq(quantized, ["8.6.2", "10.3.0"], "8.7") == []
    assert check_tensorrt_form(quantized, get_target("orin-nano-8gb"))["qdq_nodes"] > 4
