#include "model/fingerprint.h"

#include <algorithm>

#include "core/hash.h"

namespace rill {

std::string config_fingerprint(const ModelConfig& c) {
  nlohmann::json j = {
      {"architecture", c.architecture},
      {"n_vocab", c.n_vocab},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_head_kv", c.n_head_kv},
      {"head_dim", c.head_dim},
      {"n_ff", c.n_ff},
      {"max_position", c.max_position},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_dim", c.rope_dim},
      {"rope_style", static_cast<int>(c.rope_style)},
      {"rope_scaling",
       {static_cast<int>(c.rope_scaling.type), c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
        c.rope_scaling.high_freq_factor, c.rope_scaling.original_max_position, c.rope_scaling.beta_fast,
        c.rope_scaling.beta_slow, c.rope_scaling.attention_factor.value_or(-1.0f)}},
      {"sliding_window", c.sliding_window},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", c.hidden_act},
  };
  if (c.n_expert > 0) {  // only then, so dense models keep their fingerprints
    j["moe"] = {c.n_expert, c.n_expert_used, c.n_ff_expert, c.n_ff_shared_expert, c.norm_topk_prob,
                c.moe_layer_step, c.dense_layers};
  }
  // Family-specific graph fields of later architectures live in `raw`;
  // generation settings and tokenizer keys do not shape the graph.
  nlohmann::json raw = c.raw.is_object() ? c.raw : nlohmann::json::object();
  for (const char* k : {"generation_config", "transformers_version", "torch_dtype", "dtype",
                        "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id"}) {
    raw.erase(k);
  }
  j["raw"] = raw;
  return hex64(hash64(j.dump()));
}

std::string artifact_fingerprint(const ModelFiles& files) {
  uint64_t h = 0;
  for (const auto& [name, t] : files.tensors) {
    std::string entry = name + "|" + std::string(dtype_name(t.dtype)) + "|" + t.shape_string();
    h = hash64(entry, h);
    const size_t edge = std::min<size_t>(64, t.n_bytes);
    if (edge > 0) {
      h = hash64(t.data, edge, h);
      h = hash64(t.data + t.n_bytes - edge, edge, h);
    }
  }
  return hex64(h);
}

}  // namespace rill
