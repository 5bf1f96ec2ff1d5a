// nms_neon.c: best-class decode and IoU suppression with Advanced SIMD.
#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error This file must be compiled for AArch64, Advanced SIMD.
#endif
#include <arm_neon.h>

#include "internal.h"

void cuvil_nms_decode_f32_f32_neon(const float *scores, size_t n, size_t classes, ptrdiff_t score_stride,
                                   ptrdiff_t class_stride, float *best, int32_t *cls) {
    size_t i = 0;
    if (score_stride == 4 && class_stride % 4 == 0) {
        // Class-major (YOLOv8's (4 + C, N) output): 8 boxes per step, all classes in registers.
        const ptrdiff_t cs = class_stride / 4;
        for (; i + 8 <= n; i += 8) {
            float32x4_t b0 = vdupq_n_f32(-__builtin_inff()), b1 = b0;
            uint32x4_t c0 = vdupq_n_u32(0), c1 = c0;
            const float *p = scores + i;
            for (size_t c = 0; c < classes; ++c, p += cs) {
                float32x4_t s0 = vld1q_f32(p), s1 = vld1q_f32(p + 4);
                uint32x4_t g0 = vcgtq_f32(s0, b0), g1 = vcgtq_f32(s1, b1);
                uint32x4_t cv = vdupq_n_u32((uint32_t)c);
                b0 = vbslq_f32(g0, s0, b0);
                b1 = vbslq_f32(g1, s1, b1);
                c0 = vbslq_u32(g0, cv, c0);
                c1 = vbslq_u32(g1, cv, c1);
            }
            vst1q_f32(best + i, b0);
            vst1q_f32(best + i + 4, b1);
            vst1q_s32(cls + i, vreinterpretq_s32_u32(c0));
            vst1q_s32(cls + i + 4, vreinterpretq_s32_u32(c1));
        }
    } else if (class_stride == 4) {
        // Box-major ((N, C) rows): max over the row, then the first class reaching it.
        const uint8_t *base = (const uint8_t *)scores;
        for (; i < n; ++i) {
            const float *row = (const float *)(base + (ptrdiff_t)i * score_stride);
            float32x4_t mv = vdupq_n_f32(-__builtin_inff());
            size_t c = 0;
            for (; c + 4 <= classes; c += 4) mv = vmaxnmq_f32(mv, vld1q_f32(row + c));
            float b = vmaxnmvq_f32(mv);
            for (; c < classes; ++c) b = row[c] > b ? row[c] : b;
            int32_t bc = 0;
            for (c = 0; c + 4 <= classes; c += 4) {
                uint32x4_t eq = vceqq_f32(vld1q_f32(row + c), vdupq_n_f32(b));
                if (vmaxvq_u32(eq)) break;
            }
            for (; c < classes; ++c)
                if (row[c] == b) break;
            bc = c < classes ? (int32_t)c : 0;
            best[i] = b;
            cls[i] = bc;
        }
        return;
    }
    if (i < n) {
        const uint8_t *base = (const uint8_t *)scores + (ptrdiff_t)i * score_stride;
        cuvil_nms_decode_f32_f32_scalar((const float *)base, n - i, classes, score_stride, class_stride, best + i,
                                        cls + i);
    }
}

size_t cuvil_nms_suppress_s32_f32_neon(const float *x1, const float *y1, const float *x2, const float *y2,
                                       const float *area, const int32_t *cls, size_t m, float iou_thr,
                                       int agnostic, size_t max_det, int32_t *keep, uint32_t *supp) {
    size_t kept = 0;
    const float32x4_t zero = vdupq_n_f32(0.0f), thr = vdupq_n_f32(iou_thr);
    const uint32x4_t all = vdupq_n_u32(agnostic ? ~0u : 0u), one = vdupq_n_u32(1);
    for (size_t i = 0; i < m && kept < max_det; ++i) {
        if (supp[i]) continue;
        keep[kept++] = (int32_t)i;
        const float32x4_t ax1 = vdupq_n_f32(x1[i]), ay1 = vdupq_n_f32(y1[i]), ax2 = vdupq_n_f32(x2[i]),
                          ay2 = vdupq_n_f32(y2[i]), aa = vdupq_n_f32(area[i]);
        const int32x4_t ac = vdupq_n_s32(cls[i]);
        size_t j = i + 1;
        for (; j + 4 <= m; j += 4) {
            float32x4_t iw = vsubq_f32(vminq_f32(ax2, vld1q_f32(x2 + j)), vmaxq_f32(ax1, vld1q_f32(x1 + j)));
            float32x4_t ih = vsubq_f32(vminq_f32(ay2, vld1q_f32(y2 + j)), vmaxq_f32(ay1, vld1q_f32(y1 + j)));
            float32x4_t inter = vmulq_f32(vmaxq_f32(iw, zero), vmaxq_f32(ih, zero));
            float32x4_t uni = vsubq_f32(vaddq_f32(aa, vld1q_f32(area + j)), inter);
            uint32x4_t hit = vcgtq_f32(vdivq_f32(inter, uni), thr);
            hit = vandq_u32(hit, vorrq_u32(all, vceqq_s32(vld1q_s32(cls + j), ac)));
            vst1q_u32(supp + j, vorrq_u32(vld1q_u32(supp + j), vandq_u32(hit, one)));
        }
        for (; j < m; ++j) {
            float iw = (x2[i] < x2[j] ? x2[i] : x2[j]) - (x1[i] > x1[j] ? x1[i] : x1[j]);
            float ih = (y2[i] < y2[j] ? y2[i] : y2[j]) - (y1[i] > y1[j] ? y1[i] : y1[j]);
            iw = iw > 0.0f ? iw : 0.0f;
            ih = ih > 0.0f ? ih : 0.0f;
            float inter = iw * ih;
            float iou = inter / ((area[i] + area[j]) - inter);
            supp[j] |= (iou > iou_thr) && (agnostic || cls[j] == cls[i]);
        }
    }
    return kept;
}
