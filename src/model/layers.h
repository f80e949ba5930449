#pragma once
// Building blocks shared by the model families: weights bound from
// ModelFiles with their shapes checked, and the per-layer ops over them.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/rope_table.h"
#include "core/result.h"
#include "loader/model_files.h"

namespace rill {

// The config's RoPE scaling as the backend's RoPE table takes it.
cpu::RopeScalingParams rope_scaling_params(const RopeScaling& s);

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
