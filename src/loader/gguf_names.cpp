#include "loader/gguf_names.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace rill {
namespace {

struct NamePair {
  std::string_view gguf;
  std::string_view hf;
};

// Whole-model tensors.
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// A multi-token-prediction (MTP) layer's own tensors, in blocks past
// block_count - nextn_predict_layers (llama.cpp's names for DeepSeek-V3 /
// GLM and Qwen3.5's MTP layers alike) -> DeepSeek-V3's Hugging Face names
// (loader/mtp_layers.h). The layer's decoder tensors map as any block's.
constexpr NamePair kNextnNames[] = {
    {"nextn.eh_proj.weight", "eh_proj.weight"},
    {"nextn.enorm.weight", "enorm.weight"},
    {"nextn.hnorm.weight", "hnorm.weight"},
    {"nextn.embed_tokens.weight", "embed_tokens.weight"},
    {"nextn.shared_head_head.weight", "shared_head.head.weight"},
    {"nextn.shared_head_norm.weight", "shared_head.norm.weight"},
};

// Per-layer tensors: "blk.N.<gguf>" -> "model.layers.N.<hf>".
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},  // qwen3
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},  // qwen3
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

// Per-layer names that differ in the Gemma 2/3 files (sandwich norms): there
// ffn_norm is the norm before the MLP and post_attention_norm the one after
// attention. Looked up before kLayerNames for those architectures.
constexpr NamePair kGemmaLayerNames[] = {
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

bool is_gemma(std::string_view arch) {
  return arch == "gemma2" || arch == "gemma3" || arch == "gemma4";
}

// Gemma 4 (llama.cpp's gemma4): per-layer embeddings, the layer scalar and
// the MoE block (router, its scale and per-expert scale, the gate/up experts
// in one tensor, the block's extra norms). Looked up before
// kGemmaLayerNames for that architecture.
constexpr NamePair kGemma4GlobalNames[] = {
    {"per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"},
    {"per_layer_model_proj.weight", "model.per_layer_model_projection.weight"},
    {"per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight"},
};

constexpr NamePair kGemma4LayerNames[] = {
    {"layer_output_scale.weight", "layer_scalar"},
    {"inp_gate.weight", "per_layer_input_gate.weight"},
    {"proj.weight", "per_layer_projection.weight"},
    {"post_norm.weight", "post_per_layer_input_norm.weight"},
    {"ffn_gate_inp.weight", "router.proj.weight"},
    {"ffn_gate_inp.scale", "router.scale"},
    {"ffn_down_exps.scale", "router.per_expert_scale"},
    {"ffn_gate_up_exps.weight", "experts.gate_up_proj"},  // [n_expert, 2 F, E]: gate rows, then up
    {"ffn_down_exps.weight", "experts.down_proj"},
    {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
    {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
    {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
};

// The hybrid gated-DeltaNet families (llama.cpp's qwen35 and qwen3next).
// Their linear-attention layers use llama.cpp's ssm_* names; attn_qkv /
// attn_gate are the linear layers' in_proj_qkv / in_proj_z (full-attention
// layers keep attn_q/k/v). What the converter changed besides names is
// undone by the model (model/arch/qwen3_next.cpp, model/gated_delta.cpp):
// the (1 + w) norms hold 1 + w, ssm_a holds A = -exp(A_log) (hence its
// name "A"), conv1d is [conv_dim, K], and qwen35's value heads are tiled.
// Looked up before kLayerNames for those architectures.
constexpr NamePair kHybridLayerNames[] = {
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},  // [2*key_dim + value_dim, E]
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},   // [value_dim, E]
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},    // qwen35 [n_v_heads, E]
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},   // qwen35 [n_v_heads, E]
    {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},     // qwen3next, grouped per key head
    {"ssm_in.weight", "linear_attn.in_proj_qkvz.weight"},   // older qwen3next files
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},     // [conv_dim, K]
    {"ssm_dt.bias", "linear_attn.dt_bias"},                 // [n_v_heads]
    {"ssm_a", "linear_attn.A"},                             // -exp(A_log) [n_v_heads]
    {"ssm_norm.weight", "linear_attn.norm.weight"},         // [head_v_dim]
    {"ssm_out.weight", "linear_attn.out_proj.weight"},      // [E, value_dim]
};

bool is_hybrid(std::string_view arch) {
  return arch == "qwen35" || arch == "qwen3next";
}
// gpt-oss (llama.cpp's "gpt-oss"): post_attention_norm is the norm before
// the MoE FFN, the router and the stacked experts carry biases
// (ffn_*_exps.bias [n_expert, rows]), attn_sinks holds the per-head sink
// logits. Looked up before kLayerNames for that architecture.
constexpr NamePair kGptOssLayerNames[] = {
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_sinks.weight", "self_attn.sinks"},
    {"ffn_gate_inp.weight", "mlp.router.weight"},
    {"ffn_gate_inp.bias", "mlp.router.bias"},
    {"ffn_gate_exps.bias", "mlp.experts.gate_proj.bias"},
    {"ffn_up_exps.bias", "mlp.experts.up_proj.bias"},
    {"ffn_down_exps.bias", "mlp.experts.down_proj.bias"},
};

// The multi-head latent attention families (llama.cpp's deepseek2 and
// minicpm3). deepseek2 files split kv_b_proj per head into attn_k_b [n_head,
// kv_lora, nope] (W_uk transposed) and attn_v_b [n_head, v, kv_lora]; the
// model reads them under the names below (model/arch/deepseek.cpp); older
// files and minicpm3 keep attn_kv_b. Looked up before kLayerNames there.
constexpr NamePair kMlaLayerNames[] = {
    {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attn_k_b.weight", "self_attn.k_b_proj.weight"},
    {"attn_v_b.weight", "self_attn.v_b_proj.weight"},
};

bool is_mla(std::string_view arch) {
  return arch == "deepseek2" || arch == "minicpm3" || arch == "glm-dsa";
}

// GLM-5's lightning indexer (llama.cpp's glm-dsa: DeepSeek-V3's MLA and
// MoE plus DeepSeek sparse attention), on the layers whose
// attention.indexer.types entry is true ("full"); model/arch/deepseek.cpp
// reads it under the Hugging Face names. k_norm is a LayerNorm (weight and
// bias). Looked up before kLayerNames for that architecture.
constexpr NamePair kDsaLayerNames[] = {
    {"indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight"},      // [n_head D, q_lora]
    {"indexer.attn_k.weight", "self_attn.indexer.wk.weight"},          // [D, E]
    {"indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"},      // [D]
    {"indexer.k_norm.bias", "self_attn.indexer.k_norm.bias"},          // [D]
    {"indexer.proj.weight", "self_attn.indexer.weights_proj.weight"},  // [n_head, E]
};

// The sigmoid-routed mixtures (deepseek2, glm4moe): ungated shared experts
// under DeepSeek's name, the router's correction bias. glm4moe's
// post_attention_norm is the norm before the FFN.
constexpr NamePair kRoutedMoeLayerNames[] = {
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},  // glm4moe
};

bool is_routed_moe(std::string_view arch) {
  return arch == "deepseek2" || arch == "glm4moe" || arch == "glm-dsa";
}

// Mixture-of-experts tensors (llama.cpp's names). Routed experts are stacked
// in one 3-D tensor per projection: ffn_gate_exps [n_expert, n_ff, n_embd].
constexpr NamePair kMoeLayerNames[] = {
    {"ffn_gate_inp.weight", "mlp.gate.weight"},  // router [n_expert, n_embd]
    {"ffn_gate_exps.weight", "mlp.experts.gate_proj.weight"},
    {"ffn_up_exps.weight", "mlp.experts.up_proj.weight"},
    {"ffn_down_exps.weight", "mlp.experts.down_proj.weight"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},  // [n_embd]
};

// Older Mixtral files keep one tensor per expert: "ffn_gate.<e>.weight".
constexpr NamePair kPerExpertNames[] = {
    {"ffn_gate.", "gate_proj.weight"},
    {"ffn_up.", "up_proj.weight"},
    {"ffn_down.", "down_proj.weight"},
};

struct ArchInfo {
  std::string_view gguf;  // general.architecture
  std::string_view hf;    // ModelConfig::architecture (HF model_type)
  RopeStyle rope_style;   // llama-converted files had q/k rows permuted
};

constexpr ArchInfo kArchs[] = {
    {"llama", "llama", RopeStyle::kInterleaved},
    {"mistral", "mistral", RopeStyle::kInterleaved},
    {"qwen2", "qwen2", RopeStyle::kHalf},
    {"qwen3", "qwen3", RopeStyle::kHalf},
    {"gemma2", "gemma2", RopeStyle::kHalf},
    {"gemma3", "gemma3_text", RopeStyle::kHalf},
    {"qwen3moe", "qwen3_moe", RopeStyle::kHalf},
    {"qwen35", "qwen3_5_text", RopeStyle::kHalf},  // text positions: MRoPE sections all equal
    {"qwen3next", "qwen3_next", RopeStyle::kHalf},
    {"gpt-oss", "gpt_oss", RopeStyle::kHalf},
    {"deepseek2", "deepseek_v3", RopeStyle::kInterleaved},  // rope_interleave
    {"minicpm", "minicpm", RopeStyle::kInterleaved},        // MiniCPMModel permutes q/k as LlamaModel
    {"minicpm3", "minicpm3", RopeStyle::kHalf},
    {"glm4moe", "glm4_moe", RopeStyle::kHalf},
    {"gemma4", "gemma4_text", RopeStyle::kHalf},
    {"glm-dsa", "glm_moe_dsa", RopeStyle::kInterleaved},  // llama.cpp's rope type NORM: pairs (2i, 2i+1)
};

// Arrays this long are tokenizer tables, not configuration: left out of `raw`.
constexpr size_t kMaxRawArray = 1024;

// Metadata strings are not guaranteed to be UTF-8, but JSON must be (dump()
// throws otherwise): invalid sequences become U+FFFD.
std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; ok && k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc >> 6) == 0x2;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
               (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff))
      ok = false;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

nlohmann::json to_json(const GgufValue& v) {
  if (const auto* a = v.as_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : *a) out.push_back(to_json(e));
    return out;
  }
  if (const auto* s = v.as_string()) return valid_utf8(*s);
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* d = std::get_if<double>(&v.v)) {
    if (!std::isfinite(*d)) return nullptr;
    if (v.type != GgufType::kF32) return *d;
    // f32 values are held as double; keep their shortest f32 spelling
    // (1e-05, not 9.999999747378752e-06).
    char buf[32];
    auto res = std::to_chars(buf, buf + sizeof(buf) - 1, static_cast<float>(*d));
    *res.ptr = '\0';
    return std::strtod(buf, nullptr);
  }
  return nullptr;
}

// Reads the `<arch>.*` keys with the file name in every error.
class ConfigReader {
 public:
  ConfigReader(const GgufFile& file, std::string_view arch) : file_(file), arch_(arch) {}

  std::string key(std::string_view suffix) const { return std::string(arch_) + "." + std::string(suffix); }

  // A required positive integer.
  Result<int64_t> positive(std::string_view suffix) const {
    const std::string k = key(suffix);
    const GgufValue* v = file_.find(k);
    if (!v) return Error{file_.path() + ": missing metadata key '" + k + "'"};
    return check_positive(k, *v);
  }

  // An optional positive integer; `fallback` when absent.
  Result<int64_t> positive_or(std::string_view suffix, int64_t fallback) const {
    const std::string k = key(suffix);
    const GgufValue* v = file_.find(k);
    if (!v) return fallback;
    return check_positive(k, *v);
  }

  // An optional non-negative integer.
  Result<int64_t> count_or(std::string_view suffix, int64_t fallback) const {
    const std::string k = key(suffix);
    const GgufValue* v = file_.find(k);
    if (!v) return fallback;
    auto i = v->type == GgufType::kBool ? std::nullopt : v->as_int();
    if (!i || *i < 0) return Error{file_.path() + ": '" + k + "' must be a non-negative integer"};
    return *i;
  }

  // An optional finite positive float.
  Result<float> positive_float_or(std::string_view suffix, float fallback) const {
    const std::string k = key(suffix);
    const GgufValue* v = file_.find(k);
    if (!v) return fallback;
    auto f = v->type == GgufType::kBool ? std::nullopt : v->as_float();
    if (!f || !std::isfinite(*f) || *f <= 0 || *f > 3.0e38)
      return Error{file_.path() + ": '" + k + "' must be a positive number"};
    return static_cast<float>(*f);
  }

 private:
  Result<int64_t> check_positive(const std::string& k, const GgufValue& v) const {
    auto i = v.type == GgufType::kBool ? std::nullopt : v.as_int();
    if (!i || *i <= 0) return Error{file_.path() + ": '" + k + "' must be a positive integer"};
    return *i;
  }

  const GgufFile& file_;
  std::string_view arch_;
};

std::optional<int32_t> token_id(const GgufFile& file, std::string_view key) {
  auto id = file.get_int(key);
  if (!id || *id < 0 || *id > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(*id);
}

Status read_rope_scaling(const GgufFile& file, const ConfigReader& r, std::string_view arch, RopeScaling* out) {
  const std::string type_key = r.key("rope.scaling.type");
  auto type = file.get_string(type_key);
  if (!type) {
    // Older converters wrote only a linear factor.
    if (file.find(r.key("rope.scale_linear"))) {
      out->type = RopeScaling::Type::kLinear;
      RILL_ASSIGN_OR_RETURN(out->factor, r.positive_float_or("rope.scale_linear", 1.0f));
    }
    return Status::Ok();
  }
  if (*type == "none") return Status::Ok();
  if (*type == "linear") {
    out->type = RopeScaling::Type::kLinear;
  } else if (*type == "yarn") {
    out->type = RopeScaling::Type::kYarn;
    RILL_ASSIGN_OR_RETURN(out->beta_fast, r.positive_float_or("rope.scaling.yarn_beta_fast", 32.0f));
    RILL_ASSIGN_OR_RETURN(out->beta_slow, r.positive_float_or("rope.scaling.yarn_beta_slow", 1.0f));
    if (file.find(r.key("rope.scaling.attn_factor"))) {
      RILL_ASSIGN_OR_RETURN(float attn, r.positive_float_or("rope.scaling.attn_factor", 1.0f));
      out->attention_factor = attn;
    }
  } else if (*type == "longrope" && arch == "minicpm") {
    out->type = RopeScaling::Type::kLongRope;  // read_minicpm reads the factors
    return Status::Ok();
  } else {
    return Error{file.path() + ": unsupported '" + type_key + "' value '" + *type + "'"};
  }
  RILL_ASSIGN_OR_RETURN(out->factor, r.positive_float_or("rope.scaling.factor", 1.0f));
  RILL_ASSIGN_OR_RETURN(out->original_max_position, r.count_or("rope.scaling.original_context_length", 0));
  return Status::Ok();
}

// `<arch>.expert_*` keys. A "llama" file with experts is Mixtral. llama.cpp
// renormalises the top-k weights of both Mixtral and Qwen3-MoE.
Status read_experts(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RILL_ASSIGN_OR_RETURN(c->n_expert, r.count_or("expert_count", 0));
  if (c->n_expert == 0) return Status::Ok();
  if (c->architecture == "llama") c->architecture = "mixtral";
  RILL_ASSIGN_OR_RETURN(c->n_expert_used, r.positive("expert_used_count"));
  if (c->n_expert_used > c->n_expert)
    return Error{file.path() + ": '" + r.key("expert_used_count") + "' (" + std::to_string(c->n_expert_used) +
                 ") exceeds '" + r.key("expert_count") + "' (" + std::to_string(c->n_expert) + ")"};
  RILL_ASSIGN_OR_RETURN(c->n_ff_expert, r.positive_or("expert_feed_forward_length", 0));
  RILL_ASSIGN_OR_RETURN(c->n_ff_shared_expert, r.count_or("expert_shared_feed_forward_length", 0));
  c->norm_topk_prob = true;
  if (const GgufValue* norm = file.find(r.key("expert_weights_norm"))) {
    const bool* b = std::get_if<bool>(&norm->v);
    if (!b) return Error{file.path() + ": '" + r.key("expert_weights_norm") + "' must be a boolean"};
    c->norm_topk_prob = *b;
  }
  return Status::Ok();
}

// The hybrid families' `<arch>.ssm.*` keys, written into `raw` under the
// Hugging Face names the model reads (linear_num_key_heads, ...,
// layer_types), as llama.cpp's loader reads them: head_k_dim = state_size,
// head_v_dim = inner_size / time_step_rank, layer il is linear attention
// when attention.recurrent_layers[il] (else when (il + 1) %
// full_attention_interval != 0). Blocks past block_count -
// nextn_predict_layers are multi-token-prediction heads (loader/mtp_layers.h).
Status read_hybrid(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RILL_ASSIGN_OR_RETURN(const int64_t n_nextn, r.count_or("nextn_predict_layers", 0));
  if (n_nextn >= c->n_layer)
    return Error{file.path() + ": '" + r.key("nextn_predict_layers") + "' (" + std::to_string(n_nextn) +
                 ") leaves no decoder layers of '" + r.key("block_count") + "' (" + std::to_string(c->n_layer) + ")"};
  const int64_t n_blocks = c->n_layer;
  c->n_layer -= n_nextn;
  RILL_ASSIGN_OR_RETURN(const int64_t conv_kernel, r.positive("ssm.conv_kernel"));
  RILL_ASSIGN_OR_RETURN(const int64_t head_k_dim, r.positive("ssm.state_size"));
  RILL_ASSIGN_OR_RETURN(const int64_t n_k_heads, r.positive("ssm.group_count"));
  RILL_ASSIGN_OR_RETURN(const int64_t n_v_heads, r.positive("ssm.time_step_rank"));
  RILL_ASSIGN_OR_RETURN(const int64_t inner, r.positive("ssm.inner_size"));
  if (inner % n_v_heads != 0)
    return Error{file.path() + ": '" + r.key("ssm.inner_size") + "' (" + std::to_string(inner) +
                 ") is not a multiple of '" + r.key("ssm.time_step_rank") + "' (" + std::to_string(n_v_heads) + ")"};
  nlohmann::json types = nlohmann::json::array();
  const std::string layers_key = r.key("attention.recurrent_layers");
  if (const GgufArray* a = file.get_array(layers_key)) {
    if (static_cast<int64_t>(a->size()) != n_blocks)
      return Error{file.path() + ": '" + layers_key + "' has " + std::to_string(a->size()) + " entries, expected " +
                   std::to_string(n_blocks) + " ('" + r.key("block_count") + "')"};
    for (int64_t il = 0; il < c->n_layer; ++il) {
      const auto recurrent = (*a)[static_cast<size_t>(il)].as_int();  // bool (or integer)
      if (!recurrent) return Error{file.path() + ": '" + layers_key + "' must hold booleans"};
      types.push_back(*recurrent != 0 ? "linear_attention" : "full_attention");
    }
  } else {
    RILL_ASSIGN_OR_RETURN(const int64_t interval, r.positive_or("full_attention_interval", 4));
    for (int64_t il = 0; il < c->n_layer; ++il)
      types.push_back((il + 1) % interval != 0 ? "linear_attention" : "full_attention");
  }
  c->hidden_act = "silu";
  c->raw["linear_conv_kernel_dim"] = conv_kernel;
  c->raw["linear_key_head_dim"] = head_k_dim;
  c->raw["linear_value_head_dim"] = inner / n_v_heads;
  c->raw["linear_num_key_heads"] = n_k_heads;
  c->raw["linear_num_value_heads"] = n_v_heads;
  c->raw["layer_types"] = std::move(types);
  return Status::Ok();
}

// Blocks past block_count - nextn_predict_layers are multi-token-prediction
// heads: not decoder layers (loader/mtp_layers.h finds them).
Status drop_nextn_layers(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RILL_ASSIGN_OR_RETURN(const int64_t n_nextn, r.count_or("nextn_predict_layers", 0));
  if (n_nextn >= c->n_layer)
    return Error{file.path() + ": '" + r.key("nextn_predict_layers") + "' (" + std::to_string(n_nextn) +
                 ") leaves no decoder layers of '" + r.key("block_count") + "' (" + std::to_string(c->n_layer) + ")"};
  c->n_layer -= n_nextn;
  return Status::Ok();
}

// deepseek2 / glm4moe / glm-dsa: the sigmoid router's keys, written into `raw` under
// the Hugging Face names moe_params() reads (n_routed_experts, n_group,
// topk_group, routed_scaling_factor), with llama.cpp's defaults: no
// renormalisation of the top-k weights without expert_weights_norm, scale
// 1 without expert_weights_scale, the first leading_dense_block_count
// layers dense, expert_shared_count ungated shared experts of the expert
// width. deepseek2 without expert_gating_func routes with a softmax in
// llama.cpp (DeepSeek-V2), which this family does not have.
Status read_routed_moe(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RILL_TRY(drop_nextn_layers(file, r, c));
  RILL_ASSIGN_OR_RETURN(const int64_t n_dense, r.count_or("leading_dense_block_count", 0));
  if (n_dense > c->n_layer)
    return Error{file.path() + ": '" + r.key("leading_dense_block_count") + "' (" + std::to_string(n_dense) +
                 ") exceeds the " + std::to_string(c->n_layer) + " layers"};
  for (int64_t il = 0; il < n_dense; ++il) c->dense_layers.push_back(il);
  if (c->n_expert == 0) return Status::Ok();  // every layer dense
  const std::string gating_key = r.key("expert_gating_func");
  // llama.cpp's glm4moe and glm-dsa route with a sigmoid when the key is absent.
  const bool glm = c->architecture == "glm4_moe" || c->architecture == "glm_moe_dsa";
  RILL_ASSIGN_OR_RETURN(const int64_t gating, r.count_or("expert_gating_func", glm ? 2 : 0));
  if (gating != 2)  // llama_expert_gating_func_type: 1 softmax, 2 sigmoid
    return Error{file.path() + ": '" + gating_key + "' " +
                 (gating == 0 ? "is missing (a softmax router)" : "is " + std::to_string(gating)) +
                 ": only the sigmoid router (2) is supported for " + c->architecture};
  RILL_ASSIGN_OR_RETURN(const int64_t n_shared, r.count_or("expert_shared_count", 0));
  if (c->n_ff_shared_expert == 0) c->n_ff_shared_expert = n_shared * c->n_ff_expert;
  RILL_ASSIGN_OR_RETURN(const int64_t n_group, r.positive_or("expert_group_count", 1));
  RILL_ASSIGN_OR_RETURN(const int64_t topk_group, r.positive_or("expert_group_used_count", 1));
  if (c->n_expert % n_group != 0 || topk_group > n_group)
    return Error{file.path() + ": '" + r.key("expert_group_count") + "' (" + std::to_string(n_group) +
                 ") must divide the experts and be at least '" + r.key("expert_group_used_count") + "'"};
  RILL_ASSIGN_OR_RETURN(const float scale, r.positive_float_or("expert_weights_scale", 1.0f));
  c->norm_topk_prob = false;
  if (const GgufValue* norm = file.find(r.key("expert_weights_norm"))) {
    const bool* b = std::get_if<bool>(&norm->v);
    if (!b) return Error{file.path() + ": '" + r.key("expert_weights_norm") + "' must be a boolean"};
    c->norm_topk_prob = *b;
  }
  c->raw["n_routed_experts"] = c->n_expert;
  c->raw["n_group"] = n_group;
  c->raw["topk_group"] = topk_group;
  c->raw["routed_scaling_factor"] = scale;
  return Status::Ok();
}

// deepseek2 / glm-dsa / minicpm3: the latent attention's keys, written into
// `raw` under the Hugging Face names model/arch/deepseek.cpp reads. deepseek2
// and glm-dsa files declare MQA over the latent (head_count_kv 1, key_length kv_lora +
// rope, value_length kv_lora) and the heads' sizes in *_length_mla (older
// files: key_length / value_length are the heads'); minicpm3 files have
// key_length nope + rope and value_length n_embd / n_head unless given.
// llama.cpp's minicpm3 graph hard-codes MiniCPM3-4B's muP constants
// (scale_emb 12, scale_depth 1.4, dim_model_base 256): no key carries them.
Status read_mla(const GgufFile& file, const ConfigReader& r, std::string_view arch, ModelConfig* c) {
  const bool deepseek = arch == "deepseek2" || arch == "glm-dsa";
  RILL_ASSIGN_OR_RETURN(const int64_t kv_lora, r.positive("attention.kv_lora_rank"));
  RILL_ASSIGN_OR_RETURN(const int64_t q_lora, r.count_or("attention.q_lora_rank", 0));
  RILL_ASSIGN_OR_RETURN(const int64_t rope, r.positive("rope.dimension_count"));
  int64_t k_dim = c->head_dim, v_dim = 0;
  if (deepseek) {
    RILL_ASSIGN_OR_RETURN(const int64_t v_len, r.positive_or("attention.value_length", c->head_dim));
    RILL_ASSIGN_OR_RETURN(k_dim, r.positive_or("attention.key_length_mla", c->head_dim));
    RILL_ASSIGN_OR_RETURN(v_dim, r.positive_or("attention.value_length_mla", v_len));
    if (c->rope_scaling.type != RopeScaling::Type::kNone)
      return Error{file.path() + ": '" + r.key("rope.scaling.type") + "' is not supported for " + std::string(arch) +
                   " files yet"};
  } else {
    RILL_ASSIGN_OR_RETURN(v_dim, r.positive_or("attention.value_length", c->n_embd / c->n_head));
  }
  if (k_dim <= rope)
    return Error{file.path() + ": the head size " + std::to_string(k_dim) + " leaves no non-rotary dims beside '" +
                 r.key("rope.dimension_count") + "' (" + std::to_string(rope) + ")"};
  c->n_head_kv = c->n_head;
  c->head_dim = k_dim;
  c->rope_dim = rope;
  c->raw["model_type"] = c->architecture;
  c->raw["q_lora_rank"] = q_lora > 0 ? nlohmann::json(q_lora) : nlohmann::json(nullptr);
  c->raw["kv_lora_rank"] = kv_lora;
  c->raw["qk_nope_head_dim"] = k_dim - rope;
  c->raw["qk_rope_head_dim"] = rope;
  c->raw["v_head_dim"] = v_dim;
  if (deepseek) {
    c->raw["rope_interleave"] = true;  // llama.cpp's rope type for deepseek2 / glm-dsa: pairs (2i, 2i+1)
  } else {
    c->raw["scale_emb"] = 12;
    c->raw["scale_depth"] = 1.4;
    c->raw["dim_model_base"] = 256;
  }
  return Status::Ok();
}

// minicpm's LongRoPE (MiniCPM 4; rope.scaling.type longrope): the per-pair
// divisors in the tensors rope_factors_short / rope_factors_long (F32
// [rope_dim / 2]), and the context past which llama.cpp takes the long ones,
// rope.scaling.original_context_length or else context_length. No magnitude
// scale (llama.cpp's rope.scaling.attn_factor is refused).
Status read_longrope(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RopeScaling& s = c->rope_scaling;
  const int64_t n = c->rope_dim / 2;
  for (const char* name : {"rope_factors_short.weight", "rope_factors_long.weight"}) {
    const GgufTensorInfo* t = file.find_tensor(name);
    if (!t || t->type != 0 /* F32 */ || t->n_elements() != n || !t->data)
      return Error{file.path() + ": '" + r.key("rope.scaling.type") + "' is longrope, so tensor '" + name +
                   "' must hold " + std::to_string(n) + " F32 factors"};
    std::vector<float>& out = std::string_view(name).starts_with("rope_factors_short") ? s.short_factor : s.long_factor;
    out.resize(static_cast<size_t>(n));
    std::memcpy(out.data(), t->data, static_cast<size_t>(n) * sizeof(float));
    for (float f : out) {
      if (!(f > 0) || !std::isfinite(f))
        return Error{file.path() + ": tensor '" + name + "' must hold positive factors"};
    }
  }
  if (file.find(r.key("rope.scaling.attn_factor")))
    return Error{file.path() + ": '" + r.key("rope.scaling.attn_factor") + "' is not part of MiniCPM's LongRoPE"};
  RILL_ASSIGN_OR_RETURN(s.original_max_position, r.count_or("rope.scaling.original_context_length", c->max_position));
  if (s.original_max_position <= 0)
    return Error{file.path() + ": '" + r.key("rope.scaling.original_context_length") + "' must be positive"};
  return Status::Ok();
}

// minicpm (MiniCPM 1/2/4): the muP scales, written into `raw` under the
// config.json names model/mup_scales.cpp reads: embedding_scale is
// scale_emb, residual_scale is scale_depth / sqrt(n_layer) and logit_scale
// hidden_size / dim_model_base (MiniCPMModel.set_gguf_parameters). Files
// without those keys get MiniCPM-2B's values (scale_emb 12, scale_depth
// 1.4, dim_model_base 256), the numbers llama.cpp's defaults are made of;
// but llama.cpp defaults logit_scale to 256 / n_embd, the inverse of
// hidden_size / dim_model_base, and divides by it, so on such files its
// logits are transformers' times (n_embd / 256)^2 (the same argmax); rill
// keeps transformers'.
Status read_minicpm(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  const auto n_layer = static_cast<double>(c->n_layer), n_embd = static_cast<double>(c->n_embd);
  RILL_ASSIGN_OR_RETURN(const float embedding_scale, r.positive_float_or("embedding_scale", 12.0f));
  RILL_ASSIGN_OR_RETURN(const float residual_scale,
                        r.positive_float_or("residual_scale", static_cast<float>(1.4 / std::sqrt(n_layer))));
  RILL_ASSIGN_OR_RETURN(const float logit_scale, r.positive_float_or("logit_scale", static_cast<float>(n_embd / 256)));
  c->raw["model_type"] = c->architecture;
  c->raw["scale_emb"] = static_cast<double>(embedding_scale);
  c->raw["scale_depth"] = static_cast<double>(residual_scale) * std::sqrt(n_layer);
  c->raw["dim_model_base"] = n_embd / static_cast<double>(logit_scale);
  if (c->rope_scaling.type == RopeScaling::Type::kLongRope) RILL_TRY(read_longrope(file, r, c));
  return Status::Ok();
}

// glm-dsa (GLM-5): the lightning indexer's keys, written into `raw` under
// the Hugging Face names model/arch/deepseek_config.cpp reads (index_n_heads,
// index_head_dim, index_topk, indexer_types), as llama.cpp's glm-dsa reads
// them: attention.indexer.types lists per decoder layer true ("full": the
// layer has an indexer) or false ("shared": it reuses the selection of the
// full layer before it), or one boolean for all; without it, files of a
// context_length below 2^20 (GLM-5, 5.1) have an indexer on every layer and
// longer ones GLM-5.2's pattern (full on layers 0, 1 and every fourth from
// 2, up to layer 77).
Status read_dsa(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  RILL_ASSIGN_OR_RETURN(const int64_t n_head, r.positive("attention.indexer.head_count"));
  RILL_ASSIGN_OR_RETURN(const int64_t head_dim, r.positive("attention.indexer.key_length"));
  RILL_ASSIGN_OR_RETURN(const int64_t topk, r.positive("attention.indexer.top_k"));
  if (head_dim < c->rope_dim)
    return Error{file.path() + ": '" + r.key("attention.indexer.key_length") + "' (" + std::to_string(head_dim) +
                 ") is below '" + r.key("rope.dimension_count") + "' (" + std::to_string(c->rope_dim) +
                 "): the indexer rotates that many dims"};
  std::vector<bool> full(static_cast<size_t>(c->n_layer), true);
  const std::string types_key = r.key("attention.indexer.types");
  if (const GgufValue* types = file.find(types_key)) {
    const GgufArray* a = types->as_array();
    if (a && a->size() != full.size())
      return Error{file.path() + ": '" + types_key + "' has " + std::to_string(a->size()) + " entries, expected " +
                   std::to_string(full.size()) + " (one per decoder layer)"};
    for (size_t il = 0; il < full.size(); ++il) {
      const GgufValue& v = a ? (*a)[il] : *types;
      const auto b = v.as_int();  // a boolean (or an integer)
      if (!b) return Error{file.path() + ": '" + types_key + "' must hold booleans"};
      full[il] = *b != 0;
    }
    if (!full.empty() && !full[0])
      return Error{file.path() + ": '" + types_key + "' makes layer 0 shared (it has no full layer before it)"};
  } else if (c->max_position >= (int64_t{1} << 20)) {
    for (size_t il = 0; il < full.size(); ++il) full[il] = il < 2 || (il < 78 && (il - 2) % 4 == 0);
  }
  nlohmann::json names = nlohmann::json::array();
  for (const bool f : full) names.push_back(f ? "full" : "shared");
  c->raw["index_n_heads"] = n_head;
  c->raw["index_head_dim"] = head_dim;
  c->raw["index_topk"] = topk;
  c->raw["indexer_types"] = std::move(names);
  return Status::Ok();
}

// Gemma 4: the per-layer keys, written into `raw` under the Hugging Face
// names model/arch/gemma_config.cpp reads (layer_types, per_layer_config,
// num_kv_shared_layers, hidden_size_per_layer_input, attention_k_eq_v,
// enable_moe_block, rope_parameters), as llama.cpp reads them: key_length
// and head_count_kv (an array, or one count) of the full layers,
// key_length_swa of the sliding ones; K is V on full layers without
// attn_v; the full layers' proportional RoPE is rope_freqs (factor 1 on
// the rotated pairs, 1e30 on the rest: llama.cpp rotates every pair by
// pos * theta / factor, so those stay put).
Status read_gemma4(const GgufFile& file, const ConfigReader& r, ModelConfig* c) {
  const std::string pattern_key = r.key("attention.sliding_window_pattern");
  const GgufArray* pattern = file.get_array(pattern_key);
  if (!pattern || static_cast<int64_t>(pattern->size()) != c->n_layer)
    return Error{file.path() + ": '" + pattern_key + "' must list " + std::to_string(c->n_layer) + " booleans"};
  std::vector<bool> sliding;
  for (const GgufValue& v : *pattern) {
    const bool* b = std::get_if<bool>(&v.v);
    if (!b) return Error{file.path() + ": '" + pattern_key + "' must list booleans"};
    sliding.push_back(*b);
  }
  RILL_ASSIGN_OR_RETURN(const int64_t hd_full, r.positive("attention.key_length"));
  RILL_ASSIGN_OR_RETURN(const int64_t hd_swa, r.positive("attention.key_length_swa"));
  RILL_ASSIGN_OR_RETURN(const int64_t rope_swa, r.positive_or("rope.dimension_count_swa", hd_swa));
  if (rope_swa != hd_swa)
    return Error{file.path() + ": '" + r.key("rope.dimension_count_swa") + "' must be the sliding head size"};
  std::vector<int64_t> n_kv(sliding.size(), c->n_head_kv);
  const std::string kv_key = r.key("attention.head_count_kv");
  if (const GgufArray* kv = file.get_array(kv_key)) {
    if (kv->size() != sliding.size())
      return Error{file.path() + ": '" + kv_key + "' must list " + std::to_string(sliding.size()) + " counts"};
    for (size_t il = 0; il < kv->size(); ++il) {
      const auto n = (*kv)[il].as_int();
      if (!n || *n <= 0) return Error{file.path() + ": '" + kv_key + "' must list positive counts"};
      n_kv[il] = *n;
    }
  }
  nlohmann::json types = nlohmann::json::array(), per_layer = nlohmann::json::object();
  int64_t first_full = -1;
  for (size_t il = 0; il < sliding.size(); ++il) {
    types.push_back(sliding[il] ? "sliding_attention" : "full_attention");
    if (sliding[il]) continue;
    if (first_full < 0) first_full = static_cast<int64_t>(il);
    per_layer[std::to_string(il)] = {{"head_dim", hd_full}, {"num_key_value_heads", n_kv[il]}};
  }
  // The sliding layers' count is the model's (HF num_key_value_heads).
  const auto first_sliding = static_cast<size_t>(std::find(sliding.begin(), sliding.end(), true) - sliding.begin());
  const int64_t n_kv_swa = first_sliding < sliding.size() ? n_kv[first_sliding] : n_kv[0];
  for (size_t il = 0; il < sliding.size(); ++il) {
    if (sliding[il] && n_kv[il] != n_kv_swa)
      return Error{file.path() + ": '" + kv_key + "' differs between sliding layers"};
  }
  c->head_dim = hd_swa;
  c->rope_dim = hd_swa;
  c->n_head_kv = n_kv_swa;
  c->hidden_act = "gelu_pytorch_tanh";
  // The full layers' RoPE: the pairs of factor 1 rotate, those of 1e30 do not.
  double partial = 1.0;
  if (first_full >= 0) {
    const GgufTensorInfo* freqs = file.find_tensor("rope_freqs.weight");
    if (!freqs || freqs->type != 0 /* F32 */ || freqs->n_elements() != hd_full / 2 || !freqs->data)
      return Error{file.path() + ": tensor 'rope_freqs.weight' must hold " + std::to_string(hd_full / 2) +
                   " F32 factors (the full layers' RoPE)"};
    int64_t n_rot = 0;
    for (int64_t i = 0; i < hd_full / 2; ++i) {
      float f = 0;
      std::memcpy(&f, freqs->data + i * 4, 4);
      if (f == 1.0f && n_rot == i) {
        ++n_rot;
      } else if (!(f >= 1e29f)) {
        return Error{file.path() + ": 'rope_freqs.weight' must be 1 on the first pairs and 1e30 on the rest"};
      }
    }
    partial = static_cast<double>(2 * n_rot) / static_cast<double>(hd_full);
  }
  c->rope_scaling = RopeScaling{};
  c->rope_scaling.type = RopeScaling::Type::kProportional;
  RILL_ASSIGN_OR_RETURN(const float theta_swa, r.positive_float_or("rope.freq_base_swa", 10000.0f));
  RILL_ASSIGN_OR_RETURN(const int64_t n_shared, r.count_or("attention.shared_kv_layers", 0));
  RILL_ASSIGN_OR_RETURN(const int64_t ple_dim, r.count_or("embedding_length_per_layer_input", 0));
  const bool k_eq_v = first_full >= 0 && !file.find_tensor("blk." + std::to_string(first_full) + ".attn_v.weight") &&
                      file.find_tensor("blk." + std::to_string(first_full) + ".attn_k.weight");
  c->raw["layer_types"] = std::move(types);
  c->raw["per_layer_config"] = std::move(per_layer);
  c->raw["num_kv_shared_layers"] = n_shared;
  c->raw["hidden_size_per_layer_input"] = ple_dim;
  c->raw["vocab_size_per_layer_input"] = c->n_vocab;
  c->raw["attention_k_eq_v"] = k_eq_v;
  c->raw["enable_moe_block"] = c->n_expert > 0;
  c->raw["final_logit_softcapping"] = c->raw.value(r.key("final_logit_softcapping"), nlohmann::json(nullptr));
  c->raw["rope_parameters"] = {
      {"full_attention",
       {{"rope_type", "proportional"}, {"partial_rotary_factor", partial}, {"rope_theta", c->rope_theta}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", theta_swa}}}};
  return Status::Ok();
}

}  // namespace

std::optional<std::string> gguf_to_hf_tensor_name(std::string_view name, std::string_view arch) {
  for (const auto& p : kGlobalNames)
    if (name == p.gguf) return std::string(p.hf);
  if (arch == "gemma4") {
    for (const auto& p : kGemma4GlobalNames)
      if (name == p.gguf) return std::string(p.hf);
  }
  constexpr std::string_view kBlk = "blk.";
  if (!name.starts_with(kBlk)) return std::nullopt;
  std::string_view rest = name.substr(kBlk.size());
  size_t n_digits = 0;
  while (n_digits < rest.size() && rest[n_digits] >= '0' && rest[n_digits] <= '9') ++n_digits;
  // A layer index is 1-9 digits without leading zeros, so every canonical name is unique.
  if (n_digits == 0 || n_digits > 9 || (n_digits > 1 && rest[0] == '0')) return std::nullopt;
  if (n_digits >= rest.size() || rest[n_digits] != '.') return std::nullopt;
  const std::string_view layer = rest.substr(0, n_digits);
  const std::string_view suffix = rest.substr(n_digits + 1);
  if (arch == "gemma4") {
    for (const auto& p : kGemma4LayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (is_gemma(arch)) {
    for (const auto& p : kGemmaLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (arch == "gpt-oss") {
    for (const auto& p : kGptOssLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (is_mla(arch)) {
    for (const auto& p : kMlaLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (arch == "glm-dsa") {
    for (const auto& p : kDsaLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (is_routed_moe(arch)) {
    for (const auto& p : kRoutedMoeLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  if (is_hybrid(arch)) {
    for (const auto& p : kHybridLayerNames) {
      if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
    }
  }
  for (const auto& p : kNextnNames) {
    if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
  }
  for (const auto& p : kLayerNames) {
    if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
  }
  for (const auto& p : kMoeLayerNames) {
    if (suffix == p.gguf) return "model.layers." + std::string(layer) + "." + std::string(p.hf);
  }
  for (const auto& p : kPerExpertNames) {
    if (!suffix.starts_with(p.gguf)) continue;
    const std::string_view tail = suffix.substr(p.gguf.size());  // "<e>.weight"
    const size_t dot = tail.find('.');
    if (dot == 0 || dot == std::string_view::npos || dot > 9 || tail.substr(dot) != ".weight" ||
        (dot > 1 && tail[0] == '0'))
      return std::nullopt;
    for (size_t i = 0; i < dot; ++i)
      if (tail[i] < '0' || tail[i] > '9') return std::nullopt;
    return "model.layers." + std::string(layer) + ".mlp.experts." + std::string(tail.substr(0, dot)) + "." +
           std::string(p.hf);
  }
  return std::nullopt;
}

Result<ModelConfig> gguf_model_config(const GgufFile& file) {
  auto arch_name = file.get_string("general.architecture");
  if (!arch_name) return Error{file.path() + ": missing metadata key 'general.architecture'"};
  const ArchInfo* arch = nullptr;
  for (const auto& a : kArchs)
    if (*arch_name == a.gguf) arch = &a;
  if (!arch) return Error{file.path() + ": unsupported architecture '" + *arch_name + "'"};

  ModelConfig c;
  c.architecture = std::string(arch->hf);
  c.rope_style = arch->rope_style;
  const ConfigReader r(file, *arch_name);

  RILL_ASSIGN_OR_RETURN(c.n_embd, r.positive("embedding_length"));
  RILL_ASSIGN_OR_RETURN(c.n_layer, r.positive("block_count"));
  if (c.n_layer > kMaxLayers)
    return Error{file.path() + ": '" + r.key("block_count") + "' (" + std::to_string(c.n_layer) + ") exceeds " +
                 std::to_string(kMaxLayers) + " layers"};
  RILL_ASSIGN_OR_RETURN(c.n_head, r.positive("attention.head_count"));
  if (const GgufArray* kv = file.get_array(r.key("attention.head_count_kv")); kv && *arch_name == "gemma4") {
    c.n_head_kv = c.n_head;  // per layer: read_gemma4 reads the array
  } else {
    RILL_ASSIGN_OR_RETURN(c.n_head_kv, r.positive_or("attention.head_count_kv", c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0)
    return Error{file.path() + ": attention.head_count " + std::to_string(c.n_head) +
                 " is not a multiple of head_count_kv " + std::to_string(c.n_head_kv)};
  RILL_ASSIGN_OR_RETURN(c.head_dim, r.positive_or("attention.key_length", c.n_embd / c.n_head));
  if (c.head_dim <= 0)
    return Error{file.path() + ": embedding_length " + std::to_string(c.n_embd) + " is smaller than head_count " +
                 std::to_string(c.n_head)};
  RILL_TRY(read_experts(file, r, &c));
  if (c.n_expert > 0) {  // every FFN may be a mixture of experts
    RILL_ASSIGN_OR_RETURN(c.n_ff, r.positive_or("feed_forward_length", 0));
  } else {
    RILL_ASSIGN_OR_RETURN(c.n_ff, r.positive("feed_forward_length"));
  }
  if (c.n_expert > 0 && c.n_ff_expert == 0) {
    if (c.n_ff == 0) return Error{file.path() + ": missing metadata key '" + r.key("expert_feed_forward_length") + "'"};
    c.n_ff_expert = c.n_ff;
  }
  RILL_ASSIGN_OR_RETURN(c.max_position, r.positive("context_length"));
  RILL_ASSIGN_OR_RETURN(c.rms_norm_eps, r.positive_float_or("attention.layer_norm_rms_epsilon", 1e-5f));
  RILL_ASSIGN_OR_RETURN(c.rope_theta, r.positive_float_or("rope.freq_base", 10000.0f));
  RILL_ASSIGN_OR_RETURN(c.rope_dim, r.positive_or("rope.dimension_count", c.head_dim));
  if (c.rope_dim > c.head_dim)
    return Error{file.path() + ": rope.dimension_count " + std::to_string(c.rope_dim) + " exceeds the head size " +
                 std::to_string(c.head_dim)};
  // llama3-style rope scaling is baked into the 'rope_freqs.weight' tensor by
  // the converter, so it needs no RopeScaling here.
  RILL_TRY(read_rope_scaling(file, r, *arch_name, &c.rope_scaling));
  RILL_ASSIGN_OR_RETURN(c.sliding_window, r.count_or("attention.sliding_window", 0));

  // n_vocab: the explicit key, else the token list, else the embedding's rows.
  if (file.find(r.key("vocab_size"))) {
    RILL_ASSIGN_OR_RETURN(c.n_vocab, r.positive("vocab_size"));
  } else if (const GgufArray* tokens = file.get_array("tokenizer.ggml.tokens"); tokens && !tokens->empty()) {
    c.n_vocab = static_cast<int64_t>(tokens->size());
  } else if (const GgufTensorInfo* embd = file.find_tensor("token_embd.weight");
             embd && embd->ne.size() == 2 && embd->ne[1] > 0) {
    c.n_vocab = embd->ne[1];
  } else {
    return Error{file.path() + ": cannot tell the vocabulary size (no '" + r.key("vocab_size") +
                 "', tokenizer.ggml.tokens or token_embd.weight)"};
  }
  c.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;

  c.generation.bos_token_id = token_id(file, "tokenizer.ggml.bos_token_id");
  if (auto eos = token_id(file, "tokenizer.ggml.eos_token_id")) c.generation.eos_token_ids.push_back(*eos);
  // Chat models often end a turn with a separate end-of-turn token.
  if (auto eot = token_id(file, "tokenizer.ggml.eot_token_id");
      eot && (c.generation.eos_token_ids.empty() || c.generation.eos_token_ids[0] != *eot))
    c.generation.eos_token_ids.push_back(*eot);

  c.raw = nlohmann::json::object();
  for (const auto& [key, value] : file.metadata()) {
    if (const GgufArray* a = value.as_array(); a && a->size() > kMaxRawArray) continue;
    c.raw[valid_utf8(key)] = to_json(value);
  }
  if (is_hybrid(*arch_name)) RILL_TRY(read_hybrid(file, r, &c));
  if (is_routed_moe(*arch_name)) RILL_TRY(read_routed_moe(file, r, &c));
  if (is_mla(*arch_name)) RILL_TRY(read_mla(file, r, *arch_name, &c));
  if (*arch_name == "glm-dsa") RILL_TRY(read_dsa(file, r, &c));
  if (*arch_name == "minicpm") RILL_TRY(read_minicpm(file, r, &c));
  if (*arch_name == "gemma4") RILL_TRY(read_gemma4(file, r, &c));
  return c;
}

}  // namespace rill
