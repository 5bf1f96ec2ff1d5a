// normalize_scalar.c: reference uint8 HWC -> float32/float16 CHW normalization.
// Portable C99; the channel order is a compile-time constant in each loop so compilers can
// vectorize the stride-3 loads (x86 host: SSE2 and AVX2 clones).
#include "internal.h"

#define CUVIL_ID(v) (v)

#define NORMALIZE_ROWS(NAME, T, CONV)                                                                   \
    static inline __attribute__((always_inline)) void NAME(                                             \
        const uint8_t *src, size_t src_stride, size_t width, size_t rows, const float *mean,           \
        const float *inv_std, void *dst, size_t dst_row_stride, size_t dst_plane_stride, const int c0) { \
        const int c2 = 2 - c0;                                                                          \
        const float m0 = mean[0], m1 = mean[1], m2 = mean[2];                                           \
        const float s0 = inv_std[0], s1 = inv_std[1], s2 = inv_std[2];                                  \
        for (size_t y = 0; y < rows; ++y) {                                                             \
            const uint8_t *restrict s = src + y * src_stride;                                           \
            T *restrict d0 = (T *)((uint8_t *)dst + y * dst_row_stride);                                \
            T *restrict d1 = (T *)((uint8_t *)d0 + dst_plane_stride);                                   \
            T *restrict d2 = (T *)((uint8_t *)d1 + dst_plane_stride);                                   \
            for (size_t x = 0; x < width; ++x) {                                                        \
                d0[x] = CONV(((float)s[3 * x + c0] - m0) * s0);                                         \
                d1[x] = CONV(((float)s[3 * x + 1] - m1) * s1);                                          \
                d2[x] = CONV(((float)s[3 * x + c2] - m2) * s2);                                         \
            }                                                                                           \
        }                                                                                               \
    }

NORMALIZE_ROWS(rows_f32, float, CUVIL_ID)
NORMALIZE_ROWS(rows_f16, uint16_t, cuvil_f32_to_f16)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
// x86 hosts with AVX2 + F16C: normalize a chunk of pixels to float32 in a stack buffer (the
// vectorized float32 loop), then convert 8 at a time with vcvtps2ph (round to nearest even,
// the same bits as cuvil_f32_to_f16).
#define F16C_CHUNK 512
static inline __attribute__((always_inline, target("avx2,f16c"))) void f16c_rows(const uint8_t *src, size_t src_stride, size_t width,
                                                            size_t rows, const float *mean, const float *inv_std,
                                                            void *dst, size_t dst_row_stride,
                                                            size_t dst_plane_stride, const int c0) {
    float buf[3][F16C_CHUNK];
    const int c2 = 2 - c0;
    const float m0 = mean[0], m1 = mean[1], m2 = mean[2], s0 = inv_std[0], s1 = inv_std[1], s2 = inv_std[2];
    for (size_t y = 0; y < rows; ++y) {
        const uint8_t *s = src + y * src_stride;
        uint16_t *d[3];
        d[0] = (uint16_t *)((uint8_t *)dst + y * dst_row_stride);
        d[1] = (uint16_t *)((uint8_t *)d[0] + dst_plane_stride);
        d[2] = (uint16_t *)((uint8_t *)d[1] + dst_plane_stride);
        for (size_t x0 = 0; x0 < width; x0 += F16C_CHUNK) {
            const size_t n = width - x0 < F16C_CHUNK ? width - x0 : F16C_CHUNK;
            const uint8_t *p = s + 3 * x0;
            for (size_t x = 0; x < n; ++x) {
                buf[0][x] = ((float)p[3 * x + c0] - m0) * s0;
                buf[1][x] = ((float)p[3 * x + 1] - m1) * s1;
                buf[2][x] = ((float)p[3 * x + c2] - m2) * s2;
            }
            for (int c = 0; c < 3; ++c) {
                size_t x = 0;
                for (; x + 8 <= n; x += 8)
                    _mm_storeu_si128((__m128i *)(d[c] + x0 + x),
                                     _mm256_cvtps_ph(_mm256_loadu_ps(buf[c] + x), _MM_FROUND_TO_NEAREST_INT));
                for (; x < n; ++x) d[c][x0 + x] = cuvil_f32_to_f16(buf[c][x]);
            }
        }
    }
}

__attribute__((target("avx2,f16c"))) static void rows_f16c(const uint8_t *src, size_t src_stride, size_t width,
                                                          size_t rows, const float *mean, const float *inv_std,
                                                          void *dst, size_t dst_row_stride, size_t dst_plane_stride,
                                                          int swap) {
    if (swap)
        f16c_rows(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 2);
    else
        f16c_rows(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 0);
}
#define CUVIL_HAVE_F16C_PATH 1
#endif

CUVIL_HOST_CLONES
void cuvil_normalize_f32_u8_scalar(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                   const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                   size_t dst_plane_stride) {
    if (swap)
        rows_f32(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 2);
    else
        rows_f32(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 0);
}

CUVIL_HOST_CLONES
void cuvil_normalize_f16_u8_scalar(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                   const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                   size_t dst_plane_stride) {
#if defined(CUVIL_HAVE_F16C_PATH)
    if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2")) {
        rows_f16c(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, swap);
        return;
    }
#endif
    if (swap)
        rows_f16(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 2);
    else
        rows_f16(src, src_stride, width, rows, mean, inv_std, dst, dst_row_stride, dst_plane_stride, 0);
}
