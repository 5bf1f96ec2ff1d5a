// quantize_scalar.c: reference float32 <-> int8 symmetric (zero point 0) conversion.
// q = saturate(round_half_even(x / scale)): the division (not a reciprocal multiply) and the
// rounding follow ONNX Runtime's QuantizeLinear; NaN gives 0.
#include "internal.h"

CUVIL_HOST_CLONES
void cuvil_quantize_s8_f32_scalar(const float *src, int8_t *dst, size_t n, float scale) {
    for (size_t i = 0; i < n; ++i) {
        float v = src[i] / scale;
        v = v < -128.0f ? -128.0f : v;
        v = v > 127.0f ? 127.0f : v;
        v = v == v ? v : 0.0f;  // NaN -> 0
        // Adding and removing 1.5*2^23 rounds to an integer, half to even (default FP mode).
        v = (v + CUVIL_EXP_MAGIC) - CUVIL_EXP_MAGIC;
        dst[i] = (int8_t)(int32_t)v;
    }
}

CUVIL_HOST_CLONES
void cuvil_dequantize_f32_s8_scalar(const int8_t *src, float *dst, size_t n, float scale) {
    for (size_t i = 0; i < n; ++i) dst[i] = (float)src[i] * scale;
}
