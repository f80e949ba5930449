#pragma once
// ggml's AVX-512 ggml_v_expf, shared by the SiLU and attention kernels that
// reproduce llama.cpp's arithmetic bit for bit. Include only from files
// compiled with AVX-512 flags (*_avx512.cpp).
#include <immintrin.h>

#include <cmath>

namespace rill::cpu {
namespace {

// 2^n * p(b), n = round(x / ln 2), scaled with vscalefps (ggml's AVX-512 ggml_v_expf).
inline __m512 exp_ggml512(__m512 x) {
  const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter);
  const __m512 n = _mm512_sub_ps(z, shifter);
  const __m512 b =
      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 huge = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  if (huge == 0) return res;
  // |n| > 192: 0 for very negative x, inf for very positive.
  const __m512 zero = _mm512_setzero_ps();
  const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
  return _mm512_mask_blend_ps(huge, res, alt);
}

}  // namespace
}  // namespace rill::cpu
