// attention_chan_impl.h compiled for AVX2 + FMA + F16C (the same loops,
// vectorized 8 lanes wide; within rounding of the baseline build), the
// softmax in 8 lanes with ggml's AVX2 exp.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/simd_x86.h"

#define RILL_CHAN_ISA avx2
#define RILL_CHAN_SOFTMAX

namespace rill::cpu::detail::avx2 {

// s[0, n) to probabilities, 8 keys a vector from s[0] (the last partial
// one through a padded copy): the max, simd::exp_ggml(s - max) in f32, the
// sum in two 4-lane double accumulators (the vector's halves, keys in
// order within each lane) reduced in a fixed order, one f32 reciprocal.
// The same n values in give the same bits out, wherever s sits.
inline void softmax_in_place(float* s, int64_t n) {
  const int64_t n8 = n - n % 8, r = n - n8;
  alignas(32) float pad[8];
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  if (r > 0) {
    for (int64_t k = 0; k < 8; ++k) pad[k] = k < r ? s[n8 + k] : -INFINITY;
    vmax = _mm256_max_ps(vmax, _mm256_load_ps(pad));
  }
  _mm256_store_ps(pad, vmax);
  float max = pad[0];
  for (int k = 1; k < 8; ++k) max = pad[k] > max ? pad[k] : max;
  const __m256 mx = _mm256_set1_ps(max);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  auto add = [&](__m256 e) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = simd::exp_ggml(_mm256_sub_ps(_mm256_loadu_ps(s + j), mx));
    _mm256_storeu_ps(s + j, e);
    add(e);
  }
  if (r > 0) {
    for (int64_t k = 0; k < 8; ++k) pad[k] = k < r ? s[n8 + k] : max;
    _mm256_store_ps(pad, simd::exp_ggml(_mm256_sub_ps(_mm256_load_ps(pad), mx)));
    for (int64_t k = 0; k < 8; ++k) {
      if (k < r) {
        s[n8 + k] = pad[k];
      } else {
        pad[k] = 0.0f;
      }
    }
    add(_mm256_load_ps(pad));
  }
  alignas(32) double sum[4];
  _mm256_store_pd(sum, _mm256_add_pd(lo, hi));
  const auto inv = static_cast<float>(1.0 / ((sum[0] + sum[2]) + (sum[1] + sum[3])));
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

}  // namespace rill::cpu::detail::avx2

#include "backend/cpu/attention_chan_impl.h"

namespace rill::cpu::detail {

void attend_chan_avx2(const ChanAttendArgs& a) {
  avx2::attend(a);
}

void attend_chan_tile_avx2(const ChanTileArgs& a) {
  avx2::attend_tile(a);
}

}  // namespace rill::cpu::detail
