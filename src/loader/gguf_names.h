#pragma once
// The one place that knows both GGUF and Hugging Face naming: tensor names
// and the metadata keys that make a ModelConfig.
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "loader/gguf.h"
#include "loader/model_config.h"

namespace rill {

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight",
// "token_embd.weight" -> "model.embed_tokens.weight", "output.weight" -> "lm_head.weight", ...
// nullopt for names with no canonical equivalent (they are kept under their GGUF name).
// `arch` (general.architecture) selects the names that differ by family:
// gemma2/gemma3 "ffn_norm" is "pre_feedforward_layernorm", their
// "post_attention_norm" / "post_ffw_norm" the post-attention / post-MLP norms;
// qwen35/qwen3next map llama.cpp's ssm_* / attn_qkv / attn_gate names to the
// linear_attn.* names of the Hugging Face checkpoints (see kHybridLayerNames);
// gpt-oss maps attn_sinks, post_attention_norm and the router / expert
// biases (see kGptOssLayerNames).
std::optional<std::string> gguf_to_hf_tensor_name(std::string_view gguf_name, std::string_view arch = {});

// Builds the ModelConfig from `general.architecture` and the `<arch>.*` keys.
// GGUF architectures map to Hugging Face model_type names (llama -> "llama",
// qwen2 -> "qwen2", ...); a GGUF "llama" file uses RopeStyle::kInterleaved
// because its converter permuted the q/k rows. For qwen35/qwen3next the
// `<arch>.ssm.*` keys also appear in `raw` under the Hugging Face names
// (linear_num_key_heads, ..., layer_types). Errors name the file and key.
Result<ModelConfig> gguf_model_config(const GgufFile& file);

}  // namespace rill
