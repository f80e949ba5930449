#pragma once
// The multi-head latent attention family's configuration (model/arch/
// deepseek.cpp binds through it): the fields of config.json ModelConfig does
// not carry, for deepseek_v3, minicpm3 and glm_moe_dsa.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/moe.h"
#include "model/mup_scales.h"

namespace rill {

// DeepSeek sparse attention (GLM-5's glm_moe_dsa; topk 0: none): a
// lightning indexer of n_head heads of head_dim (its first rope dims
// rotated) scores every earlier key, and attention reads only the topk
// best. A layer whose indexer_types entry is "shared" has no indexer: it
// reuses the selection of the nearest full layer before it.
struct DsaParams {
  int64_t n_head = 0, head_dim = 0, topk = 0;
  std::vector<bool> shared;  // [n_layer]

  bool enabled() const { return topk > 0; }
};

// The MLA fields of config.json (ModelConfig::raw); errors name the file
// and the field.
struct MlaParams {
  int64_t q_lora_rank = 0;  // 0: q_proj
  int64_t kv_lora_rank = 0, nope = 0, rope = 0, v_dim = 0;
  bool interleaved = true;  // RoPE pairs (2i, 2i+1)
  float attn_scale = 1.0f;
  std::optional<float> rope_attention_factor;  // yarn's, from mscale / mscale_all_dim
  MupScales mup;                               // MiniCPM3's (model/mup_scales.h); 1 elsewhere
  MoeParams moe;                               // n_expert 0: every FFN dense
  DsaParams dsa;

  int64_t qk_dim() const { return nope + rope; }
};

Result<MlaParams> read_mla_params(const ModelFiles& f);

}  // namespace rill
