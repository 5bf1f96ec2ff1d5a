"""STAND-IN for the TensorRT builder (``trtexec``), for machines without TensorRT. NOT TensorRT.

TensorRT cannot be installed on the machines this project is developed and tested on, so the
one step that needs it, turning ``model.onnx`` into a serialized engine, goes through this
executable when ``cuvil-edge engine build --builder standin`` asks for it. It behaves the way
``trtexec --onnx=M --saveEngine=E --timingCacheFile=T`` does from the outside: it takes the same
flags, parses the ONNX file, prints a builder log line by line over a few seconds (so live
progress and Ctrl-C can be tested), writes the engine file and updates the timing cache, and
ends with trtexec's ``&&&& PASSED`` / ``&&&& FAILED`` line and exit status.

The "engine" it writes is not a TensorRT plan: it is :data:`STANDIN_MAGIC`, one JSON header line
(key, model sha256, flags, and a note saying what it is) and the ONNX bytes. Only the stand-in
runtime (``cuvil_edge.runtime.trt_standin``, which runs those ONNX bytes with ONNX Runtime and
reports itself as ``tensorrt-standin``) loads it; real TensorRT rejects it. Every log line says
``STAND-IN``. The file format lives beside that runtime (:mod:`cuvil_edge.runtime.standin_plan`,
so the runtime does not import the packager); this module re-exports it and is the executable.

    python -m cuvil_edge.packager.engine_standin --onnx=model.onnx --saveEngine=e.plan \\
        --timingCacheFile=timing.cache --fp16 --standin-tensorrt=10.3.0 --standin-seconds=2
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from cuvil_edge.runtime.standin_plan import STANDIN_MAGIC, read_standin_plan, standin_plan_bytes

__all__ = ["STANDIN_MAGIC", "main", "read_standin_plan", "standin_plan_bytes"]



def _parse(argv: list[str]) -> dict[str, str | bool]:
    opts: dict[str, str | bool] = {}
    for arg in argv:
        if not arg.startswith("--"):
            raise SystemExit(f"[E] Unknown argument: {arg}")
        name, eq, value = arg[2:].partition("=")
        opts[name] = value if eq else True
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run as trtexec would; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = _parse(argv)
    trt = str(opts.get("standin-tensorrt") or "10.3.0")
    tag = "".join(f"{int(p):02d}" for p in (trt.split(".") + ["0", "0"])[:3])
    seconds = float(opts.get("standin-seconds") or 2.0)
    cmd = "trtexec " + " ".join(a for a in argv if not a.startswith("--standin"))
    t0 = time.monotonic()

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"&&&& RUNNING TensorRT.trtexec [TensorRT v{tag}] [STAND-IN, not TensorRT] # {cmd}")
    onnx_path = opts.get("onnx")
    out_path = opts.get("saveEngine")
    if not isinstance(onnx_path, str) or not isinstance(out_path, str):
        say("[E] --onnx=FILE and --saveEngine=FILE are required")
        say(f"&&&& FAILED TensorRT.trtexec [TensorRT v{tag}] [STAND-IN] # {cmd}")
        return 1
    try:
        onnx = Path(onnx_path).read_bytes()
        import onnx as onnx_mod

        model = onnx_mod.load_model_from_string(onnx)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the builder's failure
        say(f"[E] [TRT] ModelImporter.cpp: Failed to parse ONNX model from file: {onnx_path} ({exc})")
        say(f"&&&& FAILED TensorRT.trtexec [TensorRT v{tag}] [STAND-IN] # {cmd}")
        return 1
    say("[I] === Model Options ===")
    say(f"[I] Format: ONNX  Model: {onnx_path}")
    say("[I] === Build Options ===")
    flags = [f for f in ("fp16", "int8", "stronglyTyped", "best") if opts.get(f)]
    say(f"[I] Precision: {'FP32+' + '+'.join(flags) if flags else 'FP32'}  memPoolSize: "
        f"{opts.get('memPoolSize', 'default')}  timingCacheFile: {opts.get('timingCacheFile', '-')}")
    say(f"[I] [TRT] ONNX IR version: {model.ir_version}  Opset version: "
        f"{max((o.version for o in model.opset_import), default=0)}  Producer: {model.producer_name or '-'}")
    nodes = list(model.graph.node)
    say(f"[I] Finished parsing network model. Parse time: {time.monotonic() - t0:.5f} (STAND-IN)")
    say("[I] [TRT] Local timing cache in use. Profiling results in this builder pass will be stored.")
    steps = max(1, min(len(nodes), 20))
    for i in range(steps):
        time.sleep(seconds / steps)
        node = nodes[i * len(nodes) // steps] if nodes else None
        op = f"{node.op_type} {node.name or ''}".strip() if node else "-"
        say(f"[V] [TRT] [STAND-IN] Timing layer {i + 1}/{steps}: {op}")
    header = {"tensorrt": trt, "flags": flags, "builder": "standin"}
    if opts.get("standin-key"):
        header["key"] = str(opts["standin-key"])
    data = standin_plan_bytes(onnx, header)
    tmp = f"{out_path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, out_path)
    cache = opts.get("timingCacheFile")
    if isinstance(cache, str):
        try:
            entries = json.loads(Path(cache).read_text()).get("entries", 0) if Path(cache).is_file() else 0
        except (OSError, ValueError):
            entries = 0
        Path(cache).write_text(json.dumps({"standin": True, "entries": entries + len(nodes)}))
    say(f"[I] [TRT] Engine generation completed in {time.monotonic() - t0:.3f} seconds. (STAND-IN)")
    say(f"[I] Engine built in {time.monotonic() - t0:.3f} sec.")
    say(f"[I] Saved engine to {out_path}")
    say(f"&&&& PASSED TensorRT.trtexec [TensorRT v{tag}] [STAND-IN, not TensorRT] # {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
