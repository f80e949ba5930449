#include "model/arch/gemma_config.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <string>

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

// A non-negative integer field; nullopt when absent or null.
Result<std::optional<int64_t>> count(const json& obj, const std::string& key, const std::string& file) {
  if (!obj.is_object()) return std::optional<int64_t>{};
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>{};
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (int64_t{1} << 30)) {
    return Error{file + ": '" + key + "' must be a non-negative integer"};
  }
  return std::optional<int64_t>{it->get<int64_t>()};
}

// Gemma 4's fields beyond gemma3's (transformers' Gemma4TextConfig): per
// layer head_dim and KV heads (global_head_dim / num_global_key_value_heads
// for full layers, or per_layer_config's overrides by layer index), KV
// sharing, K as V, per-layer embeddings, the MoE block, the full layers'
// proportional RoPE.
Status read_gemma4_params(const ModelConfig& c, const json& t, const std::string& file, GemmaParams& p) {
  const auto L = static_cast<size_t>(c.n_layer);
  p.gemma4 = true;
  p.norm_offset = 0.0f;
  p.query_pre_attn_scalar = 1.0f;  // attention scale 1
  if (auto b = t.find("attention_k_eq_v"); b != t.end() && !b->is_null()) {
    if (!b->is_boolean()) return Error{file + ": 'attention_k_eq_v' must be a boolean"};
    p.k_eq_v = b->get<bool>();
  }
  if (auto b = t.find("enable_moe_block"); b != t.end() && !b->is_null()) {
    if (!b->is_boolean()) return Error{file + ": 'enable_moe_block' must be a boolean"};
    p.moe = b->get<bool>();
  }
  bool double_wide = false;
  if (auto b = t.find("use_double_wide_mlp"); b != t.end() && !b->is_null()) {
    if (!b->is_boolean()) return Error{file + ": 'use_double_wide_mlp' must be a boolean"};
    double_wide = b->get<bool>();
  }
  if (auto b = t.find("use_bidirectional_attention"); b != t.end() && !b->is_null() && *b != "none") {
    return Error{file + ": 'use_bidirectional_attention' " + b->dump() + " is not supported (null)"};
  }
  RILL_ASSIGN_OR_RETURN(auto global_hd, count(t, "global_head_dim", file));
  RILL_ASSIGN_OR_RETURN(auto global_kv, count(t, "num_global_key_value_heads", file));
  p.head_dim.assign(L, c.head_dim);
  p.n_head_kv.assign(L, c.n_head_kv);
  for (size_t il = 0; il < L; ++il) {
    if (p.sliding[il]) continue;
    if (global_hd && *global_hd > 0) p.head_dim[il] = *global_hd;
    if (p.k_eq_v && global_kv && *global_kv > 0) p.n_head_kv[il] = *global_kv;
  }
  if (auto plc = t.find("per_layer_config"); plc != t.end() && !plc->is_null()) {
    if (!plc->is_object()) return Error{file + ": 'per_layer_config' must be an object keyed by layer index"};
    for (auto it = plc->begin(); it != plc->end(); ++it) {
      size_t il = 0;
      try {
        size_t used = 0;
        il = static_cast<size_t>(std::stoul(it.key(), &used));
        if (used != it.key().size()) il = L;
      } catch (const std::exception&) {
        il = L;
      }
      const std::string where = "per_layer_config." + it.key();
      if (il >= L || !it->is_object()) {
        return Error{file + ": '" + where + "' must name a layer below " + std::to_string(L) + " with an object"};
      }
      for (auto f = it->begin(); f != it->end(); ++f) {
        if (f.key() != "head_dim" && f.key() != "num_key_value_heads" && f.key() != "num_attention_heads") {
          return Error{file + ": '" + where + "." + f.key() + "' is not supported (head_dim, num_key_value_heads)"};
        }
      }
      RILL_ASSIGN_OR_RETURN(auto hd, count(*it, "head_dim", file));
      RILL_ASSIGN_OR_RETURN(auto kv, count(*it, "num_key_value_heads", file));
      RILL_ASSIGN_OR_RETURN(auto nh, count(*it, "num_attention_heads", file));
      if (nh && *nh != c.n_head) return Error{file + ": '" + where + ".num_attention_heads' must equal the model's"};
      if (hd) p.head_dim[il] = *hd;
      if (kv) p.n_head_kv[il] = *kv;
    }
  }
  for (size_t il = 0; il < L; ++il) {
    if (p.head_dim[il] <= 0 || p.head_dim[il] % 2 != 0 || p.n_head_kv[il] <= 0 || c.n_head % p.n_head_kv[il] != 0) {
      return Error{file + ": layer " + std::to_string(il) + " has head_dim " + std::to_string(p.head_dim[il]) +
                   " and " + std::to_string(p.n_head_kv[il]) + " KV heads (even, dividing " + std::to_string(c.n_head) +
                   " heads)"};
    }
  }
  // KV sharing: the last num_kv_shared_layers layers read the KV of the last
  // earlier layer of their kind.
  RILL_ASSIGN_OR_RETURN(auto n_shared, count(t, "num_kv_shared_layers", file));
  const size_t first_shared = L - std::min<size_t>(L, static_cast<size_t>(n_shared.value_or(0)));
  p.kv_donor.resize(L);
  p.n_ff.assign(L, c.n_ff);
  for (size_t il = 0; il < L; ++il) {
    p.kv_donor[il] = static_cast<int64_t>(il);
    if (il < first_shared) continue;
    int64_t donor = -1;
    for (size_t j = 0; j < first_shared; ++j) donor = p.sliding[j] == p.sliding[il] ? static_cast<int64_t>(j) : donor;
    if (donor < 0) {
      return Error{file + ": KV-shared layer " + std::to_string(il) + " has no earlier layer of its kind"};
    }
    const auto d = static_cast<size_t>(donor);
    if (p.head_dim[d] != p.head_dim[il] || p.n_head_kv[d] != p.n_head_kv[il]) {
      return Error{file + ": KV-shared layer " + std::to_string(il) + " and layer " + std::to_string(donor) +
                   " differ in head_dim or KV heads"};
    }
    p.kv_donor[il] = donor;
    if (double_wide && first_shared > 0) p.n_ff[il] = 2 * c.n_ff;
  }
  RILL_ASSIGN_OR_RETURN(auto ple_dim, count(t, "hidden_size_per_layer_input", file));
  RILL_ASSIGN_OR_RETURN(auto ple_vocab, count(t, "vocab_size_per_layer_input", file));
  p.ple_dim = ple_dim.value_or(0);
  p.ple_vocab = ple_vocab.value_or(c.n_vocab);
  if (p.ple_dim > 0 && p.ple_vocab <= 0) return Error{file + ": 'vocab_size_per_layer_input' must be positive"};
  // Full layers' RoPE (v5 rope_parameters.full_attention; ModelConfig read
  // its base and type): proportional rotates int(partial * head_dim / 2)
  // pairs (transformers' _compute_proportional_rope_parameters).
  double partial = 1.0;
  bool proportional = c.rope_scaling.type == RopeScaling::Type::kProportional;
  if (auto rp = t.find("rope_parameters"); rp != t.end() && rp->is_object()) {
    if (auto fa = rp->find("full_attention"); fa != rp->end() && fa->is_object()) {
      RILL_ASSIGN_OR_RETURN(auto pf, number(*fa, "partial_rotary_factor", file));
      partial = pf.value_or(1.0);
    }
    if (auto sa = rp->find("sliding_attention"); sa != rp->end() && sa->is_object()) {
      RILL_ASSIGN_OR_RETURN(auto pf, number(*sa, "partial_rotary_factor", file));
      auto type = sa->find("rope_type");
      if ((pf && *pf != 1.0) || (type != sa->end() && *type != "default")) {
        return Error{file + ": rope_parameters.sliding_attention must be default RoPE over the whole head"};
      }
    }
  }
  if (!(partial > 0 && partial <= 1)) return Error{file + ": partial_rotary_factor must be in (0, 1]"};
  int64_t full_hd = 0;
  for (size_t il = 0; il < L; ++il) {
    if (p.sliding[il]) continue;
    if (full_hd != 0 && p.head_dim[il] != full_hd) return Error{file + ": full layers differ in head_dim"};
    full_hd = p.head_dim[il];
  }
  for (size_t il = 0; il < L; ++il) {
    if (p.sliding[il] && p.head_dim[il] != c.head_dim) return Error{file + ": sliding layers differ in head_dim"};
  }
  if (proportional) {
    p.global_rope_pairs = static_cast<int64_t>(partial * static_cast<double>(full_hd) / 2.0);
    p.global_rope_factor = c.rope_scaling.factor;
  } else if (c.rope_scaling.type != RopeScaling::Type::kNone || partial != 1.0 || (full_hd && full_hd != c.head_dim)) {
    return Error{file + ": the full layers' RoPE must be proportional, or default over head_dim " +
                 std::to_string(c.head_dim)};
  } else {
    p.global_rope_pairs = full_hd / 2;
  }
  return Status::Ok();
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
  if (c.architecture == "gemma4_text" || c.architecture == "gemma4") {
    RILL_TRY(read_gemma4_params(c, t, file, p));
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
  if (f.format == ModelFormat::kGguf && f.config.architecture == "gemma4_text") {
    // loader/gguf_names.cpp wrote the Hugging Face fields from llama.cpp's keys.
    RILL_ASSIGN_OR_RETURN(p, read_hf_params(f.config, f.path));
  } else if (f.format == ModelFormat::kGguf) {
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

namespace {

// Gemma 4's MoE block under the layer prefix p: router.{proj.weight [X,
// E], scale [E], per_expert_scale [X]}, experts.gate_up_proj [X, 2 F, E]
// (gate rows, then up rows) and experts.down_proj [X, E, F] as transformers
// saves them, and the block's three norms.
Status bind_gemma4_moe(const ModelFiles& f, const std::string& p, const MoeParams& mp, GemmaLayerWeights& L) {
  const int64_t E = mp.n_embd, X = mp.n_expert, F = mp.n_ff;
  MoeWeights w;
  RILL_ASSIGN_OR_RETURN(w.router, bind_linear(f, p + "router.proj", X, E));
  RILL_ASSIGN_OR_RETURN(w.expert_scale, load_vector(f, p + "router.per_expert_scale", X));
  RILL_ASSIGN_OR_RETURN(L.router_norm, load_vector(f, p + "router.scale", E));
  const float root = 1.0f / std::sqrt(static_cast<float>(E));
  for (float& v : L.router_norm) v *= root;
  RILL_ASSIGN_OR_RETURN(const TensorRef* gu, f.require(p + "experts.gate_up_proj", {X, 2 * F, E}));
  RILL_ASSIGN_OR_RETURN(const TensorRef* dn, f.require(p + "experts.down_proj", {X, E, F}));
  for (const TensorRef* t : {gu, dn}) {
    if (dtype_info(t->dtype).block_size != 1) {
      return Error{t->file + ": tensor '" + t->name + "' must be F32, F16 or BF16"};
    }
  }
  auto slice = [](const TensorRef& t, int64_t row0, int64_t n_rows, int64_t n_cols) {
    WeightView v;
    v.dtype = t.dtype;
    v.n_rows = n_rows;
    v.n_cols = n_cols;
    v.row_stride = row_bytes(t.dtype, n_cols);
    v.data = t.data + static_cast<size_t>(row0) * v.row_stride;
    return v;
  };
  w.experts.resize(static_cast<size_t>(X));
  for (int64_t e = 0; e < X; ++e) {
    GluFfnWeights& x = w.experts[static_cast<size_t>(e)];
    x.gate.w = slice(*gu, e * 2 * F, F, E);
    x.up.w = slice(*gu, e * 2 * F + F, F, E);
    x.down.w = slice(*dn, e * E, E, F);
  }
  auto moe = MoeFfn::create(mp, std::move(w));
  if (!moe.ok()) return Error{f.path + ": '" + p + "': " + moe.error().message};
  L.moe = std::move(moe).value();
  RILL_ASSIGN_OR_RETURN(L.pre_ffn_norm_2, load_vector(f, p + "pre_feedforward_layernorm_2.weight", E));
  RILL_ASSIGN_OR_RETURN(L.post_ffn_norm_1, load_vector(f, p + "post_feedforward_layernorm_1.weight", E));
  RILL_ASSIGN_OR_RETURN(L.post_ffn_norm_2, load_vector(f, p + "post_feedforward_layernorm_2.weight", E));
  return Status::Ok();
}

}  // namespace

Status bind_gemma_layer(const ModelFiles& f, const GemmaNames& names, int64_t il, const GemmaLayerDims& d,
                        GemmaLayerWeights& L) {
  const std::string p = names.base + "layers." + std::to_string(il) + ".";
  const int64_t E = d.n_embd;
  RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", d.q_width, E, Bias::kOptional));
  if (d.has_kv) {
    RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", d.kv_width, E, Bias::kOptional));
  }
  if (d.has_kv && d.has_v) {
    RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", d.kv_width, E, Bias::kOptional));
  }
  RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", E, d.q_width, Bias::kOptional));
  if (d.gemma4 || f.find(p + "self_attn.q_norm.weight")) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", d.head_dim));
    if (d.has_kv) {
      RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", d.head_dim));
    }
  }
  if (d.ple_dim > 0) {
    RILL_ASSIGN_OR_RETURN(L.ple_gate, bind_linear(f, p + "per_layer_input_gate", d.ple_dim, E));
    RILL_ASSIGN_OR_RETURN(L.ple_proj, bind_linear(f, p + "per_layer_projection", E, d.ple_dim));
    RILL_ASSIGN_OR_RETURN(L.post_ple_norm, load_vector(f, p + "post_per_layer_input_norm.weight", E));
  }
  if (d.moe.n_expert > 0) RILL_TRY(bind_gemma4_moe(f, p, d.moe, L));
  if (d.gemma4) {
    RILL_ASSIGN_OR_RETURN(const std::vector<float> scalar, load_vector(f, p + "layer_scalar", 1));
    L.layer_scalar = scalar[0];
    if (!std::isfinite(L.layer_scalar)) return Error{f.path + ": tensor '" + p + "layer_scalar' is not finite"};
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
  if (p.gemma4) {
    // Sliding layers: default RoPE over head_dim. Full layers: pair i <
    // global_rope_pairs of the full head (i with i + hd/2) at base^(-2i /
    // hd) / factor, the others at angle 0 (HF's proportional inv_freq).
    GemmaRope r;
    r.local = cpu::make_rope_table(p.local_rope_theta, hd, false);
    int64_t full_hd = hd;
    for (size_t il = 0; il < p.sliding.size(); ++il) full_hd = p.sliding[il] ? full_hd : p.head_dim[il];
    r.global.rot_dim = full_hd;
    r.global.inv_freq.assign(static_cast<size_t>(full_hd / 2), 0.0f);
    for (int64_t i = 0; i < p.global_rope_pairs && i < full_hd / 2; ++i) {
      const double e = static_cast<double>(2 * i) / static_cast<double>(full_hd);
      r.global.inv_freq[static_cast<size_t>(i)] =
          static_cast<float>(1.0 / std::pow(static_cast<double>(c.rope_theta), e) / p.global_rope_factor);
    }
    return r;
  }
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
