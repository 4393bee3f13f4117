// specdec attention for exact mode's batches on CUDA: see fattn_rows.cuh for why and for the order
// of summing. Compiled by nvcc into ggml's CUDA backend (patch 0006), and by a C++ compiler with
// cuda_emulation.h for the CPU test of its indexing (test_fattn_rows.cu).
#include "fattn_rows.cuh"
#include "kernel_common.cuh"

#include <float.h>
#include <math.h>

// Why these sizes:
// - 32 keys per tile: lane l scores key l, so a tile's scores need no reduction across lanes,
//   only each lane reading the warp's 32 scores in order.
// - 8 pairs per block: a lone row of Qwen2.5 (6 or 7 query heads per KV head) or Llama 3 (4) fits
//   one block, so a step reads each tile once; a verification of 8 rows reads it 7 times instead
//   of 56 (patch 0003's one pair per block).
// - at most 32 parts: 32 parts of a 4-KV-head model make 128 blocks for a lone row, about one
//   per multiprocessor of an H100 or H200; more parts would only add partial sums to combine.
static_assert(SPECDEC_FATTN_TILE == 32, "a tile is one key per lane");

namespace {

constexpr int warp_size = 32;
constexpr int tile = SPECDEC_FATTN_TILE;
constexpr int nwarps = SPECDEC_FATTN_WARPS;
constexpr float no_max = -FLT_MAX / 2.0f;  // a pair's maximum before its first visible key

// exp(x - max) for x <= max, exactly 1 where x == max
__device__ __forceinline__ float exp_below(float x, float max) {
    return x == max ? 1.0f : expf(x - max);
}

// One (row, query head) pair per warp, over the tiles of keys its part holds; writes the part's
// unnormalised output, maximum and sum to the partials.
template <int D>
__global__ void __launch_bounds__(nwarps * warp_size) fattn_rows_part(const specdec_fattn_rows_args a) {
    constexpr int words = D / 2;                 // F16 pairs per key
    constexpr int words_per_lane = words / warp_size;
    __shared__ float q_s[nwarps][D];
    __shared__ uint32_t k_s[tile][words + 1];    // + 1: lane l reads key l's words a bank apart
    __shared__ uint32_t v_s[tile][words];
    __shared__ float score_s[nwarps][tile];
    __shared__ float p_s[nwarps][tile];

    const int part     = blockIdx.x;
    const int kv_head  = blockIdx.y % a.kv_heads;
    const int seq      = blockIdx.y / a.kv_heads;
    const int warp     = threadIdx.x / warp_size;
    const int lane     = threadIdx.x % warp_size;
    const int group    = a.heads / a.kv_heads;
    const int pair     = blockIdx.z * nwarps + warp;
    const bool active  = pair < a.rows * group;
    const int row      = active ? pair / group : 0;
    const int head     = kv_head * group + (active ? pair % group : 0);

    const float * q = (const float *) (a.q + seq * a.q_nb3 + head * a.q_nb2 + row * a.q_nb1);
    for (int d = lane; d < D; d += warp_size) {
        q_s[warp][d] = active ? __fmul_rn(q[d], a.scale) : 0.0f;
    }
    const char * k = a.k + seq * a.k_nb3 + kv_head * a.k_nb2;
    const char * v = a.v + seq * a.v_nb3 + kv_head * a.v_nb2;
    const uint16_t * mask = (const uint16_t *) (a.mask + (seq % a.mask_seqs) * a.mask_nb3 + row * a.mask_nb1);

    float m = no_max;
    float s = 0.0f;
    float o[2 * words_per_lane];
    for (int i = 0; i < 2 * words_per_lane; ++i) {
        o[i] = 0.0f;
    }

    for (int k0 = part * tile; k0 < a.n_kv; k0 += a.n_parts * tile) {
        __syncthreads();  // every warp is done with the last tile
        for (int i = threadIdx.x; i < tile * words; i += nwarps * warp_size) {
            const int key = i / words;
            const int word = i % words;
            const bool in_cache = k0 + key < a.n_kv;
            k_s[key][word] = in_cache ? ((const uint32_t *) (k + (int64_t) (k0 + key) * a.k_nb1))[word] : 0;
            v_s[key][word] = in_cache ? ((const uint32_t *) (v + (int64_t) (k0 + key) * a.v_nb1))[word] : 0;
        }
        __syncthreads();
        if (!active) {
            continue;
        }

        float score = -INFINITY;  // a masked key, whatever its cell holds
        if (k0 + lane < a.n_kv) {
            const float bias = specdec_half_bits_to_float(mask[k0 + lane]);
            if (bias != -INFINITY) {
                float dot = 0.0f;
                for (int w = 0; w < words; ++w) {
                    const uint32_t pair_of_k = k_s[lane][w];
                    dot = __fmaf_rn(q_s[warp][2 * w], specdec_half_bits_to_float(pair_of_k), dot);
                    dot = __fmaf_rn(q_s[warp][2 * w + 1], specdec_half_bits_to_float(pair_of_k >> 16), dot);
                }
                score = __fadd_rn(dot, bias);
            }
        }
        score_s[warp][lane] = score;
        __syncwarp();
        float tile_max = -INFINITY;
        for (int j = 0; j < tile; ++j) {
            tile_max = fmaxf(tile_max, score_s[warp][j]);
        }
        if (tile_max == -INFINITY) {
            continue;  // nothing visible: m, s and o stay as they are, bit for bit
        }
        const float m_new = fmaxf(m, tile_max);
        const float rescale = exp_below(m, m_new);
        p_s[warp][lane] = score == -INFINITY ? 0.0f : exp_below(score, m_new);
        __syncwarp();
        float tile_sum = 0.0f;
        for (int j = 0; j < tile; ++j) {
            tile_sum = __fadd_rn(tile_sum, p_s[warp][j]);
        }
        s = __fmaf_rn(s, rescale, tile_sum);
        for (int i = 0; i < 2 * words_per_lane; ++i) {
            o[i] = __fmul_rn(o[i], rescale);
        }
        for (int j = 0; j < tile; ++j) {
            const float p = p_s[warp][j];
            if (p == 0.0f) {
                continue;
            }
            for (int i = 0; i < words_per_lane; ++i) {
                const uint32_t pair_of_v = v_s[j][lane + warp_size * i];
                o[2 * i]     = __fmaf_rn(p, specdec_half_bits_to_float(pair_of_v), o[2 * i]);
                o[2 * i + 1] = __fmaf_rn(p, specdec_half_bits_to_float(pair_of_v >> 16), o[2 * i + 1]);
            }
        }
        m = m_new;
    }

    if (active) {
        const int64_t index = ((int64_t) (seq * a.rows + row) * a.heads + head) * a.n_parts + part;
        float * out = a.partials + index * (D + 2);
        for (int i = 0; i < words_per_lane; ++i) {
            const int word = lane + warp_size * i;
            out[2 * word]     = o[2 * i];
            out[2 * word + 1] = o[2 * i + 1];
        }
        if (lane == 0) {
            out[D]     = m;
            out[D + 1] = s;
        }
    }
}

// One (row, query head) pair per block, one output dimension per thread: the parts in order.
template <int D>
__global__ void __launch_bounds__(D) fattn_rows_combine(const specdec_fattn_rows_args a) {
    const int64_t pair = (int64_t) (blockIdx.z * a.rows + blockIdx.y) * a.heads + blockIdx.x;
    const float * parts = a.partials + pair * a.n_parts * (D + 2);
    const int d = threadIdx.x;
    float max = no_max;
    for (int i = 0; i < a.n_parts; ++i) {
        max = fmaxf(max, parts[i * (D + 2) + D]);
    }
    float sum = 0.0f;
    float out = 0.0f;
    for (int i = 0; i < a.n_parts; ++i) {
        const float * part = parts + i * (D + 2);
        const float weight = exp_below(part[D], max);
        sum = __fmaf_rn(part[D + 1], weight, sum);
        out = __fmaf_rn(part[d], weight, out);
    }
    a.dst[pair * D + d] = out / sum;
}

template <int D>
void launch_head_dim(const specdec_fattn_rows_args & a, void * stream) {
    const int pairs = a.rows * (a.heads / a.kv_heads);
    const dim3 grid(a.n_parts, a.kv_heads * a.seqs, (pairs + nwarps - 1) / nwarps);
    specdec_launch(fattn_rows_part<D>, grid, dim3(nwarps * warp_size), stream, a);
    specdec_launch(fattn_rows_combine<D>, dim3(a.heads, a.rows, a.seqs), dim3(D), stream, a);
}

}  // namespace

bool specdec_fattn_rows_head_dim_supported(int head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int specdec_fattn_rows_parts(int multiprocessors, int kv_heads) {
    const int parts = (multiprocessors + kv_heads - 1) / kv_heads;
    return parts < 1 ? 1 : parts > SPECDEC_FATTN_MAX_PARTS ? SPECDEC_FATTN_MAX_PARTS : parts;
}

size_t specdec_fattn_rows_partials(const specdec_fattn_rows_args & a) {
    return (size_t) a.seqs * a.rows * a.heads * a.n_parts * (a.head_dim + 2);
}

void specdec_fattn_rows(const specdec_fattn_rows_args & a, void * stream) {
    switch (a.head_dim) {
        case 64:
            launch_head_dim<64>(a, stream);
            break;
        case 128:
            launch_head_dim<128>(a, stream);
            break;
        case 256:
            launch_head_dim<256>(a, stream);
            break;
    }
}
