// sve_common.h: helpers for the SVE/SVE2 bodies (*.inc). Included only by files built with SVE.
#ifndef CUVIL_SVE_COMMON_H
#define CUVIL_SVE_COMMON_H
#include <arm_sve.h>

#include "internal.h"

#define CUVIL_CAT2(a, b) a##_##b
#define CUVIL_CAT(a, b) CUVIL_CAT2(a, b)
#define CUVIL_FN(base) CUVIL_CAT(base, CUVIL_ISA)

// Zero-extending byte -> 32-bit widening by table lookup: lane i of the result takes byte
// idx[4i] of v. Index bytes 0xff are out of range (result 0) unless the vector is 256 bytes,
// where `big` masks them off.
static inline svuint32_t cuvil_widen_tbl(svuint8_t v, svuint8_t idx, int big) {
    svuint32_t r = svreinterpret_u32_u8(svtbl_u8(v, idx));
    return big ? svand_n_u32_x(svptrue_b32(), r, 0xffu) : r;
}

// Index vector: 32-bit lane i holds byte index (start + step * i), other bytes 0xff.
static inline svuint8_t cuvil_widen_index(uint32_t start, uint32_t step) {
    return svreinterpret_u8_u32(svorr_n_u32_x(svptrue_b32(), svindex_u32(start, step), 0xffffff00u));
}

#endif
