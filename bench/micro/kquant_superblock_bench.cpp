// Prototypes, not kernels of rill: what a Q6_K prefill tile could cost if
// the K-quant dot were defined per super-block as ONE exact int32 sum (then
// one convert and one fma with d_w * d_a), instead of llama.cpp's vec_dot
// lanes (8 int32 lanes, each converted and fma'd), which rill's tiles kept
// when these were written (rill has since adopted the super-block
// definition: gemm_kquant_rows_avx512_impl.h is the production tile). With
// one int32 per super-block the lane layout is free:
//  * BM_Q6_K_superblock_proto: token-major like llama.cpp's ggml-cpu/tiled
//    path: a zmm holds 16 tokens x 4 activation bytes, a weight dword (4 u8
//    values, decoded once per row and super-block) is broadcast, one
//    vpdpbusd does 64 products; a 16-element group's sum is scaled by one
//    vpmulld.
//  * BM_Q6_K_superblock_rows: row-major on weights repacked as at load (16
//    rows x 4 signed values per zmm), activations biased to u8 and
//    broadcast per token dword, shared by two 16-row groups.
// Each is compared against the production matmul (the token-pair tile) on
// the same weights and activations; the label carries the largest
// difference of the two results relative to the largest result (different
// rounding only). Args: {n_tokens}; 1 thread.
#include <benchmark/benchmark.h>
// GCC 12's AVX-512 convert intrinsics read an undefined source vector: not a bug here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

constexpr int64_t kRows = 2048, kCols = 2048, kSb = kCols / 256;
constexpr int kGroup = 16;  // tokens per zmm
constexpr int kR = 4;       // weight rows per pass

// Activations of one 16-token group, one super-block: byte group g4 (elements
// 4 g4 .. 4 g4 + 3) of every token in one zmm, and the start lanes
// -32 * bsum_j (the Q6_K offset, folded into the dot's first accumulator).
struct ProtoActs {
  alignas(64) int8_t x[64][kGroup * 4];
  alignas(64) int32_t start[16][kGroup];
  alignas(64) float d[kGroup];
};

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void prepare(const BlockQ8_K* const* tok,
                                                                             ProtoActs* out) {
  for (int64_t ib = 0; ib < kSb; ++ib) {
    ProtoActs& o = out[ib];
    for (int t = 0; t < kGroup; ++t) {
      const BlockQ8_K& b = tok[t][ib];
      for (int g = 0; g < 64; ++g) std::memcpy(&o.x[g][4 * t], b.qs + 4 * g, 4);
      for (int j = 0; j < 16; ++j) o.start[j][t] = -32 * b.bsums[j];
      o.d[t] = b.d;
    }
  }
}

// Bits sh, sh + 1 of each byte of hb, moved to bits 4-5.
__attribute__((target("avx2"))) static inline __m256i high2(__m256i hb, int sh, __m256i m3) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, sh), m3), 4);
}

// Q6_K super-block -> 256 unsigned values (0..63) in element order.
__attribute__((target("avx2"))) void decode_q6(const BlockQ6_K& b, uint8_t* q) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
    auto* o = reinterpret_cast<__m256i*>(q + 128 * h);
    _mm256_store_si256(o, _mm256_or_si256(_mm256_and_si256(l0, m4), high2(hb, 0, m3)));
    _mm256_store_si256(o + 1, _mm256_or_si256(_mm256_and_si256(l1, m4), high2(hb, 2, m3)));
    _mm256_store_si256(o + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), high2(hb, 4, m3)));
    _mm256_store_si256(o + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), high2(hb, 6, m3)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void proto_gemm(const BlockQ6_K* w,
                                                                                const ProtoActs* act, float* y,
                                                                                int64_t y_stride) {
  alignas(64) int32_t q[kR][64];  // 4 values per dword
  for (int64_t r0 = 0; r0 < kRows; r0 += kR) {
    __m512 acc[kR];
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < kSb; ++ib) {
      const ProtoActs& a = act[ib];
      const BlockQ6_K* b[kR];
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        b[r] = w + (r0 + r) * kSb + ib;
        decode_q6(*b[r], reinterpret_cast<uint8_t*>(q[r]));
      }
      __m512i s[kR];
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        const __m512i st = _mm512_load_si512(a.start[j]);
        __m512i g[kR];
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) g[r] = st;
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512i x = _mm512_load_si512(a.x[4 * j + i]);
#pragma GCC unroll 4
          for (int r = 0; r < kR; ++r) g[r] = _mm512_dpbusd_epi32(g[r], _mm512_set1_epi32(q[r][4 * j + i]), x);
        }
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r)
          s[r] =
              _mm512_add_epi32(s[r], _mm512_mullo_epi32(g[r], _mm512_set1_epi32(static_cast<int8_t>(b[r]->scales[j]))));
      }
      const __m512 da = _mm512_load_ps(a.d);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r)
        acc[r] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(f16_to_f32(b[r]->d)), da), _mm512_cvtepi32_ps(s[r]), acc[r]);
    }
    for (int r = 0; r < kR; ++r) {
      alignas(64) float o[kGroup];
      _mm512_store_ps(o, acc[r]);
      for (int t = 0; t < kGroup; ++t) y[t * y_stride + r0 + r] = o[t];
    }
  }
}

// Variant B, row-major: the weights repacked (as at load) so a zmm holds 16
// rows x 4 signed values (q - 32) of one 4-element group, the activations
// biased to u8 (a + 128) and broadcast one token dword at a time, shared by
// two 16-row groups; a 16-element group's accumulator starts at
// -128 * (sum of its weights) per row (precomputed with the repack), so it
// ends at the exact sum of (q - 32) * a; then one vpmulld by the 16 rows'
// scales. 32 rows x 4 tokens per register tile.
struct RowGroupSb {
  alignas(64) int8_t w[64][16][4];    // group g4, row, value
  alignas(64) int32_t start[16][16];  // 16-element group j, row: -128 * sum(q - 32)
  alignas(64) int32_t sc[16][16];     // j, row
  alignas(64) float d[16];
};

std::vector<RowGroupSb> repack_rows(const BlockQ6_K* w) {
  std::vector<RowGroupSb> out(static_cast<size_t>(kRows / 16 * kSb));
  alignas(64) uint8_t q[256];
  for (int64_t rg = 0; rg < kRows / 16; ++rg)
    for (int64_t ib = 0; ib < kSb; ++ib) {
      RowGroupSb& o = out[static_cast<size_t>(rg * kSb + ib)];
      for (int r = 0; r < 16; ++r) {
        const BlockQ6_K& b = w[(rg * 16 + r) * kSb + ib];
        decode_q6(b, q);
        for (int e = 0; e < 256; ++e) o.w[e / 4][r][e % 4] = static_cast<int8_t>(q[e] - 32);
        for (int j = 0; j < 16; ++j) {
          int sum = 0;
          for (int e = 16 * j; e < 16 * j + 16; ++e) sum += q[e] - 32;
          o.start[j][r] = -128 * sum;
          o.sc[j][r] = static_cast<int8_t>(b.scales[j]);
        }
        o.d[r] = f16_to_f32(b.d);
      }
    }
  return out;
}

constexpr int kTB = 4;  // tokens per register tile

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void proto_rows(const RowGroupSb* w, const int32_t* au8,
                                                                                const float* ad, int n_t, float* y,
                                                                                int64_t y_stride) {
  // au8: token t's super-block ib at au8 + (t * kSb + ib) * 64 (dwords of a + 128); ad: t * kSb + ib.
  for (int64_t rg = 0; rg < kRows / 16; rg += 2) {
    for (int t0 = 0; t0 < n_t; t0 += kTB) {
      __m512 acc[kTB][2];
#pragma GCC unroll 4
      for (int t = 0; t < kTB; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
      for (int64_t ib = 0; ib < kSb; ++ib) {
        const RowGroupSb& w0 = w[rg * kSb + ib];
        const RowGroupSb& w1 = w[(rg + 1) * kSb + ib];
        const int32_t* at[kTB];
#pragma GCC unroll 4
        for (int t = 0; t < kTB; ++t) at[t] = au8 + ((t0 + t) * kSb + ib) * 64;
        __m512i s[kTB][2];
#pragma GCC unroll 4
        for (int t = 0; t < kTB; ++t) s[t][0] = s[t][1] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int j = 0; j < 16; ++j) {
          const __m512i st0 = _mm512_load_si512(w0.start[j]), st1 = _mm512_load_si512(w1.start[j]);
          __m512i r[kTB][2];
#pragma GCC unroll 4
          for (int t = 0; t < kTB; ++t) r[t][0] = st0, r[t][1] = st1;
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m512i q0 = _mm512_load_si512(w0.w[4 * j + i]), q1 = _mm512_load_si512(w1.w[4 * j + i]);
#pragma GCC unroll 4
            for (int t = 0; t < kTB; ++t) {
              const __m512i a = _mm512_set1_epi32(at[t][4 * j + i]);
              r[t][0] = _mm512_dpbusd_epi32(r[t][0], a, q0);
              r[t][1] = _mm512_dpbusd_epi32(r[t][1], a, q1);
            }
          }
          const __m512i sc0 = _mm512_load_si512(w0.sc[j]), sc1 = _mm512_load_si512(w1.sc[j]);
#pragma GCC unroll 4
          for (int t = 0; t < kTB; ++t) {
            s[t][0] = _mm512_add_epi32(s[t][0], _mm512_mullo_epi32(r[t][0], sc0));
            s[t][1] = _mm512_add_epi32(s[t][1], _mm512_mullo_epi32(r[t][1], sc1));
          }
        }
        const __m512 d0 = _mm512_load_ps(w0.d), d1 = _mm512_load_ps(w1.d);
#pragma GCC unroll 4
        for (int t = 0; t < kTB; ++t) {
          const __m512 da = _mm512_set1_ps(ad[(t0 + t) * kSb + ib]);
          acc[t][0] = _mm512_fmadd_ps(_mm512_mul_ps(d0, da), _mm512_cvtepi32_ps(s[t][0]), acc[t][0]);
          acc[t][1] = _mm512_fmadd_ps(_mm512_mul_ps(d1, da), _mm512_cvtepi32_ps(s[t][1]), acc[t][1]);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < kTB; ++t) {
        _mm512_storeu_ps(y + (t0 + t) * y_stride + rg * 16, acc[t][0]);
        _mm512_storeu_ps(y + (t0 + t) * y_stride + rg * 16 + 16, acc[t][1]);
      }
    }
  }
}

std::vector<uint8_t> random_q6(uint32_t seed) {
  std::vector<uint8_t> buf(static_cast<size_t>(kRows * kSb) * sizeof(BlockQ6_K));
  std::mt19937 rng(seed);
  for (auto& v : buf) v = static_cast<uint8_t>(rng());
  const uint16_t d = f32_to_f16(0.01f);
  for (size_t i = 0; i < buf.size(); i += sizeof(BlockQ6_K)) std::memcpy(&buf[i + sizeof(BlockQ6_K) - 2], &d, 2);
  return buf;
}

void BM_Q6_K_superblock_proto(benchmark::State& state) {
  const int n_t = static_cast<int>(state.range(0));
  const auto wbuf = random_q6(1);
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wbuf.data());
  std::vector<float> x(static_cast<size_t>(kCols * n_t));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  const size_t a_stride = row_bytes(DType::kQ8_K, kCols);
  std::vector<uint8_t> a(a_stride * n_t);
  for (int t = 0; t < n_t; ++t) ref::quantize_row(DType::kQ8_K, x.data() + t * kCols, a.data() + t * a_stride, kCols);
  std::vector<ProtoActs> act(static_cast<size_t>(kSb));
  std::vector<float> y(static_cast<size_t>(kRows * n_t)), want(y.size());
  for (auto _ : state) {
    for (int t0 = 0; t0 < n_t; t0 += kGroup) {
      const BlockQ8_K* tok[kGroup];
      for (int t = 0; t < kGroup; ++t)
        tok[t] = reinterpret_cast<const BlockQ8_K*>(a.data() + (t0 + (t0 + t < n_t ? t : 0)) * a_stride);
      prepare(tok, act.data());
      proto_gemm(w, act.data(), y.data() + t0 * kRows, kRows);
    }
    benchmark::DoNotOptimize(y.data());
  }
  // The production path on the same weights and activations (the token-pair tile).
  ThreadPool pool(1);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(DType::kQ6_K, kCols, n_t));
  WeightView view{DType::kQ6_K, kRows, kCols, wbuf.data(), row_bytes(DType::kQ6_K, kCols)};
  matmul(view, x.data(), n_t, want.data(), pool, scratch);
  double max_diff = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
  }
  const double max_rel = max_diff / max_abs;
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kRows * kCols * n_t * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.SetLabel("max |diff| / max |y| vs matmul " + std::to_string(max_rel));
}
BENCHMARK(BM_Q6_K_superblock_proto)->Arg(16)->Arg(64)->UseRealTime();
// Variant B (row-major, repacked weights); the repack is set-up, not timed.
void BM_Q6_K_superblock_rows(benchmark::State& state) {
  const int n_t = static_cast<int>(state.range(0));
  const auto wbuf = random_q6(1);
  const auto packed = repack_rows(reinterpret_cast<const BlockQ6_K*>(wbuf.data()));
  std::vector<float> x(static_cast<size_t>(kCols * n_t));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  const size_t a_stride = row_bytes(DType::kQ8_K, kCols);
  std::vector<uint8_t> a(a_stride * n_t);
  for (int t = 0; t < n_t; ++t) ref::quantize_row(DType::kQ8_K, x.data() + t * kCols, a.data() + t * a_stride, kCols);
  std::vector<int32_t> au8(static_cast<size_t>(n_t * kSb * 64));
  std::vector<float> ad(static_cast<size_t>(n_t * kSb));
  std::vector<float> y(static_cast<size_t>(kRows * n_t)), want(y.size());
  for (auto _ : state) {
    // Per call: the activations biased to u8 (a + 128), as a kernel would.
    for (int t = 0; t < n_t; ++t)
      for (int64_t ib = 0; ib < kSb; ++ib) {
        const auto& b = reinterpret_cast<const BlockQ8_K*>(a.data() + t * a_stride)[ib];
        uint8_t* o = reinterpret_cast<uint8_t*>(au8.data() + (t * kSb + ib) * 64);
        for (int e = 0; e < 256; ++e) o[e] = static_cast<uint8_t>(b.qs[e] + 128);
        ad[static_cast<size_t>(t * kSb + ib)] = b.d;
      }
    proto_rows(packed.data(), au8.data(), ad.data(), n_t, y.data(), kRows);
    benchmark::DoNotOptimize(y.data());
  }
  ThreadPool pool(1);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(DType::kQ6_K, kCols, n_t));
  WeightView view{DType::kQ6_K, kRows, kCols, wbuf.data(), row_bytes(DType::kQ6_K, kCols)};
  matmul(view, x.data(), n_t, want.data(), pool, scratch);
  double max_diff = 0.0, max_abs = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kRows * kCols * n_t * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.SetLabel("max |diff| / max |y| vs matmul " + std::to_string(max_diff / max_abs));
}
BENCHMARK(BM_Q6_K_superblock_rows)->Arg(16)->Arg(64)->UseRealTime();

}  // namespace
}  // namespace rill::cpu
