// specdec row-wise kernels for quantised weights (interleaved Q4_K, Q5_K, Q6_K, Q5_0, Q8_0): matrix
// products of a few activation rows (a verification batch, 1..64 tokens) that are cheap *and*
// batch-invariant.
//
// Why: exact mode needs a token's logits to be bitwise the same whether it is decoded alone or
// together with drafted tokens. llama.cpp's one-row kernels give that, but unpack the quantised
// weights again for every row, so checking n drafted tokens costs about n one-token decodes.
// These kernels unpack each block of weights once and then multiply it with every activation
// row, each row into its own accumulators, in an order that never depends on how many rows
// there are (the design of ikawrakow's 1 x N tiles in iqk_mul_mat, written anew here from
// ggml's block formats). Threads split the weight rows only, so a result does not depend on
// the thread count either.
//
// The activations are ggml's Q8_K rows (quantize_row_q8_K, one row at a time), or Q8_0 rows
// for Q8_0 and Q5_0 weights. The block layouts below mirror ggml's (ggml-common.h, ggml-cpu/repack.h) byte for byte; the hook in
// ggml (patches/llama.cpp/0002) checks their sizes at compile time.
//
// Every function returns false, having written nothing, where this build has no kernel for it
// (another instruction set): the caller then takes llama.cpp's one-row path, still invariant.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPECDEC_QK_K 256

// ggml's block_q8_K: one super-block of 256 activations quantised to int8.
typedef struct {
    float d;                        // scale
    int8_t qs[SPECDEC_QK_K];        // quants, -127..127
    int16_t bsums[SPECDEC_QK_K / 16];  // sum of each 16 consecutive quants
} specdec_block_q8_K;

// ggml's block_q6_K: 16 sub-blocks of 16 weights, w = d * scales[j] * (q - 32), q in 0..63.
typedef struct {
    uint8_t ql[SPECDEC_QK_K / 2];   // low 4 bits of q
    uint8_t qh[SPECDEC_QK_K / 4];   // high 2 bits of q
    int8_t scales[SPECDEC_QK_K / 16];
    uint16_t d;                     // fp16
} specdec_block_q6_K;

// ggml's block_q5_K: 8 sub-blocks of 32 weights, w = d * sc[j] * q - dmin * m[j], q in 0..31.
// qs holds the low 4 bits as block_q4_K does (byte 32j + l: weight 64j + l in the low nibble,
// 64j + 32 + l in the high one); bit 2j of qh[l] is the fifth bit of weight 64j + l, bit 2j + 1
// that of 64j + 32 + l. scales: the 6-bit scales and mins, packed as in block_q4_K.
typedef struct {
    uint16_t d;                     // fp16
    uint16_t dmin;                  // fp16
    uint8_t scales[12];
    uint8_t qh[SPECDEC_QK_K / 8];
    uint8_t qs[SPECDEC_QK_K / 2];
} specdec_block_q5_K;

// ggml's block_q5_0: 32 weights w = d * (q - 16), q in 0..31: the low 4 bits of weight j in
// qs[j] (j < 16, low nibble) or qs[j - 16] (high nibble), the fifth in bit j of qh.
typedef struct {
    uint16_t d;                     // fp16
    uint8_t qh[4];
    uint8_t qs[16];
} specdec_block_q5_0;

// ggml's block_q8_0: 32 weights (or activations) w = d * q, q in -127..127 as ggml quantises.
typedef struct {
    uint16_t d;                     // fp16
    int8_t qs[32];
} specdec_block_q8_0;

// ggml's block_q4_Kx8 (repack.cpp, x86 "q4_K_8x8"): one super-block of 8 weight rows
// interleaved. Per row, 8 sub-blocks of 32 weights, w = d * sc[j] * q - dmin * m[j], q in 0..15.
// qs: 16 chunks of 64 bytes; chunk c holds bytes 8c..8c+7 of each row's plain Q4_K qs, row
// after row. scales: 12 bytes per sub-block j (at 12 j) with the 6-bit scales and mins of
// the 8 rows packed as repack.cpp's make_block_q4_Kx8 writes them.
typedef struct {
    uint16_t d[8];                  // fp16, one per row
    uint16_t dmin[8];               // fp16, one per row
    uint8_t scales[96];
    uint8_t qs[1024];
} specdec_block_q4_Kx8;

// dst[n * dst_stride + r] = dot(weight row r, activation row n) for r < n_wrows, n < n_arows.
// Weight row r starts at w + r * w_row_bytes (Q6_K); activation row n at a + n * a_row_bytes.
// n_k (the dot length) is a multiple of 256.
bool specdec_rowwise_q6_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride);

// As above for Q5_K weights (Q8_K activations).
bool specdec_rowwise_q5_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride);

// As above for Q8_0 weights times Q8_0 activations (ggml's vec_dot_type for Q8_0): n_k is a
// multiple of 32.
bool specdec_rowwise_q8_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride);

// As above for Q5_0 weights (Q8_0 activations): n_k is a multiple of 32.
bool specdec_rowwise_q5_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride);

// As above for interleaved Q4_K: n_wrows is a multiple of 8, and the 8 rows 8g..8g+7 start at
// w + g * w_group_bytes (n_k / 256 blocks of specdec_block_q4_Kx8).
bool specdec_rowwise_q4_Kx8(int64_t n_k, const void * w, size_t w_group_bytes, int64_t n_wrows,
                            const void * a, size_t a_row_bytes, int64_t n_arows,
                            float * dst, size_t dst_stride);

// The instruction set these kernels were built for ("avx512_vnni", "avx2", or "none").
const char * specdec_rowwise_isa(void);

#ifdef __cplusplus
}
#endif
