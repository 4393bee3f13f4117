// What the native tests share: pass/fail counting and reproducible random numbers.
#pragma once

#include <stdint.h>
#include <stdio.h>

static int passed, failed;

static inline void check(int ok, const char * what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL: %s\n", what);
    }
}

// xorshift64*: reproducible random bytes
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t) ((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static inline int rnd_range(int lo, int hi) { return lo + (int) (rnd() % (uint32_t) (hi - lo + 1)); }
static inline float rnd_float(float lo, float hi) { return lo + (hi - lo) * (float) (rnd() >> 8) / 16777216.0f; }
