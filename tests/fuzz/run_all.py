"""Run every fuzz target for a number of executions, in parallel processes, and summarize.

    nice -n 10 python tests/fuzz/run_all.py --runs 1000000 --out /tmp/cuvil-fuzz

Each target's executions are split over ``--procs`` processes (libFuzzer instances sharing one
corpus directory per target); ``summary.json`` in ``--out`` records executions per target, the
wall time, and every crash file found (libFuzzer's ``crash-*``/``timeout-*``/``oom-*``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("kserve_request", "http_protocol", "tegrastats", "bundle", "recipe", "state_file", "grpc_message")
# Relative cost of one execution (measured on one core): split processes accordingly.
WEIGHT = {"kserve_request": 1, "http_protocol": 2, "tegrastats": 6, "bundle": 4, "recipe": 2, "state_file": 1, "grpc_message": 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000, help="executions per target")
    ap.add_argument("--cores", type=int, default=2, help="processes in all, shared by weight")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-time", type=int, default=0, help="stop each process after this many seconds")
    ap.add_argument("--targets", default=",".join(TARGETS))
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    total_w = sum(WEIGHT[t] for t in targets)
    procs: list[tuple[str, Path, subprocess.Popen[bytes], int]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for target in targets:
        n = max(1, round(args.cores * WEIGHT[target] / total_w))
        corpus = args.out / f"corpus-{target}"
        artifacts = args.out / f"artifacts-{target}"
        artifacts.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            log = args.out / f"{target}-{i}.log"
            cmd = [sys.executable, str(HERE / f"fuzz_{target}.py"), str(corpus), f"-runs={args.runs // n}",
                   f"-seed={1000 + i}", "-max_len=16384", "-rss_limit_mb=4096", "-timeout=20",
                   f"-artifact_prefix={artifacts}/", "-print_final_stats=1"]
            if args.max_time:
                cmd.append(f"-max_total_time={args.max_time}")
            with open(log, "wb") as f:
                procs.append((target, log, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=args.out), i))
            if i == 0:
                time.sleep(2)  # the first process writes the seed corpus
    summary: dict[str, dict[str, object]] = {t: {"executions": 0, "processes": 0, "crashes": [], "exit_codes": []}
                                             for t in targets}
    for target, log, proc, _i in procs:
        code = proc.wait()
        text = log.read_text(errors="replace")
        runs = re.findall(r"stat::number_of_executed_units: (\d+)", text) or re.findall(r"Done (\d+) runs", text)
        s = summary[target]
        s["executions"] = int(s["executions"]) + (int(runs[-1]) if runs else 0)  # type: ignore[call-overload]
        s["processes"] = int(s["processes"]) + 1  # type: ignore[call-overload]
        s["exit_codes"].append(code)  # type: ignore[union-attr]
    for target in targets:
        found = sorted(p.name for p in (args.out / f"artifacts-{target}").iterdir())
        summary[target]["crashes"] = found
        summary[target]["corpus_files"] = len(list((args.out / f"corpus-{target}").iterdir()))
    result = {"runs_goal_per_target": args.runs, "wall_s": round(time.time() - t0, 1), "cores": args.cores,
              "python": sys.version.split()[0], "targets": summary}
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if all(not s["crashes"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
