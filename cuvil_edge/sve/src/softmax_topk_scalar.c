// softmax_topk_scalar.c: reference softmax over one row plus its top-k.
#include "internal.h"

CUVIL_HOST_CLONES
void cuvil_softmax_topk_f32_f32_scalar(const float *x, size_t n, float *y, size_t k, float *ts, int32_t *ti) {
    float mx = -__builtin_inff();
    for (size_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    float acc[CUVIL_SUM_LANES] = {0};
    for (size_t i = 0; i < n; ++i) {
        float e = cuvil_exp_ref(x[i] - mx);
        y[i] = e;
        acc[i % CUVIL_SUM_LANES] += e;
    }
    const float sum = cuvil_sum64(acc);
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
        float p = y[i] / sum;
        y[i] = p;
        if (k && p > cuvil_topk_threshold(k, count, ts)) cuvil_topk_insert(p, (int32_t)i, k, &count, ts, ti);
    }
}
