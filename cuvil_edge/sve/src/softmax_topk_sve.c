// softmax_topk_sve.c: softmax_topk for FEAT_SVE, vector-length agnostic (body in softmax_topk_sve.inc).
#if !defined(__aarch64__) || !defined(__ARM_FEATURE_SVE)
#error This file must be compiled for AArch64, FEAT_SVE.
#endif
#define CUVIL_ISA sve
#include "softmax_topk_sve.inc"
