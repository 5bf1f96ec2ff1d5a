// nms_sort.c: nms's ISA-independent part: argument checks, the score-threshold filter, the
// candidate sort (score descending, index ascending: the order every ISA suppresses in) and the
// box decode to corners. Best-class decode and greedy suppression come from the dispatch table.
#include <stdlib.h>

#include "internal.h"

typedef struct {
    float score;
    int32_t index;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static float load_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

long cuvil_nms(const float *boxes, size_t n, ptrdiff_t box_stride, ptrdiff_t box_elem_stride, int box_format,
               const float *scores, size_t classes, ptrdiff_t score_stride, ptrdiff_t class_stride,
               float score_thr, float iou_thr, int agnostic, size_t max_det, float *out_boxes,
               float *out_scores, int32_t *out_classes, int32_t *out_index) {
    CHECK_READY();
    if ((box_format != 0 && box_format != 1) || classes == 0) return CUVIL_EINVAL;
    if (n == 0 || max_det == 0) return 0;
    if (!boxes || !scores || !out_boxes || !out_scores || !out_classes || !out_index) return CUVIL_EINVAL;
    // One allocation: best/cls per box, then per candidate: sort records, SoA box and class, flags.
    size_t bytes = n * (2 * sizeof(float) + sizeof(cand) + 5 * sizeof(float) + 3 * sizeof(int32_t)) + 64;
    uint8_t *mem = malloc(bytes);
    if (!mem) return CUVIL_ENOMEM;
    float *best = (float *)mem;
    int32_t *cls = (int32_t *)(best + n);
    cand *cands = (cand *)(cls + n);
    float *x1 = (float *)(cands + n), *y1 = x1 + n, *x2 = y1 + n, *y2 = x2 + n, *area = y2 + n;
    int32_t *ccls = (int32_t *)(area + n), *keep = ccls + n;
    uint32_t *supp = (uint32_t *)(keep + n);

    cuvil_table.nms_decode(scores, n, classes, score_stride, class_stride, best, cls);
    size_t m = 0;
    for (size_t i = 0; i < n; ++i)
        if (best[i] > score_thr) {
            cands[m].score = best[i];
            cands[m].index = (int32_t)i;
            ++m;
        }
    qsort(cands, m, sizeof(cand), cand_cmp);
    const uint8_t *bb = (const uint8_t *)boxes;
    for (size_t j = 0; j < m; ++j) {
        const uint8_t *b = bb + (ptrdiff_t)cands[j].index * box_stride;
        float a = load_f32(b), c = load_f32(b + box_elem_stride), d = load_f32(b + 2 * box_elem_stride),
              e = load_f32(b + 3 * box_elem_stride);
        if (box_format == 0) {
            float hw = d * 0.5f, hh = e * 0.5f;
            x1[j] = a - hw;
            y1[j] = c - hh;
            x2[j] = a + hw;
            y2[j] = c + hh;
        } else {
            x1[j] = a;
            y1[j] = c;
            x2[j] = d;
            y2[j] = e;
        }
        area[j] = (x2[j] - x1[j]) * (y2[j] - y1[j]);
        ccls[j] = cls[cands[j].index];
        supp[j] = 0;
    }
    size_t kept = cuvil_table.nms_suppress(x1, y1, x2, y2, area, ccls, m, iou_thr, agnostic != 0, max_det, keep, supp);
    for (size_t t = 0; t < kept; ++t) {
        size_t j = (size_t)keep[t];
        out_boxes[4 * t] = x1[j];
        out_boxes[4 * t + 1] = y1[j];
        out_boxes[4 * t + 2] = x2[j];
        out_boxes[4 * t + 3] = y2[j];
        out_scores[t] = cands[j].score;
        out_classes[t] = ccls[j];
        out_index[t] = cands[j].index;
    }
    free(mem);
    return (long)kept;
}
