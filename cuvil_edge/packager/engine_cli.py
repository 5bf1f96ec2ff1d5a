"""``cuvil-edge engine plan|build``: engine build plans on the host, engine builds on the device."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

__all__ = ["register"]

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
    from rich.console import Console
    from rich.table import Table

    from cuvil_edge._atomic import atomic_write_text
    from cuvil_edge._console import print_table
    from cuvil_edge.packager.engine import make_build_plans
    from cuvil_edge.targets import get_target

    tgt = get_target(target)
    manifest = {"precision": precision, "max_batch": max_batch}
    plans = make_build_plans(model, manifest, tgt, dla_core=None if dla_core < 0 else dla_core,
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
    console = Console()
    print_table(table, console)
    for plan in plans:
        for w in plan["warnings"]:
            console.print(f"[yellow]warning[/] (TensorRT {plan['tensorrt']}): {w}")


@engine_app.command("build")
def build_cmd(
    plan: Path = typer.Option(..., "--plan", help="Build plan JSON (engine/plan-trt<ver>.json)."),
    onnx: Path = typer.Option(..., "--onnx", help="The ONNX model the plan was made for."),
    out: Path = typer.Option(..., "--out", help="Engine file to write."),
    timing_cache: Path = typer.Option(None, "--timing-cache", help="Timing cache to read and update."),
) -> None:
    """Build a TensorRT engine from a plan ON THIS MACHINE (the device); needs TensorRT (the jetson extra)."""
    from cuvil_edge.packager.engine import build_engine

    start = time.monotonic()
    path = build_engine(plan, onnx, out, timing_cache)
    typer.echo(f"PASSED: wrote {path} ({path.stat().st_size} bytes) in {time.monotonic() - start:.1f} s")


def register(app: typer.Typer) -> None:
    """Add the ``engine`` command group to the cuvil-edge CLI."""
    app.add_typer(engine_app, name="engine")
