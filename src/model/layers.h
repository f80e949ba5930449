#pragma once
// Building blocks shared by the model families: weights bound from
// ModelFiles with their shapes checked, and the per-layer ops over them.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "core/result.h"
#include "loader/model_files.h"

namespace rill {

// The config's RoPE scaling as the backend's RoPE table takes it.
cpu::RopeScalingParams rope_scaling_params(const RopeScaling& s);

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

enum class Bias { kNone, kOptional, kRequired };

// Binds "<name>.weight" (and "<name>.bias") with shape [n_out, n_in].
Result<Linear> bind_linear(const ModelFiles& files, const std::string& name, int64_t n_out, int64_t n_in,
                           Bias bias = Bias::kNone);

// Reads a 1-D tensor of n floats (F32/F16/BF16) into an owned f32 vector.
Result<std::vector<float>> load_vector(const ModelFiles& files, const std::string& name, int64_t n);

// A weight viewed as a matrix (e.g. the embedding table [n_vocab, n_embd]).
Result<WeightView> bind_matrix(const ModelFiles& files, const std::string& name, int64_t n_rows, int64_t n_cols);

// The WeightView over a tensor already known to be [n_rows, n_cols].
WeightView weight_view(const TensorRef& t);

}  // namespace rill
