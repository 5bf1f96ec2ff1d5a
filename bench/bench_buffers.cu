// I/O buffer placement micro-benchmark (driven by bench_buffers.py): the three placements of
// cuvil_edge.runtime.buffers / runtime.trt measured with the CUDA runtime on one GPU.
//   pageable: malloc'd host memory, cudaMemcpy (what plain numpy arrays cost)
//   pinned:   cudaHostAlloc'd host memory + device buffer, cudaMemcpyAsync on a stream
//   mapped:   cudaHostAlloc(cudaHostAllocMapped) + cudaHostGetDevicePointer, read/written by the kernel
// For each size: copy bandwidths, and a round trip as an inference sees it
// (input in host memory -> kernel y = 2x -> output in host memory).
// Prints one JSON object on stdout.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(call)                                                                                                       \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
        {                                                                                                              \
            std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                                          \
            std::exit(1);                                                                                              \
        }                                                                                                              \
    } while (0)

__global__ void scale2(float const* __restrict__ x, float* __restrict__ y, size_t n)
{
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(blockDim.x) * gridDim.x)
        y[i] = 2.0f * x[i];
}

static const int kWarm = 5;
static const int kReps = 30;

template <typename F>
static double timeMs(cudaStream_t s, F&& body)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < kWarm; ++i)
        body();
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < kReps; ++i)
        body();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms / kReps;
}

int main()
{
    int dev = 0, integrated = 0, canMap = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, dev));
    CK(cudaDeviceGetAttribute(&canMap, cudaDevAttrCanMapHostMemory, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int rt = 0;
    CK(cudaRuntimeGetVersion(&rt));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    // 64 KiB; one 224x224x3 float image; a batch of 8; one 1080p float frame.
    std::vector<size_t> sizes = {64 << 10, 3 * 224 * 224 * 4, 8 * 3 * 224 * 224 * 4, 1920 * 1080 * 3 * 4};
    std::printf("{\"device\": \"%s\", \"sm\": \"%d.%d\", \"integrated\": %d, \"can_map_host_memory\": %d, "
                "\"cuda_runtime\": %d, \"reps\": %d, \"cases\": [",
                prop.name, prop.major, prop.minor, integrated, canMap, rt, kReps);
    for (size_t k = 0; k < sizes.size(); ++k)
    {
        size_t const bytes = sizes[k];
        size_t const n = bytes / sizeof(float);
        int const threads = 256;
        int const blocks = int((n + threads - 1) / threads < 4096 ? (n + threads - 1) / threads : 4096);
        float *pageIn = (float*) std::malloc(bytes), *pageOut = (float*) std::malloc(bytes);
        float *pinIn, *pinOut, *mapIn, *mapOut, *dIn, *dOut, *mapInDev, *mapOutDev;
        CK(cudaHostAlloc(&pinIn, bytes, cudaHostAllocDefault));
        CK(cudaHostAlloc(&pinOut, bytes, cudaHostAllocDefault));
        CK(cudaHostAlloc(&mapIn, bytes, cudaHostAllocMapped));
        CK(cudaHostAlloc(&mapOut, bytes, cudaHostAllocMapped));
        CK(cudaHostGetDevicePointer(&mapInDev, mapIn, 0));
        CK(cudaHostGetDevicePointer(&mapOutDev, mapOut, 0));
        CK(cudaMalloc(&dIn, bytes));
        CK(cudaMalloc(&dOut, bytes));
        for (size_t i = 0; i < n; ++i)
            pageIn[i] = pinIn[i] = mapIn[i] = float(i % 1000);

        double h2dPageable = timeMs(s, [&] { CK(cudaMemcpy(dIn, pageIn, bytes, cudaMemcpyHostToDevice)); });
        double h2dPinned = timeMs(s, [&] { CK(cudaMemcpyAsync(dIn, pinIn, bytes, cudaMemcpyHostToDevice, s)); });
        double d2hPinned = timeMs(s, [&] { CK(cudaMemcpyAsync(pinOut, dOut, bytes, cudaMemcpyDeviceToHost, s)); });
        double kernelDevice = timeMs(s, [&] { scale2<<<blocks, threads, 0, s>>>(dIn, dOut, n); });
        double tripPageable = timeMs(s, [&] {
            CK(cudaMemcpy(dIn, pageIn, bytes, cudaMemcpyHostToDevice));
            scale2<<<blocks, threads, 0, s>>>(dIn, dOut, n);
            CK(cudaMemcpy(pageOut, dOut, bytes, cudaMemcpyDeviceToHost));
        });
        double tripPinned = timeMs(s, [&] {
            CK(cudaMemcpyAsync(dIn, pinIn, bytes, cudaMemcpyHostToDevice, s));
            scale2<<<blocks, threads, 0, s>>>(dIn, dOut, n);
            CK(cudaMemcpyAsync(pinOut, dOut, bytes, cudaMemcpyDeviceToHost, s));
        });
        double tripMapped = timeMs(s, [&] { scale2<<<blocks, threads, 0, s>>>(mapInDev, mapOutDev, n); });
        CK(cudaStreamSynchronize(s));
        // Correctness of the zero-copy path: the host sees what the kernel wrote.
        bool mappedOk = mapOut[n - 1] == 2.0f * mapIn[n - 1] && mapOut[0] == 2.0f * mapIn[0];
        auto gbs = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
        std::printf("%s{\"bytes\": %zu, \"h2d_pageable_gbs\": %.2f, \"h2d_pinned_gbs\": %.2f, \"d2h_pinned_gbs\": %.2f, "
                    "\"kernel_device_ms\": %.4f, \"round_trip_ms\": {\"pageable\": %.4f, \"pinned\": %.4f, "
                    "\"mapped\": %.4f}, \"mapped_result_ok\": %s}",
                    k ? ", " : "", bytes, gbs(h2dPageable), gbs(h2dPinned), gbs(d2hPinned), kernelDevice, tripPageable,
                    tripPinned, tripMapped, mappedOk ? "true" : "false");
        std::free(pageIn);
        std::free(pageOut);
        CK(cudaFreeHost(pinIn));
        CK(cudaFreeHost(pinOut));
        CK(cudaFreeHost(mapIn));
        CK(cudaFreeHost(mapOut));
        CK(cudaFree(dIn));
        CK(cudaFree(dOut));
    }
    std::printf("]}\n");
    CK(cudaStreamDestroy(s));
    return 0;
}
