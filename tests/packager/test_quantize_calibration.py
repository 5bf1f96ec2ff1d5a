"""Calibration runs in bounded chunks and gives the same ranges as one pass over all samples."""

from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper

from cuvil_edge.packager import quantize as qmod
from cuvil_edge.packager.data import load_dataset
from cuvil_edge.packager.load import load_model, model_inputs


def _scales(model: onnx.ModelProto) -> dict[str, list[float]]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.input[1]: inits[n.input[1]].ravel().tolist() for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[1] in inits}


@pytest.fixture(scope="module")
def digits(digits_model):
    model = load_model(digits_model)
    spec = model_inputs(model)
    return model, load_dataset("builtin:digits-calibration", spec, {}, 64, seed=0)


def test_chunk_size_divides_the_batch_count():
    data = type("D", (), {"__len__": lambda self: 16 * 6, "inputs": {}})()
    assert qmod._Reader(data).chunk_batches(2) == 2
    assert qmod._Reader(data).chunk_batches(4) == 3
    prime = type("D", (), {"__len__": lambda self: 16 * 5, "inputs": {}})()
    assert qmod._Reader(prime).chunk_batches(2) == 1


@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_chunked_calibration_matches_one_pass(digits, monkeypatch, method):
    model, calib = digits
    calls: list[tuple[int, int]] = []
    real = qmod._Reader.set_range

    def spy(self, start_index, end_index):
        calls.append((start_index, end_index))
        real(self, start_index, end_index)

    monkeypatch.setattr(qmod._Reader, "set_range", spy)
    with qmod.Quantizer(model, "ort-cpu", calib, method) as q:
        chunked = _scales(q.quantize())
    # 64 samples = 4 batches of 16, read 2 batches at a time, each exactly once.
    assert calls == [(0, 2), (2, 4)]

    calls.clear()
    monkeypatch.setattr(qmod._Reader, "chunk_batches", lambda self, max_batches=0: len(self))
    with qmod.Quantizer(model, "ort-cpu", calib, method) as q:
        whole = _scales(q.quantize())
    assert calls == [(0, 4)]
    assert chunked.keys() == whole.keys() and chunked
    for name in whole:
        # min/max merge exactly; histograms are re-binned as they grow, so percentiles move a little.
        assert chunked[name] == pytest.approx(whole[name], rel=1e-6 if method == "minmax" else 0.05)
