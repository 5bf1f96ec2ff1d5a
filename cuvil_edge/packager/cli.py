"""The packager's commands: ``cuvil-edge package | inspect | quantize | validate | engine plan|build``.

Every command of the packager is registered here, by :func:`register`; each is a thin call into
the module that does the work (``package.py``, ``inspect.py``, ``engine_plan.py``,
``engine_build.py``, ``engine_device.py``). Output goes through the consoles of
:mod:`cuvil_edge._console`, never through :mod:`cuvil_edge.cli` (importing the entry point back
would register every command group again and point an arrow up the layers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from cuvil_edge._console import console, id_column, print_table
from cuvil_edge._device_options import DeviceSelection, device_options
from cuvil_edge.recipes import QUANTIZERS, TASK_KINDS, choices

if TYPE_CHECKING:
    import onnx

__all__ = ["engine_app", "inspect_cmd", "register"]

# Help read from the vocabulary's table, so a new quantizer shows up without an edit here.
_QUANTIZER_HELP = "; ".join(f"{name}: {what}" for name, what in QUANTIZERS.items()) + ". Defaults to cuvil."


def _recipe(
    model: str | None, recipe_path: Path | None, target: str | None, precision: str | None,
    calib: str | None, eval_data: str | None, name: str | None, version: str | None,
    input_shapes: list[str] | None = None, preprocess: str | None = None, exclude: list[str] | None = None,
    batch_axes: list[str] | None = None,
) -> Any:
    """The recipe a command runs: ``--recipe`` (or one made from MODEL and ``--target``), then every
    flag given on top of it, each checked as the recipe field it stands for."""
    from cuvil_edge.errors import RecipeError
    from cuvil_edge.packager.package import bundle_name
    from cuvil_edge.recipes import input_shape_from_text, load_recipe, preprocess_from_text, recipe_from_dict

    if recipe_path is not None:
        recipe = load_recipe(recipe_path)
        if model:
            recipe.model = model if model.startswith("builtin:") else str(Path(model).resolve())
    else:
        if not model:
            raise RecipeError("give a MODEL.onnx or --recipe FILE")
        if not target:
            raise RecipeError("--target is required without --recipe (see: cuvil-edge targets)")
        recipe = recipe_from_dict(
            {"name": name or bundle_name(model), "model": {"source": str(Path(model).resolve())
                                                        if not model.startswith("builtin:") else model},
             "target": {"board": target, "precision": precision or "fp32"}},
            "command line",
        )
    if target:
        from cuvil_edge.targets import get_target

        recipe.target = get_target(target).name
    if precision:
        from cuvil_edge.recipes import PRECISIONS

        if precision not in PRECISIONS:
            raise RecipeError(f"--precision must be one of {', '.join(PRECISIONS)}, got '{precision}'")
        recipe.precision = precision
    if calib:
        recipe.calibration_data = calib if calib.startswith("builtin:") else str(Path(calib).resolve())
    if eval_data:
        recipe.evaluation_data = eval_data if eval_data.startswith("builtin:") else str(Path(eval_data).resolve())
    if name:
        recipe.name = name
    if version:
        recipe.version = version
    for text in input_shapes or []:
        key, shape = input_shape_from_text(text)
        recipe.input_shapes[key] = shape
    if preprocess:
        recipe.preprocess = preprocess_from_text(preprocess)
    for text in exclude or []:
        recipe.exclude.extend(p.strip() for p in text.split(",") if p.strip())
    for text in batch_axes or []:
        key, sep, axis = text.rpartition(":")
        if not sep or not key or not (axis == "none" or axis.isdigit()):
            raise RecipeError(f"--batch-axis '{text}': write NAME:AXIS (an axis number) or NAME:none")
        recipe.batch_axes[key] = None if axis == "none" else int(axis)
    from cuvil_edge.bundle.names import check_component

    check_component("name", recipe.name, RecipeError)
    check_component("version", recipe.version, RecipeError)
    return recipe


def _check_out(out: Path, what: str = "--out") -> None:
    """Refuse an output path that cannot be written, before any work: nothing is created."""
    from cuvil_edge.errors import CuvilEdgeError

    if out.is_dir():
        raise CuvilEdgeError(f"{what} {out}: is a directory; give a file path such as {out / 'model.cvb'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CuvilEdgeError(f"{what} {out}: the directory {parent} does not exist; create it first")


def _metrics_table(title: str, metrics: dict[str, Any]) -> Table:
    table = Table(title=title)
    id_column(table, "metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    return table


def package_cmd(
    model: str = typer.Argument(None, help="ONNX model, or builtin:efficientnet-lite0 / builtin:digits-cnn."),
    recipe: Path = typer.Option(None, "--recipe", help="Recipe TOML (model, target, precision, data, goal)."),
    target: str = typer.Option(None, "--target", help="Board profile (cuvil-edge targets)."),
    precision: str = typer.Option(None, "--precision", help="fp32, fp16, int8 or mixed."),
    calib: str = typer.Option(None, "--calib", help="Calibration data: folder of images or .npy/.npz."),
    eval_data: str = typer.Option(None, "--eval", help="Evaluation data calibration does not see."),
    out: Path = typer.Option(..., "--out", help="Bundle file to write (.cvb)."),
    key: Path = typer.Option(None, "--key", help="Secret key. Defaults to ~/.config/cuvil-edge/keys/cuvil.key."),
    name: str = typer.Option(None, "--name", help="Bundle name. Defaults to the recipe's or the model's."),
    version: str = typer.Option(None, "--version", help="Bundle version. Defaults to the recipe's or 1.0.0."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    quantizer: str = typer.Option("cuvil", "--quantizer", help=_QUANTIZER_HELP),
    input_shape: list[str] = typer.Option(None, "--input-shape", help="NAME:1x3x320x320 or NAME:MIN,OPT,MAX: sizes "
                                          "of dynamic dimensions (TensorRT profile), as [input] shapes (repeat)."),
    batch_axis: list[str] = typer.Option(None, "--batch-axis", help="NAME:AXIS or NAME:none: an input's batch "
                                         "axis when not the first, as [input] batch_axes (repeat)."),
    preprocess: str = typer.Option(None, "--preprocess", help="image:HxW[,letterbox][,rgb|bgr][,nchw|nhwc]"
                                   "[,scale=1/255][,mean=R/G/B][,std=R/G/B], as [preprocess]."),
    exclude: list[str] = typer.Option(None, "--exclude", help="Node-name or op-type patterns kept in float "
                                      "(fnmatch; comma-separated or repeated), as [quantization] exclude."),
    report: Path = typer.Option(None, "--report", help="Also write the full report (JSON) here; written even "
                                "when the accuracy goal is missed."),
    kind: str = typer.Option(None, "--kind", help=f"The model's task: {choices(TASK_KINDS)} "
                             "(default: the recipe's postprocess kind, else inferred from the outputs)."),
) -> None:
    """Quantize a model for a board, check its accuracy against FP32, and write a signed bundle."""
    from cuvil_edge.packager.package import package

    started = time.perf_counter()
    _check_out(out)
    if report is not None:
        _check_out(report, "--report")
    rec = _recipe(model, recipe, target, precision, calib, eval_data, name, version, input_shape, preprocess,
                  exclude, batch_axis)
    if kind:
        from cuvil_edge.recipes import check_postprocess

        rec.postprocess = check_postprocess({**rec.postprocess, "kind": kind} if rec.postprocess.get("kind") == kind
                                            else {"kind": kind}, "--kind")
    from cuvil_edge._progress import packaging_progress

    with packaging_progress(console) as (say, bar):
        result = package(rec, out, key, progress=say, bar=bar, quantizer=quantizer, report_path=report)
    if as_json:
        print(json.dumps(result.report, indent=2, default=float))
        return
    from rich.markup import escape

    validation = result.report["validation"]
    task = validation.get("task") or {}
    title = f"{rec.name}: {rec.precision} ({result.report['runtime_format']}) vs FP32"
    if task:
        console.print(escape(f"task: {task['kind']} ({task['reason']})"))
        print_table(_metrics_table(f"{title}, {task['kind']}", validation["task_metrics"]))
    else:
        print_table(_metrics_table(title, next(iter(validation["outputs"].values()))))
    kept = result.report["quantization"].get("kept_float_groups")
    if kept is not None:
        console.print(f"mixed precision kept in float: {', '.join(kept) or 'nothing'}")
    console.print(
        f"[green]PASSED[/] wrote {out} ({result.size_bytes / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s"
    )


def quantize_cmd(
    model: str = typer.Argument(..., help="ONNX model (FP32)."),
    out: Path = typer.Option(..., "--out", help="Quantized ONNX to write."),
    target: str = typer.Option(..., "--target", help="Board profile; picks TensorRT Q/DQ or ORT CPU form."),
    precision: str = typer.Option("int8", "--precision", help="fp16, int8 or mixed."),
    calib: str = typer.Option(None, "--calib", help="Calibration data."),
    recipe: Path = typer.Option(None, "--recipe", help="Recipe for pre-processing and the accuracy goal."),
    quantizer: str = typer.Option("cuvil", "--quantizer", help=_QUANTIZER_HELP),
    batch_axis: list[str] = typer.Option(None, "--batch-axis", help="NAME:AXIS or NAME:none (repeat)."),
    preprocess: str = typer.Option(None, "--preprocess", help="image:HxW[,letterbox][,rgb|bgr][,scale=1/255]..."),
    exclude: list[str] = typer.Option(None, "--exclude", help="Node-name or op-type patterns kept in float."),
) -> None:
    """Quantize only: write the model in the target runtime's format, without validation or bundle."""
    from cuvil_edge._atomic import atomic_write_bytes
    from cuvil_edge._progress import packaging_progress
    from cuvil_edge.packager.data import assumed_image_preprocess, holds_images, load_dataset, with_batch_axes
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.package import quantize_model, resolve_model
    from cuvil_edge.targets import get_target

    _check_out(out)
    rec = _recipe(model, recipe, target, precision, calib, None, None, None, None, preprocess, exclude, batch_axis)
    m = load_model(resolve_model(rec.model))
    inputs = with_batch_axes(model_inputs(m), rec.batch_axes)
    if rec.preprocess.get("kind") != "image" and holds_images(rec.calibration_data):
        rec.preprocess = assumed_image_preprocess(inputs) or rec.preprocess
    cal = None
    if rec.calibration_data:
        cal = load_dataset(rec.calibration_data, inputs, rec.preprocess, rec.calibration_samples)
    kind = rec.postprocess.get("kind", "classification")
    with packaging_progress(console) as (say, bar):
        q, info = quantize_model(m, get_target(rec.target), rec.precision, cal, kind, rec.accuracy,
                                 rec.calibration_method, None, say, bar, rec.bias_correction, quantizer=quantizer,
                                 exclude=rec.exclude)
    atomic_write_bytes(out, q.SerializeToString())
    console.print(f"[green]PASSED[/] wrote {out} ({info['runtime_format']} format)")


def validate_cmd(
    reference: str = typer.Argument(..., help="The original FP32 ONNX model."),
    candidate: Path = typer.Argument(..., help="The quantized ONNX model, or the bundle (.cvb) holding it."),
    eval_data: str = typer.Option(..., "--eval", help="Evaluation data."),
    recipe: Path = typer.Option(None, "--recipe", help="Recipe for pre-processing, the task and the accuracy goal."),
    samples: int = typer.Option(200, "--samples", help="Evaluation samples."),
    pub: Path = typer.Option(None, "--pub", help="Verify a bundle's signature with this minisign public key."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare a quantized model with its original; exit 1 when the recipe's accuracy goal is missed.

    The task is the recipe's ``[postprocess]`` as a whole (a detector's head and thresholds
    included), else the bundle's, else inferred from the original's outputs, as ``package`` does:
    the verdict is the one ``package`` gave. A bundle brings its FP16 layers too (the manifest's
    ``layer_precisions``), rounded as the board computes them; a bare ONNX file cannot say which
    layers the board runs in FP16, so they are measured in FP32 and the output says so.
    """
    import tempfile

    from cuvil_edge.packager.data import load_dataset, with_batch_axes
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.package import resolve_model
    from cuvil_edge.packager.quantize import target_arithmetic
    from cuvil_edge.packager.tasks import declares_task
    from cuvil_edge.packager.validate import make_session, validate_models
    from cuvil_edge.recipes import AccuracyGoal, load_recipe

    rec = load_recipe(recipe) if recipe else None
    ref = load_model(resolve_model(reference))
    with tempfile.TemporaryDirectory(prefix="cuvil-validate-") as tmp:
        cand, fp16_nodes, bundle_post = _validate_candidate(Path(candidate), Path(tmp), pub)
    pre = rec.preprocess if rec else {"kind": "none"}
    data = load_dataset(eval_data, with_batch_axes(model_inputs(ref), rec.batch_axes if rec else None), pre,
                        samples, seed=100)
    declared = rec.postprocess if rec and declares_task(rec.postprocess) else None
    post = declared or bundle_post
    # The candidate as the target computes it (exact Q/DQ emulation, FP16 layers rounded), not
    # through this host's INT8 kernels.
    report = validate_models(make_session(ref), make_session(target_arithmetic(cand, fp16_nodes)), data, post,
                             rec.accuracy if rec else AccuracyGoal())
    if as_json:
        print(json.dumps({**report.to_dict(), "fp16_layers": fp16_nodes}, indent=2))
    else:
        print_table(_metrics_table(f"{candidate} vs {reference}", report.primary))
        task = report.extra.get("task") or {}
        shown = report.primary  # the decoded output's entry carries the task's metrics already
        task_metrics = {k: v for k, v in (report.extra.get("task_metrics") or {}).items()
                        if k not in shown and isinstance(v, int | float) and not isinstance(v, bool)}
        if task_metrics:
            print_table(_metrics_table(f"task: {task.get('kind', '?')}", task_metrics))
        if fp16_nodes is None:
            console.print("note: a bare ONNX file does not say which layers the board runs in FP16; pass the "
                          "bundle (.cvb) to measure them rounded")
    report.raise_if_failed(str(candidate))
    console.print("[green]PASSED[/] accuracy goal met")


def _validate_candidate(candidate: Path, tmp: Path, pub: Path | None,
                        ) -> tuple[onnx.ModelProto, list[str] | None, dict[str, Any] | None]:
    """The candidate model, its FP16 layers (None: not known) and its bundle's post-processing."""
    import tarfile

    from cuvil_edge.bundle.container import extract_bundle
    from cuvil_edge.packager.load import load_model

    if candidate.is_file() and tarfile.is_tarfile(candidate):
        manifest = extract_bundle(candidate, tmp / "bundle", pub)
        precisions = manifest.raw.get("layer_precisions") or {}
        fp16 = precisions.get("fp16") if isinstance(precisions, dict) else None
        return (load_model(tmp / "bundle" / manifest.model), [str(n) for n in fp16 or []],
                dict(manifest.postprocess or {}) or None)
    return load_model(candidate), None, None


def inspect_cmd(
    model: Path,
    target: str,
    max_batch: int = 8,
    as_json: bool = False,
    only_issues: bool = False,
) -> int:
    """Print which ops the target's TensorRT and DLA support, dynamic inputs and profiles.

    What ``cuvil-edge inspect`` runs once the model is resolved.

    Args:
        model (Path): the ONNX model file.
        target (str): the board profile's name.
        max_batch (int): the largest batch, for the optimization profiles. Defaults to 8.
        as_json (bool): print the report as JSON instead of a table. Defaults to False.
        only_issues (bool): list only nodes that fall back. Defaults to False.

    Returns:
        int: the exit status: 0, or 1 when a node is unsupported by every TensorRT version of
        the target.

    Raises:
        ModelError: no such file, or not a readable ONNX model.
    """
    import onnx

    from cuvil_edge.errors import ModelError
    from cuvil_edge.packager.inspect import inspect_model, render_inspect_table
    from cuvil_edge.packager.trt_support import UNSUPPORTED
    from cuvil_edge.targets import get_target

    tgt = get_target(target)
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"{path}: no such model file")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelError(f"{path}: not a readable ONNX model ({exc})") from exc
    report = inspect_model(proto, tgt, max_batch=max_batch)
    from rich.markup import escape

    from cuvil_edge.packager.validate import probe_task

    task, why = probe_task(proto)
    task_info = ({**task.to_dict(), "default_goal": task.goal(None).to_dict()} if task is not None
                 else {"kind": None, "reason": why})
    if as_json:
        print(json.dumps({**report.to_dict(), "task": task_info}, indent=2))
    else:
        print_table(render_inspect_table(report, only_issues=only_issues), console)
        for name, prof in report.profiles.items():
            for inp, p in prof.items():
                console.print(f"profile {name}: {inp} min {p['min']} opt {p['opt']} max {p['max']}")
        for w in report.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        if task is not None:
            goal = ", ".join(f"{k} {v}" for k, v in task_info["default_goal"].items())
            console.print(escape(f"task: {task.reason} ([postprocess] kind = \"{task.kind}\" to declare it); "
                                 f"default accuracy goal: {goal}"))
        else:
            console.print(escape(f"task: {why}; declare it with [postprocess] kind"))
        n_bad = len(report.unsupported)
        console.print(f"{len(report.nodes)} nodes: {n_bad} unsupported or unverified on some TensorRT "
                      f"version, {len(report.dla_fallbacks)} DLA fallback(s)")
    blocked = [n for n in report.nodes if n.tensorrt and all(s == UNSUPPORTED for s in n.tensorrt.values())]
    return 1 if blocked else 0


def inspect_cli(
    model: str = typer.Argument(..., help="ONNX model."),
    target: str = typer.Option(..., "--target", help="Board profile."),
    max_batch: int = typer.Option(8, "--max-batch", help="Largest batch, for optimization profiles."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    only_issues: bool = typer.Option(False, "--only-issues", help="List only nodes that fall back."),
    sensitivity: bool = typer.Option(False, "--sensitivity", help="Also measure each layer group's INT8 "
                                     "sensitivity on --calib data (the mixed search's ranking)."),
    calib: str = typer.Option(None, "--calib", help="With --sensitivity: calibration data (images, .npy/.npz)."),
    preprocess: str = typer.Option(None, "--preprocess", help="With --sensitivity: image:HxW[,letterbox][,...]."),
    batch_axis: list[str] = typer.Option(None, "--batch-axis", help="With --sensitivity: NAME:AXIS or NAME:none."),
    kind: str = typer.Option("none", "--kind", help="With --sensitivity: classification ranks by mean KL, "
                             "anything else by 1 - cosine."),
    samples: int = typer.Option(64, "--samples", help="With --sensitivity: calibration samples to use."),
    top: int = typer.Option(0, "--top", help="With --sensitivity: rows to print (0: all)."),
) -> None:
    """Which ops the target's TensorRT versions and DLA run, why others fall back, and the profiles needed.

    With --sensitivity: a table of layer groups by the error each causes when it alone is INT8
    (and, on TensorRT boards, in FP16 alone), measured as the board computes.
    """
    from cuvil_edge.packager.package import resolve_model

    path = resolve_model(model)
    rc = inspect_cmd(path, target, max_batch=max_batch, as_json=as_json and not sensitivity, only_issues=only_issues)
    if sensitivity:
        _sensitivity_table(str(path), target, calib, preprocess, batch_axis, kind, samples, top, as_json)
    if rc:
        raise typer.Exit(rc)


def _sensitivity_table(model: str, target: str, calib: str | None, preprocess: str | None,
                       batch_axis: list[str] | None, kind: str, samples: int, top: int, as_json: bool) -> None:
    """``inspect --sensitivity``: load the data as ``package`` would, rank, print a rich table."""
    from cuvil_edge._progress import packaging_progress
    from cuvil_edge.errors import RecipeError
    from cuvil_edge.packager.data import assumed_image_preprocess, holds_images, load_dataset, with_batch_axes
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.sensitivity import layer_sensitivity
    from cuvil_edge.targets import get_target

    if not calib:
        raise RecipeError("--sensitivity needs --calib DATA (images or .npy/.npz samples)")
    rec = _recipe(model, None, target, "int8", calib, None, None, None, None, preprocess, None, batch_axis)
    proto = load_model(Path(model))
    inputs = with_batch_axes(model_inputs(proto), rec.batch_axes)
    if rec.preprocess.get("kind") != "image" and holds_images(rec.calibration_data):
        rec.preprocess = assumed_image_preprocess(inputs) or rec.preprocess
    data = load_dataset(rec.calibration_data, inputs, rec.preprocess, samples)
    tgt = get_target(target)
    with packaging_progress(console) as (say, bar):
        rows = layer_sensitivity(proto, tgt, data, kind, progress=say, bar=bar)
    shown = rows[:top] if top > 0 else rows
    if as_json:
        print(json.dumps([r.to_dict() for r in shown], indent=2))
        return
    metric = "mean KL" if kind == "classification" else "1 - cosine"
    table = Table(title=f"INT8 sensitivity on {tgt.name}: {metric} vs FP32 with only this group quantized "
                        f"({len(data)} samples)")
    table.add_column("#", justify="right")
    id_column(table, "group")
    table.add_column("nodes", justify="right")
    table.add_column("ops")
    table.add_column("INT8 alone", justify="right")
    if tgt.runtime_format == "tensorrt":
        table.add_column("FP16 alone", justify="right")
    for i, r in enumerate(shown, 1):
        cells = [str(i), r.group, str(len(r.nodes)), ",".join(r.op_types), f"{r.int8_error:.3g}"]
        if tgt.runtime_format == "tensorrt":
            cells.append("-" if r.fp16_error is None else f"{r.fp16_error:.3g}")
        table.add_row(*cells)
    print_table(table, console)
    console.print("keep a group in float with --exclude 'GROUP*' (or \\[quantization] exclude), or let "
                  "--precision mixed choose", markup=True)


# ------------------------------------------------------------------------------------ engine

# The host side of ``engine build --on DEVICE BUNDLE`` is deploy's (it probes devices over SSH and
# streams their builds). The packager does not import deploy (one layer), so the entry layer,
# ``cuvil_edge/cli.py``, hands it in through :func:`register`.
_build_on_devices: Callable[..., None] | None = None

engine_app = typer.Typer(
    name="engine",
    help="TensorRT engines: write build plans (host) and build engines from them (device).",
    no_args_is_help=True,
)


@engine_app.command("plan")
def plan_cmd(
    model: Path = typer.Argument(..., help="The ONNX model the engine is built from."),
    target: str = typer.Option(..., "--target", help="Board profile (cuvil-edge targets)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, fp16, int8 or mixed."),
    max_batch: int = typer.Option(8, "--max-batch", help="Largest batch: sizes the profiles."),
    dla_core: int = typer.Option(-1, "--dla-core", help="Build for this DLA core (-1: the GPU)."),
    strongly_typed: bool = typer.Option(False, "--strongly-typed", help="Strongly typed build on TensorRT 10."),
    out_dir: Path = typer.Option(Path("."), "--out-dir", help="Where plan-trt<ver>.json files go."),
) -> None:
    """Write one engine build plan per TensorRT version of the target (plan-trt<ver>.json)."""
    from cuvil_edge._atomic import atomic_write_text
    from cuvil_edge.packager.engine_plan import PlanRequest, make_build_plans
    from cuvil_edge.targets import get_target

    tgt = get_target(target)
    request = PlanRequest(precision=precision, max_batch=max_batch)
    plans = make_build_plans(model, request, tgt, dla_core=None if dla_core < 0 else dla_core,
                             strongly_typed=strongly_typed)
    table = Table(title=f"Engine plans for {tgt.name}")
    for col in ("TensorRT", "mode", "flags", "workspace MiB", "DLA", "engine file"):
        table.add_column(col)
    for plan in plans:
        path = Path(out_dir) / f"plan-trt{plan['tensorrt']}.json"
        atomic_write_text(path, json.dumps(plan, indent=2) + "\n")
        flags = ",".join(plan["network_flags"] + plan["builder_flags"]) or "-"
        dla = "-" if not plan["dla"] else f"core {plan['dla']['core']}"
        table.add_row(plan["tensorrt"], plan["precision_mode"], flags,
                      str(plan["workspace"]["bytes"] >> 20), dla, plan["engine_file"])
    print_table(table, console)
    for plan in plans:
        for w in plan["warnings"]:
            console.print(f"[yellow]warning[/] (TensorRT {plan['tensorrt']}): {w}")


@engine_app.command("build")
@device_options(leave_out=("no_host_key_check", "device_python"), to_flag="--on",
                to_help="Build for this device, \\[user@]host\\[:port] (repeat: the first of a key builds, the "
                        "others get the cached engine). Without --on, --store and --root are this machine's.")
def build_cmd(
    bundle: Path = typer.Argument(None, help="With --on: the bundle (.cvb) whose engine to build."),
    devices: DeviceSelection = DeviceSelection(),
    plan: Path = typer.Option(None, "--plan", help="On the device: build plan JSON (engine/plan-trt<ver>.json)."),
    onnx: Path = typer.Option(None, "--onnx", help="On the device: the ONNX model the plan was made for."),
    out: Path = typer.Option(None, "--out", help="On the device: write the engine here (instead of --store)."),
    builder: str = typer.Option(None, "--builder", help="tensorrt (default) or standin: the STAND-IN builder for "
                                "machines without TensorRT (tests; never a real engine)."),
    timing_cache: Path = typer.Option(None, "--timing-cache", help="With --out: timing cache to read and update."),
    pub: Path = typer.Option(None, "--pub", help="With --on: public key the bundle's signature must verify with."),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", help="With --on: skip the signature check."),
    device_cli: str = typer.Option("cuvil-edge", "--device-cli", help="How to run cuvil-edge on the device."),
    dla_core: int = typer.Option(-1, "--dla-core", help="Build for this DLA core (-1: the GPU)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build on the device even when an engine is cached."),
    as_json: bool = typer.Option(False, "--json", help="With --on: print the outcome as JSON."),
) -> None:
    """Build a TensorRT engine: on a device from the host (--on DEVICE BUNDLE), or on this machine.

    With --on, the host probes each device's key (L4T, TensorRT, SM, DLA), picks the bundle's plan
    for it, builds on the device with its own TensorRT while streaming the builder's log (Ctrl-C
    stops the device build), and keeps the engine in ~/.cache/cuvil-edge/engines: a second device
    of the same key gets the cached engine, sha256-checked, instead of a build. Without --on it is
    the device side: --plan and --onnx, into --store (or --out); needs TensorRT (the jetson extra).
    """
    start = time.monotonic()
    store, root = devices.store, devices.root
    if devices.to or devices.inventory is not None:
        from cuvil_edge.errors import ModelError

        if _build_on_devices is None:
            raise ModelError("engine build --on needs deploy's host side; run it as cuvil-edge engine build --on")
        _build_on_devices(bundle, devices, pub=pub, allow_unsigned=allow_unsigned, device_cli=device_cli,
                          builder=builder, dla_core=None if dla_core < 0 else dla_core, rebuild=rebuild,
                          as_json=as_json)
        return
    from cuvil_edge.errors import ModelError

    if bundle is not None:
        raise ModelError(f"{bundle}: a bundle argument needs --on DEVICE (on the device, pass --plan and --onnx)")
    if plan is None or onnx is None:
        raise ModelError("pass --plan PLAN --onnx MODEL (on the device) or --on DEVICE BUNDLE (from the host)")
    if (out is None) == (store is None):
        raise ModelError("pass exactly one of --store STORE (the engine store) or --out FILE")
    if out is not None:
        from cuvil_edge.packager.engine_build import build_engine

        path = build_engine(plan, onnx, out, timing_cache, log=lambda line: print(line, flush=True))
        typer.echo(f"PASSED: wrote {path} ({path.stat().st_size} bytes) in {time.monotonic() - start:.1f} s")
        return
    import os

    from cuvil_edge.packager.engine_device import build_into_store

    # Only the stand-in reads this: how long its fake build takes (tests of progress and Ctrl-C).
    seconds = float(os.environ.get("CUVIL_EDGE_STANDIN_SECONDS") or 2.0)
    rec = build_into_store(plan, onnx, Path(store), root=root or "/", builder=builder or "tensorrt",
                           standin_seconds=seconds)
    typer.echo(f"PASSED: engine {rec.key.slug}/{rec.model_sha256[:12]}... ({rec.plan_size} bytes, "
               f"{rec.builder}) in {time.monotonic() - start:.1f} s")


def register(app: typer.Typer, build_on_devices: Callable[..., None] | None = None) -> None:
    """Add the packager's commands and the ``engine`` group to the cuvil-edge CLI.

    Args:
        app (typer.Typer): the cuvil-edge CLI.
        build_on_devices (Callable | None): the host side of ``engine build --on`` (deploy's
            :func:`~cuvil_edge.deploy.engines_cli.build_on_devices`); without it ``--on`` is refused.
    """
    global _build_on_devices
    if build_on_devices is not None:
        _build_on_devices = build_on_devices
    app.command("package")(package_cmd)
    app.command("inspect")(inspect_cli)
    app.command("quantize")(quantize_cmd)
    app.command("validate")(validate_cmd)
    app.add_typer(engine_app, name="engine")
