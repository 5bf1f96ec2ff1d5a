// selftest.c: cuvil_sve_selftest compares every op on every ISA this CPU offers against the
// scalar reference: sizes 0, 1, vector length +-1, odd widths and strides, guard bytes after
// every output. Prints the ISA and vector length; exits 1 on any mismatch (bit-exact for
// integers and float32, <= 1 ulp for float16). Under qemu-user, QEMU_CPU picks the CPU model.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_sve.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static const char *const isa_names[4] = {"scalar", "neon", "sve", "sve2"};
static unsigned long g_checks, g_fail;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

static void *galloc(size_t n) {
    uint8_t *p = malloc(n + GUARD);
    memset(p, GUARD_BYTE, n + GUARD);
    return p;
}
static int guard_ok(const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p + n;
    for (size_t i = 0; i < GUARD; ++i)
        if (b[i] != GUARD_BYTE) return 0;
    return 1;
}

// Compare bytes of the reference and candidate outputs; f16 allows 1 ulp.
static void compare(const char *what, int isa, const void *ref, const void *got, size_t bytes, int f16) {
    ++g_checks;
    int bad = !guard_ok(got, bytes);
    if (!bad) {
        if (f16) {
            const uint16_t *a = ref, *b = got;
            for (size_t i = 0; i < bytes / 2; ++i) {
                int d = (int)a[i] - (int)b[i];
                if (d > 1 || d < -1 || ((a[i] ^ b[i]) & 0x8000)) {
                    bad = 1;
                    break;
                }
            }
        } else {
            bad = memcmp(ref, got, bytes) != 0;
        }
    }
    if (bad) {
        ++g_fail;
        if (g_fail <= 20) printf("MISMATCH %s isa=%s%s\n", what, isa_names[isa], guard_ok(got, bytes) ? "" : " (guard overwritten)");
    }
}

static size_t g_vb;

static void test_normalize(unsigned avail) {
    const size_t widths[] = {0, 1, 3, g_vb - 1, g_vb, g_vb + 1, 4 * g_vb + 5, 37};
    const size_t heights[] = {1, 2, 3};
    const float mean[3] = {123.675f, 116.28f, 103.53f}, inv[3] = {1.0f / 58.395f, 1.0f / 57.12f, 1.0f / 57.375f};
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; ++wi)
        for (size_t hi = 0; hi < 3; ++hi)
            for (int pad = 0; pad < 2; ++pad)
                for (int swap = 0; swap < 2; ++swap)
                    for (int dt = 0; dt < 2; ++dt) {
                        size_t w = widths[wi], h = heights[hi], stride = 3 * w + (pad ? 7 : 0);
                        uint8_t *img = galloc(h * stride + 1);
                        for (size_t i = 0; i < h * stride; ++i) img[i] = (uint8_t)rnd();
                        size_t bytes = 3 * h * w * (dt ? 2 : 4);
                        uint8_t *ref = galloc(bytes);
                        cuvil_select_isa(CUVIL_ISA_SCALAR);
                        cuvil_normalize(img, h, w, stride, swap, mean, inv, ref, dt);
                        for (int isa = 1; isa < 4; ++isa) {
                            if (!(avail & (1u << isa))) continue;
                            uint8_t *got = galloc(bytes);
                            cuvil_select_isa(isa);
                            cuvil_normalize(img, h, w, stride, swap, mean, inv, got, dt);
                            char what[96];
                            snprintf(what, sizeof what, "normalize h=%zu w=%zu stride=%zu swap=%d f16=%d", h, w,
                                     stride, swap, dt);
                            compare(what, isa, ref, got, bytes, dt);
                            free(got);
                        }
                        free(ref);
                        free(img);
                    }
}

static void test_resize(unsigned avail) {
    const size_t src[][2] = {{1, 1}, {2, 3}, {g_vb + 1, g_vb - 1}, {37, 53}, {9, 4 * g_vb + 3}};
    const size_t dst[][2] = {{1, 1}, {5, 7}, {g_vb + 1, 2 * g_vb + 3}, {16, 9}};
    const float mean[3] = {0.5f, 10.0f, 127.0f}, inv[3] = {1.0f / 255.0f, 0.5f, 1.0f / 128.0f};
    const float pad[3] = {0.25f, -1.0f, 3.0f};
    for (size_t si = 0; si < 5; ++si)
        for (size_t di = 0; di < 4; ++di)
            for (int lb = 0; lb < 2; ++lb)
                for (int dt = 0; dt < 2; ++dt) {
                    size_t h = src[si][0], w = src[si][1], stride = 3 * w + 5;
                    size_t dh = dst[di][0], dw = dst[di][1];
                    size_t rx = 0, ry = 0, rw = dw, rh = dh;
                    if (lb && dw > 2 && dh > 2) {
                        rx = 1;
                        ry = dh / 3;
                        rw = dw - 2;
                        rh = dh - ry - 1;
                    }
                    uint8_t *img = galloc(h * stride);
                    for (size_t i = 0; i < h * stride; ++i) img[i] = (uint8_t)rnd();
                    size_t bytes = 3 * dh * dw * (dt ? 2 : 4);
                    uint8_t *ref = galloc(bytes);
                    cuvil_select_isa(CUVIL_ISA_SCALAR);
                    cuvil_resize_normalize(img, h, w, stride, (int)(si & 1), mean, inv, ref, dt, dh, dw, rx, ry, rw, rh,
                                           pad);
                    for (int isa = 1; isa < 4; ++isa) {
                        if (!(avail & (1u << isa))) continue;
                        uint8_t *got = galloc(bytes);
                        cuvil_select_isa(isa);
                        cuvil_resize_normalize(img, h, w, stride, (int)(si & 1), mean, inv, got, dt, dh, dw, rx, ry,
                                               rw, rh, pad);
                        char what[128];
                        snprintf(what, sizeof what, "resize_normalize %zux%zu->%zux%zu rect=%zu,%zu,%zu,%zu f16=%d", h,
                                 w, dh, dw, rx, ry, rw, rh, dt);
                        compare(what, isa, ref, got, bytes, dt);
                        free(got);
                    }
                    free(ref);
                    free(img);
                }
}

static void test_quantize(unsigned avail) {
    const size_t vw = g_vb / 4;
    const size_t ns[] = {0, 1, vw - 1, vw, vw + 1, g_vb - 1, g_vb, g_vb + 1, 4 * g_vb + 3, 1000, 16 * g_vb + 5};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ++ni)
        for (int per_ch = 0; per_ch < 2; ++per_ch) {
            size_t inner = ns[ni], ch = per_ch ? 3 : 1, outer = per_ch ? 2 : 1, n = outer * ch * inner;
            float scales[3] = {0.05f, 1.0f, 0.0173f};
            float *x = galloc(n * 4);
            int8_t *q = galloc(n);
            for (size_t i = 0; i < n; ++i) {
                float s = scales[per_ch ? (i / inner) % 3 : 0];
                uint32_t r = rnd() % 4;
                // Exact ties (k + 0.5) * s, out-of-range values, and plain random values.
                x[i] = r == 0 ? ((float)((int)(rnd() % 300) - 150) + 0.5f) * s
                              : r == 1 ? frand(-300.0f, 300.0f) * s : frand(-130.0f, 130.0f) * s;
                q[i] = (int8_t)rnd();
            }
            int8_t *rq = galloc(n);
            float *rd = galloc(n * 4);
            cuvil_select_isa(CUVIL_ISA_SCALAR);
            cuvil_quantize(x, rq, outer, ch, inner, scales);
            cuvil_dequantize(q, rd, outer, ch, inner, scales);
            for (int isa = 1; isa < 4; ++isa) {
                if (!(avail & (1u << isa))) continue;
                int8_t *gq = galloc(n);
                float *gd = galloc(n * 4);
                cuvil_select_isa(isa);
                cuvil_quantize(x, gq, outer, ch, inner, scales);
                cuvil_dequantize(q, gd, outer, ch, inner, scales);
                char what[96];
                snprintf(what, sizeof what, "quantize n=%zu channels=%zu", inner, ch);
                compare(what, isa, rq, gq, n, 0);
                snprintf(what, sizeof what, "dequantize n=%zu channels=%zu", inner, ch);
                compare(what, isa, rd, gd, n * 4, 0);
                free(gq);
                free(gd);
            }
            free(rq);
            free(rd);
            free(x);
            free(q);
        }
}

static void test_softmax(unsigned avail) {
    const size_t vw = g_vb / 4;
    const size_t ns[] = {1, 2, vw - 1 ? vw - 1 : 1, vw + 1, 63, 64, 65, 129, 1000, 64 * vw + 3};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ++ni) {
        size_t n = ns[ni], rows = 3, k = ni % 3 == 0 ? 0 : n < 5 ? n : 5;
        float *x = galloc(rows * n * 4);
        for (size_t i = 0; i < rows * n; ++i) x[i] = frand(-20.0f, 20.0f);
        if (n > 4) x[3] = x[1];  // a tie
        float *rp = galloc(rows * n * 4), *rs = galloc(rows * k * 4 + 4);
        int32_t *ri = galloc(rows * k * 4);
        cuvil_select_isa(CUVIL_ISA_SCALAR);
        cuvil_softmax_topk(x, rows, n, n * 4, rp, k, rs, ri);
        for (int isa = 1; isa < 4; ++isa) {
            if (!(avail & (1u << isa))) continue;
            float *gp = galloc(rows * n * 4), *gs = galloc(rows * k * 4);
            int32_t *gi = galloc(rows * k * 4);
            cuvil_select_isa(isa);
            cuvil_softmax_topk(x, rows, n, n * 4, gp, k, gs, gi);
            char what[64];
            snprintf(what, sizeof what, "softmax n=%zu", n);
            compare(what, isa, rp, gp, rows * n * 4, 0);
            snprintf(what, sizeof what, "topk n=%zu k=%zu", n, k);
            compare(what, isa, rs, gs, rows * k * 4, 0);
            compare(what, isa, ri, gi, rows * k * 4, 0);
            free(gp);
            free(gs);
            free(gi);
        }
        free(rp);
        free(rs);
        free(ri);
        free(x);
    }
}

static void test_nms(unsigned avail) {
    const size_t vw = g_vb / 4;
    const size_t ns[] = {0, 1, 7, vw + 1, 2 * vw + 3, 100, 300};
    const size_t cs[] = {1, 3, 80};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ++ni)
        for (size_t ci = 0; ci < 3; ++ci)
            for (int layout = 0; layout < 3; ++layout)
                for (int fmt = 0; fmt < 2; ++fmt)
                    for (int agn = 0; agn < 2; ++agn) {
                        size_t n = ns[ni], c = cs[ci];
                        // layout 0: class-major (C, N); 1: box-major (N, C); 2: (N, C) with a gap.
                        size_t cols = c + (layout == 2 ? 3 : 0);
                        float *sc = galloc((n * cols + 1) * 4), *bx = galloc((4 * n + 1) * 4);
                        for (size_t i = 0; i < n * cols; ++i) sc[i] = frand(0.0f, 1.0f);
                        for (size_t i = 0; i < n; ++i) {
                            float a = frand(0, 100), b = frand(0, 100), cw = frand(1, 40), ch = frand(1, 40);
                            bx[4 * i] = a;
                            bx[4 * i + 1] = b;
                            bx[4 * i + 2] = fmt ? a + cw : cw;
                            bx[4 * i + 3] = fmt ? b + ch : ch;
                        }
                        if (n > 3) sc[1] = sc[0];  // a tie
                        ptrdiff_t ss = layout == 0 ? 4 : (ptrdiff_t)(cols * 4), cst = layout == 0 ? (ptrdiff_t)(n * 4) : 4;
                        if (layout == 2) cst = 8, ss = (ptrdiff_t)(cols * 4);
                        size_t cmax = layout == 2 ? (cols + 1) / 2 : c;
                        size_t md = n ? n : 1;
                        float *rb = galloc(md * 16), *rs = galloc(md * 4);
                        int32_t *rc = galloc(md * 4), *ri = galloc(md * 4);
                        cuvil_select_isa(CUVIL_ISA_SCALAR);
                        long rk = cuvil_nms(bx, n, 16, 4, fmt, sc, cmax, ss, cst, 0.3f, 0.45f, agn, md, rb, rs, rc, ri);
                        for (int isa = 1; isa < 4; ++isa) {
                            if (!(avail & (1u << isa))) continue;
                            float *gb = galloc(md * 16), *gs = galloc(md * 4);
                            int32_t *gc = galloc(md * 4), *gi = galloc(md * 4);
                            cuvil_select_isa(isa);
                            long gk = cuvil_nms(bx, n, 16, 4, fmt, sc, cmax, ss, cst, 0.3f, 0.45f, agn, md, gb, gs, gc,
                                                gi);
                            char what[96];
                            snprintf(what, sizeof what, "nms n=%zu classes=%zu layout=%d fmt=%d agnostic=%d", n, cmax,
                                     layout, fmt, agn);
                            ++g_checks;
                            if (gk != rk) {
                                ++g_fail;
                                printf("MISMATCH %s isa=%s kept %ld vs %ld\n", what, isa_names[isa], gk, rk);
                            } else if (rk > 0) {
                                compare(what, isa, rb, gb, (size_t)rk * 16, 0);
                                compare(what, isa, rs, gs, (size_t)rk * 4, 0);
                                compare(what, isa, rc, gc, (size_t)rk * 4, 0);
                                compare(what, isa, ri, gi, (size_t)rk * 4, 0);
                            }
                            free(gb);
                            free(gs);
                            free(gc);
                            free(gi);
                        }
                        free(rb);
                        free(rs);
                        free(rc);
                        free(ri);
                        free(sc);
                        free(bx);
                    }
}

// Thread count must not change any result: big enough inputs to split, 1 vs 3 threads.
static void test_threads(unsigned avail) {
    const size_t h = 700, w = 200, n = 600000;
    const float mean[3] = {1, 2, 3}, inv[3] = {0.5f, 0.25f, 0.125f}, pad[3] = {0, 0, 0}, scale = 0.02f;
    uint8_t *img = galloc(h * w * 3);
    float *x = galloc(n * 4);
    for (size_t i = 0; i < h * w * 3; ++i) img[i] = (uint8_t)rnd();
    for (size_t i = 0; i < n; ++i) x[i] = frand(-3.0f, 3.0f);
    const size_t nb = 3 * h * w * 4, rb = 3 * 200 * 200 * 4;
    for (int isa = 0; isa < 4; ++isa) {
        if (!(avail & (1u << isa))) continue;
        cuvil_select_isa(isa);
        uint8_t *a[4], *b[4];
        for (int t = 0; t < 2; ++t) {
            uint8_t **o = t ? b : a;
            cuvil_set_threads(t ? 3 : 1);
            o[0] = galloc(nb);
            o[1] = galloc(rb);
            o[2] = galloc(n);
            o[3] = galloc(n * 4);
            cuvil_normalize(img, h, w, 3 * w, 0, mean, inv, o[0], CUVIL_F32);
            cuvil_resize_normalize(img, h, w, 3 * w, 1, mean, inv, o[1], CUVIL_F32, 200, 200, 0, 0, 200, 200, pad);
            cuvil_quantize(x, (int8_t *)o[2], 1, 1, n, &scale);
            cuvil_dequantize((const int8_t *)o[2], (float *)o[3], 1, 1, n, &scale);
        }
        cuvil_set_threads(1);
        compare("normalize threads=3", isa, a[0], b[0], nb, 0);
        compare("resize_normalize threads=3", isa, a[1], b[1], rb, 0);
        compare("quantize threads=3", isa, a[2], b[2], n, 0);
        compare("dequantize threads=3", isa, a[3], b[3], n * 4, 0);
        for (int i = 0; i < 4; ++i) {
            free(a[i]);
            free(b[i]);
        }
    }
    free(img);
    free(x);
}

int main(int argc, char **argv) {
    if (cuvil_init_status() != CUVIL_OK) {
        fprintf(stderr, "cuvil_sve_selftest: %s\n", cuvil_init_message());
        return 2;
    }
    int seeds = argc > 1 ? atoi(argv[1]) : 3;
    unsigned avail = cuvil_isa_available();
    int best = cuvil_isa_for(CUVIL_OP_NORMALIZE);
    size_t vb = cuvil_sve_vector_bytes();
    g_vb = vb ? vb : 16;
    printf("cuvil_sve_selftest: isa %s, vector length %zu bytes (%zu bits), available:", isa_names[best], vb, 8 * vb);
    for (int i = 0; i < 4; ++i)
        if (avail & (1u << i)) printf(" %s", isa_names[i]);
    printf("\n");
    for (int s = 0; s < seeds; ++s) {
        g_rng = 0x9e3779b97f4a7c15ull + (uint64_t)s * 0x632be59bd9b4e019ull;
        test_normalize(avail);
        test_resize(avail);
        test_quantize(avail);
        test_softmax(avail);
        test_nms(avail);
    }
    test_threads(avail);
    cuvil_select_isa(best);
    printf("%s: %lu checks, %lu mismatches\n", g_fail ? "FAILED" : "PASSED", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
