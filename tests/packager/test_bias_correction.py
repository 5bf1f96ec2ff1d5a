"""Bias correction removes the mean output shift that INT8 weight rounding causes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.packager.bias_correction import _shift, conv_input_means
from cuvil_edge.packager.data import Dataset
from cuvil_edge.packager.quantize import Quantizer
from cuvil_edge.packager.validate import make_session


def _conv_model(group: int, rng: np.random.Generator) -> onnx.ModelProto:
    """Input 4 channels -> conv(group) 8 channels -> 1x1 conv 6 channels; no padding, no activation."""
    w1 = rng.normal(0, 1, (8, 4 // group, 3, 3)).astype(np.float32)
    w1[:, :, 0, 0] *= 40  # one outlier tap per filter makes the other taps round coarsely
    w2 = rng.normal(0, 1, (6, 8, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(8, np.float32), "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(6, np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="c1", group=group),
             helper.make_node("Conv", ["h", "w2", "b2"], ["y"], name="c2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 6, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _data(rng: np.random.Generator, n: int) -> Dataset:
    # A non-zero input mean per channel is what turns weight rounding into an output shift.
    x = rng.normal(0, 0.3, (n, 4, 12, 12)).astype(np.float32) + np.array([2.0, -1.0, 0.5, 3.0], np.float32)[None, :, None, None]
    return Dataset({"x": x}, None, "test")


def test_shift_matches_the_measured_mean_difference_for_grouped_convs():
    rng = np.random.default_rng(0)
    for group in (1, 2, 4):
        w = rng.normal(0, 1, (8, 4 // group, 3, 3))
        delta = rng.normal(0, 0.01, w.shape)
        mean = rng.normal(0, 1, 4)
        # Direct: output channel o sees input channels of its group only.
        per_group_in = 4 // group
        expected = [sum(delta[o, i].sum() * mean[(o // (8 // group)) * per_group_in + i] for i in range(per_group_in))
                    for o in range(8)]
        assert _shift(delta, mean, group) == pytest.approx(expected, rel=1e-12)


def test_input_means_are_per_channel():
    rng = np.random.default_rng(1)
    model, data = _conv_model(1, rng), _data(rng, 40)
    means = conv_input_means(model, data, batch=16)
    assert means["c1"] == pytest.approx(data.inputs["x"].mean(axis=(0, 2, 3)), abs=1e-5)
    assert set(means) == {"c1", "c2"} and means["c2"].shape == (8,)


@pytest.mark.parametrize("fmt", ["ort-cpu", "tensorrt"])
@pytest.mark.parametrize("group", [1, 2])
def test_corrected_model_has_a_smaller_mean_output_error(fmt, group):
    rng = np.random.default_rng(2)
    model, calib, held_out = _conv_model(group, rng), _data(rng, 64), _data(rng, 64)
    ref = make_session(model).run(None, held_out.inputs)[0]

    def mean_shift(correct: bool) -> tuple[float, list[str]]:
        with Quantizer(model, fmt, calib, "minmax", bias_correction=correct) as q:
            out = make_session(q.quantize()).run(None, held_out.inputs)[0]
            return float(np.abs((out - ref).mean(axis=(0, 2, 3))).mean()), q.corrected

    plain, none = mean_shift(False)
    corrected, names = mean_shift(True)
    assert none == [] and names == ["c1", "c2"]
    assert corrected < plain / 3, (plain, corrected)


def test_layers_kept_in_float_are_not_corrected():
    rng = np.random.default_rng(3)
    model, calib = _conv_model(1, rng), _data(rng, 32)
    with Quantizer(model, "ort-cpu", calib, "minmax") as q:
        float_c1 = q.quantize(nodes_to_exclude=["c1"])
        assert q.corrected == ["c2"]
    b1 = next(i for i in float_c1.graph.initializer if i.name == "b1")
    assert not numpy_helper.to_array(b1).any()
