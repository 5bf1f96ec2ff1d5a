"""Activation ranges for INT8 calibration, collected in one streaming pass over any data.

Why not ONNX Runtime's calibrators: they keep per-batch lists of every intermediate tensor and turn
them into one array (``np.asarray`` over batches), so batches of different sizes, or samples whose
H/W differ (OCR crops, detectors at the image's own size), abort with "inhomogeneous shape"; and
without chunking they hold every activation of every sample at once (24 GB for 512 EfficientNet
crops). Here each tensor keeps a fixed-size signed histogram whose range doubles when a larger value
arrives (old bins merge pairwise), plus its exact minimum and maximum, so memory is one batch of
activations plus ``bins`` counters per tensor, whatever the sample count or shapes.

The ranges are handed to ONNX Runtime's quantizer through its calibration cache
(``TensorsData``), so quantization itself (Q/DQ placement, scales, per-channel weights) stays
ONNX Runtime's, and the mixed-precision search re-quantizes many times without calibrating again.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from cuvil_edge.errors import QuantizationError
from cuvil_edge.packager.data import Dataset
from cuvil_edge.recipes import CALIBRATION_METHODS, choices

__all__ = ["DEFAULT_PERCENTILE", "HISTOGRAM_BINS", "ORT_CACHE_METHOD", "RANGE_METHODS", "RangeCollector",
           "TensorStats", "check_method", "collect_ranges"]

# Signed bins over [-R, R]: 2048 bins of |x| for the percentile, as ONNX Runtime's default.
HISTOGRAM_BINS = 4096
# Values a tensor's histogram reads per batch (min and max always read every value).
HISTOGRAM_CAP = 1 << 20
# Percentile of |x| kept by the default method. On EfficientNet-Lite0's 500 held-out photo crops
# (TensorRT form, pure INT8) 99.99 gave top-5 containment 0.996 and mean KL 0.036, 99.999 0.994 and
# 0.038, 99.995 0.996 and 0.036, 99.9 0.990 and 0.24 (it clips real activations); mse 0.990.
DEFAULT_PERCENTILE = 99.99
# A Concat whose inputs' ranges differ by more than this stays in float (``mixed_range_nodes``): the
# narrowest input would get under 127/16 ~ 8 steps of the shared scale (3 bits). A YOLOv8n head's
# last Concat measured 320 (boxes 0-320, scores 0-1) and lost every detection at INT8; its other
# Concats (feature maps of one block) stay within 4.
RANGE_SPLIT_RATIO = 16.0
# Entropy (KL) calibration works on ONNX Runtime's default of 128 bins (more clipped ReLU6 outputs).
ENTROPY_BINS = 128
ENTROPY_QUANTIZED_BINS = 128


@dataclass
class TensorStats:
    """Running statistics of one tensor: exact min/max and a signed histogram on [-limit, limit]."""

    bins: int
    minimum: float = math.inf
    maximum: float = -math.inf
    limit: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def add(self, values: np.ndarray) -> None:
        flat = np.asarray(values, dtype=np.float32).ravel()
        if flat.size == 0:
            return
        lo, hi = float(flat.min()), float(flat.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # rare: filter only when needed
            flat = flat[np.isfinite(flat)]
            if flat.size == 0:
                return
            lo, hi = float(flat.min()), float(flat.max())
        self.minimum, self.maximum = min(self.minimum, lo), max(self.maximum, hi)
        peak = max(abs(lo), abs(hi))
        if self.hist.size == 0:
            self.limit = peak if peak > 0 else 1e-8
            self.hist = np.zeros(self.bins, np.int64)
        elif peak > self.limit:
            self._widen(peak)
        if flat.size > HISTOGRAM_CAP:
            # Min and max above are exact; the histogram reads an even stride of at most
            # HISTOGRAM_CAP values a batch (EfficientNet's first activations hold 400k values a
            # sample), which keeps ~1,600 values beyond a 99.99 percentile over 16 batches.
            flat = flat[:: -(-flat.size // HISTOGRAM_CAP)]
        idx = ((flat + np.float32(self.limit)) * np.float32(self.bins / (2 * self.limit))).astype(np.int32)
        np.clip(idx, 0, self.bins - 1, out=idx)
        self.hist += np.bincount(idx, minlength=self.bins)

    def _widen(self, peak: float) -> None:
        """Grow the range by a power of two so ``peak`` fits; old bins merge into the wider ones."""
        factor = 2 ** math.ceil(math.log2(peak / self.limit))
        old_width = 2 * self.limit / self.bins
        centers = -self.limit + (np.arange(self.bins) + 0.5) * old_width
        new_limit = self.limit * factor
        new_width = 2 * new_limit / self.bins
        idx = np.clip(((centers + new_limit) / new_width).astype(np.int64), 0, self.bins - 1)
        self.hist = np.bincount(idx, weights=self.hist, minlength=self.bins).astype(np.int64)
        self.limit = new_limit

    def edges(self) -> np.ndarray:
        return np.linspace(-self.limit, self.limit, self.bins + 1, dtype=np.float64)

    def range(self, method: str, symmetric: bool, percentile: float) -> tuple[float, float]:
        """The (lowest, highest) values to quantize, by calibration method."""
        check_method(method)
        if self.hist.size == 0:
            return 0.0, 0.0
        return RANGE_METHODS[method](self, symmetric, percentile)

    def _minmax(self, symmetric: bool, percentile: float) -> tuple[float, float]:
        peak = max(abs(self.minimum), abs(self.maximum))
        return (-peak, peak) if symmetric else (self.minimum, self.maximum)

    def _percentile(self, symmetric: bool, percentile: float) -> tuple[float, float]:
        peak = max(abs(self.minimum), abs(self.maximum))
        half = self.bins // 2
        absolute = self.hist[half:] + self.hist[:half][::-1]
        cdf = np.cumsum(absolute) / max(1, absolute.sum())
        idx = int(np.searchsorted(cdf, percentile / 100.0))
        threshold = min(peak, (idx + 1) * (self.limit / half))
        if symmetric:
            return -threshold, threshold
        return max(self.minimum, -threshold), min(self.maximum, threshold)

    def _mse(self, symmetric: bool, percentile: float) -> tuple[float, float]:
        threshold = self._mse_threshold(symmetric, max(abs(self.minimum), abs(self.maximum)))
        return (-threshold, threshold) if symmetric else (max(self.minimum, -threshold), min(self.maximum, threshold))

    def _mse_threshold(self, symmetric: bool, peak: float) -> float:
        """The clipping threshold that minimises the expected squared quantization error of |x|:
        values within it round (step^2 / 12 each), values beyond it clip ((|x| - t)^2 each)."""
        half = self.bins // 2
        absolute = (self.hist[half:] + self.hist[:half][::-1]).astype(np.float64)
        width = self.limit / half
        centers = (np.arange(half) + 0.5) * width
        levels = 127.0 if symmetric else 255.0 / 2
        # Candidate thresholds at bin edges k * width; "within" means bins 0..k-1.
        k = np.arange(max(1, half // 64), half + 1)
        t = k * width
        keep = t <= peak * (1 + 1e-6)
        if not keep.any():
            return peak
        k, t = k[keep], t[keep]
        # Suffix sums over bins >= k of h, h*c, h*c^2 give sum(h * (c - t)^2) beyond t in O(1) each.
        s0 = np.concatenate([np.cumsum(absolute[::-1])[::-1], [0.0]])
        s1 = np.concatenate([np.cumsum((absolute * centers)[::-1])[::-1], [0.0]])
        s2 = np.concatenate([np.cumsum((absolute * centers**2)[::-1])[::-1], [0.0]])
        within = s0[0] - s0[k]
        clipped = s2[k] - 2 * t * s1[k] + t**2 * s0[k]
        errors = within * (t / levels) ** 2 / 12.0 + clipped
        return float(t[int(np.argmin(errors))])

    def _entropy(self, symmetric: bool, percentile: float = 0.0) -> tuple[float, float]:
        """TensorRT's KL-divergence threshold (ONNX Runtime's implementation) on ENTROPY_BINS bins."""
        from onnxruntime.quantization.calibrate import HistogramCollector

        group = self.bins // ENTROPY_BINS
        hist = self.hist.reshape(ENTROPY_BINS, group).sum(axis=1)
        edges = np.linspace(-self.limit, self.limit, ENTROPY_BINS + 1).astype(np.float32)
        collector = HistogramCollector("entropy", symmetric, ENTROPY_BINS, ENTROPY_QUANTIZED_BINS, 99.999, "same")
        threshold = np.float32(self.limit)
        lo, hi = collector.get_entropy_threshold(
            (hist, edges, np.float32(self.minimum), np.float32(self.maximum), threshold), ENTROPY_QUANTIZED_BINS)
        return float(lo), float(hi)


class RangeCollector:
    """Statistics of every float activation of a model, fed batch by batch."""

    def __init__(self, bins: int = HISTOGRAM_BINS) -> None:
        self.bins = bins
        self.stats: dict[str, TensorStats] = {}
        self.samples = 0
        self._channel_sums: dict[str, np.ndarray] = {}

    def add_channel_sums(self, name: str, values: np.ndarray) -> None:
        """Accumulate the per-sample channel means (axis 1, mean over axes 2..) of an NC... tensor."""
        if values.ndim < 3:
            return
        part = values.astype(np.float64).mean(axis=tuple(range(2, values.ndim))).sum(axis=0)
        self._channel_sums[name] = self._channel_sums.get(name, 0.0) + part

    def channel_means(self) -> dict[str, np.ndarray]:
        """Per-channel means over every sample seen (what bias correction needs of each Conv input)."""
        return {k: v / max(1, self.samples) for k, v in self._channel_sums.items()}

    def add(self, name: str, values: np.ndarray) -> None:
        self.stats.setdefault(name, TensorStats(self.bins)).add(values)

    def ranges(self, method: str, symmetric: bool, percentile: float = DEFAULT_PERCENTILE
               ) -> dict[str, tuple[float, float]]:
        return {name: s.range(method, symmetric, percentile) for name, s in self.stats.items()}

    def tensors_data(self, method: str, symmetric: bool, percentile: float = DEFAULT_PERCENTILE,
                     unclipped: set[str] | frozenset[str] = frozenset()) -> Any:
        """The ranges as ONNX Runtime's ``TensorsData`` (what its calibration cache holds).

        ``unclipped`` tensors take their full (min/max) range whatever the method: values a graph
        output carries as they are (``output_tensors``), where the rare large value is the signal.
        """
        from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

        check_method(method)
        ranges = self.ranges(method, symmetric, percentile)
        full = self.ranges("minmax", symmetric, percentile)
        data = {name: TensorData(lowest=np.float32(lo), highest=np.float32(hi))
                for name, (lo, hi) in ((n, full[n] if n in unclipped else r) for n, r in ranges.items())}
        return TensorsData(getattr(CalibrationMethod, ORT_CACHE_METHOD[method]), data)


# The dispatch of ``recipes.CALIBRATION_METHODS``: each name, the range it computes from a tensor's
# histogram (tests/core/test_vocabularies.py fails when the two tables disagree).
RANGE_METHODS: dict[str, Callable[[TensorStats, bool, float], tuple[float, float]]] = {
    "percentile": TensorStats._percentile,
    "mse": TensorStats._mse,
    "minmax": TensorStats._minmax,
    "entropy": TensorStats._entropy,
}
# ONNX Runtime's calibration cache records a ``CalibrationMethod`` member by name; it reads only the
# ranges, so "mse" ranges travel as Percentile.
ORT_CACHE_METHOD: dict[str, str] = {"percentile": "Percentile", "mse": "Percentile", "minmax": "MinMax",
                                    "entropy": "Entropy"}


def check_method(method: str) -> None:
    """Refuse a calibration method no table names (QuantizationError listing the known ones)."""
    if method not in CALIBRATION_METHODS or method not in RANGE_METHODS:
        raise QuantizationError(f"unknown calibration method '{method}' ({choices(CALIBRATION_METHODS)})")


def _float_tensors(model: onnx.ModelProto) -> list[str]:
    """Graph inputs and node outputs that carry floats (what quantization may need a range for)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - fall back to every output; non-float ones are dropped at run time
        inferred = model
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    for node in model.graph.node:
        names.extend(o for o in node.output if o)
    return [n for n in dict.fromkeys(names) if types.get(n, onnx.TensorProto.FLOAT) in floats]


def collect_ranges(model: onnx.ModelProto, data: Dataset, batch: int = 8,
                   on_batch: Callable[[int, int], None] | None = None, threads: int = 0,
                   channel_means_of: set[str] | None = None) -> RangeCollector:
    """One pass of ``data`` through ``model`` with every float activation exposed, into histograms.

    ``channel_means_of`` names tensors whose per-channel means are gathered in the same pass (bias
    correction's E[x] of each Conv input), so calibration reads the data once.
    Memory: one batch of every activation (``batch`` samples) plus the histograms.
    """
    wanted_means = channel_means_of or set()
    from cuvil_edge.packager.validate import make_session

    names = _float_tensors(model)
    aug = copy.deepcopy(model)
    present = {o.name for o in aug.graph.output}
    for name in names:
        if name not in present:
            aug.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = make_session(aug, threads=threads)
    outputs = [o.name for o in session.get_outputs()]
    fixed_batch = any(isinstance(i.shape[0], int) for i in session.get_inputs() if i.shape)
    collector = RangeCollector()
    total = len(data)
    for start, stop, feed in data.batches(1 if fixed_batch else batch):
        if on_batch is not None:
            on_batch(start, total)
        # Model inputs are ranges too (their Q node comes first).
        for name, value in feed.items():
            collector.add(name, value)
            if name in wanted_means:
                collector.add_channel_sums(name, value)
        for name, value in zip(outputs, session.run(outputs, feed), strict=True):
            if name not in feed and isinstance(value, np.ndarray) and value.dtype.kind == "f":
                collector.add(name, value)
                if name in wanted_means:
                    collector.add_channel_sums(name, value)
        collector.samples += stop - start
    if on_batch is not None:
        on_batch(total, total)
    return collector


# Ops that move values without computing new ones: a tensor that reaches a graph output through
# these alone is what the output carries.
_MOVES = ("Concat", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Split", "Slice",
          "Gather", "Expand")


def output_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors whose values reach a graph output unchanged (through Concat, Reshape, Transpose...).

    Percentile calibration clips the rare large values of a tensor; for a detector's class scores
    the rare large values are the detections (YOLOv8n's scores: 99.99th percentile 0.10, so every
    score above 0.25 clipped below the threshold). These tensors are calibrated min/max.
    """
    producers = {o: n for n in model.graph.node for o in n.output}
    found: set[str] = set()
    todo = [o.name for o in model.graph.output]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        node = producers.get(name)
        if node is not None and node.op_type in _MOVES:
            todo.extend(node.input[:1] if node.op_type not in ("Concat",) else node.input)
    return found


def mixed_range_nodes(model: onnx.ModelProto, collector: RangeCollector, method: str, symmetric: bool,
                      ratio: float = RANGE_SPLIT_RATIO, percentile: float = DEFAULT_PERCENTILE
                      ) -> list[dict[str, Any]]:
    """Concat nodes whose inputs have calibrated ranges more than ``ratio`` apart, measured.

    A quantized Concat puts all its inputs under one scale (TensorRT fuses it only so; ONNX
    Runtime's QDQ form quantizes its output per tensor): a YOLOv8 head's last Concat joins box
    coordinates (0-320) and class scores (0-1), so a score gets 127/320 of a step and every one
    rounds to 0. Each input's own range (as the calibration method clips it) is compared with the
    widest one; the node is kept in float when the narrowest input would get fewer than
    127 / ``ratio`` steps. The inputs keep their own Q/DQ (each its own scale).

    Returns:
        list[dict]: per node kept in float, its name, the input ranges and the levels the
        narrowest would have had under the shared scale.
    """
    ranges = collector.ranges(method, symmetric, percentile)
    found = []
    for node in model.graph.node:
        if node.op_type != "Concat" or not node.name:
            continue
        peaks = {i: max(abs(ranges[i][0]), abs(ranges[i][1])) for i in node.input if i in ranges}
        if len(peaks) < 2:
            continue
        wide, narrow = max(peaks.values()), min(peaks.values())
        if narrow <= 0 or wide / narrow <= ratio:
            continue
        levels = 127.0 * narrow / wide
        found.append({"node": node.name, "input_peaks": {k: float(v) for k, v in peaks.items()},
                      "ratio": float(wide / narrow), "levels_under_shared_scale": float(levels),
                      "why": f"inputs span {narrow:.3g} to {wide:.3g}: under one scale the narrowest gets "
                             f"{levels:.1f} of 127 steps"})
    return found
