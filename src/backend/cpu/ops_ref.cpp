// Scalar reference of the elementwise ops, RMSNorm, the attention row and
// the gemm tile. The AVX2/AVX-512 tables are tested against these.
#include <cassert>
#include <cmath>

#include "backend/cpu/attend_row_impl.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/quants.h"
#include "core/half.h"

namespace rill::cpu::ref {
namespace {

struct ScalarPrims {
  static float load(const void* row, int64_t i, bool f16) {
    return f16 ? f16_to_f32(static_cast<const uint16_t*>(row)[i]) : static_cast<const float*>(row)[i];
  }
  static float dot(const float* q, const void* k, int64_t n, bool f16) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += q[i] * load(k, i, f16);
    return s;
  }
  static void scale(float* acc, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i] *= s;
  }
  static void axpy(float* acc, float a, const void* v, int64_t n, bool f16) {
    for (int64_t i = 0; i < n; ++i) acc[i] += a * load(v, i, f16);
  }
};

}  // namespace

void gemm_tile(DType w, int64_t n, const void* wp, size_t w_stride, int n_r, const void* a, size_t a_stride, int n_t,
               float* y, int64_t y_stride) {
  const auto* wb = static_cast<const uint8_t*>(wp);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_t; ++t)
    for (int r = 0; r < n_r; ++r) y[t * y_stride + r] = vec_dot(w, n, wb + r * w_stride, ab + t * a_stride);
}

// As ggml_compute_forward_rms_norm_f32: squares in f32, summed in double;
// the scale multiplies first, then the weight (ggml's separate mul op).
void rms_norm_row(const float* x, const float* w, int64_t dim, float eps, float w_offset, float* out) {
  rms_scale_row(x, w, dim, rms_norm_scale(rms_sum_squares(x, dim), dim, eps), w_offset, out);
}

void rms_scale_row(const float* x, const float* w, int64_t dim, float scale, float w_offset, float* out) {
  if (w) {
    for (int64_t i = 0; i < dim; ++i) out[i] = (x[i] * scale) * (w_offset + w[i]);
  } else {
    for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * scale;
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void rope_rotate(float* v, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool interleaved, const float* cs,
                 const float* sn) {
  const int64_t step = interleaved ? 2 : 1, other = interleaved ? 1 : n_pairs;
  for (int64_t h = 0; h < n_heads; ++h, v += head_dim) {
    for (int64_t i = 0; i < n_pairs; ++i) {
      float* a = v + i * step;
      float* b = a + other;
      const float x0 = *a, x1 = *b;
      *a = x0 * cs[i] - x1 * sn[i];
      *b = x0 * sn[i] + x1 * cs[i];
    }
  }
}

void attend_row(const AttendRowArgs& args) {
  assert(args.head_dim <= kMaxHeadDim);
  attend_row_impl<ScalarPrims>(args);
}

}  // namespace rill::cpu::ref
