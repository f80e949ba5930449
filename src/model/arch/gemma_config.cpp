#include "model/arch/gemma_config.h"

#include <cmath>
#include <optional>

#include "model/layers.h"

namespace rill {
namespace {

using nlohmann::json;

// HF multimodal wrappers keep the language model's fields in text_config.
const json& text_config(const json& raw) {
  auto tc = raw.find("text_config");
  if (tc != raw.end() && tc->is_object() && !raw.contains("hidden_size")) return *tc;
  return raw;
}

// A number field; nullopt when absent or null.
Result<std::optional<double>> number(const json& obj, const std::string& key, const std::string& file) {
  if (!obj.is_object()) return std::optional<double>{};
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>{};
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    return Error{file + ": '" + key + "' must be a finite number"};
  }
  return std::optional<double>{it->get<double>()};
}

// Layer i is full when (i + 1) % pattern == 0 (Gemma's published layouts).
std::vector<bool> pattern_layers(int64_t n_layer, int64_t pattern) {
  std::vector<bool> s(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < n_layer; ++i) s[static_cast<size_t>(i)] = pattern <= 0 || (i + 1) % pattern != 0;
  return s;
}

Result<GemmaParams> read_hf_params(const ModelConfig& c, const std::string& file) {
  const json& t = text_config(c.raw);
  const bool gemma2 = c.architecture == "gemma2";
  GemmaParams p;
  p.norm_offset = 1.0f;
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu_tanh") {
    return Error{file + ": hidden_activation '" + c.hidden_act + "' is not supported (gelu_pytorch_tanh)"};
  }
  if (auto lt = t.find("layer_types"); lt != t.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.n_layer) {
      return Error{file + ": 'layer_types' must list " + std::to_string(c.n_layer) + " layer types"};
    }
    for (const json& e : *lt) {
      if (e == "sliding_attention") {
        p.sliding.push_back(true);
      } else if (e == "full_attention") {
        p.sliding.push_back(false);
      } else {
        return Error{file + ": layer type " + e.dump() + " is not supported (sliding_attention, full_attention)"};
      }
    }
  } else {
    RILL_ASSIGN_OR_RETURN(auto pattern, number(t, "sliding_window_pattern", file));
    if (!pattern) {
      RILL_ASSIGN_OR_RETURN(pattern, number(t, "_sliding_window_pattern", file));
    }
    p.sliding = pattern_layers(c.n_layer, pattern ? static_cast<int64_t>(*pattern) : gemma2 ? 2 : 6);
  }
  RILL_ASSIGN_OR_RETURN(auto scalar, number(t, "query_pre_attn_scalar", file));
  p.query_pre_attn_scalar = static_cast<float>(scalar.value_or(static_cast<double>(c.head_dim)));
  RILL_ASSIGN_OR_RETURN(auto attn_cap, number(t, "attn_logit_softcapping", file));
  RILL_ASSIGN_OR_RETURN(auto final_cap, number(t, "final_logit_softcapping", file));
  p.attn_softcap = static_cast<float>(attn_cap.value_or(0));
  p.final_softcap = static_cast<float>(final_cap.value_or(0));
  // Local RoPE base: v5 rope_parameters.sliding_attention, v4
  // rope_local_base_freq; gemma2 has one base for every layer.
  p.local_rope_theta = c.rope_theta;
  if (!gemma2) {
    std::optional<double> local;
    if (auto rp = t.find("rope_parameters"); rp != t.end() && rp->is_object()) {
      if (auto sl = rp->find("sliding_attention"); sl != rp->end() && sl->is_object()) {
        RILL_ASSIGN_OR_RETURN(local, number(*sl, "rope_theta", file));
      }
    }
    if (!local) {
      RILL_ASSIGN_OR_RETURN(local, number(t, "rope_local_base_freq", file));
    }
    p.local_rope_theta = static_cast<float>(local.value_or(10000.0));
  }
  return p;
}

// GGUF: keys as llama.cpp writes and reads them. llama.cpp derives the
// query scale from the model size (the 27B models use n_embd / n_head, the
// others head_dim: google's published configs) and fixes gemma3's local
// RoPE base to 10000 and its pattern to 6 when the file does not say.
Result<GemmaParams> read_gguf_params(const ModelConfig& c, const std::string& file) {
  const json& raw = c.raw;
  const std::string arch = raw.value("general.architecture", std::string());
  const bool gemma2 = arch == "gemma2";
  GemmaParams p;
  p.norm_offset = 0.0f;
  int64_t pattern = gemma2 ? 2 : 6;
  if (auto it = raw.find(arch + ".attention.sliding_window_pattern"); it != raw.end()) {
    if (it->is_array() && static_cast<int64_t>(it->size()) == c.n_layer) {
      for (const json& e : *it) p.sliding.push_back(e.is_boolean() && e.get<bool>());
    } else if (it->is_number_integer()) {
      pattern = it->get<int64_t>();
    } else {
      return Error{file + ": '" + arch + ".attention.sliding_window_pattern' must be an integer or " +
                   std::to_string(c.n_layer) + " booleans"};
    }
  }
  if (p.sliding.empty()) p.sliding = pattern_layers(c.n_layer, pattern);
  const bool is_27b = (gemma2 && c.n_layer == 46) || (!gemma2 && c.n_layer == 62);
  p.query_pre_attn_scalar = static_cast<float>(is_27b ? c.n_embd / c.n_head : c.head_dim);
  RILL_ASSIGN_OR_RETURN(auto attn_cap, number(raw, arch + ".attn_logit_softcapping", file));
  RILL_ASSIGN_OR_RETURN(auto final_cap, number(raw, arch + ".final_logit_softcapping", file));
  p.attn_softcap = static_cast<float>(attn_cap.value_or(0));
  p.final_softcap = static_cast<float>(final_cap.value_or(0));
  RILL_ASSIGN_OR_RETURN(auto local, number(raw, arch + ".rope.freq_base_swa", file));
  p.local_rope_theta = gemma2 ? c.rope_theta : static_cast<float>(local.value_or(10000.0));
  return p;
}

}  // namespace

Result<GemmaParams> read_gemma_params(const ModelFiles& f) {
  GemmaParams p;
  if (f.format == ModelFormat::kGguf) {
    RILL_ASSIGN_OR_RETURN(p, read_gguf_params(f.config, f.path));
  } else {
    RILL_ASSIGN_OR_RETURN(p, read_hf_params(f.config, f.path + "/config.json"));
  }
  if (!(p.query_pre_attn_scalar > 0) || p.attn_softcap < 0 || p.final_softcap < 0) {
    return Error{f.path + ": query_pre_attn_scalar must be positive and the logit softcaps non-negative"};
  }
  return p;
}

GemmaNames gemma_tensor_names(const ModelFiles& f) {
  GemmaNames n;
  if (f.find("model.language_model.embed_tokens.weight")) {
    n.base = "model.language_model.";
  } else if (f.find("language_model.model.embed_tokens.weight")) {
    n.base = "language_model.model.";
    n.head = "language_model.lm_head.weight";
  }
  return n;
}

Status bind_gemma_layer(const ModelFiles& f, const GemmaNames& names, int64_t il, const GemmaLayerDims& d,
                        GemmaLayerWeights& L) {
  const std::string p = names.base + "layers." + std::to_string(il) + ".";
  const int64_t E = d.n_embd;
  RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", d.q_width, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", d.kv_width, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", d.kv_width, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", E, d.q_width, Bias::kOptional));
  if (f.find(p + "self_attn.q_norm.weight")) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", d.head_dim));
    RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", d.head_dim));
  }
  RILL_ASSIGN_OR_RETURN(L.post_attn_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "pre_feedforward_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.post_ffn_norm, load_vector(f, p + "post_feedforward_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, p + "mlp.gate_proj", d.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, p + "mlp.up_proj", d.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, p + "mlp.down_proj", E, d.n_ff));
  return {};
}

GemmaRope gemma_rope_tables(const ModelFiles& f, const GemmaParams& p, int64_t hd) {
  const ModelConfig& c = f.config;
  const cpu::RopeScalingParams rs = rope_scaling_params(c.rope_scaling);
  const bool interleaved = c.rope_style == RopeStyle::kInterleaved;
  const bool gemma2 = c.architecture == "gemma2";
  GemmaRope r;
  r.global = cpu::make_rope_table(c.rope_theta, hd, interleaved, rs);
  r.local = gemma2 ? r.global : cpu::make_rope_table(p.local_rope_theta, hd, interleaved);
  if (f.format == ModelFormat::kGguf) {
    // Angles as llama.cpp builds them for GGUF files (see llama.cpp in this folder).
    const float d = -2.0f / static_cast<float>(hd);
    if (c.rope_scaling.type == RopeScaling::Type::kNone) r.global.ggml_theta_scale = std::pow(c.rope_theta, d);
    if (gemma2) {
      r.local = r.global;
    } else {
      r.local.ggml_theta_scale = std::pow(p.local_rope_theta, d);
    }
  }
  return r;
}

}  // namespace rill
