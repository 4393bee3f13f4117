// specdec tensor-core products of Q4_K, Q6_K and Q8_0 weights with a few activation columns (a verification
// batch, 1..16 tokens at a time) that are batch-invariant *and* cost about what one column costs.
//
// Why: exact mode needs a token's logits to be bitwise the same whether it is decoded alone or
// inside a verification batch. Patch 0003 gets that from llama.cpp's MMVQ by giving every
// column a lone column's warps, but MMVQ runs its integer dot products once per column, so on
// an H200 verifying 8 tokens of a 7B Q4_K_M model costs 2.16x a one-token step.
//
// Here each warp unpacks a 16-row tile of weights once and multiplies it with 8 columns in one
// int8 tensor-core instruction (mma.m16n8k16). Integer products are exact, so the tensor cores
// add them in whatever order they like; everything after them is float, and is done in one
// fixed order per (row, column) with rounding intrinsics (no contraction): per sub-block (32
// weights of Q4_K and Q8_0, 16 of Q6_K) in order, then per block of 256 in the order a warp visits them,
// then across the warps in warp order. Nothing in that order depends on the number of columns or on a column's place in the
// batch, so a column's result is the same bits at n = 1 and at n = 16. The same kernel serves
// n = 1, where the tensor core's spare columns cost little: the product is bound by reading the
// weights.
//
// The arithmetic is this kernel's own, not MMVQ's: exact mode with it gives the answers of this
// kernel at n = 1, which may differ in the last bits from llama.cpp's --fast.
//
// The block layouts mirror ggml's block_q4_K and block_q8_1 (ggml-common.h) byte for byte.
#pragma once

#include <stdint.h>

#define SPECDEC_MMV_QK_K 256
#define SPECDEC_MMV_QK8_1 32

// ggml's block_q4_K: 8 sub-blocks of 32 weights, w = d * scale[s] * q - dmin * min[s], q in 0..15.
struct specdec_block_q4_K {
    uint32_t dm;           // two halves: d (low), dmin (high)
    uint8_t scales[12];    // 6-bit scales and mins of the 8 sub-blocks, packed as ggml packs them
    uint8_t qs[128];       // nibbles: byte 32*j + l holds weight 64*j + l (low) and 64*j + 32 + l (high)
};

// ggml's block_q8_1: 32 activations quantised to int8, x = d * q; s is the sum of the x before
// quantisation.
struct specdec_block_q8_1 {
    uint32_t ds;           // two halves: d (low), s (high)
    int8_t qs[32];
};

// ggml's block_q6_K: 16 sub-blocks of 16 weights, w = d * scale[u] * (q - 32), q in 0..63. Weight
// 128*n + 32*k + l (n < 2, k < 4, l < 32) has its low 4 bits in ql[64*n + 32*(k%2) + l] (the low
// nibble for k < 2, else the high one), its high 2 bits in qh[32*n + l] at bit 2*k, and scale
// 8*n + 2*k + l/16.
struct specdec_block_q6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;            // a half
};

// ggml's block_q8_0: 32 weights, w = d * q.
struct specdec_block_q8_0 {
    uint16_t d;            // a half
    int8_t qs[32];
};

static_assert(sizeof(specdec_block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(specdec_block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(specdec_block_q6_K) == 210, "block_q6_K layout");
static_assert(sizeof(specdec_block_q8_1) == 36, "block_q8_1 layout");

// Tuned constants (see mmv_tc.cu for their reasons).
#define SPECDEC_MMV_ROWS 16        // weight rows per CUDA block: one m16 tensor-core tile
#define SPECDEC_MMV_WARPS 8        // warps splitting a tile's Q4_K blocks
#define SPECDEC_MMV_TILE_COLS 8    // columns per tensor-core instruction (n8)
#define SPECDEC_MMV_MAX_COLS 16    // columns one launch takes; more go in further launches

enum specdec_mmv_type { SPECDEC_MMV_Q4_K, SPECDEC_MMV_Q6_K, SPECDEC_MMV_Q8_0 };

// dst[c*stride_col_dst + r] = row r of x times column c of y, for r < nrows, c < ncols.
// x: nrows rows of ncols_x/256 blocks of `type` (ncols_x/32 for Q8_0), row r at x + r*stride_row_x
// blocks; ncols_x a multiple of 256.
// y: ncols columns of ncols_x/32 Q8_1 blocks, column c at y + c*stride_col_y blocks.
// Any ncols >= 1 (launched 16 columns at a time). Needs compute capability 8.0 or newer.
void specdec_mmv_tc(specdec_mmv_type type, const void * x, const void * y, float * dst, int nrows,
                    int ncols_x, int stride_row_x, int ncols, int stride_col_y, int stride_col_dst,
                    void * stream);

// The same product with `warps` warps per tile (4, 8 or 16; any other value: 8) instead of
// SPECDEC_MMV_WARPS, for test_mmv_tc's bench to compare on a GPU. The warps' count sets the
// order of summing, so results differ between counts in the last bits (each is batch-invariant).
void specdec_mmv_tc_warps(int warps, specdec_mmv_type type, const void * x, const void * y, float * dst, int nrows,
                          int ncols_x, int stride_row_x, int ncols, int stride_col_y, int stride_col_dst,
                          void * stream);
