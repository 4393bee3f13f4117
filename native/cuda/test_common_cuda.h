// What specdec's CUDA kernel tests share on a GPU (nvcc builds only): failing on a CUDA error,
// copying to the device, and timing a launch against the floor of reading its bytes once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

inline void check_cuda(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(2);
    }
}

template <class T> T * to_device(const std::vector<T> & v) {
    T * d = nullptr;
    check_cuda(cudaMalloc(&d, v.size() * sizeof(T)), "cudaMalloc");
    check_cuda(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
}

// Microseconds per call of `launch`: the mean of 200 after 20 untimed.
template <class Launch> double time_us(Launch && launch) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < 20; ++i) launch();
    const int reps = 200;
    cudaEventRecord(start);
    for (int i = 0; i < reps; ++i) launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 1000.0 * ms / reps;
}

__global__ void read_all(const uint4 * __restrict__ v, size_t n, uint32_t * sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        const uint4 q = v[i];
        acc ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (acc == 0x12345678) {
        *sink = acc;
    }
}

// The floor a kernel is measured against: microseconds to read `bytes` (a multiple of 16) at
// `data` once, with enough blocks to fill the GPU.
inline double read_once_us(const void * data, size_t bytes) {
    int device;
    cudaDeviceProp prop;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    uint32_t * sink;
    check_cuda(cudaMalloc(&sink, 4), "cudaMalloc");
    const double us = time_us([&] { read_all<<<4 * prop.multiProcessorCount, 512>>>((const uint4 *) data, bytes / 16, sink); });
    cudaFree(sink);
    return us;
}
