// nms_scalar.c: reference best-class decode and greedy IoU suppression.
#include "internal.h"

CUVIL_HOST_CLONES
void cuvil_nms_decode_f32_f32_scalar(const float *scores, size_t n, size_t classes, ptrdiff_t score_stride,
                                     ptrdiff_t class_stride, float *best, int32_t *cls) {
    const uint8_t *base = (const uint8_t *)scores;
    for (size_t i = 0; i < n; ++i) {
        const uint8_t *row = base + (ptrdiff_t)i * score_stride;
        float b = -__builtin_inff();
        int32_t bc = 0;
        for (size_t c = 0; c < classes; ++c) {
            float s;
            memcpy(&s, row + (ptrdiff_t)c * class_stride, 4);
            if (s > b) {
                b = s;
                bc = (int32_t)c;
            }
        }
        best[i] = b;
        cls[i] = bc;
    }
}

CUVIL_HOST_CLONES
size_t cuvil_nms_suppress_s32_f32_scalar(const float *x1, const float *y1, const float *x2, const float *y2,
                                         const float *area, const int32_t *cls, size_t m, float iou_thr,
                                         int agnostic, size_t max_det, int32_t *keep, uint32_t *supp) {
    size_t kept = 0;
    for (size_t i = 0; i < m && kept < max_det; ++i) {
        if (supp[i]) continue;
        keep[kept++] = (int32_t)i;
        const float ax1 = x1[i], ay1 = y1[i], ax2 = x2[i], ay2 = y2[i], aa = area[i];
        const int32_t ac = cls[i];
        for (size_t j = i + 1; j < m; ++j) {
            float iw = (ax2 < x2[j] ? ax2 : x2[j]) - (ax1 > x1[j] ? ax1 : x1[j]);
            float ih = (ay2 < y2[j] ? ay2 : y2[j]) - (ay1 > y1[j] ? ay1 : y1[j]);
            iw = iw > 0.0f ? iw : 0.0f;
            ih = ih > 0.0f ? ih : 0.0f;
            float inter = iw * ih;
            float uni = (aa + area[j]) - inter;
            float iou = inter / uni;
            uint32_t hit = (iou > iou_thr) && (agnostic || cls[j] == ac);
            supp[j] |= hit;
        }
    }
    return kept;
}
