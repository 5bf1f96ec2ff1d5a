"""inspect_model: TensorRT parser support per version, DLA placement and reasons, profiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import ModelError
from cuvil_edge.packager.cli import inspect_cmd
from cuvil_edge.packager.inspect import (
    dla_available,
    inspect_model,
    optimization_profiles,
    parser_snapshot,
    render_inspect_table,
    trt_op_status,
)
from cuvil_edge.targets import get_target


def _model(nodes, inits=(), inp_shape=("N", 8, 16, 16), opset=17, extra_inputs=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(inp_shape))
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "m", [x, *extra_inputs], [y], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _row(report, op_type):
    rows = [n for n in report.nodes if n.op_type == op_type]
    assert rows, f"no {op_type} node"
    return rows[0]


@pytest.fixture(scope="module")
def effnet(tmp_path_factory):
    from cuvil_edge.models import build_efficientnet_lite0

    return onnx.load(str(build_efficientnet_lite0(tmp_path_factory.mktemp("m") / "effnet.onnx")))


class TestRealModels:
    def test_efficientnet_orin_nano_parses_everywhere(self, effnet):
        report = inspect_model(effnet, get_target("orin-nano-8gb"), max_batch=8)
        assert report.tensorrt_versions == ["8.5.2", "8.6.2", "10.3.0"]
        assert report.unsupported == []
        assert report.dla_tensorrt is None  # Orin Nano has no DLA
        assert {n.dla for n in report.nodes} == {"n/a"}
        assert report.profiles == {"gpu": {"input": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224],
                                                     "max": [8, 3, 224, 224]}}}
        assert [d.name for d in report.dynamic_inputs] == ["input"]

    def test_efficientnet_on_dla_falls_back_only_in_the_head(self, effnet):
        report = inspect_model(effnet, get_target("agx-orin-64gb"), max_batch=4)
        assert report.dla_tensorrt == "10.3.0"
        assert {n.op_type for n in report.dla_fallbacks} == {"GlobalAveragePool", "Flatten"}
        gap = _row(report, "GlobalAveragePool")
        assert "AveragePool" in gap.dla_reason
        assert _row(report, "Identity").dla == "folded"
        # every ReLU6 (Clip 0..6) and conv stays on DLA
        assert all(n.dla == "yes" for n in report.nodes if n.op_type in ("Conv", "Clip", "Add", "Gemm"))
        assert report.profiles["dla"]["input"] == {"min": [4, 3, 224, 224], "opt": [4, 3, 224, 224],
                                                   "max": [4, 3, 224, 224]}
        assert any("DLA takes no dynamic shapes" in w for w in report.warnings)

    def test_report_serialises_and_renders(self, effnet):
        report = inspect_model(effnet, get_target("agx-xavier"))
        data = json.loads(json.dumps(report.to_dict()))
        assert data["target"] == "agx-xavier" and len(data["nodes"]) == len(effnet.graph.node)
        table = render_inspect_table(report)
        headers = [c.header for c in table.columns]
        assert headers == ["#", "node", "op", "TRT 8.2.1", "TRT 8.5.2", "DLA", "why"]
        assert table.row_count == len(effnet.graph.node)
        assert render_inspect_table(report, only_issues=True).row_count == len(report.dla_fallbacks)
        # TensorRT 8.2 parses up to opset 13; the model is opset 17
        assert any("opset 17" in w and "8.2.1" in w for w in report.warnings)


class TestParserTables:
    @pytest.mark.parametrize(("version", "table"), [("8.2.1", "8.4"), ("8.5.2", "8.5"), ("8.6.2", "8.5"),
                                                     ("10.3.0", "10.15"), ("10.13.3", "10.15"),
                                                     ("11.0.0", "10.15")])
    def test_snapshot_choice(self, version, table):
        assert parser_snapshot(version)["tensorrt"] == table

    def test_layernorm_across_releases(self):
        assert trt_op_status("LayerNormalization", "8.5.2")[0] == "unsupported"
        status, why = trt_op_status("LayerNormalization", "8.6.2")
        assert status == "unverified" and "10.15" in why
        assert trt_op_status("LayerNormalization", "10.3.0") == ("supported", "")

    def test_opset23_ops_unverified_on_old_10x(self):
        assert trt_op_status("Attention", "10.3.0")[0] == "unverified"
        assert trt_op_status("Attention", "10.15.1")[0] == "supported"

    def test_unsupported_and_unknown(self):
        assert trt_op_status("NonZero", "8.2.1")[0] == "unsupported"
        assert trt_op_status("NonZero", "8.5.2")[0] == "supported"
        status, why = trt_op_status("Conv", "10.3.0", domain="com.example")
        assert status == "unsupported" and "plugin" in why
        assert trt_op_status("NoSuchOp", "10.3.0")[0] == "unsupported"

    def test_cuvil_plugins_are_recognised(self):
        assert trt_op_status("topk", "10.3.0", domain="cuvil")[0] == "plugin"

    @pytest.mark.parametrize(("version", "expected"), [("8.5.2", True), ("10.3.0", True), ("10.7.0", True),
                                                       ("10.8.0", False), ("10.13.3", False),
                                                       ("11.0.0", False), ("11.4.0", False),
                                                       ("11.4.1", True)])
    def test_dla_availability_by_release(self, version, expected):
        assert dla_available(version) is expected


class TestQuantizedModels:
    """Real Q/DQ models from ONNX Runtime's quantizer: TensorRT takes only zero-point 0."""

    @pytest.fixture(scope="class")
    def digits(self, tmp_path_factory):
        from cuvil_edge.models import build_digits_cnn

        return build_digits_cnn(tmp_path_factory.mktemp("d") / "digits.onnx")

    def _quantize(self, src: Path, dst: Path, symmetric: bool) -> onnx.ModelProto:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        rng = np.random.default_rng(0)

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.items = iter([{"input": rng.random((1, 1, 8, 8), dtype=np.float32)} for _ in range(8)])

            def get_next(self):
                return next(self.items, None)

        # The TensorRT form keeps biases float; ONNX Runtime's default (int32 biases behind a
        # DequantizeLinear) is what TensorRT's parser refuses.
        extra = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False} if symmetric else {}
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                        weight_type=QuantType.QInt8, extra_options=extra)
        return onnx.load(str(dst))

    def test_asymmetric_qdq_is_rejected_with_the_fix(self, digits, tmp_path):
        model = self._quantize(digits, tmp_path / "asym.onnx", symmetric=False)
        report = inspect_model(model, get_target("orin-nano-8gb"))
        bad = [n for n in report.unsupported if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
        assert bad, "asymmetric activations must be flagged"
        for n in bad:
            for why in n.reasons.values():
                # Activations: the zero-point rule; ONNX Runtime's default int32 biases: the dtype rule.
                assert "ActivationSymmetric" in why or "keep biases float" in why, why
        assert any("ActivationSymmetric" in why for n in bad for why in n.reasons.values())

    def test_default_int32_biases_are_rejected(self, digits, tmp_path):
        """ONNX Runtime's symmetric Q/DQ with its default int32 biases: every bias DQ is flagged."""
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        rng = np.random.default_rng(0)
        feeds = iter([{"input": rng.random((1, 1, 8, 8), dtype=np.float32)} for _ in range(8)])
        reader = type("R", (), {"get_next": lambda self: next(feeds, None)})()
        dst = tmp_path / "int32bias.onnx"
        quantize_static(str(digits), str(dst), reader, quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
        report = inspect_model(onnx.load(str(dst)), get_target("orin-nano-8gb"))
        flagged = {n.name for n in report.unsupported}
        assert flagged and all(name.endswith(".bias_DequantizeLinear") for name in flagged), flagged

    def test_symmetric_qdq_parses(self, digits, tmp_path):
        model = self._quantize(digits, tmp_path / "sym.onnx", symmetric=True)
        assert any(n.op_type == "QuantizeLinear" for n in model.graph.node)
        report = inspect_model(model, get_target("orin-nano-8gb"))
        assert report.unsupported == []

    def test_qdq_falls_back_from_dla(self, digits, tmp_path):
        model = self._quantize(digits, tmp_path / "sym.onnx", symmetric=True)
        report = inspect_model(model, get_target("orin-nx-16gb"))
        qdq = [n for n in report.dla_fallbacks if n.op_type == "QuantizeLinear"]
        assert qdq and "implicit quantization" in qdq[0].dla_reason


class TestDlaRules:
    def _dla(self, nodes, inits=(), target="agx-orin-64gb", **kw):
        report = inspect_model(_model(nodes, inits, **kw), get_target(target))
        return report

    def test_convolution_limits(self):
        ok = self._dla([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
                       [_const("W", np.zeros((16, 8, 3, 3)))])
        assert _row(ok, "Conv").dla == "yes"
        big = self._dla([helper.make_node("Conv", ["x", "W"], ["y"])], [_const("W", np.zeros((16, 8, 33, 33)))],
                        inp_shape=("N", 8, 64, 64))
        assert _row(big, "Conv").dla == "no" and "kernel [33, 33]" in _row(big, "Conv").dla_reason
        stride = self._dla([helper.make_node("Conv", ["x", "W"], ["y"], strides=[9, 9])],
                           [_const("W", np.zeros((16, 8, 3, 3)))])
        assert "stride" in _row(stride, "Conv").dla_reason
        conv3d = self._dla([helper.make_node("Conv", ["x", "W"], ["y"])], [_const("W", np.zeros((4, 8, 1, 1, 1)))],
                           inp_shape=("N", 8, 4, 4, 4))
        assert "2D" in _row(conv3d, "Conv").dla_reason
        dyn_w = self._dla([helper.make_node("Conv", ["x", "w_in"], ["y"])],
                          extra_inputs=[helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [4, 8, 3, 3])])
        assert "build-time constant" in _row(dyn_w, "Conv").dla_reason

    def test_deconvolution_limits(self):
        ok = self._dla([helper.make_node("ConvTranspose", ["x", "W"], ["y"])], [_const("W", np.zeros((8, 16, 2, 2)))])
        assert _row(ok, "ConvTranspose").dla == "yes", _row(ok, "ConvTranspose").dla_reason
        padded = self._dla([helper.make_node("ConvTranspose", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
                           [_const("W", np.zeros((8, 16, 3, 3)))])
        assert "padding 0" in _row(padded, "ConvTranspose").dla_reason
        big = self._dla([helper.make_node("ConvTranspose", ["x", "W"], ["y"])], [_const("W", np.zeros((8, 16, 33, 33)))])
        assert "kernel [33, 33]" in _row(big, "ConvTranspose").dla_reason
        vol = self._dla([helper.make_node("ConvTranspose", ["x", "W"], ["y"])],
                        [_const("W", np.zeros((8, 4, 2, 2, 2)))], inp_shape=("N", 8, 4, 4, 4))
        assert "only 2D deconvolution" in _row(vol, "ConvTranspose").dla_reason
        dyn_w = self._dla([helper.make_node("ConvTranspose", ["x", "w_in"], ["y"])],
                          extra_inputs=[helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [8, 16, 2, 2])])
        assert "build-time constant" in _row(dyn_w, "ConvTranspose").dla_reason

    @pytest.mark.parametrize(("lo", "hi", "ok"), [(0, 6, True), (0, 127, True), (0, 200, False), (-1, 1, False)])
    def test_clip_as_clipped_relu(self, lo, hi, ok):
        report = self._dla([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [_const("lo", lo), _const("hi", hi)])
        assert (_row(report, "Clip").dla == "yes") is ok

    def test_concat_channel_axis_only(self):
        ch = self._dla([helper.make_node("Concat", ["x", "x"], ["y"], axis=1)])
        assert _row(ch, "Concat").dla == "yes"
        sp = self._dla([helper.make_node("Concat", ["x", "x"], ["y"], axis=2)])
        assert "channel axis" in _row(sp, "Concat").dla_reason

    @pytest.mark.parametrize(("scales", "mode", "ctm", "ok"), [
        ([1, 1, 2, 2], "nearest", "asymmetric", True),
        ([1, 1, 1.5, 1.5], "nearest", "asymmetric", False),
        ([1, 1, 2, 2], "linear", "half_pixel", True),
        ([1, 1, 2, 2], "linear", "asymmetric", False),
        ([1, 2, 2, 2], "nearest", "asymmetric", False),
        ([1, 1, 64, 64], "nearest", "asymmetric", False),
    ])
    def test_resize(self, scales, mode, ctm, ok):
        node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, coordinate_transformation_mode=ctm)
        report = self._dla([node], [_const("s", scales)])
        assert (_row(report, "Resize").dla == "yes") is ok, _row(report, "Resize").dla_reason

    def test_pooling_window(self):
        ok = self._dla([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])])
        assert _row(ok, "MaxPool").dla == "yes"
        big = self._dla([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[9, 9])])
        assert "window" in _row(big, "AveragePool").dla_reason

    def test_orin_only_layers_and_elementwise_by_release(self):
        sm = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
        assert _row(self._dla(sm), "Softmax").dla == "yes"
        xavier = self._dla(sm, target="agx-xavier")
        assert "Orin" in _row(xavier, "Softmax").dla_reason
        div = [helper.make_node("Div", ["x", "x"], ["y"])]
        assert _row(self._dla(div), "Div").dla == "yes"  # TensorRT 10.3 on Orin
        assert "TensorRT 10" in _row(self._dla(div, target="agx-xavier"), "Div").dla_reason

    def test_lrn_sizes(self):
        assert _row(self._dla([helper.make_node("LRN", ["x"], ["y"], size=5)]), "LRN").dla == "yes"
        assert _row(self._dla([helper.make_node("LRN", ["x"], ["y"], size=11)]), "LRN").dla == "no"


class TestProfiles:
    def test_dynamic_spatial_dims_need_shapes(self):
        model = _model([helper.make_node("Relu", ["x"], ["y"])], inp_shape=("N", 3, "H", "W"))
        report = inspect_model(model, get_target("orin-nano-8gb"), max_batch=2)
        assert report.profiles["gpu"] == {}
        assert any("'H'" in w and "recipe" in w for w in report.warnings)
        dyn = report.dynamic_inputs[0]
        assert dyn.dynamic_axes == (0, 2, 3) and dyn.dim_names[2] == "H"
        profiles, warnings = optimization_profiles(report.dynamic_inputs, 2, {"x": [1, 3, 480, 640]})
        assert warnings == []
        assert profiles["gpu"]["x"] == {"min": [1, 3, 480, 640], "opt": [2, 3, 480, 640], "max": [2, 3, 480, 640]}

    def test_static_model_needs_no_profile(self):
        model = _model([helper.make_node("Relu", ["x"], ["y"])], inp_shape=(1, 3, 8, 8))
        report = inspect_model(model, get_target("orin-nano-8gb"))
        assert report.dynamic_inputs == [] and report.profiles == {"gpu": {}}

    def test_bad_max_batch(self):
        with pytest.raises(ModelError, match="max_batch"):
            optimization_profiles([], 0)


class TestCommand:
    def test_json_output_and_exit_status(self, effnet, tmp_path, capsys):
        path = tmp_path / "m.onnx"
        onnx.save(effnet, str(path))
        assert inspect_cmd(path, "agx-orin-32gb", max_batch=2, as_json=True) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["dla_fallbacks"] == ["head.pool", "head.flatten"]

    def test_blocked_model_exits_1(self, tmp_path, capsys):
        model = _model([helper.make_node("Unique", ["x"], ["y"])])
        path = tmp_path / "u.onnx"
        onnx.save(model, str(path))
        assert inspect_cmd(path, "orin-nano-8gb") == 1
        out = capsys.readouterr().out
        assert "Unique" in out
        assert "1 nodes: 1 unsupported" in out

    def test_not_onnx(self, tmp_path):
        bad = tmp_path / "bad.onnx"
        bad.write_bytes(b"\x00garbage" * 10)
        with pytest.raises(ModelError, match="bad.onnx"):
            inspect_cmd(bad, "orin-nano-8gb")
        with pytest.raises(ModelError, match="no such"):
            inspect_cmd(tmp_path / "missing.onnx", "orin-nano-8gb")
