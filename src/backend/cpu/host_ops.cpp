// The implementation of cpu::HostOps: a thread pool, grow-only scratch, and
// the kernels of backend/cpu (scalar reference, AVX2, AVX-512 chosen at run time).
#include <algorithm>
#include <memory>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/quants.h"

namespace rill::cpu {
namespace {

class CpuHostOps final : public HostOps {
 public:
  // On a pool of its own (n_threads), or on `shared` (not owned).
  CpuHostOps(int n_threads, ThreadPool* shared)
      : own_pool_(shared ? nullptr : std::make_unique<ThreadPool>(n_threads)), pool_(shared ? *shared : *own_pool_) {}

  const char* name() const override { return "cpu"; }
  ThreadPool* pool() override { return &pool_; }

  void reserve(const WeightView* const* ws, int n_weights, int64_t max_tokens) override {
    size_t bytes = 0;
    for (int i = 0; i < n_weights; ++i) {
      bytes = std::max(bytes, cpu::matmul_scratch_bytes(ws[i]->dtype, ws[i]->n_cols, max_tokens));
    }
    scratch_.reserve(bytes);
  }

  void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y) override {
    cpu::matmul(w, x, n_tokens, y, pool_, scratch_);
  }

  void matmul_group(const WeightView* const* ws, float* const* ys, int n_weights, const float* x,
                    int64_t n_tokens) override {
    // One quantization of x serves the group only when every weight pairs
    // with the same activation type.
    bool shared = n_weights <= cpu::kMaxMatmulGroup;
    for (int i = 1; i < n_weights && shared; ++i) {
      shared =
          cpu::vec_dot_partner(ws[i]->dtype) == cpu::vec_dot_partner(ws[0]->dtype) && ws[i]->n_cols == ws[0]->n_cols;
    }
    if (!shared) {
      for (int i = 0; i < n_weights; ++i) matmul(*ws[i], x, n_tokens, ys[i]);
      return;
    }
    cpu::matmul_group(ws, ys, n_weights, x, n_tokens, pool_, scratch_);
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n_ids, float* out) override {
    cpu::get_rows(w, ids, n_ids, out);
  }

  void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* out,
                float weight_offset) override {
    cpu::rms_norm(x, w, n_rows, dim, eps, out, weight_offset);
  }

  void rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
            const RopeTable& table) override {
    cpu::rope(x, positions, n_tokens, n_heads, head_dim, table);
  }

  void attention(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                 const AttentionParams& p, float* out) override {
    if (p.kv_dtype == DType::kF16) {
      cpu::attention_f16_rounded(q, q_pos, n_q, kv, n_kv, p, out, pool_);
    } else {
      cpu::attention(q, q_pos, n_q, kv, n_kv, p, out, pool_);
    }
  }

  void attention_batch(const cpu::AttentionSeq* seqs, int n_seqs, const AttentionParams& p) override {
    if (p.kv_dtype == DType::kF16) {
      cpu::attention_f16_rounded_batch(seqs, n_seqs, p, pool_);
      return;
    }
    for (int s = 0; s < n_seqs; ++s) {
      const cpu::AttentionSeq& a = seqs[s];
      cpu::attention(a.q, a.q_pos, a.n_q, a.kv, a.n_kv, p, a.out, pool_);
    }
  }

  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override { cpu::silu_mul(gate, up, out, n); }

  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::gelu_tanh_mul(gate, up, out, n);
  }

  void add_inplace(float* y, const float* x, int64_t n) override { cpu::add_inplace(y, x, n); }

 private:
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool& pool_;
  cpu::Scratch scratch_;
};

}  // namespace

std::unique_ptr<HostOps> make_host_ops(int n_threads) {
  return std::make_unique<CpuHostOps>(n_threads, nullptr);
}

std::unique_ptr<HostOps> make_host_ops_on(ThreadPool& pool) {
  return std::make_unique<CpuHostOps>(0, &pool);
}

}  // namespace rill::cpu
