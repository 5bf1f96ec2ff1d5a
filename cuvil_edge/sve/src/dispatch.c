// dispatch.c: the one dispatch table, filled once when the library loads from what the CPU
// offers (cpu_probe.c) and CUVIL_FORCE_ISA; the load-time status and the public queries.
// Built at the library baseline (-march=armv8-a on aarch64): nothing here may need SVE.
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define KERNEL_SET(isa)                                                                           \
    {                                                                                             \
        {cuvil_normalize_f32_u8_##isa, cuvil_normalize_f16_u8_##isa},                             \
            {cuvil_resize_normalize_f32_u8_##isa, cuvil_resize_normalize_f16_u8_##isa},           \
            cuvil_quantize_s8_f32_##isa, cuvil_dequantize_f32_s8_##isa,                           \
            cuvil_softmax_topk_f32_f32_##isa, cuvil_nms_decode_f32_f32_##isa,                     \
            cuvil_nms_suppress_s32_f32_##isa                                                      \
    }

static const cuvil_kernel_set g_sets[4] = {
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

cuvil_kernel_set cuvil_table;          // the dispatch table, filled once at load
int cuvil_status = CUVIL_OK;           // CUVIL_EISA after a rejected CUVIL_FORCE_ISA
static int g_isa[CUVIL_OP_COUNT];      // ISA chosen per op
static unsigned g_available = 1u;      // bit mask of ISAs the CPU and the build offer
static size_t g_vector_bytes = 0;      // SVE vector length (cntb) read at load
static char g_message[256] = "not initialised";

static int best_isa(void) {
    for (int i = 3; i >= 0; --i)
        if (g_available & (1u << i)) return i;
    return 0;
}

static void apply(int isa) {
    cuvil_table = g_sets[isa];
    for (int op = 0; op < CUVIL_OP_COUNT; ++op) g_isa[op] = isa;
}

int cuvil_select_isa(int isa) {
    if (isa == -1) isa = best_isa();
    if (isa < 0 || isa > 3 || !(g_available & (1u << isa))) return CUVIL_EISA;
    apply(isa);
    cuvil_status = CUVIL_OK;
    snprintf(g_message, sizeof g_message, "isa %s selected", g_isa_names[isa]);
    return CUVIL_OK;
}

__attribute__((constructor)) static void cuvil_init(void) {
    g_available = cuvil_probe_isas(&g_vector_bytes);
    cuvil_pool_init();
    int isa = best_isa();
    const char *force = getenv("CUVIL_FORCE_ISA");
    if (force && *force) {
        int want = -1;
        for (int i = 0; i < 4; ++i)
            if (strcmp(force, g_isa_names[i]) == 0) want = i;
        if (want < 0) {
            cuvil_status = CUVIL_EISA;
            snprintf(g_message, sizeof g_message,
                     "CUVIL_FORCE_ISA=%.32s is not an ISA: use scalar, neon, sve or sve2", force);
            apply(0);
            return;
        }
        if (!(g_available & (1u << want))) {
            cuvil_status = CUVIL_EISA;
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
int cuvil_init_status(void) { return cuvil_status; }
const char *cuvil_init_message(void) { return g_message; }
int cuvil_isa_for(int op) { return (op < 0 || op >= CUVIL_OP_COUNT) ? -1 : g_isa[op]; }
unsigned cuvil_isa_available(void) { return g_available; }
size_t cuvil_sve_vector_bytes(void) { return g_vector_bytes; }
