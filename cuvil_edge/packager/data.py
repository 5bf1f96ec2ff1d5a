"""Calibration and evaluation data: folders of images or tensors, and built-in real photographs.

Built-in sets are real, offline data: scikit-image's and scikit-learn's photographs (random crops,
calibration and evaluation drawn from *different* photos so evaluation never sees a calibration
image) and scikit-learn's digits (first 1200 for calibration, the rest, with labels, for evaluation).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.errors import DataError
from cuvil_edge.packager.imaging import as_rgb_uint8, preprocess_image

__all__ = ["Dataset", "InputSpec", "load_dataset", "load_photo", "photo_crops", "PHOTOS_CALIBRATION", "PHOTOS_EVALUATION"]

_IMAGE_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
PHOTOS_CALIBRATION = ("chelsea", "rocket", "hubble_deep_field", "retina", "sk:china", "camera", "coins", "brick", "grass")
PHOTOS_EVALUATION = ("astronaut", "coffee", "immunohistochemistry", "sk:flower", "clock", "moon", "gravel", "page")


@dataclass(frozen=True)
class InputSpec:
    """A model input: name, element type and shape (str or -1 for dynamic dimensions)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass
class Dataset:
    """Samples by input name, optional integer labels, and where they came from.

    Each input holds either one array ``[N, ...]`` (every sample the same shape) or, for models whose
    dynamic dimensions vary between samples (OCR crops, detectors at the image's own size), a list of
    ``N`` arrays of shape ``[1, ...]``. Consumers iterate with :meth:`batches`, which never stacks
    samples of different shapes.
    """

    inputs: dict[str, np.ndarray | list[np.ndarray]]
    labels: np.ndarray | None
    source: str

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    @property
    def ragged(self) -> bool:
        """True when samples are kept one by one because their shapes differ."""
        return any(isinstance(v, list) for v in self.inputs.values())

    def slice(self, start: int, stop: int) -> Dataset:
        labels = None if self.labels is None else self.labels[start:stop]
        return Dataset({k: v[start:stop] for k, v in self.inputs.items()}, labels, self.source)

    def batches(self, max_batch: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
        """``(start, stop, feed)`` over the samples in order: at most ``max_batch`` samples a feed,
        and only consecutive samples of one shape stacked together."""
        n = len(self)
        max_batch = max(1, max_batch)
        if not self.ragged:
            for start in range(0, n, max_batch):
                stop = min(n, start + max_batch)
                yield start, stop, {k: v[start:stop] for k, v in self.inputs.items()}  # type: ignore[misc]
            return

        def sample(i: int) -> dict[str, np.ndarray]:
            return {k: (v[i] if isinstance(v, list) else v[i : i + 1]) for k, v in self.inputs.items()}

        start = 0
        while start < n:
            first = sample(start)
            shapes = {k: a.shape for k, a in first.items()}
            parts = [first]
            stop = start + 1
            while stop < n and stop - start < max_batch:
                nxt = sample(stop)
                if any(a.shape != shapes[k] for k, a in nxt.items()):
                    break
                parts.append(nxt)
                stop += 1
            yield start, stop, {k: np.concatenate([p[k] for p in parts]) for k in first}
            start = stop


def load_photo(name: str) -> np.ndarray:
    """A built-in photograph as RGB uint8: a scikit-image name, or ``sk:china``/``sk:flower`` (scikit-learn)."""
    if name.startswith("sk:"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name[3:]}.jpg")
    from skimage import data as skdata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return as_rgb_uint8(getattr(skdata, name)())


def photo_crops(names: tuple[str, ...], count: int, spec: dict[str, Any], seed: int) -> np.ndarray:
    """``count`` random square crops (35-100% of the short side, random flips) of the named photos."""
    if spec.get("kind") != "image":
        raise DataError("built-in photos need an image [preprocess] section in the recipe")
    rng = np.random.default_rng(seed)
    photos = [load_photo(n) for n in names]
    out = []
    for i in range(count):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        side = int(min(h, w) * rng.uniform(0.35, 1.0))
        top = int(rng.integers(0, h - side + 1))
        left = int(rng.integers(0, w - side + 1))
        crop = img[top : top + side, left : left + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        out.append(preprocess_image(crop, spec))
    return np.stack(out)


def _check_shape(arr: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    want = spec.shape[1:]
    if arr.ndim == len(spec.shape) - 1:
        arr = arr[None]
    if arr.ndim != len(spec.shape):
        raise DataError(f"{where}: sample has shape {list(arr.shape)}, model input '{spec.name}' expects {list(spec.shape)}")
    for got, exp in zip(arr.shape[1:], want, strict=True):
        if isinstance(exp, int) and exp > 0 and got != exp:
            raise DataError(
                f"{where}: sample has shape {list(arr.shape)}, model input '{spec.name}' expects {list(spec.shape)}"
            )
    return arr.astype(spec.dtype, copy=False)


def _check_npy_header(path: Path) -> None:
    """Refuse a ``.npy`` whose header promises more data than the file holds, before allocating.

    ``np.load`` trusts the header: one claiming 1e11 samples asks for terabytes. Reading the
    header alone (magic, then ``read_array_header_*``) costs a few hundred bytes.
    """
    from numpy.lib import format as npformat

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            major, _minor = npformat.read_magic(f)
            if major == 1:
                shape, _fortran, dtype = npformat.read_array_header_1_0(f)
            elif major in (2, 3):
                shape, _fortran, dtype = npformat.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {major}")
            offset = f.tell()
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc})") from None
    if dtype.hasobject:
        raise DataError(f"{path}: holds Python objects; use a numeric array")
    count = 1
    for d in shape:
        count *= int(d)
    need = count * dtype.itemsize
    if need > size - offset:
        raise DataError(f"{path}: header claims shape {list(shape)} of {dtype} ({need} bytes) but the file "
                        f"holds only {size - offset} bytes of data; truncated or corrupt")


def _npz_member(npz: Any, key: str, path: Path) -> np.ndarray:
    """One array of an ``.npz``, its header judged against the member's real size first."""
    import zipfile

    from numpy.lib import format as npformat

    try:
        info = npz.zip.getinfo(f"{key}.npy")
        with npz.zip.open(info) as f:
            major, _minor = npformat.read_magic(f)
            read_header = npformat.read_array_header_1_0 if major == 1 else npformat.read_array_header_2_0
            shape, _fortran, dtype = read_header(f)
        count = 1
        for d in shape:
            count *= int(d)
        if dtype.hasobject or count * dtype.itemsize > info.file_size:
            raise DataError(f"{path}: member '{key}' claims shape {list(shape)} of {dtype} but holds "
                            f"{info.file_size} bytes; truncated or corrupt")
        return npz[key]
    except DataError:
        raise
    except (KeyError, OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: cannot read member '{key}' ({exc})") from None


def _load_files(path: Path, files: list[Path], inputs: list[InputSpec], spec: dict[str, Any], samples: int) -> Dataset:
    images = [p for p in files if p.suffix.lower() in _IMAGE_EXT]
    tensors = [p for p in files if p.suffix.lower() in (".npy", ".npz")]
    if not images and not tensors:
        raise DataError(f"{path}: no images (.jpg/.png/...) or tensors (.npy/.npz) in calibration/evaluation folder")
    if images and spec.get("kind") != "image":
        raise DataError(f"{path}: folder holds images but the recipe has no image [preprocess] section")
    if len(inputs) != 1 and images:
        raise DataError(f"{path}: images can feed only a single-input model; use .npz files keyed by input name")
    batches: dict[str, list[np.ndarray]] = {i.name: [] for i in inputs}
    labels: list[np.ndarray] = []
    for p in images:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(p) as im:
                arr = np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{p}: cannot read image ({exc})") from None
        batches[inputs[0].name].append(_check_shape(preprocess_image(arr, spec), inputs[0], str(p)))
    for p in tensors:
        if p.suffix.lower() == ".npy":
            _check_npy_header(p)
        try:
            # .npy: mapped, so only the samples used are read; .npz members are checked on access.
            loaded = np.load(p, allow_pickle=False, mmap_mode="r" if p.suffix.lower() == ".npy" else None)
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(f"{p}: cannot read tensor file ({exc})") from None
        if isinstance(loaded, np.ndarray):
            if len(inputs) != 1:
                raise DataError(f"{p}: .npy feeds only single-input models; use .npz keyed by input name")
            head = loaded[:samples] if loaded.ndim else loaded
            batches[inputs[0].name].append(np.array(_check_shape(head, inputs[0], str(p))))
            continue
        with loaded:
            keys = set(loaded.files)
            for spec_in in inputs:
                key = spec_in.name if spec_in.name in keys else (loaded.files[0] if len(inputs) == 1 else None)
                if key is None or key not in keys:
                    raise DataError(f"{p}: no array named '{spec_in.name}' (has: {', '.join(sorted(keys))})")
                batches[spec_in.name].append(_check_shape(_npz_member(loaded, key, p), spec_in, str(p)))
            if "labels" in keys:
                labels.append(np.asarray(_npz_member(loaded, "labels", p)).reshape(-1))
    arrays = {k: _join(v, samples) for k, v in batches.items()}
    counts = {len(v) for v in arrays.values()}
    if len(counts) != 1:
        raise DataError(f"{path}: inputs have different sample counts")
    label_arr = np.concatenate(labels)[:samples] if labels else None
    return Dataset(arrays, label_arr, str(path))


def _join(parts: list[np.ndarray], samples: int) -> np.ndarray | list[np.ndarray]:
    """Stack samples when they share one shape, else keep them one by one (``[1, ...]`` each)."""
    if len({p.shape[1:] for p in parts}) <= 1:
        return np.concatenate(parts)[:samples]
    return [p[i : i + 1] for p in parts for i in range(len(p))][:samples]


def load_dataset(
    spec: str, inputs: list[InputSpec], preprocess: dict[str, Any], samples: int, seed: int = 0
) -> Dataset:
    """Load ``samples`` samples from a folder, an .npy/.npz file or a ``builtin:`` set."""
    if not spec:
        raise DataError("no data given: pass --calib DIR (and --eval DIR) or set [calibration] data in the recipe")
    builtin: dict[str, Callable[[], Dataset]] = {
        "builtin:photos-calibration": lambda: Dataset(
            {inputs[0].name: photo_crops(PHOTOS_CALIBRATION, samples, preprocess, seed)}, None, spec
        ),
        "builtin:photos-evaluation": lambda: Dataset(
            {inputs[0].name: photo_crops(PHOTOS_EVALUATION, samples, preprocess, seed + 1)}, None, spec
        ),
        "builtin:digits-calibration": lambda: _digits(inputs, 0, 1200, samples, spec),
        "builtin:digits-evaluation": lambda: _digits(inputs, 1200, None, samples, spec),
    }
    if spec.startswith("builtin:"):
        if spec not in builtin:
            raise DataError(f"unknown built-in data set '{spec}' (known: {', '.join(sorted(builtin))})")
        ds = builtin[spec]()
        for s in inputs:
            if s.name in ds.inputs:
                ds.inputs[s.name] = _check_shape(ds.inputs[s.name], s, spec)
        return ds
    path = Path(spec)
    if not path.exists():
        raise DataError(f"{path}: data folder or file not found")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.suffix.lower() in _IMAGE_EXT or path.suffix.lower() in (".npy", ".npz"):
        files = [path]
    else:
        raise DataError(f"{path}: data must be a folder, an image, or an .npy/.npz file")
    ds = _load_files(path, files, inputs, preprocess, samples)
    if len(ds) == 0:
        raise DataError(f"{path}: no samples")
    return ds


def _digits(inputs: list[InputSpec], start: int, stop: int | None, samples: int, spec: str) -> Dataset:
    from cuvil_edge.models.digits import load_digits_data

    x, y = load_digits_data()
    x, y = x[start:stop][:samples], y[start:stop][:samples]
    return Dataset({inputs[0].name: x}, y, spec)
