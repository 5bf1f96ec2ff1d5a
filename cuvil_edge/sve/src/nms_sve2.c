// nms_sve2.c: nms for FEAT_SVE2 (body in nms_sve.inc; SVE2-only instructions where they
// save work are under __ARM_FEATURE_SVE2 there).
#if !defined(__aarch64__) || !defined(__ARM_FEATURE_SVE2)
#error This file must be compiled for AArch64, FEAT_SVE2.
#endif
#define CUVIL_ISA sve2
#include "nms_sve.inc"
