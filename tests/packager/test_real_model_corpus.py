"""Real public models nobody tuned for this project package at INT8 for an Orin.

The three ONNX models that PyPI's ``rapidocr-onnxruntime`` ships (PaddleOCR's, exported by their
authors): a text-direction classifier (opset 11, input ``[-1, 3, 48, 192]``), a text detector
(opset 12, dynamic H and W: a segmentation-style probability map) and a text recogniser (opset 12,
dynamic width, a sequence of 6,625-way softmaxes). Calibration data are real photographs cut to the
shapes each model takes, 24 ``.npy`` files, the detector's and recogniser's of different sizes.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from cuvil_edge.packager.data import load_photo

PACKAGE = "rapidocr-onnxruntime"
MODELS = {
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
}
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "page", "text", "camera", "coins")


def _model_path(kind: str) -> Path:
    from importlib.metadata import PackageNotFoundError, files

    try:
        found = [f for f in files(PACKAGE) or [] if f.name == MODELS[kind]]
    except PackageNotFoundError:
        if os.environ.get("CI"):
            pytest.fail(f"{PACKAGE} is not installed (scripts/bootstrap.sh test installs it)")
        pytest.skip(f"{PACKAGE} is not installed (scripts/bootstrap.sh test installs it)")
    assert found, f"{MODELS[kind]} not in {PACKAGE}"
    return Path(found[0].locate())


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))


def _write_samples(folder: Path, kind: str, count: int = 24) -> None:
    """``count`` crops of real photos, pre-processed as RapidOCR does for each model."""
    rng = np.random.default_rng(11)
    folder.mkdir()
    photos = [load_photo(n) for n in PHOTOS]
    for i in range(count):
        img = photos[i % len(photos)]
        if kind == "det":
            h, w = [(160, 224), (224, 160), (192, 192), (128, 256)][i % 4]
        elif kind == "rec":
            h, w = 48, [160, 192, 240, 320][i % 4]
        else:
            h, w = 48, 192
        top = int(rng.integers(0, img.shape[0] - img.shape[0] // 2))
        left = int(rng.integers(0, img.shape[1] - img.shape[1] // 2))
        crop = _resize(np.ascontiguousarray(img[top : top + img.shape[0] // 2, left : left + img.shape[1] // 2]), h, w)
        x = crop.astype(np.float32) / 255.0
        if kind == "det":
            x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
        else:
            x = (x - 0.5) / 0.5
        np.save(folder / f"{i:02d}.npy", x.transpose(2, 0, 1)[None].astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cls", "det", "rec"])
def test_public_ocr_model_packages_at_int8_for_orin(kind, tmp_path, keypair, cli):
    model = _model_path(kind)
    _write_samples(tmp_path / "calib", kind)
    out = tmp_path / f"{kind}.cvb"
    # Dynamic dimensions get a TensorRT profile covering the sizes the samples have (package refuses without).
    shapes = {"cls": "x:1x3x48x192", "det": "x:1x3x128x128,1x3x192x192,1x3x256x256",
              "rec": "x:1x3x48x160,1x3x48x240,1x3x48x320"}[kind]
    res = cli("package", str(model), "--target", "orin-nano-8gb", "--precision", "int8",
              "--calib", str(tmp_path / "calib"), "--out", str(out), "--key", str(keypair[0]), "--json",
              "--input-shape", shapes)
    assert res.returncode == 0, res.stdout + res.stderr
    with tarfile.open(out) as tar:
        quantized = onnx.load_from_string(tar.extractfile("model.onnx").read())
        report = json.loads(tar.extractfile("validation.json").read())
    inits = {i.name: i.data_type for i in quantized.graph.initializer}
    dq_types = {inits.get(n.input[0]) for n in quantized.graph.node if n.op_type == "DequantizeLinear"} - {None}
    assert dq_types == {onnx.TensorProto.INT8}, dq_types  # no int32 bias behind a DequantizeLinear
    assert report["quantization"]["qdq_check"]["violations"] == 0
    assert report["quantization"]["qdq_check"]["qdq_nodes"] > 20
    first = next(iter(report["validation"]["outputs"].values()))
    # Held-out quarter of the samples, compared by exact Q/DQ emulation with the FP32 original.
    assert first["cosine"] > 0.9, first
