// quantize_neon.c: float32 <-> int8 with Advanced SIMD, 16 elements per step.
// fcvtns rounds half to even and saturates; sqxtn narrows with saturation (NaN -> 0).
#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error This file must be compiled for AArch64, Advanced SIMD.
#endif
#include <arm_neon.h>

#include "internal.h"

void cuvil_quantize_s8_f32_neon(const float *src, int8_t *dst, size_t n, float scale) {
    const float32x4_t s = vdupq_n_f32(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float32x4x4_t v = vld1q_f32_x4(src + i);
        int32x4_t a = vcvtnq_s32_f32(vdivq_f32(v.val[0], s)), b = vcvtnq_s32_f32(vdivq_f32(v.val[1], s));
        int32x4_t c = vcvtnq_s32_f32(vdivq_f32(v.val[2], s)), d = vcvtnq_s32_f32(vdivq_f32(v.val[3], s));
        int16x8_t ab = vqmovn_high_s32(vqmovn_s32(a), b), cd = vqmovn_high_s32(vqmovn_s32(c), d);
        vst1q_s8(dst + i, vqmovn_high_s16(vqmovn_s16(ab), cd));
    }
    for (; i < n; ++i) {
        float v = src[i] / scale;
        v = v < -128.0f ? -128.0f : v;
        v = v > 127.0f ? 127.0f : v;
        uint32_t b = cuvil_f32_bits(v + CUVIL_EXP_MAGIC);
        dst[i] = (v == v) ? (int8_t)(uint8_t)(b & 0xffu) : 0;
    }
}

void cuvil_dequantize_f32_s8_neon(const int8_t *src, float *dst, size_t n, float scale) {
    const float32x4_t s = vdupq_n_f32(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        int8x16_t q = vld1q_s8(src + i);
        int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
        float32x4x4_t o = {{vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), s),
                            vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), s),
                            vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), s),
                            vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), s)}};
        vst1q_f32_x4(dst + i, o);
    }
    for (; i < n; ++i) dst[i] = (float)src[i] * scale;
}
