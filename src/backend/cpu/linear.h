#pragma once
// Linear: a weight matrix left where the model file maps it, with its bias,
// applied over cpu::HostOps (the CPU families' layers, model/layers.h, and
// the CPU MoE arithmetic, backend/cpu/moe.h).
#include <cstdint>
#include <vector>

#include "backend/cpu/host_ops.h"

namespace rill {

// y = x W^T (+ b). W: [n_out, n_in] in any supported dtype, left in the
// mapped file; the bias (if any) is copied to f32.
struct Linear {
  WeightView w;
  std::vector<float> bias;  // empty: no bias
  int64_t n_out() const { return w.n_rows; }
  int64_t n_in() const { return w.n_cols; }

  // x: [n_tokens, n_in], y: [n_tokens, n_out]
  void forward(const float* x, int64_t n_tokens, float* y, cpu::HostOps& backend) const;
};

// Applies several Linears to the same x (q/k/v, gate/up) through
// cpu::HostOps::matmul_group; results equal separate forward() calls bit for bit.
// ys[i]: [n_tokens, ls[i]->n_out()].
void forward_group(const Linear* const* ls, float* const* ys, int n, const float* x, int64_t n_tokens,
                   cpu::HostOps& backend);

}  // namespace rill
