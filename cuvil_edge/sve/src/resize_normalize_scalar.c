// resize_normalize_scalar.c: reference bilinear resize fused with normalization, one output row
// per call (see cuvil_resize_fn in internal.h for the exact arithmetic every ISA follows).
#include "internal.h"

static void vlerp(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo, size_t x_hi,
                  float *tmp, size_t tmp_plane) {
    float *restrict t0 = tmp, *restrict t1 = tmp + tmp_plane, *restrict t2 = tmp + 2 * tmp_plane;
    for (size_t x = x_lo; x < x_hi; ++x) {
        t0[x] = (float)r0[3 * x] * wy0 + (float)r1[3 * x] * wy1;
        t1[x] = (float)r0[3 * x + 1] * wy0 + (float)r1[3 * x + 1] * wy1;
        t2[x] = (float)r0[3 * x + 2] * wy0 + (float)r1[3 * x + 2] * wy1;
    }
}

#define CUVIL_HLERP_BODY(T, CONV)                                                                        \
    for (int c = 0; c < 3; ++c) {                                                                        \
        const float *restrict t = tmp + (size_t)(swap ? 2 - c : c) * tmp_plane;                          \
        const float m = mean[c], s = inv_std[c];                                                         \
        T *restrict d = (T *)((uint8_t *)dst + (size_t)c * dst_plane_stride);                            \
        for (size_t i = 0; i < nw; ++i) {                                                                \
            const float *p = t + xi[i];                                                                  \
            float v = p[0] * wx0[i] + p[1] * wx1[i];                                                     \
            d[i] = CONV((v - m) * s);                                                                    \
        }                                                                                                \
    }

#define CUVIL_ID(v) (v)

void cuvil_resize_normalize_f32_u8_scalar(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo,
                                          size_t x_hi, float *tmp, size_t tmp_plane, const int32_t *xi,
                                          const float *wx0, const float *wx1, size_t nw, int swap,
                                          const float *mean, const float *inv_std, void *dst,
                                          size_t dst_plane_stride) {
    vlerp(r0, r1, wy0, wy1, x_lo, x_hi, tmp, tmp_plane);
    CUVIL_HLERP_BODY(float, CUVIL_ID)
}

void cuvil_resize_normalize_f16_u8_scalar(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo,
                                          size_t x_hi, float *tmp, size_t tmp_plane, const int32_t *xi,
                                          const float *wx0, const float *wx1, size_t nw, int swap,
                                          const float *mean, const float *inv_std, void *dst,
                                          size_t dst_plane_stride) {
    vlerp(r0, r1, wy0, wy1, x_lo, x_hi, tmp, tmp_plane);
    CUVIL_HLERP_BODY(uint16_t, cuvil_f32_to_f16)
}
