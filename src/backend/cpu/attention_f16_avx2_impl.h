#pragma once
// Helpers of the AVX2 + F16C f16 attention kernels (attention_f16_avx2.cpp,
// attention_f16_tile_avx2.cpp); include only from files compiled with
// -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <cstdint>

namespace rill::cpu::detail {

// The 8 lanes' sum: upper half onto lower, then pairs, then the last two.
inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace rill::cpu::detail
