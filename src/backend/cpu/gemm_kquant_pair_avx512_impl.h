#pragma once
// The token-pair gemm for IQ4_XS weights against Q8_K activations (its
// decoder, KPairXS, lives in gemm_iquant_avx512.cpp) for batches of token
// rows on AVX-512BW + VNNI: prefill and batched decode. Fewer token rows
// keep the decoder's own tiles (Dec::small_gemm). Include only from the
// *_avx512.cpp kernel files; internal linkage. (Q4_K, Q5_K and Q6_K left it
// for the row tile of gemm_kquant_rows_avx512_impl.h when rill redefined
// their dots per super-block; IQ4_XS keeps llama.cpp's arithmetic.)
//
// Arithmetic: llama.cpp's x86 vec_dot lanes, bit for bit, as the one-token
// tile: per super-block an 8-lane int32 sum, lane l the scaled products of
// elements 4l..4l+3 of every 32-element sub-block, converted and fma'd with
// d = a.d * w.d.
// What differs is the layout, chosen so that a zmm holds two token rows
// instead of two sub-blocks of one token:
//  * activations are repacked once per call in token pairs: for pair p and
//    sub-block k one zmm is [token 2p's 32 values | token 2p+1's 32 values]
//    (KActPairs, up to 16 tokens per group);
//  * a weight sub-block is decoded once per (row, super-block) into 32
//    values broadcast to both halves, and serves all the group's pairs:
//    vpmaddubsw + vpdpwssd leave lanes 0..7 with token 2p's llama.cpp lanes
//    and 8..15 with token 2p+1's, so no fold is needed before the convert;
//  * the weights' scales and d are decoded once per call and row
//    (KPairMeta), not once per row tile and token group: a sub-block's
//    scale is one dword (the i16 scale twice) the vpdpwssd reads as an
//    embedded broadcast.
// The decode work per super-block is amortized over up to 16 tokens (the
// one-token tile's layout amortizes it over at most 4, plus a fold per pair).
// Signed weights (IQ4_XS, Dec::kSigned) decode to |w| and a sign mask and
// go through maddubs with llama.cpp's sign trick, |w| x sign(a, w), the
// sign put onto each activation zmm by a masked negate (0 - (-128) wraps
// to -128 as vpsignb does; IQ4 values are never 0).
//
// A decoder Dec supplies: Block, Meta (per row and super-block, decoded once
// per call by Dec::meta), Ctx and decode (sub-block pair g as two zmm, both
// halves alike; signed types also their sign masks), kSigned, kMinTokens
// and small_gemm (the GemmTileFn for fewer than kMinTokens token rows,
// where the pair tile stops paying).
#include <vector>

#include "backend/cpu/gemm_kquant_avx512_impl.h"

namespace rill::cpu {
namespace {

// Token groups: 16 tokens (8 pairs) x 1 weight row per register tile, over
// column chunks of kPairChunkBlocks super-blocks, whose repacked
// activations (~5 KiB per super-block) fit L1 with the weights passing
// through (long rows, FFN down, are chunked; the accumulators go to
// KPairState between chunks).
inline constexpr int kPairTiles = 8;  // token pairs per group, at most
inline constexpr int64_t kPairChunkBlocks = 8;

// One super-block of a group of up to 16 token rows. Tokens past the last
// real one repeat it (computed, never stored).
struct KActPairs {
  alignas(64) int8_t qs[kPairTiles][8][64];  // pair p, sub-block k: [token 2p | token 2p+1]
  alignas(64) float dpair[kPairTiles][16];   // a.d of token 2p in lanes 0..7, of 2p+1 in 8..15
};

template <typename Dec>
RILL_KERNEL_TARGET void prepare_k_pairs(KActPairs* out, int64_t nb, const void* a, size_t a_stride, int n_t) {
  constexpr int kT = 2 * kPairTiles;
  const BlockQ8_K* ar[kT];
  for (int t = 0; t < kT; ++t)
    ar[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + (t < n_t ? t : n_t - 1) * a_stride);
  const int n_pairs = (n_t + 1) / 2;
  for (int64_t ib = 0; ib < nb; ++ib) {
    KActPairs& o = out[ib];
    for (int p = 0; p < n_pairs; ++p) {
      const BlockQ8_K& b0 = ar[2 * p][ib];
      const BlockQ8_K& b1 = ar[2 * p + 1][ib];
      for (int k = 0; k < 8; ++k) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.qs[p][k]),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0.qs + 32 * k)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.qs[p][k] + 32),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1.qs + 32 * k)));
      }
      for (int l = 0; l < 8; ++l) {
        o.dpair[p][l] = b0.d;
        o.dpair[p][8 + l] = b1.d;
      }
    }
  }
}

// Per (row, super-block), decoded once per call.
struct alignas(64) KPairMeta {
  int32_t sc2[8];  // sub-block k's scale in both i16 halves
  float d;
};

// A row's f32 accumulators between column chunks (llama.cpp's per-lane
// fma chain continues where the last chunk left it, so chunking keeps
// the bits).
struct alignas(64) KPairState {
  float acc[kPairTiles][16];
};

// One weight row against a group of 2P tokens over super-blocks [ib0, ib1):
// accumulators from st (zero when first), back to st, or when last
// reduced and written to y (token t at y[t * y_stride]). The weight
// prefetch runs on into the next row's chunk (w + w_stride), the tile the
// driver calls next.
template <typename Dec, int P>
RILL_KERNEL_TARGET void gemm_k_pair_tile(int64_t ib0, int64_t ib1, bool first, bool last, const void* w,
                                         size_t w_stride, const typename Dec::Meta* meta, const KActPairs* act, int n_t,
                                         KPairState* st, float* y, int64_t y_stride) {
  static_assert(P >= 1 && P <= kPairTiles);
  using WBlock = typename Dec::Block;
  const auto* wr = static_cast<const WBlock*>(w);
  __m512 acc[P];
  RILL_UNROLL
  for (int p = 0; p < P; ++p) acc[p] = first ? _mm512_setzero_ps() : _mm512_load_ps(st->acc[p]);
  for (int64_t ib = ib0; ib < ib1; ++ib) {
    const KActPairs& ab = act[ib];
    // Weights stream from L2 / L3: prefetch as the one-token tile, past the chunk into the next row's.
    const int64_t ipf = ib + kKPrefetchBlocks;
    const char* pf = ipf < ib1 ? reinterpret_cast<const char*>(wr + ipf)
                               : reinterpret_cast<const char*>(wr + ib0 + (ipf - ib1)) + w_stride;
    RILL_UNROLL
    for (size_t l = 0; l < sizeof(WBlock); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    const WBlock* b = wr + ib;
    const typename Dec::Meta& m = meta[ib];
    const typename Dec::Ctx c = Dec::ctx(b);
    __m512i s[P];
    RILL_UNROLL
    for (int p = 0; p < P; ++p) s[p] = _mm512_setzero_si512();
    RILL_UNROLL
    for (int g = 0; g < 4; ++g) {
      __m512i q[2];
      __mmask64 neg[2];  // signed types: where w < 0
      if constexpr (Dec::kSigned)
        Dec::decode(b, c, g, &q[0], &q[1], &neg[0], &neg[1]);
      else
        Dec::decode(b, c, g, &q[0], &q[1]);
      RILL_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * g + h;
        const __m512i sc = _mm512_set1_epi32(m.sc2[k]);  // the sub-block's i16 scale in every i16 lane
        RILL_UNROLL
        for (int p = 0; p < P; ++p) {
          __m512i av = _mm512_load_si512(ab.qs[p][k]);
          if constexpr (Dec::kSigned) av = _mm512_mask_sub_epi8(av, neg[h], _mm512_setzero_si512(), av);
          s[p] = _mm512_dpwssd_epi32(s[p], _mm512_maddubs_epi16(q[h], av), sc);
        }
      }
    }
    const __m512 vd = _mm512_set1_ps(m.d);
    RILL_UNROLL
    for (int p = 0; p < P; ++p) {
      const __m512 d = _mm512_mul_ps(_mm512_load_ps(ab.dpair[p]), vd);
      acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s[p]), acc[p]);
    }
  }
  if (!last) {
    RILL_UNROLL
    for (int p = 0; p < P; ++p) _mm512_store_ps(st->acc[p], acc[p]);
    return;
  }
  alignas(64) float a[P][16];
  RILL_UNROLL
  for (int p = 0; p < P; ++p) _mm512_store_ps(a[p], acc[p]);
  for (int t = 0; t < n_t && t < 2 * P; ++t) {
    const float* l = a[t / 2] + 8 * (t % 2);
    y[t * y_stride] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  }
}

template <typename Dec>
using KPairTileFn = void (*)(int64_t, int64_t, bool, bool, const void*, size_t, const typename Dec::Meta*,
                             const KActPairs*, int, KPairState*, float*, int64_t);
// Tables by pairs - 1.
template <typename Dec, int... I>
constexpr std::array<KPairTileFn<Dec>, sizeof...(I)> k_pair_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_k_pair_tile<Dec, I + 1>...};
}
template <typename Dec>
inline constexpr auto kKPairTiles = k_pair_tiles<Dec>(std::make_integer_sequence<int, kPairTiles>{});

// The token groups: each repacked once (the whole row), then column chunk
// by chunk (kPairChunkBlocks super-blocks: the chunk's repacked
// activations stay in L1 while every row passes over them), every row.
template <typename Dec>
RILL_KERNEL_TARGET void gemm_k_pair_groups(int64_t nb, const uint8_t* wb, size_t w_stride, int n_r,
                                           const typename Dec::Meta* md, KActPairs* ad, KPairState* st,
                                           const uint8_t* a, size_t a_stride, int n_t, float* y, int64_t y_stride) {
  constexpr int kGroup = 2 * kPairTiles;
  for (int t0 = 0; t0 < n_t; t0 += kGroup) {
    const int nt = n_t - t0 < kGroup ? n_t - t0 : kGroup;
    prepare_k_pairs<Dec>(ad, nb, a + static_cast<size_t>(t0) * a_stride, a_stride, nt);
    const KPairTileFn<Dec> tile = kKPairTiles<Dec>[(nt + 1) / 2 - 1];
    for (int64_t ib0 = 0; ib0 < nb; ib0 += kPairChunkBlocks) {
      const int64_t ib1 = nb - ib0 < kPairChunkBlocks ? nb : ib0 + kPairChunkBlocks;
      for (int r = 0; r < n_r; ++r)
        tile(ib0, ib1, ib0 == 0, ib1 == nb, wb + static_cast<size_t>(r) * w_stride, w_stride, md + r * nb, ad, nt,
             st + r, y + t0 * y_stride + r, y_stride);
    }
  }
}

// GemmTileFn entry. Fewer than Dec::kMinTokens token rows: Dec::small_gemm
// (IQ4_XS: its own tiles). Otherwise the rows' scales are decoded once
// (KPairMeta), then the tokens go in groups, each repacked in pairs once
// (KActPairs), and every row tile runs against the group. Per-thread
// grow-only buffers.
template <typename Dec>
RILL_KERNEL_TARGET void gemm_k_pair_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                          size_t a_stride, int n_t, float* y, int64_t y_stride) {
  if (n_t < Dec::kMinTokens) {
    Dec::small_gemm(n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  constexpr int kMetaRows = 64;  // bounds the per-thread scale table (the matmul driver's chunks are this size)
  if (n_r > kMetaRows) {
    for (int r0 = 0; r0 < n_r; r0 += kMetaRows)
      gemm_k_pair_entry<Dec>(n, static_cast<const uint8_t*>(w) + static_cast<size_t>(r0) * w_stride, w_stride,
                             n_r - r0 < kMetaRows ? n_r - r0 : kMetaRows, a, a_stride, n_t, y + r0, y_stride);
    return;
  }
  using Meta = typename Dec::Meta;
  thread_local std::vector<KActPairs> act;
  thread_local std::vector<Meta> meta;
  thread_local std::vector<KPairState> state;
  const int64_t nb = n / kQKK;
  if (static_cast<int64_t>(act.size()) < nb) act.resize(static_cast<size_t>(nb));
  if (static_cast<int64_t>(meta.size()) < nb * n_r) meta.resize(static_cast<size_t>(nb * n_r));
  if (static_cast<int>(state.size()) < n_r) state.resize(static_cast<size_t>(n_r));
  const auto* wb = static_cast<const uint8_t*>(w);
  Meta* const md = meta.data();  // (not the thread_locals in the loops: their access is a call)
  for (int r = 0; r < n_r; ++r) {
    const auto* row = reinterpret_cast<const typename Dec::Block*>(wb + static_cast<size_t>(r) * w_stride);
    for (int64_t ib = 0; ib < nb; ++ib) Dec::meta(row + ib, md + r * nb + ib);
  }
  gemm_k_pair_groups<Dec>(nb, wb, w_stride, n_r, md, act.data(), state.data(), static_cast<const uint8_t*>(a), a_stride,
                          n_t, y, y_stride);
}

template <typename Dec>
constexpr GemmTileFn gemm_k_pair() {
  return &gemm_k_pair_entry<Dec>;
}

}  // namespace
}  // namespace rill::cpu
