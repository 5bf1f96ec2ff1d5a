// bench_driver.c: cuvil_sve_bench OP ITERS runs one op ITERS times on a realistic size (for
// dynamic instruction counts under QEMU's insn plugin: the count of ITERS=1 minus ITERS=0 is
// one call). The ISA comes from CUVIL_FORCE_ISA. Prints nothing on success.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_sve.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float frand(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cuvil_sve_bench OP ITERS\n");
        return 2;
    }
    if (cuvil_init_status() != CUVIL_OK) {
        fprintf(stderr, "cuvil_sve_bench: %s\n", cuvil_init_message());
        return 2;
    }
    const char *op = argv[1];
    const int iters = atoi(argv[2]);
    const float mean[3] = {123.675f, 116.28f, 103.53f}, inv[3] = {1 / 58.395f, 1 / 57.12f, 1 / 57.375f};
    const float pad[3] = {0.447f, 0.447f, 0.447f};
    const size_t H = 1080, W = 1920;
    int rc = 0;
    if (!strncmp(op, "normalize", 9) || !strncmp(op, "resize", 6)) {
        uint8_t *img = malloc(H * W * 3);
        for (size_t i = 0; i < H * W * 3; ++i) img[i] = (uint8_t)rnd();
        float *out = malloc(3 * H * W * 4);
        for (int it = 0; it < iters; ++it) {
            if (!strcmp(op, "normalize_f32"))
                rc |= cuvil_normalize(img, H, W, 3 * W, 1, mean, inv, out, CUVIL_F32);
            else if (!strcmp(op, "normalize_f16"))
                rc |= cuvil_normalize(img, H, W, 3 * W, 1, mean, inv, out, CUVIL_F16);
            else if (!strcmp(op, "resize_640_letterbox"))
                rc |= cuvil_resize_normalize(img, H, W, 3 * W, 1, mean, inv, out, CUVIL_F32, 640, 640, 0, 140, 640,
                                             360, pad);
            else if (!strcmp(op, "resize_224"))
                rc |= cuvil_resize_normalize(img, H, W, 3 * W, 1, mean, inv, out, CUVIL_F32, 224, 224, 0, 0, 224,
                                             224, NULL);
            else
                rc = -1;
        }
        free(img);
        free(out);
    } else if (!strcmp(op, "quantize") || !strcmp(op, "dequantize")) {
        const size_t n = 3 * 640 * 640;
        float *x = malloc(n * 4), *y = malloc(n * 4);
        int8_t *q = malloc(n);
        const float s = 0.02f;
        for (size_t i = 0; i < n; ++i) {
            x[i] = (frand() - 0.5f) * 6.0f;
            q[i] = (int8_t)rnd();
        }
        for (int it = 0; it < iters; ++it)
            rc |= op[0] == 'q' ? cuvil_quantize(x, q, 1, 1, n, &s) : cuvil_dequantize(q, y, 1, 1, n, &s);
        free(x);
        free(y);
        free(q);
    } else if (!strcmp(op, "softmax_topk")) {
        const size_t rows = 8, n = 1000, k = 5;
        float *x = malloc(rows * n * 4), *p = malloc(rows * n * 4), *ts = malloc(rows * k * 4);
        int32_t *ti = malloc(rows * k * 4);
        for (size_t i = 0; i < rows * n; ++i) x[i] = (frand() - 0.5f) * 20.0f;
        for (int it = 0; it < iters; ++it) rc |= cuvil_softmax_topk(x, rows, n, n * 4, p, k, ts, ti);
        free(x);
        free(p);
        free(ts);
        free(ti);
    } else if (!strcmp(op, "nms")) {
        // YOLOv8 raw output (4 + 80, 8400): 60 objects each seen by ~12 anchors, the rest noise.
        const size_t n = 8400, c = 80;
        float *raw = malloc((4 + c) * n * 4);
        for (size_t i = 0; i < (4 + c) * n; ++i) raw[i] = frand() * 0.05f;
        for (size_t i = 0; i < n; ++i) {
            raw[i] = frand() * 640;
            raw[n + i] = frand() * 640;
            raw[2 * n + i] = 10 + frand() * 100;
            raw[3 * n + i] = 10 + frand() * 100;
        }
        for (size_t o = 0; o < 60; ++o) {
            float cx = frand() * 640, cy = frand() * 640, w = 20 + frand() * 100, h = 20 + frand() * 100;
            size_t cls = rnd() % c;
            for (size_t a = 0; a < 12; ++a) {
                size_t i = rnd() % n;
                raw[i] = cx + frand() * 6;
                raw[n + i] = cy + frand() * 6;
                raw[2 * n + i] = w * (0.9f + 0.2f * frand());
                raw[3 * n + i] = h * (0.9f + 0.2f * frand());
                raw[(4 + cls) * n + i] = 0.3f + 0.7f * frand();
            }
        }
        float ob[300 * 4], os[300];
        int32_t oc[300], oi[300];
        for (int it = 0; it < iters; ++it) {
            long k = cuvil_nms(raw, n, 4, (ptrdiff_t)(n * 4), 0, raw + 4 * n, c, 4, (ptrdiff_t)(n * 4), 0.25f, 0.45f, 0,
                               300, ob, os, oc, oi);
            if (k < 0) rc = -1;
        }
        free(raw);
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 2;
    }
    return rc ? 1 : 0;
}
