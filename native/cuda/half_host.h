// A half's bits as a float, on the host: for the CPU emulation of the kernel's __half2float and
// for the test's expected values, which must agree with it.
#pragma once

#include <cmath>
#include <cstdint>

inline float specdec_half_to_float(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    float value;
    if (exponent == 0) {
        value = std::ldexp((float) mantissa, -24);
    } else if (exponent == 31) {
        value = mantissa ? NAN : INFINITY;
    } else {
        value = std::ldexp((float) (mantissa | 0x400), exponent - 25);
    }
    return sign ? -value : value;
}
