#pragma once
// cpu::HostOps: the CPU-shaped op vocabulary the CPU model families are
// written against today (host float pointers, cpu:: types). It is the
// interface backend/backend.h's device-neutral Backend replaces: families
// move to Backend one by one (issue 16), and this header goes away with the
// last of them. A model holds one HostOps and calls it once per op per layer
// per step (never per token), over host memory.
//
// Contracts shared by every backend:
//  - no allocation inside the step: reserve() sizes scratch while planning;
//  - results of matmul_group() equal separate matmul() calls bit for bit;
//  - attention over an f16 KV cache rounds as llama.cpp does (see
//    backend/cpu/attention_f16.h), so GGUF models give llama.cpp's tokens.
#include <cstdint>
#include <memory>

#include "backend/cpu/ops.h"
#include "core/thread_pool.h"

namespace rill {

using WeightView = cpu::WeightView;  // a [n_rows, n_cols] weight in any supported dtype
using AttentionParams = cpu::AttentionParams;
using PagedKv = cpu::PagedKv;  // one layer's K/V blocks + a sequence's block table

namespace cpu {

class HostOps {
 public:
  virtual ~HostOps() = default;
  virtual const char* name() const = 0;
  // The threads the ops run on, for a Backend that shares them
  // (backend/cpu/cpu_backend.h); null for test doubles.
  virtual ThreadPool* pool() { return nullptr; }

  // Makes room for batches of up to max_tokens rows against weights of
  // these dtypes and widths. May allocate; call while planning.
  virtual void reserve(const WeightView* const* ws, int n_weights, int64_t max_tokens) = 0;

  // y[t, r] = sum_c W[r, c] x[t, c]. x: [n_tokens, n_cols], y: [n_tokens, n_rows].
  virtual void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y) = 0;
  // Several weights over the same x (q/k/v, gate/up). ys[i]: [n_tokens, ws[i]->n_rows].
  virtual void matmul_group(const WeightView* const* ws, float* const* ys, int n_weights, const float* x,
                            int64_t n_tokens) = 0;
  // out[i, :] = row ids[i] of W, dequantized. out: [n_ids, n_cols].
  virtual void get_rows(const WeightView& w, const int32_t* ids, int64_t n_ids, float* out) = 0;
  // out[r, :] = x[r, :] / rms(x[r, :]) * (weight_offset + w). out may alias x.
  virtual void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* out,
                        float weight_offset = 0.0f) = 0;
  // x: [n_tokens, n_heads, head_dim], rotated in place.
  virtual void rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                    const RopeTable& table) = 0;
  // Causal attention of one sequence's queries over its paged KV (see cpu::attention).
  virtual void attention(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                         const AttentionParams& p, float* out) = 0;
  // attention() for several sequences in one call (one parallel pass on the
  // CPU); results equal separate calls bit for bit.
  virtual void attention_batch(const cpu::AttentionSeq* seqs, int n_seqs, const AttentionParams& p) = 0;
  // out = silu(gate) * up over n floats; out may alias gate.
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out = gelu_tanh(gate) * up over n floats (GeGLU); out may alias gate.
  virtual void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // y += x over n floats.
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
};

// The CPU's HostOps: n_threads <= 0 means one thread per core.
std::unique_ptr<HostOps> make_host_ops(int n_threads);
// The same on `pool` (not owned: it must outlive the HostOps); the CPU
// Backend's MoE runs on its own threads this way.
std::unique_ptr<HostOps> make_host_ops_on(ThreadPool& pool);

}  // namespace cpu

}  // namespace rill
