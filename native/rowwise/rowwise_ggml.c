// ggml-cpu glue for specdec's row-wise kernels (rowwise.h): the plain-layout weight types (Q5_K,
// Q6_K, Q5_0, Q8_0), called from ggml_compute_forward_mul_mat (patches/llama.cpp/0002) for a batch-invariant
// batch once the activations are quantised to the weights' vec_dot_type (Q8_K, Q8_0).
// (Interleaved Q4_K is called from repack.cpp directly.)
// Copied into ggml/src/ggml-cpu/specdec/ by scripts/build-llama-cpp-python.sh.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "rowwise.h"

#include <stddef.h>

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
