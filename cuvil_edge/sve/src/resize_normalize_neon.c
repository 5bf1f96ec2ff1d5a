// resize_normalize_neon.c: one output row of bilinear resize + normalize with Advanced SIMD.
// Vertical pass 16 pixels per step into planar float rows; horizontal pass 4 outputs per step,
// each loading its (x0, x0 + 1) pair as one 64-bit lane.
#if !defined(__aarch64__) || !defined(__ARM_NEON)
#error This file must be compiled for AArch64, Advanced SIMD.
#endif
#include <arm_neon.h>

#include "internal.h"

static inline void lerp16(uint8x16_t a, uint8x16_t b, float32x4_t w0, float32x4_t w1, float *t) {
    uint16x8_t alo = vmovl_u8(vget_low_u8(a)), ahi = vmovl_high_u8(a);
    uint16x8_t blo = vmovl_u8(vget_low_u8(b)), bhi = vmovl_high_u8(b);
#define L(A, B) vaddq_f32(vmulq_f32(vcvtq_f32_u32(A), w0), vmulq_f32(vcvtq_f32_u32(B), w1))
    float32x4x4_t o = {{L(vmovl_u16(vget_low_u16(alo)), vmovl_u16(vget_low_u16(blo))),
                        L(vmovl_high_u16(alo), vmovl_high_u16(blo)),
                        L(vmovl_u16(vget_low_u16(ahi)), vmovl_u16(vget_low_u16(bhi))),
                        L(vmovl_high_u16(ahi), vmovl_high_u16(bhi))}};
#undef L
    vst1q_f32_x4(t, o);
}

static void vlerp(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo, size_t x_hi,
                  float *tmp, size_t tmp_plane) {
    const float32x4_t w0 = vdupq_n_f32(wy0), w1 = vdupq_n_f32(wy1);
    size_t x = x_lo;
    for (; x + 16 <= x_hi; x += 16) {
        uint8x16x3_t a = vld3q_u8(r0 + 3 * x), b = vld3q_u8(r1 + 3 * x);
        lerp16(a.val[0], b.val[0], w0, w1, tmp + x);
        lerp16(a.val[1], b.val[1], w0, w1, tmp + tmp_plane + x);
        lerp16(a.val[2], b.val[2], w0, w1, tmp + 2 * tmp_plane + x);
    }
    for (; x < x_hi; ++x)
        for (int c = 0; c < 3; ++c)
            tmp[c * tmp_plane + x] = (float)r0[3 * x + c] * wy0 + (float)r1[3 * x + c] * wy1;
}

static inline float32x4_t hlerp4(const float *t, const int32_t *xi, float32x4_t w0, float32x4_t w1,
                                 float32x4_t m, float32x4_t s) {
    float32x4_t p01 = vcombine_f32(vld1_f32(t + xi[0]), vld1_f32(t + xi[1]));
    float32x4_t p23 = vcombine_f32(vld1_f32(t + xi[2]), vld1_f32(t + xi[3]));
    float32x4_t v = vaddq_f32(vmulq_f32(vuzp1q_f32(p01, p23), w0), vmulq_f32(vuzp2q_f32(p01, p23), w1));
    return vmulq_f32(vsubq_f32(v, m), s);
}

// Direct path for downscales beyond 2x: 4 output columns per step. Each tap window is one
// 32-bit load: bytes 3*x0 .. 3*x0+3 (pixel x0) and 3*x0+2 .. 3*x0+5 (pixel x0 + 1), so no load
// passes the end of the row; tbl moves channel bytes into 32-bit lanes. Same float operations
// as the separable path.
static inline uint32x4_t win4(const uint8_t *r, const int32_t *xi, int k) {
    uint32_t w[4];
    for (int j = 0; j < 4; ++j) memcpy(&w[j], r + 3 * (size_t)xi[j] + k, 4);
    return vld1q_u32(w);
}

static inline float32x4_t byte_lane(uint32x4_t w, uint8x16_t idx) {
    return vcvtq_f32_u32(vreinterpretq_u32_u8(vqtbl1q_u8(vreinterpretq_u8_u32(w), idx)));
}

static void direct_f32(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, const int32_t *xi,
                       const float *wx0, const float *wx1, size_t nw, int swap, const float *mean,
                       const float *inv_std, void *dst, size_t dst_plane_stride, int f16) {
    static const uint8_t idx_bytes[4][16] = {
        {0, 255, 255, 255, 4, 255, 255, 255, 8, 255, 255, 255, 12, 255, 255, 255},
        {1, 255, 255, 255, 5, 255, 255, 255, 9, 255, 255, 255, 13, 255, 255, 255},
        {2, 255, 255, 255, 6, 255, 255, 255, 10, 255, 255, 255, 14, 255, 255, 255},
        {3, 255, 255, 255, 7, 255, 255, 255, 11, 255, 255, 255, 15, 255, 255, 255}};
    const uint8x16_t ix[4] = {vld1q_u8(idx_bytes[0]), vld1q_u8(idx_bytes[1]), vld1q_u8(idx_bytes[2]),
                              vld1q_u8(idx_bytes[3])};
    const float32x4_t W0 = vdupq_n_f32(wy0), W1 = vdupq_n_f32(wy1);
    const int o0 = swap ? 2 : 0;
    int oc[3] = {o0, 1, 2 - o0};  // output channel of each source channel
    float32x4_t M[3], S[3];
    for (int c = 0; c < 3; ++c) {
        M[c] = vdupq_n_f32(mean[oc[c]]);
        S[c] = vdupq_n_f32(inv_std[oc[c]]);
    }
    size_t i = 0;
    for (; i + 4 <= nw; i += 4) {
        const uint32x4_t a0 = win4(r0, xi + i, 0), a1 = win4(r0, xi + i, 2);
        const uint32x4_t b0 = win4(r1, xi + i, 0), b1 = win4(r1, xi + i, 2);
        const float32x4_t u = vld1q_f32(wx0 + i), v = vld1q_f32(wx1 + i);
        for (int c = 0; c < 3; ++c) {
            // Channel c of pixel x0 is byte c of window 0; of pixel x0 + 1, byte c + 1 of window 2.
            float32x4_t t0 = vaddq_f32(vmulq_f32(byte_lane(a0, ix[c]), W0), vmulq_f32(byte_lane(b0, ix[c]), W1));
            float32x4_t t1 =
                vaddq_f32(vmulq_f32(byte_lane(a1, ix[c + 1]), W0), vmulq_f32(byte_lane(b1, ix[c + 1]), W1));
            float32x4_t val = vaddq_f32(vmulq_f32(t0, u), vmulq_f32(t1, v));
            val = vmulq_f32(vsubq_f32(val, M[c]), S[c]);
            uint8_t *d = (uint8_t *)dst + (size_t)oc[c] * dst_plane_stride;
            if (f16)
                vst1_u16((uint16_t *)d + i, vreinterpret_u16_f16(vcvt_f16_f32(val)));
            else
                vst1q_f32((float *)d + i, val);
        }
    }
    for (; i < nw; ++i) {
        const uint8_t *a = r0 + 3 * (size_t)xi[i], *b = r1 + 3 * (size_t)xi[i];
        for (int c = 0; c < 3; ++c) {
            float p = ((float)a[c] * wy0 + (float)b[c] * wy1) * wx0[i] +
                      ((float)a[3 + c] * wy0 + (float)b[3 + c] * wy1) * wx1[i];
            p = (p - mean[oc[c]]) * inv_std[oc[c]];
            uint8_t *d = (uint8_t *)dst + (size_t)oc[c] * dst_plane_stride;
            if (f16)
                ((uint16_t *)d)[i] = cuvil_f32_to_f16(p);
            else
                ((float *)d)[i] = p;
        }
    }
}

#define CUVIL_ID(v) (v)
#define HLERP_NEON(T, STORE4, CONV)                                                                      \
    const float *t[3];                                                                                   \
    T *d[3];                                                                                             \
    float32x4_t mv[3], sv[3];                                                                            \
    for (int c = 0; c < 3; ++c) {                                                                        \
        t[c] = tmp + (size_t)(swap ? 2 - c : c) * tmp_plane;                                             \
        d[c] = (T *)((uint8_t *)dst + (size_t)c * dst_plane_stride);                                     \
        mv[c] = vdupq_n_f32(mean[c]);                                                                    \
        sv[c] = vdupq_n_f32(inv_std[c]);                                                                 \
    }                                                                                                    \
    size_t i = 0;                                                                                        \
    for (; i + 4 <= nw; i += 4) {                                                                        \
        float32x4_t w0 = vld1q_f32(wx0 + i), w1 = vld1q_f32(wx1 + i);                                    \
        STORE4(d[0] + i, hlerp4(t[0], xi + i, w0, w1, mv[0], sv[0]));                                    \
        STORE4(d[1] + i, hlerp4(t[1], xi + i, w0, w1, mv[1], sv[1]));                                    \
        STORE4(d[2] + i, hlerp4(t[2], xi + i, w0, w1, mv[2], sv[2]));                                    \
    }                                                                                                    \
    for (; i < nw; ++i)                                                                                  \
        for (int c = 0; c < 3; ++c) {                                                                    \
            const float *p = t[c] + xi[i];                                                               \
            float v = p[0] * wx0[i] + p[1] * wx1[i];                                                     \
            d[c][i] = CONV((v - mean[c]) * inv_std[c]);                                                  \
        }

#define STORE4_F32(p, v) vst1q_f32((p), (v))
#define STORE4_F16(p, v) vst1_u16((p), vreinterpret_u16_f16(vcvt_f16_f32(v)))

void cuvil_resize_normalize_f32_u8_neon(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo,
                                        size_t x_hi, float *tmp, size_t tmp_plane, const int32_t *xi,
                                        const float *wx0, const float *wx1, size_t nw, int swap,
                                        const float *mean, const float *inv_std, void *dst,
                                        size_t dst_plane_stride) {
    if (2 * nw < x_hi - x_lo) {
        direct_f32(r0, r1, wy0, wy1, xi, wx0, wx1, nw, swap, mean, inv_std, dst, dst_plane_stride, 0);
        return;
    }
    vlerp(r0, r1, wy0, wy1, x_lo, x_hi, tmp, tmp_plane);
    HLERP_NEON(float, STORE4_F32, CUVIL_ID)
}

void cuvil_resize_normalize_f16_u8_neon(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo,
                                        size_t x_hi, float *tmp, size_t tmp_plane, const int32_t *xi,
                                        const float *wx0, const float *wx1, size_t nw, int swap,
                                        const float *mean, const float *inv_std, void *dst,
                                        size_t dst_plane_stride) {
    if (2 * nw < x_hi - x_lo) {
        direct_f32(r0, r1, wy0, wy1, xi, wx0, wx1, nw, swap, mean, inv_std, dst, dst_plane_stride, 1);
        return;
    }
    vlerp(r0, r1, wy0, wy1, x_lo, x_hi, tmp, tmp_plane);
    HLERP_NEON(uint16_t, STORE4_F16, cuvil_f32_to_f16)
}
