// resize_normalize_sve.c: resize_normalize for FEAT_SVE, vector-length agnostic (body in resize_normalize_sve.inc).
#if !defined(__aarch64__) || !defined(__ARM_FEATURE_SVE)
#error This file must be compiled for AArch64, FEAT_SVE.
#endif
#define CUVIL_ISA sve
#include "resize_normalize_sve.inc"
