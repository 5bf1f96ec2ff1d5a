// dispatch.c: CPU probing, the one dispatch table, and the ISA-independent parts of each op
// (argument checks, resize coordinate tables, letterbox fill, NMS candidate sort).
// Built at the library baseline (-march=armv8-a on aarch64): nothing here may need SVE.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#ifndef HWCAP2_SVE2
#define HWCAP2_SVE2 (1UL << 1)
#endif
#endif

typedef struct {
    cuvil_normalize_fn normalize[2];  // [dtype]
    cuvil_resize_fn resize[2];
    cuvil_quantize_fn quantize;
    cuvil_dequantize_fn dequantize;
    cuvil_softmax_fn softmax;
    cuvil_nms_decode_fn nms_decode;
    cuvil_nms_suppress_fn nms_suppress;
} kernel_set;

#define KERNEL_SET(isa)                                                                           \
    {                                                                                             \
        {cuvil_normalize_f32_u8_##isa, cuvil_normalize_f16_u8_##isa},                             \
            {cuvil_resize_normalize_f32_u8_##isa, cuvil_resize_normalize_f16_u8_##isa},           \
            cuvil_quantize_s8_f32_##isa, cuvil_dequantize_f32_s8_##isa,                           \
            cuvil_softmax_topk_f32_f32_##isa, cuvil_nms_decode_f32_f32_##isa,                     \
            cuvil_nms_suppress_s32_f32_##isa                                                      \
    }

static const kernel_set g_sets[4] = {
    KERNEL_SET(scalar),
#if defined(__aarch64__)
    KERNEL_SET(neon),
#if defined(CUVIL_HAVE_SVE)
    KERNEL_SET(sve),
    KERNEL_SET(sve2),
#endif
#endif
};

static const char *const g_isa_names[4] = {"scalar", "neon", "sve", "sve2"};

static kernel_set g_table;            // the dispatch table, filled once at load
static int g_isa[CUVIL_OP_COUNT];     // ISA chosen per op
static unsigned g_available = 1u;     // bit mask of ISAs the CPU and the build offer
static size_t g_vector_bytes = 0;     // SVE vector length (cntb) read at load
static int g_status = CUVIL_OK;
static int g_threads = 1;             // worker threads per call (CUVIL_NUM_THREADS, cuvil_set_threads)
static char g_message[256] = "not initialised";

static void pool_after_fork_child(void);

static unsigned probe(void) {
    unsigned m = 1u << CUVIL_ISA_SCALAR;
#if defined(__aarch64__)
    m |= 1u << CUVIL_ISA_NEON;  // Advanced SIMD is mandatory in Armv8-A
#if defined(CUVIL_HAVE_SVE) && defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (hw & HWCAP_SVE) {
        m |= 1u << CUVIL_ISA_SVE;
        g_vector_bytes = cuvil_sve_cntb();
        if (hw2 & HWCAP2_SVE2) m |= 1u << CUVIL_ISA_SVE2;
    }
#endif
#endif
    return m;
}

static int best_isa(void) {
    for (int i = 3; i >= 0; --i)
        if (g_available & (1u << i)) return i;
    return 0;
}

static void apply(int isa) {
    g_table = g_sets[isa];
    for (int op = 0; op < CUVIL_OP_COUNT; ++op) g_isa[op] = isa;
}

int cuvil_select_isa(int isa) {
    if (isa == -1) isa = best_isa();
    if (isa < 0 || isa > 3 || !(g_available & (1u << isa))) return CUVIL_EISA;
    apply(isa);
    g_status = CUVIL_OK;
    snprintf(g_message, sizeof g_message, "isa %s selected", g_isa_names[isa]);
    return CUVIL_OK;
}

__attribute__((constructor)) static void cuvil_init(void) {
    g_available = probe();
    pthread_atfork(NULL, NULL, pool_after_fork_child);
    const char *nt = getenv("CUVIL_NUM_THREADS");
    if (nt && atoi(nt) > 0) g_threads = atoi(nt) > CUVIL_MAX_THREADS ? CUVIL_MAX_THREADS : atoi(nt);
    int isa = best_isa();
    const char *force = getenv("CUVIL_FORCE_ISA");
    if (force && *force) {
        int want = -1;
        for (int i = 0; i < 4; ++i)
            if (strcmp(force, g_isa_names[i]) == 0) want = i;
        if (want < 0) {
            g_status = CUVIL_EISA;
            snprintf(g_message, sizeof g_message,
                     "CUVIL_FORCE_ISA=%.32s is not an ISA: use scalar, neon, sve or sve2", force);
            apply(0);
            return;
        }
        if (!(g_available & (1u << want))) {
            g_status = CUVIL_EISA;
            snprintf(g_message, sizeof g_message,
                     "CUVIL_FORCE_ISA=%s but this CPU (or build) lacks %s: unset it or pick one of the "
                     "available ISAs",
                     force, force);
            apply(0);
            return;
        }
        isa = want;
    }
    apply(isa);
    snprintf(g_message, sizeof g_message, "isa %s%s", g_isa_names[isa], force && *force ? " (forced)" : "");
}

int cuvil_abi_version(void) { return CUVIL_ABI_VERSION; }
int cuvil_init_status(void) { return g_status; }
const char *cuvil_init_message(void) { return g_message; }
int cuvil_isa_for(int op) { return (op < 0 || op >= CUVIL_OP_COUNT) ? -1 : g_isa[op]; }
unsigned cuvil_isa_available(void) { return g_available; }
size_t cuvil_sve_vector_bytes(void) { return g_vector_bytes; }

#define CHECK_READY() \
    do {                                 \
        if (g_status != CUVIL_OK) return g_status; \
    } while (0)

int cuvil_set_threads(int n) {
    if (n < 1 || n > CUVIL_MAX_THREADS) return CUVIL_EINVAL;
    g_threads = n;
    return CUVIL_OK;
}
int cuvil_get_threads(void) { return g_threads; }

// Split [0, n) into up to g_threads contiguous ranges of at least min_chunk items; range 0 runs
// on the calling thread, the others on a persistent pool (started on first use, idle workers
// sleep on a condition variable). Every range computes exactly what a single call would, so
// results do not depend on the thread count. When another call holds the pool, or a worker
// cannot be started, the work runs on fewer threads.
typedef void (*range_fn)(void *ctx, size_t begin, size_t end);
typedef struct {
    range_fn fn;
    void *ctx;
    size_t begin, end;
} range_job;

static pthread_mutex_t g_pool_owner = PTHREAD_MUTEX_INITIALIZER;  // one parallel_for at a time
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;     // guards the fields below
static pthread_cond_t g_pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_pool_done = PTHREAD_COND_INITIALIZER;
static size_t g_pool_size;                  // workers started (ids 1..g_pool_size)
static unsigned long g_pool_gen;            // bumped for each batch of jobs
static unsigned long g_pool_seen0[CUVIL_MAX_THREADS];
static range_job g_pool_jobs[CUVIL_MAX_THREADS];
static size_t g_pool_njobs, g_pool_pending;

static void *pool_worker(void *arg) {
    const size_t id = (size_t)(uintptr_t)arg;
    pthread_mutex_lock(&g_pool_mu);
    unsigned long seen = g_pool_seen0[id];  // the generation current when this worker was made
    for (;;) {
        while (g_pool_gen == seen) pthread_cond_wait(&g_pool_wake, &g_pool_mu);
        seen = g_pool_gen;
        if (id < g_pool_njobs) {
            range_job j = g_pool_jobs[id];
            pthread_mutex_unlock(&g_pool_mu);
            j.fn(j.ctx, j.begin, j.end);
            pthread_mutex_lock(&g_pool_mu);
            if (--g_pool_pending == 0) pthread_cond_signal(&g_pool_done);
        }
    }
    return NULL;
}

// A forked child has none of the parent's workers: start over.
static void pool_after_fork_child(void) {
    pthread_mutex_init(&g_pool_owner, NULL);
    pthread_mutex_init(&g_pool_mu, NULL);
    pthread_cond_init(&g_pool_wake, NULL);
    pthread_cond_init(&g_pool_done, NULL);
    g_pool_size = 0;
    g_pool_njobs = g_pool_pending = 0;
}

static void parallel_for(size_t n, size_t min_chunk, range_fn fn, void *ctx) {
    size_t t = (size_t)g_threads;
    if (min_chunk == 0) min_chunk = 1;
    if (t > n / min_chunk) t = n / min_chunk;
    if (t <= 1 || pthread_mutex_trylock(&g_pool_owner) != 0) {
        if (n) fn(ctx, 0, n);
        return;
    }
    while (g_pool_size + 1 < t) {  // gen only changes under g_pool_owner, which we hold
        const size_t id = g_pool_size + 1;
        pthread_t th;
        g_pool_seen0[id] = g_pool_gen;
        if (pthread_create(&th, NULL, pool_worker, (void *)(uintptr_t)id) != 0) break;
        pthread_detach(th);
        g_pool_size = id;
    }
    if (t > g_pool_size + 1) t = g_pool_size + 1;
    range_job first = {fn, ctx, 0, n / t};
    if (t > 1) {
        pthread_mutex_lock(&g_pool_mu);
        for (size_t i = 1; i < t; ++i) {
            g_pool_jobs[i].fn = fn;
            g_pool_jobs[i].ctx = ctx;
            g_pool_jobs[i].begin = n * i / t;
            g_pool_jobs[i].end = n * (i + 1) / t;
        }
        g_pool_njobs = t;
        g_pool_pending = t - 1;
        ++g_pool_gen;
        pthread_cond_broadcast(&g_pool_wake);
        pthread_mutex_unlock(&g_pool_mu);
    } else {
        first.end = n;
    }
    first.fn(first.ctx, first.begin, first.end);
    if (t > 1) {
        pthread_mutex_lock(&g_pool_mu);
        while (g_pool_pending) pthread_cond_wait(&g_pool_done, &g_pool_mu);
        g_pool_njobs = 0;
        pthread_mutex_unlock(&g_pool_mu);
    }
    pthread_mutex_unlock(&g_pool_owner);
}

static size_t dtype_size(int dtype) { return dtype == CUVIL_F16 ? 2 : 4; }

typedef struct {
    const uint8_t *src;
    size_t height, width, src_stride;
    int swap, dtype;
    const float *mean, *inv_std;
    uint8_t *dst;
} normalize_ctx;

static void normalize_range(void *p, size_t y0, size_t y1) {
    const normalize_ctx *c = p;
    const size_t es = dtype_size(c->dtype);
    g_table.normalize[c->dtype](c->src + y0 * c->src_stride, c->src_stride, c->width, y1 - y0, c->swap, c->mean,
                                c->inv_std, c->dst + y0 * c->width * es, c->width * es, c->height * c->width * es);
}

int cuvil_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride, int swap,
                    const float *mean, const float *inv_std, void *dst, int dtype) {
    CHECK_READY();
    if ((dtype != CUVIL_F32 && dtype != CUVIL_F16) || src_stride < 3 * width) return CUVIL_EINVAL;
    if (height == 0 || width == 0) return CUVIL_OK;
    if (!src || !dst || !mean || !inv_std) return CUVIL_EINVAL;
    normalize_ctx c = {src, height, width, src_stride, swap != 0, dtype, mean, inv_std, dst};
    parallel_for(height, (65536 + width - 1) / width, normalize_range, &c);
    return CUVIL_OK;
}

static void fill(void *dst, int dtype, size_t n, float v) {
    if (dtype == CUVIL_F16) {
        uint16_t h = cuvil_f32_to_f16(v), *d = dst;
        for (size_t i = 0; i < n; ++i) d[i] = h;
    } else {
        float *d = dst;
        for (size_t i = 0; i < n; ++i) d[i] = v;
    }
}

// Source coordinate of output index o (half-pixel centres, as cv2.INTER_LINEAR), split into
// a clamped integer index i0 (i0 + 1 < n unless n == 1) and weights (w0, w1).
static void coord(size_t o, size_t in, size_t out, int32_t *i0, float *w0, float *w1) {
    double s = ((double)o + 0.5) * ((double)in / (double)out) - 0.5;
    if (s < 0) s = 0;
    if (s > (double)(in - 1)) s = (double)(in - 1);
    size_t i = (size_t)s;
    if (in >= 2 && i > in - 2) i = in - 2;
    float w = (float)(s - (double)i);
    *i0 = (int32_t)i;
    *w1 = w;
    *w0 = 1.0f - w;
}

typedef struct {
    const uint8_t *src;
    size_t height, width, src_stride;
    int swap;
    const float *mean, *inv_std;
    uint8_t *dst;  // first pixel of the rectangle, channel 0
    size_t dst_row, plane;
    cuvil_resize_fn k;
    size_t rh;
    const int32_t *xi;
    const float *wx0, *wx1;
    size_t rw, x_lo, x_hi;
    volatile int failed;
} resize_ctx;

static void resize_range(void *p, size_t y_begin, size_t y_end) {
    resize_ctx *c = p;
    // Vertical-pass rows: 3 planes of width + 1 floats, zeroed so a 1-pixel-wide source reads a
    // finite x0 + 1 with weight 0. Cache-line aligned for the vector stores.
    const size_t tmp_plane = c->width + 1;
    uint8_t *mem = calloc(1, 3 * tmp_plane * sizeof(float) + 64);
    if (!mem) {
        c->failed = 1;
        return;
    }
    float *tmp = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    for (size_t y = y_begin; y < y_end; ++y) {
        int32_t y0;
        float wy0, wy1;
        coord(y, c->height, c->rh, &y0, &wy0, &wy1);
        const uint8_t *r0 = c->src + (size_t)y0 * c->src_stride;
        const uint8_t *r1 = c->height > 1 ? r0 + c->src_stride : r0;
        c->k(r0, r1, wy0, wy1, c->x_lo, c->x_hi, tmp, tmp_plane, c->xi, c->wx0, c->wx1, c->rw, c->swap, c->mean,
             c->inv_std, c->dst + y * c->dst_row, c->plane);
    }
    free(mem);
}

int cuvil_resize_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride, int swap,
                           const float *mean, const float *inv_std, void *dst, int dtype, size_t dst_h,
                           size_t dst_w, size_t rx, size_t ry, size_t rw, size_t rh, const float *pad) {
    CHECK_READY();
    if ((dtype != CUVIL_F32 && dtype != CUVIL_F16) || src_stride < 3 * width) return CUVIL_EINVAL;
    if (rx + rw > dst_w || ry + rh > dst_h) return CUVIL_EINVAL;
    if (dst_h == 0 || dst_w == 0) return CUVIL_OK;
    if (!dst || !mean || !inv_std) return CUVIL_EINVAL;
    const int letterbox = rw != dst_w || rh != dst_h;
    if (letterbox && !pad) return CUVIL_EINVAL;
    if (rw && rh && (height == 0 || width == 0 || !src)) return CUVIL_EINVAL;
    const size_t es = dtype_size(dtype);
    const size_t plane = dst_h * dst_w * es;
    uint8_t *out = dst;
    if (letterbox) {
        // Pad only what the rectangle does not cover: rows above/below, then the side columns.
        for (int c = 0; c < 3; ++c) {
            uint8_t *p = out + (size_t)c * plane;
            fill(p, dtype, ry * dst_w, pad[c]);
            fill(p + (ry + rh) * dst_w * es, dtype, (dst_h - ry - rh) * dst_w, pad[c]);
            for (size_t y = ry; y < ry + rh; ++y) {
                fill(p + y * dst_w * es, dtype, rx, pad[c]);
                fill(p + (y * dst_w + rx + rw) * es, dtype, dst_w - rx - rw, pad[c]);
            }
        }
    }
    if (rw == 0 || rh == 0) return CUVIL_OK;
    // Column tables, shared by every range.
    uint8_t *tables = malloc(rw * (sizeof(int32_t) + 2 * sizeof(float)));
    if (!tables) return CUVIL_ENOMEM;
    int32_t *xi = (int32_t *)tables;
    float *wx0 = (float *)(xi + rw), *wx1 = wx0 + rw;
    size_t x_lo = width, x_hi = 0;
    for (size_t i = 0; i < rw; ++i) {
        coord(i, width, rw, &xi[i], &wx0[i], &wx1[i]);
        size_t a = (size_t)xi[i], b = a + 2 > width ? width : a + 2;
        if (a < x_lo) x_lo = a;
        if (b > x_hi) x_hi = b;
    }
    resize_ctx c = {src, height, width, src_stride, swap != 0, mean, inv_std, out + (ry * dst_w + rx) * es,
                    dst_w * es, plane, g_table.resize[dtype], rh, xi, wx0, wx1, rw, x_lo, x_hi, 0};
    parallel_for(rh, (16384 + rw - 1) / rw, resize_range, &c);
    free(tables);
    return c.failed ? CUVIL_ENOMEM : CUVIL_OK;
}

typedef struct {
    const void *src;
    void *dst;
    size_t channels, inner;
    const float *scales;
    int dequant;
} qdq_ctx;

// Ranges over elements (per tensor) or over (outer, channel) blocks (per channel).
static void qdq_range(void *p, size_t b, size_t e) {
    const qdq_ctx *c = p;
    if (c->channels == 1) {
        if (c->dequant)
            g_table.dequantize((const int8_t *)c->src + b, (float *)c->dst + b, e - b, c->scales[0]);
        else
            g_table.quantize((const float *)c->src + b, (int8_t *)c->dst + b, e - b, c->scales[0]);
        return;
    }
    for (size_t blk = b; blk < e; ++blk) {
        const size_t off = blk * c->inner;
        const float s = c->scales[blk % c->channels];
        if (c->dequant)
            g_table.dequantize((const int8_t *)c->src + off, (float *)c->dst + off, c->inner, s);
        else
            g_table.quantize((const float *)c->src + off, (int8_t *)c->dst + off, c->inner, s);
    }
}

static int qdq(const void *src, void *dst, size_t outer, size_t channels, size_t inner, const float *scales,
               int dequant) {
    CHECK_READY();
    if (!scales || channels == 0) return CUVIL_EINVAL;
    const size_t total = outer * channels * inner;
    if (total == 0) return CUVIL_OK;
    if (!src || !dst) return CUVIL_EINVAL;
    qdq_ctx c = {src, dst, channels, inner, scales, dequant};
    if (channels == 1)
        parallel_for(total, 1u << 18, qdq_range, &c);
    else
        parallel_for(outer * channels, ((1u << 18) + inner - 1) / inner, qdq_range, &c);
    return CUVIL_OK;
}

int cuvil_quantize(const float *src, int8_t *dst, size_t outer, size_t channels, size_t inner,
                   const float *scales) {
    return qdq(src, dst, outer, channels, inner, scales, 0);
}

int cuvil_dequantize(const int8_t *src, float *dst, size_t outer, size_t channels, size_t inner,
                     const float *scales) {
    return qdq(src, dst, outer, channels, inner, scales, 1);
}

int cuvil_softmax_topk(const float *src, size_t rows, size_t n, size_t src_stride, float *probs, size_t k,
                       float *top_scores, int32_t *top_idx) {
    CHECK_READY();
    if (k > n || (k && (!top_scores || !top_idx)) || src_stride < n * sizeof(float)) return CUVIL_EINVAL;
    if (rows == 0 || n == 0) return CUVIL_OK;
    if (!src) return CUVIL_EINVAL;
    float *scratch = NULL;
    if (!probs) {
        scratch = malloc(n * sizeof(float));
        if (!scratch) return CUVIL_ENOMEM;
    }
    for (size_t r = 0; r < rows; ++r) {
        const float *x = (const float *)((const uint8_t *)src + r * src_stride);
        float *y = probs ? probs + r * n : scratch;
        g_table.softmax(x, n, y, k, k ? top_scores + r * k : NULL, k ? top_idx + r * k : NULL);
    }
    free(scratch);
    return CUVIL_OK;
}

typedef struct {
    float score;
    int32_t index;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static float load_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

long cuvil_nms(const float *boxes, size_t n, ptrdiff_t box_stride, ptrdiff_t box_elem_stride, int box_format,
               const float *scores, size_t classes, ptrdiff_t score_stride, ptrdiff_t class_stride,
               float score_thr, float iou_thr, int agnostic, size_t max_det, float *out_boxes,
               float *out_scores, int32_t *out_classes, int32_t *out_index) {
    CHECK_READY();
    if ((box_format != 0 && box_format != 1) || classes == 0) return CUVIL_EINVAL;
    if (n == 0 || max_det == 0) return 0;
    if (!boxes || !scores || !out_boxes || !out_scores || !out_classes || !out_index) return CUVIL_EINVAL;
    // One allocation: best/cls per box, then per candidate: sort records, SoA box and class, flags.
    size_t bytes = n * (2 * sizeof(float) + sizeof(cand) + 5 * sizeof(float) + 3 * sizeof(int32_t)) + 64;
    uint8_t *mem = malloc(bytes);
    if (!mem) return CUVIL_ENOMEM;
    float *best = (float *)mem;
    int32_t *cls = (int32_t *)(best + n);
    cand *cands = (cand *)(cls + n);
    float *x1 = (float *)(cands + n), *y1 = x1 + n, *x2 = y1 + n, *y2 = x2 + n, *area = y2 + n;
    int32_t *ccls = (int32_t *)(area + n), *keep = ccls + n;
    uint32_t *supp = (uint32_t *)(keep + n);

    g_table.nms_decode(scores, n, classes, score_stride, class_stride, best, cls);
    size_t m = 0;
    for (size_t i = 0; i < n; ++i)
        if (best[i] > score_thr) {
            cands[m].score = best[i];
            cands[m].index = (int32_t)i;
            ++m;
        }
    qsort(cands, m, sizeof(cand), cand_cmp);
    const uint8_t *bb = (const uint8_t *)boxes;
    for (size_t j = 0; j < m; ++j) {
        const uint8_t *b = bb + (ptrdiff_t)cands[j].index * box_stride;
        float a = load_f32(b), c = load_f32(b + box_elem_stride), d = load_f32(b + 2 * box_elem_stride),
              e = load_f32(b + 3 * box_elem_stride);
        if (box_format == 0) {
            float hw = d * 0.5f, hh = e * 0.5f;
            x1[j] = a - hw;
            y1[j] = c - hh;
            x2[j] = a + hw;
            y2[j] = c + hh;
        } else {
            x1[j] = a;
            y1[j] = c;
            x2[j] = d;
            y2[j] = e;
        }
        area[j] = (x2[j] - x1[j]) * (y2[j] - y1[j]);
        ccls[j] = cls[cands[j].index];
        supp[j] = 0;
    }
    size_t kept = g_table.nms_suppress(x1, y1, x2, y2, area, ccls, m, iou_thr, agnostic != 0, max_det, keep, supp);
    for (size_t t = 0; t < kept; ++t) {
        size_t j = (size_t)keep[t];
        out_boxes[4 * t] = x1[j];
        out_boxes[4 * t + 1] = y1[j];
        out_boxes[4 * t + 2] = x2[j];
        out_boxes[4 * t + 3] = y2[j];
        out_scores[t] = cands[j].score;
        out_classes[t] = ccls[j];
        out_index[t] = cands[j].index;
    }
    free(mem);
    return (long)kept;
}
