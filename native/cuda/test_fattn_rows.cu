// Test of specdec's attention for exact mode's batches (fattn_rows.cu): every (row, query head)
// pair's output must be the same bits alone, in a batch, at any place in it, and whatever the
// cache's length past its visible keys (cells there hold NaNs); within 1e-4 of double-precision
// attention; and, in the CPU emulation (whose expf is the C library's, as the expected values'
// is), the same bits as a plain C++ computation of the documented order (fattn_rows.cuh). On a
// GPU (nvcc) it runs the real kernel, whose expf is the GPU's.
//
//   test_fattn_rows          the checks; exit status 1 on any difference
//   test_fattn_rows bench    (GPU) microseconds per call on 7B and 0.5B shapes, by rows and context
#include "fattn_rows.cuh"
#include "half_host.h"

#include <algorithm>
#include <cfloat>
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

constexpr uint16_t half_zero = 0x0000;
constexpr uint16_t half_minus_inf = 0xFC00;
constexpr uint16_t half_nan = 0x7E00;
constexpr int garbage_cells = 7;  // cells past every row's visible keys, holding NaNs

struct shape {
    const char * name;
    int head_dim, heads, kv_heads, seqs, mask_seqs, context, rows, n_parts;
};

// A random half of magnitude 2^-5 .. 2^2: normal, so exactly what specdec_half_to_float says
template <class Random> uint16_t random_half(Random & rng) {
    const uint32_t sign = rng() & 1, exponent = 10 + rng() % 7, mantissa = rng() & 0x3FF;
    return (uint16_t) ((sign << 15) | (exponent << 10) | mantissa);
}

// One problem: a cache of context + rows cells (then garbage) per sequence, the batch's queries,
// and which keys each row sees: keys up to its own position, less a few holes (another
// sequence's cells, say) in the context.
struct problem {
    shape s;
    int cells;
    std::vector<uint16_t> k, v;  // [seq][cell][kv_head][d]
    std::vector<float> q;        // [seq][row][head][d]
    std::vector<char> hole;      // [mask_seq][cell]
    float scale;

    bool visible(int seq, int row, int key) const {
        return key <= s.context + row && !hole[(size_t) (seq % s.mask_seqs) * cells + key];
    }
    const uint16_t * key(int seq, int cell, int kv_head) const {
        return &k[(((size_t) seq * cells + cell) * s.kv_heads + kv_head) * s.head_dim];
    }
    const uint16_t * value(int seq, int cell, int kv_head) const {
        return &v[(((size_t) seq * cells + cell) * s.kv_heads + kv_head) * s.head_dim];
    }
    const float * query(int seq, int row, int head) const {
        return &q[(((size_t) seq * s.rows + row) * s.heads + head) * s.head_dim];
    }
};

problem make_problem(const shape & s, unsigned seed) {
    std::mt19937 rng(seed);
    problem p{s, s.context + s.rows + garbage_cells, {}, {}, {}, {}, 1.0f / std::sqrt((float) s.head_dim)};
    const size_t kv_size = (size_t) s.seqs * p.cells * s.kv_heads * s.head_dim;
    p.k.resize(kv_size);
    p.v.resize(kv_size);
    for (int seq = 0; seq < s.seqs; ++seq) {
        for (int cell = 0; cell < p.cells; ++cell) {
            const bool garbage = cell >= s.context + s.rows;
            for (int i = 0; i < s.kv_heads * s.head_dim; ++i) {
                const size_t at = ((size_t) seq * p.cells + cell) * s.kv_heads * s.head_dim + i;
                p.k[at] = garbage ? half_nan : random_half(rng);
                p.v[at] = garbage ? half_nan : random_half(rng);
            }
        }
    }
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    p.q.resize((size_t) s.seqs * s.rows * s.heads * s.head_dim);
    for (float & x : p.q) {
        x = 4.0f * unit(rng);
    }
    p.hole.assign((size_t) s.mask_seqs * p.cells, 0);
    for (size_t i = 0; i < p.hole.size(); ++i) {
        p.hole[i] = (int) (i % p.cells) < s.context - 1 && rng() % 9 == 0;
    }
    return p;
}

#ifndef __CUDACC__
// The documented order (fattn_rows.cuh) in plain C++, over the tiles that hold visible keys.
std::vector<float> expected(const problem & p, int seq, int row, int head) {
    const int D = p.s.head_dim, group = p.s.heads / p.s.kv_heads, kv_head = head / group;
    std::vector<float> q(D);
    for (int d = 0; d < D; ++d) {
        q[d] = p.query(seq, row, head)[d] * p.scale;
    }
    const auto exp_below = [](float x, float max) { return x == max ? 1.0f : expf(x - max); };
    const int tiles = (p.s.context + row + SPECDEC_FATTN_TILE) / SPECDEC_FATTN_TILE;
    std::vector<float> m(p.s.n_parts, -FLT_MAX / 2.0f), s(p.s.n_parts, 0.0f);
    std::vector<std::vector<float>> o(p.s.n_parts, std::vector<float>(D, 0.0f));
    for (int t = 0; t < tiles; ++t) {
        const int part = t % p.s.n_parts;
        float score[SPECDEC_FATTN_TILE], tile_max = -INFINITY;
        for (int j = 0; j < SPECDEC_FATTN_TILE; ++j) {
            const int key = SPECDEC_FATTN_TILE * t + j;
            score[j] = -INFINITY;
            if (p.visible(seq, row, key)) {
                float dot = 0.0f;
                for (int d = 0; d < D; ++d) {
                    dot = std::fmaf(q[d], specdec_half_to_float(p.key(seq, key, kv_head)[d]), dot);
                }
                score[j] = dot + 0.0f;  // the mask's bias of a visible key
            }
            tile_max = std::fmax(tile_max, score[j]);
        }
        if (tile_max == -INFINITY) {
            continue;
        }
        const float m_new = std::fmax(m[part], tile_max), rescale = exp_below(m[part], m_new);
        float pk[SPECDEC_FATTN_TILE], sum = 0.0f;
        for (int j = 0; j < SPECDEC_FATTN_TILE; ++j) {
            pk[j] = score[j] == -INFINITY ? 0.0f : exp_below(score[j], m_new);
            sum += pk[j];
        }
        s[part] = std::fmaf(s[part], rescale, sum);
        for (int d = 0; d < D; ++d) {
            o[part][d] *= rescale;
            for (int j = 0; j < SPECDEC_FATTN_TILE; ++j) {
                if (pk[j] != 0.0f) {
                    o[part][d] = std::fmaf(pk[j], specdec_half_to_float(p.value(seq, SPECDEC_FATTN_TILE * t + j, kv_head)[d]), o[part][d]);
                }
            }
        }
        m[part] = m_new;
    }
    float max = -FLT_MAX / 2.0f;
    for (int i = 0; i < p.s.n_parts; ++i) {
        max = std::fmax(max, m[i]);
    }
    std::vector<float> out(D);
    for (int d = 0; d < D; ++d) {
        float sum = 0.0f, acc = 0.0f;
        for (int i = 0; i < p.s.n_parts; ++i) {
            const float weight = exp_below(m[i], max);
            sum = std::fmaf(s[i], weight, sum);
            acc = std::fmaf(o[i][d], weight, acc);
        }
        out[d] = acc / sum;
    }
    return out;
}
#endif

// Attention in double precision; the largest error of `got` against it, relative to the
// weighted magnitude of the values summed.
double error_in_double(const problem & p, int seq, int row, int head, const float * got) {
    const int D = p.s.head_dim, kv_head = head / (p.s.heads / p.s.kv_heads);
    std::vector<double> score;
    std::vector<int> keys;
    for (int key = 0; key <= p.s.context + row; ++key) {
        if (p.visible(seq, row, key)) {
            double dot = 0.0;
            for (int d = 0; d < D; ++d) {
                dot += (double) (p.query(seq, row, head)[d] * p.scale) * specdec_half_to_float(p.key(seq, key, kv_head)[d]);
            }
            score.push_back(dot);
            keys.push_back(key);
        }
    }
    const double max = *std::max_element(score.begin(), score.end());
    double sum = 0.0;
    for (double & x : score) {
        x = std::exp(x - max);
        sum += x;
    }
    double worst = 0.0;
    for (int d = 0; d < D; ++d) {
        double value = 0.0, magnitude = 0.0;
        for (size_t j = 0; j < keys.size(); ++j) {
            const double vd = specdec_half_to_float(p.value(seq, keys[j], kv_head)[d]);
            value += score[j] * vd;
            magnitude += score[j] * std::fabs(vd);
        }
        worst = std::max(worst, std::fabs(got[d] - value / sum) / (magnitude / sum));
    }
    return worst;
}

void point_at(specdec_fattn_rows_args & a, const float * q, const uint16_t * k, const uint16_t * v, const uint16_t * mask,
              float * dst, float * partials) {
    a.q = (const char *) q;
    a.k = (const char *) k;
    a.v = (const char *) v;
    a.mask = (const char *) mask;
    a.dst = dst;
    a.partials = partials;
}

// The kernel's output for the batch `rows` (a row of the problem per place), with a cache of
// n_kv cells: [seq][place][head][d].
std::vector<float> run(const problem & p, const std::vector<int> & rows, int n_kv) {
    const shape & s = p.s;
    const int n = (int) rows.size(), D = s.head_dim;
    std::vector<float> q((size_t) s.seqs * n * s.heads * D);
    std::vector<uint16_t> mask((size_t) s.mask_seqs * n * n_kv);
    for (int seq = 0; seq < s.seqs; ++seq) {
        for (int j = 0; j < n; ++j) {
            std::memcpy(&q[(((size_t) seq * n + j) * s.heads) * D], p.query(seq, rows[j], 0), (size_t) s.heads * D * sizeof(float));
        }
    }
    for (int mseq = 0; mseq < s.mask_seqs; ++mseq) {
        for (int j = 0; j < n; ++j) {
            for (int key = 0; key < n_kv; ++key) {
                mask[((size_t) mseq * n + j) * n_kv + key] = p.visible(mseq, rows[j], key) ? half_zero : half_minus_inf;
            }
        }
    }
    specdec_fattn_rows_args a{};
    a.head_dim = D;
    a.rows = n;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.seqs = s.seqs;
    a.mask_seqs = s.mask_seqs;
    a.n_kv = n_kv;
    a.n_parts = s.n_parts;
    a.scale = p.scale;
    a.q_nb1 = (int64_t) s.heads * D * sizeof(float);
    a.q_nb2 = (int64_t) D * sizeof(float);
    a.q_nb3 = (int64_t) n * s.heads * D * sizeof(float);
    a.k_nb1 = a.v_nb1 = (int64_t) s.kv_heads * D * sizeof(uint16_t);
    a.k_nb2 = a.v_nb2 = (int64_t) D * sizeof(uint16_t);
    a.k_nb3 = a.v_nb3 = (int64_t) p.cells * s.kv_heads * D * sizeof(uint16_t);
    a.mask_nb1 = (int64_t) n_kv * sizeof(uint16_t);
    a.mask_nb3 = (int64_t) n * n_kv * sizeof(uint16_t);
    std::vector<float> dst((size_t) s.seqs * n * s.heads * D, NAN);
    std::vector<float> partials(specdec_fattn_rows_partials(a), NAN);
#ifdef __CUDACC__
    float * dq = to_device(q);
    uint16_t * dk = to_device(p.k);
    uint16_t * dv = to_device(p.v);
    uint16_t * dm = to_device(mask);
    float * dd = to_device(dst);
    float * dp = to_device(partials);
    point_at(a, dq, dk, dv, dm, dd, dp);
    specdec_fattn_rows(a, nullptr);
    check_cuda(cudaGetLastError(), "launch");
    check_cuda(cudaMemcpy(dst.data(), dd, dst.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (void * ptr : {(void *) dq, (void *) dk, (void *) dv, (void *) dm, (void *) dd, (void *) dp}) {
        cudaFree(ptr);
    }
#else
    point_at(a, q.data(), p.k.data(), p.v.data(), mask.data(), dst.data(), partials.data());
    specdec_fattn_rows(a, nullptr);
#endif
    return dst;
}

// The batches a row is checked in: alone (the cache just past its own position), the whole
// batch, the whole batch reversed, and a middle slice; each with its own cache length.
struct batch {
    const char * name;
    std::vector<int> rows;
    int n_kv;
};

std::vector<batch> batches(const problem & p) {
    const shape & s = p.s;
    std::vector<batch> out;
    for (int r = 0; r < s.rows; ++r) {
        out.push_back({"alone", {r}, std::min(s.context + r + 1 + (r % 3) * 11, p.cells)});
    }
    std::vector<int> all(s.rows), reversed(s.rows);
    for (int r = 0; r < s.rows; ++r) {
        all[r] = r;
        reversed[r] = s.rows - 1 - r;
    }
    out.push_back({"batch", all, s.context + s.rows});
    out.push_back({"batch reversed, cache with garbage", reversed, p.cells});
    if (s.rows > 2) {
        out.push_back({"middle rows", std::vector<int>(all.begin() + 1, all.end() - 1), s.context + s.rows - 1});
    }
    return out;
}

int check(const shape & s, unsigned seed) {
    const problem p = make_problem(s, seed);
    const int D = s.head_dim;
    // every pair's first result, and where it came from
    std::vector<std::vector<float>> first((size_t) s.seqs * s.rows * s.heads);
    std::vector<const char *> first_from(first.size());
    int failures = 0;
    double worst = 0.0;
    for (const batch & b : batches(p)) {
        const std::vector<float> got = run(p, b.rows, b.n_kv);
        const int n = (int) b.rows.size();
        for (int seq = 0; seq < s.seqs; ++seq) {
            for (int j = 0; j < n; ++j) {
                for (int head = 0; head < s.heads; ++head) {
                    const float * out = &got[(((size_t) seq * n + j) * s.heads + head) * D];
                    const size_t pair = ((size_t) seq * s.rows + b.rows[j]) * s.heads + head;
                    if (first[pair].empty()) {
                        first[pair].assign(out, out + D);
                        first_from[pair] = b.name;
                        worst = std::max(worst, error_in_double(p, seq, b.rows[j], head, out));
                        continue;
                    }
                    if (std::memcmp(first[pair].data(), out, D * sizeof(float)) != 0) {
                        if (failures++ < 3) {
                            std::printf("FAIL: %s, seq %d row %d head %d: %s differs from %s\n", s.name, seq, b.rows[j], head,
                                        b.name, first_from[pair]);
                        }
                    }
                }
            }
        }
    }
    if (!(worst < 1e-4)) {
        std::printf("FAIL: %s: %.2e off attention in double precision\n", s.name, worst);
        ++failures;
    }
#ifndef __CUDACC__
    // the emulation's expf is the expected values' own: the documented order, bit for bit
    for (int seq = 0; seq < s.seqs; ++seq) {
        for (int row = 0; row < s.rows; ++row) {
            for (int head = 0; head < s.heads; ++head) {
                const std::vector<float> want = expected(p, seq, row, head);
                const std::vector<float> & got = first[((size_t) seq * s.rows + row) * s.heads + head];
                if (std::memcmp(want.data(), got.data(), D * sizeof(float)) != 0 && failures++ < 6) {
                    std::printf("FAIL: %s, seq %d row %d head %d: not the documented order's bits\n", s.name, seq, row, head);
                }
            }
        }
    }
#endif
    std::printf("%s: %s (double precision: %.2e)\n", s.name, failures ? "FAILED" : "every pair the same bits in every batch", worst);
    return failures ? 1 : 0;
}

#ifdef __CUDACC__
// Microseconds per call (one layer's attention) by rows and context, against reading one
// layer's keys and values once (the floor).
int bench() {
    struct model { const char * name; int head_dim, heads, kv_heads; };
    const model models[] = {{"7B", 128, 28, 4}, {"1.5B", 128, 12, 2}, {"0.5B", 64, 14, 2}};
    const int contexts[] = {128, 1024, 4096};
    const int ns[] = {1, 2, 4, 8, 16};
    int device;
    cudaDeviceProp prop;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::printf("%s; us per layer's attention of n rows, and the floor: reading its keys and values once\n", prop.name);
    std::printf("%-6s %7s %5s %8s", "model", "context", "parts", "floor");
    for (int n : ns) std::printf("    n=%-3d", n);
    std::printf(" %8s\n", "n=8/n=1");
    for (const model & md : models) {
        for (int context : contexts) {
            const int n_kv = context + 256;
            const size_t kv_elems = (size_t) n_kv * md.kv_heads * md.head_dim;
            std::vector<uint16_t> kv(kv_elems, 0x3C00);  // 1.0
            std::vector<uint16_t> mask((size_t) 16 * n_kv, half_zero);
            for (int j = 0; j < 16; ++j) {
                for (int key = context + j + 1; key < n_kv; ++key) mask[(size_t) j * n_kv + key] = half_minus_inf;
            }
            std::vector<float> q((size_t) 16 * md.heads * md.head_dim, 0.01f);
            uint16_t * dk = to_device(kv);
            uint16_t * dv = to_device(kv);
            uint16_t * dm = to_device(mask);
            float * dq = to_device(q);
            float * dd;
            float * dp;
            specdec_fattn_rows_args a{};
            a.head_dim = md.head_dim;
            a.heads = md.heads;
            a.kv_heads = md.kv_heads;
            a.seqs = a.mask_seqs = 1;
            a.n_kv = n_kv;
            a.n_parts = specdec_fattn_rows_parts(prop.multiProcessorCount, md.kv_heads);
            a.scale = 0.1f;
            a.rows = 16;
            check_cuda(cudaMalloc(&dd, (size_t) 16 * md.heads * md.head_dim * sizeof(float)), "cudaMalloc");
            check_cuda(cudaMalloc(&dp, specdec_fattn_rows_partials(a) * sizeof(float)), "cudaMalloc");
            point_at(a, dq, dk, dv, dm, dd, dp);
            a.q_nb1 = (int64_t) md.heads * md.head_dim * sizeof(float);
            a.q_nb2 = (int64_t) md.head_dim * sizeof(float);
            a.k_nb1 = a.v_nb1 = (int64_t) md.kv_heads * md.head_dim * sizeof(uint16_t);
            a.k_nb2 = a.v_nb2 = (int64_t) md.head_dim * sizeof(uint16_t);
            a.mask_nb1 = (int64_t) n_kv * sizeof(uint16_t);
            const size_t bytes = kv_elems * sizeof(uint16_t);
            const double floor = read_once_us(dk, bytes) + read_once_us(dv, bytes);
            std::printf("%-6s %7d %5d %8.1f", md.name, context, a.n_parts, floor);
            double t1 = 0.0, t8 = 0.0;
            for (int n : ns) {
                a.rows = n;
                const double t = time_us([&] { specdec_fattn_rows(a, nullptr); });
                t1 = n == 1 ? t : t1;
                t8 = n == 8 ? t : t8;
                std::printf(" %8.1f", t);
            }
            std::printf(" %7.2fx\n", t8 / t1);
            check_cuda(cudaGetLastError(), "bench");
            for (void * ptr : {(void *) dq, (void *) dk, (void *) dv, (void *) dm, (void *) dd, (void *) dp}) {
                cudaFree(ptr);
            }
        }
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
        std::fprintf(stderr, "bench needs the CUDA build (make gpu-test)\n");
        return 2;
#endif
    }
    // Qwen2.5 0.5B's heads (7 per KV head: a lone row fills 7 of a block's 8 warps, a batch of
    // 9 spills over blocks), 1.5B's (6), Llama 3's 4 at head size 256 with two sequences
    // sharing a mask, and two sequences with masks of their own; contexts past a tile, parts
    // of 1 to 3.
    const shape shapes[] = {
        {"d=64, 14 heads, 2 KV heads, 3 parts", 64, 14, 2, 1, 1, 70, 9, 3},
        {"d=128, 12 heads, 2 KV heads, 2 parts", 128, 12, 2, 1, 1, 45, 5, 2},
        {"d=256, 8 heads, 2 KV heads, 2 sequences, 1 mask", 256, 8, 2, 2, 1, 40, 3, 2},
        {"d=128, 4 heads, 4 KV heads, 2 sequences, 2 masks, 1 part", 128, 4, 4, 2, 2, 33, 4, 1},
    };
    int failed = 0;
    unsigned seed = 1;
    for (const shape & s : shapes) {
        failed |= check(s, seed++);
    }
    return failed;
}
