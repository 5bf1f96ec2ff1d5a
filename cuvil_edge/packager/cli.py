"""``cuvil-edge package | quantize | validate | inspect``: the packager's commands."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cuvil_edge._console import id_column, print_table

__all__ = ["register"]


def _recipe(
    model: str | None, recipe_path: Path | None, target: str | None, precision: str | None,
    calib: str | None, eval_data: str | None, name: str | None, version: str | None,
) -> Any:
    from cuvil_edge.errors import RecipeError
    from cuvil_edge.recipes import load_recipe, recipe_from_dict

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
            {"name": name or Path(model).stem, "model": {"source": str(Path(model).resolve())
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
    quantizer: str = typer.Option("cuvil", "--quantizer",
                                  help="cuvil (default) or modelopt (NVIDIA Model Optimizer; extra cuvil-edge[modelopt])."),
) -> None:
    """Quantize a model for a board, check its accuracy against FP32, and write a signed bundle."""
    from cuvil_edge._console import console
    from cuvil_edge.packager.package import package

    started = time.perf_counter()
    _check_out(out)
    rec = _recipe(model, recipe, target, precision, calib, eval_data, name, version)
    from cuvil_edge._progress import packaging_progress

    with packaging_progress(console) as (say, bar):
        result = package(rec, out, key, progress=say, bar=bar, quantizer=quantizer)
    if as_json:
        print(json.dumps(result.report, indent=2, default=float))
        return
    primary = result.report["validation"]["outputs"]
    first = next(iter(primary.values()))
    print_table(_metrics_table(f"{rec.name}: {rec.precision} ({result.report['runtime_format']}) vs FP32", first))
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
    quantizer: str = typer.Option("cuvil", "--quantizer", help="cuvil (default) or modelopt."),
) -> None:
    """Quantize only: write the model in the target runtime's format, without validation or bundle."""
    from cuvil_edge._atomic import atomic_write_bytes
    from cuvil_edge._console import console
    from cuvil_edge._progress import packaging_progress
    from cuvil_edge.packager.data import load_dataset
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.package import quantize_model, resolve_model
    from cuvil_edge.targets import get_target

    _check_out(out)
    rec = _recipe(model, recipe, target, precision, calib, None, None, None)
    m = load_model(resolve_model(rec.model))
    inputs = model_inputs(m)
    cal = None
    if rec.calibration_data:
        cal = load_dataset(rec.calibration_data, inputs, rec.preprocess, rec.calibration_samples)
    kind = rec.postprocess.get("kind", "classification")
    with packaging_progress(console) as (say, bar):
        q, info = quantize_model(m, get_target(rec.target), rec.precision, cal, kind, rec.accuracy,
                                 rec.calibration_method, None, say, bar, rec.bias_correction, quantizer=quantizer)
    atomic_write_bytes(out, q.SerializeToString())
    console.print(f"[green]PASSED[/] wrote {out} ({info['runtime_format']} format)")


def validate_cmd(
    reference: str = typer.Argument(..., help="The original FP32 ONNX model."),
    candidate: Path = typer.Argument(..., help="The quantized ONNX model."),
    eval_data: str = typer.Option(..., "--eval", help="Evaluation data."),
    recipe: Path = typer.Option(None, "--recipe", help="Recipe for pre-processing and the accuracy goal."),
    samples: int = typer.Option(200, "--samples", help="Evaluation samples."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare a quantized model with its original; exit 1 when the recipe's accuracy goal is missed."""
    from cuvil_edge._console import console
    from cuvil_edge.packager.data import load_dataset
    from cuvil_edge.packager.load import load_model, model_inputs
    from cuvil_edge.packager.package import resolve_model
    from cuvil_edge.packager.quantize import target_arithmetic
    from cuvil_edge.packager.validate import make_session, validate_models
    from cuvil_edge.recipes import AccuracyGoal, load_recipe

    rec = load_recipe(recipe) if recipe else None
    ref = load_model(resolve_model(reference))
    cand = load_model(candidate)
    pre = rec.preprocess if rec else {"kind": "none"}
    data = load_dataset(eval_data, model_inputs(ref), pre, samples, seed=100)
    kind = rec.postprocess.get("kind", "classification") if rec else "classification"
    # The candidate as the target computes it (exact Q/DQ emulation), not through this host's INT8 kernels.
    report = validate_models(make_session(ref), make_session(target_arithmetic(cand)), data, kind,
                             rec.accuracy if rec else AccuracyGoal())
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_table(_metrics_table(f"{candidate} vs {reference}", report.primary))
    report.raise_if_failed(str(candidate))
    console.print("[green]PASSED[/] accuracy goal met")


def inspect_cli(
    model: str = typer.Argument(..., help="ONNX model."),
    target: str = typer.Option(..., "--target", help="Board profile."),
    max_batch: int = typer.Option(8, "--max-batch", help="Largest batch, for optimization profiles."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    only_issues: bool = typer.Option(False, "--only-issues", help="List only nodes that fall back."),
) -> None:
    """Which ops the target's TensorRT versions and DLA run, why others fall back, and the profiles needed."""
    from cuvil_edge.packager.inspect import inspect_cmd
    from cuvil_edge.packager.package import resolve_model

    rc = inspect_cmd(resolve_model(model), target, max_batch=max_batch, as_json=as_json, only_issues=only_issues)
    if rc:
        raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("package")(package_cmd)
    app.command("inspect")(inspect_cli)
    app.command("quantize")(quantize_cmd)
    app.command("validate")(validate_cmd)
