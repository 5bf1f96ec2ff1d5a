// normalize_scalar.c: reference uint8 HWC -> float32/float16 CHW normalization.
// Portable C99; on x86 the compiler auto-vectorizes the loops (-O3).
#include "internal.h"

#define CUVIL_NORMALIZE_BODY(T, CONV)                                                                  \
    const int c0 = swap ? 2 : 0, c2 = swap ? 0 : 2;                                                    \
    const float m0 = mean[0], m1 = mean[1], m2 = mean[2];                                              \
    const float s0 = inv_std[0], s1 = inv_std[1], s2 = inv_std[2];                                     \
    for (size_t y = 0; y < rows; ++y) {                                                                \
        const uint8_t *restrict s = src + y * src_stride;                                              \
        T *restrict d0 = (T *)((uint8_t *)dst + y * dst_row_stride);                                   \
        T *restrict d1 = (T *)((uint8_t *)d0 + dst_plane_stride);                                      \
        T *restrict d2 = (T *)((uint8_t *)d1 + dst_plane_stride);                                      \
        for (size_t x = 0; x < width; ++x) {                                                           \
            d0[x] = CONV(((float)s[3 * x + c0] - m0) * s0);                                            \
            d1[x] = CONV(((float)s[3 * x + 1] - m1) * s1);                                             \
            d2[x] = CONV(((float)s[3 * x + c2] - m2) * s2);                                            \
        }                                                                                              \
    }

#define CUVIL_ID(v) (v)

CUVIL_HOST_CLONES
void cuvil_normalize_f32_u8_scalar(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                   const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                   size_t dst_plane_stride) {
    CUVIL_NORMALIZE_BODY(float, CUVIL_ID)
}

CUVIL_HOST_CLONES
void cuvil_normalize_f16_u8_scalar(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                   const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                   size_t dst_plane_stride) {
    CUVIL_NORMALIZE_BODY(uint16_t, cuvil_f32_to_f16)
}
