"""The packaging pipeline: load → inspect → quantize → validate → build plans → signed bundle.

Nothing is written unless every step succeeds: a model that misses its accuracy goal leaves no
bundle behind, and an existing bundle at the output path survives.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.bundle.names import check_bundle_names
from cuvil_edge.errors import (
    AccuracyError,
    DataError,
    KernelError,
    ModelError,
    QuantizationError,
    RecipeError,
)
from cuvil_edge.packager.data import (
    Dataset,
    InputSpec,
    assumed_image_preprocess,
    holds_images,
    load_dataset,
    with_batch_axes,
)
from cuvil_edge.packager.load import load_model, model_inputs, model_outputs
from cuvil_edge.packager.partial_quant import quantized_nodes, subgraph_node_count
from cuvil_edge.packager.quantize import Quantizer, convert_fp16, target_arithmetic
from cuvil_edge.packager.tasks import TaskSpec
from cuvil_edge.packager.validate import (
    ValidationReport,
    fused_session,
    make_session,
    task_for,
    validate_models,
)
from cuvil_edge.recipes import QUANTIZERS, AccuracyGoal, Recipe, choices
from cuvil_edge.targets import Target, get_target

__all__ = ["QUANTIZER_STEPS", "PackageResult", "QuantizerStep", "bundle_name", "check_loadable", "check_tensorrt_form",
           "package", "quantize_model", "report_path_beside", "resolve_model", "resolve_profiles", "sample_members"]

SAMPLE_SIZE = 4
Progress = Callable[[str], None]
Bar = Callable[[str, int, int], None]


def resolve_model(source: str | Path) -> Path:
    """A model path; ``builtin:efficientnet-lite0`` and ``builtin:digits-cnn`` are built and cached."""
    text = str(source)
    if text.startswith("builtin:"):
        from cuvil_edge.models import build_digits_cnn, build_efficientnet_lite0

        builders = {"builtin:efficientnet-lite0": build_efficientnet_lite0, "builtin:digits-cnn": build_digits_cnn}
        if text not in builders:
            raise ModelError(f"unknown built-in model '{text}' (known: {', '.join(sorted(builders))})")
        return builders[text]()
    return Path(text)


def bundle_name(source: str | Path) -> str:
    """The bundle name a model source implies: ``builtin:digits-cnn`` -> ``digits-cnn``, ``a/yolo.onnx`` -> ``yolo``."""
    text = str(source)
    if text.startswith("builtin:"):
        return text.split(":", 1)[1]
    return Path(text).stem


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's calibrator prints to stdout; keep the CLI's output readable."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@dataclass
class PackageResult:
    """What ``package`` produced and measured."""

    out: Path
    manifest: dict[str, Any]
    report: dict[str, Any]
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return self.out.stat().st_size


def _split_for_evaluation(calib: Dataset) -> tuple[Dataset, Dataset]:
    """No evaluation data given: hold out the last quarter of the calibration data, unseen by calibration."""
    n = len(calib)
    if n < 4:
        raise DataError(f"{calib.source}: {n} sample(s) cannot be split into calibration and evaluation; "
                        "give --eval data or at least 4 samples")
    cut = n - max(1, n // 4)
    return calib.slice(0, cut), calib.slice(cut, n)


def _random_data(inputs: list[InputSpec], count: int) -> Dataset:
    """Stand-in samples when no data is given (fp32/fp16 need none): normal floats, zero integers."""
    rng = np.random.default_rng(0)
    arrays = {}
    for spec in inputs:
        shape = [count] + [d if isinstance(d, int) and d > 0 else 1 for d in spec.sample_shape]
        if np.dtype(spec.dtype).kind == "f":
            arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            arrays[spec.name] = np.zeros(shape, spec.dtype)
    return Dataset(arrays, None, "random normal inputs (no data given)", {s.name: s.batch_axis for s in inputs})


def quantize_model(
    model: onnx.ModelProto,
    target: Target,
    precision: str,
    calibration: Dataset | None,
    kind: str | dict[str, Any] | TaskSpec | None,
    goal: AccuracyGoal,
    method: str = "percentile",
    sensitivity: Dataset | None = None,
    progress: Progress | None = None,
    bar: Bar | None = None,
    bias_correction: bool = True,
    quantizer: str = "cuvil",
    exclude: list[str] | None = None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The model in ``precision`` for ``target``'s runtime, with what the search found.

    ``quantizer="modelopt"`` quantizes with NVIDIA Model Optimizer (TensorRT targets, ``int8`` only).
    ``exclude``: node-name or op-type patterns kept in float (``[quantization] exclude``).
    """
    say = progress or (lambda msg: None)
    info: dict[str, Any] = {"runtime_format": target.runtime_format, "quantizer": quantizer}
    if quantizer not in QUANTIZER_STEPS:
        raise QuantizationError(f"--quantizer must be {choices(QUANTIZERS)}, not '{quantizer}'")
    if precision == "fp32":
        return model, info
    if precision == "fp16":
        return convert_fp16(model), info
    if calibration is None:
        raise DataError(f"precision '{precision}' needs calibration data: pass --calib DIR or set [calibration] data")
    step = QuantizerStep(model, target, precision, calibration, kind, goal, method, sensitivity, say, bar,
                         bias_correction, tuple(exclude or ()))
    quantized, found = QUANTIZER_STEPS[quantizer](step)
    return quantized, {**info, **found}


@dataclass(frozen=True)
class QuantizerStep:
    """What a quantizer gets: the model, the board, the data and the goal (one value, not 11 arguments)."""

    model: onnx.ModelProto
    target: Target
    precision: str  # int8 or mixed
    calibration: Dataset
    kind: str | dict[str, Any] | TaskSpec | None  # the task (packager/tasks); None or "none": inferred
    goal: AccuracyGoal
    method: str
    sensitivity: Dataset | None
    say: Progress
    bar: Bar | None
    bias_correction: bool
    exclude: tuple[str, ...] = ()  # node-name or op-type patterns kept in float (not for modelopt)


def _quantize_modelopt(step: QuantizerStep) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """NVIDIA Model Optimizer's INT8 (TensorRT targets, ``int8`` only)."""
    target, precision, calibration = step.target, step.precision, step.calibration
    if precision != "int8" or target.runtime_format != "tensorrt":
        raise QuantizationError("--quantizer modelopt makes the TensorRT INT8 form: use --precision int8 and a "
                                f"board with an NVIDIA GPU (not {precision} for {target.name})")
    from cuvil_edge.packager.modelopt_quant import quantize_with_modelopt

    step.say(f"quantizing with NVIDIA Model Optimizer on {len(calibration)} samples")
    info: dict[str, Any] = {"accuracy_arithmetic": "exact Q/DQ emulation (target arithmetic)",
                            "fp16_nodes": [], "fp32_nodes": []}
    method = "minmax" if step.method == "percentile" else step.method
    quantized = quantize_with_modelopt(step.model, calibration, method)
    info["quantized_nodes"] = len(quantized_nodes(quantized))
    info["subgraph_nodes_in_float"] = subgraph_node_count(quantized)
    return quantized, info


def _quantize_cuvil(step: QuantizerStep) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """cuvil-edge's calibration ranges through ONNX Runtime's quantizer; ``mixed`` searches the tiers."""
    say, calibration, method, bias_correction = step.say, step.calibration, step.method, step.bias_correction
    info: dict[str, Any] = {}
    say(f"calibrating on {len(calibration)} samples ({method})")
    search = step.sensitivity if step.sensitivity is not None else calibration
    with _quiet(), Quantizer(step.model, step.target.runtime_format, calibration, method, progress=say,
                             bar=step.bar, bias_correction=bias_correction, arch=step.target.arch,
                             exclude=step.exclude) as q:
        # Calibration samples past the search's count: the search never sees them (its data is a
        # prefix of the calibration set, or fresh samples), so candidates are compared on them.
        holdout = calibration.slice(len(search), len(calibration)) if step.sensitivity is not None else None
        result = q.mixed(search, step.kind, step.goal, holdout=holdout) if step.precision == "mixed" else None
        quantized = result.model if result is not None else q.quantize()
        info["bias_corrected_convs"] = len(q.corrected)
        info["int8_form"] = q.form.to_dict()
        info["excluded_nodes"] = list(q.excluded)
        info["exclude_patterns"] = list(q.exclude_patterns)
        info["range_split"] = list(q.range_split)
        info["quantized_nodes"] = len(quantized_nodes(quantized))
        info["subgraph_nodes_in_float"] = subgraph_node_count(quantized)
    if info["subgraph_nodes_in_float"]:
        say(f"warning: {info['subgraph_nodes_in_float']} node(s) inside If/Loop/Scan bodies stay in float "
            f"(only the main graph is quantized; {info['quantized_nodes']} node(s) there read INT8)")
    elif not info["quantized_nodes"]:
        say("warning: no node of the model was quantized; the bundle computes in float")
    info["accuracy_arithmetic"] = ("exact Q/DQ emulation: the target's integer arithmetic computed in float "
                                   "operators, identical on any host (not the host's fused INT8 kernels)")
    info["fp16_nodes"], info["fp32_nodes"] = [], []
    if bias_correction:
        say(f"bias correction on {info['bias_corrected_convs']} quantized convolution(s)")
    if result is not None:
        info.update(
            {
                "kept_float_groups": result.kept_float,
                "tiers": result.tiers,
                "fp16_nodes": result.fp16_nodes,
                "fp32_nodes": result.fp32_nodes,
                "sensitivity": result.sensitivity,
                "fp16_sensitivity": result.fp16_sensitivity,
                "search_data": search.source,
                "search_steps": result.steps,
            }
        )
    return quantized, info


# The dispatch of ``recipes.QUANTIZERS`` (a new quantizer: an entry there, a step here).
QUANTIZER_STEPS: dict[str, Callable[[QuantizerStep], tuple[onnx.ModelProto, dict[str, Any]]]] = {
    "cuvil": _quantize_cuvil,
    "modelopt": _quantize_modelopt,
}


def check_tensorrt_form(model: onnx.ModelProto, target: Target) -> dict[str, Any]:
    """Refuse a Q/DQ model that a parser of one of the board's TensorRT versions would reject.

    Raises:
        QuantizationError: naming the first offending node, its rule and the TensorRT version.
    """
    from cuvil_edge.packager.qdq_rules import check_qdq

    versions = sorted({r.tensorrt for r in target.releases}, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    violations = check_qdq(model, versions, target.gpu_sm)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise QuantizationError(f"the quantized model is not in TensorRT's form: {violations[0]}{more}")
    count = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    return {"tensorrt": versions, "qdq_nodes": count, "violations": 0}


def sample_members(model_bytes: bytes, evaluation: Dataset, variants: list[bytes] | None = None,
                   integer_kernels: bool = False) -> tuple[bytes, bytes, dict[str, float]]:
    """A small validation sample and the bundled model's outputs on it, for deploy's smoke test.

    ``model_bytes`` is the bundled model, run with its Q/DQ as written (``make_session``): what any
    runtime that computes the file as written produces, the host's saturating INT8 kernels excluded.
    ``variants`` are other legitimate ways the board may compute it (its FP16 layers in half
    precision under TensorRT): the tolerance is widened to twice their largest distance, so either
    runtime passes while a broken install, which differs by far more, does not.
    ``integer_kernels``: the board runs the file with ONNX Runtime's fused integer kernels (a CPU
    board; the daemon serves such bundles so, for speed), whose requantisation rounds once per
    fused node where the file rounds per Q/DQ pair; the differences compound over a deep network
    (CenterFace: 0.31 on an output of magnitude 3.6, 11 quantisation steps, with recall, precision and
    cosine against FP32 unchanged). The host's own fused kernels stand in for the board's as one
    more variant. Samples of one shape only (the first sample's), so they stack into one request,
    fed as the model takes it (batch axes in place, one value for inputs without one).
    """
    session = make_session(model_bytes)
    axes = evaluation.batch_axes
    fixed = any(isinstance(i.shape[axes.get(i.name, 0) or 0], int) for i in session.get_inputs()
                if i.shape and axes.get(i.name, 0) is not None)
    feed = next(evaluation.batches(1 if fixed else SAMPLE_SIZE))[2]

    def run(sess: Any) -> dict[str, np.ndarray]:
        names = [o.name for o in sess.get_outputs()]
        return {n: np.asarray(v) for n, v in zip(names, sess.run(names, feed), strict=True)}

    outputs = run(session)
    spread = 0.0
    others = [make_session(v) for v in variants or []]
    if integer_kernels:
        others.append(fused_session(model_bytes))
    for sess in others:
        other = run(sess)
        spread = max([spread] + [float(np.abs(other[k].astype(np.float64) - v).max()) for k, v in outputs.items()
                                 if v.dtype.kind == "f"])
    buf_in, buf_out = io.BytesIO(), io.BytesIO()
    np.savez_compressed(buf_in, **feed)
    np.savez_compressed(buf_out, **outputs)
    scale = max((float(np.abs(v).max()) for v in outputs.values() if v.size), default=1.0)
    # Other runtimes (TensorRT kernels, another CPU) differ by rounding; a broken install differs by far more.
    tolerance = {"rtol": 0.01, "atol": max(1e-3, 0.02 * scale, 2 * spread)}
    return buf_in.getvalue(), buf_out.getvalue(), tolerance


def _plugins(target: Target, say: Progress) -> dict[str, Path]:
    if target.arch != "aarch64":
        return {}
    try:
        from cuvil_edge.sve import library_for

        lib = library_for(target.plugin_platform)
    except (ImportError, KernelError) as exc:
        say(f"warning: no {target.plugin_platform} kernel library to bundle ({str(exc).splitlines()[0]}); "
            "the device will use its own or numpy")
        return {}
    return {f"plugins/{target.plugin_platform}/{lib.name}": lib}


def _spec_list(specs: list[InputSpec], profiles: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Manifest input entries; ``batch_axis`` when not the first (None: no batch axis), the
    TensorRT ``profile`` when the input is dynamic (what the board's engine build uses)."""
    out = []
    for s in specs:
        entry: dict[str, Any] = {"name": s.name, "dtype": s.dtype,
                                 "shape": [d if isinstance(d, int) and d > 0 else -1 for d in s.shape]}
        if s.batch_axis != 0:
            entry["batch_axis"] = s.batch_axis
        if profiles and isinstance(profiles.get(s.name), dict):
            entry["profile"] = profiles[s.name]
        out.append(entry)
    return out


def resolve_profiles(model: onnx.ModelProto, inputs: list[InputSpec], recipe: Recipe, target: Target
                     ) -> dict[str, Any]:
    """The TensorRT optimization profile of every dynamic input (``{name: {min, opt, max}}``).

    Sizes come from the recipe's ``[input] shapes`` (or ``--input-shape``), else an image input's
    pre-processing size; the batch axis runs 1..max_batch. Boards without TensorRT need none (an
    empty mapping), but a recipe shape for an input the model lacks is refused everywhere.

    Raises:
        RecipeError: a TensorRT target with a dynamic dimension nobody sized, naming the input, its
            dimension and the recipe field or flag that sizes it; or a shape that contradicts the model.
    """
    from cuvil_edge.packager.profiles import dynamic_inputs, optimization_profiles, profile_shapes

    dynamic = dynamic_inputs(model)
    try:
        shapes = profile_shapes(dynamic, recipe.input_shapes, recipe.preprocess)
        profiles, warnings = optimization_profiles(dynamic, recipe.max_batch, shapes,
                                                   batch_axes={i.name: i.batch_axis for i in inputs})
    except ModelError as exc:
        raise RecipeError(str(exc)) from None
    if not target.has_gpu:
        return {}
    if warnings:
        more = f" ({len(warnings) - 1} more input(s) too)" if len(warnings) > 1 else ""
        raise RecipeError(f"{target.name} runs TensorRT: {warnings[0]}{more}")
    return profiles["gpu"]


def check_loadable(model: onnx.ModelProto, what: str) -> None:
    """Refuse a model that ``onnx.checker`` or ONNX Runtime rejects, before anything is written.

    The same checks ``load_model`` (and so ``cuvil-edge validate``) applies to a model it reads,
    so every bundle the packager writes is one its own tools accept.

    Raises:
        QuantizationError: naming the checker's or ONNX Runtime's first complaint.
    """
    try:
        onnx.checker.check_model(model, full_check=False)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QuantizationError(f"{what} fails the ONNX checker ({first}); nothing was written") from None
    try:
        make_session(model)
    except ModelError as exc:
        raise QuantizationError(f"{what}: {exc}; nothing was written") from None


def _write_reports(report: dict[str, Any], paths: list[Path]) -> list[Path]:
    """Write ``report`` as JSON to each path (atomically, fsynced); the paths written."""
    from cuvil_edge._atomic import atomic_write_text

    text = json.dumps(report, indent=2, default=float) + "\n"
    written = []
    for path in dict.fromkeys(Path(p) for p in paths):
        atomic_write_text(path, text)
        written.append(path)
    return written


def _keep_float_advice(model: onnx.ModelProto, target: Target, recipe: Recipe, calib: Dataset,
                       search: Dataset | None, evaluation: Dataset, kind: TaskSpec, goal: AccuracyGoal,
                       quantized: onnx.ModelProto, qinfo: dict[str, Any], say: Progress, bar: Bar | None
                       ) -> dict[str, Any]:
    """The most sensitive layer groups of a model that missed its goal, and what keeping each out of
    INT8 (FP16 on TensorRT boards, FP32) would give on the evaluation data, as the target computes.

    The ranking is the mixed search's when it ran, else measured here on calibration data; the
    figures are measured on variants of the model that missed, so they say what one more group
    kept in float buys (``cuvil-edge package ... --exclude GROUP/*`` or ``--precision mixed``).
    """
    with _quiet(), Quantizer(model, target.runtime_format, calib, recipe.calibration_method, progress=say, bar=bar,
                             bias_correction=recipe.bias_correction, arch=target.arch, exclude=recipe.exclude) as q:
        ranking = qinfo.get("sensitivity") or q.sensitivity(search if search is not None else calib, kind)
        rows = q.keep_float_advice(quantized, evaluation, kind, goal, ranking, qinfo.get("tiers") or {})
    return {"ranking": dict(sorted(ranking.items(), key=lambda kv: -kv[1])[:20]),
            "ranking_metric": f"error when only this group is INT8, for the {kind.kind} task (mean KL for "
                              "classifiers, else the task's shortfall plus 1 - the worst output's cosine)",
            "keep_float": rows,
            "hint": "keep a group in float with --exclude 'GROUP*' ([quantization] exclude), or let "
                    "--precision mixed choose"}


def report_path_beside(out: Path) -> Path:
    """Where the report of a bundle that was not written goes: ``m.cvb`` -> ``m.report.json``."""
    return out.with_name(f"{out.stem}.report.json")


@contextlib.contextmanager
def _timed(timings: dict[str, float], step: str) -> Iterator[None]:
    """Adds the wall time of one named step to ``timings`` (the report's ``timings_s``)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        timings[step] = timings.get(step, 0.0) + time.perf_counter() - t


@dataclass
class _Loaded:
    """What the load step found: the model, its inputs and outputs, and the TensorRT profiles."""

    path: Path
    model: onnx.ModelProto
    inputs: list[InputSpec]
    outputs: list[InputSpec]
    profiles: dict[str, Any] | None


@dataclass
class _Data:
    """The data step's datasets and what it had to assume (the report's ``inferred``)."""

    calib: Dataset | None
    evaluation: Dataset
    sensitivity: Dataset | None
    inferred: dict[str, Any] = field(default_factory=dict)


def _load_step(recipe: Recipe, target: Target, say: Progress) -> _Loaded:
    """Loads the model and checks the recipe's inputs against it; a TensorRT target's dynamic
    dimensions get their profiles here, before any calibration, so a missing one costs nothing."""
    model_path = resolve_model(recipe.model)
    say(f"loading {model_path}")
    model = load_model(model_path)
    outputs = model_outputs(model)
    try:
        inputs = with_batch_axes(model_inputs(model), recipe.batch_axes)
    except DataError as exc:
        raise RecipeError(str(exc)) from None
    if recipe.input_name and recipe.input_name not in [i.name for i in inputs]:
        raise RecipeError(f"recipe input name '{recipe.input_name}' is not an input of {model_path} "
                          f"(inputs: {', '.join(i.name for i in inputs)})")
    profiles = resolve_profiles(model, inputs, recipe, target)
    return _Loaded(model_path, model, inputs, outputs, profiles)


def _inspect_step(loaded: _Loaded, recipe: Recipe, target: Target, say: Progress) -> dict[str, Any]:
    """TensorRT's view of the model on a GPU board (unsupported nodes are a warning here:
    ``inspect`` explains them, and the engine build would fall back or fail on the device)."""
    if not target.has_gpu:
        return {}
    from cuvil_edge.packager.inspect import inspect_model

    report = inspect_model(loaded.model, target, max_batch=recipe.max_batch, shapes=loaded.profiles)
    if report.unsupported:
        say(f"warning: {len(report.unsupported)} node(s) unsupported by TensorRT on {target.name}: "
            + ", ".join(n.name for n in report.unsupported[:5]))
    return report.to_dict()


def _data_step(recipe: Recipe, inputs: list[InputSpec], say: Progress) -> _Data:
    """Calibration, evaluation and sensitivity data; images without a pre-processing spec get
    the one the model's input implies, said as a warning and recorded as inferred."""
    inferred: dict[str, Any] = {}
    if recipe.preprocess.get("kind") != "image" and any(
            holds_images(d) for d in (recipe.calibration_data, recipe.evaluation_data)):
        assumed = assumed_image_preprocess(inputs)
        if assumed is None:
            raise RecipeError("the data holds images but nothing says how to pre-process them for this model: give "
                              "--preprocess image:HxW[,letterbox][,rgb|bgr][,scale=1/255][,mean=...][,std=...] "
                              "or a [preprocess] section")
        recipe.preprocess = assumed
        inferred["preprocess"] = assumed
        say(f"warning: no pre-processing given; assumed image:{assumed['size'][0]}x{assumed['size'][1]}, "
            f"{assumed['layout']}, RGB, pixels / 255 (give --preprocess to change it)")
    needs_calib = recipe.precision in ("int8", "mixed")
    calib = None
    if needs_calib or recipe.calibration_data:
        if recipe.calibration_data:
            say(f"loading calibration data {recipe.calibration_data}")
            calib = load_dataset(recipe.calibration_data, inputs, recipe.preprocess, recipe.calibration_samples, seed=0)
    if recipe.evaluation_data:
        say(f"loading evaluation data {recipe.evaluation_data}")
        evaluation = load_dataset(recipe.evaluation_data, inputs, recipe.preprocess, recipe.evaluation_samples, seed=100)
    elif calib is not None:
        calib, evaluation = _split_for_evaluation(calib)
        say(f"no evaluation data: holding out {len(evaluation)} of the calibration samples")
    else:
        evaluation = _random_data(inputs, 16)
    sensitivity = None
    if recipe.precision == "mixed" and calib is not None:
        # The search never looks at the evaluation data, so the final check stays unbiased: it
        # ranks layers on calibration data (fresh crops of the calibration photos for built-ins).
        if recipe.calibration_data.startswith("builtin:photos"):
            sensitivity = load_dataset(recipe.calibration_data, inputs, recipe.preprocess,
                                       recipe.sensitivity_samples, seed=7)
        else:
            sensitivity = calib.slice(0, recipe.sensitivity_samples)
    return _Data(calib, evaluation, sensitivity, inferred)


def _write_step(recipe: Recipe, target: Target, loaded: _Loaded, qinfo: dict[str, Any], qbytes: bytes,
                emulated: onnx.ModelProto, quantized: onnx.ModelProto, evaluation: Dataset,
                report: dict[str, Any], inspect_info: dict[str, Any], out: Path, key: Path | None,
                say: Progress) -> Any:
    """Samples, manifest, build plans per TensorRT release, plugins and the report, written as one
    signed bundle (``write_bundle`` replaces ``out`` only when every member is in place)."""
    variants = [emulated.SerializeToString()] if emulated is not quantized else []
    quantized_for_cpu = target.runtime_format != "tensorrt" and recipe.precision in ("int8", "mixed")
    sample_in, sample_out, tolerance = sample_members(qbytes, evaluation, variants, integer_kernels=quantized_for_cpu)
    with tempfile.TemporaryDirectory(prefix="cuvil-pack-") as tmp:
        model_file = Path(tmp) / "model.onnx"
        model_file.write_bytes(qbytes)
        fp16_nodes, fp32_nodes = qinfo.get("fp16_nodes") or [], qinfo.get("fp32_nodes") or []
        # ``files`` (and ``format``) are filled in by write_bundle from the members.
        manifest = Manifest(
            name=recipe.name,
            version=recipe.version,
            target=target.to_dict(),
            precision=recipe.precision,
            format_kind=target.runtime_format,
            model="model.onnx",
            inputs=_spec_list(loaded.inputs, loaded.profiles),
            outputs=_spec_list(loaded.outputs),
            files=[],
            max_batch=recipe.max_batch,
            preprocess=recipe.preprocess,
            postprocess=recipe.postprocess,
            latency_target_ms={"p95": recipe.latency_p95_ms} if recipe.latency_p95_ms else {},
            validation={"report": "validation.json", "sample_inputs": "sample/inputs.npz",
                        "sample_expected": "sample/expected.npz", **tolerance},
            engines=[],
            build_plans=[],
            plugins={},
            raw={"layer_precisions": {"fp16": fp16_nodes, "fp32": fp32_nodes}},
        )
        members: dict[str, Path | bytes] = {"model.onnx": model_file, "sample/inputs.npz": sample_in,
                                            "sample/expected.npz": sample_out}
        if recipe.source is not None:
            members["recipe.toml"] = recipe.source.read_bytes()
        else:
            members["recipe.json"] = json.dumps(recipe.to_dict(), indent=2).encode()
        if target.has_gpu:
            from cuvil_edge.packager.engine_plan import PlanRequest, make_build_plan, plan_member_name

            request = PlanRequest.from_manifest(manifest, layer_fp16=fp16_nodes, layer_fp32=fp32_nodes)
            for release in target.releases:
                plan = make_build_plan(model_file, request, target, release)
                name = plan_member_name(plan)
                members[name] = (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode()
                manifest.build_plans.append({"tensorrt": release.tensorrt, "path": name})
        for name, path in _plugins(target, say).items():
            members[name] = path
            manifest.plugins.setdefault(target.plugin_platform, []).append(name)
        members["validation.json"] = (json.dumps(report, indent=2, default=float) + "\n").encode()
        if "inspect.json" not in members and inspect_info:
            members["inspect.json"] = (json.dumps(inspect_info, indent=2) + "\n").encode()
        from cuvil_edge.bundle import write_bundle

        say(f"writing {out}")
        return write_bundle(out, manifest.to_dict(), members, key)


def package(
    recipe: Recipe,
    out: Path,
    key: Path | None = None,
    progress: Progress | None = None,
    bar: Bar | None = None,
    enforce_goal: bool = True,
    quantizer: str = "cuvil",
    report_path: Path | None = None,
) -> PackageResult:
    """Run the whole pipeline for ``recipe`` and write a signed bundle to ``out``.

    The steps, each timed in the report's ``timings_s``: load (model, inputs, TensorRT profiles),
    inspect (TensorRT's view on GPU boards), data (calibration, evaluation, sensitivity) and the
    task that decides what the gate measures, quantize, validate (the target's arithmetic), the
    gate, and bundle (samples, manifest, build plans, signature).

    ``enforce_goal=False`` writes the bundle even when the accuracy goal is missed (benchmarks
    record such models); the report's ``validation.passed`` says so. A missed goal writes no
    bundle but the whole report, with the most sensitive layer groups and what keeping each out of
    INT8 would give (``advice``), to ``report_path`` and beside the would-be bundle
    (:func:`report_path_beside`); ``report_path`` also gets the report of a bundle that was written.

    Raises:
        ModelError, DataError, QuantizationError, AccuracyError, BundleError: with one-line messages.
    """
    say = progress or (lambda msg: None)
    check_bundle_names(recipe.name, recipe.version)  # before any work: they become directories
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    target = get_target(recipe.target)
    with _timed(timings, "load"):
        loaded = _load_step(recipe, target, say)
    model = loaded.model
    with _timed(timings, "inspect"):
        inspect_info = _inspect_step(loaded, recipe, target, say)
    with _timed(timings, "data"):
        data = _data_step(recipe, loaded.inputs, say)
        # The task decides what the gate measures: declared in [postprocess], or inferred from the
        # original's outputs on the evaluation data (the report says which and why).
        task = task_for(make_session(model), data.evaluation, recipe.postprocess)
        if task.inferred:
            say(f"task: {task.reason}")
            data.inferred["postprocess"] = task.post
        goal = task.goal(recipe.accuracy)
    calib, evaluation, sensitivity, inferred = data.calib, data.evaluation, data.sensitivity, data.inferred

    with _timed(timings, "quantize"):
        quantized, qinfo = quantize_model(model, target, recipe.precision, calib, task, goal,
                                          recipe.calibration_method, sensitivity, say, bar, recipe.bias_correction,
                                          quantizer=quantizer, exclude=recipe.exclude)
    check_loadable(quantized, f"the {recipe.precision} model")
    if target.has_gpu and recipe.precision in ("int8", "mixed"):
        qinfo["qdq_check"] = check_tensorrt_form(quantized, target)

    with _timed(timings, "validate"):
        say(f"validating on {len(evaluation)} samples calibration did not see")
        qbytes = quantized.SerializeToString()
        # Accuracy is the target's arithmetic: Q/DQ emulated exactly, FP16 groups rounded to FP16.
        emulated = (target_arithmetic(quantized, qinfo.get("fp16_nodes")) if recipe.precision in ("int8", "mixed")
                    else quantized)
        validation: ValidationReport = validate_models(make_session(model), make_session(emulated), evaluation, task,
                                                       goal if recipe.precision != "fp32" else None)

    def make_report() -> dict[str, Any]:
        made = {
            "model": str(loaded.path),
            "target": target.name,
            "precision": recipe.precision,
            "runtime_format": target.runtime_format,
            "validation": validation.to_dict(),
            "quantization": qinfo,
            "inspect": {k: inspect_info[k] for k in ("unsupported", "dla_fallbacks", "dynamic_inputs", "profiles",
                                                      "warnings") if k in inspect_info},
            "timings_s": timings,
        }
        if inferred:
            made["inferred"] = inferred
        return made

    if enforce_goal and validation.failures:
        missed = make_report()
        if recipe.precision in ("int8", "mixed") and quantizer == "cuvil" and calib is not None:
            say("goal missed: measuring what keeping the most sensitive layers out of INT8 would give")
            missed["advice"] = _keep_float_advice(model, target, recipe, calib, sensitivity, evaluation, task,
                                                  goal, quantized, qinfo, say, bar)
        written_to = _write_reports(missed, [p for p in (report_path, report_path_beside(Path(out))) if p])
        try:
            validation.raise_if_failed(f"{recipe.name} ({recipe.precision}, {target.runtime_format} format)")
        except AccuracyError as exc:
            raise AccuracyError(f"{exc}; report: {', '.join(str(p) for p in written_to)}") from None
    elif validation.failures:
        say(f"warning: accuracy goal missed: {'; '.join(validation.failures)}")

    with _timed(timings, "bundle"):
        report = make_report()
        written = _write_step(recipe, target, loaded, qinfo, qbytes, emulated, quantized, evaluation, report,
                              inspect_info, Path(out), key, say)
    timings["total"] = time.perf_counter() - t0
    if report_path is not None:
        _write_reports(report, [report_path])
    return PackageResult(Path(out), written.to_dict(), report, timings)
