// kv_fit.h's candidate errors on AVX-512: lane c of a group of eight holds
// candidate c's scale and its own running sum, so each sum adds the block's
// elements in index order, as the scalar loop does, and the five groups of
// a 34-candidate search run as independent chains. The multiply and the
// adds of each squared error use the explicit-rounding intrinsics, which
// the compiler never fuses into an FMA (a plain vector multiply and add
// may be contracted under -mfma), so every rounding is the scalar's.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kv_fit.h"
#include "backend/cpu/quants.h"  // kIq4nlValues

// GCC 12 reports the undefined pass-through operands of its unmasked
// AVX-512 intrinsics (_mm512_permutexvar_ps, the conversions) as used
// uninitialized once inlined; with no mask nothing undefined is read (as
// attention_quant_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace rill::cpu::detail {
namespace {

constexpr int kLanes = 8;
constexpr int kMaxGroups = 8;  // up to 64 candidates
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// code(y) as an f32 level value for uniform levels: nearbyint, a NaN to 0,
// clamped to [lo, hi], through an int so that -0 becomes +0 (the scalar's
// static_cast<int>).
inline __m256 uniform_level(__m256 y, __m256 lo, __m256 hi) {
  __m256 r = _mm256_round_ps(y, kRound);
  r = _mm256_andnot_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q), r);  // NaN -> +0
  r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
  return _mm256_cvtepi32_ps(_mm256_cvtps_epi32(r));
}

// code(y) as iq4_nl's level value: the count of midpoints strictly below y.
inline __m256 nl_level(__m256 y, const __m256 (&mid)[15], __m512 levels) {
  __m256i q = _mm256_setzero_si256();
  for (int i = 0; i < 15; ++i) {  // a true compare is all ones: -1
    q = _mm256_sub_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(y, mid[i], _CMP_GT_OQ)));
  }
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_zextsi256_si512(q), levels));
}

template <bool kNl>
void errors(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
  const int groups = (n_d + kLanes - 1) / kLanes;
  alignas(32) float dpad[kMaxGroups * kLanes];
  for (int c = 0; c < groups * kLanes; ++c) dpad[c] = c < n_d ? d[c] : 1.0f;
  __m256 dv[kMaxGroups], id[kMaxGroups];
  __m512d acc[kMaxGroups];
  for (int g = 0; g < groups; ++g) {
    dv[g] = _mm256_load_ps(dpad + kLanes * g);
    const __mmask8 nz = _mm256_cmp_ps_mask(dv[g], _mm256_setzero_ps(), _CMP_NEQ_UQ);
    id[g] = _mm256_maskz_div_ps(nz, _mm256_set1_ps(1.0f), dv[g]);
    acc[g] = _mm512_setzero_pd();
  }
  const __m256 lo = _mm256_set1_ps(static_cast<float>(lv.lo)), hi = _mm256_set1_ps(static_cast<float>(lv.hi));
  __m256 mid[15];
  for (int i = 0; i < 15; ++i) {
    mid[i] = _mm256_set1_ps(0.5f * static_cast<float>(kIq4nlValues[i] + kIq4nlValues[i + 1]));
  }
  const __m512 levels =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))));
  for (int j = 0; j < n; ++j) {
    const __m256 xs = _mm256_set1_ps(x[j]);
    const __m512d xd = _mm512_set1_pd(static_cast<double>(x[j]));
    for (int g = 0; g < groups; ++g) {
      const __m256 y = _mm256_mul_ps(xs, id[g]);
      const __m256 v = kNl ? nl_level(y, mid, levels) : uniform_level(y, lo, hi);
      // v * d is exact in f32 (a level of at most 8 bits times a scale of
      // at most 11), so its rounding cannot differ from the scalar's.
      const __m512d e = _mm512_sub_round_pd(xd, _mm512_cvtps_pd(_mm256_mul_ps(v, dv[g])), kRound);
      acc[g] = _mm512_add_round_pd(acc[g], _mm512_mul_round_pd(e, e, kRound), kRound);
    }
  }
  alignas(64) double out[kMaxGroups * kLanes];
  for (int g = 0; g < groups; ++g) _mm512_store_pd(out + kLanes * g, acc[g]);
  std::memcpy(err, out, sizeof(double) * static_cast<size_t>(n_d));
}

}  // namespace

void chan_codes_avx512(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq) {
  const __m512 z = _mm512_set1_ps(zf), s = _mm512_set1_ps(step), iv = _mm512_set1_ps(inv);
  const __m512 top = _mm512_set1_ps(static_cast<float>(n_levels));
  for (int h = 0; h < 2; ++h) {
    const __m512 xv = _mm512_loadu_ps(x + 16 * h);
    __m512 r = _mm512_roundscale_ps(_mm512_mul_round_ps(_mm512_sub_round_ps(xv, z, kRound), iv, kRound), kRound);
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // NaN -> +0
    const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), top));
    _mm512_storeu_si512(code + 16 * h, q);
    const __m512 back = _mm512_add_round_ps(z, _mm512_mul_round_ps(s, _mm512_cvtepi32_ps(q), kRound), kRound);
    for (int p = 0; p < 2; ++p) {
      const __m512d xd = _mm512_cvtps_pd(p ? _mm512_extractf32x8_ps(xv, 1) : _mm512_castps512_ps256(xv));
      const __m512d bd = _mm512_cvtps_pd(p ? _mm512_extractf32x8_ps(back, 1) : _mm512_castps512_ps256(back));
      const __m512d e = _mm512_sub_round_pd(xd, bd, kRound);
      _mm512_storeu_pd(sq + 16 * h + 8 * p, _mm512_mul_round_pd(e, e, kRound));
    }
  }
}

void fit_errors_avx512(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
  if (n_d > kMaxGroups * kLanes) {  // not a search fit_scale makes; the scalar loop takes it
    fit_errors_ref(x, n, d, n_d, lv, err);
    return;
  }
  if (lv.nl) {
    errors<true>(x, n, d, n_d, lv, err);
  } else {
    errors<false>(x, n, d, n_d, lv, err);
  }
}

}  // namespace rill::cpu::detail
