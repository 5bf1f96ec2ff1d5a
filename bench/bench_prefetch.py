#!/usr/bin/env python3
"""Adaptive prefetch against every fixed depth 1..N, phase by phase, in the simulator.

Everything here is a simulation (no Jetson is available to this project's CI): the board is
:class:`cuvil_edge.telemetry.SimulatedBoard` ("orin-nano-8gb": 8 GB LPDDR5, 68 GB/s, 625 MHz GPU,
7-15 W, figures from the Orin Nano data sheet DS-11105-001 and ``data/targets.toml``) running
:class:`cuvil_edge.telemetry.pipeline_sim.PipelineSim`. Every assumption that drives a result is
written into the JSON (``workload``, ``board_model``, ``timeline``, ``criteria``).

The timeline is built so that the best fixed depth *changes* (one phase each; 180 s):

* ``light``           0-40 s: the board to ourselves. Preparing a batch (decode + resize on one
  of 4 worker threads) takes about twice as long as the GPU executes it, so only a deep pipeline
  keeps the GPU fed: deep prefetch pays;
* ``gpu shared``     40-80 s: another process takes 60% of the GPU (time-sliced) and 30% of the
  memory bus; execution is now the bottleneck and extra depth only queues;
* ``memory squeeze`` 80-120 s: another application grows to 6.2 GB (10 s ramp) and shares the GPU
  30%; RAM is short, depth costs memory;
* ``thermal``       120-180 s: the enclosure heats by 45 °C; above 95 °C the GPU clock steps down
  to half (the simulator's thermal model), or, with ``--thermal-log``, the GPU clock and
  temperatures of a recorded tegrastats log are replayed from 120 s.

For each phase the bench reports every fixed depth 1..``--max-depth`` and picks the best in
hindsight: the highest throughput; depths within 1% of it are equally fast, and among those the
lowest p99 wins. Adaptive (``MemoryScheduler`` + ``PrefetchController`` wired as ``cuvil-edged``
wires them) must reach >= 95% of that throughput with p99 and peak daemon memory no worse than
the best's, in every phase. Figures are over the phase after a settling window (``--settle``, the
same for every mode) and, separately, over the whole phase. A separate ``harsh squeeze`` run
(the other application grows to 6.55 GB, below the ladder's REJECT line) shows what the memory
ladder trades for staying clear of the OOM killer; it is reported, not part of the goal.

Usage::

    .venv/bin/python bench/bench_prefetch.py            # bench/results/prefetch.json + prefetch.png
    .venv/bin/python bench/bench_prefetch.py --seeds 2  # quicker
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuvil_edge.daemon.scheduler import MemoryScheduler, PrefetchController  # noqa: E402
from cuvil_edge.telemetry.pipeline_sim import MiB, PipelineResult, PipelineSim, Workload  # noqa: E402
from cuvil_edge.telemetry.sim import BOARD_FIGURES, SimulatedBoard  # noqa: E402

BOARD = "orin-nano-8gb"
DURATION = 180.0
PHASES = [(0.0, 40.0, "light"), (40.0, 80.0, "gpu shared"), (80.0, 120.0, "memory squeeze"),
          (120.0, 180.0, "thermal")]
SQUEEZE_MB = 6200.0
HARSH_SQUEEZE_MB = 6550.0
THROUGHPUT_TIE = 0.01  # depths within 1% of the best throughput are equally fast
GOAL_THROUGHPUT = 0.95
# "No worse" allows the seed-to-seed noise of the figures; the JSON keeps the raw ratios too.
P99_TOLERANCE = 0.05
MEMORY_TOLERANCE = 0.05

# Eight 1080p30 cameras into a small 640x640 FP16 detector (a YOLOv8n-class model) on an Orin
# Nano. Assumptions, not measurements: decode + resize + normalize 7 ms per frame on one Cortex-A78AE
# core (coefficient of variation 0.6), each batch one task on a pool of 4 worker threads (2 of the
# 6 cores left to capture and the OS); GPU 3 ms + 2.8 ms per frame (TensorRT FP16, in the range of
# published YOLOv8n timings on Orin Nano); 6 MB held per frame in flight (3.1 MB decoded NV12 +
# 2.4 MB FP16 input + outputs); 250 MB resident engine and runtime; p95 objective 250 ms.
WORKLOAD = Workload(streams=8, fps=30.0, max_batch=8, cpu_workers=4, pre_ms=7.0, pre_cv=0.6,
                    gpu_t0_ms=3.0, gpu_t1_ms=2.8, bytes_per_frame=int(6 * MiB), resident_bytes=250 * MiB,
                    dram_bytes_per_frame=60 * MiB, pre_parallel=True, latency_target_ms=250.0)


def make_board(seed: int, squeeze_mb: float = SQUEEZE_MB, thermal_log: Path | None = None) -> SimulatedBoard:
    b = SimulatedBoard(BOARD, seed=seed, noise_pct=3.0)
    b.gpu_saturation(40, 40, fraction=0.6)
    b.memory_squeeze(80, 40, mb=squeeze_mb, ramp_s=10)
    b.gpu_saturation(80, 40, fraction=0.3)
    if thermal_log is not None:
        from cuvil_edge.telemetry.replay import load_log

        b.replay_clock(120, load_log(thermal_log))
    else:
        b.thermal_throttle(120, 60, ambient_rise_c=45)
    return b


def run_mode(mode: str, seed: int, squeeze_mb: float = SQUEEZE_MB, thermal_log: Path | None = None,
             max_depth: int = 8) -> PipelineResult:
    board = make_board(seed, squeeze_mb, thermal_log)
    if mode == "adaptive":
        sched = MemoryScheduler(target=board.target, reserve_mb=256)
        ctl = PrefetchController(1, max_depth)
        sim = PipelineSim(board, WORKLOAD, controller=ctl, scheduler=sched, seed=seed)
    else:
        sim = PipelineSim(board, WORKLOAD, depth=int(mode.split("-")[1]), seed=seed)
    return sim.run(DURATION)


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return round(statistics.fmean(vals), 2) if vals else None


def phase_table(runs: dict[str, list[PipelineResult]], settle: float) -> dict[str, dict[str, Any]]:
    """Per phase and mode: throughput, p99, peak memory, OOM kills (means over seeds), settled and whole."""
    out: dict[str, dict[str, Any]] = {}
    for start, end, name in PHASES:
        out[name] = {}
        for mode, rs in runs.items():
            row: dict[str, Any] = {}
            for label, a in (("settled", start + settle if start > 0 else settle), ("whole", start)):
                w = [r.window(a, end) for r in rs]
                row[label] = {
                    "throughput_fps": _mean([x["throughput_fps"] for x in w]),
                    "p99_ms": _mean([x["p99_ms"] for x in w]),
                    "peak_daemon_mb": _mean([x["peak_daemon_mb"] for x in w]),
                    "oom_events": sum(x["oom_events"] for x in w),
                    "p99_ms_range": [round(min(x["p99_ms"] for x in w), 1), round(max(x["p99_ms"] for x in w), 1)],
                }
            if mode == "adaptive":
                tr = [x for r in rs for x in r.trace if start <= x["t"] < end]
                row["mean_depth"] = round(statistics.fmean(x["depth"] for x in tr), 2) if tr else None
                row["depths_seen"] = sorted({x["depth"] for x in tr})
            out[name][mode] = row
    return out


def judge(table: dict[str, dict[str, Any]], label: str) -> dict[str, Any]:
    """Best fixed depth per phase (in hindsight) and adaptive against it."""
    phases: dict[str, Any] = {}
    for name, modes in table.items():
        fixed = {m: v[label] for m, v in modes.items() if m.startswith("fixed")}
        top = max(v["throughput_fps"] for v in fixed.values())
        ties = [m for m, v in fixed.items() if v["throughput_fps"] >= (1 - THROUGHPUT_TIE) * top]
        best = min(ties, key=lambda m: (fixed[m]["p99_ms"], fixed[m]["peak_daemon_mb"]))
        ref, ad = fixed[best], modes["adaptive"][label]
        ratios = {"throughput": round(ad["throughput_fps"] / ref["throughput_fps"], 3),
                  "p99": round(ad["p99_ms"] / ref["p99_ms"], 3),
                  "peak_memory": round(ad["peak_daemon_mb"] / ref["peak_daemon_mb"], 3)}
        checks = {"throughput": ratios["throughput"] >= GOAL_THROUGHPUT,
                  "p99": ratios["p99"] <= 1 + P99_TOLERANCE,
                  "peak_memory": ratios["peak_memory"] <= 1 + MEMORY_TOLERANCE,
                  "no_oom": ad["oom_events"] == 0}
        phases[name] = {"best_fixed": best, "equally_fast": ties, "best": ref, "adaptive": ad,
                        "ratios": ratios, "checks": checks, "met": all(checks.values())}
    # No single fixed depth meets the bar in every phase: check each against the phase bests.
    fixed_modes = [m for m in next(iter(table.values())) if m.startswith("fixed")]
    single: dict[str, bool] = {}
    for m in fixed_modes:
        ok = True
        for name, modes in table.items():
            v, ref = modes[m][label], phases[name]["best"]
            ok &= (v["throughput_fps"] >= GOAL_THROUGHPUT * ref["throughput_fps"]
                   and v["p99_ms"] <= (1 + P99_TOLERANCE) * ref["p99_ms"]
                   and v["peak_daemon_mb"] <= (1 + MEMORY_TOLERANCE) * ref["peak_daemon_mb"]
                   and v["oom_events"] == 0)
        single[m] = ok
    return {"phases": phases, "adaptive_meets_bar_every_phase": all(p["met"] for p in phases.values()),
            "fixed_depths_meeting_bar_every_phase": [m for m, ok in single.items() if ok]}


def harsh_squeeze(seeds: int, max_depth: int) -> dict[str, Any]:
    """The same timeline with a squeeze below the ladder's REJECT line (reported, not judged)."""
    a, e = 80.0, 120.0
    out: dict[str, Any] = {"other_application_mb": HARSH_SQUEEZE_MB, "window_s": [a, e], "modes": {}}
    for mode in [f"fixed-{d}" for d in range(1, max_depth + 1)] + ["adaptive"]:
        rs = [run_mode(mode, s, squeeze_mb=HARSH_SQUEEZE_MB, max_depth=max_depth) for s in range(seeds)]
        w = [r.window(a, e) for r in rs]
        out["modes"][mode] = {
            "throughput_fps": _mean([x["throughput_fps"] for x in w]),
            "p99_ms": _mean([x["p99_ms"] for x in w]),
            "peak_daemon_mb": _mean([x["peak_daemon_mb"] for x in w]),
            "oom_events": sum(x["oom_events"] for x in w),
            "rejected": sum(r.rejected for r in rs),
        }
    return out


def plot(runs: dict[str, list[PipelineResult]], verdict: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    tr = runs["adaptive"][0].trace
    ax = axes[0]
    colors = {"light": "tab:green", "gpu shared": "tab:orange", "memory squeeze": "tab:purple", "thermal": "tab:red"}
    for start, end, name in PHASES:
        ax.axvspan(start, end, alpha=0.12, color=colors[name], label=f"{name} (best fixed: "
                   f"{verdict['phases'][name]['best_fixed']})")
    ax.step([x["t"] for x in tr], [x["depth"] for x in tr], where="post", color="black", label="adaptive depth")
    ax.set_ylim(0, 9)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("prefetch depth")
    ax.set_title("Adaptive depth (seed 0)")
    ax.legend(fontsize=7, loc="upper right")
    names = [n for _, _, n in PHASES]
    for ax, key, title in ((axes[1], "throughput", "throughput vs phase-best fixed"),
                           (axes[2], "p99", "p99 and peak memory vs phase-best fixed")):
        if key == "throughput":
            vals = [verdict["phases"][n]["ratios"]["throughput"] for n in names]
            ax.bar(names, vals, color=[colors[n] for n in names])
            ax.axhline(GOAL_THROUGHPUT, color="black", ls="--", lw=1, label="goal >= 0.95")
        else:
            x = range(len(names))
            ax.bar([i - 0.2 for i in x], [verdict["phases"][n]["ratios"]["p99"] for n in names], 0.4, label="p99")
            ax.bar([i + 0.2 for i in x], [verdict["phases"][n]["ratios"]["peak_memory"] for n in names], 0.4,
                   label="peak memory")
            ax.set_xticks(list(x), names)
            ax.axhline(1.0, color="black", ls="--", lw=1, label="goal <= 1 (+5% noise)")
        ax.set_ylim(0, 1.3)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"Prefetch on a simulated {BOARD} (model, not a measurement): adaptive / best fixed depth "
                 "of each phase (settled)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="runs per mode (different random seeds)")
    ap.add_argument("--max-depth", type=int, default=8, help="fixed depths swept: 1..N (and adaptive's range)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after each phase change left out of the "
                    "settled figures (every mode alike)")
    ap.add_argument("--thermal-log", type=Path, default=None,
                    help="tegrastats log whose GPU clock and temperatures are replayed from 120 s")
    ap.add_argument("--no-harsh", action="store_true", help="skip the harsh-squeeze run")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefetch.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the ladder logs every step at WARNING
    t0 = time.perf_counter()
    modes = [f"fixed-{d}" for d in range(1, args.max_depth + 1)] + ["adaptive"]
    runs = {m: [run_mode(m, s, thermal_log=args.thermal_log, max_depth=args.max_depth) for s in range(args.seeds)]
            for m in modes}
    table = phase_table(runs, args.settle)
    settled, whole = judge(table, "settled"), judge(table, "whole")
    results: dict[str, Any] = {
        "benchmark": "prefetch",
        "kind": "simulation",
        "command": "python bench/bench_prefetch.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "note": "All figures come from a discrete-event model (cuvil_edge.telemetry.pipeline_sim) on a simulated "
                "board; every assumption that drives them is in 'workload', 'board_model' and 'timeline'.",
        "board": BOARD,
        "board_figures": asdict(BOARD_FIGURES[BOARD]),
        "workload": asdict(WORKLOAD),
        "board_model": {
            "os_used_mb": 1100, "ram_total_mb": 8192,
            "gpu_sharing": "time-sliced: our execution time / (1 - other process's share)",
            "emc": "execution slows by 1 + 2*(u - 0.7)/0.3 above 70% memory-bus utilization",
            "thermal": ("recorded tegrastats GPU clock and temperatures replayed"
                        if args.thermal_log else
                        "first-order heating toward ambient + 55 C x power/max power (20 s); above 95 C the GPU "
                        "clock steps down 10%/s to half, back 5 C lower"),
            "thermal_log": str(args.thermal_log) if args.thermal_log else None,
            "thermal_log_note": "the recorded logs in tests/data/tegrastats hold no throttling episode (hottest "
                                "sensor 63 C, idle GPU clocks), so the default thermal phase is the model above",
            "oom": "the daemon is killed when board RAM would overflow and restarts after restart_s",
            "capture_ring": "a full ring drops its oldest frame (leaky queue); queued frames hold "
                            "queued_frame_bytes each",
        },
        "timeline": {"duration_s": DURATION, "phases": [{"start_s": a, "end_s": b, "name": n} for a, b, n in PHASES],
                     "gpu_shared_other_fraction": 0.6, "squeeze_other_application_mb": SQUEEZE_MB,
                     "squeeze_ramp_s": 10, "squeeze_other_gpu_fraction": 0.3, "thermal_ambient_rise_c": 45},
        "criteria": {
            "best_fixed": f"highest throughput; depths within {THROUGHPUT_TIE:.0%} of it tie, lowest p99 among them",
            "adaptive_throughput": f">= {GOAL_THROUGHPUT:.0%} of the phase-best fixed depth",
            "adaptive_p99": f"<= phase-best p99 x {1 + P99_TOLERANCE:.2f} (seed noise allowance)",
            "adaptive_peak_memory": f"<= phase-best peak daemon memory x {1 + MEMORY_TOLERANCE:.2f}",
            "settle_s": args.settle,
            "adaptive_controller": "PrefetchController(1, max_depth) defaults; MemoryScheduler(reserve_mb=256)",
        },
        "seeds": args.seeds,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "per_phase": table,
        "goal_settled": settled,
        "goal_whole_phase": whole,
    }
    if not args.no_harsh:
        results["harsh_squeeze"] = harsh_squeeze(args.seeds, args.max_depth)
    results["wall_s"] = round(time.perf_counter() - t0, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(runs, settled, args.out.with_suffix(".png"))

    for label, verdict in (("settled", settled), ("whole phase", whole)):
        print(f"== {label}: phase: best fixed (fps / p99 ms / peak MB) | adaptive | ratios")
        for name, p in verdict["phases"].items():
            b, a, r = p["best"], p["adaptive"], p["ratios"]
            print(f"  {name:15} {p['best_fixed']:8} {b['throughput_fps']:6.1f} / {b['p99_ms']:6.0f} / "
                  f"{b['peak_daemon_mb']:5.0f} | {a['throughput_fps']:6.1f} / {a['p99_ms']:6.0f} / "
                  f"{a['peak_daemon_mb']:5.0f} | thr {r['throughput']:.3f} p99 {r['p99']:.3f} "
                  f"mem {r['peak_memory']:.3f} {'MET' if p['met'] else 'NOT MET ' + str(p['checks'])}")
        print(f"  adaptive meets the bar in every phase: {verdict['adaptive_meets_bar_every_phase']}; "
              f"fixed depths that do: {verdict['fixed_depths_meeting_bar_every_phase'] or 'none'}")
    if "harsh_squeeze" in results:
        print("== harsh squeeze (80-120 s, other application 6.55 GB): fps / p99 / peak MB / OOM / rejected")
        for m, v in results["harsh_squeeze"]["modes"].items():
            print(f"  {m:9} {v['throughput_fps']:6.1f} / {v['p99_ms'] or float('nan'):6.0f} / "
                  f"{v['peak_daemon_mb'] or float('nan'):5.0f} / {v['oom_events']} / {v['rejected']}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} in {results['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
