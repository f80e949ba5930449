// AVX2 + F16C version of attend_f16_rounded (compiled with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/attention_f16.h"

namespace rill::cpu::detail {

void softmax_to_f16(float* s, uint16_t* p16, int64_t n);

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace

void attend_f16_rounded_avx2(const F16AttendArgs& a) {
  const int64_t n = a.j_end - a.j_begin;
  const int64_t hd = a.head_dim;
  if (hd % 8 != 0) {
    attend_f16_rounded_scalar(a);
    return;
  }
  for_each_row(a.kv, a.kv.k, a.j_begin, a.j_end, [&](int64_t j, const uint8_t* row) {
    const auto* kr = reinterpret_cast<const uint16_t*>(row);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) acc = _mm256_fmadd_ps(load_f16x8(a.q16 + d), load_f16x8(kr + d), acc);
    float x = hsum(acc) * a.scale;
    if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
    a.scores[j - a.j_begin] = x;
  });
  softmax_to_f16(a.scores, a.probs16, n);
  for (int64_t d0 = 0; d0 < hd; d0 += 32) {
    // Up to 4 registers of output dims at a time, accumulated over all keys.
    const int n_reg = static_cast<int>(hd - d0 >= 32 ? 4 : (hd - d0) / 8);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for_each_row(a.kv, a.kv.v, a.j_begin, a.j_end, [&](int64_t j, const uint8_t* row) {
      const __m256 p = _mm256_set1_ps(_cvtsh_ss(a.probs16[j - a.j_begin]));
      const uint16_t* vr = reinterpret_cast<const uint16_t*>(row) + d0;
      for (int r = 0; r < n_reg; ++r) acc[r] = _mm256_fmadd_ps(p, load_f16x8(vr + 8 * r), acc[r]);
    });
    for (int r = 0; r < n_reg; ++r) _mm256_storeu_ps(a.out + d0 + 8 * r, acc[r]);
  }
}

}  // namespace rill::cpu::detail
