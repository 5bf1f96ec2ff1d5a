// CUDA kernels behind the cuvil-edge TensorRT plugins (see cuvil_kernels.h).
#include "cuvil_kernels.h"

#include <cfloat>

namespace cuvil {
namespace {

// One thread per output element; consecutive threads write consecutive NCHW floats (coalesced
// stores), reading with a stride of C bytes, which the L1/L2 absorb for C <= 4.
__global__ void normalizeU8Kernel(uint8_t const* __restrict__ image, float* __restrict__ out, int64_t n,
                                  int64_t h, int64_t w, int32_t c, ChannelAffine affine)
{
    int64_t const total = n * c * h * w;
    int64_t const hw = h * w;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    {
        int64_t const pix = i % hw;
        int64_t const ch = (i / hw) % c;
        int64_t const img = i / (hw * c);
        float const v = static_cast<float>(image[(img * hw + pix) * c + ch]);
        out[i] = (v - affine.mean[ch]) * affine.inv_std[ch];
    }
}

// One block per row. Each thread keeps a sorted private top-k of its strided slice; thread 0
// then merges the blockDim.x lists through shared memory. k and blockDim are small (<= 32, 128).
constexpr int kThreads = 128;

__device__ bool better(float a, int32_t ia, float b, int32_t ib)
{
    return a > b || (a == b && ia < ib);
}

__global__ void topKKernel(float const* __restrict__ logits, float* __restrict__ values,
                           int32_t* __restrict__ indices, int32_t cols, int32_t k)
{
    __shared__ float sv[kThreads * kMaxTopK];
    __shared__ int32_t si[kThreads * kMaxTopK];
    float const* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
    float* mv = sv + threadIdx.x * kMaxTopK;
    int32_t* mi = si + threadIdx.x * kMaxTopK;
    for (int32_t j = 0; j < k; ++j)
    {
        mv[j] = -FLT_MAX;
        mi[j] = INT32_MAX;
    }
    for (int32_t col = threadIdx.x; col < cols; col += blockDim.x)
    {
        float const v = row[col];
        if (!better(v, col, mv[k - 1], mi[k - 1]))
            continue;
        int32_t j = k - 1;
        while (j > 0 && better(v, col, mv[j - 1], mi[j - 1]))
        {
            mv[j] = mv[j - 1];
            mi[j] = mi[j - 1];
            --j;
        }
        mv[j] = v;
        mi[j] = col;
    }
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    // k-way selection over the per-thread sorted lists: heads[t] is the next candidate of list t.
    int32_t heads[kThreads];
    for (int t = 0; t < blockDim.x; ++t)
        heads[t] = 0;
    for (int32_t j = 0; j < k; ++j)
    {
        int best = -1;
        for (int t = 0; t < blockDim.x; ++t)
        {
            int32_t const h = heads[t];
            if (h < k && (best < 0 || better(sv[t * kMaxTopK + h], si[t * kMaxTopK + h],
                                              sv[best * kMaxTopK + heads[best]], si[best * kMaxTopK + heads[best]])))
                best = t;
        }
        values[static_cast<int64_t>(blockIdx.x) * k + j] = sv[best * kMaxTopK + heads[best]];
        indices[static_cast<int64_t>(blockIdx.x) * k + j] = si[best * kMaxTopK + heads[best]];
        ++heads[best];
    }
}

} // namespace

cudaError_t launchNormalizeU8(uint8_t const* image, float* out, int64_t n, int64_t h, int64_t w, int32_t c,
                              ChannelAffine const& affine, cudaStream_t stream)
{
    if (c < 1 || c > kMaxChannels)
        return cudaErrorInvalidValue;
    int64_t const total = n * c * h * w;
    if (total == 0)
        return cudaSuccess;
    int const threads = 256;
    int64_t const wanted = (total + threads - 1) / threads;
    int const blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
    normalizeU8Kernel<<<blocks, threads, 0, stream>>>(image, out, n, h, w, c, affine);
    return cudaGetLastError();
}

cudaError_t launchTopK(float const* logits, float* values, int32_t* indices, int64_t rows, int32_t cols, int32_t k,
                       cudaStream_t stream)
{
    if (k < 1 || k > kMaxTopK || k > cols || rows > 2147483647)
        return cudaErrorInvalidValue;
    if (rows == 0)
        return cudaSuccess;
    topKKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, values, indices, cols, k);
    return cudaGetLastError();
}

} // namespace cuvil
