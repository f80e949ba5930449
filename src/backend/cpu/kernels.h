#pragma once
// Per-ISA kernel table. The scalar table (built from quants_ref.cpp and
// ops_ref.cpp) is the reference; the AVX2 and AVX-512 tables override the
// entries they accelerate and are used only on CPUs that support them.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/paged_kv.h"
#include "core/dtype.h"

namespace rill::cpu {

// Largest register tile of the gemm functions (they tile larger calls).
inline constexpr int kMaxTileRows = 4;  // weight rows
inline constexpr int kMaxTileCols = 4;  // activation (token) rows

// y[t * y_stride + r] = dot(weight row r, activation row t) for r < n_r and
// t < n_t (both >= 1; a call may span many register tiles, which lets an
// implementation share per-token work across rows). Weight row r starts at
// w + r * w_stride bytes, activation row t at a + t * a_stride bytes; the
// activation is of the weight's vec_dot_partner type. n: elements per row.
using GemmTileFn = void (*)(int64_t n, const void* w, size_t w_stride, int n_r, const void* a, size_t a_stride, int n_t,
                            float* y, int64_t y_stride);
using QuantizeRowFn = void (*)(const float* x, void* y, int64_t n);

// One query row of one head against keys [j_begin, j_end) of its KV head,
// with online softmax. Key j's head_dim elements (f32 or f16) start at
// kv.k_row(j) (value: kv.v_row(j)): the caller points kv.k / kv.v at this
// KV head's first element of physical block 0.
struct AttendRowArgs {
  const float* q = nullptr;  // [head_dim]
  PagedKv kv;
  int64_t head_dim = 0;
  int64_t j_begin = 0;
  int64_t j_end = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  bool kv_f16 = false;
  float* out = nullptr;  // [head_dim]
  // A sink logit (gpt-oss): joins the softmax denominator, adds no value.
  bool has_sink = false;
  float sink = 0.0f;
};
using AttendRowFn = void (*)(const AttendRowArgs& args);

inline constexpr int kNumDTypeIds = 40;  // MXFP4 is 39

struct Kernels {
  Isa isa = Isa::kScalar;
  GemmTileFn gemm[kNumDTypeIds] = {};  // by weight dtype id
  // Token rows the matmul driver hands one gemm call at most (0: its
  // default block, sized for the activations to stay in cache). A gemm that
  // does per-call work on the weights (the K-quants' repack) blocks the tokens
  // itself and asks for them all.
  int gemm_max_tokens[kNumDTypeIds] = {};
  QuantizeRowFn quantize[kNumDTypeIds] = {};  // by activation (partner) dtype id
  void (*rms_norm_row)(const float* x, const float* w, int64_t dim, float eps, float w_offset, float* out) = nullptr;
  // The second half of rms_norm_row: out = (x * scale) * (w_offset + w)
  // (x * scale without w), for a scale from rms_norm_scale().
  void (*rms_scale_row)(const float* x, const float* w, int64_t dim, float scale, float w_offset, float* out) = nullptr;
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  void (*gelu_tanh_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  void (*add_inplace)(float* y, const float* x, int64_t n) = nullptr;
  // Rotates the first 2 * n_pairs dims of each of n_heads heads of v
  // ([n_heads, head_dim]) by the per-pair cos/sin: interleaved pairs
  // (2i, 2i+1), else (i, i + n_pairs).
  void (*rope_rotate)(float* v, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool interleaved, const float* cs,
                      const float* sn) = nullptr;
  AttendRowFn attend_row = nullptr;
};

// Requires that the CPU supports `isa`.
const Kernels& kernels(Isa isa);
// The table for best_isa().
const Kernels& kernels();

// Filled in by the ISA files (each compiled with its own flags); they start
// from a copy of the next-lower table and override what they accelerate.
void fill_kernels_avx2(Kernels& k);
void fill_kernels_avx512(Kernels& k);
void fill_ops_avx2(Kernels& k);    // elementwise ops and attention (ops_avx2.cpp)
void fill_ops_avx512(Kernels& k);  // SiLU with ggml's AVX-512 exp (ops_avx512.cpp)
// Q2_K, Q3_K, IQ4_NL, IQ4_XS gemm (gemm_iquant_avx2.cpp / gemm_iquant_avx512.cpp).
void fill_iquant_avx2(Kernels& k);
void fill_iquant_avx512(Kernels& k);

// RMSNorm's scale from a row's sum of squares, as ggml: squares in f32
// summed in double in element order (rms_sum_squares), the mean rounded to
// f32, then 1 / sqrt(mean + eps) in f32.
inline double rms_sum_squares(const float* x, int64_t dim) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}
inline float rms_norm_scale(double sum, int64_t dim, float eps) {
  const float mean = static_cast<float>(sum / static_cast<double>(dim));
  return 1.0f / std::sqrt(mean + eps);
}

namespace ref {
// Scalar entries, also used by tests as the reference.
void gemm_tile(DType w, int64_t n, const void* wp, size_t w_stride, int n_r, const void* a, size_t a_stride, int n_t,
               float* y, int64_t y_stride);
void rms_norm_row(const float* x, const float* w, int64_t dim, float eps, float w_offset, float* out);
void rms_scale_row(const float* x, const float* w, int64_t dim, float scale, float w_offset, float* out);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
void add_inplace(float* y, const float* x, int64_t n);
void rope_rotate(float* v, int64_t n_heads, int64_t head_dim, int64_t n_pairs, bool interleaved, const float* cs,
                 const float* sn);
void attend_row(const AttendRowArgs& args);
}  // namespace ref

}  // namespace rill::cpu
