// Standalone check of cuvil_kernels.cu against CPU references (no TensorRT needed):
//   nvcc -O2 -std=c++17 -o test_kernels test_kernels.cu cuvil_kernels.cu && ./test_kernels
// Prints one line per case and exits non-zero on the first mismatch.
#include "cuvil_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(call)                                                                                                    \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
        {                                                                                                              \
            std::printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                                              \
            std::exit(1);                                                                                              \
        }                                                                                                              \
    } while (0)

static int checkNormalize(int64_t n, int64_t h, int64_t w, int32_t c, std::mt19937& rng)
{
    std::vector<uint8_t> img(n * h * w * c);
    for (auto& v : img)
        v = static_cast<uint8_t>(rng() & 0xff);
    cuvil::ChannelAffine a{};
    float std_[cuvil::kMaxChannels];
    for (int i = 0; i < c; ++i)
    {
        a.mean[i] = 100.0f + 10.0f * i;
        std_[i] = 50.0f + 5.0f * i;
        a.inv_std[i] = 1.0f / std_[i];
    }
    uint8_t* dImg = nullptr;
    float* dOut = nullptr;
    CHECK(cudaMalloc(&dImg, img.size() + 1));
    CHECK(cudaMalloc(&dOut, img.size() * sizeof(float) + 4));
    CHECK(cudaMemcpy(dImg, img.data(), img.size(), cudaMemcpyHostToDevice));
    CHECK(cuvil::launchNormalizeU8(dImg, dOut, n, h, w, c, a, nullptr));
    std::vector<float> out(img.size());
    CHECK(cudaMemcpy(out.data(), dOut, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dImg));
    CHECK(cudaFree(dOut));
    double maxErr = 0;
    for (int64_t b = 0; b < n; ++b)
        for (int32_t ch = 0; ch < c; ++ch)
            for (int64_t y = 0; y < h; ++y)
                for (int64_t x = 0; x < w; ++x)
                {
                    float ref = (img[((b * h + y) * w + x) * c + ch] - a.mean[ch]) / std_[ch];
                    float got = out[((b * c + ch) * h + y) * w + x];
                    maxErr = std::max(maxErr, static_cast<double>(std::fabs(ref - got)));
                }
    bool ok = maxErr < 1e-5;
    std::printf("%s normalize_u8 n=%lld h=%lld w=%lld c=%d max_abs_err=%.3g\n", ok ? "PASS" : "FAIL", (long long) n,
                (long long) h, (long long) w, c, maxErr);
    return ok ? 0 : 1;
}

static int checkTopK(int64_t rows, int32_t cols, int32_t k, bool ties, std::mt19937& rng)
{
    std::vector<float> logits(rows * cols);
    std::normal_distribution<float> nd;
    for (auto& v : logits)
        v = ties ? static_cast<float>(static_cast<int>(rng() % 5)) : nd(rng);
    float* dIn = nullptr;
    float* dV = nullptr;
    int32_t* dI = nullptr;
    CHECK(cudaMalloc(&dIn, logits.size() * sizeof(float)));
    CHECK(cudaMalloc(&dV, rows * k * sizeof(float)));
    CHECK(cudaMalloc(&dI, rows * k * sizeof(int32_t)));
    CHECK(cudaMemcpy(dIn, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cuvil::launchTopK(dIn, dV, dI, rows, cols, k, nullptr));
    std::vector<float> v(rows * k);
    std::vector<int32_t> idx(rows * k);
    CHECK(cudaMemcpy(v.data(), dV, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(idx.data(), dI, idx.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dIn));
    CHECK(cudaFree(dV));
    CHECK(cudaFree(dI));
    int bad = 0;
    std::vector<int32_t> order(cols);
    for (int64_t r = 0; r < rows; ++r)
    {
        std::iota(order.begin(), order.end(), 0);
        float const* row = logits.data() + r * cols;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        for (int32_t j = 0; j < k; ++j)
            if (idx[r * k + j] != order[j] || v[r * k + j] != row[order[j]])
                ++bad;
    }
    std::printf("%s topk rows=%lld cols=%d k=%d ties=%d mismatches=%d\n", bad ? "FAIL" : "PASS", (long long) rows,
                cols, k, ties ? 1 : 0, bad);
    return bad ? 1 : 0;
}

int main()
{
    std::mt19937 rng(1234);
    int fails = 0;
    // Awkward sizes: 1, odd, a 224x224 RGB batch.
    fails += checkNormalize(1, 1, 1, 1, rng);
    fails += checkNormalize(3, 17, 13, 3, rng);
    fails += checkNormalize(8, 224, 224, 3, rng);
    fails += checkNormalize(2, 31, 7, 4, rng);
    fails += checkTopK(1, 10, 1, false, rng);
    fails += checkTopK(64, 1000, 5, false, rng);
    fails += checkTopK(3, 127, 32, false, rng);
    fails += checkTopK(16, 1000, 5, true, rng);
    fails += checkTopK(4, 5, 5, true, rng);
    // Invalid arguments are refused, not launched.
    bool refused = cuvil::launchTopK(nullptr, nullptr, nullptr, 1, 4, 5, nullptr) == cudaErrorInvalidValue
        && cuvil::launchNormalizeU8(nullptr, nullptr, 1, 1, 1, 5, cuvil::ChannelAffine{}, nullptr) == cudaErrorInvalidValue;
    std::printf("%s invalid arguments refused\n", refused ? "PASS" : "FAIL");
    fails += refused ? 0 : 1;
    return fails ? 1 : 0;
}
