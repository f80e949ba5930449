#pragma once
// ModelConfig: every graph-shaping hyperparameter of a model, filled from a
// Hugging Face config.json (hf_config.cpp) or from GGUF metadata
// (gguf_config.cpp). The model registry picks an implementation from
// `architecture`; the config fingerprint hashes every field below.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rill {

// How RoPE pairs the dimensions of a head.
enum class RopeStyle {
  kHalf,         // dim i rotates with dim i + rot_dim/2 (Hugging Face, GGUF "neox")
  kInterleaved,  // dim 2i rotates with dim 2i+1 (GGUF llama: q/k rows were permuted)
};

struct RopeScaling {
  // kProportional (Gemma 4's full layers): the first partial_rotary_factor
  // of the head's angle pairs rotate, at frequencies over the whole
  // head_dim, the rest not at all; only the Gemma family builds its table.
  // kLongRope (MiniCPM 4, model_type minicpm only): pair i's frequency
  // divided by short_factor[i] (long_factor[i] past
  // original_max_position, which the Llama family refuses to reach).
  enum class Type { kNone, kLinear, kLlama3, kYarn, kProportional, kLongRope };
  Type type = Type::kNone;
  float factor = 1.0f;
  // llama3
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 0;
  // yarn
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  std::optional<float> attention_factor;  // yarn mscale override
  bool truncate = true;                   // yarn: round the correction range to whole dims (gpt-oss: false)
  // longrope: one divisor per rotated pair, [rope_dim / 2] each
  std::vector<float> short_factor, long_factor;
};

// Sampling defaults from generation_config.json (or GGUF), used when a
// request leaves a field unset.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<bool> do_sample;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
};

// The most decoder layers a config may declare. Real models have at most a
// few hundred; the bound keeps a hostile file's layer count from driving
// per-layer loops (layer types, KV specs) for hours before the tensor check.
inline constexpr int64_t kMaxLayers = 4096;

struct ModelConfig {
  // Registry key: the Hugging Face model_type ("llama", "mistral", "qwen2",
  // "qwen3", ...) or, for GGUF, general.architecture mapped to the same names.
  std::string architecture;

  int64_t n_vocab = 0;
  int64_t n_embd = 0;        // hidden_size
  int64_t n_layer = 0;       // num_hidden_layers
  int64_t n_head = 0;        // num_attention_heads
  int64_t n_head_kv = 0;     // num_key_value_heads
  int64_t head_dim = 0;      // explicit head_dim, else n_embd / n_head
  int64_t n_ff = 0;          // intermediate_size
  int64_t max_position = 0;  // max_position_embeddings / context_length
  float rms_norm_eps = 1e-6f;

  float rope_theta = 10000.0f;
  int64_t rope_dim = 0;  // rotary dims per head (partial rotary), default head_dim
  RopeStyle rope_style = RopeStyle::kHalf;
  RopeScaling rope_scaling;

  int64_t sliding_window = 0;  // 0: full attention everywhere
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";

  // Mixture of experts (model/moe.h); n_expert == 0: every FFN is dense.
  // Layer il has the MoE FFN when n_expert > 0, (il + 1) % moe_layer_step
  // == 0 and il is not in dense_layers (transformers' Qwen3-MoE rule).
  int64_t n_expert = 0;               // num_local_experts / num_experts
  int64_t n_expert_used = 0;          // num_experts_per_tok (top-k)
  int64_t n_ff_expert = 0;            // moe_intermediate_size, else intermediate_size
  int64_t n_ff_shared_expert = 0;     // shared_expert_intermediate_size; 0: no shared expert
  bool norm_topk_prob = true;         // renormalise the top-k weights (Mixtral always does)
  int64_t moe_layer_step = 1;         // decoder_sparse_step
  std::vector<int64_t> dense_layers;  // mlp_only_layers

  GenerationDefaults generation;

  // The whole source config (config.json, or GGUF metadata as JSON without
  // the tokenizer arrays) for family-specific fields of later architectures.
  nlohmann::json raw;
};

}  // namespace rill
