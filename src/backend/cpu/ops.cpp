// Public CPU ops (ops.h) other than matmul: thin drivers that split work
// across the pool and call the kernel table of the best ISA.
#include <algorithm>
#include <cassert>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"

namespace rill::cpu {

void get_rows(const WeightView& w, const int32_t* ids, int64_t n_ids, float* out) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t i = 0; i < n_ids; ++i) {
    assert(ids[i] >= 0 && ids[i] < w.n_rows);
    ref::dequantize_row(w.dtype, base + static_cast<size_t>(ids[i]) * w.row_stride, out + i * w.n_cols, w.n_cols);
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  ref::dequantize_row(t, src, dst, n);
}

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* out, float weight_offset) {
  const Kernels& k = kernels();
  // Each row's sum of squares is a chain of dependent double adds (ggml's
  // order, kept for bit parity): four rows' chains run interleaved, so a
  // batch pays about one chain's latency per four rows. Every row's sum is
  // still its own elements added in order, as rms_sum_squares.
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    const float* x0 = x + r * dim;
    const float *x1 = x0 + dim, *x2 = x1 + dim, *x3 = x2 + dim;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      s0 += static_cast<double>(x0[i] * x0[i]);
      s1 += static_cast<double>(x1[i] * x1[i]);
      s2 += static_cast<double>(x2[i] * x2[i]);
      s3 += static_cast<double>(x3[i] * x3[i]);
    }
    const double sums[4] = {s0, s1, s2, s3};
    for (int q = 0; q < 4; ++q) {
      k.rms_scale_row(x + (r + q) * dim, w, dim, rms_norm_scale(sums[q], dim, eps), weight_offset, out + (r + q) * dim);
    }
  }
  for (; r < n_rows; ++r) k.rms_norm_row(x + r * dim, w, dim, eps, weight_offset, out + r * dim);
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          const RopeTable& table) {
  constexpr int64_t kMaxPairs = 512;
  const int64_t n_pairs = table.rot_dim / 2;
  assert(n_pairs <= kMaxPairs && table.rot_dim <= head_dim);
  float cs[kMaxPairs], sn[kMaxPairs];
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    if (table.ggml_theta_scale > 0.0f) {
      float theta_base = pos;
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float theta =
            table.ggml_freq_divisor.empty() ? theta_base : theta_base / table.ggml_freq_divisor[static_cast<size_t>(i)];
        cs[i] = std::cos(theta) * table.attn_factor;
        sn[i] = std::sin(theta) * table.attn_factor;
        theta_base *= table.ggml_theta_scale;
      }
    } else {
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float theta = pos * table.inv_freq[static_cast<size_t>(i)];
        cs[i] = std::cos(theta) * table.attn_factor;
        sn[i] = std::sin(theta) * table.attn_factor;
      }
    }
    kernels().rope_rotate(x + t * n_heads * head_dim, n_heads, head_dim, n_pairs, table.interleaved, cs, sn);
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  kernels().silu_mul(gate, up, out, n);
}
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  kernels().gelu_tanh_mul(gate, up, out, n);
}
void add_inplace(float* y, const float* x, int64_t n) {
  kernels().add_inplace(y, x, n);
}

void attention(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
               const AttentionParams& p, float* out, ThreadPool& pool) {
  attention_strided(q, q_pos, n_q, kv, n_kv, p, out, pool, 0, 0);
}

void attention_strided(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                       const AttentionParams& p, float* out, ThreadPool& pool, int64_t q_stride, int64_t out_stride) {
  assert(p.n_head % p.n_head_kv == 0);
  const int64_t qs = q_stride > 0 ? q_stride : p.n_head * p.head_dim;
  const int64_t os = out_stride > 0 ? out_stride : p.n_head * p.head_dim;
  assert(p.kv_dtype == DType::kF32 || p.kv_dtype == DType::kF16);
  const AttendRowFn attend = kernels().attend_row;
  const int64_t group = p.n_head / p.n_head_kv;
  const bool f16 = p.kv_dtype == DType::kF16;
  const size_t elem = f16 ? 2 : 4;
  assert(kv.row_bytes == static_cast<size_t>(p.n_head_kv * p.head_dim) * elem);
  const int64_t n_units = n_q * p.n_head;  // (query, head) pairs, head fastest
  const int64_t grain = std::max<int64_t>(1, n_units / (pool.n_threads() * 8));
  pool.parallel_for(n_units, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t i = u / p.n_head, h = u % p.n_head;
      const int64_t pos = q_pos[i];
      AttendRowArgs a;
      a.q = q + i * qs + h * p.head_dim;
      const size_t head_off = static_cast<size_t>((h / group) * p.head_dim) * elem;
      a.kv = kv;
      a.kv.k += head_off;
      a.kv.v += head_off;
      a.head_dim = p.head_dim;
      a.j_end = std::min<int64_t>(pos + 1, n_kv);
      a.j_begin = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.kv_f16 = f16;
      a.out = out + i * os + h * p.head_dim;
      if (p.sinks) {
        a.has_sink = true;
        a.sink = p.sinks[h];
      }
      attend(a);
    }
  });
}

}  // namespace rill::cpu
