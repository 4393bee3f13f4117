// Tests (and a microbenchmark) for specdec's batch-invariant attention, with no llama.cpp: random
// queries, an FP16 KV cache and masks; a reference in double; bitwise checks that a lane's result
// does not depend on the lanes beside it.
//
//   make -C native/rowwise test      builds it for each instruction set this machine runs, runs all
//   ./test_attention_avx2 bench       microseconds a call by lanes and keys (one thread)
//   ./test_attention_avx2 digest      a hash of every result's bits: equal for every instruction set
//
// Exit 0 when every check passes; the last line reads "N passed, N failed".
#define _POSIX_C_SOURCE 199309L
#include "attention.c"  // the kernel's helpers too (half_to_float, exp_nonpositive)

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "test_common.h"

// IEEE half's value, by its definition
static double half_value(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    double value;
    if (exponent == 0x1f) {
        value = mantissa ? NAN : INFINITY;
    } else if (exponent == 0) {
        value = ldexp(mantissa, -24);
    } else {
        value = ldexp(1024 + mantissa, exponent - 25);
    }
    return (h & 0x8000) ? -value : value;
}

// the nearest half of a float, ties to the even one (as F16C and llama.cpp round): searched
// among the halves next to a first guess, so it holds for subnormal and overflowing values too
static uint16_t to_half(float f) {
    const double x = fabs((double) f);
    uint16_t best = 0x7c00;  // inf: beyond 65520 nothing is nearer
    double best_error = x >= 65520.0 ? 0.0 : INFINITY;
    const int exponent = x < ldexp(1.0, -14) ? 0 : ilogb(x) + 15;
    const int first = exponent <= 0 ? 0 : (exponent << 10) - 1;
    for (int h = first; h < first + 1026 && h < 0x7c00 && best_error > 0.0; h++) {
        const double error = fabs(half_value((uint16_t) h) - x);
        if (error < best_error || (error == best_error && (h & 1) == 0)) {
            best_error = error;
            best = (uint16_t) h;
        }
        if (half_value((uint16_t) h) > x) {
            break;
        }
    }
    return (uint16_t) (best | (signbit(f) ? 0x8000 : 0));
}

static void half_to_float_check(void) {
    int exact = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float got = half_to_float((uint16_t) h);
        const double want = half_value((uint16_t) h);
        if (isnan(want) ? !isnan(got) : (double) got != want || !signbit(got) != !signbit(want)) {
            exact = 0;
            printf("  half %04x: %g, want %g\n", h, got, want);
            break;
        }
    }
    check(exact, "half_to_float is exact for every half (zeros, subnormals, inf, NaN)");
}

static void round_to_half_check(void) {
    int exact = 1;
    for (int i = 0; i < 400000 && exact; i++) {
        uint32_t bits = rnd();
        bits = (bits & 0x807fffffu) | ((uint32_t) (100 + rnd() % 45) << 23);  // 2^-27 .. 2^17
        if (i % 4 == 0) {
            bits = (bits & ~0x1fffu) | 0x1000u;  // a tie between two halves
        }
        float x;
        memcpy(&x, &bits, 4);
        const float got = round_to_half(x);
        const double want = half_value(to_half(x));
        if ((double) got != want) {
            exact = 0;
            printf("  round_to_half(%a) = %a, want %a\n", (double) x, (double) got, want);
        }
    }
    check(exact, "round_to_half is the nearest half, ties to even, subnormals and overflow too");
}

static void exp_check(void) {
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -100.0f * (float) i / 2000000.0f;
        const double want = exp((double) x);
        const float got = exp_nonpositive(x);
        const double ulp = want < 1.2e-38 ? 1.4e-45 : ldexp(1.0, ilogb(want) - 23);
        const double error = fabs(got - want) / ulp;
        if (x >= -87.0f && error > worst) {
            worst = error;
        }
        if (x < -87.0f && got != 0.0f) {
            worst = INFINITY;
        }
    }
    printf("  exp: worst error %.2f ulp on [-87, 0]\n", worst);
    check(worst <= 2.0, "exp_nonpositive within 2 ulp, 0 below -87");
    check(exp_nonpositive(0.0f) == 1.0f, "exp(0) is exactly 1");
    check(exp_nonpositive(-INFINITY) == 0.0f, "exp(-inf) is 0");
}

#define MAX_KV 1100
#define MAX_LANES_TOTAL 40

typedef struct {
    int64_t dk, dv, n_kv;
    float scale;
    uint16_t * k;
    uint16_t * v;
    float q[MAX_LANES_TOTAL][SPECDEC_ATTN_MAX_DIM];
    uint16_t mask[MAX_LANES_TOTAL][MAX_KV];
} problem;

static const uint16_t HALF_MINUS_INF = 0xfc00;

// Lane i sees a prefix of the keys (as a causal mask leaves it), some lanes with holes, one none.
static void build(problem * p, int64_t dk, int64_t dv, int64_t n_kv) {
    p->dk = dk;
    p->dv = dv;
    p->n_kv = n_kv;
    p->scale = 1.0f / sqrtf((float) dk);
    p->k = malloc(sizeof(uint16_t) * (size_t) (n_kv * dk));
    p->v = malloc(sizeof(uint16_t) * (size_t) (n_kv * dv));
    for (int64_t i = 0; i < n_kv * dk; i++) {
        p->k[i] = to_half(rnd_float(-2.0f, 2.0f));
    }
    for (int64_t i = 0; i < n_kv * dv; i++) {
        p->v[i] = to_half(rnd_float(-1.0f, 1.0f));
    }
    for (int lane = 0; lane < MAX_LANES_TOTAL; lane++) {
        for (int64_t d = 0; d < dk; d++) {
            p->q[lane][d] = rnd_float(-3.0f, 3.0f);
        }
        const int64_t seen = lane == 7 ? 0 : n_kv - (int64_t) (rnd() % (uint32_t) (n_kv / 2 + 1));
        for (int64_t key = 0; key < n_kv; key++) {
            const int hole = lane % 3 == 1 && key % 37 == 5;
            p->mask[lane][key] = key < seen && !hole ? to_half(lane % 4 == 2 ? rnd_float(-1.0f, 0.0f) : 0.0f) : HALF_MINUS_INF;
        }
    }
}

// lanes first..first+n-1 of the problem, computed together
static void run(const problem * p, int first, int n, float (*out)[SPECDEC_ATTN_MAX_DIM]) {
    specdec_attn_lanes lanes = {.n_lanes = n};
    for (int l = 0; l < n; l++) {
        lanes.q[l] = p->q[first + l];
        lanes.mask[l] = p->mask[first + l];
        lanes.out[l] = out[l];
    }
    const bool done = specdec_attention_f16(p->dk, p->dv, p->n_kv, p->scale, p->k, (size_t) p->dk, p->v, (size_t) p->dv, &lanes);
    check(done, "the kernel takes head dimensions up to 256");
}

static double reference_error(const problem * p, int lane, const float * got) {
    double scores[MAX_KV], max = -INFINITY, sum = 0, worst = 0, magnitude = 1e-30;
    for (int64_t key = 0; key < p->n_kv; key++) {
        const double m = half_value(p->mask[lane][key]);
        double dot = 0;
        for (int64_t d = 0; d < p->dk; d++) {
            dot += half_value(to_half(p->q[lane][d])) * half_value(p->k[key * p->dk + d]);
        }
        scores[key] = isinf(m) ? -INFINITY : dot * p->scale + m;
        max = scores[key] > max ? scores[key] : max;
    }
    for (int64_t key = 0; key < p->n_kv; key++) {
        scores[key] = isinf(max) ? 0 : exp(scores[key] - max);
        sum += scores[key];
    }
    for (int64_t d = 0; d < p->dv; d++) {
        double want = 0;
        for (int64_t key = 0; key < p->n_kv; key++) {
            want += scores[key] * half_value(p->v[key * p->dv + d]);
        }
        want = sum == 0 ? 0 : want / sum;
        magnitude = fabs(want) > magnitude ? fabs(want) : magnitude;
        worst = fabs(got[d] - want) > worst ? fabs(got[d] - want) : worst;
    }
    return sum == 0 ? worst : worst / magnitude;
}

// llama.cpp's one-row path for an F16 cache, as patch 0001 takes it (ops.cpp, one_chunk): the
// query in FP16, keys one at a time, expf, and the values summed in an FP16 accumulator. Its
// error against the reference, for comparison with the kernel's.
static void one_row_path(const problem * p, int lane, float * out) {
    float vkq[SPECDEC_ATTN_MAX_DIM] = {0};  // each value held as FP16, as VKQ16 is
    float m = -INFINITY, sum = 0.0f;
    for (int64_t key = 0; key < p->n_kv; key++) {
        const float mv = half_to_float(p->mask[lane][key]);
        if (mv == -INFINITY) {
            continue;
        }
        float dot = 0.0f;
        for (int64_t d = 0; d < p->dk; d++) {
            dot += round_to_half(p->q[lane][d]) * half_to_float(p->k[key * p->dk + d]);
        }
        const float score = dot * p->scale + mv;
        float ms = 1.0f, vs = 1.0f;
        if (score > m) {
            ms = expf(m - score);
            m = score;
            for (int64_t d = 0; d < p->dv; d++) {
                vkq[d] = round_to_half(vkq[d] * ms);
            }
        } else {
            vs = expf(score - m);
        }
        for (int64_t d = 0; d < p->dv; d++) {
            vkq[d] = round_to_half(vkq[d] + half_to_float(p->v[key * p->dv + d]) * vs);
        }
        sum = sum * ms + vs;
    }
    for (int64_t d = 0; d < p->dv; d++) {
        out[d] = sum == 0.0f ? 0.0f : vkq[d] / sum;
    }
}

static float together[MAX_LANES_TOTAL][SPECDEC_ATTN_MAX_DIM];
static float alone[SPECDEC_ATTN_MAX_DIM][SPECDEC_ATTN_MAX_DIM];

static void problem_checks(int64_t dk, int64_t dv, int64_t n_kv) {
    problem * p = malloc(sizeof *p);
    build(p, dk, dv, n_kv);
    char what[160];
    // groups of 16, 8, 9, 4 and 3 lanes: both kernel widths, each lane at a new place
    int firsts[] = {0, 16, 24, 33, 37}, counts[] = {16, 8, 9, 4, 3};
    for (int g = 0; g < 5; g++) {
        run(p, firsts[g], counts[g], together + firsts[g]);
    }
    double worst = 0;
    int identical = 1;
    for (int lane = 0; lane < MAX_LANES_TOTAL; lane++) {
        const double error = reference_error(p, lane, together[lane]);
        worst = error > worst ? error : worst;
        run(p, lane, 1, alone);
        identical &= memcmp(alone[0], together[lane], sizeof(float) * (size_t) dv) == 0;
    }
    // the same lanes again, shifted by one in their group and in reverse
    for (int first = 1; first + 16 <= MAX_LANES_TOTAL; first += 11) {
        run(p, first, 16, alone);
        for (int l = 0; l < 16; l++) {
            identical &= memcmp(alone[l], together[first + l], sizeof(float) * (size_t) dv) == 0;
        }
    }
    double one_row_worst = 0;
    for (int lane = 0; lane < MAX_LANES_TOTAL; lane++) {
        one_row_path(p, lane, alone[0]);
        const double error = reference_error(p, lane, alone[0]);
        one_row_worst = error > one_row_worst ? error : one_row_worst;
    }
    printf("  dk %3lld dv %3lld keys %4lld: worst relative error %.2e (llama.cpp's one-row path: %.2e)\n",
           (long long) dk, (long long) dv, (long long) n_kv, worst, one_row_worst);
    snprintf(what, sizeof what, "dk %lld, %lld keys: within 1e-5 of the double-precision result", (long long) dk, (long long) n_kv);
    check(worst < 1e-5, what);
    snprintf(what, sizeof what, "dk %lld, %lld keys: each lane's bits the same alone and beside any lanes", (long long) dk, (long long) n_kv);
    check(identical, what);
    int unseen_zero = 1;
    for (int64_t d = 0; d < dv; d++) {
        unseen_zero &= together[7][d] == 0.0f;
    }
    check(unseen_zero, "a lane that sees no key gets zeros");
    free(p->k);
    free(p->v);
    free(p);
}

static uint64_t digest(void) {
    uint64_t hash = 0xCBF29CE484222325ull;
    const int64_t shapes[][3] = {{64, 64, 300}, {128, 128, 1000}, {256, 256, 77}};
    for (int s = 0; s < 3; s++) {
        problem * p = malloc(sizeof *p);
        build(p, shapes[s][0], shapes[s][1], shapes[s][2]);
        for (int first = 0; first < MAX_LANES_TOTAL; first += 16) {
            const int n = MAX_LANES_TOTAL - first < 16 ? MAX_LANES_TOTAL - first : 16;
            run(p, first, n, together + first);
        }
        for (int lane = 0; lane < MAX_LANES_TOTAL; lane++) {
            const unsigned char * bytes = (const unsigned char *) together[lane];
            for (size_t i = 0; i < sizeof(float) * (size_t) p->dv; i++) {
                hash = (hash ^ bytes[i]) * 0x100000001B3ull;
            }
        }
        free(p->k);
        free(p->v);
        free(p);
    }
    return hash;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static int bench_repeats = 20;

static void bench(void) {
    problem * p = malloc(sizeof *p);
    build(p, 64, 64, MAX_KV);
    for (int lane = 0; lane < MAX_LANES_TOTAL; lane++) {
        memset(p->mask[lane], 0, sizeof p->mask[lane]);
    }
    const int counts[] = {1, 4, 7, 16};
    for (int c = 0; c < 4; c++) {
        double best = INFINITY;
        for (int repeat = 0; repeat < bench_repeats; repeat++) {
            const double start = seconds();
            run(p, 0, counts[c], together);
            const double took = seconds() - start;
            best = took < best ? took : best;
        }
        printf("  head dim 64, %d keys, %2d lanes: %7.1f us, %5.2f ns a key and lane\n", MAX_KV, counts[c],
               best * 1e6, best * 1e9 / MAX_KV / counts[c]);
    }
    free(p->k);
    free(p->v);
    free(p);
}

int main(int argc, char ** argv) {
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        bench_repeats = argc > 2 ? atoi(argv[2]) : 20;
        bench();
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "digest") == 0) {
        printf("attention digest %016llx\n", (unsigned long long) digest());
        return 0;
    }
    half_to_float_check();
    round_to_half_check();
    exp_check();
    problem_checks(64, 64, 300);
    problem_checks(128, 128, 1000);
    problem_checks(80, 72, 33);
    problem_checks(256, 256, 200);
    problem_checks(16, 16, 40);
    specdec_attn_lanes lanes = {.n_lanes = 1};
    check(!specdec_attention_f16(320, 64, 10, 1.0f, NULL, 0, NULL, 0, &lanes), "head dimensions above 256 are declined");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
