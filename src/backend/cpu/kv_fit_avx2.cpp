// kv_fit.h's candidate errors on AVX2, uniform levels: kv_fit_avx512.cpp's
// scheme with four candidates to a vector (lane c holds candidate c and its
// own sum over the elements in index order). AVX2 has no explicit-rounding
// arithmetic, and GCC may contract a vector multiply and add into an FMA
// under -mfma, so an empty asm stands between the squared error and its
// add: every rounding stays the scalar's. iq4_nl's levels keep the scalar
// loop, whose codes the compiler already vectorizes across the block.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kv_fit.h"

namespace rill::cpu::detail {
namespace {

constexpr int kLanes = 4;
constexpr int kMaxGroups = 16;  // up to 64 candidates
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

}  // namespace

void fit_errors_avx2(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
  if (lv.nl || n_d > kMaxGroups * kLanes) {
    fit_errors_ref(x, n, d, n_d, lv, err);
    return;
  }
  const int groups = (n_d + kLanes - 1) / kLanes;
  alignas(16) float dpad[kMaxGroups * kLanes];
  for (int c = 0; c < groups * kLanes; ++c) dpad[c] = c < n_d ? d[c] : 1.0f;
  __m128 dv[kMaxGroups], id[kMaxGroups];
  __m256d acc[kMaxGroups];
  for (int g = 0; g < groups; ++g) {
    dv[g] = _mm_load_ps(dpad + kLanes * g);
    const __m128 nz = _mm_cmp_ps(dv[g], _mm_setzero_ps(), _CMP_NEQ_UQ);
    id[g] = _mm_and_ps(nz, _mm_div_ps(_mm_set1_ps(1.0f), dv[g]));
    acc[g] = _mm256_setzero_pd();
  }
  const __m128 lo = _mm_set1_ps(static_cast<float>(lv.lo)), hi = _mm_set1_ps(static_cast<float>(lv.hi));
  for (int j = 0; j < n; ++j) {
    const __m128 xs = _mm_set1_ps(x[j]);
    const __m256d xd = _mm256_set1_pd(static_cast<double>(x[j]));
    for (int g = 0; g < groups; ++g) {
      // code: nearbyint, a NaN to 0, clamped, through an int (-0 to +0).
      __m128 r = _mm_round_ps(_mm_mul_ps(xs, id[g]), kRound);
      r = _mm_andnot_ps(_mm_cmp_ps(r, r, _CMP_UNORD_Q), r);
      r = _mm_cvtepi32_ps(_mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(r, lo), hi)));
      // v * d is exact in f32 (kv_fit_avx512.cpp), then the f64 error.
      const __m256d e = _mm256_sub_pd(xd, _mm256_cvtps_pd(_mm_mul_ps(r, dv[g])));
      __m256d sq = _mm256_mul_pd(e, e);
      asm("" : "+x"(sq));  // no FMA: the square is rounded before the add
      acc[g] = _mm256_add_pd(acc[g], sq);
    }
  }
  alignas(32) double out[kMaxGroups * kLanes];
  for (int g = 0; g < groups; ++g) _mm256_store_pd(out + kLanes * g, acc[g]);
  std::memcpy(err, out, sizeof(double) * static_cast<size_t>(n_d));
}

}  // namespace rill::cpu::detail
