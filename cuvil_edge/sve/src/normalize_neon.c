// normalize_neon.c: uint8 HWC -> float32/float16 CHW with Advanced SIMD.
// 16 pixels per step (ld3 deinterleaves RGB), scalar tail with the same float operations.
#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error This file must be compiled for AArch64, Advanced SIMD.
#endif
#include <arm_neon.h>

#include "internal.h"

static inline void widen(uint8x16_t v, float32x4_t m, float32x4_t s, float32x4_t *o0, float32x4_t *o1,
                         float32x4_t *o2, float32x4_t *o3) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    *o0 = vmulq_f32(vsubq_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), m), s);
    *o1 = vmulq_f32(vsubq_f32(vcvtq_f32_u32(vmovl_high_u16(lo)), m), s);
    *o2 = vmulq_f32(vsubq_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), m), s);
    *o3 = vmulq_f32(vsubq_f32(vcvtq_f32_u32(vmovl_high_u16(hi)), m), s);
}

static inline void store_f32(float *d, float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t e) {
    float32x4x4_t v = {{a, b, c, e}};
    vst1q_f32_x4(d, v);
}

static inline void store_f16(uint16_t *d, float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t e) {
    float16x8_t lo = vcvt_high_f16_f32(vcvt_f16_f32(a), b);
    float16x8_t hi = vcvt_high_f16_f32(vcvt_f16_f32(c), e);
    vst1q_u16(d, vreinterpretq_u16_f16(lo));
    vst1q_u16(d + 8, vreinterpretq_u16_f16(hi));
}

#define CUVIL_ID(v) (v)
#define NORMALIZE_NEON(T, STORE, CONV)                                                                 \
    const int c0 = swap ? 2 : 0, c2 = swap ? 0 : 2;                                                    \
    const float32x4_t m0 = vdupq_n_f32(mean[0]), m1 = vdupq_n_f32(mean[1]), m2 = vdupq_n_f32(mean[2]); \
    const float32x4_t s0 = vdupq_n_f32(inv_std[0]), s1 = vdupq_n_f32(inv_std[1]),                      \
                      s2 = vdupq_n_f32(inv_std[2]);                                                    \
    for (size_t y = 0; y < rows; ++y) {                                                                \
        const uint8_t *s = src + y * src_stride;                                                       \
        T *d0 = (T *)((uint8_t *)dst + y * dst_row_stride);                                            \
        T *d1 = (T *)((uint8_t *)d0 + dst_plane_stride);                                               \
        T *d2 = (T *)((uint8_t *)d1 + dst_plane_stride);                                               \
        size_t x = 0;                                                                                  \
        for (; x + 16 <= width; x += 16) {                                                             \
            uint8x16x3_t v = vld3q_u8(s + 3 * x);                                                      \
            float32x4_t a, b, c, e;                                                                    \
            widen(v.val[c0], m0, s0, &a, &b, &c, &e);                                                  \
            STORE(d0 + x, a, b, c, e);                                                                 \
            widen(v.val[1], m1, s1, &a, &b, &c, &e);                                                   \
            STORE(d1 + x, a, b, c, e);                                                                 \
            widen(v.val[c2], m2, s2, &a, &b, &c, &e);                                                  \
            STORE(d2 + x, a, b, c, e);                                                                 \
        }                                                                                              \
        for (; x < width; ++x) {                                                                       \
            d0[x] = CONV(((float)s[3 * x + c0] - mean[0]) * inv_std[0]);                               \
            d1[x] = CONV(((float)s[3 * x + 1] - mean[1]) * inv_std[1]);                                \
            d2[x] = CONV(((float)s[3 * x + c2] - mean[2]) * inv_std[2]);                               \
        }                                                                                              \
    }

void cuvil_normalize_f32_u8_neon(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                 const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                 size_t dst_plane_stride) {
    NORMALIZE_NEON(float, store_f32, CUVIL_ID)
}

void cuvil_normalize_f16_u8_neon(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                 const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                 size_t dst_plane_stride) {
    NORMALIZE_NEON(uint16_t, store_f16, cuvil_f32_to_f16)
}
