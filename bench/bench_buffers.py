"""I/O buffer placement on a real GPU: pageable vs pinned (+ async copies) vs mapped zero-copy.

Checks the three placements cuvil-edge chooses between (``cuvil_edge.runtime.buffers`` /
``runtime.trt.choose_placement``: mapped on integrated GPUs, pinned on discrete ones) with the
CUDA runtime calls they map to, and measures them. Compiles ``bench_buffers.cu`` with ``nvcc``
(no TensorRT, pycuda or CuPy needed), runs it, adds what the placement policy picks for the
device it ran on, and writes ``bench/results/<name>.json``.

    python bench/bench_buffers.py --name buffers_h200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="buffers", help="result name: bench/results/<name>.json")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--from-raw", type=Path, help="post-process the JSON bench_buffers.cu printed on a GPU machine")
    args = ap.parse_args(argv)
    if args.from_raw:
        data = json.loads(args.from_raw.read_text())
    else:
        if not Path(args.nvcc).exists():
            print(f"nvcc not found ({args.nvcc}): this benchmark needs a CUDA toolkit and a GPU", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            exe = Path(tmp) / "bench_buffers"
            cmd = [args.nvcc, "-O2", "-std=c++17", "-o", str(exe), str(HERE / "bench_buffers.cu")]
            subprocess.run(cmd, check=True)
            data = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
        data["nvcc"] = subprocess.run([args.nvcc, "--version"], capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]
    sys.path.insert(0, str(HERE.parent))
    from cuvil_edge.runtime.trt import choose_placement

    data["placement_chosen"] = choose_placement(bool(data["integrated"]))
    data.setdefault("command", f"python bench/bench_buffers.py --name {args.name}")
    for case in data["cases"]:
        trip = case["round_trip_ms"]
        case["fastest"] = min(trip, key=trip.get)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{args.name}.json"
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp_out, out)
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
