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

``--compare-bindings`` measures the same I/O path with the two Python CUDA bindings the ``jetson``
extra could carry, to decide between them: pycuda (``PyCudaOps``, what the runtime uses) and
NVIDIA's cuda-python (``cuda.bindings.runtime``, what TensorRT 10's samples use), through
:class:`CudaPythonOps` below, a candidate implementation of the same ``DeviceOps`` protocol. Both
run in CUDA's primary context and the stand-in kernel is launched by CuPy on the slot's stream,
so only the binding differs. Measured per binding: pinned and pageable host<->device copies with
the stream sync, an idle stream sync (the per-call cost), a pinned allocation and its free, the
whole ``run_slot`` path per placement, whether ``synchronize`` releases the GIL (a Python thread
counts while the stream waits on a 20 ms kernel), and the import time in a fresh interpreter.

    python bench/bench_trt_io.py --compare-bindings --name cuda_binding_h200   # GPU, pycuda, cuda-python, CuPy
"""

from __future__ import annotations

import argparse
import json
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


class CudaPythonOps:
    """``DeviceOps`` with NVIDIA's cuda-python (``cuda.bindings.runtime``): the candidate the binding
    comparison measures against ``PyCudaOps`` (bench only; the runtime uses pycuda)."""

    def __init__(self):
        import weakref

        from cuda.bindings import runtime as rt

        self.rt, self._finalize = rt, weakref.finalize
        self._host = {}  # base address -> (nbytes, device pointer or None)
        self._ck(rt.cudaFree(0))  # the runtime binds the primary context

    def _ck(self, res):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"cuda-python: {err}")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    def alloc_host(self, shape, dtype, mapped):
        import ctypes

        rt = self.rt
        count = int(np.prod(shape, dtype=np.int64))
        n = max(1, count * np.dtype(dtype).itemsize)
        ptr = int(self._ck(rt.cudaHostAlloc(n, rt.cudaHostAllocMapped if mapped else rt.cudaHostAllocDefault)))
        dev = int(self._ck(rt.cudaHostGetDevicePointer(ptr, 0))) if mapped else None
        buf = (ctypes.c_char * n).from_address(ptr)
        self._host[ptr] = (n, dev)
        self._finalize(buf, self._free_host, ptr)
        return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)

    def _free_host(self, ptr):
        self._host.pop(ptr, None)
        self.rt.cudaFreeHost(ptr)

    def _root(self, arr):
        addr = arr.ctypes.data
        for base, (n, dev) in self._host.items():
            if base <= addr < base + n:
                return base, dev
        return None

    def device_alias(self, host):
        return self.pagelocked_alias(host)

    def pagelocked_alias(self, arr):
        root = self._root(arr)
        if root is None or root[1] is None:
            return None
        return root[1] + (arr.ctypes.data - root[0])

    def is_pagelocked(self, arr):
        return self._root(arr) is not None

    def alloc_device(self, nbytes):
        return int(self._ck(self.rt.cudaMalloc(max(1, int(nbytes)))))

    def free_device(self, ptr):
        self._ck(self.rt.cudaFree(ptr))

    def htod_async(self, dst, src, stream):
        self._ck(self.rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes,
                                         self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))

    def dtoh_async(self, dst, src, stream):
        self._ck(self.rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes,
                                         self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream))

    def new_stream(self):
        return self._ck(self.rt.cudaStreamCreate())

    def stream_handle(self, stream):
        return int(stream)

    def synchronize(self, stream):
        self._ck(self.rt.cudaStreamSynchronize(stream))


SLEEP_KERNEL = """
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""


class CupyKernelContext(KernelContext):
    """:class:`KernelContext` whose ``y = 2 x`` is a CuPy kernel on the slot's stream (either binding)."""

    def __init__(self, kernel, ops, stream):
        super().__init__(kernel, stream)
        self.ops = ops

    def execute_async_v3(self, handle):
        import cupy

        assert handle == self.ops.stream_handle(self.stream)
        n = int(np.prod(self.shapes["x"]))
        with cupy.cuda.ExternalStream(handle):
            self.func((min(4096, (n + 255) // 256),), (256,), (np.uintp(self.addr["x"]), np.uintp(self.addr["y"]),
                                                              np.int64(n)))
        return True


def _binding_case(name, ops, reps, rng):
    """One binding's figures (see the module docstring)."""
    import subprocess
    import threading

    import cupy

    from cuvil_edge.runtime.buffers import Placement
    from cuvil_edge.runtime.trt import IOSlot, ScratchArena, TensorBinding, run_slot

    kernel = cupy.RawKernel(KERNEL.replace("__global__", 'extern "C" __global__'), "scale2")
    spin = cupy.RawKernel(SLEEP_KERNEL, "spin")
    out = {"binding": name, "copies": [], "run_slot": []}
    stream = ops.new_stream()

    def timed(fn, n=reps):
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return _stats(times)

    for nbytes in (602112, 4816896):
        count = nbytes // 4
        pinned = ops.alloc_host((count,), np.dtype(np.float32), False)
        pinned[...] = rng.standard_normal(count, dtype=np.float32)
        pageable = np.array(pinned)
        back = ops.alloc_host((count,), np.dtype(np.float32), False)
        dev = ops.alloc_device(nbytes)

        def htod(src=pinned, dev=dev):
            ops.htod_async(dev, src, stream)
            ops.synchronize(stream)

        def dtoh(back=back, dev=dev):
            ops.dtoh_async(back, dev, stream)
            ops.synchronize(stream)

        row = {"bytes": nbytes, "htod_pinned_sync": timed(htod), "htod_pageable_sync": timed(lambda p=pageable: htod(p)),
               "dtoh_pinned_sync": timed(dtoh)}
        row["roundtrip_correct"] = bool(np.array_equal(back, pinned))
        row["htod_pinned_GBps"] = round(nbytes / row["htod_pinned_sync"]["median_ms"] / 1e6, 2)
        row["dtoh_pinned_GBps"] = round(nbytes / row["dtoh_pinned_sync"]["median_ms"] / 1e6, 2)
        ops.free_device(dev)
        out["copies"].append(row)
    out["idle_stream_sync"] = timed(lambda: ops.synchronize(stream), reps * 5)
    out["alloc_free_pinned_4.8MB"] = timed(lambda: ops.alloc_host((1204224,), np.dtype(np.float32), False), 50)

    # GIL: a Python thread counts while the main thread waits on a 20 ms kernel.
    rate = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrClockRate, 0) * 1000  # Hz
    counted, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    handle = ops.stream_handle(stream)
    with cupy.cuda.ExternalStream(handle):
        spin((1,), (1,), (np.int64(rate * 0.02),))
    ops.synchronize(stream)
    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    c0 = counted[0]
    t0 = time.perf_counter()
    with cupy.cuda.ExternalStream(handle):
        spin((1,), (1,), (np.int64(rate * 0.02),))
    ops.synchronize(stream)
    waited = time.perf_counter() - t0
    during = counted[0] - c0
    time.sleep(waited)
    free_rate = (counted[0] - c0 - during) / waited
    stop.set()
    t.join()
    out["gil_during_sync"] = {"wait_ms": round(waited * 1e3, 2), "counter_increments": during,
                              "free_running_increments_same_span": round(free_rate * waited),
                              "releases_gil": bool(during > 0.2 * free_rate * waited)}

    arena = ScratchArena(ops, slots=2)
    arena.register("bench", 8 << 20)
    for batch in (1, 8):
        shape = (batch, 3, 224, 224)
        x = rng.standard_normal(shape, dtype=np.float32)
        bindings = [TensorBinding("x", np.dtype(np.float32), (8, 3, 224, 224), True),
                    TensorBinding("y", np.dtype(np.float32), (8, 3, 224, 224), False)]
        case = {"shape": list(shape)}
        for placement in (Placement.MAPPED, Placement.PINNED):
            slot = IOSlot(bindings, placement, ops)
            ctx = CupyKernelContext(kernel, ops, slot.stream)
            pooled = ops.alloc_host(shape, np.dtype(np.float32), placement == Placement.MAPPED)
            pooled[...] = x
            for feed_kind, feed in (("numpy", x), ("pool", pooled)):
                got = run_slot(ctx, slot, {"x": feed}, arena, lambda c, p, n: c.set_device_memory(p, n))
                ok = bool(np.array_equal(got["y"], 2 * x))
                case[f"{placement}_{feed_kind}"] = {"correct": ok, **timed(
                    lambda f=feed, c=ctx, s=slot: run_slot(c, s, {"x": f}, arena,
                                                           lambda k, p, n: k.set_device_memory(p, n)))}
            slot.release()
        out["run_slot"].append(case)
    mod = {"pycuda": "import pycuda.driver as d; d.init()", "cuda-python": "from cuda.bindings import runtime as r"}
    code = f"import time; t=time.perf_counter(); {mod[name]}; print((time.perf_counter()-t)*1e3)"
    imports = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
               for _ in range(5)]
    out["import_ms_median_of_5"] = round(statistics.median(imports), 1)
    return out


def compare_bindings(args) -> int:
    import cupy
    import pycuda.driver as cuda

    cuda.init()
    primary = cuda.Device(0).retain_primary_context()
    primary.push()  # pycuda in CUDA's primary context, where CuPy and cuda-python work too
    try:
        from cuda import bindings as cuda_bindings

        from cuvil_edge.runtime.trt import PyCudaOps

        rng = np.random.default_rng(0)
        result = {"device": cuda.Device(0).name(), "cupy": cupy.__version__,
                  "pycuda": getattr(__import__("pycuda"), "VERSION_TEXT", "?"),
                  "cuda_python": getattr(cuda_bindings, "__version__", "?"), "python": sys.version.split()[0],
                  "reps": args.reps, "command": f"python bench/bench_trt_io.py --compare-bindings --name {args.name}",
                  "bindings": [_binding_case("pycuda", PyCudaOps(), args.reps, rng),
                               _binding_case("cuda-python", CudaPythonOps(), args.reps, rng)]}
    finally:
        primary.pop()
    _save(result, args.out_dir / f"{args.name}.json")
    ok = all(r["roundtrip_correct"] for b in result["bindings"] for r in b["copies"]) and all(
        v["correct"] for b in result["bindings"] for c in b["run_slot"] for k, v in c.items() if k != "shape")
    return 0 if ok else 1


def _save(result: dict, out: Path) -> None:
    """Writes the result durably (the project's atomic write) and prints it."""
    from cuvil_edge._atomic import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _stats(samples_ms):
    s = sorted(samples_ms)
    return {"median_ms": round(statistics.median(s), 4), "p90_ms": round(s[int(0.9 * (len(s) - 1))], 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="trt_io")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--compare-bindings", action="store_true", help="pycuda against cuda-python (module docstring)")
    args = ap.parse_args(argv)
    if args.compare_bindings:
        return compare_bindings(args)

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
    _save(result, args.out_dir / f"{args.name}.json")
    keys = ("mapped_numpy", "mapped_pool", "pinned_numpy", "pinned_pool", "pageable_peer")
    return 0 if all(c[k]["correct"] for c in result["cases"] for k in keys) else 1


if __name__ == "__main__":
    sys.exit(main())
