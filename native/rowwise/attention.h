// specdec's batch-invariant attention for ggml's CPU backend: flash attention over an F16 KV cache
// for the query rows of a batch-invariant batch (a verification, a one-token step, an exact
// prompt's batch), each (query row, head) computed alone in one fixed order, and cheap.
//
// Why: patch 0001 keeps attention invariant by sending every query row through llama.cpp's
// one-row path, which visits the keys one at a time per row and head: a vector dot product, two
// scalar expf and an FP16 accumulator rewritten per key. At long contexts that is much of a step
// (Qwen2.5 0.5B at 3,000 tokens: 14 of 44 ms on a 2-core Xeon), and verifying 8 tokens pays it
// 8 times. Here the (row, head) pairs that share a KV head take the lanes of one vector, so each
// key is converted once and its dot product, softmax and value update run for all of them at
// once. A lane's arithmetic never looks at another lane, so its result is the same bits whatever
// shares the vector: batch size, place in the batch and thread count change nothing. Only
// elementwise float operations are used, with fused multiply-adds written out and contraction
// off, so every instruction set gives the same bits as well (the test's digest).
//
// The order, per lane: keys in blocks of SPECDEC_ATTN_BLOCK from key 0. In a block, each score
// is a sequential sum over the head dimension (q rounded to FP16 as llama.cpp rounds it, k from
// FP16), times scale, plus the mask; the block's maximum raises the running one, the running sum
// and values are rescaled by exp(old - new), and each key then adds exp(score - max) to the sum
// and that times its value row to the values, in key order. Last, values / sum (0 where no key
// is visible).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPECDEC_ATTN_LANES 16   // (query row, head) pairs computed together
#define SPECDEC_ATTN_MAX_DIM 256  // head dimensions above this are declined
#define SPECDEC_ATTN_BLOCK 32   // keys per block of the online softmax

// The (query row, head) pairs of one call, all attending to the same KV head: lane l reads its
// query (head_dim_k floats) at q[l] and its mask (one FP16 per key, -inf hides the key; NULL: no
// mask) at mask[l], and writes head_dim_v floats at out[l].
typedef struct {
    int n_lanes;  // 1..SPECDEC_ATTN_LANES
    const float * q[SPECDEC_ATTN_LANES];
    const uint16_t * mask[SPECDEC_ATTN_LANES];
    float * out[SPECDEC_ATTN_LANES];
} specdec_attn_lanes;

// softmax(scale * q k^T + mask) v for each lane, over n_kv keys: key i's row of head_dim_k FP16 at
// k + i * k_stride (elements), its value row of head_dim_v FP16 at v + i * v_stride. False,
// having written nothing, where a head dimension is above SPECDEC_ATTN_MAX_DIM.
bool specdec_attention_f16(int64_t head_dim_k, int64_t head_dim_v, int64_t n_kv, float scale,
                           const uint16_t * k, size_t k_stride, const uint16_t * v, size_t v_stride,
                           const specdec_attn_lanes * lanes);

#ifdef __cplusplus
}
#endif
