// Tests (and a microbenchmark) for the row-wise kernels, with no llama.cpp: random blocks in
// ggml's layouts, a plain reference (dequantise, multiply in double), and bitwise checks that a
// row's result does not depend on the batch it was computed in.
//
//   make -C native test        builds it for each instruction set this machine runs, runs all
//   ./test_rowwise_avx2 bench  GMAC/s by number of activation rows (one thread)
//   ./test_rowwise_avx2 digest a hash of every product's bits: equal for every instruction set
//
// Exit 0 when every check passes; the last line reads "N passed, N failed".
#define _POSIX_C_SOURCE 199309L
#include "rowwise.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_common.h"

// IEEE half <-> float for normal values in the ranges used here (no F16C needed by the reference)
static uint16_t to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const int exponent = (int) ((x >> 23) & 0xff) - 127 + 15;
    const uint32_t mantissa = (x >> 13) & 0x3ff;
    return (uint16_t) (sign | ((uint32_t) exponent << 10) | mantissa);
}
static double from_fp16(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f;
    const double value = ldexp(1.0 + (h & 0x3ff) / 1024.0, exponent - 15);
    return (h & 0x8000) ? -value : value;
}

// ---- activations ---------------------------------------------------------------------------------

static void random_q8_K_row(specdec_block_q8_K * row, int nb) {
    for (int i = 0; i < nb; i++) {
        row[i].d = rnd_float(0.001f, 0.05f);
        for (int k = 0; k < SPECDEC_QK_K; k++) {
            row[i].qs[k] = (int8_t) rnd_range(-127, 127);
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) {
                sum += row[i].qs[16 * j + k];
            }
            row[i].bsums[j] = (int16_t) sum;
        }
    }
}

static double q8_K_value(const specdec_block_q8_K * row, int k) {
    return (double) row[k / SPECDEC_QK_K].d * row[k / SPECDEC_QK_K].qs[k % SPECDEC_QK_K];
}

// ---- Q4_K, interleaved by 8: built from per-row parameters, as make_block_q4_Kx8 lays them out ---

typedef struct {
    uint16_t d, dmin;
    uint8_t sc[8], m[8], q[SPECDEC_QK_K];
} q4_K_params;

static void pack_q4_Kx8(const q4_K_params rows[8], specdec_block_q4_Kx8 * out) {
    uint8_t plain[8][128];  // each row's plain Q4_K qs: byte 32j + l = q[64j + l] | q[64j + 32 + l] << 4
    for (int r = 0; r < 8; r++) {
        out->d[r] = rows[r].d;
        out->dmin[r] = rows[r].dmin;
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 32; l++) {
                plain[r][32 * j + l] = (uint8_t) (rows[r].q[64 * j + l] | (rows[r].q[64 * j + 32 + l] << 4));
            }
        }
    }
    for (int i = 0; i < 128; i++) {  // 8 bytes at a time, row after row
        memcpy(out->qs + 8 * i, plain[i % 8] + 8 * (i / 8), 8);
    }
    for (int j = 0; j < 8; j++) {
        uint8_t * s = out->scales + 12 * j;
        for (int r = 0; r < 4; r++) {
            s[r] = (uint8_t) ((rows[r].sc[j] & 63) | ((rows[r + 4].sc[j] & 48) << 2));
            s[r + 4] = (uint8_t) ((rows[r].m[j] & 63) | ((rows[r + 4].m[j] & 48) << 2));
            s[r + 8] = (uint8_t) ((rows[r + 4].sc[j] & 15) | ((rows[r + 4].m[j] & 15) << 4));
        }
    }
}

static void random_q4_K_params(q4_K_params * p) {
    p->d = to_fp16(rnd_float(0.0005f, 0.01f));
    p->dmin = to_fp16(rnd_float(0.0005f, 0.01f));
    for (int j = 0; j < 8; j++) {
        p->sc[j] = (uint8_t) rnd_range(0, 63);
        p->m[j] = (uint8_t) rnd_range(0, 63);
    }
    for (int k = 0; k < SPECDEC_QK_K; k++) {
        p->q[k] = (uint8_t) rnd_range(0, 15);
    }
}

static double q4_K_value(const q4_K_params * p, int k) {
    return from_fp16(p->d) * p->sc[k / 32] * p->q[k] - from_fp16(p->dmin) * p->m[k / 32];
}

// ---- Q6_K: random bytes are valid blocks -----------------------------------------------------------

static void random_q6_K(specdec_block_q6_K * b) {
    for (int k = 0; k < 128; k++) b->ql[k] = (uint8_t) rnd();
    for (int k = 0; k < 64; k++) b->qh[k] = (uint8_t) rnd();
    for (int j = 0; j < 16; j++) b->scales[j] = (int8_t) rnd_range(-128, 127);
    b->d = to_fp16(rnd_float(0.0005f, 0.01f));
}

// dequantize_row_q6_K's formula, one weight at a time
static double q6_K_value(const specdec_block_q6_K * row, int k) {
    const specdec_block_q6_K * b = row + k / SPECDEC_QK_K;
    const int w = k % SPECDEC_QK_K, h = w / 128, t = (w % 128) / 32, l = w % 32;
    const uint8_t ql = b->ql[64 * h + l + 32 * (t & 1)];
    const int low = t < 2 ? (ql & 0xf) : (ql >> 4);
    const int high = (b->qh[32 * h + l] >> (2 * t)) & 3;
    return from_fp16(b->d) * b->scales[w / 16] * ((low | (high << 4)) - 32);
}

// ---- Q5_K: random bytes are valid blocks, given valid fp16 scales ---------------------------------

static void random_q5_K(specdec_block_q5_K * b) {
    b->d = to_fp16(rnd_float(0.0005f, 0.01f));
    b->dmin = to_fp16(rnd_float(0.0005f, 0.01f));
    for (int k = 0; k < 12; k++) b->scales[k] = (uint8_t) rnd();
    for (int k = 0; k < 32; k++) b->qh[k] = (uint8_t) rnd();
    for (int k = 0; k < 128; k++) b->qs[k] = (uint8_t) rnd();
}

// ggml's get_scale_min_k4 and dequantize_row_q5_K, one weight at a time
static void scale_min_k4(int j, const uint8_t * q, int * sc, int * m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static double q5_K_value(const specdec_block_q5_K * row, int k) {
    const specdec_block_q5_K * b = row + k / SPECDEC_QK_K;
    const int w = k % SPECDEC_QK_K, j = w / 64, h = (w % 64) / 32, l = w % 32;
    const uint8_t ql = b->qs[32 * j + l];
    const int q = (h ? ql >> 4 : ql & 0xF) + 16 * ((b->qh[l] >> (2 * j + h)) & 1);
    int sc, m;
    scale_min_k4(2 * j + h, b->scales, &sc, &m);
    return from_fp16(b->d) * sc * q - from_fp16(b->dmin) * m;
}

// ---- Q8_0: weights and activations, |q| <= 127 as ggml's quantisers make them -------------------------

static void random_q8_0(specdec_block_q8_0 * b, int n_blocks) {
    for (int i = 0; i < n_blocks; i++) {
        b[i].d = to_fp16(rnd_float(0.0005f, 0.05f));
        for (int k = 0; k < 32; k++) b[i].qs[k] = (int8_t) rnd_range(-127, 127);
    }
}

// ---- Q5_0: random bytes are valid blocks, given a valid fp16 scale ------------------------------------

static void random_q5_0(specdec_block_q5_0 * b, int n_blocks) {
    for (int i = 0; i < n_blocks; i++) {
        b[i].d = to_fp16(rnd_float(0.0005f, 0.05f));
        for (int k = 0; k < 4; k++) b[i].qh[k] = (uint8_t) rnd();
        for (int k = 0; k < 16; k++) b[i].qs[k] = (uint8_t) rnd();
    }
}

// dequantize_row_q5_0's formula, one weight at a time
static double q5_0_weight(const specdec_block_q5_0 * b, int j) {
    const int low = j < 16 ? b->qs[j] & 0xF : b->qs[j - 16] >> 4;
    const int high = (b->qh[j / 8] >> (j % 8)) & 1;
    return from_fp16(b->d) * ((low | (high << 4)) - 16);
}

// ---- the checks --------------------------------------------------------------------------------------

enum { N_K = 1024, NB = N_K / SPECDEC_QK_K, N_WROWS = 32, MAX_AROWS = 70 };

typedef bool (*kernel_fn)(int64_t, const void *, size_t, int64_t, const void *, size_t, int64_t, float *, size_t);

typedef struct {
    const char * name;
    kernel_fn kernel;
    const void * w;
    size_t w_stride;   // bytes between weight rows (Q6_K) or groups of 8 (Q4_Kx8)
    int rows_per_w;    // 1 or 8: weight rows per w_stride
    double (*value)(const void * w, int row, int k);
    const void * acts;       // MAX_AROWS activation rows
    size_t act_row_bytes;
    double (*act_value)(int n, int k);
} matrix;

static specdec_block_q8_K acts[MAX_AROWS][NB];
static specdec_block_q8_0 acts_q8_0[MAX_AROWS][N_K / 32];

static double q8_K_act(int n, int k) { return q8_K_value(acts[n], k); }
static double q8_0_act(int n, int k) {
    return from_fp16(acts_q8_0[n][k / 32].d) * acts_q8_0[n][k / 32].qs[k % 32];
}

// The worst |got - reference| / sum |w a| over the first n_k weights, the reference in double.
static double worst_relative_error(const matrix * m, const float * got, int n_arows, int n_k) {
    double worst = 0;
    for (int n = 0; n < n_arows; n++) {
        for (int r = 0; r < N_WROWS; r++) {
            double ref = 0, magnitude = 0;
            for (int k = 0; k < n_k; k++) {
                const double term = m->value(m->w, r, k) * m->act_value(n, k);
                ref += term;
                magnitude += fabs(term);
            }
            const double error = fabs(got[n * N_WROWS + r] - ref) / magnitude;
            worst = error > worst ? error : worst;
        }
    }
    return worst;
}

static void tolerance_check(const matrix * m, const float * got, int n_arows) {
    // float sums of exact per-block integers: |error| <= 1e-5 * sum |w a| (the true error is ~1e-7)
    const double worst = worst_relative_error(m, got, n_arows, N_K);
    char what[128];
    snprintf(what, sizeof what, "%s: matches the double reference (worst relative error %.2e)", m->name, worst);
    check(worst <= 1e-5, what);
}

static void invariance_check(const matrix * m) {
    static float alone[MAX_AROWS][N_WROWS], batch[MAX_AROWS * N_WROWS];
    for (int n = 0; n < MAX_AROWS; n++) {
        m->kernel(N_K, m->w, m->w_stride, N_WROWS, (const uint8_t *) m->acts + n * m->act_row_bytes,
                  m->act_row_bytes, 1, alone[n], N_WROWS);
    }
    const int sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 64, MAX_AROWS};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int n_arows = sizes[s];
        m->kernel(N_K, m->w, m->w_stride, N_WROWS, m->acts, m->act_row_bytes, n_arows, batch, N_WROWS);
        char what[128];
        snprintf(what, sizeof what, "%s: %d rows together equal each row alone, bitwise", m->name, n_arows);
        check(memcmp(batch, alone, sizeof(float) * N_WROWS * n_arows) == 0, what);
        if (n_arows == MAX_AROWS) {
            tolerance_check(m, batch, n_arows);
        }
    }
    // a thread computes a slice of the weight rows: the slice's results are the same bits
    const int slice = 8;  // a multiple of 8 for the interleaved layout
    m->kernel(N_K, (const uint8_t *) m->w + (slice / m->rows_per_w) * m->w_stride, m->w_stride,
              N_WROWS - slice, m->acts, m->act_row_bytes, 5, batch, N_WROWS);
    int same = 1;
    for (int n = 0; n < 5; n++) {
        same &= memcmp(batch + n * N_WROWS, alone[n] + slice, sizeof(float) * (N_WROWS - slice)) == 0;
    }
    char what[128];
    snprintf(what, sizeof what, "%s: a slice of the weight rows gives the same bits", m->name);
    check(same, what);
}

// Q8_0 and Q5_0 take blocks in pairs: a row of an odd number of blocks ends on a lone one
static void odd_blocks_check(const matrix * m) {
    const int n_k = N_K - 32, n_arows = 9;
    static float alone[MAX_AROWS * N_WROWS], batch[MAX_AROWS * N_WROWS];
    for (int n = 0; n < n_arows; n++) {
        m->kernel(n_k, m->w, m->w_stride, N_WROWS, (const uint8_t *) m->acts + n * m->act_row_bytes,
                  m->act_row_bytes, 1, alone + n * N_WROWS, N_WROWS);
    }
    m->kernel(n_k, m->w, m->w_stride, N_WROWS, m->acts, m->act_row_bytes, n_arows, batch, N_WROWS);
    const double worst = worst_relative_error(m, batch, n_arows, n_k);
    char what[128];
    snprintf(what, sizeof what, "%s: an odd number of blocks, bitwise alone and together, error %.2e", m->name, worst);
    check(worst <= 1e-5 && memcmp(alone, batch, sizeof(float) * N_WROWS * n_arows) == 0, what);
}

static q4_K_params q4_rows[N_WROWS][NB];
static specdec_block_q4_Kx8 q4_packed[N_WROWS / 8][NB];
static specdec_block_q6_K q6_rows[N_WROWS][NB];
static specdec_block_q8_0 q8_0_rows[N_WROWS][N_K / 32];
static specdec_block_q5_K q5_rows[N_WROWS][NB];
static specdec_block_q5_0 q5_0_rows[N_WROWS][N_K / 32];

static double q4_value(const void * w, int row, int k) { (void) w; return q4_K_value(&q4_rows[row][k / SPECDEC_QK_K], k % SPECDEC_QK_K); }
static double q6_value(const void * w, int row, int k) { return q6_K_value(((const specdec_block_q6_K (*)[NB]) w)[row], k); }
static double q5_value(const void * w, int row, int k) { return q5_K_value(((const specdec_block_q5_K (*)[NB]) w)[row], k); }
static double q5_0_value(const void * w, int row, int k) {
    (void) w;
    return q5_0_weight(&q5_0_rows[row][k / 32], k % 32);
}
static double q8_0_value(const void * w, int row, int k) {
    (void) w;
    return from_fp16(q8_0_rows[row][k / 32].d) * q8_0_rows[row][k / 32].qs[k % 32];
}

static void build_matrices(matrix * q4, matrix * q5, matrix * q6, matrix * q8, matrix * q5_0) {
    for (int r = 0; r < N_WROWS; r++) {
        random_q8_0(q8_0_rows[r], N_K / 32);
        random_q5_0(q5_0_rows[r], N_K / 32);
        for (int i = 0; i < NB; i++) {
            random_q4_K_params(&q4_rows[r][i]);
            random_q6_K(&q6_rows[r][i]);
            random_q5_K(&q5_rows[r][i]);
        }
    }
    for (int g = 0; g < N_WROWS / 8; g++) {
        for (int i = 0; i < NB; i++) {
            q4_K_params group[8];
            for (int r = 0; r < 8; r++) group[r] = q4_rows[8 * g + r][i];
            pack_q4_Kx8(group, &q4_packed[g][i]);
        }
    }
    for (int n = 0; n < MAX_AROWS; n++) {
        random_q8_K_row(acts[n], NB);
        random_q8_0(acts_q8_0[n], N_K / 32);
    }
    *q4 = (matrix) {"q4_Kx8", specdec_rowwise_q4_Kx8, q4_packed, sizeof q4_packed[0], 8, q4_value, acts, sizeof acts[0], q8_K_act};
    *q5 = (matrix) {"q5_K", specdec_rowwise_q5_K, q5_rows, sizeof q5_rows[0], 1, q5_value, acts, sizeof acts[0], q8_K_act};
    *q6 = (matrix) {"q6_K", specdec_rowwise_q6_K, q6_rows, sizeof q6_rows[0], 1, q6_value, acts, sizeof acts[0], q8_K_act};
    *q5_0 = (matrix) {"q5_0", specdec_rowwise_q5_0, q5_0_rows, sizeof q5_0_rows[0], 1, q5_0_value, acts_q8_0, sizeof acts_q8_0[0], q8_0_act};
    *q8 = (matrix) {"q8_0", specdec_rowwise_q8_0, q8_0_rows, sizeof q8_0_rows[0], 1, q8_0_value, acts_q8_0, sizeof acts_q8_0[0], q8_0_act};
}

// ---- digest: the bits of products of every batch size, hashed (FNV-1a), to compare builds -------

static uint64_t digest_k(const matrix * m, int n_k, uint64_t hash) {
    static float out[MAX_AROWS * N_WROWS];
    for (int n_arows = 1; n_arows <= MAX_AROWS; n_arows++) {
        m->kernel(n_k, m->w, m->w_stride, N_WROWS, m->acts, m->act_row_bytes, n_arows, out, N_WROWS);
        const uint8_t * bytes = (const uint8_t *) out;
        for (size_t i = 0; i < sizeof(float) * N_WROWS * n_arows; i++) {
            hash = (hash ^ bytes[i]) * 0x100000001B3ull;
        }
    }
    return hash;
}

static uint64_t digest(const matrix * m, uint64_t hash) {
    return digest_k(m, N_K, hash);
}

// ---- microbenchmark: one weight matrix of the default target's shapes, one thread -------------------

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void bench(kernel_fn kernel, const char * name, size_t block_bytes, int block_k, int rows_per_stride,
                  int64_t n_wrows, int64_t n_k, bool q8_0_acts) {
    const int64_t nb = n_k / block_k;
    const size_t stride = block_bytes * (size_t) nb;  // bytes per weight row, or per group of 8
    const size_t w_bytes = stride * (size_t) (n_wrows / rows_per_stride);
    uint8_t * w = malloc(w_bytes);
    for (size_t i = 0; i < w_bytes; i++) w[i] = (uint8_t) rnd();
    const size_t a_row_bytes = q8_0_acts ? sizeof(specdec_block_q8_0) * (size_t) (n_k / 32)
                                         : sizeof(specdec_block_q8_K) * (size_t) (n_k / SPECDEC_QK_K);
    uint8_t * a = malloc(a_row_bytes * 16);
    for (int n = 0; n < 16; n++) {
        if (q8_0_acts) {
            random_q8_0((specdec_block_q8_0 *) (a + n * a_row_bytes), (int) (n_k / 32));
        } else {
            random_q8_K_row((specdec_block_q8_K *) (a + n * a_row_bytes), (int) (n_k / SPECDEC_QK_K));
        }
    }
    float * dst = malloc(sizeof(float) * n_wrows * 16);
    printf("%s, %lld x %lld (%.1f MB), one thread:\n", name, (long long) n_wrows, (long long) n_k, w_bytes / 1e6);
    double one = 0;
    for (int n_arows = 1; n_arows <= 16; n_arows *= 2) {
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            const double t = seconds();
            kernel(n_k, w, stride, n_wrows, a, a_row_bytes, n_arows, dst, n_wrows);
            const double dt = seconds() - t;
            best = dt < best ? dt : best;
        }
        if (n_arows == 1) one = best;
        printf("  n=%2d  %7.2f ms  %5.2fx n=1  %6.1f GMAC/s  %5.1f GB/s of weights\n", n_arows, best * 1e3,
               best / one, (double) n_wrows * n_k * n_arows / best / 1e9, w_bytes / best / 1e9);
    }
    free(w);
    free(a);
    free(dst);
}

int main(int argc, char ** argv) {
    matrix q4, q5, q6, q8, q5_0;
    build_matrices(&q4, &q5, &q6, &q8, &q5_0);
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        printf("row-wise kernels: %s\n", specdec_rowwise_isa());
        bench(specdec_rowwise_q4_Kx8, "q4_Kx8", sizeof(specdec_block_q4_Kx8), SPECDEC_QK_K, 8, 8960, 1536, false);
        bench(specdec_rowwise_q5_K, "q5_K", sizeof(specdec_block_q5_K), SPECDEC_QK_K, 1, 8960, 1536, false);
        bench(specdec_rowwise_q6_K, "q6_K", sizeof(specdec_block_q6_K), SPECDEC_QK_K, 1, 151936 / 4, 1536, false);
        bench(specdec_rowwise_q8_0, "q8_0", sizeof(specdec_block_q8_0), 32, 1, 8960, 1536, true);
        bench(specdec_rowwise_q5_0, "q5_0", sizeof(specdec_block_q5_0), 32, 1, 8960, 1536, true);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "digest") == 0) {
        printf("digest %016llx\n", (unsigned long long) digest_k(&q5_0, N_K - 32, digest_k(&q8, N_K - 32, digest(&q5_0, digest(&q8, digest(&q6, digest(&q5, digest(&q4, 0xCBF29CE484222325ull))))))));
        return 0;
    }
    printf("row-wise kernels: %s\n", specdec_rowwise_isa());
    if (strcmp(specdec_rowwise_isa(), "none") == 0) {
        float out[1];
        check(!specdec_rowwise_q4_Kx8(N_K, q4_packed, sizeof q4_packed[0], 8, acts, sizeof acts[0], 1, out, 1),
              "without a kernel, q4_Kx8 declines");
        check(!specdec_rowwise_q6_K(N_K, q6_rows, sizeof q6_rows[0], 1, acts, sizeof acts[0], 1, out, 1),
              "without a kernel, q6_K declines");
        check(!specdec_rowwise_q5_K(N_K, q5_rows, sizeof q5_rows[0], 1, acts, sizeof acts[0], 1, out, 1),
              "without a kernel, q5_K declines");
        check(!specdec_rowwise_q5_0(N_K, q5_0_rows, sizeof q5_0_rows[0], 1, acts_q8_0, sizeof acts_q8_0[0], 1, out, 1),
              "without a kernel, q5_0 declines");
        check(!specdec_rowwise_q8_0(N_K, q8_0_rows, sizeof q8_0_rows[0], 1, acts_q8_0, sizeof acts_q8_0[0], 1, out, 1),
              "without a kernel, q8_0 declines");
    } else {
        invariance_check(&q4);
        invariance_check(&q5);
        invariance_check(&q6);
        invariance_check(&q8);
        invariance_check(&q5_0);
        odd_blocks_check(&q8);
        odd_blocks_check(&q5_0);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
