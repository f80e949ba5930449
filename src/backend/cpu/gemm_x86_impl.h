#pragma once
// Register-tiled gemm for the classic 32-element block types (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0 weights against Q8_0/Q8_1 activations) and for float
// weights, shared by the AVX2 and AVX-512 VNNI files. `Dot` supplies the
// integer dot of 32 u8 x 32 s8 -> 8 i32 lanes (maddubs+madd, or vpdpbusd).
// Include only from an ISA file; everything has internal linkage.
//
// Each weight block is decoded once per tile and reused for the tile's T
// token rows; each activation block is loaded once and reused for R weight
// rows. Per block and (row, token) pair: one integer dot, one convert and
// one fma scaled by d_w * d_a (llama.cpp's formula; its sum order differs
// only in the final horizontal add).
#include <array>
#include <type_traits>
#include <utility>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/simd_x86.h"

// RILL_KERNEL_TARGET: a target attribute the including file may define (the
// AVX-512 file adds VNNI) so the tiles can inline its Dot.
#ifndef RILL_KERNEL_TARGET
#define RILL_KERNEL_TARGET
#endif
// The tile loops have compile-time trip counts; -O2 does not fully unroll
// them, and unrolled they keep the accumulators in registers.
#define RILL_UNROLL _Pragma("GCC unroll 16")

namespace rill::cpu {
namespace {

// Weight decoders: 32 bytes of quantized values, and whether they are signed
// (dot with the sign trick) or unsigned with a per-block min m (adds m * s).
struct DecQ4_0 {
  using Block = BlockQ4_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i decode(const Block* b) { return _mm256_sub_epi8(simd::nibbles_32(b->qs), _mm256_set1_epi8(8)); }
};
struct DecQ4_1 {
  using Block = BlockQ4_1;
  static constexpr bool kSigned = false, kMin = true;
  static __m256i decode(const Block* b) { return simd::nibbles_32(b->qs); }
};
struct DecQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i decode(const Block* b) {
    // (nibble | bit4 << 4) - 16 == nibble | (bit4 ? 0 : 0xF0) as int8
    const __m256i hi = _mm256_andnot_si256(simd::bits_to_bytes_32(b->qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
    return _mm256_or_si256(simd::nibbles_32(b->qs), hi);
  }
};
struct DecQ5_1 {
  using Block = BlockQ5_1;
  static constexpr bool kSigned = false, kMin = true;
  static __m256i decode(const Block* b) {
    const __m256i hi = _mm256_and_si256(simd::bits_to_bytes_32(b->qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(simd::nibbles_32(b->qs), hi);
  }
};
struct DecQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i decode(const Block* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs)); }
};

inline constexpr size_t kPrefetchBytes = 2048;

template <typename Dec, typename Dot, int R, int T>
RILL_KERNEL_TARGET void gemm_q_tile(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride, float* y,
                                    int64_t y_stride) {
  using WBlock = typename Dec::Block;
  using ABlock = std::conditional_t<Dec::kMin, BlockQ8_1, BlockQ8_0>;
  const int64_t nb = n / kQK;
  const WBlock* wr[R];
  const ABlock* ar[T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride);
  RILL_UNROLL
  for (int t = 0; t < T; ++t) ar[t] = reinterpret_cast<const ABlock*>(static_cast<const uint8_t*>(a) + t * a_stride);
  __m256 acc[R][T];
  float macc[R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), macc[r][t] = 0.0f;

  // Decode streams weights from DRAM: the R rows of a tile are one
  // contiguous region read R blocks at a time, a pattern too short per row
  // for the hardware prefetchers, so prefetch that region kPrefetchBytes ahead.
  constexpr size_t kStep = R * sizeof(WBlock);
  constexpr int kLines = static_cast<int>((kStep + 63) / 64) + 1;
  const char* pf = static_cast<const char*>(w) + kPrefetchBytes;
  for (int64_t ib = 0; ib < nb; ++ib) {
    if constexpr (T == 1) {
      RILL_UNROLL
      for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + ib * kStep + 64 * l, _MM_HINT_T0);
    }
    __m256i qa[T];
    float da[T], sa[T];
    RILL_UNROLL
    for (int t = 0; t < T; ++t) {
      qa[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar[t][ib].qs));
      da[t] = simd::f16(ar[t][ib].d);
      if constexpr (Dec::kMin) sa[t] = simd::f16(ar[t][ib].s);
    }
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      const WBlock* b = wr[r] + ib;
      const __m256i qw = Dec::decode(b);
      const float dw = Dec::kMin ? 0.0f : simd::f16(b->d);
      if constexpr (Dec::kSigned) {
        const __m256i aw = _mm256_sign_epi8(qw, qw);  // |w|, moving w's sign onto a
        RILL_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(Dot::dot(aw, _mm256_sign_epi8(qa[t], qw)));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da[t]), p, acc[r][t]);
        }
      } else {
        // d and m are adjacent f16s: one conversion for both (same values).
        uint32_t dm;
        std::memcpy(&dm, &b->d, 4);
        const __m128 dmf = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
        const float mw = _mm_cvtss_f32(_mm_movehdup_ps(dmf));
        const float dwm = _mm_cvtss_f32(dmf);
        RILL_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(Dot::dot(qw, qa[t]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dwm * da[t]), p, acc[r][t]);
          macc[r][t] += mw * sa[t];
        }
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = simd::hsum(acc[r][t]) + macc[r][t];
}

// Float weights (F32, F16, BF16) against f32 activations, 8 columns at a time.
struct LoadF32 {
  static __m256 load(const void* p, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(p) + i); }
  static float load1(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct LoadF16 {
  static __m256 load(const void* p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  static float load1(const void* p, int64_t i) { return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]); }
};
struct LoadBF16 {
  static __m256 load(const void* p, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float load1(const void* p, int64_t i) {
    const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename Load, typename Dot, int R, int T>
RILL_KERNEL_TARGET void gemm_f_tile(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride, float* y,
                                    int64_t y_stride) {
  const uint8_t* wr[R];
  const float* ar[T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = static_cast<const uint8_t*>(w) + r * w_stride;
  RILL_UNROLL
  for (int t = 0; t < T; ++t) ar[t] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a) + t * a_stride);
  __m256 acc[R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 av[T];
    RILL_UNROLL
    for (int t = 0; t < T; ++t) av[t] = _mm256_loadu_ps(ar[t] + i);
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 wv = Load::load(wr[r], i);
      RILL_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, av[t], acc[r][t]);
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) {
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      float s = simd::hsum(acc[r][t]);
      for (int64_t j = i; j < n; ++j) s += Load::load1(wr[r], j) * ar[t][j];
      y[t * y_stride + r] = s;
    }
  }
}

using TileFn = void (*)(int64_t, const void*, size_t, const void*, size_t, float*, int64_t);

template <typename Dec, typename Dot, int... I>
constexpr std::array<TileFn, sizeof...(I)> q_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_q_tile<Dec, Dot, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Load, typename Dot, int... I>
constexpr std::array<TileFn, sizeof...(I)> f_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_f_tile<Load, Dot, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}

// GemmTileFn entry points: weight rows in tiles of kMaxTileRows, each against
// the token rows in groups of at most Dot::kMaxT (register budget), picking
// the instantiation for the tile's shape.
template <const auto& kTiles, typename Dot>
RILL_KERNEL_TARGET void gemm_tiles(int64_t n, const void* w, size_t w_stride, int n_r, const void* a, size_t a_stride,
                                   int n_t, float* y, int64_t y_stride) {
  for (int r0 = 0; r0 < n_r; r0 += kMaxTileRows) {
    const int nr = n_r - r0 < kMaxTileRows ? n_r - r0 : kMaxTileRows;
    const auto* wr = static_cast<const uint8_t*>(w) + static_cast<size_t>(r0) * w_stride;
    for (int t0 = 0; t0 < n_t; t0 += Dot::kMaxT) {
      const int nt = n_t - t0 < Dot::kMaxT ? n_t - t0 : Dot::kMaxT;
      kTiles[(nr - 1) * kMaxTileCols + (nt - 1)](n, wr, w_stride, static_cast<const uint8_t*>(a) + t0 * a_stride,
                                                 a_stride, y + t0 * y_stride + r0, y_stride);
    }
  }
}

template <typename Dec, typename Dot>
inline constexpr auto kQTiles = q_tiles<Dec, Dot>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});
template <typename Load, typename Dot>
inline constexpr auto kFTiles = f_tiles<Load, Dot>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

template <typename Dec, typename Dot>
constexpr GemmTileFn gemm_q() {
  return &gemm_tiles<kQTiles<Dec, Dot>, Dot>;
}
template <typename Load, typename Dot>
constexpr GemmTileFn gemm_f() {
  return &gemm_tiles<kFTiles<Load, Dot>, Dot>;
}

}  // namespace
}  // namespace rill::cpu
