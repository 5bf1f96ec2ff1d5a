"""Calibration and evaluation data: folders of images or tensors, and built-in real photographs.

Built-in sets are real, offline data: scikit-image's and scikit-learn's photographs (random crops,
calibration and evaluation drawn from *different* photos so evaluation never sees a calibration
image) and scikit-learn's digits (first 1200 for calibration, the rest, with labels, for evaluation).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.errors import DataError
from cuvil_edge.packager.imaging import as_rgb_uint8, preprocess_image

__all__ = ["Dataset", "InputSpec", "assumed_image_preprocess", "holds_images", "load_dataset", "with_batch_axes", "load_photo", "photo_crops", "PHOTOS_CALIBRATION", "PHOTOS_EVALUATION"]

_IMAGE_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
PHOTOS_CALIBRATION = ("chelsea", "rocket", "hubble_deep_field", "retina", "sk:china", "camera", "coins", "brick", "grass")
PHOTOS_EVALUATION = ("astronaut", "coffee", "immunohistochemistry", "sk:flower", "clock", "moon", "gravel", "page")


@dataclass(frozen=True)
class InputSpec:
    """A model input: name, element type, shape (str or -1 for dynamic dimensions) and batch axis.

    ``batch_axis`` is the axis samples stack along: 0 for most inputs, 1 for a recurrent state laid
    out ``[layers, batch, hidden]``, ``None`` for an input without one (a scalar sample rate, a
    flag): such an input takes one value per run, shared by every sample of a batch.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    batch_axis: int | None = 0

    @property
    def sample_shape(self) -> tuple[int | str, ...]:
        """The shape of one sample: the input's shape without its batch axis."""
        if self.batch_axis is None:
            return self.shape
        return self.shape[: self.batch_axis] + self.shape[self.batch_axis + 1 :]


def _dynamic(dim: int | str) -> bool:
    return not isinstance(dim, int) or dim <= 0


def with_batch_axes(inputs: list[InputSpec], declared: Mapping[str, int | None] | None = None) -> list[InputSpec]:
    """The inputs with their batch axes: as ``declared`` (the recipe's ``[input] batch_axes``), else detected.

    Detection: a scalar has none; axis 0 when it is dynamic or 1; else the axis named like another
    input's batch dimension (``state [2, batch, 128]`` beside ``input [batch, 512]``); else the
    first dynamic or size-1 axis (``[2, ?, 128]``); else 0.

    Raises:
        DataError: a declared axis outside the input's rank, or a declared input the model lacks.
    """
    declared = dict(declared or {})
    unknown = sorted(set(declared) - {s.name for s in inputs})
    if unknown:
        raise DataError(f"[input] batch_axes: '{unknown[0]}' is not an input of the model "
                        f"(inputs: {', '.join(s.name for s in inputs)})")
    batch_names = {s.shape[0] for s in inputs if s.shape and isinstance(s.shape[0], str) and s.shape[0]}
    out = []
    for s in inputs:
        axis: int | None
        if s.name in declared:
            axis = declared[s.name]
            if axis is not None and not 0 <= axis < len(s.shape):
                raise DataError(f"[input] batch_axes: input '{s.name}' has rank {len(s.shape)}; "
                                f"batch axis {axis} does not exist")
        elif not s.shape:
            axis = None
        elif _dynamic(s.shape[0]) or s.shape[0] == 1:
            axis = 0
        else:
            named = [i for i, d in enumerate(s.shape) if isinstance(d, str) and d in batch_names]
            loose = [i for i, d in enumerate(s.shape) if _dynamic(d) or d == 1]
            axis = named[0] if named else (loose[0] if loose else 0)
        out.append(replace(s, batch_axis=axis))
    return out


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
    # Per input, the model's batch axis (absent: 0). Samples are stored with it moved to the front;
    # None: the input has none, one value per sample is stored and a feed carries it as it is.
    batch_axes: dict[str, int | None] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    @property
    def ragged(self) -> bool:
        """True when samples are kept one by one because their shapes differ."""
        return any(isinstance(v, list) for v in self.inputs.values())

    def slice(self, start: int, stop: int) -> Dataset:
        labels = None if self.labels is None else self.labels[start:stop]
        return Dataset({k: v[start:stop] for k, v in self.inputs.items()}, labels, self.source, dict(self.batch_axes))

    def take(self, indices: list[int]) -> Dataset:
        """The samples at ``indices``, in that order."""
        labels = None if self.labels is None else self.labels[indices]
        inputs: dict[str, np.ndarray | list[np.ndarray]] = {
            k: ([v[i] for i in indices] if isinstance(v, list) else v[indices]) for k, v in self.inputs.items()}
        return Dataset(inputs, labels, self.source, dict(self.batch_axes))

    def shape_order(self) -> list[int] | None:
        """Sample indices with samples of one shape together (stable), or None when :meth:`batches`
        already stacks all it can: samples in order, or none that would stack anyway.

        OCR crops of four widths in turn never stack in order; grouped, a run takes two to four
        samples a call (a quarter less time per sample for PP-OCR's recogniser)."""
        if not self.ragged:
            return None
        unbatched = {k for k, a in self.batch_axes.items() if a is None}
        keys = []
        for i in range(len(self)):
            key = []
            for k, v in self.inputs.items():
                a = np.asarray(v[i])
                key.append((k, a.shape, a.tobytes() if k in unbatched else b""))
            keys.append(tuple(key))
        first: dict[tuple[Any, ...], int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        order = sorted(range(len(self)), key=lambda i: (first[keys[i]], i))
        return None if order == list(range(len(self))) else order

    def _feed(self, name: str, stacked: np.ndarray) -> np.ndarray:
        """Samples stacked along axis 0 as the model takes them: the batch axis in its place."""
        axis = self.batch_axes.get(name, 0)
        if axis is None:
            return np.array(stacked[0])  # a 0-d array, not a numpy scalar: ONNX Runtime takes arrays only
        return np.moveaxis(stacked, 0, axis) if axis else stacked

    def batches(self, max_batch: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
        """``(start, stop, feed)`` over the samples in order: at most ``max_batch`` samples a feed,
        only consecutive samples of one shape stacked together, and, for inputs without a batch
        axis, only samples that share its value."""
        n = len(self)
        max_batch = max(1, max_batch)
        unbatched = [k for k, a in self.batch_axes.items() if a is None and k in self.inputs]
        if not self.ragged and not unbatched:
            for start in range(0, n, max_batch):
                stop = min(n, start + max_batch)
                yield start, stop, {k: self._feed(k, v[start:stop]) for k, v in self.inputs.items()}  # type: ignore[arg-type]
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
                if any(not np.array_equal(nxt[k], first[k]) for k in unbatched):
                    break
                parts.append(nxt)
                stop += 1
            yield start, stop, {k: self._feed(k, np.concatenate([p[k] for p in parts])) for k in first}
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
    """Samples of ``spec`` as stored in a Dataset: stacked along axis 0 (the batch axis moved there).

    Accepts one sample without its batch axis, or samples in the model's layout (batch axis where
    the model has it); an input without a batch axis takes one value, or one per sample stacked
    on a new first axis.
    """
    rank = len(spec.shape)
    arr = np.asarray(arr)
    bad = (f"{where}: sample has shape {list(arr.shape)}, model input '{spec.name}' expects "
           f"{list(spec.shape)}" + (f" (batch axis {spec.batch_axis})" if spec.batch_axis else ""))
    if spec.batch_axis is None or rank == 0:  # a scalar input has no batch axis, whatever it says
        if arr.ndim == rank:
            arr = arr[None]
        if arr.ndim != rank + 1:
            raise DataError(bad)
    else:
        if arr.ndim == rank - 1:
            arr = np.expand_dims(arr, spec.batch_axis)
        if arr.ndim != rank:
            raise DataError(bad)
        if spec.batch_axis:
            arr = np.moveaxis(arr, spec.batch_axis, 0)
    for got, exp in zip(arr.shape[1:], spec.sample_shape, strict=True):
        if isinstance(exp, int) and exp > 0 and got != exp:
            raise DataError(bad)
    try:
        return arr.astype(spec.dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: input '{spec.name}' needs {spec.dtype} values ({exc})") from None


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
            got: dict[str, np.ndarray] = {}
            for spec_in in inputs:
                key = spec_in.name if spec_in.name in keys else (loaded.files[0] if len(inputs) == 1 else None)
                if key is None or key not in keys:
                    raise DataError(f"{p}: no array named '{spec_in.name}' (has: {', '.join(sorted(keys))})")
                got[spec_in.name] = _check_shape(_npz_member(loaded, key, p), spec_in, str(p))
            count = max(len(a) for a in got.values())
            for spec_in in inputs:
                arr = got[spec_in.name]
                if spec_in.batch_axis is None and len(arr) == 1 and count > 1:
                    arr = np.repeat(arr, count, axis=0)  # one value for every sample of the file
                elif len(arr) != count:
                    raise DataError(f"{p}: '{spec_in.name}' holds {len(arr)} sample(s), other inputs {count}")
                batches[spec_in.name].append(arr)
            if "labels" in keys:
                labels.append(np.asarray(_npz_member(loaded, "labels", p)).reshape(-1))
    arrays = {k: _join(v, samples) for k, v in batches.items()}
    counts = {len(v) for v in arrays.values()}
    if len(counts) != 1:
        raise DataError(f"{path}: inputs have different sample counts")
    label_arr = np.concatenate(labels)[:samples] if labels else None
    return Dataset(arrays, label_arr, str(path), {i.name: i.batch_axis for i in inputs})


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
        ds.batch_axes = {i.name: i.batch_axis for i in inputs}
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


def holds_images(spec: str) -> bool:
    """True when ``spec`` is an image file or a folder holding images (not tensors only)."""
    if not spec or spec.startswith("builtin:"):
        return False
    path = Path(spec)
    if path.is_file():
        return path.suffix.lower() in _IMAGE_EXT
    return path.is_dir() and any(p.suffix.lower() in _IMAGE_EXT for p in path.iterdir() if p.is_file())


def assumed_image_preprocess(inputs: list[InputSpec]) -> dict[str, Any] | None:
    """The pre-processing assumed for images when nobody gave one: the model's one image input at its
    own size, RGB, pixels scaled to 0..1 (``/255``, as YOLO-family and most exported detectors take
    them). None when the model has no such input (several inputs, no 3 channels, dynamic H/W)."""
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        return None
    shape = inputs[0].shape
    for layout, c, hw in (("NCHW", shape[1], shape[2:]), ("NHWC", shape[3], shape[1:3])):
        if c == 3 and all(isinstance(d, int) and d > 0 for d in hw):
            return {"kind": "image", "size": [int(hw[0]), int(hw[1])], "resize": "bilinear", "letterbox": False,
                    "layout": layout, "color": "RGB", "mean": [0.0, 0.0, 0.0], "std": [255.0, 255.0, 255.0],
                    "dtype": "float32" if inputs[0].dtype != "float16" else "float16"}
    return None
