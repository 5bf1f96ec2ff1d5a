// internal.h: kernel signatures, the per-ISA kernel declarations and the helpers every ISA
// shares so that all paths compute bit-identical results. Not installed.
#ifndef CUVIL_INTERNAL_H
#define CUVIL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuvil_sve.h"

#define CUVIL_HIDDEN __attribute__((visibility("hidden")))
#define UNUSED(x) ((void)(x))

// The x86 host build has only the scalar ISA; GCC clones its loops for AVX2 (chosen at load by
// ifunc) next to the SSE2 baseline. No FMA either way (-ffp-contract=off), so results match.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CUVIL_HOST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CUVIL_HOST_CLONES
#endif
#ifdef CUVIL_DEBUG
#include <assert.h>
#define ASSUME(c) assert(c)
#define ASSERT(c) assert(c)
#else
#define ASSUME(c) ((void)0)
#define ASSERT(c) ((void)0)
#endif

// ---------------------------------------------------------------- kernel signatures
// normalize rows: dst points at channel 0 of the first row; channel c at dst + c*dst_plane.
typedef void (*cuvil_normalize_fn)(const uint8_t *src, size_t src_stride, size_t width, size_t rows, int swap,
                                   const float *mean, const float *inv_std, void *dst, size_t dst_row_stride,
                                   size_t dst_plane_stride);
// One output row of resize_normalize. Vertical pass: tmp[c*tmp_plane + x] = r0*wy0 + r1*wy1 for
// x in [x_lo, x_hi) and source channel c. Horizontal pass: out channel c, column i:
// v = tmp[sc][xi[i]]*wx0[i] + tmp[sc][xi[i]+1]*wx1[i]; out = (v - mean[c]) * inv_std[c].
typedef void (*cuvil_resize_fn)(const uint8_t *r0, const uint8_t *r1, float wy0, float wy1, size_t x_lo,
                                size_t x_hi, float *tmp, size_t tmp_plane, const int32_t *xi, const float *wx0,
                                const float *wx1, size_t nw, int swap, const float *mean, const float *inv_std,
                                void *dst, size_t dst_plane_stride);
typedef void (*cuvil_quantize_fn)(const float *src, int8_t *dst, size_t n, float scale);
typedef void (*cuvil_dequantize_fn)(const int8_t *src, float *dst, size_t n, float scale);
// One row: y = softmax(x) and the running top-k (ts/ti hold *count entries, sorted).
typedef void (*cuvil_softmax_fn)(const float *x, size_t n, float *y, size_t k, float *ts, int32_t *ti);
// Best class per box: best[i] = max_c scores[i][c], cls[i] = lowest c reaching it.
typedef void (*cuvil_nms_decode_fn)(const float *scores, size_t n, size_t classes, ptrdiff_t score_stride,
                                    ptrdiff_t class_stride, float *best, int32_t *cls);
// Greedy suppression over m candidates sorted by score (SoA); returns the kept count, keep[] the
// candidate positions. supp[] is m zeroed words of scratch.
typedef size_t (*cuvil_nms_suppress_fn)(const float *x1, const float *y1, const float *x2, const float *y2,
                                        const float *area, const int32_t *cls, size_t m, float iou_thr,
                                        int agnostic, size_t max_det, int32_t *keep, uint32_t *supp);

#define CUVIL_DECLARE_ISA(isa)                                                                                 \
    CUVIL_HIDDEN void cuvil_normalize_f32_u8_##isa(const uint8_t *, size_t, size_t, size_t, int, const float *, \
                                                   const float *, void *, size_t, size_t);                      \
    CUVIL_HIDDEN void cuvil_normalize_f16_u8_##isa(const uint8_t *, size_t, size_t, size_t, int, const float *, \
                                                   const float *, void *, size_t, size_t);                      \
    CUVIL_HIDDEN void cuvil_resize_normalize_f32_u8_##isa(                                                      \
        const uint8_t *, const uint8_t *, float, float, size_t, size_t, float *, size_t, const int32_t *,       \
        const float *, const float *, size_t, int, const float *, const float *, void *, size_t);               \
    CUVIL_HIDDEN void cuvil_resize_normalize_f16_u8_##isa(                                                      \
        const uint8_t *, const uint8_t *, float, float, size_t, size_t, float *, size_t, const int32_t *,       \
        const float *, const float *, size_t, int, const float *, const float *, void *, size_t);               \
    CUVIL_HIDDEN void cuvil_quantize_s8_f32_##isa(const float *, int8_t *, size_t, float);                      \
    CUVIL_HIDDEN void cuvil_dequantize_f32_s8_##isa(const int8_t *, float *, size_t, float);                    \
    CUVIL_HIDDEN void cuvil_softmax_topk_f32_f32_##isa(const float *, size_t, float *, size_t, float *,          \
                                                       int32_t *);                                              \
    CUVIL_HIDDEN void cuvil_nms_decode_f32_f32_##isa(const float *, size_t, size_t, ptrdiff_t, ptrdiff_t,       \
                                                     float *, int32_t *);                                       \
    CUVIL_HIDDEN size_t cuvil_nms_suppress_s32_f32_##isa(const float *, const float *, const float *,           \
                                                         const float *, const float *, const int32_t *, size_t, \
                                                         float, int, size_t, int32_t *, uint32_t *);

CUVIL_DECLARE_ISA(scalar)
#if defined(__aarch64__)
CUVIL_DECLARE_ISA(neon)
#if defined(CUVIL_HAVE_SVE)
CUVIL_DECLARE_ISA(sve)
CUVIL_DECLARE_ISA(sve2)
// Vector length in bytes, read by `rdvl` in a separate non-inlined function (sve_vl.c) so GCC
// cannot fold svcntb() into a constant (it does, and then the length of the build machine sticks).
CUVIL_HIDDEN size_t cuvil_sve_cntb(void);
#endif
#endif

// ---------------------------------------------------------------- the dispatch table (dispatch.c)
// One kernel per op, filled once when the library loads (and by cuvil_select_isa). The entry
// points (entry_checks.c, resize_tables.c, nms_sort.c) call through it; they refuse to run while
// cuvil_status is not CUVIL_OK (a rejected CUVIL_FORCE_ISA).
typedef struct {
    cuvil_normalize_fn normalize[2];  // [dtype]
    cuvil_resize_fn resize[2];
    cuvil_quantize_fn quantize;
    cuvil_dequantize_fn dequantize;
    cuvil_softmax_fn softmax;
    cuvil_nms_decode_fn nms_decode;
    cuvil_nms_suppress_fn nms_suppress;
} cuvil_kernel_set;

extern CUVIL_HIDDEN cuvil_kernel_set cuvil_table;
extern CUVIL_HIDDEN int cuvil_status;

#define CHECK_READY()                                    \
    do {                                                 \
        if (cuvil_status != CUVIL_OK) return cuvil_status; \
    } while (0)

static inline size_t cuvil_dtype_size(int dtype) { return dtype == CUVIL_F16 ? 2 : 4; }

// ---------------------------------------------------------------- CPU probe (cpu_probe.c)
// Bit mask (1 << enum cuvil_isa) of the ISAs this CPU and this build offer; *vector_bytes gets
// the SVE vector length (0 without SVE). Reads HWCAP once; needs no SVE itself.
CUVIL_HIDDEN unsigned cuvil_probe_isas(size_t *vector_bytes);

// ---------------------------------------------------------------- thread pool (thread_pool.c)
// fn(ctx, begin, end) over [0, n) split into up to cuvil_get_threads() contiguous ranges of at
// least min_chunk items; every range computes what a single call would, so results never depend
// on the thread count.
typedef void (*cuvil_range_fn)(void *ctx, size_t begin, size_t end);
CUVIL_HIDDEN void cuvil_parallel_for(size_t n, size_t min_chunk, cuvil_range_fn fn, void *ctx);
// Called once at load: reads CUVIL_NUM_THREADS and makes a forked child start a fresh pool.
CUVIL_HIDDEN void cuvil_pool_init(void);

// ---------------------------------------------------------------- shared helpers
static inline uint32_t cuvil_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float cuvil_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// float32 -> float16 bits, round to nearest even, as FCVT does (NaN -> quiet 0x7e00 | sign).
// After F. Giesen, "float_to_half_fast3_rtne" (public domain), written without branches (all
// three cases computed, one selected) so compilers vectorize loops that call it.
static inline uint16_t cuvil_f32_to_f16(float f) {
    const uint32_t x = cuvil_f32_bits(f);
    const uint32_t sign = x & 0x80000000u, u = x ^ sign;
    // Below 2^-14: subnormal half; adding 0.5 makes the FPU round at the right bit.
    const uint32_t sub = cuvil_f32_bits(cuvil_bits_f32(u) + cuvil_bits_f32(0x3f000000u)) - 0x3f000000u;
    // Normal: rebias the exponent ((15 - 127) << 23) and round half to even on bit 13.
    const uint32_t norm = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
    // >= 65536 or inf/NaN.
    const uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    const uint32_t o = u >= 0x47800000u ? big : (u < 0x38800000u ? sub : norm);
    return (uint16_t)(o | (sign >> 16));
}

// exp(x) for softmax (x <= 0 after max subtraction). Cephes-style: x clamped to >= -86,
// n = round(x*log2e) by the 1.5*2^23 trick, two-step ln2 reduction, degree-5 polynomial,
// 2^n by exponent add. Every ISA performs exactly these float operations in this order
// (files are built with -ffp-contract=off), so results are bit-identical.
#define CUVIL_EXP_LO (-86.0f)
#define CUVIL_EXP_LOG2E 1.44269504088896341f
#define CUVIL_EXP_MAGIC 12582912.0f
#define CUVIL_EXP_LN2_HI 0.693359375f
#define CUVIL_EXP_LN2_LO (-2.12194440e-4f)
#define CUVIL_EXP_P0 1.9875691500e-4f
#define CUVIL_EXP_P1 1.3981999507e-3f
#define CUVIL_EXP_P2 8.3334519073e-3f
#define CUVIL_EXP_P3 4.1665795894e-2f
#define CUVIL_EXP_P4 1.6666665459e-1f
#define CUVIL_EXP_P5 5.0000001201e-1f

static inline float cuvil_exp_ref(float x) {
    x = x < CUVIL_EXP_LO ? CUVIL_EXP_LO : x;
    float t = x * CUVIL_EXP_LOG2E + CUVIL_EXP_MAGIC;
    float n = t - CUVIL_EXP_MAGIC;
    float r = x - n * CUVIL_EXP_LN2_HI;
    r = r - n * CUVIL_EXP_LN2_LO;
    float z = r * r;
    float y = CUVIL_EXP_P0;
    y = y * r + CUVIL_EXP_P1;
    y = y * r + CUVIL_EXP_P2;
    y = y * r + CUVIL_EXP_P3;
    y = y * r + CUVIL_EXP_P4;
    y = y * r + CUVIL_EXP_P5;
    y = y * z;
    y = y + r;
    y = y + 1.0f;
    int32_t ni = (int32_t)(cuvil_f32_bits(t) - cuvil_f32_bits(CUVIL_EXP_MAGIC));
    return cuvil_bits_f32(cuvil_f32_bits(y) + ((uint32_t)ni << 23));
}

// Softmax sums run over 64 lanes (element i into lane i % 64) then this fixed tree, so the
// order is the same for every ISA and vector length up to 2048 bits.
#define CUVIL_SUM_LANES 64
static inline float cuvil_sum64(float *acc) {
    for (size_t w = CUVIL_SUM_LANES / 2; w >= 1; w /= 2)
        for (size_t j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
    return acc[0];
}

// Insert (p, i) into the sorted top-k list (descending p; equal p keeps the earlier index
// first). Callers scan indices in increasing order and only call when p beats the threshold.
static inline void cuvil_topk_insert(float p, int32_t i, size_t k, size_t *count, float *ts, int32_t *ti) {
    size_t c = *count;
    size_t pos = c;
    while (pos > 0 && ts[pos - 1] < p) --pos;
    if (pos >= k) return;
    size_t last = c < k ? c : k - 1;
    for (size_t j = last; j > pos; --j) {
        ts[j] = ts[j - 1];
        ti[j] = ti[j - 1];
    }
    ts[pos] = p;
    ti[pos] = i;
    if (c < k) *count = c + 1;
}

// Threshold a new probability must beat to enter the top-k.
static inline float cuvil_topk_threshold(size_t k, size_t count, const float *ts) {
    return (k == 0 || count < k) ? -__builtin_inff() : ts[k - 1];
}

#endif
