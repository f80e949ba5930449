#pragma once
// Register-tiled gemm for the classic 32-element block types on AVX-512VL +
// VNNI for 2 or more token rows (batched decode, prefill); one token row
// keeps the GEMV tile of gemm_x86_impl.h. Include only from
// quants_avx512.cpp (after gemm_x86_impl.h); internal linkage.
//
// Every (weight row, token) dot keeps exactly the arithmetic of
// gemm_q_tile<Dec, DotVnni, R, 1> (and of llama.cpp's AVX-512 VNNI vec_dot),
// so results do not depend on the batch size: per block an 8-lane int32 dot
// of the 32 quants, converted to f32 exactly, fma'd with the f32 product
// d_w * d_a into an 8-lane accumulator, blocks in order; the Q4_1/Q5_1 min
// term macc = fma(m_w, s_a, macc) per block; hsum(acc) + macc at the end.
// What changes is only how the same numbers are produced, so that the two
// vector pipes that do multiplies (FP0/FP1 on Zen 4) carry little besides
// the vpdpbusd and the fma of each (row, token, block):
//  * scales: per chunk of kChunk blocks a first pass computes the R x T
//    products d_w * d_a with one 16-lane multiply per block (each lane the
//    same single f32 multiply as the scalar dw * da) and the macc fmas as one
//    16-lane fma; the dot pass then reads each product with a broadcast load
//    folded into the fma. The tokens' d (and s) are converted to f32 once
//    per call (TokenScales), not once per row tile.
//  * int -> f32: vpdpbusd accumulates onto 0x4B400000 (the f32 1.5 * 2^23),
//    so the lanes hold the bits of 1.5 * 2^23 + k for the int32 dot k
//    (|k| < 2^22 always: at most 4 * 255 * 128); subtracting 1.5 * 2^23 gives
//    float(k) exactly, as cvtdq2ps would, but on the add pipes.
//  * signed weights (Q4_0, Q5_0, Q8_0): w + 128 = w ^ 0x80 as u8 against the
//    activations, starting from bias - 128 * (sum of the lane's 4 activations):
//    the same int32 as the sign trick, without a vpsignb per (row, token).
// The first pass also touches every weight block of the chunk, which brings
// the weights toward L1 before the dot pass (they stream from DRAM in decode).
#include <cstring>

#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

inline constexpr int kChunk = 32;  // blocks per scale pass

static inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 4 x u32 (each the first 4 bytes of a block: its f16 d, then m / s or
// quants) -> 8 f32: (d0, x0, d1, x1, d2, x2, d3, x3).
static inline RILL_KERNEL_TARGET __m256 f16_pairs(uint32_t p0, uint32_t p1, uint32_t p2, uint32_t p3) {
  return _mm256_cvtph_ps(
      _mm_setr_epi32(static_cast<int>(p0), static_cast<int>(p1), static_cast<int>(p2), static_cast<int>(p3)));
}

// The d (and s) of up to 4 token rows as f32, per block: d_0..d_3, s_0..s_3
// (rows past the last one repeat it). Sized for rows of up to
// kTableBlocks blocks; longer rows convert per row tile instead.
inline constexpr int kTableBlocks = 256;
struct TokenScales {
  alignas(32) float v[kTableBlocks][8];
};

template <typename ABlock>
RILL_KERNEL_TARGET void fill_token_scales(TokenScales& ts, int64_t nb, const void* a, size_t a_stride, int n_t) {
  const ABlock* ar[4];
  for (int t = 0; t < 4; ++t)
    ar[t] = reinterpret_cast<const ABlock*>(static_cast<const uint8_t*>(a) + (t < n_t ? t : n_t - 1) * a_stride);
  const __m256i deinterleave = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const __m256 v = f16_pairs(load_u32(ar[0] + ib), load_u32(ar[1] + ib), load_u32(ar[2] + ib), load_u32(ar[3] + ib));
    _mm256_store_ps(ts.v[ib], _mm256_permutevar8x32_ps(v, deinterleave));
  }
}

// For the signed weight types: each token's starting lanes per block,
// bias - 128 * (sum of the lane's 4 activations), computed once per call
// instead of once per row tile (a vpdpbusd and a subtract per token and
// block, about an eighth of the multiply pipes' work in the tile). Sized
// for rows of up to kStartBlocks blocks (the LM head and FFN rows of small
// models); longer rows compute them per tile.
inline constexpr int kStartBlocks = 64;
struct TokenStarts {
  alignas(32) int32_t v[kStartBlocks][4][8];
};

template <typename ABlock>
RILL_KERNEL_TARGET void fill_token_starts(TokenStarts& st, int64_t nb, const void* a, size_t a_stride, int n_t) {
  const __m256i bias = _mm256_set1_epi32(0x4B400000);
  for (int t = 0; t < n_t; ++t) {
    const ABlock* ar = reinterpret_cast<const ABlock*>(static_cast<const uint8_t*>(a) + t * a_stride);
    for (int64_t ib = 0; ib < nb; ++ib) {
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar[ib].qs));
      const __m256i sum128 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), qa);
      _mm256_store_si256(reinterpret_cast<__m256i*>(st.v[ib][t]), _mm256_sub_epi32(bias, sum128));
    }
  }
}

// ts: the tokens' scales (fill_token_scales), or null to convert them here;
// starts: the signed types' start lanes (fill_token_starts), or null.
template <typename Dec, int R, int T>
RILL_KERNEL_TARGET void gemm_q_tile_vnni(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride,
                                         const TokenScales* ts, const TokenStarts* starts, float* y, int64_t y_stride) {
  static_assert(R >= 1 && R <= 4 && T >= 1 && T <= 4);
  using WBlock = typename Dec::Block;
  using ABlock = std::conditional_t<Dec::kMin, BlockQ8_1, BlockQ8_0>;
  const int64_t nb = n / kQK;
  const WBlock* wr[R];
  const ABlock* ar[T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride);
  RILL_UNROLL
  for (int t = 0; t < T; ++t) ar[t] = reinterpret_cast<const ABlock*>(static_cast<const uint8_t*>(a) + t * a_stride);

  // Lane l = 4 * r + t of the scale vectors (lanes with r >= R or t >= T are
  // computed but unused): the row's and the token's element of the f16 pairs.
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx_w = _mm512_slli_epi32(_mm512_srli_epi32(lane, 2), 1);                    // 2 * r
  const __m512i idx_a = _mm512_slli_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(3)), 1);  // 2 * t
  const __m512i one = _mm512_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x4B400000);
  const __m256 fbias = _mm256_castsi256_ps(bias);

  __m512 macc = _mm512_setzero_ps();  // lane 4 * r + t
  __m256 acc[R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();

  // The R rows of the tile are one contiguous region, read R blocks per
  // step: prefetch it kPrefetchBytes ahead (as the 1-token tile does).
  constexpr size_t kStep = R * sizeof(WBlock);
  constexpr int kLines = static_cast<int>((kStep + 63) / 64) + 1;
  const char* pf = static_cast<const char*>(w) + kPrefetchBytes;

  alignas(64) float scale[kChunk][16];  // d_w * d_a, lane 4 * r + t
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int nc = static_cast<int>(nb - c0 < kChunk ? nb - c0 : kChunk);
    for (int j = 0; j < nc; ++j) {
      const int64_t ib = c0 + j;
      uint32_t rp[4] = {};
      RILL_UNROLL
      for (int r = 0; r < R; ++r) rp[r] = load_u32(wr[r] + ib);
      const __m512 rv = _mm512_castps256_ps512(f16_pairs(rp[0], rp[1], rp[2], rp[3]));
      __m512 da, sa;  // lane 4 * r + t: token t's d, s
      if (ts) {
        da = _mm512_broadcast_f32x4(_mm_load_ps(ts->v[ib]));
        sa = _mm512_broadcast_f32x4(_mm_load_ps(ts->v[ib] + 4));
      } else {
        uint32_t tp[4] = {};
        RILL_UNROLL
        for (int t = 0; t < T; ++t) tp[t] = load_u32(ar[t] + ib);
        const __m512 tv = _mm512_castps256_ps512(f16_pairs(tp[0], tp[1], tp[2], tp[3]));
        da = _mm512_permutexvar_ps(idx_a, tv);
        sa = _mm512_permutexvar_ps(_mm512_add_epi32(idx_a, one), tv);
      }
      _mm512_store_ps(scale[j], _mm512_mul_ps(_mm512_permutexvar_ps(idx_w, rv), da));
      if constexpr (Dec::kMin)
        macc = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_add_epi32(idx_w, one), rv), sa, macc);
    }
    // The dot pass reads the products back as broadcast loads (keeps the
    // compiler from turning them into lane permutes).
    __asm__("" : "+m"(scale));
    for (int j = 0; j < nc; ++j) {
      const int64_t ib = c0 + j;
      RILL_UNROLL
      for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + ib * kStep + 64 * l, _MM_HINT_T0);
      __m256i qa[T], start[T];
      RILL_UNROLL
      for (int t = 0; t < T; ++t) {
        qa[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar[t][ib].qs));
        if constexpr (Dec::kSigned) {
          if (starts) {
            start[t] = _mm256_load_si256(reinterpret_cast<const __m256i*>(starts->v[ib][t]));
          } else {
            const __m256i sum128 =
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), qa[t]);
            start[t] = _mm256_sub_epi32(bias, sum128);
          }
        } else {
          start[t] = bias;
        }
      }
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        __m256i qw = Dec::decode(wr[r] + ib);
        if constexpr (Dec::kSigned) qw = _mm256_xor_si256(qw, _mm256_set1_epi8(static_cast<char>(0x80)));
        RILL_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256i d = _mm256_dpbusd_epi32(start[t], qw, qa[t]);
          const __m256 p = _mm256_sub_ps(_mm256_castsi256_ps(d), fbias);
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(scale[j][4 * r + t]), p, acc[r][t]);
        }
      }
    }
  }
  alignas(64) float m[16];
  _mm512_store_ps(m, macc);
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = simd::hsum(acc[r][t]) + (Dec::kMin ? m[4 * r + t] : 0.0f);
}

using TileFnTs = void (*)(int64_t, const void*, size_t, const void*, size_t, const TokenScales*, const TokenStarts*,
                          float*, int64_t);
template <typename Dec, int... I>
constexpr std::array<TileFnTs, sizeof...(I)> q_tiles_vnni(std::integer_sequence<int, I...>) {
  return {&gemm_q_tile_vnni<Dec, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Dec>
inline constexpr auto kQTilesVnni = q_tiles_vnni<Dec>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

// GemmTileFn entry: a lone token row (decode of one sequence) uses the
// memory-bound GEMV tiles of gemm_x86_impl.h; otherwise tokens go in groups
// of 8, each split in tiles of 4 (a 3 + 1 or 4 + 1 split leaves a lone row to
// the GEMV tile), the groups' scales converted once, and every row tile runs
// against both tiles of the group while its weights are in L1.
template <typename Dec, typename Dot>
RILL_KERNEL_TARGET void gemm_q_vnni_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                          size_t a_stride, int n_t, float* y, int64_t y_stride) {
  using ABlock = std::conditional_t<Dec::kMin, BlockQ8_1, BlockQ8_0>;
  const int64_t nb = n / kQK;
  const auto* ab = static_cast<const uint8_t*>(a);
  const auto* wb = static_cast<const uint8_t*>(w);
  TokenScales ts[2];
  TokenStarts st[2];
  for (int t0 = 0; t0 < n_t; t0 += 2 * kMaxTileCols) {
    const int nt = n_t - t0 < 2 * kMaxTileCols ? n_t - t0 : 2 * kMaxTileCols;
    const int nt0 = nt < kMaxTileCols ? nt : kMaxTileCols, nt1 = nt - nt0;
    const uint8_t* a0 = ab + static_cast<size_t>(t0) * a_stride;
    const uint8_t* a1 = a0 + static_cast<size_t>(nt0) * a_stride;
    const bool tab = nb <= kTableBlocks;
    if (tab && nt0 > 1) fill_token_scales<ABlock>(ts[0], nb, a0, a_stride, nt0);
    if (tab && nt1 > 1) fill_token_scales<ABlock>(ts[1], nb, a1, a_stride, nt1);
    const bool st_tab = Dec::kSigned && nb <= kStartBlocks;
    if (st_tab && nt0 > 1) fill_token_starts<ABlock>(st[0], nb, a0, a_stride, nt0);
    if (st_tab && nt1 > 1) fill_token_starts<ABlock>(st[1], nb, a1, a_stride, nt1);
    for (int r0 = 0; r0 < n_r; r0 += kMaxTileRows) {
      const int nr = n_r - r0 < kMaxTileRows ? n_r - r0 : kMaxTileRows;
      const uint8_t* wr = wb + static_cast<size_t>(r0) * w_stride;
      float* yr = y + t0 * y_stride + r0;
      if (nt0 == 1) {
        kQTiles<Dec, Dot>[(nr - 1) * kMaxTileCols](n, wr, w_stride, a0, a_stride, yr, y_stride);
      } else {
        kQTilesVnni<Dec>[(nr - 1) * kMaxTileCols + (nt0 - 1)](n, wr, w_stride, a0, a_stride, tab ? &ts[0] : nullptr,
                                                              st_tab ? &st[0] : nullptr, yr, y_stride);
      }
      if (nt1 == 1) {
        kQTiles<Dec, Dot>[(nr - 1) * kMaxTileCols](n, wr, w_stride, a1, a_stride, yr + nt0 * y_stride, y_stride);
      } else if (nt1 > 1) {
        kQTilesVnni<Dec>[(nr - 1) * kMaxTileCols + (nt1 - 1)](n, wr, w_stride, a1, a_stride, tab ? &ts[1] : nullptr,
                                                              st_tab ? &st[1] : nullptr, yr + nt0 * y_stride, y_stride);
      }
    }
  }
}
template <typename Dec, typename Dot>
constexpr GemmTileFn gemm_q_vnni() {
  return &gemm_q_vnni_entry<Dec, Dot>;
}

}  // namespace
}  // namespace rill::cpu
