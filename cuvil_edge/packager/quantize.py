"""Quantize an FP32 ONNX model in the form the target's runtime needs.

- ``tensorrt`` targets: FP16 with IO types kept, or INT8 as explicit Q/DQ with symmetric scales
  (every zero-point 0) and per-channel weights: the one form TensorRT 10 and 11 both build from.
- ``ort-cpu`` targets (boards without an NVIDIA GPU, the host): asymmetric uint8 activations and
  int8 per-channel weights, which ONNX Runtime fuses into QLinear kernels (symmetric Q/DQ leaves
  ReLU6 clips unfused and runs at about half FP32 speed there; PEERS.md).
- ``mixed``: INT8, with the most sensitive layer groups kept in float until the accuracy goal holds.
  Sensitivity is measured by quantizing one group alone ("quantize only this block"), which ranks
  better than leave-one-out because quantization errors mask each other (PEERS.md); groups are then
  returned to float greedily, most sensitive first, until the goal holds on the search data *and*
  the mean KL divergence there is within a budget: goal metrics such as top-5 containment saturate
  on a few hundred samples (the search can stop at zero kept groups and then miss on other photos),
  while mean KL keeps measuring the distance to FP32.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from cuvil_edge.errors import QuantizationError
from cuvil_edge.packager.bias_correction import conv_input_means, correct_biases
from cuvil_edge.packager.data import Dataset
from cuvil_edge.packager.load import upgrade_opset
from cuvil_edge.packager.validate import compare_outputs, goal_failures, make_session, run_model
from cuvil_edge.recipes import AccuracyGoal

__all__ = ["MixedResult", "Quantizer", "convert_fp16", "layer_groups", "symmetric_zero_points"]

# Mean KL (nats) the mixed search accepts on its data when the recipe sets no max_mean_kl. The
# search data come from the calibration photos that bias correction is fitted on, so held-out KL
# ran 1.8-2.3x the search KL on EfficientNet-Lite0; at 0.02 the TensorRT-form search kept nothing
# and held-out top-5 containment landed at 0.994 (goal 0.995). 0.01 leaves that margin.
SEARCH_KL_BUDGET = 0.01
# Calibration batches (of 16) per ONNX Runtime collection pass: bounds peak memory to about 1.5 GB for
# EfficientNet-Lite0 whatever the number of calibration samples.
CALIB_CHUNK_BATCHES = 2

_QUANT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "GlobalAveragePool", "AveragePool",
              "MaxPool", "Concat", "Resize", "Sigmoid", "Clip", "Relu", "Flatten", "Reshape", "Transpose")


def convert_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """FP16 weights and compute; inputs and outputs stay FP32 so clients need no change."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)


class _Reader:
    """ONNX Runtime CalibrationDataReader over a Dataset, in batches.

    ``set_range`` lets ONNX Runtime calibrate in chunks (``CalibStridedMinMax``): its calibrators
    otherwise hold every intermediate tensor of every sample at once (EfficientNet-Lite0 needs about
    47 MB per sample, so 512 samples took 24 GB and were OOM-killed here).
    """

    def __init__(self, data: Dataset, batch: int = 16, on_batch: Callable[[int, int], None] | None = None) -> None:
        self._data = data
        self._batch = batch
        self._on_batch = on_batch
        self._range = (0, len(self))
        self._it: Iterator[dict[str, np.ndarray]] | None = None

    def _gen(self) -> Iterator[dict[str, np.ndarray]]:
        total = len(self._data)
        first, last = self._range
        for b in range(first, last):
            start = b * self._batch
            if self._on_batch is not None:
                self._on_batch(start, total)
            yield {k: v[start : start + self._batch] for k, v in self._data.inputs.items()}
        if self._on_batch is not None and last == len(self):
            self._on_batch(total, total)

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._it = self._gen()
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = None

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restrict the next pass to batches [start_index, end_index)."""
        self._range = (start_index, min(end_index, len(self)))
        self._it = None

    def chunk_batches(self, max_batches: int = CALIB_CHUNK_BATCHES) -> int:
        """Largest divisor of the batch count up to ``max_batches`` (ONNX Runtime wants an exact split)."""
        n = len(self)
        return max(d for d in range(1, max(1, min(max_batches, n)) + 1) if n % d == 0)

    def __len__(self) -> int:
        return (len(self._data) + self._batch - 1) // self._batch


def layer_groups(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Quantizable nodes grouped into blocks by name (``blocks.3.expand`` -> ``blocks.3``,
    ``/features/features.3/conv/Conv`` -> ``/features/features.3``), in graph order."""
    groups: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type not in _QUANT_OPS or not node.name:
            continue
        name = node.name
        if "/" in name:
            parts = [p for p in name.split("/") if p]
            key = "/" + "/".join(parts[:2]) if len(parts) > 2 else name
        elif "." in name:
            parts = name.split(".")
            key = ".".join(parts[:2]) if len(parts) > 2 else parts[0]
        else:
            key = name
        groups.setdefault(key, []).append(name)
    return groups


def symmetric_zero_points(model: onnx.ModelProto) -> bool:
    """True when every QuantizeLinear/DequantizeLinear zero-point is 0 (TensorRT's requirement)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            zp = inits.get(node.input[2])
            if zp is None or np.any(zp != 0):
                return False
    return True


@dataclass
class MixedResult:
    """Outcome of the mixed-precision search."""

    model: onnx.ModelProto
    kept_float: list[str]
    sensitivity: dict[str, float]
    steps: list[dict[str, Any]] = field(default_factory=list)


class Quantizer:
    """Calibrates once, then quantizes as often as the mixed search needs.

    Args:
        model (onnx.ModelProto): the FP32 model (upgraded to opset 13 if older).
        runtime_format (str): ``tensorrt`` (symmetric Q/DQ) or ``ort-cpu`` (asymmetric activations).
        calibration (Dataset): calibration samples.
        method (str): ``percentile`` (default; best here), ``minmax`` or ``entropy``.
        bias_correction (bool): subtract each quantized Conv's mean output shift from its bias
            (see ``bias_correction.py``); on by default.
    """

    def __init__(self, model: onnx.ModelProto, runtime_format: str, calibration: Dataset, method: str = "percentile",
                 progress: Callable[[str], None] | None = None,
                 bar: Callable[[str, int, int], None] | None = None, bias_correction: bool = True) -> None:
        if runtime_format not in ("tensorrt", "ort-cpu"):
            raise QuantizationError(f"unknown runtime format '{runtime_format}'")
        self.model = upgrade_opset(model)
        self.runtime_format = runtime_format
        self.calibration = calibration
        self.method = method
        self._progress = progress or (lambda msg: None)
        self._bar = bar or (lambda task, done, total: None)
        self._calibrated = False
        self._tmp = tempfile.TemporaryDirectory(prefix="cuvil-quant-")
        self._dir = Path(self._tmp.name)
        self._prepared = self._prepare()
        self._cache = self._dir / "calibration.cache"
        self._supports_cache = "calibration_cache_path" in inspect.signature(_quantize_static()).parameters
        self.bias_correction = bias_correction
        # (prepared float model, per-Conv input means), computed on the first quantize() only.
        self._bias_reference: tuple[onnx.ModelProto, dict[str, np.ndarray]] | None = None
        self.corrected: list[str] = []

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> Quantizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self) -> Path:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        src = self._dir / "fp32.onnx"
        out = self._dir / "prepared.onnx"
        onnx.save(self.model, str(src))
        try:
            quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
        except Exception as exc:  # pre-processing is an optimisation; fall back to the model as given
            self._progress(f"quantization pre-processing skipped: {str(exc).splitlines()[0]}")
            return src
        return out

    def _options(self) -> dict[str, Any]:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

        methods = {
            "percentile": CalibrationMethod.Percentile,
            "minmax": CalibrationMethod.MinMax,
            "entropy": CalibrationMethod.Entropy,
        }
        extra: dict[str, Any] = {"CalibPercentile": 99.999}
        if self.runtime_format == "tensorrt":
            extra.update({"ActivationSymmetric": True, "WeightSymmetric": True})
            act = QuantType.QInt8
        else:
            extra.update({"ActivationSymmetric": False, "WeightSymmetric": True})
            act = QuantType.QUInt8
        return {
            "quant_format": QuantFormat.QDQ,
            "per_channel": True,
            "activation_type": act,
            "weight_type": QuantType.QInt8,
            "calibrate_method": methods[self.method],
            "extra_options": extra,
        }

    def quantize(self, nodes_to_exclude: list[str] | None = None, nodes_to_quantize: list[str] | None = None
                 ) -> onnx.ModelProto:
        """INT8 model; ``nodes_to_exclude`` stay in float."""
        out = self._dir / "int8.onnx"
        kwargs = self._options()
        if self._supports_cache:
            kwargs["calibration_cache_path"] = str(self._cache)
        first = not (self._calibrated and self._supports_cache)
        reader = _Reader(self.calibration, on_batch=(lambda d, t: self._bar("calibrating", d, t)) if first else None)
        kwargs["extra_options"]["CalibStridedMinMax"] = reader.chunk_batches()
        try:
            _quantize_static()(
                str(self._prepared), str(out), reader,
                nodes_to_exclude=nodes_to_exclude or [], nodes_to_quantize=nodes_to_quantize or [], **kwargs,
            )
        except Exception as exc:  # onnxruntime's quantizer raises assorted untyped errors
            raise QuantizationError(f"quantization failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        self._calibrated = True
        model = onnx.load(str(out))
        if self.bias_correction:
            if self._bias_reference is None:
                prepared = onnx.load(str(self._prepared))
                self._bias_reference = (prepared, conv_input_means(prepared, self.calibration))
            self.corrected = correct_biases(model, *self._bias_reference)
        if self.runtime_format == "tensorrt" and not symmetric_zero_points(model):
            raise QuantizationError("quantizer produced a non-zero zero-point; TensorRT needs symmetric Q/DQ")
        return model

    def mixed(self, data: Dataset, kind: str, goal: AccuracyGoal, reference: dict[str, np.ndarray] | None = None,
              max_kept_fraction: float = 0.5, kl_budget: float | None = None) -> MixedResult:
        """INT8 with the fewest most-sensitive groups kept in float so ``goal`` holds on ``data``.

        Args:
            kl_budget (float): largest mean KL (classifiers) or 1 - cosine (other outputs) accepted
                on ``data``. Defaults to the goal's ``max_mean_kl``, else SEARCH_KL_BUDGET.
        """
        budget = kl_budget if kl_budget is not None else (goal.max_mean_kl or SEARCH_KL_BUDGET)
        ref = reference if reference is not None else run_model(make_session(self.model), data)
        out_name = next(iter(ref))

        def score(model: onnx.ModelProto) -> tuple[float, list[str], dict[str, Any]]:
            got = run_model(make_session(model), data)[out_name]
            m = compare_outputs(ref[out_name], got, kind, data.labels)
            err = m["mean_kl"] if "mean_kl" in m else 1.0 - m["cosine"]
            misses = goal_failures(m, goal)
            if err > budget:
                misses.append(f"search error {err:.4f} > budget {budget:.4f}")
            return err, misses, m

        full = self.quantize()
        err, misses, metrics = score(full)
        steps = [{"kept_float": [], "error": err, "failures": misses, "metrics": metrics}]
        groups = layer_groups(self.model)
        if not misses:
            self._progress(f"INT8 meets the goal with no layer kept in float (search error {err:.4f})")
            return MixedResult(full, [], {}, steps)
        sensitivity: dict[str, float] = {}
        for i, (name, nodes) in enumerate(groups.items()):
            self._progress(f"sensitivity {i + 1}/{len(groups)}: {name}")
            self._bar("layer sensitivity", i, len(groups))
            sensitivity[name] = score(self.quantize(nodes_to_quantize=nodes))[0]
        self._bar("layer sensitivity", len(groups), len(groups))
        order = sorted(sensitivity, key=lambda k: -sensitivity[k])
        kept: list[str] = []
        model = full
        limit = max(1, int(len(order) * max_kept_fraction))
        for name in order[:limit]:
            kept.append(name)
            excluded = [n for g in kept for n in groups[g]]
            model = self.quantize(nodes_to_exclude=excluded)
            err, misses, metrics = score(model)
            steps.append({"kept_float": list(kept), "error": err, "failures": misses, "metrics": metrics})
            self._progress(f"kept {len(kept)} group(s) in float: error {err:.5f}, {'goal met' if not misses else 'goal missed'}")
            if not misses:
                break
        return MixedResult(model, kept, sensitivity, steps)


def _quantize_static() -> Callable[..., Any]:
    from onnxruntime.quantization import quantize_static

    return quantize_static
