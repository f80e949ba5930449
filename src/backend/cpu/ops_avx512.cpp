// AVX-512 (F/DQ): SiLU-gated product computed exactly as ggml's AVX-512
// ggml_vec_swiglu_f32 (llama.cpp built for this CPU runs that variant, whose
// exp differs from the AVX2 one in the last bit), 16 lanes at a time.
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/exp_ggml_avx512.h"
#include "backend/cpu/kernels.h"

namespace rill::cpu {
namespace {

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_ggml512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace

void fill_ops_avx512(Kernels& k) {
  k.silu_mul = silu_mul;
}

}  // namespace rill::cpu
