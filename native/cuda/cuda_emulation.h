// Just enough of CUDA to run specdec's kernels (mmv_tc.cu, fattn_rows.cu) on a CPU, for the
// tests of their indexing where no GPU is at hand: every CUDA thread is a std::thread,
// __syncthreads a barrier of the block, __syncwarp one of the warp, and mma.m16n8k16 a
// warp-wide exchange through memory that computes what the PTX ISA says each lane gets
// ("Matrix Fragments for mma.m16n8k16 with integer type"). Blocks (one-dimensional, in a grid
// of up to three) run one after another, so a __shared__ array may be a static. Slow, and only
// for small test matrices.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "half_host.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// aligned as CUDA's vector_types.h aligns them: a GPU faults on a load that is not
struct alignas(8) uint2 {
    uint32_t x, y;
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { volatile float p = a * b; return p; }
inline float __fadd_rn(float a, float b) { volatile float s = a + b; return s; }
inline float __int2float_rn(int i) { return (float) i; }

namespace emulation {

struct warp_exchange {
    std::barrier<> arrived{32};
    int a_g[32], a_g8[32], b[32];
};

struct block_state {
    std::unique_ptr<std::barrier<>> sync;
    std::vector<std::unique_ptr<warp_exchange>> warps;
};

inline block_state * current_block = nullptr;

inline void syncthreads() { current_block->sync->arrive_and_wait(); }

inline void syncwarp() { current_block->warps[threadIdx.x / 32]->arrived.arrive_and_wait(); }

inline int8_t byte_at(int word, int k) { return (int8_t) ((uint32_t) word >> (8 * k)); }

// Lane l holds rows l/4 and l/4 + 8 of A and column l/4 of B at k slots 4*(l%4) .. 4*(l%4)+3,
// and gets C at rows l/4, l/4 + 8 and columns 2*(l%4), 2*(l%4)+1.
inline void mma_s8_16x8x16(int (&c)[4], int a_g, int a_g8, int b) {
    const int lane = threadIdx.x % 32;
    warp_exchange & x = *current_block->warps[threadIdx.x / 32];
    x.a_g[lane]  = a_g;
    x.a_g8[lane] = a_g8;
    x.b[lane]    = b;
    x.arrived.arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        const int row = lane / 4 + 8 * (i / 2);
        const int col = 2 * (lane % 4) + i % 2;
        int sum = 0;
        for (int k = 0; k < 16; ++k) {
            const int a_lane = 4 * (row % 8) + k / 4;
            const int a_word = row < 8 ? x.a_g[a_lane] : x.a_g8[a_lane];
            const int b_word = x.b[4 * col + k / 4];
            sum += byte_at(a_word, k % 4) * byte_at(b_word, k % 4);
        }
        c[i] += sum;
    }
    x.arrived.arrive_and_wait();  // nobody writes the next operands before all have read these
}

// Each byte of a minus that of b, wrapping, as CUDA's __vsub4.
inline uint32_t vsub4(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        r |= ((((a >> (8 * i)) & 0xFF) - ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    }
    return r;
}

template <class Kernel, class... Args>
void run_block(dim3 block_index, dim3 block, Kernel kernel, Args... args) {
    block_state state;
    state.sync = std::make_unique<std::barrier<>>(block.x);
    for (unsigned w = 0; w < block.x / 32; ++w) {
        state.warps.push_back(std::make_unique<warp_exchange>());
    }
    current_block = &state;
    std::vector<std::thread> threads;
    for (unsigned tx = 0; tx < block.x; ++tx) {
        threads.emplace_back([=] {
            threadIdx = dim3(tx);
            blockIdx  = block_index;
            kernel(args...);
        });
    }
    for (std::thread & thread : threads) {
        thread.join();
    }
    current_block = nullptr;
}

template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
    gridDim  = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz) {
        for (unsigned by = 0; by < grid.y; ++by) {
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                run_block(dim3(bx, by, bz), block, kernel, args...);
            }
        }
    }
}

}  // namespace emulation

#define __syncthreads() emulation::syncthreads()
#define __syncwarp() emulation::syncwarp()
