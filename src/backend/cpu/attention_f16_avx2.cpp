// AVX2 + F16C version of attend_f16_rounded (compiled with -mavx2 -mfma -mf16c).
#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/attention_f16_avx2_impl.h"

namespace rill::cpu::detail {

void softmax_to_f16_avx2(float* s, uint16_t* p16, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
  float max = -INFINITY;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float x : lanes) max = std::max(max, x);
  for (int64_t j = n8; j < n; ++j) max = std::max(max, s[j]);
  // The tail as a padded block of 8 (-inf: exp 0).
  alignas(32) float tail[8];
  for (int i = 0; i < 8; ++i) tail[i] = n8 + i < n ? s[n8 + i] : -INFINITY;
  const __m256 m = _mm256_set1_ps(max);
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  auto exps = [&](float* at) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(at), m));
    _mm256_storeu_ps(at, e);
    sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  for (int64_t j = 0; j < n8; j += 8) exps(s + j);
  if (n8 < n) exps(tail);
  alignas(32) double parts[4];
  _mm256_store_pd(parts, _mm256_add_pd(sum_lo, sum_hi));
  const double sum = (parts[0] + parts[1]) + (parts[2] + parts[3]);
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t j = 0; j < n8; j += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + j), inv), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p16 + j), h);
  }
  if (n8 < n) {
    alignas(16) uint16_t h[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(_mm256_mul_ps(_mm256_load_ps(tail), inv), _MM_FROUND_TO_NEAREST_INT));
    for (int64_t j = n8; j < n; ++j) {
      s[j] = tail[j - n8];
      p16[j] = h[j - n8];
    }
  }
}

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
    float x = hsum8(acc) * a.scale;
    if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
    a.scores[j - a.j_begin] = x;
  });
  softmax_to_f16_avx2(a.scores, a.probs16, n);
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
