#pragma once
// Builds a RopeTable (inverse frequencies + magnitude scale) from plain RoPE
// parameters. The backend does not see the loader's ModelConfig; the model
// layer copies its RopeScaling fields into RopeScalingParams.
// Reference: Hugging Face transformers modeling_rope_utils (default, linear,
// llama3 and yarn inv_freq), computed here in double and rounded to f32.
#include <cstdint>
#include <optional>

#include "backend/cpu/ops.h"

namespace rill::cpu {

struct RopeScalingParams {
  enum class Type { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  float factor = 1.0f;
  // llama3
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 0;  // llama3 and yarn; must be > 0 for them
  // yarn
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  std::optional<float> attention_factor;  // yarn: overrides 0.1 * ln(factor) + 1
  bool truncate = true;                   // yarn: floor/ceil the correction range (HF `truncate`)
};

// theta: rope base; rot_dim: rotated dims per head (even).
RopeTable make_rope_table(float theta, int64_t rot_dim, bool interleaved, const RopeScalingParams& scaling = {});

}  // namespace rill::cpu
