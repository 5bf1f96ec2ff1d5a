"""``cuvil-edge engine plan|build``: engine build plans on the host, engine builds on the device."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import typer

__all__ = ["register"]

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
    bundle: Path = typer.Argument(None, help="With --on: the bundle (.cvb) whose engine to build."),
    on: list[str] = typer.Option(None, "--on", help="Build for this device, \\[user@]host\\[:port] (repeat: the "
                                 "first of a key builds, the others get the cached engine).", envvar="CUVIL_EDGE_ON"),
    inventory: Path = typer.Option(None, "--inventory", help="With a bundle: TOML inventory of devices (as for "
                                   "cuvil-edge deploy).", envvar="CUVIL_EDGE_INVENTORY"),
    plan: Path = typer.Option(None, "--plan", help="On the device: build plan JSON (engine/plan-trt<ver>.json)."),
    onnx: Path = typer.Option(None, "--onnx", help="On the device: the ONNX model the plan was made for."),
    out: Path = typer.Option(None, "--out", help="On the device: write the engine here (instead of --store)."),
    store: str = typer.Option(None, "--store", help="Bundle store: the engine goes to <store>/engines/<key>/. "
                              "With --on: the device's store.", envvar="CUVIL_EDGE_STORE"),
    root: str = typer.Option(None, "--root", help="Device system root whose facts give the engine key. "
                             "Defaults to /.", envvar="CUVIL_EDGE_DEVICE_ROOT"),
    builder: str = typer.Option(None, "--builder", help="tensorrt (default) or standin: the STAND-IN builder for "
                                "machines without TensorRT (tests; never a real engine).",
                                envvar="CUVIL_EDGE_ENGINE_BUILDER"),
    timing_cache: Path = typer.Option(None, "--timing-cache", help="With --out: timing cache to read and update."),
    pub: Path = typer.Option(None, "--pub", help="With --on: public key the bundle's signature must verify with.",
                             envvar="CUVIL_EDGE_PUB"),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", help="With --on: skip the signature check."),
    identity: Path = typer.Option(None, "--identity", "-i", help="SSH private key.", envvar="CUVIL_EDGE_IDENTITY"),
    known_hosts: Path = typer.Option(None, "--known-hosts", help="known_hosts file.", envvar="CUVIL_EDGE_KNOWN_HOSTS"),
    daemon_port: int = typer.Option(None, "--daemon-port", help="Daemon port on the device (reload after the "
                                    "build). Defaults to 8000.", envvar="CUVIL_EDGE_DAEMON_PORT"),
    device_cli: str = typer.Option("cuvil-edge", "--device-cli", help="How to run cuvil-edge on the device.",
                                   envvar="CUVIL_EDGE_DEVICE_CLI"),
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
    if on or inventory is not None:
        from cuvil_edge.errors import ModelError

        if _build_on_devices is None:
            raise ModelError("engine build --on needs deploy's host side; run it as cuvil-edge engine build --on")
        _build_on_devices(bundle, on or [], inventory=inventory, pub=pub, allow_unsigned=allow_unsigned, identity=identity,
                         known_hosts=known_hosts, root=root, store=store, daemon_port=daemon_port,
                         device_cli=device_cli, builder=builder, dla_core=None if dla_core < 0 else dla_core,
                         rebuild=rebuild, as_json=as_json)
        return
    from cuvil_edge.errors import ModelError

    if bundle is not None:
        raise ModelError(f"{bundle}: a bundle argument needs --on DEVICE (on the device, pass --plan and --onnx)")
    if plan is None or onnx is None:
        raise ModelError("pass --plan PLAN --onnx MODEL (on the device) or --on DEVICE BUNDLE (from the host)")
    if (out is None) == (store is None):
        raise ModelError("pass exactly one of --store STORE (the engine store) or --out FILE")
    if out is not None:
        from cuvil_edge.packager.engine import build_engine

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
    """Add the ``engine`` command group to the cuvil-edge CLI.

    Args:
        app (typer.Typer): the cuvil-edge CLI.
        build_on_devices (Callable | None): the host side of ``engine build --on`` (deploy's
            :func:`~cuvil_edge.deploy.engines_cli.build_on_devices`); without it ``--on`` is refused.
    """
    global _build_on_devices
    if build_on_devices is not None:
        _build_on_devices = build_on_devices
    app.add_typer(engine_app, name="engine")
