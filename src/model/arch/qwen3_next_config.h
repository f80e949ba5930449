#pragma once
// The hybrid gated-DeltaNet family's configuration (qwen3_next.cpp, every
// device): the linear-attention dims and which layers are linear attention,
// and the tensor-name root.
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/gated_delta.h"

namespace rill {

struct HybridConfig {
  GatedDeltaDims gdn;
  std::vector<uint8_t> is_linear;  // [n_layer]
};

// The linear-attention fields transformers reads (configuration_qwen3_5 /
// configuration_qwen3_next), from config.json or its text_config; layer
// kinds from layer_types, else every full_attention_interval-th layer (4 by
// default) is full attention. Errors name `path` and the field.
Result<HybridConfig> read_hybrid_config(const ModelConfig& cfg, const std::string& path);

// Qwen3.5 multimodal checkpoints keep the language model under
// "model.language_model."; text-only ones under "model.".
std::string hybrid_tensor_root(const ModelFiles& files);

}  // namespace rill
