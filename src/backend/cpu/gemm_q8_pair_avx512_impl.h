#pragma once
// Q8_0 weights x Q8_0 activations on AVX-512 VNNI for 9+ token rows
// (prefill): two tokens per zmm. Include only from quants_avx512.cpp (after
// gemm_q_avx512_impl.h); internal linkage.
//
// Arithmetic per (weight row, token, block): exactly gemm_q_tile_vnni's
// (and llama.cpp's AVX-512 VNNI vec_dot): an 8-lane int32 vpdpbusd of the
// block's 32 values (weights + 128 as u8 against the activations, starting
// from 1.5 * 2^23 - 128 * the lane's activation sum, so the lanes hold the
// f32 bits of 1.5 * 2^23 + dot), the exact f32 of the dot, fma'd with the
// f32 product d_w * d_a into an 8-lane accumulator, blocks in order; the
// same hsum at the end. The layout differs: a group of up to 8 tokens is
// repacked once per call in pairs, [token 2p's block | token 2p+1's block]
// in one zmm, so one vpdpbusd, subtract and fma serve two tokens, and a
// weight block (broadcast to both halves) is loaded once per row for 4 pairs.
#include <vector>

#include "backend/cpu/gemm_q_avx512_impl.h"

namespace rill::cpu {
namespace {

inline constexpr int kQ8Pairs = 4;     // token pairs per group
inline constexpr int kQ8PairRows = 4;  // weight rows per register tile
inline constexpr int kQ8PairMinTokens = 9;

struct Q8ActPairs {
  alignas(64) int8_t qs[kQ8Pairs][64];  // pair p: [token 2p's 32 values | token 2p+1's]
  alignas(64) float d[kQ8Pairs][16];    // token 2p's d in lanes 0..7, 2p+1's in 8..15
};

RILL_KERNEL_TARGET void prepare_q8_pairs(Q8ActPairs* out, int64_t nb, const void* a, size_t a_stride, int n_t) {
  constexpr int kT = 2 * kQ8Pairs;
  const BlockQ8_0* ar[kT];
  for (int t = 0; t < kT; ++t)
    ar[t] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(a) + (t < n_t ? t : n_t - 1) * a_stride);
  const int n_pairs = (n_t + 1) / 2;
  for (int64_t ib = 0; ib < nb; ++ib) {
    Q8ActPairs& o = out[ib];
    for (int p = 0; p < n_pairs; ++p) {
      const BlockQ8_0& b0 = ar[2 * p][ib];
      const BlockQ8_0& b1 = ar[2 * p + 1][ib];
      _mm256_store_si256(reinterpret_cast<__m256i*>(o.qs[p]),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0.qs)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o.qs[p] + 32),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1.qs)));
      _mm512_store_ps(o.d[p], _mm512_insertf32x8(_mm512_set1_ps(simd::f16(b0.d)), _mm256_set1_ps(simd::f16(b1.d)), 1));
    }
  }
}

template <int R, int P>
RILL_KERNEL_TARGET void gemm_q8_pair_tile(int64_t nb, const void* w, size_t w_stride, const Q8ActPairs* act, int n_t,
                                          float* y, int64_t y_stride) {
  static_assert(R >= 1 && R <= kQ8PairRows && P >= 1 && P <= kQ8Pairs);
  const BlockQ8_0* wr[R];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(w) + r * w_stride);
  const __m512i bias = _mm512_set1_epi32(0x4B400000);
  const __m512 fbias = _mm512_castsi512_ps(bias);
  const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R][P];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  constexpr size_t kStep = R * sizeof(BlockQ8_0);
  constexpr int kLines = static_cast<int>((kStep + 63) / 64) + 1;
  const char* pf = static_cast<const char*>(w) + kPrefetchBytes;
  for (int64_t ib = 0; ib < nb; ++ib) {
    RILL_UNROLL
    for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + ib * kStep + 64 * l, _MM_HINT_T0);
    const Q8ActPairs& ab = act[ib];
    __m512i qa[P], start[P];
    RILL_UNROLL
    for (int p = 0; p < P; ++p) {
      qa[p] = _mm512_load_si512(ab.qs[p]);
      start[p] = _mm512_sub_epi32(bias, _mm512_dpbusd_epi32(_mm512_setzero_si512(), x80, qa[p]));
    }
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* b = wr[r] + ib;
      const __m512i qw =
          _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs))), x80);
      const __m512 dw = _mm512_set1_ps(simd::f16(b->d));
      RILL_UNROLL
      for (int p = 0; p < P; ++p) {
        const __m512 dot = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_dpbusd_epi32(start[p], qw, qa[p])), fbias);
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_load_ps(ab.d[p])), dot, acc[r][p]);
      }
    }
  }
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int p = 0; p < P; ++p) {
    const int t = 2 * p;
    if (t < n_t) y[t * y_stride + r] = simd::hsum(_mm512_castps512_ps256(acc[r][p]));
    if (t + 1 < n_t) y[(t + 1) * y_stride + r] = simd::hsum(_mm512_extractf32x8_ps(acc[r][p], 1));
  }
}

using Q8PairTileFn = void (*)(int64_t, const void*, size_t, const Q8ActPairs*, int, float*, int64_t);
template <int... I>
constexpr std::array<Q8PairTileFn, sizeof...(I)> q8_pair_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_q8_pair_tile<I / kQ8Pairs + 1, I % kQ8Pairs + 1>...};
}
inline constexpr auto kQ8PairTiles = q8_pair_tiles(std::make_integer_sequence<int, kQ8PairRows * kQ8Pairs>{});

// GemmTileFn entry: fewer than kQ8PairMinTokens token rows go to
// gemm_q_vnni_entry; otherwise groups of 8 tokens, each repacked once
// (per-thread grow-only buffer), every row tile against the group.
template <typename Dot>
RILL_KERNEL_TARGET void gemm_q8_pair_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                           size_t a_stride, int n_t, float* y, int64_t y_stride) {
  if (n_t < kQ8PairMinTokens) {
    gemm_q_vnni_entry<DecQ8_0, Dot>(n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  thread_local std::vector<Q8ActPairs> act;
  const int64_t nb = n / kQK;
  if (static_cast<int64_t>(act.size()) < nb) act.resize(static_cast<size_t>(nb));
  Q8ActPairs* const ad = act.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  constexpr int kGroup = 2 * kQ8Pairs;
  for (int t0 = 0; t0 < n_t; t0 += kGroup) {
    const int nt = n_t - t0 < kGroup ? n_t - t0 : kGroup;
    prepare_q8_pairs(ad, nb, static_cast<const uint8_t*>(a) + static_cast<size_t>(t0) * a_stride, a_stride, nt);
    const int np = (nt + 1) / 2;
    for (int r0 = 0; r0 < n_r; r0 += kQ8PairRows) {
      const int nr = n_r - r0 < kQ8PairRows ? n_r - r0 : kQ8PairRows;
      kQ8PairTiles[(nr - 1) * kQ8Pairs + (np - 1)](nb, wb + static_cast<size_t>(r0) * w_stride, w_stride, ad, nt,
                                                   y + t0 * y_stride + r0, y_stride);
    }
  }
}

}  // namespace
}  // namespace rill::cpu
