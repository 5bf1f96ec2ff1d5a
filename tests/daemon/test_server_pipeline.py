"""Pre/post-processing from the manifest spec: cuvil_edge.sve kernels agree with the numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.daemon import pipeline as pl
from cuvil_edge.runtime.base import TensorSpec

IMG_IN = [TensorSpec("input", np.dtype(np.float32), (-1, 3, 16, 24))]
LOGITS = [TensorSpec("logits", np.dtype(np.float32), (-1, 10))]


@pytest.fixture
def numpy_only(monkeypatch):
    """Force the numpy reference path (as on a device without the kernel library)."""
    monkeypatch.setattr(pl, "_SVE", None)
    monkeypatch.setattr(pl, "_SVE_CHECKED", True)


def _kernels_or_skip():
    k = pl.kernels()
    if k is None:
        pytest.skip("libcuvil_sve is not built here (cross/build.sh host); the numpy path is tested alone")
    return k


def _pre(**over):
    spec = {"kind": "image", "size": [16, 24], "resize": "bilinear", "letterbox": False, "layout": "NCHW",
            "color": "RGB", "mean": [123.7, 116.3, 103.5], "std": [58.4, 57.1, 57.4]}
    spec.update(over)
    return {"preprocess": spec}


@pytest.mark.parametrize("over", [{}, {"color": "BGR"}, {"letterbox": True}, {"layout": "NHWC"},
                                  {"letterbox": True, "pad_value": 0.0, "color": "BGR"}])
@pytest.mark.parametrize("hw", [(16, 24), (37, 61), (7, 5)])
def test_image_preprocess_kernel_matches_numpy(over, hw, monkeypatch):
    _kernels_or_skip()
    img = (np.random.default_rng(hw[0]).random((*hw, 3)) * 255).astype(np.uint8)
    p = pl.Pipeline(_pre(**over), IMG_IN, LOGITS)
    fast = p.preprocess_image(img)
    monkeypatch.setattr(pl, "_SVE", None)
    slow = p.preprocess_image(img)
    assert fast.shape == slow.shape == ((16, 24, 3) if over.get("layout") == "NHWC" else (3, 16, 24))
    np.testing.assert_allclose(fast, slow, atol=2e-3)


def test_image_preprocess_numpy_values(numpy_only):
    img = np.zeros((16, 24, 3), np.uint8)
    img[..., 0] = 200
    p = pl.Pipeline(_pre(mean=[100, 0, 0], std=[50, 1, 1]), IMG_IN, LOGITS)
    out = p.prepare({"image": img[None]})["input"]
    assert out.shape == (1, 3, 16, 24) and out.dtype == np.float32
    np.testing.assert_allclose(out[0, 0], 2.0)
    np.testing.assert_allclose(out[0, 1], 0.0)
    bgr = pl.Pipeline(_pre(mean=[0, 0, 0], std=[1, 1, 1], color="BGR"), IMG_IN, LOGITS).preprocess_image(img)
    np.testing.assert_allclose(bgr[2], 200.0)
    np.testing.assert_allclose(bgr[0], 0.0)


def test_classification_kernel_matches_numpy(monkeypatch):
    _kernels_or_skip()
    p = pl.Pipeline({"postprocess": {"kind": "classification", "softmax": True, "top_k": 4}}, IMG_IN, LOGITS)
    logits = np.random.default_rng(0).standard_normal((5, 10)).astype(np.float32)
    fast = p.postprocess({"logits": logits.copy()}, None)
    monkeypatch.setattr(pl, "_SVE", None)
    slow = p.postprocess({"logits": logits.copy()}, None)
    np.testing.assert_array_equal(fast["topk_classes"], slow["topk_classes"])
    assert fast["topk_classes"].dtype == np.int64
    np.testing.assert_allclose(fast["topk_scores"], slow["topk_scores"], rtol=1e-5, atol=1e-7)


def test_classification_without_softmax_and_selective_outputs(numpy_only):
    p = pl.Pipeline({"postprocess": {"kind": "classification", "softmax": False, "top_k": 2}}, IMG_IN, LOGITS)
    logits = np.array([[0.1, 3.0, -1, 2.0, 0, 0, 0, 0, 0, 0]], np.float32)
    out = p.postprocess({"logits": logits}, None)
    assert out["topk_classes"].tolist() == [[1, 3]] and out["topk_scores"].tolist() == [[3.0, 2.0]]
    assert p.needs_model_output({"topk_scores"}) == ["logits"]
    assert "topk_scores" not in p.postprocess({"logits": logits}, {"logits"})


def _yolo_output() -> np.ndarray:
    # Three boxes (cx, cy, w, h) and two classes in YOLOv8's (1, 4 + C, A) layout: boxes 0 and 1
    # overlap heavily in class 0, box 2 is elsewhere in class 1.
    boxes = np.array([[50, 50, 20, 20], [52, 51, 20, 20], [150, 80, 30, 10]], np.float32)
    scores = np.array([[0.9, 0.1], [0.8, 0.05], [0.2, 0.7]], np.float32)
    rows = np.concatenate([boxes, scores], 1)
    rows = np.concatenate([rows, np.zeros((9, 6), np.float32)])  # background anchors, score 0
    return rows.T[None].copy()


@pytest.mark.parametrize("use_kernel", [True, False])
def test_detection_postprocess(use_kernel, monkeypatch):
    if use_kernel:
        _kernels_or_skip()
    else:
        monkeypatch.setattr(pl, "_SVE", None)
        monkeypatch.setattr(pl, "_SVE_CHECKED", True)
    outs = [TensorSpec("output0", np.dtype(np.float32), (-1, 6, 12))]
    p = pl.Pipeline({"postprocess": {"kind": "detection", "box_format": "cxcywh", "score_threshold": 0.25,
                                     "iou_threshold": 0.45, "max_detections": 5}}, IMG_IN, outs)
    res = p.postprocess({"output0": _yolo_output()}, None)
    assert res["num_detections"].tolist() == [2]
    dets = res["detections"][0]
    np.testing.assert_allclose(dets[0], [40, 40, 60, 60, 0.9, 0], atol=1e-5)
    np.testing.assert_allclose(dets[1], [135, 75, 165, 85, 0.7, 1], atol=1e-5)
    assert not dets[2:].any()


def _constant_detector(path):
    """A real ONNX detector whose every anchor sees one box, cx 32 cy 32 w 20 h 10 (model pixels)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    anchors = np.tile(np.array([[32, 32, 20, 10, 0.9]], np.float32), (8, 1))[None]  # [1, 8, 4+1]
    nodes = [helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1),
             helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Reshape", ["z", "shape"], ["z3"]),
             helper.make_node("Add", ["z3", "anchors"], ["output0"])]
    graph = helper.make_graph(
        nodes, "det", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 8, 5])],
        [numpy_helper.from_array(np.zeros((), np.float32), "zero"),
         numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape"),
         numpy_helper.from_array(anchors, "anchors")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_detections_come_back_in_the_clients_image_coordinates(tmp_path, bundle_maker, installer, daemon_factory):
    import tritonclient.http as httpclient

    store = tmp_path / "store"
    store.mkdir()
    installer(store, bundle_maker(
        tmp_path / "det", _constant_detector(tmp_path / "det.onnx"), "det", "1.0.0",
        preprocess={"kind": "image", "size": [64, 64], "letterbox": True, "mean": [0, 0, 0], "std": [255, 255, 255]},
        postprocess={"kind": "detection", "box_format": "cxcywh", "score_threshold": 0.25, "iou_threshold": 0.45,
                     "max_detections": 4}))
    d = daemon_factory(store)
    img = np.zeros((32, 128, 3), np.uint8)  # letterboxed: scale 0.5, 16 x 64 at top 24, left 0
    inp = httpclient.InferInput("image", list(img.shape), "UINT8")
    inp.set_data_from_numpy(img)
    outs = [httpclient.InferRequestedOutput(n) for n in ("detections", "detections_model", "num_detections")]
    res = d.client().infer("det", [inp], outputs=outs)
    assert res.as_numpy("num_detections").tolist() == [1]
    np.testing.assert_allclose(res.as_numpy("detections_model")[0, 0, :4], [22, 27, 42, 37])
    np.testing.assert_allclose(res.as_numpy("detections")[0, 0, :4], [44, 6, 84, 26])
    assert not res.as_numpy("detections")[0, 1:].any()
