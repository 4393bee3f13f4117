// specdec tensor-core products for verification batches: see mmv_tc.cuh for why and for the
// order of summing. Compiled by nvcc into ggml's CUDA backend (patch 0004), and by a C++
// compiler with cuda_emulation.h for the CPU test of its indexing (test_mmv_tc.cu).
#include "mmv_tc.cuh"
#include "kernel_common.cuh"

// Why these sizes:
// - 16 rows per CUDA block is the tensor core's m16 tile; a warp unpacks those rows once for
//   all of its columns.
// - 8 warps split a tile's units of 256 weights (warp w takes units w, w+8, ...): a 7B
//   model's ffn_down has only 224 tiles, and one warp per tile would leave too few loads in
//   flight to read the weights at the memory's pace. The split depends on the matrix alone,
//   never on the columns, so the order of summing does not either. 4 and 16 are built too, for
//   test_mmv_tc's bench to compare on a GPU (specdec_mmv_tc_warps).
// - 16 columns per launch: two n8 instructions per unpacked tile. Exact mode verifies up to 16
//   tokens at a time in practice; more columns take further launches, each reading the
//   weights again.
static_assert(SPECDEC_MMV_WARPS == 4 || SPECDEC_MMV_WARPS == 8 || SPECDEC_MMV_WARPS == 16, "a warp count built");

namespace {

constexpr int warp_size = 32;

// c += rows g and g+8 of A times column g of B, as mma.m16n8k16 distributes them over a warp:
// a_g and a_g8 hold 4 int8 of rows g and g+8, b 4 int8 of column g, at the same 4 k slots
// (4*t .. 4*t+3); c holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void mma_s8_16x8x16(int (&c)[4], int a_g, int a_g8, int b) {
#ifdef __CUDACC__
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a_g), "r"(a_g8), "r"(b));
#else
    __trap();  // the launcher never runs this kernel below compute capability 8.0
#endif
#else
    emulation::mma_s8_16x8x16(c, a_g, a_g8, b);
#endif
}

// Each byte minus 32, wrapping (6-bit quants 0..63 to -32..31).
__device__ __forceinline__ int bytes_minus_32(uint32_t v) {
#ifdef __CUDACC__
    return (int) __vsub4(v, 0x20202020);
#else
    return (int) emulation::vsub4(v, 0x20202020);
#endif
}

// 4 bytes at a 2-byte aligned address (Q6_K blocks are 210 bytes long).
__device__ __forceinline__ uint32_t load_u32_aligned_2(const uint8_t * p) {
    const uint16_t * h = (const uint16_t *) p;
    return (uint32_t) h[0] | ((uint32_t) h[1] << 16);
}

__device__ __forceinline__ int byte_of(uint32_t word, int i) {
    return (int) ((word >> (8 * i)) & 0xFF);
}

// The activations a lane needs for one block of 256 weights: the column it gives B, and the
// two columns of its C, each at the block's first of 8 Q8_1 blocks; absent columns read as 0.
struct lane_columns {
    const specdec_block_q8_1 * b;
    const specdec_block_q8_1 * c0;
    const specdec_block_q8_1 * c1;
    bool has_b, has_c0, has_c1;

    __device__ __forceinline__ int b_word(int q8_block, int byte) const {
        return has_b ? *(const int *) (b[q8_block].qs + byte) : 0;
    }
    __device__ __forceinline__ uint32_t c0_ds(int q8_block) const { return has_c0 ? c0[q8_block].ds : 0; }
    __device__ __forceinline__ uint32_t c1_ds(int q8_block) const { return has_c1 ? c1[q8_block].ds : 0; }
};

// Q4_K. A lane holds of each of its two rows' block: the scales and mins, d and dmin, and the
// 8 bytes at 8t of each of the 4 32-byte chunks of nibbles (byte 32j + l: weight 64j + l in
// the low nibble, 64j + 32 + l in the high one). Sub-block s = 2j + (high nibble) takes two
// instructions, k slots 4t+i holding l = 8t+i and then l = 8t+4+i.
struct q4_K {
    using block = specdec_block_q4_K;
    static constexpr int blocks_per_256 = 1;

    struct row {
        uint32_t scale[2];  // 6-bit scales of sub-blocks 0-3 and 4-7, a byte each
        uint32_t min[2];
        float d, dmin;
        uint2 qs[4];
    };

    static __device__ __forceinline__ row load_row(const block * x, int t) {
        const uint4 head = *(const uint4 *) x;  // d and dmin, then scales[0..11]
        row r;
        r.scale[0] = head.y & 0x3F3F3F3F;
        r.min[0]   = head.z & 0x3F3F3F3F;
        r.scale[1] = (head.w & 0x0F0F0F0F) | (((head.y >> 6) & 0x03030303) << 4);
        r.min[1]   = ((head.w >> 4) & 0x0F0F0F0F) | (((head.z >> 6) & 0x03030303) << 4);
        r.d        = specdec_half_bits_to_float(head.x);
        r.dmin     = specdec_half_bits_to_float(head.x >> 16);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            r.qs[j] = *(const uint2 *) (x->qs + 32 * j + 8 * t);
        }
        return r;
    }

    static __device__ __forceinline__ int nibbles(const row & r, int s, int part) {
        const uint32_t bytes = part == 0 ? r.qs[s / 2].x : r.qs[s / 2].y;
        return (int) ((bytes >> (4 * (s % 2))) & 0x0F0F0F0F);
    }

    // acc (see the kernel) += this block's products: per sub-block, the exact integer dot product
    // scaled by the row's scale and the column's d, and the row's min by the column's sum.
    static __device__ __forceinline__ void add(const row & g, const row & g8, const lane_columns & y, int t, float (&acc)[4]) {
        float sum_d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float sum_m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            int c[4] = {0, 0, 0, 0};
            mma_s8_16x8x16(c, nibbles(g, s, 0), nibbles(g8, s, 0), y.b_word(s, 8 * t));
            mma_s8_16x8x16(c, nibbles(g, s, 1), nibbles(g8, s, 1), y.b_word(s, 8 * t + 4));
            const uint32_t ds0 = y.c0_ds(s), ds1 = y.c1_ds(s);
            const float d[2]   = {specdec_half_bits_to_float(ds0), specdec_half_bits_to_float(ds1)};
            const float sum[2] = {specdec_half_bits_to_float(ds0 >> 16), specdec_half_bits_to_float(ds1 >> 16)};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const row & r = i < 2 ? g : g8;
                const int scale = byte_of(r.scale[s / 4], s % 4), min = byte_of(r.min[s / 4], s % 4);
                sum_d[i] = __fmaf_rn(d[i % 2], __int2float_rn(c[i] * scale), sum_d[i]);
                sum_m[i] = __fmaf_rn(sum[i % 2], __int2float_rn(min), sum_m[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const row & r = i < 2 ? g : g8;
            acc[i] = __fadd_rn(acc[i], __fmaf_rn(r.d, sum_d[i], __fmul_rn(-r.dmin, sum_m[i])));
        }
    }
};

// Q6_K. Sub-block u = 8n + 2k + h (16 weights: l = 16h .. 16h+15 of weights 128n + 32k + l)
// takes one instruction, k slots 4t+i holding l = 16h + 4t + i. A lane holds of each row's
// block the 4 bytes of low bits at 64n + 32(k%2) + 16h + 4t, the 4 bytes of high bits at
// 32n + 16h + 4t, the 16 scales and d.
struct q6_K {
    using block = specdec_block_q6_K;
    static constexpr int blocks_per_256 = 1;

    struct row {
        uint32_t ql[2][2][2];  // [n][k % 2][h]
        uint32_t qh[2][2];     // [n][h]
        uint32_t scale[4];     // int8 scales, four to a word
        float d;
    };

    static __device__ __forceinline__ row load_row(const block * x, int t) {
        row r;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                r.ql[n][0][h] = load_u32_aligned_2(x->ql + 64 * n + 16 * h + 4 * t);
                r.ql[n][1][h] = load_u32_aligned_2(x->ql + 64 * n + 32 + 16 * h + 4 * t);
                r.qh[n][h]    = load_u32_aligned_2(x->qh + 32 * n + 16 * h + 4 * t);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.scale[i] = load_u32_aligned_2((const uint8_t *) x->scales + 4 * i);
        }
        r.d = specdec_half_bits_to_float(x->d);
        return r;
    }

    static __device__ __forceinline__ int quants(const row & r, int n, int k, int h) {
        const uint32_t low  = (r.ql[n][k % 2][h] >> (4 * (k / 2))) & 0x0F0F0F0F;
        const uint32_t high = ((r.qh[n][h] >> (2 * k)) & 0x03030303) << 4;
        return bytes_minus_32(low | high);
    }

    static __device__ __forceinline__ int scale(const row & r, int u) {
        return (int) (int8_t) byte_of(r.scale[u / 4], u % 4);
    }

    static __device__ __forceinline__ void add(const row & g, const row & g8, const lane_columns & y, int t, float (&acc)[4]) {
        float sum_d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int q8 = 4 * n + k;  // the Q8_1 block of weights 128n + 32k ..
                const float d[2] = {specdec_half_bits_to_float(y.c0_ds(q8)), specdec_half_bits_to_float(y.c1_ds(q8))};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int u = 8 * n + 2 * k + h;
                    int c[4] = {0, 0, 0, 0};
                    mma_s8_16x8x16(c, quants(g, n, k, h), quants(g8, n, k, h), y.b_word(q8, 16 * h + 4 * t));
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int sc = scale(i < 2 ? g : g8, u);
                        sum_d[i] = __fmaf_rn(d[i % 2], __int2float_rn(c[i] * sc), sum_d[i]);
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[i] = __fadd_rn(acc[i], __fmul_rn(i < 2 ? g.d : g8.d, sum_d[i]));
        }
    }
};

// Q8_0. A block of 256 weights is 8 Q8_0 blocks, each one sub-block of 32 beside its Q8_1 block:
// two instructions, k slots 4t+i holding l = 8t+i and then l = 8t+4+i. A lane holds of each
// row the 8 bytes at 8t of each of the 8 blocks, and their d.
struct q8_0 {
    using block = specdec_block_q8_0;
    static constexpr int blocks_per_256 = 8;

    struct row {
        uint32_t qs[8][2];
        float d[8];
    };

    static __device__ __forceinline__ row load_row(const block * x, int t) {
        row r;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            r.qs[j][0] = load_u32_aligned_2((const uint8_t *) x[j].qs + 8 * t);
            r.qs[j][1] = load_u32_aligned_2((const uint8_t *) x[j].qs + 8 * t + 4);
            r.d[j]     = specdec_half_bits_to_float(x[j].d);
        }
        return r;
    }

    static __device__ __forceinline__ void add(const row & g, const row & g8, const lane_columns & y, int t, float (&acc)[4]) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int c[4] = {0, 0, 0, 0};
            mma_s8_16x8x16(c, (int) g.qs[j][0], (int) g8.qs[j][0], y.b_word(j, 8 * t));
            mma_s8_16x8x16(c, (int) g.qs[j][1], (int) g8.qs[j][1], y.b_word(j, 8 * t + 4));
            const float d[2] = {specdec_half_bits_to_float(y.c0_ds(j)), specdec_half_bits_to_float(y.c1_ds(j))};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float d_w = i < 2 ? g.d[j] : g8.d[j];
                sum[i] = __fmaf_rn(__fmul_rn(d_w, d[i % 2]), __int2float_rn(c[i]), sum[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[i] = __fadd_rn(acc[i], sum[i]);
        }
    }
};

// Blocks an SM keeps resident: up to 8 columns in 64 registers a thread, up to 16 in 128.
constexpr int resident_blocks(int ntiles, int nwarps) {
    return (ntiles == 1 ? 1024 : 512) / (nwarps * warp_size);
}

template <class W, int ntiles, int nwarps>
__global__ void __launch_bounds__(nwarps * warp_size, resident_blocks(ntiles, nwarps))
mmv_tc(const typename W::block * __restrict__ x, const specdec_block_q8_1 * __restrict__ y,
       float * __restrict__ dst, int nrows, int nblocks_k, int stride_row_x, int ncols,
       int stride_col_y, int stride_col_dst) {
    const int lane = threadIdx.x % warp_size;
    const int warp = threadIdx.x / warp_size;
    const int g    = lane / 4;  // rows g and g+8 of the tile, column g of B
    const int t    = lane % 4;  // k slots 4t..4t+3, columns 2t and 2t+1 of C

    const int row_g  = blockIdx.x * SPECDEC_MMV_ROWS + g;
    const int row_g8 = row_g + 8;
    // rows past the matrix read its last row and write nothing
    const typename W::block * x_g  = x + (int64_t) (row_g < nrows ? row_g : nrows - 1) * stride_row_x;
    const typename W::block * x_g8 = x + (int64_t) (row_g8 < nrows ? row_g8 : nrows - 1) * stride_row_x;

    // acc[tile][i]: (row g, col 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) of the tile's columns
    float acc[ntiles][4];
#pragma unroll
    for (int tile = 0; tile < ntiles; ++tile) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[tile][i] = 0.0f;
        }
    }

    for (int kb = warp; kb < nblocks_k; kb += nwarps) {
        const typename W::row w_g  = W::load_row(x_g + W::blocks_per_256 * kb, t);
        const typename W::row w_g8 = W::load_row(x_g8 + W::blocks_per_256 * kb, t);
        const specdec_block_q8_1 * y_kb = y + 8 * kb;
#pragma unroll
        for (int tile = 0; tile < ntiles; ++tile) {
            const int col_b = SPECDEC_MMV_TILE_COLS * tile + g;
            const int col_c = SPECDEC_MMV_TILE_COLS * tile + 2 * t;
            const lane_columns cols = {y_kb + (int64_t) col_b * stride_col_y, y_kb + (int64_t) col_c * stride_col_y,
                                       y_kb + (int64_t) (col_c + 1) * stride_col_y, col_b < ncols, col_c < ncols,
                                       col_c + 1 < ncols};
            W::add(w_g, w_g8, cols, t, acc[tile]);
        }
    }

    // the warps' sums, added in warp order
    __shared__ float partial[nwarps][ntiles * SPECDEC_MMV_TILE_COLS][SPECDEC_MMV_ROWS];
#pragma unroll
    for (int tile = 0; tile < ntiles; ++tile) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            partial[warp][SPECDEC_MMV_TILE_COLS * tile + 2 * t + i % 2][g + 8 * (i / 2)] = acc[tile][i];
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < ntiles * SPECDEC_MMV_TILE_COLS * SPECDEC_MMV_ROWS; k += blockDim.x) {
        const int col = k / SPECDEC_MMV_ROWS;
        const int r   = k % SPECDEC_MMV_ROWS;
        float sum = partial[0][col][r];
        for (int w = 1; w < nwarps; ++w) {
            sum = __fadd_rn(sum, partial[w][col][r]);
        }
        const int row = blockIdx.x * SPECDEC_MMV_ROWS + r;
        if (row < nrows && col < ncols) {
            dst[(int64_t) col * stride_col_dst + row] = sum;
        }
    }
}

template <class W, int nwarps>
void launch_columns(const void * x, const void * y, float * dst, int nrows, int ncols_x, int stride_row_x,
                    int ncols, int stride_col_y, int stride_col_dst, void * stream) {
    const int nblocks_k = ncols_x / SPECDEC_MMV_QK_K;
    const dim3 grid((nrows + SPECDEC_MMV_ROWS - 1) / SPECDEC_MMV_ROWS);
    const dim3 block(nwarps * warp_size);
    const typename W::block * x_w = (const typename W::block *) x;
    for (int c0 = 0; c0 < ncols; c0 += SPECDEC_MMV_MAX_COLS) {
        const int n = ncols - c0 < SPECDEC_MMV_MAX_COLS ? ncols - c0 : SPECDEC_MMV_MAX_COLS;
        const specdec_block_q8_1 * y_c = (const specdec_block_q8_1 *) y + (int64_t) c0 * stride_col_y;
        float * dst_c = dst + (int64_t) c0 * stride_col_dst;
        specdec_launch(n <= SPECDEC_MMV_TILE_COLS ? mmv_tc<W, 1, nwarps> : mmv_tc<W, 2, nwarps>, grid, block, stream, x_w, y_c, dst_c, nrows,
                       nblocks_k, stride_row_x, n, stride_col_y, stride_col_dst);
    }
}

template <class W>
void launch_warps(int warps, const void * x, const void * y, float * dst, int nrows, int ncols_x, int stride_row_x,
                  int ncols, int stride_col_y, int stride_col_dst, void * stream) {
    switch (warps) {
        case 4:
            launch_columns<W, 4>(x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
        case 16:
            launch_columns<W, 16>(x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
        default:
            launch_columns<W, 8>(x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
    }
}

}  // namespace

void specdec_mmv_tc_warps(int warps, specdec_mmv_type type, const void * x, const void * y, float * dst, int nrows,
                          int ncols_x, int stride_row_x, int ncols, int stride_col_y, int stride_col_dst,
                          void * stream) {
    switch (type) {
        case SPECDEC_MMV_Q4_K:
            launch_warps<q4_K>(warps, x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
        case SPECDEC_MMV_Q6_K:
            launch_warps<q6_K>(warps, x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
        case SPECDEC_MMV_Q8_0:
            launch_warps<q8_0>(warps, x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y, stride_col_dst, stream);
            break;
    }
}

void specdec_mmv_tc(specdec_mmv_type type, const void * x, const void * y, float * dst, int nrows,
                    int ncols_x, int stride_row_x, int ncols, int stride_col_y, int stride_col_dst,
                    void * stream) {
    specdec_mmv_tc_warps(SPECDEC_MMV_WARPS, type, x, y, dst, nrows, ncols_x, stride_row_x, ncols, stride_col_y,
                         stride_col_dst, stream);
}
