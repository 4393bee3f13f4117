// What specdec's CUDA kernels share: their launch, and a half's bits as a float. Built by nvcc
// for the GPU, or by a C++ compiler with cuda_emulation.h for their CPU tests.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#else
#include "cuda_emulation.h"
#endif

// kernel<<<grid, block, 0, stream>>>(args...), or its emulation
template <class Kernel, class... Args>
void specdec_launch(Kernel kernel, dim3 grid, dim3 block, void * stream, Args... args) {
#ifdef __CUDACC__
    kernel<<<grid, block, 0, (cudaStream_t) stream>>>(args...);
#else
    (void) stream;
    emulation::launch(grid, block, kernel, args...);
#endif
}

// the half in the low 16 bits of `bits`
__device__ __forceinline__ float specdec_half_bits_to_float(uint32_t bits) {
#ifdef __CUDACC__
    return __half2float(__ushort_as_half((unsigned short) (bits & 0xFFFF)));
#else
    return specdec_half_to_float((uint16_t) (bits & 0xFFFF));
#endif
}
