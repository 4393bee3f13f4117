// specdec attention for exact mode on CUDA: the rows of a verification batch, each row's bits the
// same whatever the rows beside it, with each tile of keys and values read once for all the query
// heads (and rows) that share its KV head.
//
// Why: patch 0003 keeps llama.cpp's flash attention batch-invariant by giving every (row, query
// head) pair a block of its own (the vector kernel, one query row per block). A verification of
// n tokens then reads the KV cache n * (query heads per KV head) times over: nothing at 128 tokens
// of context, but at thousands it is what a verification costs beyond a step. This is the CUDA
// twin of native/rowwise/attention.c, the CPU's kernel for the same reason.
//
// The order of summing, per (row, query head) pair, fixed by the keys' absolute positions alone:
//   - keys are cut into tiles of SPECDEC_FATTN_TILE; tile t belongs to part t % n_parts, where
//     n_parts depends on the GPU and the model only (specdec_fattn_rows_parts), never on the
//     batch or the cache's length;
//   - one warp holds one pair. Per tile, lane l scores key l: q (scaled, F32) times k (F16 to
//     F32), one fmaf per dimension in order, plus the mask; a masked key scores -inf whatever
//     its cell holds. The tile's maximum m' = max(m, scores); p_l = exp(score_l - m'), 0 where
//     masked; the pair's sum s = s * a + (p_0 + p_1 + ... + p_31, in order), a = exp(m - m')
//     (exactly 1 where m' = m); each output dimension o = o * a, then o = fmaf(p_k, v_k, o)
//     for k = 0..31 in order, skipping p_k = 0;
//   - the parts are combined in part order: M = max of the parts' m; S = fmaf(s_i, w_i, S) and
//     out = fmaf(o_i, w_i, out) for i = 0..n_parts-1 with w_i = exp(m_i - M); out / S.
// A tile past a row's visible keys leaves m, s and o as they were, bit for bit, so neither the
// cache's length nor the rows after a row change its result; a warp reads nothing of other pairs.
//
// Tensors as ggml's flash attention takes them (byte strides): q F32 [d, rows, heads, seqs];
// k, v F16 [d, n_kv, kv_heads, seqs]; mask F16 [n_kv, rows, 1, mask_seqs] (-inf hides a key;
// broadcast over heads, sequence s reads s % mask_seqs); dst F32 [d, heads, rows, seqs],
// contiguous.
#pragma once

#include <stddef.h>
#include <stdint.h>

// Tuned constants (see fattn_rows.cu for their reasons).
#define SPECDEC_FATTN_TILE 32       // keys per tile: one per lane
#define SPECDEC_FATTN_WARPS 8       // pairs (warps) per CUDA block, sharing each tile
#define SPECDEC_FATTN_MAX_PARTS 32  // most parts a pair's keys are split into

struct specdec_fattn_rows_args {
    const char * q;
    const char * k;
    const char * v;
    const char * mask;
    float * dst;
    float * partials;  // specdec_fattn_rows_partials(...) floats of scratch
    int64_t q_nb1, q_nb2, q_nb3;
    int64_t k_nb1, k_nb2, k_nb3;
    int64_t v_nb1, v_nb2, v_nb3;
    int64_t mask_nb1, mask_nb3;
    int head_dim;      // 64, 128 or 256 (specdec_fattn_rows_head_dim_supported)
    int rows;
    int heads;
    int kv_heads;      // divides heads
    int seqs;
    int mask_seqs;
    int n_kv;
    int n_parts;       // specdec_fattn_rows_parts
    float scale;
};

bool specdec_fattn_rows_head_dim_supported(int head_dim);

// The parts a pair's keys are split into on a GPU of `multiprocessors` for a model of `kv_heads`:
// enough blocks for a lone row to fill the GPU, at most SPECDEC_FATTN_MAX_PARTS.
int specdec_fattn_rows_parts(int multiprocessors, int kv_heads);

// Floats of scratch the parts' sums need.
size_t specdec_fattn_rows_partials(const specdec_fattn_rows_args & args);

void specdec_fattn_rows(const specdec_fattn_rows_args & args, void * stream);
