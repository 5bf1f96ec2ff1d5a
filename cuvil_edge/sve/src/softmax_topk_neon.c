// softmax_topk_neon.c: softmax + top-k over one row with Advanced SIMD. The 64-lane sum lives
// in 16 registers; the top-k scan only leaves the vector loop when a lane beats the threshold.
#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error This file must be compiled for AArch64, Advanced SIMD.
#endif
#include <arm_neon.h>

#include "internal.h"

static inline float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(CUVIL_EXP_LO));
    const float32x4_t magic = vdupq_n_f32(CUVIL_EXP_MAGIC);
    float32x4_t t = vaddq_f32(vmulq_f32(x, vdupq_n_f32(CUVIL_EXP_LOG2E)), magic);
    float32x4_t n = vsubq_f32(t, magic);
    float32x4_t r = vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(CUVIL_EXP_LN2_HI)));
    r = vsubq_f32(r, vmulq_f32(n, vdupq_n_f32(CUVIL_EXP_LN2_LO)));
    float32x4_t z = vmulq_f32(r, r);
    float32x4_t y = vdupq_n_f32(CUVIL_EXP_P0);
    y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(CUVIL_EXP_P1));
    y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(CUVIL_EXP_P2));
    y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(CUVIL_EXP_P3));
    y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(CUVIL_EXP_P4));
    y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(CUVIL_EXP_P5));
    y = vmulq_f32(y, z);
    y = vaddq_f32(y, r);
    y = vaddq_f32(y, vdupq_n_f32(1.0f));
    int32x4_t ni = vsubq_s32(vreinterpretq_s32_f32(t), vreinterpretq_s32_f32(magic));
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), vshlq_n_s32(ni, 23)));
}

void cuvil_softmax_topk_f32_f32_neon(const float *x, size_t n, float *y, size_t k, float *ts, int32_t *ti) {
    size_t i = 0;
    float32x4_t mv = vdupq_n_f32(-__builtin_inff());
    for (; i + 4 <= n; i += 4) mv = vmaxq_f32(mv, vld1q_f32(x + i));
    float mx = vmaxvq_f32(mv);
    for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    const float32x4_t m = vdupq_n_f32(mx);

    float32x4_t acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = vdupq_n_f32(0.0f);
    i = 0;
    for (; i + CUVIL_SUM_LANES <= n; i += CUVIL_SUM_LANES) {
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
            float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i + 4 * j), m));
            vst1q_f32(y + i + 4 * j, e);
            acc[j] = vaddq_f32(acc[j], e);
        }
    }
    float a[CUVIL_SUM_LANES];
    for (int j = 0; j < 16; ++j) vst1q_f32(a + 4 * j, acc[j]);
    for (; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), m));
        vst1q_f32(y + i, e);
        float *ap = a + (i % CUVIL_SUM_LANES);
        vst1q_f32(ap, vaddq_f32(vld1q_f32(ap), e));
    }
    for (; i < n; ++i) {
        float e = cuvil_exp_ref(x[i] - mx);
        y[i] = e;
        a[i % CUVIL_SUM_LANES] += e;
    }
    const float sum = cuvil_sum64(a);
    const float32x4_t sv = vdupq_n_f32(sum);
    size_t count = 0;
    float thr = cuvil_topk_threshold(k, count, ts);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t p = vdivq_f32(vld1q_f32(y + i), sv);
        vst1q_f32(y + i, p);
        if (k && vmaxvq_u32(vcgtq_f32(p, vdupq_n_f32(thr)))) {
            for (size_t l = 0; l < 4; ++l)
                if (y[i + l] > thr) {
                    cuvil_topk_insert(y[i + l], (int32_t)(i + l), k, &count, ts, ti);
                    thr = cuvil_topk_threshold(k, count, ts);
                }
        }
    }
    for (; i < n; ++i) {
        float p = y[i] / sum;
        y[i] = p;
        if (k && p > thr) {
            cuvil_topk_insert(p, (int32_t)i, k, &count, ts, ti);
            thr = cuvil_topk_threshold(k, count, ts);
        }
    }
}
