// kv_fit.h's candidate errors on AVX2, uniform levels: kv_fit_avx512.cpp's
// scheme with four candidates to a vector (lane c holds candidate c and its
// own sum over the elements in index order). AVX2 has no explicit-rounding
// arithmetic, and GCC may contract a vector multiply and add into an FMA
// under -mfma, so an empty asm stands between the squared error and its
// add: every rounding stays the scalar's. iq4_nl's code counts the
// midpoints below y by a binary search, its tables looked up in two 8-entry
// permutes.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kv_fit.h"
#include "backend/cpu/quants.h"  // kIq4nlValues

namespace rill::cpu::detail {
namespace {

constexpr int kLanes = 4;
constexpr int kMaxGroups = 16;  // up to 64 candidates
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// code(y) as an f32 level value for uniform levels: nearbyint, a NaN to 0,
// clamped, through an int (-0 to +0), as kv_fit_avx512.cpp.
inline __m128 uniform_level(__m128 y, __m128 lo, __m128 hi) {
  __m128 r = _mm_round_ps(y, kRound);
  r = _mm_andnot_ps(_mm_cmp_ps(r, r, _CMP_UNORD_Q), r);
  return _mm_cvtepi32_ps(_mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(r, lo), hi)));
}

// A 16-entry f32 table as two halves of eight, for the lookup.
struct Table16 {
  __m256 low, high;
};

Table16 table16(const float* v) {
  return {_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8)};
}

// t[q] per lane, q in [0, 16).
inline __m128 lookup(const Table16& t, __m128i q) {
  const __m256i q8 = _mm256_zextsi128_si256(q);
  const __m128 lo = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(t.low, q8));
  const __m128 hi = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(t.high, q8));
  return _mm_blendv_ps(lo, hi, _mm_castsi128_ps(_mm_cmpgt_epi32(q, _mm_set1_epi32(7))));
}

struct NlTables {
  Table16 mid, level;  // the 15 midpoints (a 16th never read), the 16 levels
};

NlTables nl_tables() {
  float mid[16], level[16];
  for (int i = 0; i < 16; ++i) {
    level[i] = static_cast<float>(kIq4nlValues[i]);
    mid[i] = i < 15 ? 0.5f * static_cast<float>(kIq4nlValues[i] + kIq4nlValues[i + 1]) : 0.0f;
  }
  return {table16(mid), table16(level)};
}

// code(y) as iq4_nl's level value: the count q of midpoints strictly below
// y, by a binary search over the sorted midpoints (four compares; a NaN
// compares false throughout: 0), then level q.
inline __m128 nl_level(__m128 y, const NlTables& t) {
  auto above = [&](__m128i at) { return _mm_castps_si128(_mm_cmp_ps(y, lookup(t.mid, at), _CMP_GT_OQ)); };
  __m128i q = _mm_and_si128(above(_mm_set1_epi32(7)), _mm_set1_epi32(8));
  q = _mm_add_epi32(q, _mm_and_si128(above(_mm_add_epi32(q, _mm_set1_epi32(3))), _mm_set1_epi32(4)));
  q = _mm_add_epi32(q, _mm_and_si128(above(_mm_add_epi32(q, _mm_set1_epi32(1))), _mm_set1_epi32(2)));
  q = _mm_sub_epi32(q, above(q));  // a true compare is all ones: -1
  return lookup(t.level, q);
}

template <bool kNl>
void errors(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
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
  const NlTables nl = nl_tables();
  for (int j = 0; j < n; ++j) {
    const __m128 xs = _mm_set1_ps(x[j]);
    const __m256d xd = _mm256_set1_pd(static_cast<double>(x[j]));
    for (int g = 0; g < groups; ++g) {
      const __m128 y = _mm_mul_ps(xs, id[g]);
      const __m128 r = kNl ? nl_level(y, nl) : uniform_level(y, lo, hi);
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

}  // namespace

void chan_codes_avx2(const float* x, float zf, float step, float inv, int n_levels, int* code, double* sq) {
  const __m256 z = _mm256_set1_ps(zf), s = _mm256_set1_ps(step), iv = _mm256_set1_ps(inv);
  const __m256 top = _mm256_set1_ps(static_cast<float>(n_levels));
  for (int h = 0; h < 4; ++h) {
    const __m256 xv = _mm256_loadu_ps(x + 8 * h);
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(xv, z), iv), kRound);
    r = _mm256_andnot_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q), r);  // NaN -> +0
    const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), top));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 8 * h), q);
    __m256 prod = _mm256_mul_ps(s, _mm256_cvtepi32_ps(q));
    asm("" : "+x"(prod));  // no FMA: the product is rounded before the add
    const __m256 back = _mm256_add_ps(z, prod);
    for (int p = 0; p < 2; ++p) {
      const __m256d xd = _mm256_cvtps_pd(p ? _mm256_extractf128_ps(xv, 1) : _mm256_castps256_ps128(xv));
      const __m256d bd = _mm256_cvtps_pd(p ? _mm256_extractf128_ps(back, 1) : _mm256_castps256_ps128(back));
      const __m256d e = _mm256_sub_pd(xd, bd);
      _mm256_storeu_pd(sq + 8 * h + 4 * p, _mm256_mul_pd(e, e));
    }
  }
}

void fit_errors_avx2(const float* x, int n, const float* d, int n_d, FitLevels lv, double* err) {
  if (n_d > kMaxGroups * kLanes) {  // not a search fit_scale makes; the scalar loop takes it
    fit_errors_ref(x, n, d, n_d, lv, err);
  } else if (lv.nl) {
    errors<true>(x, n, d, n_d, lv, err);
  } else {
    errors<false>(x, n, d, n_d, lv, err);
  }
}

}  // namespace rill::cpu::detail
