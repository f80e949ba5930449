#pragma once
// Register-tiled gemm for the K-quants (Q4_K, Q5_K, Q6_K weights against
// Q8_K activations) on AVX-512BW + VNNI, for decode (one token row) and
// batched rows alike. Include only from quants_avx512.cpp; internal linkage.
//
// Arithmetic: rill's K-quant definition (quants_ref.cpp): per super-block
// exact int32s, each converted and fma'd once, so every (weight row, token)
// result equals the reference bit for bit whatever the tile shape. Per
// super-block, each 64-element chunk of a weight row is one zmm of unsigned
// values: vpmaddubsw with the activations gives i16 pair sums and vpdpwssd
// adds them times the i16 scales into 16 int32 lanes; a (row, token)'s lanes
// are summed (integers: any order) and 4 (row, token) pairs share one
// convert and fma.
//
// The GGUF blocks are used in place (no repacking): a Q4_K/Q5_K zmm of 64
// bytes holds sub-blocks (j, j+2) in its low nibbles, so the activations are
// reordered instead, once per call and token (KActBlock), with the per-token
// sub-block sums and scales the tiles need, in the lanes they use them.
#include <vector>

#include "backend/cpu/gemm_kquant_x86_impl.h"

namespace rill::cpu {
namespace {

// A super-block of up to 4 token rows (a quad), laid out for the tiles.
// Rows past the last real one repeat it (computed, never stored).
struct KActBlock {
  alignas(64) int8_t qs[4][kQKK];    // token t's values in its weight type's chunk order
  alignas(64) int16_t bsums[2][32];  // tokens (2p, 2p+1): their 16 bsums each (Q6_K)
  alignas(64) int16_t subsums[32];   // token t's 8 sub-block sums at 8t (Q4_K, Q5_K)
  alignas(16) float d[4];            // a.d of token t
  alignas(16) float dn[4];           // -a.d of token t
};

// kOrder[k]: the 32-element sub-block whose activations go k-th.
template <const int (&kOrder)[8]>
RILL_KERNEL_TARGET void prepare_k_acts(KActBlock* out, int64_t nb, const void* a, size_t a_stride, int n_t) {
  const BlockQ8_K* ar[4];
  for (int t = 0; t < 4; ++t)
    ar[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + (t < n_t ? t : n_t - 1) * a_stride);
  for (int64_t ib = 0; ib < nb; ++ib) {
    KActBlock& o = out[ib];
    for (int t = 0; t < 4; ++t) {
      const BlockQ8_K& b = ar[t][ib];
      for (int k = 0; k < 8; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.qs[t] + 32 * k),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * kOrder[k])));
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o.bsums[t / 2] + 16 * (t % 2)), bs);
      // sub-block j's sum: bsums[2j] + bsums[2j+1] (as llama.cpp's hadd_epi16)
      _mm_store_si128(reinterpret_cast<__m128i*>(o.subsums + 8 * t),
                      _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
      o.d[t] = b.d;
      o.dn[t] = -b.d;
    }
  }
}

// A decoded weight super-block: 4 chunks of 64 unsigned values, the i16
// scale of each value pair's maddubs lane, and the min (or offset) terms.
struct KRow {
  __m512i q[4];
  __m512i sc[4];
  __m512i mins;  // Q4_K/Q5_K: the 8 i16 mins in every 128-bit lane; Q6_K: 32 * scales (i16) in both halves
  float d, dmin;
};

// i16 lane i of chunk c's scale vector is scale (i < 16 ? A : B) for Q4_K/Q5_K
// sub-blocks (A, B); Q6_K has a scale per 16 elements: 4c + i / 8.
RILL_KERNEL_TARGET static inline __m512i scale_index_k4(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(a)), _mm256_set1_epi16(static_cast<short>(b)), 1);
}

// 128-bit lane i (0..3) of v. The immediate must be a constant expression
// for clang even where an unrolled loop makes i one (gcc folds it).
RILL_KERNEL_TARGET static inline __m128i lane128(__m512i v, int i) {
  switch (i) {
    case 0:
      return _mm512_castsi512_si128(v);
    case 1:
      return _mm512_extracti32x4_epi32(v, 1);
    case 2:
      return _mm512_extracti32x4_epi32(v, 2);
    default:
      return _mm512_extracti32x4_epi32(v, 3);
  }
}

// The 12 packed scale bytes -> sc (bytes 0..7) and mn (bytes 8..15), as
// llama.cpp's utmp shuffle, in one xmm.
RILL_KERNEL_TARGET static inline __m128i unpack_k4_scales_simd(const uint8_t* scales) {
  uint32_t u[3];
  std::memcpy(u, scales, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const uint32_t o0 = u[0] & k1, o2 = u[1] & k1;
  const uint32_t o1 = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const uint32_t o3 = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  return _mm_setr_epi32(static_cast<int>(o0), static_cast<int>(o1), static_cast<int>(o2), static_cast<int>(o3));
}

// The 12 packed scale bytes of 4 Q4_K/Q5_K rows at once (row r's in 128-bit
// lane r, as unpack_k4_scales_simd lays out one): 4 loads and 7 vector ops
// for the 4 rows instead of about 25 scalar ops per row. A row's 16 bytes
// are read from its scales (the 4 after them are the row's quants, unused).
RILL_KERNEL_TARGET static inline __m512i unpack_k4_scales_x4(const uint8_t* s0, const uint8_t* s1, const uint8_t* s2,
                                                             const uint8_t* s3) {
  const __m512i u = _mm512_inserti32x4(
      _mm512_inserti32x4(
          _mm512_inserti32x4(_mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s0))),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(s1)), 1),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(s2)), 2),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(s3)), 3);
  // Per lane (u0, u1, u2): o0 = u0 & k1, o1 = (u2 & k2) | (((u0 >> 6) & k3) << 4),
  // o2 = u1 & k1, o3 = ((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4).
  const __m512i a = _mm512_shuffle_epi32(u, _MM_PERM_CBCA);  // (u0, u2, u1, u2)
  const __m512i b = _mm512_shuffle_epi32(u, _MM_PERM_BBAA);  // (u0, u0, u1, u1)
  const __m512i shift = _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
  const __m512i keep =
      _mm512_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                        0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
  const __m512i high = _mm512_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0,
                                         0x30303030, 0, 0x30303030, 0, 0x30303030);
  return _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(a, shift), keep),
                         _mm512_and_si512(_mm512_srli_epi32(b, 2), high));
}

// A Q4_K/Q5_K row's scale vectors from its 16 scale bytes s8 (sc 0..7, mn 0..7).
template <const int (&kOrder)[8]>
RILL_KERNEL_TARGET static inline void k4_scale_vectors(__m128i s8, KRow* r) {
  const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(s8));
  RILL_UNROLL
  for (int c = 0; c < 4; ++c)
    r->sc[c] = _mm512_permutexvar_epi16(scale_index_k4(kOrder[2 * c], kOrder[2 * c + 1]), s16);
  r->mins = _mm512_permutexvar_epi16(_mm512_set_epi16(15, 14, 13, 12, 11, 10, 9, 8, 15, 14, 13, 12, 11, 10, 9, 8, 15,
                                                      14, 13, 12, 11, 10, 9, 8, 15, 14, 13, 12, 11, 10, 9, 8),
                                     s16);
}

struct KVnniQ4 {
  using Block = BlockQ4_K;
  static constexpr int kMins = 1;  // as KDecQ4
  // Chunks: low nibbles of bytes 0..63 = sub-blocks (0, 2), high (1, 3); of 64..127: (4, 6), (5, 7).
  static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  RILL_KERNEL_TARGET static void decode_q(const Block* b, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_loadu_si512(b->qs), hi = _mm512_loadu_si512(b->qs + 64);
    q[0] = _mm512_and_si512(lo, m4);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), m4);
    q[2] = _mm512_and_si512(hi, m4);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), m4);
  }
  RILL_KERNEL_TARGET static void decode(const Block* b, KRow* r) {
    decode_q(b, r->q);
    k4_scale_vectors<kOrder>(unpack_k4_scales_simd(b->scales), r);
    r->d = simd::f16(b->d);
    r->dmin = simd::f16(b->dmin);
  }
};

struct KVnniQ5 {
  using Block = BlockQ5_K;
  static constexpr int kMins = 1;
  static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  RILL_KERNEL_TARGET static void decode(const Block* b, KRow* r) {
    decode_q(b, r->q);
    k4_scale_vectors<kOrder>(unpack_k4_scales_simd(b->scales), r);
    r->d = simd::f16(b->d);
    r->dmin = simd::f16(b->dmin);
  }
  RILL_KERNEL_TARGET static void decode_q(const Block* b, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_loadu_si512(b->qs), hi = _mm512_loadu_si512(b->qs + 64);
    const __m512i l4[4] = {_mm512_and_si512(lo, m4), _mm512_and_si512(_mm512_srli_epi16(lo, 4), m4),
                           _mm512_and_si512(hi, m4), _mm512_and_si512(_mm512_srli_epi16(hi, 4), m4)};
    // Bit j of qh[l] is bit 4 of element 32j + l: chunk c's sub-blocks (A, B) test bits A and B.
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh)));
    const __m512i sixteen = _mm512_set1_epi8(16);
    RILL_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << kOrder[2 * c])),
                                              _mm256_set1_epi8(static_cast<char>(1 << kOrder[2 * c + 1])), 1);
      q[c] = _mm512_mask_add_epi8(l4[c], _mm512_test_epi8_mask(qh, bits), l4[c], sixteen);
    }
  }
};

struct KVnniQ6 {
  using Block = BlockQ6_K;
  static constexpr int kMins = 0;
  static constexpr int kOrder[8] = {0, 1, 2, 3, 4, 5, 6, 7};  // chunks are elements 64c..64c+63
  RILL_KERNEL_TARGET static void decode(const Block* b, KRow* r) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // Quarter k of half h (elements 128h + 32k + l): nibble of ql[64h + l (+32 for odd k)],
    // low for k < 2; high bits (qh[32h + l] >> 2k) & 3.
    const __m512i mask01 = _mm512_inserti64x4(_mm512_set1_epi8(0x03), _mm256_set1_epi8(0x0C), 1);
    const __m512i mask23 = _mm512_inserti64x4(_mm512_set1_epi8(0x30), _mm256_set1_epi8(static_cast<char>(0xC0)), 1);
    const __m512i shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    RILL_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * h)));
      r->q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(_mm512_and_si512(qh, mask01), shl01));
      r->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                        _mm512_srlv_epi16(_mm512_and_si512(qh, mask23), shr23));
    }
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)));
    const __m512i s16z = _mm512_castsi256_si512(s16);
    // lane i of chunk c: scale 4c + i / 8
    const __m512i base = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                                            16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           3);
    RILL_UNROLL
    for (int c = 0; c < 4; ++c)
      r->sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(4 * c))), s16z);
    r->mins = _mm512_broadcast_i64x4(_mm256_slli_epi16(s16, 5));
    r->d = simd::f16(b->d);
    r->dmin = 0.0f;
  }
};

inline constexpr int kKPrefetchBlocks = 6;  // super-blocks ahead, per row (decode streams weights from DRAM)

template <typename Dec, int R, int T>
RILL_KERNEL_TARGET void gemm_k_tile_vnni(int64_t n, const void* w, size_t w_stride, const KActBlock* act, float* y,
                                         int64_t y_stride) {
  static_assert(R >= 1 && R <= 4 && T >= 1 && T <= 4);
  using WBlock = typename Dec::Block;
  constexpr bool kMins = Dec::kMins != 0;
  const int64_t nb = n / kQKK;
  const WBlock* wr[R];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride);
  // (row r, token t) = index i = r T + t; its f32 accumulator is lane i % 4 of acc[i / 4].
  constexpr int G = (R * T + 3) / 4;
  __m128 acc[G];
  RILL_UNROLL
  for (int g = 0; g < G; ++g) acc[g] = _mm_setzero_ps();
  for (int64_t ib = 0; ib < nb; ++ib) {
    const KActBlock& ab = act[ib];
    __m128i xs[4 * G];             // (r, t)'s super-block int32 as 4 partial sums, at r T + t
    __m128i ms[4 * G];             // Q4_K/Q5_K: its min term likewise
    alignas(16) float wd[4 * G];   // w.d of row r at r
    alignas(16) float wdm[4 * G];  // w.dmin of row r at r
    __m512i zs[4];                 // T = 1: row r's 16 partial sums (Q6_K: offset included)
    __m128i zm[4] = {};            // T = 1, Q4_K/Q5_K: row r's 4 partial min sums (Q6_K: unused)
    // T = 1: w.d and w.dmin of row r in lane r, built in registers (4 scalar stores then a
    // vector load would stall on store forwarding once per super-block).
    __m128 wdv = _mm_setzero_ps(), wdmv = _mm_setzero_ps();
    // T = 1, Q4_K/Q5_K: the 4 rows' scale bytes (lane r: row r) and their (d, dmin) f16
    // pairs (a block's first 4 bytes) converted together (rows past R repeat the last).
    __m512i s8x4 = _mm512_setzero_si512();
    if constexpr (T == 1 && kMins) {
      const WBlock* b[4];
      RILL_UNROLL
      for (int r = 0; r < 4; ++r) b[r] = wr[r < R ? r : R - 1] + ib;
      s8x4 = unpack_k4_scales_x4(b[0]->scales, b[1]->scales, b[2]->scales, b[3]->scales);
      uint32_t dm[4];
      RILL_UNROLL
      for (int r = 0; r < 4; ++r) std::memcpy(&dm[r], b[r], 4);
      const __m256 pairs =
          _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_setr_epi32(static_cast<int>(dm[0]), static_cast<int>(dm[1]),
                                                                  static_cast<int>(dm[2]), static_cast<int>(dm[3]))),
                                   _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
      wdv = _mm256_castps256_ps128(pairs);
      wdmv = _mm256_extractf128_ps(pairs, 1);
    }
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      const char* pf = reinterpret_cast<const char*>(wr[r] + ib + kKPrefetchBlocks);
      RILL_UNROLL
      for (size_t l = 0; l < sizeof(WBlock); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      KRow k;
      if constexpr (T == 1 && kMins) {
        Dec::decode_q(wr[r] + ib, k.q);
        k4_scale_vectors<Dec::kOrder>(lane128(s8x4, r), &k);
      } else {
        Dec::decode(wr[r] + ib, &k);
        wd[r] = k.d;
        wdm[r] = k.dmin;
      }
      if constexpr (T == 1 && !kMins) {
        wdv = _mm_mask_mov_ps(wdv, static_cast<__mmask8>(1 << r), _mm_set1_ps(k.d));
      }
      __m512i prod = _mm512_setzero_si512();
      if constexpr (kMins) prod = _mm512_madd_epi16(k.mins, _mm512_load_si512(ab.subsums));  // lane 4t + k
      RILL_UNROLL
      for (int t = 0; t < T; ++t) {
        __m512i s = _mm512_setzero_si512();
        RILL_UNROLL
        for (int c = 0; c < 4; ++c) {
          const __m512i av = _mm512_load_si512(ab.qs[t] + 64 * c);
          s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(k.q[c], av), k.sc[c]);
        }
        if constexpr (T == 1) {  // reduced across the rows below
          if constexpr (!kMins) {
            const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.bsums[0]));
            s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_madd_epi16(bs, _mm512_castsi512_si256(k.mins))));
          } else {
            zm[r] = _mm512_castsi512_si128(prod);
          }
          zs[r] = s;
          continue;
        }
        __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        if constexpr (!kMins) {  // Q6_K: - 32 sum_j sc[j] bsums[j]
          const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.bsums[t / 2] + 16 * (t % 2)));
          h = _mm256_sub_epi32(h, _mm256_madd_epi16(bs, _mm512_castsi512_si256(k.mins)));
        } else {
          ms[r * T + t] = lane128(prod, t);
        }
        xs[r * T + t] = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      }
    }
    // The super-block's exact int32s, 4 (row, token) pairs per xmm, one convert and fma each
    // (quants_ref.cpp's definition).
    if constexpr (T == 1) {
      // 4 rows' 16 lanes each -> lane r of one xmm: a transpose-add tree (integers: any order).
      RILL_UNROLL
      for (int r = R; r < 4; ++r) zs[r] = zs[R - 1], zm[r] = zm[R - 1];
      const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(zs[0], zs[1]), _mm512_unpackhi_epi32(zs[0], zs[1]));
      const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(zs[2], zs[3]), _mm512_unpackhi_epi32(zs[2], zs[3]));
      const __m512i v = _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
      const __m256i v2 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
      const __m128i sb = _mm_add_epi32(_mm256_castsi256_si128(v2), _mm256_extracti128_si256(v2, 1));
      acc[0] = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(ab.d[0]), wdv), _mm_cvtepi32_ps(sb), acc[0]);
      if constexpr (kMins) {
        const __m128i m01 = _mm_add_epi32(_mm_unpacklo_epi32(zm[0], zm[1]), _mm_unpackhi_epi32(zm[0], zm[1]));
        const __m128i m23 = _mm_add_epi32(_mm_unpacklo_epi32(zm[2], zm[3]), _mm_unpackhi_epi32(zm[2], zm[3]));
        const __m128i mb = _mm_add_epi32(_mm_unpacklo_epi64(m01, m23), _mm_unpackhi_epi64(m01, m23));
        acc[0] = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(ab.dn[0]), wdmv), _mm_cvtepi32_ps(mb), acc[0]);
      }
      continue;
    }
    RILL_UNROLL
    for (int i = R * T; i < 4 * G; ++i) xs[i] = xs[R * T - 1], ms[i] = ms[R * T - 1];
    RILL_UNROLL
    for (int r = R; r < 4 * G; ++r) wd[r] = wd[R - 1], wdm[r] = wdm[R - 1];
    RILL_UNROLL
    for (int g = 0; g < G; ++g) {
      const __m128i sb =
          _mm_hadd_epi32(_mm_hadd_epi32(xs[4 * g], xs[4 * g + 1]), _mm_hadd_epi32(xs[4 * g + 2], xs[4 * g + 3]));
      // lane l: w.d (w.dmin) of row i / T and a.d (-a.d) of token i % T, i = 4 g + l
      __m128 dw, dwm, da, dan;
      if constexpr (T == 1) {
        dw = _mm_load_ps(wd + 4 * g), dwm = _mm_load_ps(wdm + 4 * g);
        da = _mm_set1_ps(ab.d[0]), dan = _mm_set1_ps(ab.dn[0]);
      } else if constexpr (T == 4) {
        dw = _mm_set1_ps(wd[g]), dwm = _mm_set1_ps(wdm[g]);
        da = _mm_load_ps(ab.d), dan = _mm_load_ps(ab.dn);
      } else {
        alignas(16) float f[4][4];
        RILL_UNROLL
        for (int l = 0; l < 4; ++l) {
          const int i = 4 * g + l < R * T ? 4 * g + l : R * T - 1;
          f[0][l] = wd[i / T], f[1][l] = wdm[i / T], f[2][l] = ab.d[i % T], f[3][l] = ab.dn[i % T];
        }
        dw = _mm_load_ps(f[0]), dwm = _mm_load_ps(f[1]), da = _mm_load_ps(f[2]), dan = _mm_load_ps(f[3]);
      }
      acc[g] = _mm_fmadd_ps(_mm_mul_ps(da, dw), _mm_cvtepi32_ps(sb), acc[g]);
      if constexpr (kMins) {
        const __m128i mb =
            _mm_hadd_epi32(_mm_hadd_epi32(ms[4 * g], ms[4 * g + 1]), _mm_hadd_epi32(ms[4 * g + 2], ms[4 * g + 3]));
        acc[g] = _mm_fmadd_ps(_mm_mul_ps(dan, dwm), _mm_cvtepi32_ps(mb), acc[g]);
      }
    }
  }
  alignas(16) float o[4 * G];
  RILL_UNROLL
  for (int g = 0; g < G; ++g) _mm_store_ps(o + 4 * g, acc[g]);
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) y[t * y_stride + r] = o[r * T + t];
}

using KTileFn = void (*)(int64_t, const void*, size_t, const KActBlock*, float*, int64_t);
template <typename Dec, int... I>
constexpr std::array<KTileFn, sizeof...(I)> k_tiles_vnni(std::integer_sequence<int, I...>) {
  return {&gemm_k_tile_vnni<Dec, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Dec>
inline constexpr auto kKTilesVnni = k_tiles_vnni<Dec>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

// GemmTileFn entry: token rows in quads, each prepared once (KActBlock per
// super-block, in a grow-only per-thread buffer: it allocates only when a
// longer row or the first call comes), then every row tile against it.
template <typename Dec>
RILL_KERNEL_TARGET void gemm_k_vnni_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                          size_t a_stride, int n_t, float* y, int64_t y_stride) {
  thread_local std::vector<KActBlock> act;
  const int64_t nb = n / kQKK;
  if (static_cast<int64_t>(act.size()) < nb) act.resize(static_cast<size_t>(nb));
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int t0 = 0; t0 < n_t; t0 += kMaxTileCols) {
    const int nt = n_t - t0 < kMaxTileCols ? n_t - t0 : kMaxTileCols;
    prepare_k_acts<Dec::kOrder>(act.data(), nb, static_cast<const uint8_t*>(a) + static_cast<size_t>(t0) * a_stride,
                                a_stride, nt);
    for (int r0 = 0; r0 < n_r; r0 += kMaxTileRows) {
      const int nr = n_r - r0 < kMaxTileRows ? n_r - r0 : kMaxTileRows;
      kKTilesVnni<Dec>[(nr - 1) * kMaxTileCols + (nt - 1)](n, wb + static_cast<size_t>(r0) * w_stride, w_stride,
                                                           act.data(), y + t0 * y_stride + r0, y_stride);
    }
  }
}

template <typename Dec>
constexpr GemmTileFn gemm_k_vnni() {
  return &gemm_k_vnni_entry<Dec>;
}

}  // namespace
}  // namespace rill::cpu
