"""The real-model corpus packaged as a user would: each public model keeps its job, or ``package``
refuses naming the task metric that failed and leaves no bundle (issue 21).

Every model of ``corpus.CORPUS`` is packaged INT8 for an Orin Nano (TensorRT form) and for a generic
arm64 board (ONNX Runtime CPU form), and mixed for the Orin, on small real data (held-out photos,
synthesised speech, the bytes of real files; see ``corpus.py``). ``OUTCOME`` records what the gate
decides today for each: ``None`` = ships, with its task metric asserted here against FP32; a metric
name = refused on that metric. An entry that changes (a quantizer that keeps scores apart from boxes
makes NudeNet pass) must be updated here, with the figure.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import onnx
import pytest
from corpus import CORPUS, model_path, recipe_dict, samples, write_samples

from cuvil_edge.errors import AccuracyError
from cuvil_edge.packager.package import package
from cuvil_edge.recipes import recipe_from_dict

# Samples (calibration, evaluation): frames for the stream model, samples otherwise.
SIZES = {"silero-vad": (160, 320), "minilm": (12, 8), "magika": (24, 24)}
DEFAULT_SIZE = (12, 12)
# Samples the mixed search ranks and checks on (a slice of the calibration data).
SEARCH = {"ocr-cls": 12, "magika": 8}
ORIN, ARM = "orin-nano-8gb", "generic-arm64"
# NudeNet's mixed search is measured by bench/bench_packager.py --tasks (24 held-out crops, 36
# detections: recall 0.97): on this file's 12 crops FP32 finds 12 boxes, and one extra box in the
# bundle's output is a precision of 0.85.
SEARCH_IN_BENCH = {"nudenet-320n"}
MATRIX = [(name, ORIN, "int8") for name in CORPUS] + [(name, ARM, "int8") for name in CORPUS] + [
    (name, ORIN, "mixed") for name in CORPUS if name not in SEARCH_IN_BENCH]

# What the gate decides today: None ships; a metric name is the refusal's.
OUTCOME: dict[tuple[str, str, str], str | None] = {
    # Boxes and scores are quantized apart now (one shared scale gave recall 0 at cosine 0.999:
    # test_tasks.py plants it); Orin recall 0.81 on 24 held-out crops.
    ("nudenet-320n", ORIN, "int8"): "recall",
    ("nudenet-320n", ARM, "int8"): None,  # recall 0.917, precision 0.917 on these 12 crops (0.86 on 24)
    ("centerface", ORIN, "int8"): None,
    ("centerface", ARM, "int8"): None,
    ("centerface", ORIN, "mixed"): None,
    # Thin text masks on photo crops: a sample whose few FP32 text pixels vanish scores IoU 0.
    ("ocr-det", ORIN, "int8"): "mask_iou",
    ("ocr-det", ARM, "int8"): "mask_iou",
    ("ocr-det", ORIN, "mixed"): "mask_iou",
    ("ocr-rec", ORIN, "int8"): "char_error_rate",
    ("ocr-rec", ARM, "int8"): "char_error_rate",
    # Over runs of nodes the search met the goal on its 4 samples with every group in FP16 and lost a
    # character on held-out crops (CER 0.07); the op-type families' search, compared on the calibration
    # samples it did not see, ships: Conv/Mul/Add/Div/HardSigmoid in FP32, CER 0.
    ("ocr-rec", ORIN, "mixed"): None,
    # Text lines as rapidocr feeds them (the detector's lines, half turned 180 degrees; photo crops left
    # the original undecided). Calibrated on these 12 lines the TensorRT form flips 1 of 12 held-out
    # lines; the mixed search keeps a few runs in float and keeps every decision.
    ("ocr-cls", ORIN, "int8"): "confident_top1_agreement",
    ("ocr-cls", ARM, "int8"): None,
    ("ocr-cls", ORIN, "mixed"): None,
    # Per-tensor INT8 activations through LayerNorm/GELU/attention: cosine 0.49.
    ("minilm", ORIN, "int8"): "cosine",
    ("minilm", ARM, "int8"): "cosine",
    ("minilm", ORIN, "mixed"): None,  # 138 nodes in FP16: cosine 0.991
    # Silero VAD's graph sits inside an If on the sample rate: INT8 quantizes nothing in it (the report
    # says so), and the stream keeps every decision.
    ("silero-vad", ORIN, "int8"): None,
    ("silero-vad", ARM, "int8"): None,
    ("silero-vad", ORIN, "mixed"): None,
    # YOLOX at ddddocr's own score threshold (0.1): scores drift by 0.1 and characters near the
    # threshold drop out (recall 0.81, precision 0.96 on the Orin; 176 held-out characters).
    ("ddddocr-det", ORIN, "int8"): "recall",
    ("ddddocr-det", ARM, "int8"): "recall",
    # Its mixed search: INT8, or the first choice, meets recall 0.9 on the 4 search crops and misses it
    # on the 8 held-out calibration crops; searched again with every choice held to both, 28 nodes in
    # FP16 keep recall 0.92, precision 0.99 (was: 3 nodes, recall 0.79).
    ("ddddocr-det", ORIN, "mixed"): None,
    # Magika on the bytes of real files (features by the magika wheel itself): per-tensor INT8 through
    # its LayerNorm/GELU layers keeps no decision (top-1 agreement 0-0.4); mixed keeps the float path
    # the search finds and keeps every one.
    ("magika", ORIN, "int8"): "confident_top1_agreement",
    ("magika", ARM, "int8"): "confident_top1_agreement",
    ("magika", ORIN, "mixed"): None,
    # MTCNN O-Net's landmarks: every point within 5% of the face (mean error 0.5% of the crop).
    ("mtcnn-onet", ORIN, "int8"): None,
    ("mtcnn-onet", ARM, "int8"): None,
    ("mtcnn-onet", ORIN, "mixed"): None,
}
# Verdicts that sit on the host's float rounding: the mixed search ranks layer groups by measured
# loss, and on 12 held-out samples one flipped decision crosses the goal. ONNX Runtime's CPU kernels
# (and its NCHWc layout, blocked by the host's vector width) round differently on AVX-512 and AVX2
# hosts: each of these ships where the figures above were taken and is refused on a 2-core AMD EPYC
# with AVX2 only (ocr-rec CER 0.0714, ocr-cls confident top-1 0.917 = 1 of 12 lines, ddddocr-det
# recall 0.881), where graph optimisations at "extended" (no NCHWc) give ocr-cls and ddddocr-det
# back. Either verdict is accepted for these; each still holds: shipped means the task metric met,
# refused means refused on this metric.
HOST_EDGE: dict[tuple[str, str, str], str] = {
    ("ocr-rec", ORIN, "mixed"): "char_error_rate",
    ("ocr-cls", ORIN, "mixed"): "confident_top1_agreement",
    ("ddddocr-det", ORIN, "mixed"): "recall",
}
# Models left out of the matrix (none today: Magika's scores were softmaxed twice, so its FP32 model
# was never confident, and its CPU form failed in ONNX Runtime's quantizer on a [1, C] Gemm bias).
BLOCKED: set[str] = set()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("corpus")
    made: dict[str, tuple[Path, Path]] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> tuple[Path, Path]:
            n_cal, n_eval = SIZES.get(name, DEFAULT_SIZE)
            pair = (write_samples(root / f"{name}-cal", samples(name, n_cal, "calibration")),
                    write_samples(root / f"{name}-eval", samples(name, n_eval, "evaluation")))
            self[name] = pair
            return pair

    return Lazy(made)


def _recipe(name: str, target: str, precision: str, folders: dict[str, tuple[Path, Path]]):
    cal, ev = folders[name]
    return recipe_from_dict(recipe_dict(name, target, precision, cal, ev, evaluation={
        "data": str(ev), "samples": 1000, "sensitivity_samples": SEARCH.get(name, 4)}), "corpus")


# Models whose every bundle also goes through `cuvil-edge validate` with its recipe (a subprocess each),
# and the metric of each task that its table must show.
VALIDATE_CLI = {"ddddocr-det", "mtcnn-onet"}
TASK_METRIC = {"detection": "recall", "keypoints": "pck"}


def _toml(data: dict) -> str:
    """A recipe dict as TOML: top-level tables as sections, nested tables inline (JSON scalars and
    lists are TOML)."""
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    head = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    body = [f"\n[{k}]\n" + "\n".join(f"{json.dumps(f)} = {value(x)}" for f, x in v.items())
            for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(head) + "\n" + "\n".join(body) + "\n"


def _validate_cli(name: str, target: str, precision: str, bundle: Path, passed: bool, failures: list[str],
                  folders: dict[str, tuple[Path, Path]], cli, tmp_path: Path) -> None:
    """`cuvil-edge validate` on the bundle with its recipe measures the recipe's task (a detector's
    recall, not only cosine) with the bundle's FP16 layers: the verdict ``package`` gave, no traceback.
    On the bare model.onnx it measures the task too (FP16 layers unknown to it: in FP32)."""
    cal, ev = folders[name]
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(_toml(recipe_dict(name, target, precision, cal, ev)))
    model = tmp_path / f"{name}-bundled.onnx"
    with tarfile.open(bundle) as tar:
        model.write_bytes(tar.extractfile("model.onnx").read())
    metric = TASK_METRIC[CORPUS[name].task]
    for candidate in (bundle, model):
        res = cli("validate", str(model_path(name)), str(candidate), "--eval", str(ev), "--recipe", str(recipe),
                  "--samples", "1000", env={"COLUMNS": "300"})
        out = res.stdout + res.stderr
        assert "Traceback" not in res.stderr, res.stderr
        assert metric in out, out  # the task's own metric was measured
        if candidate == bundle:
            assert res.returncode == (0 if passed else 1), out
            if not passed:
                assert failures[0].split(" ")[0] in out, out


def _check_task(kind: str, m: dict) -> None:
    """The bundle keeps its job against FP32 (the issue's acceptance figures)."""
    if kind == "detection":
        assert m["recall"] >= 0.9 and m["precision"] >= 0.9, m
        assert m["reference_detections"] >= 5, m  # enough to mean something
    elif kind == "segmentation":
        assert m["mask_iou"] >= 0.9, m
    elif kind == "stream":
        assert m["decision_agreement"] >= 0.95, m
    elif kind == "ctc":
        assert m["char_error_rate"] <= 0.05, m
    elif kind == "keypoints":
        assert m["pck"] >= 0.95 and m["scored_samples"] >= 6, m
    elif kind == "classification":
        assert m["confident_top1_agreement"] >= 0.99 and m["top5_containment"] >= 0.995, m
    else:
        assert m["cosine"] >= 0.99, m


@pytest.mark.slow
@pytest.mark.parametrize(("name", "target", "precision"), [c for c in MATRIX if c[0] not in BLOCKED],
                         ids=lambda v: str(v))
def test_corpus_model_keeps_its_task_or_is_refused_naming_it(name, target, precision, folders, keypair, tmp_path,
                                                              cli):
    recipe = _recipe(name, target, precision, folders)
    out = tmp_path / f"{name}.cvb"
    expected = OUTCOME[(name, target, precision)]
    edge = HOST_EDGE.get((name, target, precision))
    # The gate's verdict without its keep-float advice, which ranks every layer group on a miss (minutes
    # for NudeNet here); test_a_refusal_names_the_metric_and_writes_no_bundle runs the refusal itself.
    result = package(recipe, out, keypair[0], enforce_goal=False)
    validation = result.report["validation"]
    task = validation["task_metrics"]
    if name in VALIDATE_CLI:
        _validate_cli(name, target, precision, out, validation["passed"], validation["failures"], folders, cli,
                      tmp_path)
    if not validation["passed"]:
        refused_on = expected or edge
        assert refused_on is not None, f"{name} {target} {precision} was refused: {validation['failures']}"
        assert any(f.startswith(f"{refused_on} ") for f in validation["failures"]), validation["failures"]
        return
    assert expected is None or edge is not None, f"{name} {target} {precision} now ships ({task}): update OUTCOME"
    assert result.report["validation"]["task"]["kind"] == CORPUS[name].task
    _check_task(CORPUS[name].task, task)
    with tarfile.open(out) as tar:
        report = json.loads(tar.extractfile("validation.json").read())
        onnx.checker.check_model(onnx.load_from_string(tar.extractfile("model.onnx").read()))
    assert report["validation"]["passed"] and report["validation"]["task_metrics"] == json.loads(json.dumps(task))


@pytest.mark.slow
def test_a_refusal_names_the_metric_and_writes_no_bundle(folders, keypair, tmp_path):
    """``package`` itself refuses a corpus model that loses its job: the error names the task metric,
    no bundle is written (the report is, beside it)."""
    out = tmp_path / "ocr-cls.cvb"
    with pytest.raises(AccuracyError, match=r"missed the accuracy goal: confident_top1_agreement 0\.\d+ < 0\.9900"):
        package(_recipe("ocr-cls", ORIN, "int8", folders), out, keypair[0])
    assert not out.exists()
