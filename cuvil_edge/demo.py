"""``cuvil-edge demo``: the main job end to end on a real model, for a simulated Orin Nano 8 GB.

EfficientNet-Lite0 (ImageNet weights) is calibrated on real photographs, quantized to mixed
INT8/FP32 in TensorRT's Q/DQ form, validated against FP32 on photos calibration never saw,
signed, verified, installed into a bundle store and run once; then served by the daemon when it
is available.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.table import Table

from cuvil_edge._console import print_table

__all__ = ["imagenet_labels", "register", "run_demo"]

DEMO_RECIPE = "efficientnet-lite0-orin-nano.toml"


def imagenet_labels() -> list[str]:
    from importlib import resources

    text = resources.files("cuvil_edge").joinpath("data/imagenet_labels.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _recipe_path() -> Path:
    from cuvil_edge.errors import RecipeError

    path = Path(__file__).resolve().parents[1] / "recipes" / DEMO_RECIPE
    if not path.exists():
        raise RecipeError(f"{path}: demo recipe not found; run the demo from a source checkout")
    return path


def _install(bundle: Path, store: Path, public_key: Path) -> Path:
    """Extract into ``store/bundles/<name>/<version>`` and point ``current`` at it (atomic rename).

    The signature and the names are verified (reading the bundle's head) before anything in the
    store is touched; a version already there is replaced only once the new copy has verified.
    """
    import os

    from cuvil_edge.bundle import extract_bundle, read_manifest
    from cuvil_edge.bundle.layout import StoreLayout, point_current

    manifest = read_manifest(bundle, public_key)
    base = Path(StoreLayout.of(store).bundle_dir(manifest.name))
    dest = base / manifest.version
    staged = base / f".{manifest.version}.new"
    old = base / f".{manifest.version}.old"
    for leftover in (staged, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    extract_bundle(bundle, staged, public_key)
    if dest.exists():
        os.rename(dest, old)
    os.rename(staged, dest)
    shutil.rmtree(old, ignore_errors=True)
    point_current(StoreLayout.of(store), manifest.name, manifest.version)
    return dest


def run_demo(out_dir: Path, serve: bool = True, requests: int = 200) -> dict[str, Any]:
    """Run the demo; returns the figures it printed."""
    from cuvil_edge._console import console
    from cuvil_edge.bundle import generate_keypair, verify_bundle
    from cuvil_edge.packager.data import load_photo
    from cuvil_edge.packager.imaging import preprocess_image
    from cuvil_edge.packager.load import load_model
    from cuvil_edge.packager.package import package, resolve_model
    from cuvil_edge.packager.quantize import target_arithmetic
    from cuvil_edge.packager.validate import make_session
    from cuvil_edge.recipes import load_recipe
    from cuvil_edge.runtime.ort import OrtBackend

    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    key, pub = out_dir / "demo.key", out_dir / "demo.pub"
    if not key.exists():
        generate_keypair(key, pub)
    recipe = load_recipe(_recipe_path())
    bundle = out_dir / f"{recipe.name}-{recipe.target}.cvb"
    console.rule(f"[bold]cuvil-edge demo[/]: {recipe.name} for {recipe.target}, {recipe.precision}")
    with console.status("building EfficientNet-Lite0 from its ImageNet weights"):
        fp32_path = resolve_model(recipe.model)
    from cuvil_edge._progress import packaging_progress

    with packaging_progress(console) as (say, bar):
        result = package(recipe, bundle, key, progress=say, bar=bar)
    manifest = verify_bundle(bundle, pub)
    minisign = shutil.which("minisign")
    store = out_dir / "store"
    installed = _install(bundle, store, pub)
    minisign_ok = None
    if minisign:
        rc = subprocess.run([minisign, "-Vq", "-p", str(pub), "-m", str(installed / "manifest.json")],
                            capture_output=True, text=True)
        minisign_ok = rc.returncode == 0

    labels = imagenet_labels()
    image = load_photo("coffee")
    x = preprocess_image(image, recipe.preprocess)[None]
    ref_sess = make_session(load_model(fp32_path))
    # What the board computes (exact Q/DQ emulation, FP16 layers rounded), not this host's INT8 kernels.
    fp16 = result.report["quantization"].get("fp16_nodes") or []
    logits = make_session(target_arithmetic(load_model(installed / manifest.model), fp16)).run(None, {"input": x})[0][0]
    # The host's own speed, as cuvil-edged serves this bundle here without TensorRT (Q/DQ as written).
    host = OrtBackend.from_bundle(installed, manifest.to_dict())
    host.activate()
    try:
        host.infer({"input": x}, None)
        t = time.perf_counter()
        runs = 20
        for _ in range(runs):
            host.infer({"input": x}, None)
        latency_ms = (time.perf_counter() - t) / runs * 1e3
    finally:
        host.deactivate()
    ref_logits = ref_sess.run(None, {"input": x})[0][0]

    def top5(v: np.ndarray) -> list[tuple[str, float]]:
        p = np.exp(v - v.max())
        p /= p.sum()
        return [(labels[i], float(p[i])) for i in np.argsort(-p)[:5]]

    table = Table(title="scikit-image 'coffee' photo: top-5, FP32 original vs bundled model")
    table.add_column("#")
    table.add_column("FP32")
    table.add_column(f"bundle ({recipe.precision})")
    for i, (a, b) in enumerate(zip(top5(ref_logits), top5(logits), strict=True)):
        table.add_row(str(i + 1), f"{a[0]} {a[1]:.3f}", f"{b[0]} {b[1]:.3f}")
    print_table(table, console)

    metrics = next(iter(result.report["validation"]["outputs"].values()))
    kept = result.report["quantization"].get("kept_float_groups", [])
    tiers = result.report["quantization"].get("tiers") or {g: "fp32" for g in kept}
    summary = Table(title="bundle")
    summary.add_column("what")
    summary.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("bundle", f"{bundle} ({result.size_bytes / 1e6:.1f} MB)"),
        ("precision / format", f"{recipe.precision} / {manifest.format_kind} (symmetric Q/DQ)"),
        ("layer groups kept out of INT8", ", ".join(f"{g} ({t})" for g, t in tiers.items()) or "none"),
        ("held-out crops", str(metrics["samples"])),
        ("top-1 agreement (all / confident)",
         f"{metrics['top1_agreement']:.3f} / {metrics['confident_top1_agreement']:.3f} "
         f"(n={metrics['confident_samples']})"),
        ("top-5 containment", f"{metrics['top5_containment']:.3f}"),
        ("mean KL / cosine", f"{metrics['mean_kl']:.4f} / {metrics['cosine']:.4f}"),
        ("signature", "verified" + (", minisign -V OK" if minisign_ok else "")),
        ("engine build plans", ", ".join(p["tensorrt"] for p in manifest.build_plans) or "none"),
        ("this host's latency, batch 1 (ONNX Runtime CPU, Q/DQ as written)", f"{latency_ms:.1f} ms"),
        ("packaging time", f"{result.timings_s['total']:.0f} s"),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    print_table(summary, console)
    figures: dict[str, Any] = {"bundle": str(bundle), "metrics": metrics, "kept_float": kept,
                               "latency_ms": latency_ms, "store": str(store)}
    if serve:
        figures["serving"] = _serve(store, recipe.target, requests)
    console.print(f"[green]PASSED[/] demo in {time.perf_counter() - started:.0f} s; outputs in {out_dir}")
    return figures


def _serve(store: Path, board: str, requests: int) -> dict[str, Any] | None:
    from cuvil_edge._console import console
    from cuvil_edge.loadgen import ClientMissing, serve_and_measure

    try:
        with console.status(f"serving with cuvil-edged (simulated {board} telemetry), {requests} requests"):
            figures = serve_and_measure(store, board=board, requests=requests)
    except ClientMissing as exc:
        console.print(f"skipping the serving step: {exc}", markup=False)
        return None
    table = Table(title=f"cuvil-edged on a simulated {board}: tritonclient, binary tensors")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, value in _serving_rows(figures):
        table.add_row(label, value)
    print_table(table, console)
    return figures


def _serving_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    """The serving figures worth reading, flattened from serve_and_measure's dict."""
    server = f.get("server") or {}
    board = f.get("board_metrics") or {}

    def pick(prefix: str) -> float | None:
        return next((v for k, v in board.items() if k.startswith(prefix)), None)

    rows = [
        ("requests / concurrency / errors", f"{f.get('requests')} / {f.get('concurrency')} / {f.get('errors')}"),
        ("throughput", f"{f.get('throughput_rps', 0):.1f} req/s"),
        ("latency p50 / p99", f"{f.get('p50_ms', 0):.1f} / {f.get('p99_ms', 0):.1f} ms"),
        ("server: queue / compute per execution",
         f"{server.get('queue_ms_mean', 0):.1f} / {server.get('compute_infer_ms_mean', 0):.1f} ms"),
        ("batches / inferences", f"{server.get('executions')} / {server.get('inferences')}"),
    ]
    sim = [
        ("simulated GPU / EMC utilization", pick("cuvil_board_gpu_utilization"), pick("cuvil_board_emc_utilization"),
         "{:.0f} % / {:.0f} %"),
        ("simulated RAM used / memory budget", (pick("cuvil_board_ram_used_bytes") or 0) / 2**20,
         (pick("cuvil_memory_budget_bytes") or 0) / 2**20, "{:.0f} MB / {:.0f} MB"),
    ]
    for label, a, b, fmt in sim:
        if a is not None and b is not None:
            rows.append((label, fmt.format(a, b)))
    power = pick('cuvil_board_power_milliwatts{rail="VDD_IN"}')
    if power is not None:
        rows.append(("simulated input power", f"{power / 1000:.1f} W"))
    depth = pick("cuvil_prefetch_depth")
    if depth is not None:
        rows.append(("prefetch depth", f"{depth:.0f}"))
    return rows


def demo(
    out_dir: Path = typer.Option(Path("cuvil-demo"), "--out-dir", help="Where keys, bundle and store go."),
    serve: bool = typer.Option(True, "--serve/--no-serve", help="Also serve the bundle with cuvil-edged."),
    requests: int = typer.Option(200, "--requests", help="Requests to send when serving."),
) -> None:
    """Run the main job on the embedded default: EfficientNet-Lite0 for a simulated Orin Nano 8 GB."""
    run_demo(out_dir, serve=serve, requests=requests)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
