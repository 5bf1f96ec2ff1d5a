// resize_tables.c: resize_normalize's ISA-independent part: argument checks, the letterbox fill,
// the column coordinate tables every row shares and the vertical coordinate of each output row.
// The per-row kernel comes from the dispatch table.
#include <stdlib.h>

#include "internal.h"

static void fill(void *dst, int dtype, size_t n, float v) {
    if (dtype == CUVIL_F16) {
        uint16_t h = cuvil_f32_to_f16(v), *d = dst;
        for (size_t i = 0; i < n; ++i) d[i] = h;
    } else {
        float *d = dst;
        for (size_t i = 0; i < n; ++i) d[i] = v;
    }
}

// Source coordinate of output index o (half-pixel centres, as cv2.INTER_LINEAR), split into
// a clamped integer index i0 (i0 + 1 < n unless n == 1) and weights (w0, w1).
static void coord(size_t o, size_t in, size_t out, int32_t *i0, float *w0, float *w1) {
    double s = ((double)o + 0.5) * ((double)in / (double)out) - 0.5;
    if (s < 0) s = 0;
    if (s > (double)(in - 1)) s = (double)(in - 1);
    size_t i = (size_t)s;
    if (in >= 2 && i > in - 2) i = in - 2;
    float w = (float)(s - (double)i);
    *i0 = (int32_t)i;
    *w1 = w;
    *w0 = 1.0f - w;
}

typedef struct {
    const uint8_t *src;
    size_t height, width, src_stride;
    int swap;
    const float *mean, *inv_std;
    uint8_t *dst;  // first pixel of the rectangle, channel 0
    size_t dst_row, plane;
    cuvil_resize_fn k;
    size_t rh;
    const int32_t *xi;
    const float *wx0, *wx1;
    size_t rw, x_lo, x_hi;
    volatile int failed;
} resize_ctx;

static void resize_range(void *p, size_t y_begin, size_t y_end) {
    resize_ctx *c = p;
    // Vertical-pass rows: 3 planes of width + 1 floats, zeroed so a 1-pixel-wide source reads a
    // finite x0 + 1 with weight 0. Cache-line aligned for the vector stores.
    const size_t tmp_plane = c->width + 1;
    uint8_t *mem = calloc(1, 3 * tmp_plane * sizeof(float) + 64);
    if (!mem) {
        c->failed = 1;
        return;
    }
    float *tmp = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    for (size_t y = y_begin; y < y_end; ++y) {
        int32_t y0;
        float wy0, wy1;
        coord(y, c->height, c->rh, &y0, &wy0, &wy1);
        const uint8_t *r0 = c->src + (size_t)y0 * c->src_stride;
        const uint8_t *r1 = c->height > 1 ? r0 + c->src_stride : r0;
        c->k(r0, r1, wy0, wy1, c->x_lo, c->x_hi, tmp, tmp_plane, c->xi, c->wx0, c->wx1, c->rw, c->swap, c->mean,
             c->inv_std, c->dst + y * c->dst_row, c->plane);
    }
    free(mem);
}

int cuvil_resize_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride, int swap,
                           const float *mean, const float *inv_std, void *dst, int dtype, size_t dst_h,
                           size_t dst_w, size_t rx, size_t ry, size_t rw, size_t rh, const float *pad) {
    CHECK_READY();
    if ((dtype != CUVIL_F32 && dtype != CUVIL_F16) || src_stride < 3 * width) return CUVIL_EINVAL;
    if (rx + rw > dst_w || ry + rh > dst_h) return CUVIL_EINVAL;
    if (dst_h == 0 || dst_w == 0) return CUVIL_OK;
    if (!dst || !mean || !inv_std) return CUVIL_EINVAL;
    const int letterbox = rw != dst_w || rh != dst_h;
    if (letterbox && !pad) return CUVIL_EINVAL;
    if (rw && rh && (height == 0 || width == 0 || !src)) return CUVIL_EINVAL;
    const size_t es = cuvil_dtype_size(dtype);
    const size_t plane = dst_h * dst_w * es;
    uint8_t *out = dst;
    if (letterbox) {
        // Pad only what the rectangle does not cover: rows above/below, then the side columns.
        for (int c = 0; c < 3; ++c) {
            uint8_t *p = out + (size_t)c * plane;
            fill(p, dtype, ry * dst_w, pad[c]);
            fill(p + (ry + rh) * dst_w * es, dtype, (dst_h - ry - rh) * dst_w, pad[c]);
            for (size_t y = ry; y < ry + rh; ++y) {
                fill(p + y * dst_w * es, dtype, rx, pad[c]);
                fill(p + (y * dst_w + rx + rw) * es, dtype, dst_w - rx - rw, pad[c]);
            }
        }
    }
    if (rw == 0 || rh == 0) return CUVIL_OK;
    // Column tables, shared by every range.
    uint8_t *tables = malloc(rw * (sizeof(int32_t) + 2 * sizeof(float)));
    if (!tables) return CUVIL_ENOMEM;
    int32_t *xi = (int32_t *)tables;
    float *wx0 = (float *)(xi + rw), *wx1 = wx0 + rw;
    size_t x_lo = width, x_hi = 0;
    for (size_t i = 0; i < rw; ++i) {
        coord(i, width, rw, &xi[i], &wx0[i], &wx1[i]);
        size_t a = (size_t)xi[i], b = a + 2 > width ? width : a + 2;
        if (a < x_lo) x_lo = a;
        if (b > x_hi) x_hi = b;
    }
    resize_ctx c = {src, height, width, src_stride, swap != 0, mean, inv_std, out + (ry * dst_w + rx) * es,
                    dst_w * es, plane, cuvil_table.resize[dtype], rh, xi, wx0, wx1, rw, x_lo, x_hi, 0};
    cuvil_parallel_for(rh, (16384 + rw - 1) / rw, resize_range, &c);
    free(tables);
    return c.failed ? CUVIL_ENOMEM : CUVIL_OK;
}
