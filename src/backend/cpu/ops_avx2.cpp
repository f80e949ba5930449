// AVX2 + FMA + F16C: RMSNorm, activations, residual add and the attention
// row (f32 or f16 K/V). Tested against ops_ref.cpp.
#include <cmath>

#include "backend/cpu/attend_row_impl.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_x86.h"

namespace rill::cpu {
namespace {

// out = (x * scale) * (w_offset + w), 8 lanes at a time (the scale comes
// from kernels.h's rms_norm_scale, computed as ggml does).
void rms_scale_row(const float* x, const float* w, int64_t dim, float scale, float w_offset, float* out) {
  const __m256 vs = _mm256_set1_ps(scale), vo = _mm256_set1_ps(w_offset);
  int64_t i = 0;
  if (w) {
    for (; i + 8 <= dim; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
      _mm256_storeu_ps(out + i, _mm256_mul_ps(v, _mm256_add_ps(vo, _mm256_loadu_ps(w + i))));
    }
    for (; i < dim; ++i) out[i] = (x[i] * scale) * (w_offset + w[i]);
  } else {
    for (; i + 8 <= dim; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < dim; ++i) out[i] = x[i] * scale;
  }
}

// As ggml_vec_swiglu_f32 on AVX2: (g / (1 + exp(0 - g))) * up with
// ggml's vector exp, libm expf for the tail.
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = simd::exp_ggml(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void rms_norm_row(const float* x, const float* w, int64_t dim, float eps, float w_offset, float* out) {
  rms_scale_row(x, w, dim, rms_norm_scale(rms_sum_squares(x, dim), dim, eps), w_offset, out);
}

// 0.5 x (1 + tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u))
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(-2.0f * kSqrt2OverPi), k = _mm256_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(k, x), x, one));  // x (1 + k x^2)
    const __m256 e = simd::exp_ggml(_mm256_mul_ps(c, inner));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

// With FMA the way GCC contracts ggml's rotate_pairs (x0*c - x1*s becomes
// fma(x0, c, -(x1*s))), so rotated q/k equal llama.cpp's bit for bit.
void rope_rotate(float* v, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool interleaved, const float* cs,
                 const float* sn) {
  const int64_t step = interleaved ? 2 : 1, other = interleaved ? 1 : n_pairs;
  for (int64_t h = 0; h < n_heads; ++h, v += head_dim) {
    for (int64_t i = 0; i < n_pairs; ++i) {
      float* a = v + i * step;
      float* b = a + other;
      const float x0 = *a, x1 = *b;
      *a = __builtin_fmaf(x0, cs[i], -(x1 * sn[i]));
      *b = __builtin_fmaf(x0, sn[i], x1 * cs[i]);
    }
  }
}

inline __m256 load8(const void* row, int64_t i, bool f16) {
  if (f16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(row) + i);
}
inline float load1(const void* row, int64_t i, bool f16) {
  return f16 ? _cvtsh_ss(static_cast<const uint16_t*>(row)[i]) : static_cast<const float*>(row)[i];
}

struct Avx2Prims {
  static float dot(const float* q, const void* k, int64_t n, bool f16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k, i + 8, f16), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), acc0);
    float s = simd::hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += q[i] * load1(k, i, f16);
    return s;
  }
  static void scale(float* acc, float s, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), vs));
    for (; i < n; ++i) acc[i] *= s;
  }
  static void axpy(float* acc, float a, const void* v, int64_t n, bool f16) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, load8(v, i, f16), _mm256_loadu_ps(acc + i)));
    for (; i < n; ++i) acc[i] += a * load1(v, i, f16);
  }
};

void attend_row(const AttendRowArgs& args) {
  attend_row_impl<Avx2Prims>(args);
}

}  // namespace

void fill_ops_avx2(Kernels& k) {
  k.rms_norm_row = rms_norm_row;
  k.rms_scale_row = rms_scale_row;
  k.silu_mul = silu_mul;
  k.gelu_tanh_mul = gelu_tanh_mul;
  k.add_inplace = add_inplace;
  k.rope_rotate = rope_rotate;
  k.attend_row = attend_row;
}

}  // namespace rill::cpu
