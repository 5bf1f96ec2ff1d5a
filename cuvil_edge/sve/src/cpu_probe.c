// cpu_probe.c: which ISAs this CPU offers, read once from the kernel's HWCAP bits at load.
// Built at the library baseline (-march=armv8-a on aarch64): nothing here may need SVE (the
// vector length comes from cuvil_sve_cntb in sve_vl.c, called only when HWCAP says SVE).
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

unsigned cuvil_probe_isas(size_t *vector_bytes) {
    unsigned m = 1u << CUVIL_ISA_SCALAR;
    *vector_bytes = 0;
#if defined(__aarch64__)
    m |= 1u << CUVIL_ISA_NEON;  // Advanced SIMD is mandatory in Armv8-A
#if defined(CUVIL_HAVE_SVE) && defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (hw & HWCAP_SVE) {
        m |= 1u << CUVIL_ISA_SVE;
        *vector_bytes = cuvil_sve_cntb();
        if (hw2 & HWCAP2_SVE2) m |= 1u << CUVIL_ISA_SVE2;
    }
#endif
#endif
    return m;
}
