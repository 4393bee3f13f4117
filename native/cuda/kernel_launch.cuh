// kernel<<<grid, block, 0, stream>>>(args...) for specdec's kernels, or, built by a C++ compiler
// for their CPU tests, its emulation (cuda_emulation.h).
#pragma once

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include "cuda_emulation.h"
#endif

template <class Kernel, class... Args>
void specdec_launch(Kernel kernel, dim3 grid, dim3 block, void * stream, Args... args) {
#ifdef __CUDACC__
    kernel<<<grid, block, 0, (cudaStream_t) stream>>>(args...);
#else
    (void) stream;
    emulation::launch(grid, block, kernel, args...);
#endif
}
