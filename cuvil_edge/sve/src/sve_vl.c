// sve_vl.c: the SVE vector length, read by `rdvl` at run time. Kept out of line (and in asm) so
// GCC cannot treat svcntb() as a compile-time constant (it caches it otherwise).
#if !defined(__aarch64__) || !defined(__ARM_FEATURE_SVE)
#error This file must be compiled for AArch64, FEAT_SVE.
#endif
#include "internal.h"

__attribute__((noinline)) size_t cuvil_sve_cntb(void) {
    size_t vl;
    __asm__ volatile("rdvl %0, #1" : "=r"(vl));
    return vl;
}
