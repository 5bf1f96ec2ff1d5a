"""Benchmark of the cuvil_edge.sve kernels.

Host: wall time of each op on realistic sizes (a 1920x1080 frame to a 3x640x640 letterboxed or
3x224x224 tensor, 80 classes x 8400 boxes NMS, ...) against numpy and OpenCV measured in the same
run, plus a memcpy of the output bytes as the bandwidth bound. Repeats are interleaved across
implementations and the minimum is reported (the machine is shared), medians kept beside it.

aarch64: dynamic instruction counts of one call under qemu-aarch64 with QEMU's ``insn`` TCG
plugin (hil/build_insn_plugin.sh), per ISA and SVE vector length: the count of
``cuvil_sve_bench OP 1`` minus ``cuvil_sve_bench OP 0``. Counts are exact and repeatable; they
are not time.

    .venv/bin/python bench/bench_kernels.py [--skip-host] [--skip-aarch64] [--repeats N]

Writes bench/results/kernels.json and bench/results/kernels.png.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuvil_edge import sve  # noqa: E402
from hil import qemu_user  # noqa: E402

F32 = np.float32
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)


# --------------------------------------------------------------------------- numpy peers
def np_normalize(img, mean, std, dtype=F32):
    m = np.asarray(mean, F32)
    inv = (F32(1) / np.asarray(std, F32)).astype(F32)
    return np.ascontiguousarray(((img[..., ::-1].astype(F32) - m) * inv).transpose(2, 0, 1).astype(dtype))


def _coords(n_in, n_out):
    s = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    i = np.minimum(np.floor(s).astype(np.int64), max(n_in - 2, 0))
    w = (s - i).astype(F32)
    return i, F32(1) - w, w


def np_resize_normalize(img, size, mean, std, letterbox):
    h, w, _ = img.shape
    dh, dw = size
    lb = sve.letterbox_rect((h, w), size) if letterbox else sve.Letterbox(1.0, 0, 0, dw, dh)
    m = np.broadcast_to(np.asarray(mean, F32), (3,))
    inv = (F32(1) / np.broadcast_to(np.asarray(std, F32), (3,))).astype(F32)
    out = np.empty((3, dh, dw), F32)
    out[:] = ((F32(114) - m) * inv)[:, None, None]
    yi, wy0, wy1 = _coords(h, lb.h)
    xi, wx0, wx1 = _coords(w, lb.w)
    r0 = img[yi][:, np.concatenate([xi, xi + 1])].astype(F32)
    r1 = img[yi + 1][:, np.concatenate([xi, xi + 1])].astype(F32)
    t = r0 * wy0[:, None, None] + r1 * wy1[:, None, None]
    v = t[:, :lb.w] * wx0[None, :, None] + t[:, lb.w:] * wx1[None, :, None]
    out[:, lb.y:lb.y + lb.h, lb.x:lb.x + lb.w] = ((v[..., ::-1] - m) * inv).transpose(2, 0, 1)
    return out


def np_quantize(x, s):
    return np.clip(np.rint(x / F32(s)), -128, 127).astype(np.int8)


def np_softmax_topk(x, k):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    idx = np.argpartition(-p, k, axis=1)[:, :k]
    part = np.take_along_axis(p, idx, 1)
    order = np.argsort(-part, axis=1, kind="stable")
    return np.take_along_axis(part, order, 1), np.take_along_axis(idx, order, 1)


def np_decode(raw, thr):
    scores = raw[4:]
    best = scores.max(axis=0)
    cls = scores.argmax(axis=0)
    keep = np.nonzero(best > thr)[0]
    return raw[:4, keep].T, best[keep], cls[keep], keep


def np_nms(raw, thr=0.25, iou_thr=0.45, max_det=300):
    """Returns the kept input box indices, in descending score order."""
    b, s, c, idx = np_decode(raw, thr)
    order = np.argsort(-s, kind="stable")
    b, s, c, idx = b[order], s[order], c[order], idx[order]
    x1, y1 = b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2
    x2, y2 = b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2
    area = (x2 - x1) * (y2 - y1)
    supp = np.zeros(len(s), bool)
    keep = []
    for i in range(len(s)):
        if supp[i]:
            continue
        keep.append(i)
        if len(keep) >= max_det:
            break
        iw = np.maximum(np.minimum(x2[i], x2[i + 1:]) - np.maximum(x1[i], x1[i + 1:]), 0)
        ih = np.maximum(np.minimum(y2[i], y2[i + 1:]) - np.maximum(y1[i], y1[i + 1:]), 0)
        inter = iw * ih
        iou = inter / (area[i] + area[i + 1:] - inter)
        supp[i + 1:] |= (iou > np.float32(iou_thr)) & (c[i + 1:] == c[i])
    return idx[keep]


def yolo_output(rng, n=8400, c=80, objects=60):
    """A YOLOv8-like raw output (4 + C, N): noise scores plus objects seen by several anchors."""
    raw = np.empty((4 + c, n), F32)
    raw[0:2] = rng.uniform(0, 640, (2, n))
    raw[2:4] = rng.uniform(10, 110, (2, n))
    raw[4:] = rng.uniform(0, 0.05, (c, n))
    for _ in range(objects):
        cx, cy, w, h = rng.uniform(0, 640), rng.uniform(0, 640), rng.uniform(20, 120), rng.uniform(20, 120)
        cls = rng.integers(0, c)
        idx = rng.choice(n, 12, replace=False)
        raw[0, idx] = cx + rng.uniform(0, 6, 12)
        raw[1, idx] = cy + rng.uniform(0, 6, 12)
        raw[2, idx] = w * rng.uniform(0.9, 1.1, 12)
        raw[3, idx] = h * rng.uniform(0.9, 1.1, 12)
        raw[4 + cls, idx] = rng.uniform(0.3, 1.0, 12)
    return raw


# --------------------------------------------------------------------------- host timing
def _time(fns: dict, repeats: int) -> dict:
    for f in fns.values():
        f()  # warm up
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():  # interleaved so load spikes hit every implementation
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return {k: {"min_ms": 1e3 * min(v), "median_ms": 1e3 * float(np.median(v))} for k, v in samples.items()}


def host_bench(repeats: int) -> dict:
    import cv2

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (1080, 1920, 3), np.uint8)  # BGR, as a camera hands it over
    cv_threads = cv2.getNumThreads()
    cases = {}

    def ours(fn, *a, threads=1, **kw):
        def run():
            sve.set_num_threads(threads)
            fn(*a, **kw)
        return run

    def cv1(fn):
        def run():
            cv2.setNumThreads(1)
            fn()
            cv2.setNumThreads(cv_threads)
        return run

    def memcpy_of(nbytes):
        a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        return lambda: np.copyto(b, a)

    # normalize: BGR frame -> RGB float32 CHW, ImageNet mean/std. OpenCV's blobFromImage takes one
    # scale factor, so its run uses std 57.375 for all channels (same work).
    o32 = np.empty((3, 1080, 1920), F32)
    o16 = np.empty((3, 1080, 1920), np.float16)
    blob_norm = lambda: cv2.dnn.blobFromImage(frame, 1 / 57.375, (1920, 1080), MEAN, swapRB=True)  # noqa: E731
    cases["normalize_f32 1920x1080"] = _time({
        "cuvil": ours(sve.normalize, frame, MEAN, STD, swap_rb=True, out=o32),
        "cuvil_threads2": ours(sve.normalize, frame, MEAN, STD, swap_rb=True, out=o32, threads=2),
        "numpy": lambda: np_normalize(frame, MEAN, STD),
        "opencv": blob_norm,
        "opencv_threads1": cv1(blob_norm),
        "memcpy": memcpy_of(o32.nbytes),
    }, repeats)
    cases["normalize_f16 1920x1080"] = _time({
        "cuvil": ours(sve.normalize, frame, MEAN, STD, swap_rb=True, dtype=np.float16, out=o16),
        "cuvil_threads2": ours(sve.normalize, frame, MEAN, STD, swap_rb=True, dtype=np.float16, out=o16,
                               threads=2),
        "numpy": lambda: np_normalize(frame, MEAN, STD, np.float16),
        "memcpy": memcpy_of(o16.nbytes),
    }, repeats)

    # resize_normalize: YOLO letterbox 640x640 (/255, pad 114) and ImageNet 224x224 stretch.
    o640 = np.empty((3, 640, 640), F32)

    def cv_letterbox():
        small = cv2.resize(frame, (640, 360), interpolation=cv2.INTER_LINEAR)
        padded = cv2.copyMakeBorder(small, 140, 140, 0, 0, cv2.BORDER_CONSTANT, value=(114, 114, 114))
        return cv2.dnn.blobFromImage(padded, 1 / 255, (640, 640), (0, 0, 0), swapRB=True)

    cases["resize_normalize 1920x1080->640x640 letterbox"] = _time({
        "cuvil": ours(sve.resize_normalize, frame, (640, 640), 0, 255, swap_rb=True, letterbox=True, out=o640),
        "cuvil_threads2": ours(sve.resize_normalize, frame, (640, 640), 0, 255, swap_rb=True, letterbox=True,
                               out=o640, threads=2),
        "numpy": lambda: np_resize_normalize(frame, (640, 640), 0, 255, True),
        "opencv": cv_letterbox,
        "opencv_threads1": cv1(cv_letterbox),
        "memcpy": memcpy_of(o640.nbytes),
    }, repeats)
    o224 = np.empty((3, 224, 224), F32)
    blob224 = lambda: cv2.dnn.blobFromImage(frame, 1 / 57.375, (224, 224), MEAN, swapRB=True)  # noqa: E731
    cases["resize_normalize 1920x1080->224x224"] = _time({
        "cuvil": ours(sve.resize_normalize, frame, (224, 224), MEAN, STD, swap_rb=True, out=o224),
        "cuvil_threads2": ours(sve.resize_normalize, frame, (224, 224), MEAN, STD, swap_rb=True, out=o224,
                               threads=2),
        "numpy": lambda: np_resize_normalize(frame, (224, 224), MEAN, STD, False),
        "opencv": blob224,
        "opencv_threads1": cv1(blob224),
        "memcpy": memcpy_of(o224.nbytes),
    }, repeats)

    # quantize / dequantize: a 3x640x640 activation, per tensor. OpenCV has no int8 QuantizeLinear.
    x = rng.uniform(-3, 3, (3, 640, 640)).astype(F32)
    q = np.empty(x.shape, np.int8)
    y = np.empty(x.shape, F32)
    cases["quantize 3x640x640"] = _time({
        "cuvil": ours(sve.quantize, x, 0.02, out=q),
        "cuvil_threads2": ours(sve.quantize, x, 0.02, out=q, threads=2),
        "numpy": lambda: np_quantize(x, 0.02),
        "memcpy": memcpy_of(x.nbytes),
    }, repeats)
    cases["dequantize 3x640x640"] = _time({
        "cuvil": ours(sve.dequantize, q, 0.02, out=y),
        "cuvil_threads2": ours(sve.dequantize, q, 0.02, out=y, threads=2),
        "numpy": lambda: q.astype(F32) * F32(0.02),
        "memcpy": memcpy_of(y.nbytes),
    }, repeats)

    # softmax_topk: 8 x 1000 ImageNet logits, top 5. OpenCV has no softmax outside a dnn Net.
    logits = rng.uniform(-10, 10, (8, 1000)).astype(F32)
    cases["softmax_topk 8x1000 k=5"] = _time({
        "cuvil": lambda: sve.softmax_topk(logits, 5),
        "numpy": lambda: np_softmax_topk(logits, 5),
    }, repeats * 5)

    # nms: YOLOv8 (84, 8400) raw output, per-class NMS. OpenCV's NMSBoxesBatched needs the
    # per-box best score and class first (numpy), which is part of its pipeline here.
    raw = yolo_output(rng)

    def cv_nms():
        b, s, c, _ = np_decode(raw, 0.25)
        xywh = np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 2], b[:, 3]], 1)
        return cv2.dnn.NMSBoxesBatched(xywh.tolist(), s.tolist(), c.tolist(), 0.25, 0.45, top_k=300)

    cases["nms 80x8400"] = _time({
        "cuvil": lambda: sve.nms(raw[:4].T, raw[4:].T, score_threshold=0.25, iou_threshold=0.45,
                                 max_detections=300),
        "numpy": lambda: np_nms(raw),
        "opencv": cv_nms,
    }, repeats * 2)
    sve.set_num_threads(1)
    det = sve.nms(raw[:4].T, raw[4:].T, score_threshold=0.25, iou_threshold=0.45, max_detections=300)
    agree = det.indices.tolist() == np_nms(raw).tolist()

    goals = {}
    for name, r in cases.items():
        best = min(r["cuvil"]["min_ms"], r.get("cuvil_threads2", r["cuvil"])["min_ms"])
        # Each peer at its best configuration (OpenCV: default threads or one thread).
        peers = {"numpy": r["numpy"]["min_ms"]}
        if "opencv" in r:
            peers["opencv"] = min(r["opencv"]["min_ms"], r.get("opencv_threads1", r["opencv"])["min_ms"])
        goals[name] = {"cuvil_best_ms": best, "cuvil_single_thread_ms": r["cuvil"]["min_ms"]}
        goals[name].update({f"faster_than_{p}": best < v for p, v in peers.items()})
        goals[name].update({f"speedup_vs_{p}": v / best for p, v in peers.items()})
        if name.startswith("normalize") and "memcpy" in r:
            goals[name]["vs_memcpy"] = r["cuvil"]["min_ms"] / r["memcpy"]["min_ms"]
            goals[name]["within_2x_memcpy"] = goals[name]["vs_memcpy"] <= 2.0
    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "numpy": np.__version__, "opencv": cv2.__version__, "opencv_threads": cv_threads},
        "library": sve.cpu_info(),
        "cases": cases,
        "nms_agrees_with_numpy": agree,
        "goals": goals,
    }


# --------------------------------------------------------------------------- aarch64 counts
AARCH64_OPS = ("normalize_f32", "normalize_f16", "resize_640_letterbox", "resize_224", "quantize", "dequantize",
               "softmax_topk", "nms")
CONFIGS = [("scalar", "neoverse-n1", 0), ("neon", "neoverse-n1", 0)] + [
    (isa, f"max,sve-default-vector-length={vb}", vb) for vb in (16, 32, 64, 256) for isa in ("sve", "sve2")]


def _count(plugin: str, exe: Path, op: str, iters: int, cpu: str, isa: str) -> int:
    p = qemu_user.run([str(exe), op, str(iters)], cpu, env={"CUVIL_FORCE_ISA": isa},
                      plugin=f"{plugin},inline=on", timeout=900)
    m = re.search(r"insns: (\d+)", p.stderr + p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"{op} {isa} {cpu}: rc {p.returncode}: {p.stderr[-500:]}")
    return int(m.group(1))


def aarch64_bench() -> dict:
    subprocess.run([str(REPO / "cross" / "build.sh"), "aarch64"], check=True)
    plugin = subprocess.run([str(REPO / "hil" / "build_insn_plugin.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    exe = REPO / "build" / "aarch64" / "cuvil_sve_bench"
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for op in AARCH64_OPS:
            for isa, cpu, vb in CONFIGS:
                for it in (0, 1):
                    jobs[(op, isa, vb, it)] = pool.submit(_count, plugin, exe, op, it, cpu, isa)
    counts: dict = {}
    for op in AARCH64_OPS:
        row = {}
        for isa, _cpu, vb in CONFIGS:
            key = isa if not vb else f"{isa}@{vb * 8}"
            row[key] = jobs[(op, isa, vb, 1)].result() - jobs[(op, isa, vb, 0)].result()
        counts[op] = row
    ratios = {op: {k: v / row["neon"] for k, v in row.items()} for op, row in counts.items()}
    goals = {}
    for op, r in ratios.items():
        goals[op] = {
            "sve_128_le_neon": r["sve@128"] <= 1.0, "sve2_128_le_neon": r["sve2@128"] <= 1.0,
            "sve_256_le_0.6_neon": r["sve@256"] <= 0.6, "sve2_256_le_0.6_neon": r["sve2@256"] <= 0.6,
        }
    return {"qemu": subprocess.run([qemu_user.qemu_binary(True), "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0],
            "toolchain": subprocess.run(["aarch64-linux-gnu-gcc", "--version"], capture_output=True,
                                        text=True).stdout.splitlines()[0],
            "flags": "library -O3 -march=armv8-a; SVE files -O2 -march=armv8.2-a+sve(2); -ffp-contract=off",
            "method": "insn plugin (inline), count(OP 1) - count(OP 0), CUVIL_FORCE_ISA per ISA",
            "instructions": counts, "ratio_vs_neon": ratios, "goals": goals}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("host", "aarch64") if k in result]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 5 * len(panels)), squeeze=False)
    for ax, key in zip(axes[:, 0], panels):
        if key == "host":
            cases = result["host"]["cases"]
            impls = ["cuvil", "cuvil_threads2", "numpy", "opencv", "memcpy"]
            x = np.arange(len(cases))
            for j, impl in enumerate(impls):
                vals = [cases[c][impl]["min_ms"] if impl in cases[c] else np.nan for c in cases]
                ax.bar(x + (j - 2) * 0.16, vals, 0.16, label=impl)
            ax.set_xticks(x, [c.replace(" ", "\n", 1) for c in cases], fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("ms (min of repeats, log)")
            ax.set_title("host x86_64: cuvil_edge.sve vs numpy / OpenCV / memcpy bound")
        else:
            ratios = result["aarch64"]["ratio_vs_neon"]
            keys = [k for k in next(iter(ratios.values())) if k != "scalar"]
            x = np.arange(len(ratios))
            for j, k in enumerate(keys):
                ax.bar(x + (j - len(keys) / 2) * 0.09, [ratios[o][k] for o in ratios], 0.09, label=k)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(0.6, color="r", lw=0.8, ls="--")
            ax.set_xticks(x, list(ratios), fontsize=8)
            ax.set_ylabel("instructions / NEON")
            ax.set_title("aarch64 (qemu insn plugin): dynamic instructions relative to NEON")
        ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-host", action="store_true")
    ap.add_argument("--skip-aarch64", action="store_true")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kernels.json")
    args = ap.parse_args()
    subprocess.run([str(REPO / "cross" / "build.sh"), "host"], check=True)
    result: dict = {"command": " ".join(["bench/bench_kernels.py"] + sys.argv[1:]),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not args.skip_host:
        result["host"] = host_bench(args.repeats)
    if not args.skip_aarch64:
        result["aarch64"] = aarch64_bench()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k].get("goals") for k in ("host", "aarch64") if k in result}, indent=1))


if __name__ == "__main__":
    main()
