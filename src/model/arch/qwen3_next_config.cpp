#include "model/arch/qwen3_next_config.h"

#include "backend/cpu/gated_delta.h"

namespace rill {
namespace {

using nlohmann::json;

Result<int64_t> read_dim(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 20)) {
    return Error{path + ": field '" + key + "' must be a positive integer"};
  }
  return it->get<int64_t>();
}

}  // namespace

Result<HybridConfig> read_hybrid_config(const ModelConfig& cfg, const std::string& path) {
  const json* j = &cfg.raw;
  if (auto tc = cfg.raw.find("text_config");
      tc != cfg.raw.end() && tc->is_object() && !cfg.raw.contains("hidden_size")) {
    j = &*tc;
  }
  HybridConfig h;
  RILL_ASSIGN_OR_RETURN(h.gdn.n_k_heads, read_dim(*j, "linear_num_key_heads", path));
  RILL_ASSIGN_OR_RETURN(h.gdn.n_v_heads, read_dim(*j, "linear_num_value_heads", path));
  RILL_ASSIGN_OR_RETURN(h.gdn.head_k_dim, read_dim(*j, "linear_key_head_dim", path));
  RILL_ASSIGN_OR_RETURN(h.gdn.head_v_dim, read_dim(*j, "linear_value_head_dim", path));
  RILL_ASSIGN_OR_RETURN(h.gdn.conv_kernel, read_dim(*j, "linear_conv_kernel_dim", path));
  if (h.gdn.n_v_heads % h.gdn.n_k_heads != 0 || h.gdn.head_k_dim > cpu::kMaxHeadKDim ||
      h.gdn.head_v_dim > cpu::kMaxHeadVDim || h.gdn.conv_kernel < 2 || h.gdn.conv_kernel > cpu::kMaxConvKernel) {
    return Error{path + ": linear attention of " + std::to_string(h.gdn.n_k_heads) + " key / " +
                 std::to_string(h.gdn.n_v_heads) + " value heads of " + std::to_string(h.gdn.head_k_dim) + "/" +
                 std::to_string(h.gdn.head_v_dim) + " dims, conv kernel " + std::to_string(h.gdn.conv_kernel) +
                 " is not supported"};
  }
  if (cfg.hidden_act != "silu") {
    return Error{path + ": hidden_act '" + cfg.hidden_act + "' is not supported (the conv and FFN use silu)"};
  }
  h.is_linear.assign(static_cast<size_t>(cfg.n_layer), 0);
  if (auto lt = j->find("layer_types"); lt != j->end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != cfg.n_layer) {
      return Error{path + ": field 'layer_types' must list num_hidden_layers layer types"};
    }
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (t == "linear_attention") {
        h.is_linear[i] = 1;
      } else if (t != "full_attention") {
        return Error{path + ": layer_types[" + std::to_string(i) + "] must be linear_attention or full_attention"};
      }
    }
  } else {
    int64_t interval = 4;
    if (j->contains("full_attention_interval")) {
      RILL_ASSIGN_OR_RETURN(interval, read_dim(*j, "full_attention_interval", path));
    }
    for (int64_t i = 0; i < cfg.n_layer; ++i) h.is_linear[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  }
  return h;
}

std::string hybrid_tensor_root(const ModelFiles& files) {
  return files.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
}

}  // namespace rill
