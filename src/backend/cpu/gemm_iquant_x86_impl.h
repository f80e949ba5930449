#pragma once
// Register-tiled gemm for the low-bit GGUF types: Q2_K, Q3_K, IQ4_XS
// against Q8_K activations and IQ4_NL against Q8_0, shared by the AVX2 and
// AVX-512 VNNI files (gemm_iquant_avx2.cpp, gemm_iquant_avx512.cpp), which
// supply `Ops`: the i16 pair-sum-times-scale accumulate (madd + add, or
// vpdpwssd), the 32 u8 x s8 -> 8 i32 dot (maddubs + madd, or vpdpbusd) and
// the token tile width their register file allows.
//
// Arithmetic: llama.cpp's x86 vec_dot (quants_iq.h states it), so every
// (weight row, token) result equals ref::vec_dot bit for bit whatever the
// tile shape: integer lanes of elements 4l..4l+3 per 32-element chunk, one
// convert and one fma per super-block (IQ4_NL: per block, alternating two
// accumulators), llama.cpp's horizontal add. IQ4_XS (Dec::kSuperblockSum):
// the lanes summed to the super-block's one exact int32, one scalar fma.
//
// A super-block of each weight row is decoded once per tile into 8 chunks of
// 32 i8 values (Q2_K: unsigned 0..3; Q3_K: -4..3; IQ4_XS: the IQ4 code
// values) and the i16 scale of every maddubs lane, and reused for the
// tile's tokens. Signed values go through maddubs with the sign trick
// (|w| x sign(a, w)): |w| <= 127 and |a| <= 127 keep each i16 pair sum exact.
#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

// 64-byte aligned so the AVX-512 tiles read two chunks per zmm.
struct IqDecoded {
  alignas(64) int8_t q[8][32];    // chunk k: elements 32k..32k+31 (signed types: |value|)
  alignas(64) int8_t sg[8][32];   // signed types: the values (their signs go onto the activations)
  alignas(64) int16_t sc[8][16];  // chunk k, maddubs lane i (elements 2i, 2i+1): its scale
  alignas(32) int16_t mins[16];   // Q2_K: the min of each 16 elements (multiplies bsums)
  float d, dmin;
};

inline void set_chunk_scales(IqDecoded* out, int k, int lo, int hi) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(out->sc[k]),
                     _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(hi)), _mm_set1_epi16(static_cast<short>(lo))));
}

// Chunk k's scales from 16 per-16-element i16 scales s: lanes 0..7 take s[2k], 8..15 s[2k+1].
inline void set_chunk_scales_16(IqDecoded* out, const int16_t* s) {
  for (int k = 0; k < 8; ++k) set_chunk_scales(out, k, s[2 * k], s[2 * k + 1]);
}

inline void store_signed_chunk(IqDecoded* out, int k, __m256i v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[k]), _mm256_sign_epi8(v, v));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out->sg[k]), v);
}

struct IqDecQ2K {
  using Block = BlockQ2_K;
  static constexpr bool kSigned = false, kMins = true, kSuperblockSum = false;
  static void decode(const Block* b, IqDecoded* out) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * h));
      for (int k = 0; k < 4; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out->q[4 * h + k]),
                           _mm256_and_si256(_mm256_srli_epi16(raw, 2 * k), m3));
    }
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out->mins), mn16);
    alignas(32) int16_t s[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), sc16);
    set_chunk_scales_16(out, s);
    out->d = simd::f16(b->d);
    out->dmin = simd::f16(b->dmin);
  }
};

struct IqDecQ3K {
  using Block = BlockQ3_K;
  static constexpr bool kSigned = true, kMins = false, kSuperblockSum = false;
  static void decode(const Block* b, IqDecoded* out) {
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->hmask));
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * k), m3);
        // bit 4h + k of hmask[l], moved to bit 2 (srli_epi16 by < 8 keeps each byte's own bit at bit 0)
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), one), 2);
        store_signed_chunk(out, 4 * h + k, _mm256_sub_epi8(_mm256_or_si256(low, high), four));
      }
    }
    // The 16 6-bit scales as llama.cpp unpacks them (u32 lanes of 4 scales each), minus 32.
    uint32_t aux[3];
    std::memcpy(aux, b->scales, 12);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    const __m128i s8 =
        _mm_sub_epi8(_mm_setr_epi32(static_cast<int>((aux[0] & k2) | ((aux[2] & k1) << 4)),
                                    static_cast<int>((aux[1] & k2) | (((aux[2] >> 2) & k1) << 4)),
                                    static_cast<int>(((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4)),
                                    static_cast<int>(((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4))),
                     _mm_set1_epi8(32));
    alignas(32) int16_t s[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_cvtepi8_epi16(s8));
    set_chunk_scales_16(out, s);
    out->d = simd::f16(b->d);
    out->dmin = 0.0f;
  }
};

// The IQ4 code values of 16 packed bytes: low nibbles (elements 0..15), then high.
inline __m256i iq4_values_32(const uint8_t* qs) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  return _mm256_shuffle_epi8(table, simd::nibbles_32(qs));
}

struct IqDecIQ4XS {
  using Block = BlockIQ4_XS;
  static constexpr bool kSigned = true, kMins = false, kSuperblockSum = true;
  static void decode(const Block* b, IqDecoded* out) {
    for (int k = 0; k < 8; ++k) {
      store_signed_chunk(out, k, iq4_values_32(b->qs + 16 * k));
      const int s = iq4_xs_scale(k, *b) - 32;
      set_chunk_scales(out, k, s, s);
    }
    out->d = simd::f16(b->d);
    out->dmin = 0.0f;
  }
};

inline constexpr int kIqPrefetchBlocks = 4;  // super-blocks ahead per row when decoding one token

template <typename Dec, typename Ops, int R, int T>
RILL_KERNEL_TARGET void gemm_iq_tile(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride,
                                     float* y, int64_t y_stride) {
  using WBlock = typename Dec::Block;
  const int64_t nb = n / kQKK;
  const WBlock* wr[R];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride);
  __m256 acc[R][T];
  float acc1[R][T];  // Dec::kSuperblockSum
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), acc1[r][t] = 0.0f;
  IqDecoded dec[R];
  for (int64_t ib = 0; ib < nb; ++ib) {
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) {
        const char* pf = reinterpret_cast<const char*>(wr[r] + ib + kIqPrefetchBlocks);
        RILL_UNROLL
        for (size_t l = 0; l < sizeof(WBlock); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      }
      Dec::decode(wr[r] + ib, &dec[r]);
    }
    RILL_UNROLL
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& ab = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + t * a_stride)[ib];
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        __m256i isum = _mm256_setzero_si256();
        RILL_UNROLL
        for (int k = 0; k < 8; ++k) {
          const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].q[k]));
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * k));
          const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].sc[k]));
          __m256i p16;
          if constexpr (Dec::kSigned)
            p16 = _mm256_maddubs_epi16(
                q, _mm256_sign_epi8(av, _mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].sg[k]))));
          else
            p16 = _mm256_maddubs_epi16(q, av);
          isum = Ops::madd_acc(isum, p16, s);
        }
        if constexpr (Dec::kMins) {
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
          const __m256i prod = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(dec[r].mins)), bs);
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(-ab.d * dec[r].dmin), _mm256_cvtepi32_ps(prod), acc[r][t]);
        }
        if constexpr (Dec::kSuperblockSum)
          acc1[r][t] = std::fmaf(ab.d * dec[r].d, static_cast<float>(simd::hsum_i32(isum)), acc1[r][t]);
        else
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * dec[r].d), _mm256_cvtepi32_ps(isum), acc[r][t]);
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = Dec::kSuperblockSum ? acc1[r][t] : simd::hsum(acc[r][t]);
}

// IQ4_NL x Q8_0: blocks in pairs, even ones into acc1 and odd ones into acc2
// (llama.cpp's two accumulators), an odd last block through a scalar fma.
template <typename Ops, int R, int T>
RILL_KERNEL_TARGET void gemm_iq4nl_tile(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride,
                                        float* y, int64_t y_stride) {
  const int64_t nb = n / kQK;
  const BlockIQ4_NL* wr[R];
  const BlockQ8_0* ar[T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r)
    wr[r] = reinterpret_cast<const BlockIQ4_NL*>(static_cast<const uint8_t*>(w) + r * w_stride);
  RILL_UNROLL
  for (int t = 0; t < T; ++t) ar[t] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(a) + t * a_stride);
  __m256 acc[2][R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[0][r][t] = acc[1][r][t] = _mm256_setzero_ps();
  int64_t ib = 0;
  for (; ib + 1 < nb; ib += 2) {
    if constexpr (T == 1) {  // 36 bytes per row per step: one line each, kPrefetchBytes ahead
      RILL_UNROLL
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wr[r] + ib) + kPrefetchBytes, _MM_HINT_T0);
    }
    RILL_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i qa[T];
      float da[T];
      RILL_UNROLL
      for (int t = 0; t < T; ++t) {
        qa[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar[t][ib + h].qs));
        da[t] = simd::f16(ar[t][ib + h].d);
      }
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        const BlockIQ4_NL& b = wr[r][ib + h];
        const __m256i qw = iq4_values_32(b.qs);
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        const float dw = simd::f16(b.d);
        RILL_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(Ops::dot(aw, _mm256_sign_epi8(qa[t], qw)));
          acc[h][r][t] = _mm256_fmadd_ps(_mm256_set1_ps(da[t] * dw), p, acc[h][r][t]);
        }
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) {
    float sum = simd::hsum(_mm256_add_ps(acc[0][r][t], acc[1][r][t]));
    if (ib < nb) {
      const __m256i qw = iq4_values_32(wr[r][ib].qs);
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar[t][ib].qs));
      const int s = simd::hsum_i32(Ops::dot(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw)));
      sum = std::fmaf(simd::f16(ar[t][ib].d) * simd::f16(wr[r][ib].d), static_cast<float>(s), sum);
    }
    y[t * y_stride + r] = sum;
  }
}

template <typename Dec, typename Ops, int... I>
constexpr std::array<TileFn, sizeof...(I)> iq_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_iq_tile<Dec, Ops, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Ops, int... I>
constexpr std::array<TileFn, sizeof...(I)> iq4nl_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_iq4nl_tile<Ops, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Dec, typename Ops>
inline constexpr auto kIqTiles = iq_tiles<Dec, Ops>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});
template <typename Ops>
inline constexpr auto kIq4nlTiles = iq4nl_tiles<Ops>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

// Token widths per call of a tile (gemm_tiles reads Policy::kMaxT).
template <int N>
struct IqMaxT {
  static constexpr int kMaxT = N;
};

// Fills the Q2_K, Q3_K, IQ4_XS and IQ4_NL entries of k (the AVX-512 file then
// replaces the first three with its zmm tiles).
template <typename Ops>
void fill_iquant_gemm(Kernels& k) {
  k.gemm[static_cast<size_t>(DType::kQ2_K)] = &gemm_tiles<kIqTiles<IqDecQ2K, Ops>, IqMaxT<Ops::kMaxTK>>;
  k.gemm[static_cast<size_t>(DType::kQ3_K)] = &gemm_tiles<kIqTiles<IqDecQ3K, Ops>, IqMaxT<Ops::kMaxTK>>;
  k.gemm[static_cast<size_t>(DType::kIQ4_XS)] = &gemm_tiles<kIqTiles<IqDecIQ4XS, Ops>, IqMaxT<Ops::kMaxTK>>;
  k.gemm[static_cast<size_t>(DType::kIQ4_NL)] = &gemm_tiles<kIq4nlTiles<Ops>, IqMaxT<Ops::kMaxTNl>>;
}

}  // namespace
}  // namespace rill::cpu
