"""The TensorRT backend's own I/O code on a real GPU: IOSlot + run_slot + ScratchArena + PyCudaOps.

TensorRT is not available on the machines we have, so a one-line CUDA kernel (``y = 2 x``, via
pycuda's SourceModule) stands in for ``execute_async_v3``: it reads and writes the very device
addresses ``run_slot`` binds with ``set_tensor_address``, on the slot's stream. Everything else
is cuvil-edge's code as the daemon runs it: mapped zero-copy host buffers
(``pagelocked_empty(..., mem_flags=host_alloc_flags.DEVICEMAP)`` + ``get_device_pointer``),
pinned host + device buffers with async copies, the shared scratch arena, result copies.

For each placement and batch it checks the result against numpy and measures the latency of one
request through that path (median and p90 over repeated calls), beside the peer a plain numpy
user would write (``cuda.to_device`` / ``memcpy_dtoh`` from pageable memory, synchronous).

    python bench/bench_trt_io.py --name trt_io_h200     # needs a GPU, CUDA and pycuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

KERNEL = """
__global__ void scale2(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        y[i] = 2.0f * x[i];
}
"""


class KernelContext:
    """Stands in for a TensorRT execution context (not TensorRT): records the bound addresses and
    shapes, and on ``execute_async_v3`` runs ``y = 2 x`` on them with a CUDA kernel."""

    def __init__(self, func, stream):
        self.func, self.stream = func, stream
        self.shapes, self.addr, self.scratch = {}, {}, None

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name, ptr):
        self.addr[name] = int(ptr)

    def set_device_memory(self, ptr, size):
        self.scratch = (ptr, size)

    def get_tensor_shape(self, name):
        return self.shapes["x"]

    def execute_async_v3(self, handle):
        assert handle == int(self.stream.handle)
        n = int(np.prod(self.shapes["x"]))
        blocks = min(4096, (n + 255) // 256)
        self.func(np.uintp(self.addr["x"]), np.uintp(self.addr["y"]), np.int64(n),
                  block=(256, 1, 1), grid=(blocks, 1), stream=self.stream)
        return True


def _stats(samples_ms):
    s = sorted(samples_ms)
    return {"median_ms": round(statistics.median(s), 4), "p90_ms": round(s[int(0.9 * (len(s) - 1))], 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="trt_io")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args(argv)

    import pycuda.autoinit  # noqa: F401 - creates and pushes the context
    import pycuda.driver as cuda
    from pycuda.compiler import SourceModule

    from cuvil_edge.runtime.buffers import Placement, host_allocator
    from cuvil_edge.runtime.trt import (
        IOSlot,
        PyCudaOps,
        ScratchArena,
        TensorBinding,
        choose_placement,
        run_slot,
    )

    dev = cuda.Context.get_device()
    integrated = bool(dev.get_attribute(cuda.device_attribute.INTEGRATED))
    func = SourceModule(KERNEL).get_function("scale2")
    ops = PyCudaOps()
    arena = ScratchArena(ops, slots=2)
    arena.register("bench", 8 << 20)
    result = {
        "device": dev.name(), "sm": "{}.{}".format(*dev.compute_capability()), "integrated": integrated,
        "placement_chosen": choose_placement(integrated), "pycuda": getattr(__import__("pycuda"), "VERSION_TEXT", "?"),
        "reps": args.reps, "command": f"python bench/bench_trt_io.py --name {args.name}", "cases": [],
    }
    rng = np.random.default_rng(0)

    def set_mem(ctx, ptr, size):
        ctx.set_device_memory(ptr, size)

    for batch in (1, 8):
        shape = (batch, 3, 224, 224)
        x = rng.standard_normal(shape, dtype=np.float32)
        bindings = [TensorBinding("x", np.dtype(np.float32), (8, 3, 224, 224), True),
                    TensorBinding("y", np.dtype(np.float32), (8, 3, 224, 224), False)]
        case = {"shape": list(shape), "bytes": int(x.nbytes)}
        for placement in (Placement.MAPPED, Placement.PINNED):
            slot = IOSlot(bindings, placement, ops)
            ctx = KernelContext(func, slot.stream)
            # "numpy": the request arrives as a plain array and is staged into the slot;
            # "pool": the batcher assembled it in a BufferPool of the same placement
            # (runtime.buffers.host_allocator), which run_slot uses in place.
            pooled = host_allocator(placement)(shape, np.dtype(np.float32))
            pooled[...] = x
            for feed_kind, feed in (("numpy", x), ("pool", pooled)):
                copies0 = slot.host_copies
                out = run_slot(ctx, slot, {"x": feed}, arena, set_mem)
                ok = bool(np.array_equal(out["y"], 2 * x))
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    run_slot(ctx, slot, {"x": feed}, arena, set_mem)
                    times.append((time.perf_counter() - t0) * 1e3)
                case[f"{placement}_{feed_kind}"] = {
                    "correct": ok, "input_staging_copies_per_request": (slot.host_copies - copies0) / (args.reps + 1),
                    "input_bound_to_host_alias": ctx.addr["x"] != slot.device["x"], **_stats(times)}
            slot.release()
        # Peer: what a numpy user writes without placement (pageable, synchronous copies).
        d_x, d_y = cuda.mem_alloc(x.nbytes), cuda.mem_alloc(x.nbytes)
        times = []
        y = np.empty_like(x)
        for i in range(args.reps + 1):
            t0 = time.perf_counter()
            cuda.memcpy_htod(d_x, x)
            func(d_x, d_y, np.int64(x.size), block=(256, 1, 1), grid=(min(4096, (x.size + 255) // 256), 1))
            cuda.memcpy_dtoh(y, d_y)
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        case["pageable_peer"] = {"correct": bool(np.array_equal(y, 2 * x)), **_stats(times)}
        result["cases"].append(case)
    result["scratch_reserved_bytes"] = arena.reserved_bytes
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{args.name}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    print(json.dumps(result, indent=2))
    keys = ("mapped_numpy", "mapped_pool", "pinned_numpy", "pinned_pool", "pageable_peer")
    return 0 if all(c[k]["correct"] for c in result["cases"] for k in keys) else 1


if __name__ == "__main__":
    sys.exit(main())
