// softmax_topk_scalar.c: reference softmax over one row plus its top-k. Loops are written in
// 64-element blocks so compilers vectorize them (the sum order stays element i -> lane i % 64).
#include "internal.h"

CUVIL_HOST_CLONES
void cuvil_softmax_topk_f32_f32_scalar(const float *x, size_t n, float *y, size_t k, float *ts, int32_t *ti) {
    // Max in 8 independent lanes (max is exact, so the grouping does not matter).
    float m8[8];
    for (int j = 0; j < 8; ++j) m8[j] = -__builtin_inff();
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) m8[j] = x[i + j] > m8[j] ? x[i + j] : m8[j];
    float mx = -__builtin_inff();
    for (int j = 0; j < 8; ++j) mx = m8[j] > mx ? m8[j] : mx;
    for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;

    float acc[CUVIL_SUM_LANES] = {0};
    for (i = 0; i + CUVIL_SUM_LANES <= n; i += CUVIL_SUM_LANES)
        for (size_t j = 0; j < CUVIL_SUM_LANES; ++j) {
            float e = cuvil_exp_ref(x[i + j] - mx);
            y[i + j] = e;
            acc[j] += e;
        }
    for (size_t j = 0; i + j < n; ++j) {
        float e = cuvil_exp_ref(x[i + j] - mx);
        y[i + j] = e;
        acc[j] += e;
    }
    const float sum = cuvil_sum64(acc);
    for (i = 0; i < n; ++i) y[i] = y[i] / sum;
    size_t count = 0;
    float thr = cuvil_topk_threshold(k, count, ts);
    for (i = 0; k && i < n; ++i)
        if (y[i] > thr) {
            cuvil_topk_insert(y[i], (int32_t)i, k, &count, ts, ti);
            thr = cuvil_topk_threshold(k, count, ts);
        }
}
