// entry_checks.c: the public entry points of normalize, quantize/dequantize and softmax_topk:
// argument checks (a bad call returns CUVIL_EINVAL, never aborts), then the work split over the
// thread pool and run through the dispatch table. resize_normalize and nms, which also build
// tables and sort, have their own files (resize_tables.c, nms_sort.c).
#include <stdlib.h>

#include "internal.h"

typedef struct {
    const uint8_t *src;
    size_t height, width, src_stride;
    int swap, dtype;
    const float *mean, *inv_std;
    uint8_t *dst;
} normalize_ctx;

static void normalize_range(void *p, size_t y0, size_t y1) {
    const normalize_ctx *c = p;
    const size_t es = cuvil_dtype_size(c->dtype);
    cuvil_table.normalize[c->dtype](c->src + y0 * c->src_stride, c->src_stride, c->width, y1 - y0, c->swap,
                                    c->mean, c->inv_std, c->dst + y0 * c->width * es, c->width * es,
                                    c->height * c->width * es);
}

int cuvil_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride, int swap,
                    const float *mean, const float *inv_std, void *dst, int dtype) {
    CHECK_READY();
    if ((dtype != CUVIL_F32 && dtype != CUVIL_F16) || src_stride < 3 * width) return CUVIL_EINVAL;
    if (height == 0 || width == 0) return CUVIL_OK;
    if (!src || !dst || !mean || !inv_std) return CUVIL_EINVAL;
    normalize_ctx c = {src, height, width, src_stride, swap != 0, dtype, mean, inv_std, dst};
    cuvil_parallel_for(height, (65536 + width - 1) / width, normalize_range, &c);
    return CUVIL_OK;
}

typedef struct {
    const void *src;
    void *dst;
    size_t channels, inner;
    const float *scales;
    int dequant;
} qdq_ctx;

// Ranges over elements (per tensor) or over (outer, channel) blocks (per channel).
static void qdq_range(void *p, size_t b, size_t e) {
    const qdq_ctx *c = p;
    if (c->channels == 1) {
        if (c->dequant)
            cuvil_table.dequantize((const int8_t *)c->src + b, (float *)c->dst + b, e - b, c->scales[0]);
        else
            cuvil_table.quantize((const float *)c->src + b, (int8_t *)c->dst + b, e - b, c->scales[0]);
        return;
    }
    for (size_t blk = b; blk < e; ++blk) {
        const size_t off = blk * c->inner;
        const float s = c->scales[blk % c->channels];
        if (c->dequant)
            cuvil_table.dequantize((const int8_t *)c->src + off, (float *)c->dst + off, c->inner, s);
        else
            cuvil_table.quantize((const float *)c->src + off, (int8_t *)c->dst + off, c->inner, s);
    }
}

static int qdq(const void *src, void *dst, size_t outer, size_t channels, size_t inner, const float *scales,
               int dequant) {
    CHECK_READY();
    if (!scales || channels == 0) return CUVIL_EINVAL;
    const size_t total = outer * channels * inner;
    if (total == 0) return CUVIL_OK;
    if (!src || !dst) return CUVIL_EINVAL;
    qdq_ctx c = {src, dst, channels, inner, scales, dequant};
    if (channels == 1)
        cuvil_parallel_for(total, 1u << 18, qdq_range, &c);
    else
        cuvil_parallel_for(outer * channels, ((1u << 18) + inner - 1) / inner, qdq_range, &c);
    return CUVIL_OK;
}

int cuvil_quantize(const float *src, int8_t *dst, size_t outer, size_t channels, size_t inner,
                   const float *scales) {
    return qdq(src, dst, outer, channels, inner, scales, 0);
}

int cuvil_dequantize(const int8_t *src, float *dst, size_t outer, size_t channels, size_t inner,
                     const float *scales) {
    return qdq(src, dst, outer, channels, inner, scales, 1);
}

int cuvil_softmax_topk(const float *src, size_t rows, size_t n, size_t src_stride, float *probs, size_t k,
                       float *top_scores, int32_t *top_idx) {
    CHECK_READY();
    if (k > n || (k && (!top_scores || !top_idx)) || src_stride < n * sizeof(float)) return CUVIL_EINVAL;
    if (rows == 0 || n == 0) return CUVIL_OK;
    if (!src) return CUVIL_EINVAL;
    float *scratch = NULL;
    if (!probs) {
        scratch = malloc(n * sizeof(float));
        if (!scratch) return CUVIL_ENOMEM;
    }
    for (size_t r = 0; r < rows; ++r) {
        const float *x = (const float *)((const uint8_t *)src + r * src_stride);
        float *y = probs ? probs + r * n : scratch;
        cuvil_table.softmax(x, n, y, k, k ? top_scores + r * k : NULL, k ? top_idx + r * k : NULL);
    }
    free(scratch);
    return CUVIL_OK;
}
