"""Kernel checks shared by the host pytest run and the aarch64 run under qemu-user.

Plain numpy + assert, no pytest: the arm64 Debian root file system (hil/make_rootfs.sh) has only
python3 and numpy. ``python3 tests/sve/sve_kernel_cases.py`` runs every case on every ISA the
CPU offers and prints one line per ISA; exit status 1 on any failure.

Each case compares the library against a numpy reference that performs the same float32
operations (exact for normalize, resize, quantize, dequantize, NMS), and every ISA against the
scalar one (bit-exact; float16 within 1 ulp).
"""

from __future__ import annotations

import os
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from cuvil_edge import sve  # noqa: E402

F32 = np.float32


def vector_bytes() -> int:
    return int(sve.cpu_info()["sve_vector_bytes"]) or 16


def ref_normalize(img, mean, std, swap, dtype):
    m = np.asarray(mean, F32)
    inv = (F32(1) / np.asarray(std, F32)).astype(F32)
    x = img[..., ::-1] if swap else img
    out = ((x.astype(F32) - m) * inv).transpose(2, 0, 1)
    return np.ascontiguousarray(out.astype(dtype))


def _coords(n_in, n_out):
    s = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    s = np.clip(s, 0, n_in - 1)
    i = np.floor(s).astype(np.int64)
    if n_in >= 2:
        i = np.minimum(i, n_in - 2)
    w1 = (s - i).astype(F32)
    return i, (F32(1) - w1).astype(F32), w1


def ref_resize_normalize(img, size, mean, std, swap, letterbox, pad_value, dtype):
    h, w, _ = img.shape
    dh, dw = size
    m = np.asarray(mean, F32)
    inv = (F32(1) / np.asarray(std, F32)).astype(F32)
    if letterbox:
        lb = sve.letterbox_rect((h, w), (dh, dw))
        rx, ry, rw, rh = lb.x, lb.y, lb.w, lb.h
    else:
        rx, ry, rw, rh = 0, 0, dw, dh
    out = np.empty((3, dh, dw), F32)
    padv = ((np.broadcast_to(np.asarray(pad_value, F32), (3,)) - m) * inv).astype(F32)
    out[:] = padv[:, None, None]
    yi, wy0, wy1 = _coords(h, rh)
    xi, wx0, wx1 = _coords(w, rw)
    src = img.astype(F32)
    r0 = src[yi]
    r1 = src[np.minimum(yi + 1, h - 1)]
    t = r0 * wy0[:, None, None] + r1 * wy1[:, None, None]  # (rh, w, 3)
    x1 = np.minimum(xi + 1, w - 1)
    v = t[:, xi] * wx0[None, :, None] + t[:, x1] * wx1[None, :, None]  # (rh, rw, 3)
    if swap:
        v = v[..., ::-1]
    out[:, ry:ry + rh, rx:rx + rw] = ((v - m) * inv).transpose(2, 0, 1)
    return out.astype(dtype)


def ref_quantize(x, scale, axis):
    s = np.asarray(scale, F32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    q = np.rint(np.clip(x / s, F32(-128), F32(127)))
    return np.nan_to_num(q).astype(np.int8)


def ref_nms(boxes, scores, fmt, score_thr, iou_thr, agnostic, max_det):
    best = scores.max(axis=1)
    cls = scores.argmax(axis=1).astype(np.int32)
    cand = np.nonzero(best > F32(score_thr))[0]
    order = cand[np.lexsort((cand, -best[cand]))]
    b = boxes[order].astype(F32)
    if fmt == "cxcywh":
        hw, hh = b[:, 2] * F32(0.5), b[:, 3] * F32(0.5)
        x1, y1, x2, y2 = b[:, 0] - hw, b[:, 1] - hh, b[:, 0] + hw, b[:, 1] + hh
    else:
        x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    area = (x2 - x1) * (y2 - y1)
    c = cls[order]
    supp = np.zeros(len(order), bool)
    keep = []
    for i in range(len(order)):
        if len(keep) >= max_det:
            break
        if supp[i]:
            continue
        keep.append(i)
        j = slice(i + 1, None)
        iw = np.maximum(np.minimum(x2[i], x2[j]) - np.maximum(x1[i], x1[j]), F32(0))
        ih = np.maximum(np.minimum(y2[i], y2[j]) - np.maximum(y1[i], y1[j]), F32(0))
        inter = iw * ih
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = inter / ((area[i] + area[j]) - inter)
        hit = iou > F32(iou_thr)
        if not agnostic:
            hit &= c[j] == c[i]
        supp[j] |= hit
    k = np.asarray(keep, np.int64)
    return (np.stack([x1, y1, x2, y2], 1)[k], best[order][k], c[k], order[k].astype(np.int32))


def _ulp16(a, b):
    ai = a.view(np.uint16).astype(np.int32)
    bi = b.view(np.uint16).astype(np.int32)
    return int(np.abs(ai - bi).max()) if a.size else 0


def case_normalize(rng):
    vb = vector_bytes()
    for h, w in [(1, 1), (2, vb - 1), (3, vb + 1), (5, 37), (2, 4 * vb + 3), (0, 4)]:
        for swap in (False, True):
            for dtype in (np.float32, np.float16):
                full = rng.integers(0, 256, (h, w + 5, 3), dtype=np.uint8)
                img = full[:, 2:w + 2]  # row stride 3 * (w + 5): not packed rows
                mean, std = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
                got = sve.normalize(img, mean, std, swap_rb=swap, dtype=dtype)
                want = ref_normalize(img, mean, std, swap, dtype)
                if dtype == np.float16:
                    assert _ulp16(got, want) <= 1, ("normalize f16", h, w, swap)
                else:
                    assert np.array_equal(got, want), ("normalize", h, w, swap)
                out = np.empty((1, 3, h, w), dtype)
                assert sve.normalize(img, mean, std, swap_rb=swap, dtype=dtype, out=out) is out


def case_resize_normalize(rng):
    vb = vector_bytes()
    for (h, w), size, lb in [((1, 1), (3, 5), False), ((4, 6), (1, 1), False), ((37, 53), (16, 9), True),
                             ((vb + 1, vb - 1), (vb, 2 * vb + 1), False), ((27, 48), (32, 32), True),
                             ((48, 27), (20, 20), True), ((30, 40), (30, 40), False)]:
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for dtype in (np.float32, np.float16):
            swap = bool(rng.integers(0, 2))
            got = sve.resize_normalize(img, size, 0.5, 255.0, swap_rb=swap, letterbox=lb, dtype=dtype)
            want = ref_resize_normalize(img, size, 0.5, 255.0, swap, lb, 114.0, dtype)
            if dtype == np.float16:
                assert _ulp16(got, want) <= 1, ("resize f16", h, w, size, lb)
            else:
                assert np.array_equal(got, want), ("resize", h, w, size, lb, float(np.abs(got - want).max()))
    img = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    same = sve.resize_normalize(img, (30, 40), 0, 1)
    assert np.array_equal(same, img.transpose(2, 0, 1).astype(F32)), "identity resize"


def case_quantize(rng):
    vb = vector_bytes()
    for n in [0, 1, vb // 4 - 1, vb // 4 + 1, vb - 1, vb + 1, 4 * vb + 3, 1000]:
        s = F32(0.05)
        ties = (rng.integers(-150, 150, n).astype(F32) + F32(0.5)) * s
        wide = rng.uniform(-300, 300, n).astype(F32) * s
        x = np.where(rng.integers(0, 2, n) == 0, ties, wide).astype(F32)
        q = sve.quantize(x, s)
        assert np.array_equal(q, ref_quantize(x, s, None)), ("quantize", n)
        d = sve.dequantize(q, s)
        assert np.array_equal(d, q.astype(F32) * s), ("dequantize", n)
    x = rng.uniform(-3, 3, (2, 5, 7)).astype(F32)
    sc = np.array([0.01, 0.02, 0.5, 0.003, 1.0], F32)
    q = sve.quantize(x, sc, axis=1)
    assert np.array_equal(q, ref_quantize(x, sc, 1)), "quantize per-channel"
    d = sve.dequantize(q, sc, axis=1)
    assert np.array_equal(d, q.astype(F32) * sc[None, :, None]), "dequantize per-channel"
    x = rng.uniform(-3, 3, (6, 4)).astype(F32)
    q = sve.quantize(x, sc[:4], axis=-1)
    assert np.array_equal(q, ref_quantize(x, sc[:4], 1)), "quantize last axis"
    special = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 127.5, -128.5, 126.5], F32)
    assert sve.quantize(special, 1.0).tolist() == [0, 127, -128, 127, -128, 0, 0, 127, -128, 126]


def case_softmax_topk(rng):
    vb = vector_bytes()
    for n in [1, 2, vb // 4 + 1, 63, 64, 65, 129, 1000]:
        x = rng.uniform(-20, 20, (3, n)).astype(F32)
        probs = np.empty_like(x)
        k = min(n, 5)
        s, i = sve.softmax_topk(x, k, probs_out=probs)
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
        assert np.allclose(probs, want, rtol=2e-6, atol=1e-12), ("softmax", n, float(np.abs(probs - want).max()))
        order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        assert np.array_equal(i, order), ("topk indices", n)
        assert np.array_equal(s, np.take_along_axis(probs, order, 1)), ("topk scores", n)
    x = np.zeros((2, 10), F32)
    s, i = sve.softmax_topk(x, 3)
    assert i.tolist() == [[0, 1, 2], [0, 1, 2]], "ties keep the lower index first"
    assert np.array_equal(sve.softmax(x[0]), np.full(10, 0.1, F32))


def case_nms(rng):
    for n, c, fmt, agn, layout in [(0, 3, "xyxy", False, "nc"), (1, 1, "cxcywh", False, "nc"),
                                   (300, 80, "cxcywh", False, "cn"), (300, 80, "cxcywh", True, "cn"),
                                   (257, 3, "xyxy", False, "nc"), (100, 7, "xyxy", True, "strided")]:
        xy = rng.uniform(0, 100, (n, 2)).astype(F32)
        wh = rng.uniform(1, 40, (n, 2)).astype(F32)
        boxes = np.concatenate([xy, wh if fmt == "cxcywh" else xy + wh], 1).astype(F32)
        if layout == "cn":  # YOLOv8 (4 + C, N) output, passed as transposed views
            raw = np.concatenate([boxes.T, rng.uniform(0, 1, (c, n)).astype(F32)], 0)
            b, s = raw[:4].T, raw[4:].T
        elif layout == "strided":
            b, s = boxes, rng.uniform(0, 1, (n, 2 * c)).astype(F32)[:, ::2]
        else:
            b, s = boxes, rng.uniform(0, 1, (n, c)).astype(F32)
        got = sve.nms(b, s, box_format=fmt, score_threshold=0.3, iou_threshold=0.45, class_agnostic=agn,
                      max_detections=50)
        want = ref_nms(np.ascontiguousarray(b), np.ascontiguousarray(s), fmt, 0.3, 0.45, agn, 50)
        for g, w_, name in zip(got, want, ("boxes", "scores", "classes", "indices")):
            assert np.array_equal(g, w_), ("nms", name, n, c, fmt, agn, layout)


CASES = [case_normalize, case_resize_normalize, case_quantize, case_softmax_topk, case_nms]


def _outputs(case, seed):
    """Runs a case and also records every array the library returned (for cross-ISA checks)."""
    case(np.random.default_rng(seed))


def run_all(seeds=(0, 1)) -> int:
    info = sve.cpu_info()
    failures = 0
    for isa in info["available"]:
        sve.select_isa(isa)
        bad = []
        for case in CASES:
            for seed in seeds:
                try:
                    case(np.random.default_rng(seed))
                except AssertionError as exc:
                    bad.append(f"{case.__name__}[seed {seed}]: {exc}")
        failures += len(bad)
        print(f"{'FAILED' if bad else 'PASSED'} isa={isa} vector_bytes={info['sve_vector_bytes']} "
              f"platform={info['platform']}")
        for b in bad:
            print("  " + b)
    sve.select_isa(None)
    return failures


if __name__ == "__main__":
    sys.exit(1 if run_all() else 0)
