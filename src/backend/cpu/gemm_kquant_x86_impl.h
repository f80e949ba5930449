#pragma once
// Register-tiled gemm for the K-quants (Q4_K, Q5_K, Q6_K weights against
// Q8_K activations) with AVX2, shared by the ISA files like gemm_x86_impl.h.
// Each 256-element super-block of a weight row is decoded once per tile into
// 8 vectors of 32 unsigned values plus the i16 scale of every maddubs lane;
// per (row, token) the integer dot is sum_k madd(maddubs(q_k, a_k), scale_k),
// its 8 int32 lanes summed into the super-block's exact int32 and fma'd once
// with d, the min (or -32 offset) term taken from Q8_K's bsums: rill's
// K-quant definition (quants_ref.cpp), so the results equal the reference
// bit for bit.
#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

// A decoded super-block: q[k] holds elements 32k..32k+31 (unsigned), sc[k]
// the i16 scale of each of its 16 maddubs lanes (lane i: elements 2i, 2i+1).
struct KDecoded {
  alignas(32) uint8_t q[8][32];
  alignas(32) int16_t sc[8][16];
  alignas(32) int16_t corr[16];  // multiplies bsums[0..15]: min or 32 * scale
  float d;                       // scale of the integer dot
  float dcorr;                   // scale of the correction (subtracted)
};

inline void unpack_k4_scales(const uint8_t* scales, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, scales, &sc[j], &mn[j]);
}

struct KDecQ4 {
  using Block = BlockQ4_K;
  static constexpr int kMins = 1;  // 1: a min term (Q4_K, Q5_K); 0: the -32 offset (Q6_K)
  static void decode(const Block* b, KDecoded* out) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales(b->scales, sc, mn);
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * g));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[2 * g]), _mm256_and_si256(raw, low));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[2 * g + 1]),
                         _mm256_and_si256(_mm256_srli_epi16(raw, 4), low));
    }
    for (int k = 0; k < 8; ++k) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->sc[k]), _mm256_set1_epi16(sc[k]));
      out->corr[2 * k] = out->corr[2 * k + 1] = mn[k];
    }
    out->d = simd::f16(b->d);
    out->dcorr = simd::f16(b->dmin);
  }
};

struct KDecQ5 {
  using Block = BlockQ5_K;
  static constexpr int kMins = 1;
  static void decode(const Block* b, KDecoded* out) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales(b->scales, sc, mn);
    const __m256i low = _mm256_set1_epi8(0x0F), bit = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh));
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * g));
      // bit 2g of qh[l] is bit 4 of element 64g + l; bit 2g+1 of element 64g + 32 + l
      const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * g), 4), bit);
      const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * g + 1), 4), bit);
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[2 * g]), _mm256_or_si256(_mm256_and_si256(raw, low), h0));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[2 * g + 1]),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low), h1));
    }
    for (int k = 0; k < 8; ++k) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->sc[k]), _mm256_set1_epi16(sc[k]));
      out->corr[2 * k] = out->corr[2 * k + 1] = mn[k];
    }
    out->d = simd::f16(b->d);
    out->dcorr = simd::f16(b->dmin);
  }
};

struct KDecQ6 {
  using Block = BlockQ6_K;
  static constexpr int kMins = 0;
  static void decode(const Block* b, KDecoded* out) {
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b->ql + 64 * half;
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * half));
      const __m256i hi[4] = {_mm256_slli_epi16(_mm256_and_si256(qh, two), 4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4)};
      const __m256i lo[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      for (int k = 0; k < 4; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[4 * half + k]), _mm256_or_si256(lo[k], hi[k]));
    }
    for (int k = 0; k < 8; ++k)
      _mm256_store_si256(reinterpret_cast<__m256i*>(out->sc[k]),
                         _mm256_set_m128i(_mm_set1_epi16(b->scales[2 * k + 1]), _mm_set1_epi16(b->scales[2 * k])));
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out->corr), _mm256_slli_epi16(s16, 5));
    out->d = simd::f16(b->d);
    out->dcorr = out->d;  // q - 32: subtract 32 * scale * bsum at the same scale
  }
};

template <typename Dec, int R, int T>
RILL_KERNEL_TARGET void gemm_k_tile(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride, float* y,
                                    int64_t y_stride) {
  using WBlock = typename Dec::Block;
  const int64_t nb = n / kQKK;
  __m128 acc[R][T];  // lane 0: the (row, token)'s f32 accumulator
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm_setzero_ps();
  KDecoded dec[R];
  for (int64_t ib = 0; ib < nb; ++ib) {
    RILL_UNROLL
    for (int r = 0; r < R; ++r)
      Dec::decode(reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride) + ib, &dec[r]);
    RILL_UNROLL
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& ab = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + t * a_stride)[ib];
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        __m256i isum = _mm256_setzero_si256();
        RILL_UNROLL
        for (int k = 0; k < 8; ++k) {
          const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].q[k]));
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * k));
          const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].sc[k]));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), s));
        }
        // lane j: corr[2j] * bsums[2j] + corr[2j+1] * bsums[2j+1]
        const __m256i corr = _mm256_madd_epi16(bsums, _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].corr)));
        // The super-block's exact int32s, one scalar fma each (quants_ref.cpp).
        const __m128 d = _mm_set_ss(ab.d * dec[r].d);
        if constexpr (Dec::kMins == 0) {  // Q6_K: q - 32
          const int sb = simd::hsum_i32(_mm256_sub_epi32(isum, corr));
          acc[r][t] = _mm_fmadd_ss(d, _mm_cvtsi32_ss(_mm_setzero_ps(), sb), acc[r][t]);
        } else {  // Q4_K, Q5_K: the min term at -a.d * dmin
          const int sb = simd::hsum_i32(isum), ms = simd::hsum_i32(corr);
          acc[r][t] = _mm_fmadd_ss(d, _mm_cvtsi32_ss(_mm_setzero_ps(), sb), acc[r][t]);
          acc[r][t] = _mm_fmadd_ss(_mm_set_ss(-ab.d * dec[r].dcorr), _mm_cvtsi32_ss(_mm_setzero_ps(), ms), acc[r][t]);
        }
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = _mm_cvtss_f32(acc[r][t]);
}

template <typename Dec, int... I>
constexpr std::array<TileFn, sizeof...(I)> k_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_k_tile<Dec, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Dec>
inline constexpr auto kKTiles = k_tiles<Dec>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

struct KMaxT {
  static constexpr int kMaxT = 2;  // 16 ymm registers: R x T f32 and min accumulators
};
template <typename Dec>
constexpr GemmTileFn gemm_k() {
  return &gemm_tiles<kKTiles<Dec>, KMaxT>;
}

}  // namespace
}  // namespace rill::cpu
