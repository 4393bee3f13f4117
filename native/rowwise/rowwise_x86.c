// specdec row-wise K-quant kernels for x86: AVX-512 with VNNI, or AVX2 (FMA, F16C); see rowwise.h
// for what and why. Which one a build has follows the flags it is compiled with (ggml compiles its
// CPU backend for one instruction set); specdec_rowwise_isa() names it.
//
// Shape: for each super-block of weights (8 interleaved Q4_K rows, or one Q6_K row), unpack the
// 4/6-bit quants, scales and mins once into a small scratch (L1); then for each activation row
// in turn, multiply-add into that row's own accumulators. Nothing a row computes depends on the
// other rows, on how many there are, or on which weight rows share its call, so every result is
// bitwise the same for any batch size and thread split. Integer sums are exact (their order does
// not matter); the float operations and their order are written down above each kernel.
//
// Every float operation is an explicit intrinsic with no multiply feeding an add, so a compiler's
// contraction of a*b+c into an FMA (GCC's default, -ffp-contract=fast) cannot make the unrolled
// or specialised copies of a loop round differently; keep it so when editing.
//
// AVX2 multiplies u8 x s8 with vpmaddubsw into int16 pairs and applies the int16 sub-block scales
// with vpmaddwd, which also widens to int32. AVX-512 VNNI multiplies and adds four u8 x s8 products
// into an int32 lane in one vpdpbusd, then applies the scales with vpdpwssd (see its section).
// Both compute the same exact integers per super-block and then the same float operations in the
// same order, so the two builds give the same bits (test_rowwise.c's digest checks it).

#include "rowwise.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__FMA__) && defined(__F16C__)
#define SPECDEC_ROWWISE_AVX512_VNNI 1
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

// Activation rows handled per pass over the weights: their float accumulators live on the stack.
#define AROWS_PER_PASS 64

static inline __m256i broadcast_8_bytes(const int8_t * p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi64x(v);
}

static inline int32_t load_i32(const void * p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float fp16_to_fp32(uint16_t h) {
    return _cvtsh_ss(h);
}

// Sum of the 8 lanes, always in this order: (lanes 0-3 + lanes 4-7), then pairs, then the last two.
static inline float hsum_fixed(__m256 x) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

// The 8 sub-block scales (bytes 0-7) and mins (bytes 8-15) of a block_q4_K or block_q5_K, from
// their 12 packed bytes (ggml's get_scale_min_k4, four at a time). block_q4_Kx8 packs the 8
// rows' scales and mins of one sub-block the same way, rows in place of sub-blocks.
static inline __m128i scales_and_mins_k4(const uint8_t * packed) {
    const uint32_t w0 = (uint32_t) load_i32(packed);
    const uint32_t w1 = (uint32_t) load_i32(packed + 4);
    const uint32_t w2 = (uint32_t) load_i32(packed + 8);
    const uint32_t s03 = w0 & 0x3f3f3f3f;
    const uint32_t m03 = w1 & 0x3f3f3f3f;
    const uint32_t s47 = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
    const uint32_t m47 = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
    return _mm_setr_epi32((int) s03, (int) s47, (int) m03, (int) m47);
}

#if !defined(SPECDEC_ROWWISE_AVX512_VNNI)  // ---- the AVX2 kernels ----

// ---- Q4_K, 8 interleaved weight rows (block_q4_Kx8) x Q8_K ---------------------------------------

// One super-block of 8 weight rows, unpacked: quants as bytes 0..15, scales widened for vpmaddwd.
typedef struct {
    __m256i q[16][2][2];  // [chunk c][rows 0-3 | rows 4-7][low | high nibbles]
    __m256i scales[8][2]; // [sub-block][rows 0-3 | rows 4-7]: int16, each row's scale 4 times
    __m256i mins[8];      // [sub-block]: int16 pairs (m_r, m_r) for rows r = 0..7
    __m256 d;             // the 8 rows' d
    __m256 dmin;          // the 8 rows' dmin
} q4_Kx8_unpacked;

static void unpack_q4_Kx8_quants(const specdec_block_q4_Kx8 * b, q4_Kx8_unpacked * u) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 16; c++) {
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *) (b->qs + 64 * c + 32 * h));
            u->q[c][h][0] = _mm256_and_si256(raw, low4);
            u->q[c][h][1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        }
    }
}

static void unpack_q4_Kx8_scales(const specdec_block_q4_Kx8 * b, q4_Kx8_unpacked * u) {
    // 12 bytes per sub-block j: bytes 0-3 scales of rows 0-3 (6 bits) with bits 4-5 of rows 4-7's
    // scales on top, bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits of rows 4-7's
    // scale (low nibble) and min (high nibble).
    const __m128i rows_0_3 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m128i rows_4_7 = _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    const __m128i min_pairs = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    for (int j = 0; j < 8; j++) {
        const __m128i sm = scales_and_mins_k4(b->scales + 12 * j);  // rows 0..7: scales, mins
        u->scales[j][0] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, rows_0_3));
        u->scales[j][1] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, rows_4_7));
        u->mins[j] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, min_pairs));
    }
    u->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->d));
    u->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->dmin));
}

// The quants of chunk c of one super-block: rows 0-3 (a) and 4-7 (b), low and high nibbles;
// from the unpacked scratch, or unpacked from the block itself when `raw` is given (one row:
// the scratch would be written and read once for nothing).
typedef struct {
    __m256i low_a, low_b, high_a, high_b;
} q4_chunk;

static inline __attribute__((always_inline)) q4_chunk q4_chunk_at(const q4_Kx8_unpacked * u,
                                                                  const specdec_block_q4_Kx8 * raw, int c) {
    q4_chunk q;
    if (raw) {
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        const __m256i a = _mm256_loadu_si256((const __m256i *) (raw->qs + 64 * c));
        const __m256i b = _mm256_loadu_si256((const __m256i *) (raw->qs + 64 * c + 32));
        q.low_a = _mm256_and_si256(a, low4);
        q.low_b = _mm256_and_si256(b, low4);
        q.high_a = _mm256_and_si256(_mm256_srli_epi16(a, 4), low4);
        q.high_b = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
    } else {
        q.low_a = u->q[c][0][0];
        q.low_b = u->q[c][1][0];
        q.high_a = u->q[c][0][1];
        q.high_b = u->q[c][1][1];
    }
    return q;
}

// One activation super-block against one weight super-block: the integer sums, lane r for
// weight row r. sumi = sum_j sc[r][j] * sum_{k in j} q[r][k] * a[k]; summ = sum_j m[r][j] *
// (sum of a over sub-block j). Exact (at most 4 * 2 * 15 * 127 per int16 lane before widening),
// so where the quants come from cannot change them.
static inline __attribute__((always_inline)) void dot_q4_Kx8_block(
        const q4_Kx8_unpacked * u, const specdec_block_q4_Kx8 * raw, const specdec_block_q8_K * y,
        __m256i * sumi, __m256i * summ) {
    __m256i rows_0_3 = _mm256_setzero_si256();  // two int32 lanes per row
    __m256i rows_4_7 = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles)
        __m256i low_a = _mm256_setzero_si256(), low_b = _mm256_setzero_si256();
        __m256i high_a = _mm256_setzero_si256(), high_b = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const int c = 4 * j + k;
            const __m256i a_low = broadcast_8_bytes(y->qs + 64 * j + 8 * k);
            const __m256i a_high = broadcast_8_bytes(y->qs + 64 * j + 32 + 8 * k);
            const q4_chunk q = q4_chunk_at(u, raw, c);
            low_a = _mm256_add_epi16(low_a, _mm256_maddubs_epi16(q.low_a, a_low));
            low_b = _mm256_add_epi16(low_b, _mm256_maddubs_epi16(q.low_b, a_low));
            high_a = _mm256_add_epi16(high_a, _mm256_maddubs_epi16(q.high_a, a_high));
            high_b = _mm256_add_epi16(high_b, _mm256_maddubs_epi16(q.high_b, a_high));
        }
        rows_0_3 = _mm256_add_epi32(rows_0_3, _mm256_madd_epi16(low_a, u->scales[2 * j][0]));
        rows_0_3 = _mm256_add_epi32(rows_0_3, _mm256_madd_epi16(high_a, u->scales[2 * j + 1][0]));
        rows_4_7 = _mm256_add_epi32(rows_4_7, _mm256_madd_epi16(low_b, u->scales[2 * j][1]));
        rows_4_7 = _mm256_add_epi32(rows_4_7, _mm256_madd_epi16(high_b, u->scales[2 * j + 1][1]));
    }
    // hadd gives rows 0 1 4 5 2 3 6 7; the permute puts them in order
    *sumi = _mm256_permute4x64_epi64(_mm256_hadd_epi32(rows_0_3, rows_4_7), 0xD8);

    __m256i mins = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {  // bsums[2j] + bsums[2j+1] is the sum of a over sub-block j
        const __m256i pair = _mm256_set1_epi32(load_i32(y->bsums + 2 * j));
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(u->mins[j], pair));
    }
    *summ = mins;
}

// Float order, per activation row n and weight row r (lane r), over super-blocks i = 0, 1, ...:
//   acc = fma(d[r] * d_a, float(sumi), acc); acc = acc - (dmin[r] * d_a) * float(summ)  (fnmadd)
// starting from acc = 0; acc is the result.
static void q4_Kx8_pass(int64_t nb, const void * weights, const uint8_t * a,
                        size_t a_row_bytes, int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q4_Kx8 * w = weights;
    __m256 acc[AROWS_PER_PASS];
    q4_Kx8_unpacked u;
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const specdec_block_q4_Kx8 * raw = n_arows == 1 ? w + i : NULL;
        unpack_q4_Kx8_scales(w + i, &u);
        if (!raw) {
            unpack_q4_Kx8_quants(w + i, &u);
        }
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) (a + n * a_row_bytes) + i;
            __m256i sumi, summ;
            if (raw) {
                dot_q4_Kx8_block(&u, raw, y, &sumi, &summ);
            } else {
                dot_q4_Kx8_block(&u, NULL, y, &sumi, &summ);
            }
            const __m256 da = _mm256_set1_ps(y->d);
            acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(u.d, da), _mm256_cvtepi32_ps(sumi), acc[n]);
            acc[n] = _mm256_fnmadd_ps(_mm256_mul_ps(u.dmin, da), _mm256_cvtepi32_ps(summ), acc[n]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        _mm256_storeu_ps(dst + n * dst_stride, acc[n]);
    }
}

// ---- Q6_K, one weight row x Q8_K ----------------------------------------------------------------

typedef struct {
    __m256i q[8];       // quants 32y..32y+31 as bytes 0..63
    __m256i scales[8];  // int16: sub-block 2y's scale 8 times, then sub-block 2y+1's
    __m256i all_scales; // int16: the 16 sub-block scales
    float d;
} q6_K_unpacked;

static inline __attribute__((always_inline)) void unpack_q6_K(const specdec_block_q6_K * b, q6_K_unpacked * u) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {  // halves of 128 weights: 64 bytes of ql, 32 of qh
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *) (b->qh + 32 * h));
        // weights 32t + l take ql's low (t = 0, 1) or high (t = 2, 3) nibble and qh's bits 2t, 2t+1
        u->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
        u->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
        u->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
        u->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
    }
    const __m128i scales = _mm_loadu_si128((const __m128i *) b->scales);
    for (int y = 0; y < 8; y++) {
        const __m128i pick = _mm_setr_epi8(2 * y, 2 * y, 2 * y, 2 * y, 2 * y, 2 * y, 2 * y, 2 * y,
                                           2 * y + 1, 2 * y + 1, 2 * y + 1, 2 * y + 1,
                                           2 * y + 1, 2 * y + 1, 2 * y + 1, 2 * y + 1);
        u->scales[y] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
    }
    u->all_scales = _mm256_cvtepi8_epi16(scales);
    u->d = fp16_to_fp32(b->d);
}

// sum_j sc[j] * sum_{k in j} (q[k] - 32) * a[k], as 8 int32 lanes (unordered: exact). The -32 is
// taken out through the activations' 16-sums: 32 * sum_j sc[j] * bsums[j].
static inline __attribute__((always_inline)) __m256i dot_q6_K_block(const q6_K_unpacked * u, const specdec_block_q8_K * y) {
    __m256i sum = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *) (y->qs + 32 * t));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[t], a), u->scales[t]));
    }
    const __m256i bsums = _mm256_loadu_si256((const __m256i *) y->bsums);
    const __m256i offset = _mm256_madd_epi16(u->all_scales, bsums);
    return _mm256_sub_epi32(sum, _mm256_slli_epi32(offset, 5));
}

// Float order, per activation row n and the weight row, over super-blocks i = 0, 1, ...:
//   acc = fma(broadcast(d * d_a), float(lanes), acc)   (8 lanes, from acc = 0)
// then the result is hsum_fixed(acc).
static void q6_K_pass(int64_t nb, const void * weights, const uint8_t * a,
                      size_t a_row_bytes, int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q6_K * w = weights;
    __m256 acc[AROWS_PER_PASS];
    q6_K_unpacked u;
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    if (n_arows == 1) {  // the same operations, with the unpacked block kept in registers
        for (int64_t i = 0; i < nb; i++) {
            q6_K_unpacked one;
            unpack_q6_K(w + i, &one);
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) a + i;
            const __m256 scale = _mm256_set1_ps(one.d * y->d);
            acc[0] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot_q6_K_block(&one, y)), acc[0]);
        }
        dst[0] = hsum_fixed(acc[0]);
        return;
    }
    for (int64_t i = 0; i < nb; i++) {
        unpack_q6_K(w + i, &u);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) (a + n * a_row_bytes) + i;
            const __m256 scale = _mm256_set1_ps(u.d * y->d);
            acc[n] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot_q6_K_block(&u, y)), acc[n]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        dst[n * dst_stride] = hsum_fixed(acc[n]);
    }
}

// ---- Q5_K, one weight row x Q8_K ----------------------------------------------------------------
//
// Per block and activation row, two sets of 8 int32 lanes (exact):
//   sumi lane l = sum over sub-blocks t of sc[t] * (products of bytes 4l..4l + 3 of sub-block t)
//                 (vpmaddubsw, then vpmaddwd with the sub-block's scale; q <= 31, so no int16
//                 pair saturates)
//   summ lane j = m[j] * (sum of the activations of sub-block j)   (vpmaddwd with Q8_K's bsums)
// Float order, per activation row n, over super-blocks i = 0, 1, ...:
//   acc = fma(broadcast(d * d_a), float(sumi), acc); acc = acc - broadcast(dmin * d_a) * float(summ)
//   (fnmadd), from acc = 0; then the result is hsum_fixed(acc).

typedef struct {
    __m256i q[8];        // sub-block t's quants (0..31) as bytes
    __m256i scales[8];   // int16: sub-block t's scale 16 times
    __m256i mins;        // int16 pairs (m_j, m_j), j = 0..7
    float d, dmin;
} q5_K_unpacked;

static inline __attribute__((always_inline)) void unpack_q5_K(const specdec_block_q5_K * b, q5_K_unpacked * u) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i qh = _mm256_loadu_si256((const __m256i *) b->qh);
    for (int j = 0; j < 4; j++) {
        const __m256i ql = _mm256_loadu_si256((const __m256i *) (b->qs + 32 * j));
        const __m256i fifth_low = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one);
        const __m256i fifth_high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one);
        u->q[2 * j] = _mm256_or_si256(_mm256_and_si256(ql, low4), _mm256_slli_epi16(fifth_low, 4));
        u->q[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), low4),
                                          _mm256_slli_epi16(fifth_high, 4));
    }
    const __m128i sm = scales_and_mins_k4(b->scales);
    const __m256i wide = _mm256_cvtepu8_epi16(sm);  // int16: 8 scales, then 8 mins
    int16_t scales[16];
    _mm256_storeu_si256((__m256i *) scales, wide);
    for (int t = 0; t < 8; t++) {
        u->scales[t] = _mm256_set1_epi16(scales[t]);
    }
    const __m128i min_pairs = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    u->mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, min_pairs));
    u->d = fp16_to_fp32(b->d);
    u->dmin = fp16_to_fp32(b->dmin);
}

static inline __attribute__((always_inline)) void dot_q5_K_block(const q5_K_unpacked * u, const specdec_block_q8_K * y,
                                                                 __m256i * sumi, __m256i * summ) {
    __m256i sum = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *) (y->qs + 32 * t));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[t], a), u->scales[t]));
    }
    *sumi = sum;
    *summ = _mm256_madd_epi16(u->mins, _mm256_loadu_si256((const __m256i *) y->bsums));
}

static void q5_K_pass(int64_t nb, const void * weights, const uint8_t * a, size_t a_row_bytes,
                      int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q5_K * w = weights;
    __m256 acc[AROWS_PER_PASS];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        q5_K_unpacked u;
        unpack_q5_K(w + i, &u);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) (a + n * a_row_bytes) + i;
            __m256i sumi, summ;
            dot_q5_K_block(&u, y, &sumi, &summ);
            acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(u.d * y->d), _mm256_cvtepi32_ps(sumi), acc[n]);
            acc[n] = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin * y->d), _mm256_cvtepi32_ps(summ), acc[n]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        dst[n * dst_stride] = hsum_fixed(acc[n]);
    }
}

// ---- Q8_0 and Q5_0, one weight row x Q8_0 ---------------------------------------------------------
//
// Both are blocks of 32 signed weights with one fp16 scale (Q8_0: -127..127; Q5_0: 4 + 1 bits,
// -16..15), times Q8_0 activations. Per block and activation row, 8 int32 lanes: lane l sums the
// products of weights and activations 4l..4l + 3 (vpmaddubsw of |w| and a with w's sign, then
// vpmaddwd with ones; ggml's quantisers keep |q| <= 127, so no int16 pair saturates). Exact, so
// the AVX-512 kernel's lanes are the same integers.
//
// Float order, per activation row n, over blocks b = 0, 1, ...:
//   acc[b % 2] = fma(broadcast(d_w[b] * d_a[b]), float(lanes), acc[b % 2])   (from acc = 0)
// then the result is hsum_fixed(acc[0] + acc[1]). (Two accumulators: the AVX-512 kernel takes
// blocks in pairs, one per 256-bit half.)

typedef struct {
    __m256i q;  // 32 signed weights
    float d;
} signed_block;

static inline signed_block q8_0_weights(const void * row, int64_t b) {
    const specdec_block_q8_0 * block = (const specdec_block_q8_0 *) row + b;
    return (signed_block) {_mm256_loadu_si256((const __m256i *) block->qs), fp16_to_fp32(block->d)};
}

// Q5_0: weight j is (low nibble of qs[j], or high nibble of qs[j - 16]) + 16 * bit j of qh, - 16
static inline signed_block q5_0_weights(const void * row, int64_t b) {
    const specdec_block_q5_0 * block = (const specdec_block_q5_0 *) row + b;
    const __m128i qs = _mm_loadu_si128((const __m128i *) block->qs);
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0f));
    // byte j takes byte j / 8 of qh and keeps bit j % 8 of it
    const __m256i which_byte = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    const __m256i qh = _mm256_shuffle_epi8(_mm256_set1_epi32(load_i32(block->qh)), which_byte);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles, fifth), _mm256_set1_epi8(16));
    return (signed_block) {q, fp16_to_fp32(block->d)};
}

static inline __attribute__((always_inline)) void signed_blocks_pass(
        signed_block (*weights)(const void *, int64_t), int64_t nb, const void * w, const uint8_t * a,
        size_t a_row_bytes, int64_t n_arows, float * dst, size_t dst_stride) {
    __m256 acc[AROWS_PER_PASS][2];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n][0] = _mm256_setzero_ps();
        acc[n][1] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const signed_block wb = weights(w, b);
        const __m256i q_abs = _mm256_sign_epi8(wb.q, wb.q);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_0 * y = (const specdec_block_q8_0 *) (a + n * a_row_bytes) + b;
            const __m256i act = _mm256_loadu_si256((const __m256i *) y->qs);
            const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(act, wb.q)),
                                                    _mm256_set1_epi16(1));
            const __m256 scale = _mm256_set1_ps(wb.d * fp16_to_fp32(y->d));
            acc[n][b & 1] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), acc[n][b & 1]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        dst[n * dst_stride] = hsum_fixed(_mm256_add_ps(acc[n][0], acc[n][1]));
    }
}

static void q8_0_pass(int64_t nb, const void * w, const uint8_t * a, size_t a_row_bytes, int64_t n_arows,
                      float * dst, size_t dst_stride) {
    signed_blocks_pass(q8_0_weights, nb, w, a, a_row_bytes, n_arows, dst, dst_stride);
}

static void q5_0_pass(int64_t nb, const void * w, const uint8_t * a, size_t a_row_bytes, int64_t n_arows,
                      float * dst, size_t dst_stride) {
    signed_blocks_pass(q5_0_weights, nb, w, a, a_row_bytes, n_arows, dst, dst_stride);
}

const char * specdec_rowwise_isa(void) {
    return "avx2";
}

#else  // ---- the AVX-512 VNNI kernels ----
// ---- Q4_K, 8 interleaved weight rows x Q8_K, AVX-512 VNNI ----------------------------------------
//
// A 64-byte chunk c of block_q4_Kx8.qs holds 8 bytes of each of the 8 rows (row r at 8r), so one
// zmm register is 8 rows x 16 quants (low and high nibbles), and vpdpbusd against the 8 matching
// activation bytes broadcast to every row gives int32 lanes 2r, 2r + 1 = row r's two half-sums.
// Over the 4 chunks of a sub-block a lane sums 16 products of q <= 15 and |a| <= 128: at most
// 30720, so it is also an int16 with its sign in the high half, and vpdpwssd against (scale, 0)
// multiplies it by the 6-bit sub-block scale and accumulates in int32 in one instruction. The
// mins go the same way: vpdpwssd of (m, m) pairs against the activations' 16-sums.
//
// Activation rows are taken in tiles of up to Q4_TILE (their accumulators stay in registers);
// the weights' scales are unpacked once per super-block, their quants once per tile from the
// block itself, which is in L1 after the first tile.

#define Q4_TILE 8  // measured: 8 rows 180 GMAC/s per core at n = 16, 4 rows 162

typedef struct {
    __m512i scales[8];  // [sub-block j]: int32 lanes 2r, 2r + 1 = (scale of row r, 0) as int16 pairs
    __m512i mins[4];    // [q]: int32 lane 2r + h = (m, m), m the min of row r's sub-block 2q + h
    __m256 d;           // the 8 rows' d
    __m256 dmin;        // the 8 rows' dmin
} q4_Kx8_scales512;

static void unpack_q4_Kx8_scales512(const specdec_block_q4_Kx8 * b, q4_Kx8_scales512 * u) {
    __m128i mins[8];  // sub-block j's 8 min bytes (rows 0..7) in the low 8 bytes
    for (int j = 0; j < 8; j++) {
        const __m128i sm = scales_and_mins_k4(b->scales + 12 * j);  // rows 0..7: scales, mins
        mins[j] = _mm_srli_si128(sm, 8);
        u->scales[j] = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, sm));
    }
    for (int q = 0; q < 4; q++) {
        const __m512i m = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(mins[2 * q], mins[2 * q + 1]));
        u->mins[q] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
    }
    u->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->d));
    u->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->dmin));
}

static inline __m512i broadcast_8_bytes512(const void * p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi64(v);
}

// int32 lanes 2r and 2r + 1 added: row r's total, rows 0..7 in order (exact)
static inline __m256i add_lane_pairs(__m512i x) {
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(x, _mm512_srli_epi64(x, 32)));
}

// Up to Q4_TILE activation rows (their super-block i at y[t]) against one weight super-block: the
// same exact integers as dot_q4_Kx8_block (AVX2), lane r for weight row r.
static inline __attribute__((always_inline)) void dot_q4_Kx8_tile512(
        const specdec_block_q4_Kx8 * b, const q4_Kx8_scales512 * u, const specdec_block_q8_K * const * y,
        const int tile, __m256i * sumi, __m256i * summ) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i total[Q4_TILE];
    for (int t = 0; t < tile; t++) {
        total[t] = _mm512_setzero_si512();
    }
    for (int j = 0; j < 4; j++) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles)
        __m512i low[Q4_TILE], high[Q4_TILE];
        for (int t = 0; t < tile; t++) {
            low[t] = _mm512_setzero_si512();
            high[t] = _mm512_setzero_si512();
        }
        for (int k = 0; k < 4; k++) {
            const __m512i raw = _mm512_loadu_si512((const void *) (b->qs + 64 * (4 * j + k)));
            const __m512i q_low = _mm512_and_si512(raw, low4);
            const __m512i q_high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
            for (int t = 0; t < tile; t++) {
                low[t] = _mm512_dpbusd_epi32(low[t], q_low, broadcast_8_bytes512(y[t]->qs + 64 * j + 8 * k));
                high[t] = _mm512_dpbusd_epi32(high[t], q_high, broadcast_8_bytes512(y[t]->qs + 64 * j + 32 + 8 * k));
            }
        }
        for (int t = 0; t < tile; t++) {
            total[t] = _mm512_dpwssd_epi32(total[t], low[t], u->scales[2 * j]);
            total[t] = _mm512_dpwssd_epi32(total[t], high[t], u->scales[2 * j + 1]);
        }
    }
    for (int t = 0; t < tile; t++) {
        __m512i mins = _mm512_setzero_si512();
        for (int q = 0; q < 4; q++) {  // bsums 4q, 4q + 1 sum sub-block 2q; 4q + 2, 4q + 3 sub-block 2q + 1
            mins = _mm512_dpwssd_epi32(mins, u->mins[q], broadcast_8_bytes512(y[t]->bsums + 4 * q));
        }
        sumi[t] = add_lane_pairs(total[t]);
        summ[t] = add_lane_pairs(mins);
    }
}

static inline __attribute__((always_inline)) void q4_Kx8_tile512(
        const specdec_block_q4_Kx8 * b, const q4_Kx8_scales512 * u, int64_t i, const uint8_t * a,
        size_t a_row_bytes, const int tile, __m256 * acc) {
    const specdec_block_q8_K * y[Q4_TILE];
    for (int t = 0; t < tile; t++) {
        y[t] = (const specdec_block_q8_K *) (a + t * a_row_bytes) + i;
    }
    __m256i sumi[Q4_TILE], summ[Q4_TILE];
    dot_q4_Kx8_tile512(b, u, y, tile, sumi, summ);
    for (int t = 0; t < tile; t++) {  // the float order of q4_Kx8_pass (AVX2)
        const __m256 da = _mm256_set1_ps(y[t]->d);
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(u->d, da), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(u->dmin, da), _mm256_cvtepi32_ps(summ[t]), acc[t]);
    }
}

// Float order, per activation row n and weight row r (lane r), over super-blocks i = 0, 1, ...:
//   acc = fma(d[r] * d_a, float(sumi), acc); acc = acc - (dmin[r] * d_a) * float(summ)  (fnmadd)
// starting from acc = 0; acc is the result. The same as the AVX2 kernel, on the same integers.
static void q4_Kx8_pass(int64_t nb, const void * weights, const uint8_t * a,
                        size_t a_row_bytes, int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q4_Kx8 * w = weights;
    __m256 acc[AROWS_PER_PASS];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        q4_Kx8_scales512 u;
        unpack_q4_Kx8_scales512(w + i, &u);
        int64_t n = 0;
        for (; n + Q4_TILE <= n_arows; n += Q4_TILE) {
            q4_Kx8_tile512(w + i, &u, i, a + n * a_row_bytes, a_row_bytes, Q4_TILE, acc + n);
        }
        const uint8_t * rest = a + n * a_row_bytes;
        switch (n_arows - n) {  // the rows left over: the same integers, in a smaller tile
#define Q4_REST(rows) case rows: q4_Kx8_tile512(w + i, &u, i, rest, a_row_bytes, rows, acc + n); break
            Q4_REST(7); Q4_REST(6); Q4_REST(5); Q4_REST(4); Q4_REST(3); Q4_REST(2); Q4_REST(1);
#undef Q4_REST
            default: break;
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        _mm256_storeu_ps(dst + n * dst_stride, acc[n]);
    }
}

// ---- Q6_K, one weight row x Q8_K, AVX-512 VNNI ---------------------------------------------------
//
// The block's 256 quants (0..63) unpacked once into 4 zmm registers of 64 weights; per activation
// row, vpdpbusd gives int32 lane L of register v = 4 products of bytes 4L..4L + 3 (sub-block
// 4v + L / 4; at most 4 * 63 * 128 = 32256, an int16), and vpdpwssd against (scale, 0) scales and
// accumulates them. Adding the two 256-bit halves gives exactly the AVX2 kernel's 8 lanes (its lane
// l sums bytes 4l..4l + 3 of every 32 weights), so the float operations that follow are its own.

typedef struct {
    __m512i q[4];        // quants 64v..64v + 63 as bytes 0..63
    __m512i scales[4];   // int32 lane L = (scale of sub-block 4v + L / 4, 0) as int16 pairs
    __m256i minus_32_scales;  // int16: the 16 sub-block scales times -32
    float d;
} q6_K_unpacked512;

static inline __attribute__((always_inline)) void unpack_q6_K512(const specdec_block_q6_K * b, q6_K_unpacked512 * u) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    // qh's bits for weights 32t + l sit at 2t, 2t + 1: moved to bits 4-5 by shifting left 4 (t = 0),
    // left 2 (t = 1), not at all (t = 2), right 2 (t = 3); the low 256 bits take t = 0 or 2
    const __m512i shift_up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shift_down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; h++) {  // halves of 128 weights: 64 bytes of ql, 32 of qh
        const __m512i ql = _mm512_loadu_si512((const void *) (b->ql + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (b->qh + 32 * h)));
        u->q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                      _mm512_and_si512(_mm512_sllv_epi16(qh, shift_up), bits45));
        u->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, shift_down), bits45));
    }
    const __m128i scales = _mm_loadu_si128((const __m128i *) b->scales);
    for (int v = 0; v < 4; v++) {
        const __m128i pick = _mm_setr_epi8(4 * v, 4 * v, 4 * v, 4 * v, 4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v + 1,
                                           4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2,
                                           4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 3);
        const __m256i wide = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
        u->scales[v] = _mm512_cvtepu16_epi32(wide);
    }
    u->minus_32_scales = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(scales), _mm256_set1_epi16(-32));
    u->d = fp16_to_fp32(b->d);
}

// the AVX2 kernel's dot_q6_K_block, the same 8 int32 lanes: the -32 offset is the starting value
// of the low 8 lanes (|32 * scale| <= 4096 fits int16)
static inline __attribute__((always_inline)) __m256i dot_q6_K_block512(const q6_K_unpacked512 * u, const specdec_block_q8_K * y) {
    const __m256i bsums = _mm256_loadu_si256((const __m256i *) y->bsums);
    __m512i sum = _mm512_zextsi256_si512(_mm256_madd_epi16(u->minus_32_scales, bsums));
    for (int v = 0; v < 4; v++) {
        const __m512i a = _mm512_loadu_si512((const void *) (y->qs + 64 * v));
        sum = _mm512_dpwssd_epi32(sum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), u->q[v], a), u->scales[v]);
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
}

// Float order: that of q6_K_pass (AVX2), per activation row n, over super-blocks i = 0, 1, ...:
//   acc = fma(broadcast(d * d_a), float(lanes), acc)   (8 lanes, from acc = 0)
// then the result is hsum_fixed(acc).
static void q6_K_pass(int64_t nb, const void * weights, const uint8_t * a,
                      size_t a_row_bytes, int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q6_K * w = weights;
    __m256 acc[AROWS_PER_PASS];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        q6_K_unpacked512 u;  // in registers: 8 zmm and one ymm
        unpack_q6_K512(w + i, &u);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) (a + n * a_row_bytes) + i;
            const __m256 scale = _mm256_set1_ps(u.d * y->d);
            acc[n] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot_q6_K_block512(&u, y)), acc[n]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        dst[n * dst_stride] = hsum_fixed(acc[n]);
    }
}

// ---- Q5_K, one weight row x Q8_K, AVX-512 VNNI ---------------------------------------------------
//
// Register v holds sub-blocks 2v (low 256 bits) and 2v + 1 (high); vpdpbusd then vpdpwssd against
// (scale, 0) as for Q6_K (a lane's 4 products are at most 4 * 31 * 128, an int16), and adding the
// halves gives the AVX2 kernel's sumi lanes; summ and the float order are its own.

typedef struct {
    __m512i q[4];       // quants 64v..64v + 63 (sub-blocks 2v, 2v + 1) as bytes
    __m512i scales[4];  // int32 lanes 0-7: (scale of sub-block 2v, 0); lanes 8-15: of 2v + 1
    __m256i mins;       // int16 pairs (m_j, m_j), j = 0..7
    float d, dmin;
} q5_K_unpacked512;

static inline __attribute__((always_inline)) void unpack_q5_K512(const specdec_block_q5_K * b, q5_K_unpacked512 * u) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) b->qh));
    const __m128i sm = scales_and_mins_k4(b->scales);
    const __m512i scales = _mm512_cvtepu8_epi32(sm);  // lanes 0-7: the 8 scales (lanes 8-15: mins)
    for (int v = 0; v < 4; v++) {
        const __m512i ql = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (b->qs + 32 * v)));
        const __m512i fifth_shift = _mm512_inserti64x4(_mm512_set1_epi16((short) (2 * v)),
                                                        _mm256_set1_epi16((short) (2 * v + 1)), 1);
        const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, fifth_shift), one);
        u->q[v] = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(ql, nibble_shift), low4),
                                  _mm512_slli_epi16(fifth, 4));
        const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi32(2 * v), _mm256_set1_epi32(2 * v + 1), 1);
        u->scales[v] = _mm512_permutexvar_epi32(pick, scales);
    }
    const __m128i min_pairs = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    u->mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, min_pairs));
    u->d = fp16_to_fp32(b->d);
    u->dmin = fp16_to_fp32(b->dmin);
}

static void q5_K_pass(int64_t nb, const void * weights, const uint8_t * a, size_t a_row_bytes,
                      int64_t n_arows, float * dst, size_t dst_stride) {
    const specdec_block_q5_K * w = weights;
    __m256 acc[AROWS_PER_PASS];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        q5_K_unpacked512 u;
        unpack_q5_K512(w + i, &u);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_K * y = (const specdec_block_q8_K *) (a + n * a_row_bytes) + i;
            __m512i sum = _mm512_setzero_si512();
            for (int v = 0; v < 4; v++) {
                const __m512i act = _mm512_loadu_si512((const void *) (y->qs + 64 * v));
                sum = _mm512_dpwssd_epi32(sum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.q[v], act), u.scales[v]);
            }
            const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            const __m256i summ = _mm256_madd_epi16(u.mins, _mm256_loadu_si256((const __m256i *) y->bsums));
            acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(u.d * y->d), _mm256_cvtepi32_ps(sumi), acc[n]);
            acc[n] = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin * y->d), _mm256_cvtepi32_ps(summ), acc[n]);
        }
    }
    for (int64_t n = 0; n < n_arows; n++) {
        dst[n * dst_stride] = hsum_fixed(acc[n]);
    }
}

// ---- Q8_0 and Q5_0, one weight row x Q8_0, AVX-512 VNNI ----------------------------------------------
//
// Blocks in pairs, one per 256-bit half: vpdpbusd of |w| and a with w's sign (a masked negation:
// AVX-512 has no vpsignb) gives the AVX2 kernel's 8 lanes for each block of the pair, and one
// 512-bit fma adds them into its two accumulators at once (low half: even blocks, high: odd).
// Float order: that of signed_blocks_pass (AVX2); a last unpaired block goes to the even
// accumulator.

typedef struct {
    __m512i q;  // blocks b (low 256 bits) and b + 1 (high): 64 signed weights
    __m128 d;   // lanes 0, 1: their scales
} signed_pair;

static inline __m128 two_fp16(uint16_t first, uint16_t second) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int) first | ((int) second << 16)));
}

static inline signed_pair q8_0_weight_pair(const void * row, int64_t b) {
    const specdec_block_q8_0 * block = (const specdec_block_q8_0 *) row + b;
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) block[0].qs)),
                                         _mm256_loadu_si256((const __m256i *) block[1].qs), 1);
    return (signed_pair) {q, two_fp16(block[0].d, block[1].d)};
}

// Q5_0 as q5_0_weights (AVX2); the two blocks' qh are the 64 bits of a byte mask (adding 16
// to a nibble sets its fifth bit)
static inline signed_pair q5_0_weight_pair(const void * row, int64_t b) {
    const specdec_block_q5_0 * block = (const specdec_block_q5_0 *) row + b;
    const __m128i qs0 = _mm_loadu_si128((const __m128i *) block[0].qs);
    const __m128i qs1 = _mm_loadu_si128((const __m128i *) block[1].qs);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(qs0, 4), qs0)),
                                            _mm256_set_m128i(_mm_srli_epi16(qs1, 4), qs1), 1);
    const __m512i nibbles = _mm512_and_si512(both, _mm512_set1_epi8(0x0f));
    const __mmask64 fifth = (__mmask64) (uint32_t) load_i32(block[0].qh) |
                            ((__mmask64) (uint32_t) load_i32(block[1].qh) << 32);
    const __m512i q = _mm512_sub_epi8(_mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(0x10)),
                                      _mm512_set1_epi8(16));
    return (signed_pair) {q, two_fp16(block[0].d, block[1].d)};
}

// the last block when the count is odd: the low half of a pair
static inline signed_pair q8_0_weight_last(const void * row, int64_t b) {
    const specdec_block_q8_0 * block = (const specdec_block_q8_0 *) row + b;
    const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) block->qs));
    return (signed_pair) {q, _mm_set_ss(fp16_to_fp32(block->d))};
}

static inline signed_pair q5_0_weight_last(const void * row, int64_t b) {
    const specdec_block_q5_0 * block = (const specdec_block_q5_0 *) row + b;
    const __m128i qs = _mm_loadu_si128((const __m128i *) block->qs);
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0f));
    const __mmask32 fifth = (__mmask32) (uint32_t) load_i32(block->qh);
    const __m256i q = _mm256_sub_epi8(_mm256_mask_add_epi8(nibbles, fifth, nibbles, _mm256_set1_epi8(0x10)),
                                      _mm256_set1_epi8(16));
    return (signed_pair) {_mm512_castsi256_si512(q), _mm_set_ss(fp16_to_fp32(block->d))};
}

static inline __attribute__((always_inline)) void signed_blocks_pass512(
        signed_pair (*pair_at)(const void *, int64_t), signed_pair (*last_at)(const void *, int64_t),
        int64_t nb, const void * w, const uint8_t * a, size_t a_row_bytes, int64_t n_arows,
        float * dst, size_t dst_stride) {
    __m512 acc[AROWS_PER_PASS];
    for (int64_t n = 0; n < n_arows; n++) {
        acc[n] = _mm512_setzero_ps();
    }
    const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const signed_pair wp = pair_at(w, b);
        const __m512i q_abs = _mm512_abs_epi8(wp.q);
        const __mmask64 negative = _mm512_movepi8_mask(wp.q);
        for (int64_t n = 0; n < n_arows; n++) {
            const specdec_block_q8_0 * y = (const specdec_block_q8_0 *) (a + n * a_row_bytes) + b;
            const __m512i act = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) y[0].qs)),
                                                   _mm256_loadu_si256((const __m256i *) y[1].qs), 1);
            const __m512i signed_act = _mm512_mask_sub_epi8(act, negative, _mm512_setzero_si512(), act);
            const __m512i lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q_abs, signed_act);
            const __m128 scales = _mm_mul_ps(wp.d, two_fp16(y[0].d, y[1].d));
            const __m512 scale = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(scales));
            acc[n] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(lanes), acc[n]);
        }
    }
    const bool odd = b < nb;
    signed_pair last = {_mm512_setzero_si512(), _mm_setzero_ps()};
    if (odd) {
        last = last_at(w, b);
    }
    for (int64_t n = 0; n < n_arows; n++) {
        __m256 even = _mm512_castps512_ps256(acc[n]);
        if (odd) {  // the last block, unpaired
            const specdec_block_q8_0 * y = (const specdec_block_q8_0 *) (a + n * a_row_bytes) + b;
            const __m256i q = _mm512_castsi512_si256(last.q);
            const __m256i act = _mm256_loadu_si256((const __m256i *) y->qs);
            const __m256i signed_act = _mm256_mask_sub_epi8(act, _mm256_movepi8_mask(q), _mm256_setzero_si256(), act);
            const __m256i lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(q), signed_act);
            const __m256 scale = _mm256_set1_ps(_mm_cvtss_f32(last.d) * fp16_to_fp32(y->d));
            even = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), even);
        }
        dst[n * dst_stride] = hsum_fixed(_mm256_add_ps(even, _mm512_extractf32x8_ps(acc[n], 1)));
    }
}

static void q8_0_pass(int64_t nb, const void * w, const uint8_t * a, size_t a_row_bytes, int64_t n_arows,
                      float * dst, size_t dst_stride) {
    signed_blocks_pass512(q8_0_weight_pair, q8_0_weight_last, nb, w, a, a_row_bytes, n_arows, dst, dst_stride);
}

static void q5_0_pass(int64_t nb, const void * w, const uint8_t * a, size_t a_row_bytes, int64_t n_arows,
                      float * dst, size_t dst_stride) {
    signed_blocks_pass512(q5_0_weight_pair, q5_0_weight_last, nb, w, a, a_row_bytes, n_arows, dst, dst_stride);
}

const char * specdec_rowwise_isa(void) {
    return "avx512_vnni";
}
#endif

// ---- entry points: each instruction set above defines the passes ------------------------------------

typedef void (*pass_fn)(int64_t, const void *, const uint8_t *, size_t, int64_t, float *, size_t);

// The weight rows (or groups of rows_per_unit interleaved rows) one after the other, each against
// the activation rows in passes of at most AROWS_PER_PASS.
static bool rows_mul(pass_fn pass, int64_t block_k, int64_t rows_per_unit, int64_t n_k, const void * w,
                     size_t w_unit_bytes, int64_t n_wrows, const void * a, size_t a_row_bytes, int64_t n_arows,
                     float * dst, size_t dst_stride) {
    if (n_k % block_k != 0 || n_wrows % rows_per_unit != 0) {
        return false;
    }
    for (int64_t u = 0; u < n_wrows / rows_per_unit; u++) {
        const uint8_t * unit = (const uint8_t *) w + u * w_unit_bytes;
        for (int64_t n0 = 0; n0 < n_arows; n0 += AROWS_PER_PASS) {
            const int64_t count = n_arows - n0 < AROWS_PER_PASS ? n_arows - n0 : AROWS_PER_PASS;
            pass(n_k / block_k, unit, (const uint8_t *) a + n0 * a_row_bytes, a_row_bytes, count,
                 dst + n0 * dst_stride + u * rows_per_unit, dst_stride);
        }
    }
    return true;
}

bool specdec_rowwise_q4_Kx8(int64_t n_k, const void * w, size_t w_group_bytes, int64_t n_wrows,
                            const void * a, size_t a_row_bytes, int64_t n_arows,
                            float * dst, size_t dst_stride) {
    return rows_mul(q4_Kx8_pass, SPECDEC_QK_K, 8, n_k, w, w_group_bytes, n_wrows, a, a_row_bytes, n_arows, dst,
                    dst_stride);
}

bool specdec_rowwise_q5_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    return rows_mul(q5_K_pass, SPECDEC_QK_K, 1, n_k, w, w_row_bytes, n_wrows, a, a_row_bytes, n_arows, dst,
                    dst_stride);
}

bool specdec_rowwise_q6_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    return rows_mul(q6_K_pass, SPECDEC_QK_K, 1, n_k, w, w_row_bytes, n_wrows, a, a_row_bytes, n_arows, dst,
                    dst_stride);
}

bool specdec_rowwise_q8_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    return rows_mul(q8_0_pass, 32, 1, n_k, w, w_row_bytes, n_wrows, a, a_row_bytes, n_arows, dst, dst_stride);
}

bool specdec_rowwise_q5_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    return rows_mul(q5_0_pass, 32, 1, n_k, w, w_row_bytes, n_wrows, a, a_row_bytes, n_arows, dst, dst_stride);
}

#else  // no kernel for this instruction set: callers keep llama.cpp's one-row path

bool specdec_rowwise_q6_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    (void) n_k; (void) w; (void) w_row_bytes; (void) n_wrows;
    (void) a; (void) a_row_bytes; (void) n_arows; (void) dst; (void) dst_stride;
    return false;
}

bool specdec_rowwise_q4_Kx8(int64_t n_k, const void * w, size_t w_group_bytes, int64_t n_wrows,
                            const void * a, size_t a_row_bytes, int64_t n_arows,
                            float * dst, size_t dst_stride) {
    (void) n_k; (void) w; (void) w_group_bytes; (void) n_wrows;
    (void) a; (void) a_row_bytes; (void) n_arows; (void) dst; (void) dst_stride;
    return false;
}

bool specdec_rowwise_q5_K(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    (void) n_k; (void) w; (void) w_row_bytes; (void) n_wrows;
    (void) a; (void) a_row_bytes; (void) n_arows; (void) dst; (void) dst_stride;
    return false;
}

bool specdec_rowwise_q8_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    (void) n_k; (void) w; (void) w_row_bytes; (void) n_wrows;
    (void) a; (void) a_row_bytes; (void) n_arows; (void) dst; (void) dst_stride;
    return false;
}

bool specdec_rowwise_q5_0(int64_t n_k, const void * w, size_t w_row_bytes, int64_t n_wrows,
                          const void * a, size_t a_row_bytes, int64_t n_arows,
                          float * dst, size_t dst_stride) {
    (void) n_k; (void) w; (void) w_row_bytes; (void) n_wrows;
    (void) a; (void) a_row_bytes; (void) n_arows; (void) dst; (void) dst_stride;
    return false;
}

const char * specdec_rowwise_isa(void) {
    return "none";
}

#endif
