// ggml-cpu glue for specdec's row-wise kernels (rowwise.h): the plain-layout weight types (Q5_K,
// Q6_K, Q5_0, Q8_0), called from ggml_compute_forward_mul_mat (patches/llama.cpp/0002) for a batch-invariant
// batch once the activations are quantised to the weights' vec_dot_type (Q8_K, Q8_0).
// (Interleaved Q4_K is called from repack.cpp directly.) And for its attention (attention.h),
// called from ggml_compute_forward_flash_attn_ext_f16.
// Copied into ggml/src/ggml-cpu/specdec/ by scripts/build-llama-cpp-python.sh.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "attention.h"
#include "rowwise.h"

#include <stddef.h>
#include <string.h>

_Static_assert(sizeof(specdec_block_q8_K) == sizeof(block_q8_K), "Q8_K layout");
_Static_assert(offsetof(specdec_block_q8_K, bsums) == offsetof(block_q8_K, bsums), "Q8_K layout");
_Static_assert(sizeof(specdec_block_q6_K) == sizeof(block_q6_K), "Q6_K layout");
_Static_assert(offsetof(specdec_block_q6_K, d) == offsetof(block_q6_K, d), "Q6_K layout");
_Static_assert(sizeof(specdec_block_q4_Kx8) == 8 * sizeof(block_q4_K), "Q4_Kx8 layout");
_Static_assert(sizeof(specdec_block_q5_K) == sizeof(block_q5_K), "Q5_K layout");
_Static_assert(offsetof(specdec_block_q5_K, qh) == offsetof(block_q5_K, qh), "Q5_K layout");
_Static_assert(offsetof(specdec_block_q5_K, qs) == offsetof(block_q5_K, qs), "Q5_K layout");
_Static_assert(sizeof(specdec_block_q5_0) == sizeof(block_q5_0), "Q5_0 layout");
_Static_assert(offsetof(specdec_block_q5_0, qs) == offsetof(block_q5_0, qs), "Q5_0 layout");
_Static_assert(sizeof(specdec_block_q8_0) == sizeof(block_q8_0), "Q8_0 layout");
_Static_assert(offsetof(specdec_block_q8_0, qs) == offsetof(block_q8_0, qs), "Q8_0 layout");

typedef bool (*rowwise_kernel)(int64_t, const void *, size_t, int64_t, const void *, size_t, int64_t, float *, size_t);

// True when it computed dst (this thread's share of the weight rows); false, having written
// nothing, on every thread alike, where it has no kernel for the weights' type or shape.
bool ggml_cpu_specdec_rowwise_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const bool plain_2d = src0->ne[2] == 1 && src0->ne[3] == 1 && src1->ne[2] == 1 && src1->ne[3] == 1;
    rowwise_kernel kernel;
    enum ggml_type activations;  // the weights' vec_dot_type
    switch (src0->type) {
        case GGML_TYPE_Q5_K: kernel = specdec_rowwise_q5_K; activations = GGML_TYPE_Q8_K; break;
        case GGML_TYPE_Q6_K: kernel = specdec_rowwise_q6_K; activations = GGML_TYPE_Q8_K; break;
        case GGML_TYPE_Q8_0: kernel = specdec_rowwise_q8_0; activations = GGML_TYPE_Q8_0; break;
        case GGML_TYPE_Q5_0: kernel = specdec_rowwise_q5_0; activations = GGML_TYPE_Q8_0; break;
        default: return false;
    }
    if (src1->type != GGML_TYPE_F32 || !plain_2d) {
        return false;
    }
    // the activations, quantised by ggml_compute_forward_mul_mat row after row into wdata
    const size_t a_row_bytes = ggml_row_size(activations, src1->ne[0]);
    const int64_t n_wrows = src0->ne[1];
    const int64_t first = n_wrows * params->ith / params->nth;
    const int64_t last = n_wrows * (params->ith + 1) / params->nth;
    return kernel(src0->ne[0], (const char *) src0->data + first * src0->nb[1], src0->nb[1], last - first,
                  params->wdata, a_row_bytes, src1->ne[1], (float *) dst->data + first, dst->nb[1] / sizeof(float));
}

const char * ggml_cpu_specdec_rowwise_isa(void) {
    return specdec_rowwise_isa();
}

static _Atomic bool attention_enabled = true;

// Query heads to a KV head below this, and the kernel is declined for every batch size (so a
// model's attention takes one path whatever its batch): a one-token step fills that few of a
// call's 16 lanes, and llama.cpp's one-row path costs less. SmolLM2 135M, 3 to a KV head, at 3,000
// tokens of context: 31.5 against 27.7 ms a step with it (2-core Xeon, AVX-512); Qwen2.5 0.5B, 7:
// 37.0 against 44.3 ms (docs/measurements/experiments/attention_costs.py).
#define ATTENTION_MIN_GROUP 4

void ggml_cpu_specdec_set_attention(bool enabled) {
    attention_enabled = enabled;
}

// specdec's attention (attention.h) for the query rows of a batch-invariant batch: true when it
// computed dst (this thread's share of the (KV head, lane group) items); false, on every thread
// alike, where it does not take the case (a KV cache not in F16, ALiBi, a soft cap, sinks, head
// dimensions above SPECDEC_ATTN_MAX_DIM, fewer than ATTENTION_MIN_GROUP query heads to a KV
// head), and llama.cpp's one-row path runs as before.
bool ggml_cpu_specdec_attention(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    const struct ggml_tensor * v = dst->src[2];
    const struct ggml_tensor * mask = dst->src[3];
    float scale, max_bias, softcap;
    memcpy(&scale, (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap, (const float *) dst->op_params + 2, sizeof(float));
    if (!attention_enabled || q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16 || dst->src[4] != NULL ||
        max_bias != 0.0f || softcap != 0.0f || (mask != NULL && mask->type != GGML_TYPE_F16) ||
        k->ne[0] > SPECDEC_ATTN_MAX_DIM || v->ne[0] > SPECDEC_ATTN_MAX_DIM || k->ne[2] != v->ne[2] ||
        k->ne[3] != v->ne[3] || q->ne[2] % k->ne[2] != 0 || q->ne[2] / k->ne[2] < ATTENTION_MIN_GROUP ||
        q->ne[3] % k->ne[3] != 0 ||
        k->nb[1] % sizeof(uint16_t) != 0 || v->nb[1] % sizeof(uint16_t) != 0) {
        return false;
    }
    const int64_t n_rows = q->ne[1], n_heads = q->ne[2], n_kv_heads = k->ne[2];
    const int64_t group = n_heads / n_kv_heads;  // query heads to a KV head
    const int64_t pairs = n_rows * group;         // (row, head) pairs that read one KV head
    const int64_t items_per_head = (pairs + SPECDEC_ATTN_LANES - 1) / SPECDEC_ATTN_LANES;
    const int64_t items = q->ne[3] * n_kv_heads * items_per_head;
    for (int64_t item = params->ith; item < items; item += params->nth) {
        const int64_t iq3 = item / (n_kv_heads * items_per_head);
        const int64_t kv_head = item / items_per_head % n_kv_heads;
        const int64_t first = item % items_per_head * SPECDEC_ATTN_LANES;
        specdec_attn_lanes lanes = {.n_lanes = (int) (pairs - first < SPECDEC_ATTN_LANES ? pairs - first : SPECDEC_ATTN_LANES)};
        for (int l = 0; l < lanes.n_lanes; l++) {
            const int64_t row = (first + l) / group;
            const int64_t head = kv_head * group + (first + l) % group;
            lanes.q[l] = (const float *) ((const char *) q->data + row * q->nb[1] + head * q->nb[2] + iq3 * q->nb[3]);
            lanes.mask[l] = mask == NULL ? NULL
                : (const uint16_t *) ((const char *) mask->data + row * mask->nb[1] + (head % mask->ne[2]) * mask->nb[2] +
                                      (iq3 % mask->ne[3]) * mask->nb[3]);
            // dst is permuted: [head dim, head, row, stream]
            lanes.out[l] = (float *) ((char *) dst->data + (iq3 * dst->ne[2] * dst->ne[1] + row * dst->ne[1] + head) * dst->nb[1]);
        }
        const int64_t ik3 = iq3 / (q->ne[3] / k->ne[3]);
        const uint16_t * k_head = (const uint16_t *) ((const char *) k->data + kv_head * k->nb[2] + ik3 * k->nb[3]);
        const uint16_t * v_head = (const uint16_t *) ((const char *) v->data + kv_head * v->nb[2] + ik3 * v->nb[3]);
        specdec_attention_f16(k->ne[0], v->ne[0], k->ne[1], scale, k_head, k->nb[1] / sizeof(uint16_t), v_head,
                              v->nb[1] / sizeof(uint16_t), &lanes);
    }
    return true;
}
