"""Calibration: one streaming pass, any sample count, any per-sample shape, bounded memory."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.packager import quantize as qmod
from cuvil_edge.packager.calibrate import RangeCollector, TensorStats, collect_ranges
from cuvil_edge.packager.data import Dataset, load_dataset
from cuvil_edge.packager.load import load_model, model_inputs
from cuvil_edge.packager.validate import make_session, run_model


def _scales(model: onnx.ModelProto) -> dict[str, list[float]]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.input[1]: inits[n.input[1]].ravel().tolist() for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[1] in inits}


@pytest.fixture(scope="module")
def digits(digits_model):
    model = load_model(digits_model)
    spec = model_inputs(model)
    return model, load_dataset("builtin:digits-calibration", spec, {}, 100, seed=0)


def _fully_convolutional() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Sigmoid with dynamic H and W, like a text detector's head."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((1, 8, 3, 3)).astype(np.float32) * 0.3, "w2")
    b2 = numpy_helper.from_array(np.zeros(1, np.float32), "b2")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="c2", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["y"], name="y"),
    ]
    graph = helper.make_graph(
        nodes, "fcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "H", "W"])], [w1, b1, w2, b2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_widening_keeps_every_count_and_the_percentile():
    rng = np.random.default_rng(0)
    stats = TensorStats(4096)
    chunks = [rng.standard_normal(5000) * s for s in (0.1, 1.0, 7.0, 30.0)]  # range grows 3 times
    for c in chunks:
        stats.add(c)
    everything = np.concatenate(chunks)
    assert stats.hist.sum() == everything.size and stats.hist.size == 4096
    assert stats.minimum == pytest.approx(everything.min()) and stats.maximum == pytest.approx(everything.max())
    lo, hi = stats.range("percentile", True, 99.0)
    exact = np.percentile(np.abs(everything), 99.0)
    # The widest range is at most 2x the peak; a bin is limit/2048 wide, merged bins at most twice that.
    assert hi == -lo and abs(hi - exact) <= 4 * stats.limit / 2048
    assert stats.range("minmax", False, 0) == (pytest.approx(everything.min()), pytest.approx(everything.max()))


def test_minmax_ranges_equal_one_pass_whatever_the_batching(digits):
    model, calib = digits
    one = collect_ranges(model, calib, batch=len(calib)).ranges("minmax", False)
    many = collect_ranges(model, calib, batch=3).ranges("minmax", False)
    assert one.keys() == many.keys() and len(one) > 5
    for name in one:
        assert many[name] == pytest.approx(one[name], rel=1e-6, abs=1e-7)


def test_minmax_ranges_match_onnxruntime_calibrator(digits, tmp_path):
    """Our streaming minmax gives the ranges ONNX Runtime's own MinMax calibrator gives."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader, create_calibrator

    model, calib = digits
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([feed for _, _, feed in calib.batches(16)])

        def get_next(self):
            return next(self.it, None)

    cal = create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"))
    cal.collect_data(Reader())
    theirs = {k: (float(v.range_value[0]), float(v.range_value[1])) for k, v in cal.compute_data().data.items()}
    ours = collect_ranges(model, calib).ranges("minmax", False)
    common = set(theirs) & set(ours)
    assert len(common) >= len(theirs) - 1 > 3
    for name in common:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("count", [1, 7, 22, 33, 40, 80])
def test_any_sample_count_quantizes(digits, count):
    """Counts that made the chunked ONNX Runtime calibrator fail (22-40, 80) now quantize."""
    model, calib = digits
    with qmod.Quantizer(model, "tensorrt", calib.slice(0, count), "percentile") as q:
        assert _scales(q.quantize())


def test_samples_of_different_sizes_calibrate_and_validate():
    """A fully convolutional model fed images of different H/W (one at a time) quantizes and runs."""
    model = _fully_convolutional()
    rng = np.random.default_rng(1)
    samples = [rng.random((1, 3, h, w), dtype=np.float32) for h, w in [(32, 48), (64, 32), (32, 48), (40, 96), (24, 24)]]
    data = Dataset({"x": samples}, None, "ragged")
    assert data.ragged and [stop - start for start, stop, _ in data.batches(8)] == [1, 1, 1, 1, 1]
    with qmod.Quantizer(model, "tensorrt", data, "percentile") as q:
        quantized = q.quantize()
    ref = run_model(make_session(model), data)["y"]
    got = run_model(make_session(qmod.target_arithmetic(quantized)), data)["y"]
    assert isinstance(ref, list) and [r.shape for r in ref] == [s[:, :1].shape for s in samples]
    assert all(np.abs(r - g).max() < 0.05 for r, g in zip(ref, got, strict=True))


def test_collector_memory_is_bins_per_tensor_not_samples(digits):
    model, calib = digits
    small = collect_ranges(model, calib.slice(0, 10))
    large = collect_ranges(model, calib)
    assert set(small.stats) == set(large.stats)
    assert all(s.hist.size == RangeCollector().bins for s in large.stats.values())
    assert large.samples == len(calib) == 100


def _two_input_model(opset: int) -> onnx.ModelProto:
    """Two image inputs, a conv on each, added: calibration must feed and range both inputs."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, f"w{i}")
             for i in (1, 2)]
    nodes = [
        helper.make_node("Conv", ["a", "w1"], ["ca"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "w2"], ["cb"], name="conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["ca", "cb"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3, 16, 16]) for n in ("a", "b")]
    graph = helper.make_graph(nodes, "two", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [10, 13, 17, 21])
@pytest.mark.parametrize("form", ["tensorrt", "ort-cpu"])
def test_two_inputs_and_opsets_10_to_21_quantize(opset, form):
    from cuvil_edge.packager.qdq_rules import check_qdq

    model = _two_input_model(opset)
    rng = np.random.default_rng(2)
    data = Dataset({"a": rng.standard_normal((9, 3, 16, 16)).astype(np.float32),
                    "b": rng.standard_normal((9, 3, 16, 16)).astype(np.float32)}, None, "two inputs")
    with qmod.Quantizer(model, form, data) as q:
        quantized = q.quantize()
    quantized_inputs = {n.input[0] for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    assert {"a", "b"} <= quantized_inputs
    ref = run_model(make_session(model), data)["y"]
    got = run_model(make_session(qmod.target_arithmetic(quantized)), data)["y"]
    assert np.abs(ref - got).max() < 0.1 * np.abs(ref).max()
    if form == "tensorrt":
        assert check_qdq(quantized, ["8.6.2", "10.3.0"], "8.7") == []


def test_bias_correction_means_come_from_the_calibration_pass(digits):
    """One pass gives the ranges and the per-channel input means bias correction needs, counted once."""
    from cuvil_edge.packager.bias_correction import conv_input_means

    model, calib = digits
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    collector = collect_ranges(model, calib, channel_means_of={n.input[0] for n in convs})
    means = collector.channel_means()
    expected = conv_input_means(model, calib)
    assert set(expected) == {n.name for n in convs}
    for conv in convs:
        np.testing.assert_allclose(means[conv.input[0]], expected[conv.name], rtol=1e-6)


def _dense_with_row_bias() -> onnx.ModelProto:
    """x [N, 8] -> MatMul [8, 6] -> Add bias [1, 6] (as Keras/JAX exports a Dense layer, Magika's last)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 6)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense/MatMul"),
         helper.make_node("Add", ["h", "b"], ["y"], name="dense/Add")],
        "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("form", ["ort-cpu", "tensorrt"])
def test_a_dense_layer_with_a_row_bias_quantizes(form):
    """ONNX Runtime's pre-processing fuses MatMul + Add [1, N] into a Gemm whose bias is [1, N]; its
    per-channel int32-bias check then indexed a row and raised "The truth value of an array with more
    than one element is ambiguous" (Magika's CPU form). The bias is flattened to [N] first."""
    model = _dense_with_row_bias()
    data = Dataset({"x": np.random.default_rng(4).standard_normal((16, 8)).astype(np.float32)}, None, "dense")
    with qmod.Quantizer(model, form, data) as q:
        assert any(n.op_type == "Gemm" for n in q.float_model.graph.node)  # fused, as on Magika
        quantized = q.quantize()
    assert any(n.op_type == "QuantizeLinear" for n in quantized.graph.node)
    ref = run_model(make_session(model), data)["y"]
    got = run_model(make_session(quantized), data)["y"]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
