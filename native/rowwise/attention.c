// specdec's batch-invariant attention (attention.h). Plain C: every loop over lanes is elementwise
// and of fixed length, so compilers vectorise it for whatever instruction set ggml's CPU backend
// is built for, and the bits stay those of the scalar order.
// Copied into ggml/src/ggml-cpu/specdec/ by scripts/build-llama-cpp-python.sh.
#include "attention.h"

#include <math.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

// a * b + c fused here and not there would give other bits on other instruction sets
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define LANES SPECDEC_ATTN_LANES
#define BLOCK SPECDEC_ATTN_BLOCK
#define MAX_DIM SPECDEC_ATTN_MAX_DIM
// Keys whose dot products run side by side: independent chains of fused multiply-adds, enough to
// keep both FMA units busy through their latency (AVX-512: one register a key; AVX2: two).
#define KEYS_AT_ONCE 8  // block_scores names its eight accumulators
#define HALF_MINUS_INFINITY 0xfc00u  // what a mask holds for a hidden key

_Static_assert(BLOCK % KEYS_AT_ONCE == 0, "whole groups of keys in a block");

// IEEE half to float, exactly (zeros, subnormals, normals, inf, NaN), without branches.
static inline float half_to_float(uint16_t h) {
    const uint32_t magnitude = h & 0x7fffu;
    // exponent and mantissa in float's places, then times 2^112: exact for normals and subnormals
    const uint32_t moved = magnitude << 13;
    float f;
    memcpy(&f, &moved, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= magnitude >= 0x7c00u ? 0x7f800000u : 0u;  // inf and NaN keep an all-ones exponent
    bits |= (uint32_t) (h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// x rounded to the nearest half (ties to even), as a float: llama.cpp's CPU flash attention rounds
// the query so before its dot products with an F16 cache, and so does this kernel, to stay within
// float order of its results. Products of two halves are then exact in float.
static inline float round_to_half(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint32_t sign = bits & 0x80000000u;
    const uint32_t magnitude = bits ^ sign;
    // normal halves: the mantissa cut to 10 bits, ties to even (a carry may raise the exponent)
    const uint32_t normal = (magnitude + 0xfffu + ((magnitude >> 13) & 1u)) & ~0x1fffu;
    // subnormal halves (below 2^-14): multiples of 2^-24, rounded by adding and taking 0.5
    float absolute;
    memcpy(&absolute, &magnitude, sizeof absolute);
    const float small = (absolute + 0.5f) - 0.5f;
    uint32_t small_bits;
    memcpy(&small_bits, &small, sizeof small_bits);
    uint32_t rounded = magnitude < 0x38800000u ? small_bits : normal;
    rounded = magnitude >= 0x477ff000u ? (magnitude > 0x7f800000u ? magnitude : 0x7f800000u) : rounded;
    rounded |= sign;
    float result;
    memcpy(&result, &rounded, sizeof result);
    return result;
}

// e^x for x <= 0 (-inf gives 0), within about one ulp: x = n ln2 + r with |r| <= ln2 / 2, e^r by
// its Taylor series to r^7, times 2^n. exp(0) is exactly 1, so an unchanged maximum rescales by 1.
static inline float exp_nonpositive(float x) {
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float clamped = x < -87.0f ? -87.0f : x;
    const float shifted = fmaf(clamped, 1.44269504088896341f, magic);
    const float n = shifted - magic;
    float r = fmaf(n, -0.693145751953125f, clamped);  // ln 2's high part: n times it is exact
    r = fmaf(n, -1.42860682030941723e-6f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    const uint32_t power_bits = (bits - 0x4b400000u + 127u) << 23;  // 2^n, n in -126..0
    float power;
    memcpy(&power, &power_bits, sizeof power);
    return x < -87.0f ? 0.0f : p * power;
}

// One block's scores: s[j][l] = (q_l . k_j) * scale + mask, the dot product summed over d in order;
// -inf where the mask hides the key from the lane.
static void block_scores(int64_t dim, int n_keys, float scale, float (*qt)[LANES], float (*kf)[MAX_DIM],
                         float (*mask)[LANES], float (*s)[LANES]) {
    int j = 0;
    for (; j + KEYS_AT_ONCE <= n_keys; j += KEYS_AT_ONCE) {
        float d0[LANES] = {0}, d1[LANES] = {0}, d2[LANES] = {0}, d3[LANES] = {0};
        float d4[LANES] = {0}, d5[LANES] = {0}, d6[LANES] = {0}, d7[LANES] = {0};
        for (int64_t d = 0; d < dim; d++) {
            const float * q = qt[d];
            const float k0 = kf[j][d], k1 = kf[j + 1][d], k2 = kf[j + 2][d], k3 = kf[j + 3][d];
            const float k4 = kf[j + 4][d], k5 = kf[j + 5][d], k6 = kf[j + 6][d], k7 = kf[j + 7][d];
            for (int l = 0; l < LANES; l++) {
                d0[l] = fmaf(q[l], k0, d0[l]);
                d1[l] = fmaf(q[l], k1, d1[l]);
                d2[l] = fmaf(q[l], k2, d2[l]);
                d3[l] = fmaf(q[l], k3, d3[l]);
                d4[l] = fmaf(q[l], k4, d4[l]);
                d5[l] = fmaf(q[l], k5, d5[l]);
                d6[l] = fmaf(q[l], k6, d6[l]);
                d7[l] = fmaf(q[l], k7, d7[l]);
            }
        }
        float * dots[KEYS_AT_ONCE] = {d0, d1, d2, d3, d4, d5, d6, d7};
        for (int key = 0; key < KEYS_AT_ONCE; key++) {
            for (int l = 0; l < LANES; l++) {
                const float m = mask[j + key][l];
                s[j + key][l] = m == -INFINITY ? -INFINITY : dots[key][l] * scale + m;
            }
        }
    }
    for (; j < n_keys; j++) {
        float dot[LANES] = {0};
        for (int64_t d = 0; d < dim; d++) {
            const float kd = kf[j][d];
            for (int l = 0; l < LANES; l++) {
                dot[l] = fmaf(qt[d][l], kd, dot[l]);
            }
        }
        for (int l = 0; l < LANES; l++) {
            const float m = mask[j][l];
            s[j][l] = m == -INFINITY ? -INFINITY : dot[l] * scale + m;
        }
    }
}

// acc[d][l] += p[j][l] * v_j[d] for each key j in order.
static void block_values(int64_t dim, int n_keys, float (*p)[LANES], float (*vf)[MAX_DIM], float (*acc)[LANES]) {
    int j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        for (int64_t d = 0; d < dim; d++) {
            const float v0 = vf[j][d], v1 = vf[j + 1][d], v2 = vf[j + 2][d], v3 = vf[j + 3][d];
            for (int l = 0; l < LANES; l++) {
                float a = fmaf(p[j][l], v0, acc[d][l]);
                a = fmaf(p[j + 1][l], v1, a);
                a = fmaf(p[j + 2][l], v2, a);
                acc[d][l] = fmaf(p[j + 3][l], v3, a);
            }
        }
    }
    for (; j < n_keys; j++) {
        for (int64_t d = 0; d < dim; d++) {
            const float vd = vf[j][d];
            for (int l = 0; l < LANES; l++) {
                acc[d][l] = fmaf(p[j][l], vd, acc[d][l]);
            }
        }
    }
}

// n halves to floats: F16C's instruction where the build has it, the same exact values
static void halves_to_float(const uint16_t * src, int64_t n, float * dst) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (src + i))));
    }
#endif
    for (; i < n; i++) {
        dst[i] = half_to_float(src[i]);
    }
}

static void rows_to_float(const uint16_t * src, size_t stride, int n_rows, int64_t dim, float (*dst)[MAX_DIM]) {
    for (int j = 0; j < n_rows; j++) {
        halves_to_float(src + (size_t) j * stride, dim, dst[j]);
    }
}

bool specdec_attention_f16(int64_t head_dim_k, int64_t head_dim_v, int64_t n_kv, float scale,
                           const uint16_t * k, size_t k_stride, const uint16_t * v, size_t v_stride,
                           const specdec_attn_lanes * lanes) {
    if (head_dim_k > MAX_DIM || head_dim_v > MAX_DIM || lanes->n_lanes < 1 || lanes->n_lanes > LANES) {
        return false;
    }
    const int n_lanes = lanes->n_lanes;
    _Alignas(64) float qt[MAX_DIM][LANES];   // queries, transposed: a dimension's lanes side by side
    _Alignas(64) float acc[MAX_DIM][LANES];  // values, likewise
    _Alignas(64) float rows[BLOCK][MAX_DIM];  // the block's keys, then its values, as floats
    _Alignas(64) float mask[BLOCK][LANES];
    _Alignas(64) float s[BLOCK][LANES];  // scores, then their exponentials
    float running_max[LANES], sum[LANES];
    for (int64_t d = 0; d < head_dim_k; d++) {
        for (int l = 0; l < LANES; l++) {
            qt[d][l] = l < n_lanes ? round_to_half(lanes->q[l][d]) : 0.0f;
        }
    }
    memset(acc, 0, sizeof acc);
    for (int l = 0; l < LANES; l++) {
        running_max[l] = -INFINITY;
        sum[l] = 0.0f;
    }
    for (int64_t first = 0; first < n_kv; first += BLOCK) {
        const int n_keys = n_kv - first < BLOCK ? (int) (n_kv - first) : BLOCK;
        bool visible = false;
        for (int l = 0; l < LANES; l++) {
            const uint16_t * m = l < n_lanes ? lanes->mask[l] : NULL;
            float row[BLOCK];
            if (m != NULL) {
                unsigned seen = 0;
                for (int j = 0; j < n_keys; j++) {
                    seen |= m[first + j] != HALF_MINUS_INFINITY;
                }
                visible |= seen != 0;
                halves_to_float(m + first, n_keys, row);
            } else {
                visible |= l < n_lanes;
                for (int j = 0; j < n_keys; j++) {
                    row[j] = l < n_lanes ? 0.0f : -INFINITY;
                }
            }
            for (int j = 0; j < n_keys; j++) {
                mask[j][l] = row[j];
            }
        }
        if (!visible) {
            continue;  // a lane that sees none of a block's keys keeps its state: the same as skipping
        }
        rows_to_float(k + (size_t) first * k_stride, k_stride, n_keys, head_dim_k, rows);
        block_scores(head_dim_k, n_keys, scale, qt, rows, mask, s);
        float block_max[LANES], rescale[LANES];
        for (int l = 0; l < LANES; l++) {
            block_max[l] = -INFINITY;
        }
        for (int j = 0; j < n_keys; j++) {
            for (int l = 0; l < LANES; l++) {
                block_max[l] = s[j][l] > block_max[l] ? s[j][l] : block_max[l];
            }
        }
        for (int l = 0; l < LANES; l++) {
            const float new_max = block_max[l] > running_max[l] ? block_max[l] : running_max[l];
            rescale[l] = new_max == -INFINITY ? 1.0f : exp_nonpositive(running_max[l] - new_max);
            running_max[l] = new_max;
            sum[l] = sum[l] * rescale[l];
        }
        for (int j = 0; j < n_keys; j++) {
            for (int l = 0; l < LANES; l++) {
                s[j][l] = running_max[l] == -INFINITY ? 0.0f : exp_nonpositive(s[j][l] - running_max[l]);
                sum[l] = sum[l] + s[j][l];
            }
        }
        for (int64_t d = 0; d < head_dim_v; d++) {
            for (int l = 0; l < LANES; l++) {
                acc[d][l] = acc[d][l] * rescale[l];
            }
        }
        rows_to_float(v + (size_t) first * v_stride, v_stride, n_keys, head_dim_v, rows);
        block_values(head_dim_v, n_keys, s, rows, acc);
    }
    for (int l = 0; l < n_lanes; l++) {
        const float inverse = sum[l] == 0.0f ? 0.0f : 1.0f / sum[l];
        for (int64_t d = 0; d < head_dim_v; d++) {
            lanes->out[l][d] = acc[d][l] * inverse;
        }
    }
    return true;
}
