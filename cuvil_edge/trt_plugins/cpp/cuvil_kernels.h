// CUDA kernels behind the cuvil-edge TensorRT plugins. No TensorRT dependency: the kernels build
// and are tested on any CUDA machine (test_kernels.cu); the IPluginV3 glue (normalize_plugin.*)
// calls them from enqueue().
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace cuvil {

/// Maximum channel count of normalize_u8 (mean/std live in kernel parameters).
constexpr int32_t kMaxChannels = 4;

/// Per-channel affine map: out = (in - mean[c]) * inv_std[c].
struct ChannelAffine {
    float mean[kMaxChannels];
    float inv_std[kMaxChannels];
};

/// uint8 NHWC frames -> float32 NCHW, (x - mean[c]) / std[c], one pass.
/// @param[in]  image  device pointer, n*h*w*c bytes, NHWC, C-contiguous.
/// @param[out] out    device pointer, n*c*h*w floats, NCHW, C-contiguous.
/// @param[in]  affine per-channel mean and 1/std (c <= kMaxChannels).
/// @return cudaSuccess or the launch error.
cudaError_t launchNormalizeU8(uint8_t const* image, float* out, int64_t n, int64_t h, int64_t w, int32_t c,
                              ChannelAffine const& affine, cudaStream_t stream);

/// The k largest values of each row (largest first, lower index first among equals).
/// One thread block per row; k <= kMaxTopK.
/// @param[in]  logits  device pointer, rows*cols floats.
/// @param[out] values  device pointer, rows*k floats.
/// @param[out] indices device pointer, rows*k int32.
cudaError_t launchTopK(float const* logits, float* values, int32_t* indices, int64_t rows, int32_t cols, int32_t k,
                       cudaStream_t stream);

/// Largest k launchTopK takes.
constexpr int32_t kMaxTopK = 32;

} // namespace cuvil
