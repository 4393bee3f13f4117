// Test of the tensor-core Q4_K, Q6_K and Q8_0 kernels (mmv_tc.cu): for every batch size and every place of a
// column in the batch, each column's result must be the same bits as a plain C++ computation
// of the kernel's documented order of summing (mmv_tc.cuh), and close to the double-precision
// product of the dequantised weights. On a GPU (nvcc) it runs the real kernel; built with a
// C++ compiler it runs the same source through cuda_emulation.h, which checks its indexing.
//
//   test_mmv_tc          the checks; exit status 1 on any difference
//   test_mmv_tc bench    (GPU) microseconds per product on 7B and 1.5B shapes, by columns
#include "half_host.h"
#include "mmv_tc.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#ifdef __CUDACC__
#include "test_common_cuda.h"
#else
#include "cuda_emulation.h"
#endif

namespace {

// Round to nearest even, for the normal half range this test's data stays in.
uint16_t float_to_half(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint32_t sign = (bits >> 16) & 0x8000;
    const int exponent = (int) ((bits >> 23) & 0xFF) - 127 + 15;
    if (f == 0.0f) {
        return (uint16_t) sign;
    }
    if (exponent <= 0 || exponent >= 31) {
        std::fprintf(stderr, "float_to_half: %g is outside the test's range\n", f);
        std::exit(2);
    }
    const uint32_t mantissa = bits & 0x7FFFFF;
    uint32_t half = ((uint32_t) exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) {
        half += 1;
    }
    return (uint16_t) (sign | half);
}

uint32_t two_halves(float lo, float hi) {
    return (uint32_t) float_to_half(lo) | ((uint32_t) float_to_half(hi) << 16);
}

// ggml's get_scale_min_k4, written out per sub-block (the kernel unpacks four at a time).
void scale_and_min(const uint8_t * q, int s, int & scale, int & min) {
    if (s < 4) {
        scale = q[s] & 63;
        min   = q[s + 4] & 63;
    } else {
        scale = (q[s + 4] & 0x0F) | ((q[s - 4] >> 6) << 4);
        min   = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

// The quants of ggml's dequantize_row_q4_K and _q6_K, weight by weight.
int q4_K_quant(const specdec_block_q4_K & b, int s, int l) {  // weight 32s + l
    return (b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
}

int q6_K_quant(const specdec_block_q6_K & b, int n, int k, int l) {  // weight 128n + 32k + l
    const int low  = (b.ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
    const int high = (b.qh[32 * n + l] >> (2 * k)) & 3;
    return (low | (high << 4)) - 32;
}

float q8_d(const specdec_block_q8_1 & a) { return specdec_half_to_float(a.ds & 0xFFFF); }
float q8_sum(const specdec_block_q8_1 & a) { return specdec_half_to_float(a.ds >> 16); }

// One weight's and activation's share of the double product and of the magnitudes.
void add_product(double w, double v, double & value, double & magnitude) {
    value += w * v;
    magnitude += std::fabs(w * v);
}

// Per weight type: a random block, one block's share of a product in the kernel's order of
// summing (plain C++, built with -ffp-contract=off), and in double precision.
struct q4_K_weights {
    using block = specdec_block_q4_K;
    static constexpr specdec_mmv_type type = SPECDEC_MMV_Q4_K;
    static constexpr const char * name = "Q4_K";
    static constexpr int blocks_per_256 = 1;

    template <class Random> static void fill(block * x, Random & byte, float d, float dmin) {
        block & b = *x;
        b.dm = two_halves(d, dmin);
        for (uint8_t & v : b.scales) v = (uint8_t) byte();
        for (uint8_t & v : b.qs) v = (uint8_t) byte();
    }

    static float in_order(const block * x, const specdec_block_q8_1 * a) {
        const block & b = *x;
        float sum_d = 0.0f, sum_m = 0.0f;
        for (int s = 0; s < 8; ++s) {
            int dot = 0;
            for (int l = 0; l < 32; ++l) {
                dot += q4_K_quant(b, s, l) * a[s].qs[l];
            }
            int scale, min;
            scale_and_min(b.scales, s, scale, min);
            sum_d = std::fma(q8_d(a[s]), (float) (dot * scale), sum_d);
            sum_m = std::fma(q8_sum(a[s]), (float) min, sum_m);
        }
        return std::fma(specdec_half_to_float(b.dm & 0xFFFF), sum_d, -specdec_half_to_float(b.dm >> 16) * sum_m);
    }

    static void in_double(const block * x, const specdec_block_q8_1 * a, double & value, double & magnitude) {
        const block & b = *x;
        const double d = specdec_half_to_float(b.dm & 0xFFFF), dmin = specdec_half_to_float(b.dm >> 16);
        for (int s = 0; s < 8; ++s) {
            int scale, min;
            scale_and_min(b.scales, s, scale, min);
            for (int l = 0; l < 32; ++l) {
                const double w = d * scale * q4_K_quant(b, s, l) - dmin * min;
                add_product(w, (double) q8_d(a[s]) * a[s].qs[l], value, magnitude);
            }
        }
    }
};

struct q6_K_weights {
    using block = specdec_block_q6_K;
    static constexpr specdec_mmv_type type = SPECDEC_MMV_Q6_K;
    static constexpr const char * name = "Q6_K";
    static constexpr int blocks_per_256 = 1;

    template <class Random> static void fill(block * x, Random & byte, float d, float) {
        block & b = *x;
        b.d = float_to_half(d / 8);
        for (uint8_t & v : b.ql) v = (uint8_t) byte();
        for (uint8_t & v : b.qh) v = (uint8_t) byte();
        for (int8_t & v : b.scales) v = (int8_t) byte();
    }

    static float in_order(const block * x, const specdec_block_q8_1 * a) {
        const block & b = *x;
        float sum_d = 0.0f;
        for (int n = 0; n < 2; ++n) {
            for (int k = 0; k < 4; ++k) {
                for (int h = 0; h < 2; ++h) {
                    int dot = 0;
                    for (int l = 16 * h; l < 16 * h + 16; ++l) {
                        dot += q6_K_quant(b, n, k, l) * a[4 * n + k].qs[l];
                    }
                    sum_d = std::fma(q8_d(a[4 * n + k]), (float) (dot * b.scales[8 * n + 2 * k + h]), sum_d);
                }
            }
        }
        return specdec_half_to_float(b.d) * sum_d;
    }

    // as dequantize_row_q6_K walks the block
    static void in_double(const block * x, const specdec_block_q8_1 * a, double & value, double & magnitude) {
        const block & b = *x;
        const double d = specdec_half_to_float(b.d);
        for (int n = 0; n < 2; ++n) {
            for (int l = 0; l < 32; ++l) {
                for (int k = 0; k < 4; ++k) {
                    const double w = d * b.scales[8 * n + l / 16 + 2 * k] * q6_K_quant(b, n, k, l);
                    add_product(w, (double) q8_d(a[4 * n + k]) * a[4 * n + k].qs[l], value, magnitude);
                }
            }
        }
    }
};

struct q8_0_weights {
    using block = specdec_block_q8_0;
    static constexpr specdec_mmv_type type = SPECDEC_MMV_Q8_0;
    static constexpr const char * name = "Q8_0";
    static constexpr int blocks_per_256 = 8;

    template <class Random> static void fill(block * b, Random & byte, float d, float) {
        for (int j = 0; j < 8; ++j) {
            b[j].d = float_to_half(d * (1 + j % 3) / 16);
            for (int8_t & v : b[j].qs) v = (int8_t) byte();
        }
    }

    static float in_order(const block * b, const specdec_block_q8_1 * a) {
        float sum = 0.0f;
        for (int j = 0; j < 8; ++j) {
            int dot = 0;
            for (int l = 0; l < 32; ++l) {
                dot += b[j].qs[l] * a[j].qs[l];
            }
            sum = std::fma(specdec_half_to_float(b[j].d) * q8_d(a[j]), (float) dot, sum);
        }
        return sum;
    }

    static void in_double(const block * b, const specdec_block_q8_1 * a, double & value, double & magnitude) {
        for (int j = 0; j < 8; ++j) {
            for (int l = 0; l < 32; ++l) {
                const double w = (double) specdec_half_to_float(b[j].d) * b[j].qs[l];
                add_product(w, (double) q8_d(a[j]) * a[j].qs[l], value, magnitude);
            }
        }
    }
};

template <class W> struct problem {
    int nrows, nblocks_k, ncols;
    int stride_row_x, stride_col_y, stride_col_dst;  // padded, as ggml's buffers are
    std::vector<typename W::block> x;
    std::vector<specdec_block_q8_1> y;

    // the weights of row `row` from weight 256*kb on
    const typename W::block * weights(int row, int kb) const {
        return &x[(size_t) row * stride_row_x + W::blocks_per_256 * kb];
    }
    const specdec_block_q8_1 * column(int col, int kb) const { return &y[(size_t) col * stride_col_y + 8 * kb]; }
};

template <class W> problem<W> make_problem(int nrows, int nblocks_k, int ncols, unsigned seed) {
    problem<W> p{nrows, nblocks_k, ncols, W::blocks_per_256 * nblocks_k + 1, 8 * nblocks_k + 16, nrows + 3, {}, {}};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> bytes(0, 255);
    auto byte = [&] { return bytes(rng); };
    p.x.resize((size_t) nrows * p.stride_row_x + W::blocks_per_256);
    for (size_t i = 0; i + W::blocks_per_256 <= p.x.size(); i += W::blocks_per_256) {
        W::fill(&p.x[i], byte, 0.002f + 0.004f * std::fabs(unit(rng)), 0.001f + 0.002f * std::fabs(unit(rng)));
    }
    // activations quantised as ggml's quantize_q8_1 does: d = max|x|/127, s = the sum
    p.y.resize((size_t) ncols * p.stride_col_y);
    for (int c = 0; c < ncols; ++c) {
        for (int i = 0; i < 8 * nblocks_k; ++i) {
            specdec_block_q8_1 & b = p.y[(size_t) c * p.stride_col_y + i];
            float xs[32], amax = 0.0f;
            for (float & v : xs) {
                v = unit(rng) * (1 + c % 3);
                amax = std::fmax(amax, std::fabs(v));
            }
            const float d = specdec_half_to_float(float_to_half(amax / 127.0f));
            float sum = 0.0f;
            for (int l = 0; l < 32; ++l) {
                const int q = (int) std::lround(xs[l] / d);
                b.qs[l] = (int8_t) (q > 127 ? 127 : q < -127 ? -127 : q);
                sum += d * b.qs[l];
            }
            b.ds = two_halves(d, sum);
        }
    }
    return p;
}

// The kernel's order of summing: per block (W::in_order), blocks in the order each warp
// visits them, then the warps' sums in warp order.
template <class W> float expected(const problem<W> & p, int row, int col, int warps) {
    float partial[16] = {};
    for (int w = 0; w < warps; ++w) {
        for (int kb = w; kb < p.nblocks_k; kb += warps) {
            partial[w] = partial[w] + W::in_order(p.weights(row, kb), p.column(col, kb));
        }
    }
    float total = partial[0];
    for (int w = 1; w < warps; ++w) {
        total = total + partial[w];
    }
    return total;
}

// The product of the dequantised weights and activations, and the sum of their magnitudes.
template <class W> void in_double(const problem<W> & p, int row, int col, double & value, double & magnitude) {
    value = magnitude = 0.0;
    for (int kb = 0; kb < p.nblocks_k; ++kb) {
        W::in_double(p.weights(row, kb), p.column(col, kb), value, magnitude);
    }
}

// The kernel's results for the columns `order` (a column index per place in the batch).
template <class W> std::vector<float> run(const problem<W> & p, const std::vector<int> & order, int warps) {
    const int n = (int) order.size();
    std::vector<specdec_block_q8_1> y((size_t) n * p.stride_col_y);
    for (int j = 0; j < n; ++j) {
        std::memcpy(&y[(size_t) j * p.stride_col_y], &p.y[(size_t) order[j] * p.stride_col_y],
                    p.stride_col_y * sizeof(specdec_block_q8_1));
    }
    std::vector<float> dst((size_t) n * p.stride_col_dst, NAN);
#ifdef __CUDACC__
    typename W::block * dx = to_device(p.x);
    specdec_block_q8_1 * dy = to_device(y);
    float * dd = to_device(dst);
    specdec_mmv_tc_warps(warps, W::type, dx, dy, dd, p.nrows, 256 * p.nblocks_k, p.stride_row_x, n, p.stride_col_y,
                         p.stride_col_dst, nullptr);
    check_cuda(cudaGetLastError(), "launch");
    check_cuda(cudaMemcpy(dst.data(), dd, dst.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dd);
#else
    specdec_mmv_tc_warps(warps, W::type, p.x.data(), y.data(), dst.data(), p.nrows, 256 * p.nblocks_k, p.stride_row_x,
                         n, p.stride_col_y, p.stride_col_dst, nullptr);
#endif
    return dst;
}

// The kernel with `warps` warps per tile: every batch size for its own count, a few for the
// counts only the bench compares.
template <class W> int check(int warps) {
    // 40 rows: two whole tiles and a partial one; 11 blocks: warps get 2 or 1 of them
    const problem<W> p = make_problem<W>(40, 11, 33, 1234);
    std::vector<std::vector<float>> want(p.ncols, std::vector<float>(p.nrows));
    double worst = 0.0;
    for (int c = 0; c < p.ncols; ++c) {
        for (int r = 0; r < p.nrows; ++r) {
            want[c][r] = expected(p, r, c, warps);
            double value, magnitude;
            in_double(p, r, c, value, magnitude);
            worst = std::fmax(worst, std::fabs(want[c][r] - value) / magnitude);
        }
    }
    int failures = 0;
    if (!(worst < 1e-3)) {
        std::printf("FAIL: %s: the order of summing is %.2e off the double product (of the magnitudes)\n", W::name, worst);
        ++failures;
    }
    const std::vector<int> sizes = warps == SPECDEC_MMV_WARPS ? std::vector<int>{1, 2, 3, 7, 8, 9, 15, 16, 17, 33}
                                                              : std::vector<int>{1, 8, 9, 17};
    for (int n : sizes) {
        for (bool reversed : {false, true}) {
            std::vector<int> order(n);
            for (int j = 0; j < n; ++j) {
                order[j] = reversed ? p.ncols - 1 - j : j;
            }
            const std::vector<float> got = run(p, order, warps);
            int differing = 0;
            for (int j = 0; j < n; ++j) {
                for (int r = 0; r < p.nrows; ++r) {
                    const float g = got[(size_t) j * p.stride_col_dst + r], w = want[order[j]][r];
                    if (std::memcmp(&g, &w, sizeof(float)) != 0) {
                        if (differing++ == 0) {
                            std::printf("FAIL: %s, %d warps, n=%d%s, column %d at place %d, row %d: %.9g, want %.9g\n", W::name, warps, n,
                                        reversed ? " reversed" : "", order[j], j, r, g, w);
                        }
                    }
                }
                for (int r = p.nrows; r < p.stride_col_dst; ++r) {
                    if (!std::isnan(got[(size_t) j * p.stride_col_dst + r])) {
                        std::printf("FAIL: %s n=%d wrote past row %d\n", W::name, n, p.nrows);
                        ++differing;
                        break;
                    }
                }
            }
            failures += differing != 0;
            std::printf("%s, %2d warps, n=%2d%s: %s\n", W::name, warps, n, reversed ? " reversed" : "         ",
                        differing ? "DIFFERS" : "every column the same bits as alone");
        }
    }
    std::printf("%s, %d warps: %s (double product: %.2e of the magnitudes)\n", W::name, warps, failures ? "FAILED" : "ok", worst);
    return failures ? 1 : 0;
}

#ifdef __CUDACC__
// Microseconds per product, by columns, against reading the same weights once (the floor),
// for each warp count built (the kernel's own first). Random bytes: the kernel's cost does not
// depend on the values.
int bench() {
    struct shape { const char * name; specdec_mmv_type type; int rows, cols; };
    const shape shapes[] = {{"7B ffn_up Q4_K", SPECDEC_MMV_Q4_K, 18944, 3584}, {"7B ffn_down Q6_K", SPECDEC_MMV_Q6_K, 3584, 18944},
                            {"7B attn_q Q4_K", SPECDEC_MMV_Q4_K, 3584, 3584},   {"7B attn_k Q4_K", SPECDEC_MMV_Q4_K, 512, 3584},
                            {"7B output Q6_K", SPECDEC_MMV_Q6_K, 152064, 3584}, {"1.5B ffn_up Q4_K", SPECDEC_MMV_Q4_K, 8960, 1536},
                            {"1.5B ffn_down Q6_K", SPECDEC_MMV_Q6_K, 1536, 8960}, {"7B ffn_up Q8_0", SPECDEC_MMV_Q8_0, 18944, 3584}};
    const int ns[] = {1, 2, 4, 8, 9, 16};
    int device;
    cudaDeviceProp prop;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::printf("%s; us per product of n columns, and the floor: reading the weights once\n", prop.name);
    std::printf("%-20s %5s %8s", "matrix", "warps", "floor");
    for (int n : ns) std::printf("     n=%-3d", n);
    std::printf(" %9s %9s\n", "n=8/n=1", "n=1 GB/s");
    for (const shape & s : shapes) {
        const int nblocks_k = s.cols / 256;
        const size_t bytes_per_256 = s.type == SPECDEC_MMV_Q4_K ? sizeof(specdec_block_q4_K)
                                   : s.type == SPECDEC_MMV_Q6_K ? sizeof(specdec_block_q6_K)
                                                                : 8 * sizeof(specdec_block_q8_0);
        const size_t x_bytes = (size_t) s.rows * nblocks_k * bytes_per_256;
        const size_t y_bytes = (size_t) 16 * nblocks_k * 8 * sizeof(specdec_block_q8_1);
        std::vector<uint8_t> random_bytes(x_bytes > y_bytes ? x_bytes : y_bytes);
        std::mt19937 rng(7);
        for (uint8_t & b : random_bytes) b = (uint8_t) rng();
        void * x;
        void * y;
        float * dst;
        check_cuda(cudaMalloc(&x, x_bytes), "cudaMalloc");
        check_cuda(cudaMemcpy(x, random_bytes.data(), x_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        check_cuda(cudaMalloc(&y, y_bytes), "cudaMalloc");
        check_cuda(cudaMemcpy(y, random_bytes.data(), y_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        check_cuda(cudaMalloc(&dst, (size_t) 16 * s.rows * sizeof(float)), "cudaMalloc");
        const double floor = read_once_us(x, x_bytes);
        for (int warps : {SPECDEC_MMV_WARPS, 4, 16}) {
            std::printf("%-20s %5d %8.1f", s.name, warps, floor);
            double t1 = 0.0, t8 = 0.0;
            for (int n : ns) {
                const double t = time_us([&] {
                    const int stride_row_x = s.type == SPECDEC_MMV_Q8_0 ? 8 * nblocks_k : nblocks_k;
                    specdec_mmv_tc_warps(warps, s.type, x, y, dst, s.rows, s.cols, stride_row_x, n, nblocks_k * 8, s.rows,
                                         nullptr);
                });
                t1 = n == 1 ? t : t1;
                t8 = n == 8 ? t : t8;
                std::printf(" %9.1f", t);
            }
            std::printf(" %8.2fx %9.0f\n", t8 / t1, x_bytes / t1 / 1e3);
        }
        check_cuda(cudaGetLastError(), "bench");
        cudaFree(x);
        cudaFree(y);
        cudaFree(dst);
    }
    return 0;
}
#endif

}  // namespace

int main(int argc, char ** argv) {
    if (argc > 1 && std::strcmp(argv[1], "bench") == 0) {
#ifdef __CUDACC__
        return bench();
#else
        std::fprintf(stderr, "bench needs the CUDA build (make gpu-bench)\n");
        return 2;
#endif
    }
    int failed = 0;
    for (int warps : {SPECDEC_MMV_WARPS, 4, 16}) {
        failed |= check<q4_K_weights>(warps) | check<q6_K_weights>(warps) | check<q8_0_weights>(warps);
    }
    return failed;
}
