"""Task metrics: recognised from real models' outputs, decoded as the models' own packages decode,
and goals that cannot be measured are errors, never passes (issue 21)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from corpus import CORPUS, model_path, samples
from onnx import helper, numpy_helper

from cuvil_edge.errors import AccuracyError, RecipeError
from cuvil_edge.packager.data import Dataset
from cuvil_edge.packager.tasks import TASKS, goal_failures, infer_task, keypoints, measure, resolve_task
from cuvil_edge.packager.tasks.detection import Detections, decode, match
from cuvil_edge.packager.validate import make_session, validate_models
from cuvil_edge.recipes import TASK_KINDS, AccuracyGoal, recipe_from_dict

EXPECTED = {
    "nudenet-320n": ("detection", "yolo"),
    "centerface": ("detection", "centernet"),
    "ocr-det": ("segmentation", None),
    "ocr-rec": ("ctc", None),
    "ocr-cls": ("classification", None),
    "silero-vad": ("stream", None),
    "minilm": ("embedding", None),
    "magika": ("classification", None),
    "ddddocr-det": ("detection", "yolox"),
    # Keypoints are declared, never guessed: O-Net's [N, 4], [N, 10], [N, 2] read as an embedding
    # (cosine on every output), and the report says what was inferred.
    "mtcnn-onet": ("embedding", None),
}


def _fp32(name: str, count: int, split: str = "evaluation") -> tuple[dict, dict]:
    sess = ort.InferenceSession(str(model_path(name)), providers=["CPUExecutionProvider"])
    feeds = samples(name, count, split)
    names = [o.name for o in sess.get_outputs()]
    runs = [dict(zip(names, sess.run(names, f), strict=True)) for f in feeds]
    return {n: [r[n] for r in runs] for n in names}, feeds[0]


def test_one_table_names_the_task_kinds():
    assert list(TASKS) == list(TASK_KINDS)
    assert {kind for kind, _ in EXPECTED.values()} <= set(TASKS)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "packager.md").read_text("utf-8")
    table = docs[docs.index("<!-- vocabulary: TASK_KINDS"):]
    assert [f"| `{k}` |" in table for k in TASK_KINDS] == [True] * len(TASK_KINDS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_task_inferred_from_each_corpus_models_outputs(name):
    """No recipe: the packager recognises each public model's job from what it outputs."""
    values, feed = _fp32(name, 1)
    spec = infer_task({k: v[0] for k, v in values.items()}, feed)
    kind, head = EXPECTED[name]
    assert spec.kind == kind and spec.inferred, spec.reason
    assert spec.post.get("head") == head
    assert kind in spec.reason and "inferred from the outputs" in spec.reason
    if kind == "stream":
        assert spec.post["state"] == {"state": "stateN"} and spec.post["decision"] == "output"


def test_yolo_decoding_matches_the_detectors_own_rule():
    """NudeNet's own post-processing (score > 0.2 then NMS) finds the same boxes as the bundle's."""
    values, _ = _fp32("nudenet-320n", 4)
    dets = decode(values, {"head": "yolo", "score_threshold": 0.25, "iou_threshold": 0.45, "box_format": "cxcywh"})
    raw = values["output0"][0][0].T  # [A, 4 + 18]
    assert len(dets) == 4
    assert len(dets[0].scores) >= 1  # the astronaut's face at least
    best = int(raw[:, 4:].max(1).argmax())
    cx, cy, w, h = raw[best, :4]
    assert np.allclose(dets[0].boxes[0], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], atol=1e-3)
    assert dets[0].scores[0] == pytest.approx(raw[best, 4:].max(), abs=1e-6)


def test_centernet_decoding_gives_boxes_and_five_keypoints():
    values, _ = _fp32("centerface", 1)
    dets = decode(values, {"head": "centernet", "score_threshold": 0.5, "iou_threshold": 0.3, "class_agnostic": True})
    assert len(dets[0].scores) >= 1  # the astronaut's face
    assert dets[0].keypoints is not None and dets[0].keypoints.shape[1:] == (5, 2)
    box, points = dets[0].boxes[0], dets[0].keypoints[0]
    assert ((points >= box[:2] - 2) & (points <= box[2:] + 2)).all()  # eyes, nose, mouth inside the face


def test_yolox_decoding_matches_the_detectors_own_rule():
    """ddddocr's own YOLOX post-processing (grid offsets and exp sizes at strides 8/16/32, objectness x
    class) finds the boxes the bundle's ``yolox`` head decodes, on the scanned page's characters."""
    values, _ = _fp32("ddddocr-det", 2)
    post = {"head": "yolox", "score_threshold": 0.1, "iou_threshold": 0.45, "class_agnostic": True}
    dets = decode(values, post)
    raw = values["output"][0][0].astype(np.float64)  # [3549, 6]
    cells, strides = [], []
    for s in (8, 16, 32):  # YOLOX's demo_postprocess, written out
        n = 416 // s
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        cells.append(np.stack([xv, yv], 2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(cells), np.concatenate(strides)
    xy, wh = (raw[:, :2] + grid) * stride, np.exp(raw[:, 2:4]) * stride
    score = raw[:, 4] * raw[:, 5]
    best = int(score.argmax())
    assert len(dets[0].scores) >= 5  # characters of the page
    assert np.allclose(dets[0].boxes[0], [*(xy[best] - wh[best] / 2), *(xy[best] + wh[best] / 2)], atol=1e-3)
    assert dets[0].scores[0] == pytest.approx(score[best], abs=1e-6)
    assert len(dets[0].scores) <= int((score > 0.1).sum())


def test_keypoint_layouts_decode_to_points():
    xs, ys = np.array([0.1, 0.2, 0.3]), np.array([0.6, 0.7, 0.8])
    want = np.stack([xs, ys], -1)
    assert np.allclose(keypoints.decode(np.concatenate([xs, ys])[None], {"layout": "xxyy"}), want)
    assert np.allclose(keypoints.decode(want.reshape(1, -1), {"layout": "xyxy"}), want)
    assert np.allclose(keypoints.decode(want[None] * 200, {"layout": "xyxy", "scale": 200}), want)
    heat = np.zeros((1, 3, 10, 20))
    for k, (x, y) in enumerate([(2, 1), (19, 9), (0, 0)]):
        heat[0, k, y, x] = 1.0
    assert np.allclose(keypoints.decode(heat, {"layout": "heatmap"}), [[0.125, 0.15], [0.975, 0.95], [0.025, 0.05]])
    with pytest.raises(AccuracyError, match="even number of coordinates"):
        keypoints.decode(np.zeros((1, 5)), {"layout": "xyxy"})


def test_keypoint_metric_counts_points_within_the_threshold_of_the_frame():
    ref = {"pts": np.array([[0.1, 0.5, 0.2, 0.6], [0.3, 0.3, 0.4, 0.4]]), "face": np.array([[0.1, 0.9], [0.9, 0.1]])}
    test = {"pts": ref["pts"] + [[0.03, 0.0, 0.0, 0.1], [0.5, 0.5, 0.5, 0.5]], "face": ref["face"]}
    spec = resolve_task({"kind": "keypoints", "output": "pts", "layout": "xxyy"})
    m, _ = measure(ref, test, spec)
    assert m["scored_samples"] == 2 and m["pck"] == pytest.approx(0.25)  # one of four points within 0.05
    kept = resolve_task({"kind": "keypoints", "output": "pts", "layout": "xxyy", "score_output": "face",
                         "score_threshold": 0.7})
    m, _ = measure(ref, test, kept)
    assert m["scored_samples"] == 1 and m["pck"] == pytest.approx(0.5) and m["score_agreement"] == 1.0
    assert goal_failures(m, kept.goal(None))[0].startswith("pck 0.5000 < 0.9500")
    assert m["keypoint_error"] == pytest.approx((0.03 + 0.1) / 2)
    nothing = {"pts": ref["pts"], "face": np.array([[0.9, 0.1], [0.9, 0.1]])}
    m, _ = measure(nothing, nothing, kept)
    with pytest.raises(RecipeError, match="'min_pck' cannot be computed for task 'keypoints': the original's face"):
        goal_failures(m, kept.goal(None))


def test_keypoint_gate_refuses_coarse_points_that_cosine_passes():
    """O-Net's landmarks rounded to steps of 0.1 of the face (one coarse per-tensor scale on the output):
    cosine stays above 0.99 while points move by up to 7% of the face; the keypoint gate refuses on PCK."""
    path = model_path("mtcnn-onet")
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.output[:] = ["dense_6_fp" if o == "dense_6" else o for o in node.output]
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.1, np.float32), "planted_scale"),
                                    numpy_helper.from_array(np.array(0, np.int8), "planted_zero")])
    model.graph.node.extend([
        helper.make_node("QuantizeLinear", ["dense_6_fp", "planted_scale", "planted_zero"], ["dense_6_q"]),
        helper.make_node("DequantizeLinear", ["dense_6_q", "planted_scale", "planted_zero"], ["dense_6"]),
    ])
    data = Dataset({"input_3": np.concatenate([s["input_3"] for s in samples("mtcnn-onet", 12, "evaluation")])},
                   None, "faces")
    post = {"kind": "keypoints", "output": "dense_6", "layout": "xxyy", "score_output": "softmax_2",
            "score_threshold": 0.7}
    report = validate_models(make_session(path), make_session(model), data, post, AccuracyGoal())
    m = report.extra["task_metrics"]
    assert report.outputs["dense_6"]["cosine"] > 0.99  # what a cosine gate would pass
    assert m["scored_samples"] >= 6 and m["pck"] < 0.95 and not report.passed, m
    assert report.failures[0].startswith("pck "), report.failures
    same = validate_models(make_session(path), make_session(path), data, post, AccuracyGoal())
    assert same.passed and same.extra["task_metrics"]["pck"] == 1.0


def test_match_needs_the_same_class_and_half_overlap():
    ref = Detections(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([0.9, 0.8]), np.array([1, 2]))
    test = Detections(np.array([[1, 1, 10, 10], [20, 20, 30, 30], [0, 0, 4, 4]], float), np.array([0.7, 0.8, 0.9]),
                      np.array([1, 3, 1]))
    pairs = match(ref, test)
    assert [(r, t) for r, t, _ in pairs] == [(0, 0)]  # class 3 != 2; the small box overlaps < 0.5


def _planted_concat_scale(path) -> onnx.ModelProto:
    """The YOLO output as a per-tensor INT8 Q/DQ would carry it: one scale for boxes (0-320) and scores
    (0-1) together, as the issue found in a shipped bundle."""
    model = onnx.load(str(path))
    out = model.graph.output[0].name
    inner = out + "_fp"
    for node in model.graph.node:
        node.output[:] = [inner if o == out else o for o in node.output]
    scale = numpy_helper.from_array(np.array(320.0 / 127, np.float32), "planted_scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "planted_zero")
    model.graph.initializer.extend([scale, zero])
    model.graph.node.extend([
        helper.make_node("QuantizeLinear", [inner, "planted_scale", "planted_zero"], [out + "_q"], name="planted_q"),
        helper.make_node("DequantizeLinear", [out + "_q", "planted_scale", "planted_zero"], [out], name="planted_dq"),
    ])
    return model


def test_gate_refuses_one_scale_for_boxes_and_scores():
    """Cosine stays near 1 (boxes dominate the tensor) while every score rounds to 0: the detection
    gate refuses on recall; the old gate (cosine, first output) passed this model."""
    path = model_path("nudenet-320n")
    data = Dataset({"images": np.concatenate([s["images"] for s in samples("nudenet-320n", 6, "evaluation")])},
                   None, "photos")
    broken = _planted_concat_scale(path)
    report = validate_models(make_session(path), make_session(broken), data, "detection", AccuracyGoal())
    assert report.outputs["output0"]["cosine"] > 0.99  # what the old gate looked at
    assert not report.passed
    assert report.extra["task_metrics"]["recall"] == 0.0
    assert any(f.startswith("recall 0.0000 < 0.9000") for f in report.failures), report.failures
    with pytest.raises(AccuracyError, match="recall"):
        report.raise_if_failed("nudenet")
    fine = validate_models(make_session(path), make_session(path), data, "detection", AccuracyGoal())
    assert fine.passed and fine.extra["task_metrics"]["recall"] == 1.0


def test_a_goal_the_task_cannot_measure_is_an_error_naming_the_fix():
    spec = resolve_task({"kind": "detection", "head": "yolo"})
    ref = {"out": np.array([[[10, 10, 4, 4, 0.9]] * 40], np.float32).transpose(0, 2, 1)}
    metrics, _ = measure(ref, ref, spec)
    with pytest.raises(RecipeError, match=r"'min_top5_containment' cannot be computed for task 'detection'.*"
                                          r"kind = \"classification\" \(or --kind classification\)"):
        goal_failures(metrics, spec.goal(AccuracyGoal(min_top5_containment=0.99)), "detection")
    with pytest.raises(RecipeError, match="no labels"):
        goal_failures(metrics, AccuracyGoal(min_map50=0.5), "detection")


def test_detection_with_nothing_to_find_is_not_a_pass():
    spec = resolve_task({"kind": "detection", "head": "yolo"})
    empty = {"out": np.zeros((2, 40, 6), np.float32)}
    metrics, _ = measure(empty, empty, spec)
    assert metrics["recall"] is None
    with pytest.raises(RecipeError, match="'min_recall' cannot be computed for task 'detection': the original "
                                          "model finds no detection above score_threshold"):
        goal_failures(metrics, spec.goal(None))
    assert goal_failures(metrics, AccuracyGoal(min_cosine=0.99), "detection") == []  # cosine still is


def test_every_output_is_checked_not_just_the_first():
    """A second output that drifts fails the default cosine goal though the first is exact."""
    spec = resolve_task("embedding")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((8, 4))
    metrics, per = measure({"first": a, "second": b}, {"first": a, "second": -b}, spec)
    assert per["first"]["cosine"] == pytest.approx(1.0) and per["second"]["cosine"] == pytest.approx(-1.0)
    assert goal_failures(metrics, spec.goal(None))[0].startswith("cosine -1.0000 < 0.9900")


def test_default_goals_follow_the_task():
    assert resolve_task("detection").goal(None).to_dict() == {"min_recall": 0.9, "min_precision": 0.9}
    assert resolve_task("segmentation").goal(AccuracyGoal(min_cosine=0.5)).to_dict() == {
        "min_cosine": 0.5, "min_mask_iou": 0.9}
    assert resolve_task("classification").goal(None).to_dict() == {
        "min_confident_top1_agreement": 0.99, "min_top5_containment": 0.995}
    assert resolve_task("keypoints").goal(None).to_dict() == {"min_pck": 0.95}


def test_recipe_declares_streams_and_detection_heads():
    base = {"name": "m", "model": {"source": "m.onnx"}, "target": {"board": "generic-arm64"}}
    rec = recipe_from_dict({**base, "postprocess": {"kind": "stream", "state": {"state": "stateN"}}}, "t")
    assert rec.postprocess["state"] == {"state": "stateN"} and rec.postprocess["stream_length"] == 0
    with pytest.raises(RecipeError, match="'state' must map each state input"):
        recipe_from_dict({**base, "postprocess": {"kind": "stream"}}, "t")
    with pytest.raises(RecipeError, match="head' must be yolo, centernet, nms or yolox, got 'ssd'"):
        recipe_from_dict({**base, "postprocess": {"kind": "detection", "head": "ssd"}}, "t")
    rec = recipe_from_dict({**base, "postprocess": {"kind": "detection", "head": "yolox", "strides": [8, 16, 32]}}, "t")
    assert rec.postprocess["strides"] == [8, 16, 32]
    with pytest.raises(RecipeError, match="'strides' must be a list of positive integers"):
        recipe_from_dict({**base, "postprocess": {"kind": "detection", "head": "yolox", "strides": [8, 0]}}, "t")
    rec = recipe_from_dict({**base, "postprocess": {"kind": "keypoints", "layout": "xxyy", "output": "dense_6",
                                                    "score_output": "softmax_2", "score_threshold": 0.7}}, "t")
    assert rec.postprocess == {"kind": "keypoints", "layout": "xxyy", "scale": 1.0, "pck_threshold": 0.05,
                               "output": "dense_6", "score_output": "softmax_2", "score_threshold": 0.7,
                               "score_index": -1}
    with pytest.raises(RecipeError, match="'layout' must be xyxy, xxyy or heatmap, got 'yx'"):
        recipe_from_dict({**base, "postprocess": {"kind": "keypoints", "layout": "yx"}}, "t")
    with pytest.raises(RecipeError, match="kind must be classification, detection, .* got 'pose'"):
        recipe_from_dict({**base, "postprocess": {"kind": "pose"}}, "t")


def test_inspect_shows_the_task_and_its_default_goal(cli):
    res = cli("inspect", str(model_path("nudenet-320n")), "--target", "generic-arm64", env={"COLUMNS": "400"})
    assert res.returncode == 0, res.stderr
    assert "detection (yolo head)" in res.stdout and "default accuracy goal: min_recall 0.9, min_precision 0.9" \
        in res.stdout, res.stdout[-600:]


def test_stream_gate_runs_each_model_with_its_own_state(tmp_path):
    """A VAD whose state output is rounded to whole units: fed the original's states frame by frame
    (what validation did) it agrees on every frame; run as a stream with its own state it drifts and
    the gate refuses it on decision agreement."""
    from corpus import vad_samples, write_samples

    from cuvil_edge.packager.data import load_dataset, with_batch_axes
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.validate import run_model

    path = model_path("silero-vad")
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.output[:] = ["stateN_fp" if o == "stateN" else o for o in node.output]
    model.graph.initializer.extend([numpy_helper.from_array(np.array(1.0, np.float32), "planted_scale"),
                                    numpy_helper.from_array(np.array(0, np.int8), "planted_zero")])
    model.graph.node.extend([
        helper.make_node("QuantizeLinear", ["stateN_fp", "planted_scale", "planted_zero"], ["stateN_q"]),
        helper.make_node("DequantizeLinear", ["stateN_q", "planted_scale", "planted_zero"], ["stateN"]),
    ])
    folder = write_samples(tmp_path / "speech", vad_samples("evaluation", 320))
    inputs = with_batch_axes(model_inputs(load_model(path)), {"state": 1, "sr": None})
    data = load_dataset(str(folder), inputs, {"kind": "none"}, 1000)
    ref, got = run_model(make_session(path), data), run_model(make_session(model), data)
    frame_by_frame = np.mean([(np.asarray(a) > 0.5) == (np.asarray(b) > 0.5) for a, b in zip(ref["output"], got["output"])])
    assert frame_by_frame == 1.0  # the old check: nothing to see
    post = {"kind": "stream", "state": {"state": "stateN"}, "decision": "output", "threshold": 0.5}
    report = validate_models(make_session(path), make_session(model), data, post, AccuracyGoal())
    m = report.extra["task_metrics"]
    assert m["frames"] == 320 and 0.5 < m["reference_positive_rate"] < 0.95  # speech and pauses
    assert m["decision_agreement"] < 0.95 and not report.passed, m
    assert report.failures[0].startswith("decision_agreement"), report.failures
    same = validate_models(make_session(path), make_session(path), data, post, AccuracyGoal())
    assert same.passed and same.extra["task_metrics"]["decision_agreement"] == 1.0


def test_a_model_that_ends_in_softmax_is_judged_on_its_own_probabilities():
    """Magika's 214 class probabilities, softmaxed again, gave a top-1 of at most e / (e + 213):
    never confident, so its classification goal could not be computed. Probabilities are taken as
    they are; logits still go through a softmax."""
    from cuvil_edge.packager.tasks.classification import classify

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((16, 214)) * 2
    logits[np.arange(16), rng.integers(0, 214, 16)] += 12  # decided originals
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    flipped = probs.copy()
    flipped[:4] = flipped[:4, ::-1]  # four samples change their class
    m = classify(probs, flipped)
    assert m["confident_samples"] == 16
    assert m["confident_top1_agreement"] == pytest.approx(12 / 16)
    assert classify(logits, logits)["confident_samples"] == 16
    assert classify(logits, logits)["mean_kl"] == pytest.approx(0.0, abs=1e-9)
