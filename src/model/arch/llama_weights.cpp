#include "model/arch/llama_weights.h"

#include <cmath>
#include <utility>

namespace rill {

Result<LlamaDims> llama_dims(const ModelFiles& f, int64_t max_head_dim) {
  const ModelConfig& c = f.config;
  LlamaDims d;
  d.E = c.n_embd;
  d.V = c.n_vocab;
  d.F = c.n_ff;
  if (d.E <= 0 || d.V <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || (d.F <= 0 && c.n_expert == 0) ||
      c.n_head % c.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(d.E) + ", heads " +
                 std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + ")"};
  }
  d.hd = c.head_dim > 0 ? c.head_dim : d.E / c.n_head;
  if (d.hd <= 0 || d.hd > max_head_dim || d.hd % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(d.hd) + " is not supported (even, at most " +
                 std::to_string(max_head_dim) + ")"};
  }
  d.Q = c.n_head * d.hd;
  d.KV = c.n_head_kv * d.hd;
  return d;
}

bool LlamaWeights::all_f32() const {
  if (embed.dtype != DType::kF32) return false;
  for (const LlamaLayerWeights& L : layers) {
    if (L.q.w.dtype != DType::kF32) return false;
    if (!L.moe && L.gate.w.dtype != DType::kF32) return false;
  }
  return true;
}

namespace {

// Decoder layer il, its tensors under prefix p ("model.layers.{il}.").
Result<LlamaLayerWeights> bind_llama_layer(const ModelFiles& f, const LlamaDims& d, const std::string& p, int64_t il) {
  LlamaLayerWeights L;
  RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", d.E));
  RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", d.Q, d.E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", d.KV, d.E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", d.KV, d.E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", d.E, d.Q, Bias::kOptional));
  if (f.find(p + "self_attn.q_norm.weight")) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", d.hd));
    RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", d.hd));
  }
  RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "post_attention_layernorm.weight", d.E));
  if (is_moe_layer(f.config, il)) {
    RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind_llama(f, p));  // Mixtral's block_sparse_moe or mlp.experts
    return L;
  }
  RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, p + "mlp.gate_proj", d.F, d.E));
  RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, p + "mlp.up_proj", d.F, d.E));
  RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, p + "mlp.down_proj", d.E, d.F));
  return L;
}

// MiniCPM 1/2/4 (`minicpm`): the Llama graph with muP scales. What
// MiniCPM checkpoints may declare beyond that is refused, never ignored.
Status check_minicpm(const ModelFiles& f) {
  const ModelConfig& c = f.config;
  const bool gguf = f.format == ModelFormat::kGguf;
  const std::string file = gguf ? f.path : f.path + "/config.json";
  const nlohmann::json& raw = c.raw;
  auto present = [&](const char* key) { return raw.is_object() && raw.contains(key) && !raw.at(key).is_null(); };
  if (present("sparse_config")) {
    return Error{file + ": field 'sparse_config' (MiniCPM4's InfLLM v2 sparse attention) is not supported; " +
                 "minicpm runs dense attention only"};
  }
  if (c.n_expert > 0) {
    return Error{file + ": " + (gguf ? "'minicpm.expert_count'" : "field 'num_experts'") +
                 " (MiniCPM-MoE's experts) is not supported; minicpm runs dense FFNs only"};
  }
  if (c.hidden_act != "silu") {
    return Error{file + ": field 'hidden_act' '" + c.hidden_act + "' is not supported by minicpm (silu)"};
  }
  if (present("mlp_bias") && !(raw.at("mlp_bias").is_boolean() && !raw.at("mlp_bias").get<bool>())) {
    return Error{file + ": field 'mlp_bias' must be false for minicpm (the graph has no MLP biases)"};
  }
  if (present("use_mup") && !(raw.at("use_mup").is_boolean() && raw.at("use_mup").get<bool>())) {
    return Error{file + ": field 'use_mup' must be true for minicpm (its scales are always applied)"};
  }
  // The residual scale multiplies o_proj's and down_proj's inputs, so a bias
  // of theirs would be added unscaled (MiniCPM scales the whole output):
  // refused, as are gate/up biases (the graph adds none). q/k/v biases sit
  // before the scales and are applied as for Llama.
  for (const auto& [name, ref] : f.tensors) {
    const std::string_view n = name;
    const bool bias = n.size() > 5 && n.substr(n.size() - 5) == ".bias";
    if (bias && (n.find(".mlp.") != std::string_view::npos || n.find(".self_attn.o_proj.") != std::string_view::npos)) {
      return Error{ref.file + ": tensor '" + name + "' (a bias after minicpm's residual scale) is not supported"};
    }
  }
  for (const char* factors : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    if (f.find(factors) && c.rope_scaling.type != RopeScaling::Type::kLongRope) {
      return Error{f.path + ": tensor '" + factors + "' (LongRoPE's factors) without '" +
                   "minicpm.rope.scaling.type' longrope"};
    }
  }
  return Status::Ok();
}

}  // namespace

Result<LlamaWeights> bind_llama_weights(const ModelFiles& f, const LlamaDims& d) {
  const ModelConfig& c = f.config;
  LlamaWeights w;
  if (c.architecture == "minicpm") {
    RILL_TRY(check_minicpm(f));
    RILL_ASSIGN_OR_RETURN(w.mup,
                          read_mup_scales(c, f.format == ModelFormat::kGguf ? f.path : f.path + "/config.json", true));
  }
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, "model.embed_tokens.weight", d.V, d.E));
  w.tied = !f.find("lm_head.weight");
  if (w.tied) {
    w.lm_head = w.embed;
  } else {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, "lm_head.weight", d.V, d.E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, "model.norm.weight", d.E));
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t il = 0; il < c.n_layer; ++il) {
    RILL_ASSIGN_OR_RETURN(w.layers[static_cast<size_t>(il)],
                          bind_llama_layer(f, d, "model.layers." + std::to_string(il) + ".", il));
  }
  return w;
}

Status bind_llama_mtp(const ModelFiles& f, const LlamaDims& d, LlamaWeights& w) {
  RILL_ASSIGN_OR_RETURN(const MtpLayers found, find_mtp_layers(f));
  if (found.n_layers() == 0) return Error{f.path + ": --spec mtp: the files carry no multi-token-prediction layers"};
  if (found.naming != MtpLayers::Naming::kNextn)
    return Error{f.path + ": --spec mtp: MTP layers named '" + found.prefixes[0] + "*' are not run by this family"};
  RILL_ASSIGN_OR_RETURN(w.mtp_layer, bind_llama_layer(f, d, found.prefixes[0], f.config.n_layer));
  RILL_ASSIGN_OR_RETURN(w.mtp_head, bind_mtp_head(f, found, w.embed, w.lm_head));
  return Status::Ok();
}

Status shard_llama_layers(LlamaWeights& w, const TensorSplit& split, const SplitRange& ff, int64_t hd,
                          const std::string& path) {
  const SplitRange q_rows{split.heads.begin * hd, split.heads.n * hd};
  const SplitRange kv_rows{split.kv_heads.begin * hd, split.kv_heads.n * hd};
  for (size_t il = 0; il < w.layers.size(); ++il) {
    LlamaLayerWeights& L = w.layers[il];
    const std::string where = path + ": layer " + std::to_string(il) + " ";
    L.q = slice_rows(L.q, q_rows);
    L.k = slice_rows(L.k, kv_rows);
    L.v = slice_rows(L.v, kv_rows);
    std::vector<float> o_bias = std::move(L.o.bias);
    RILL_ASSIGN_OR_RETURN(L.o, slice_cols(L.o, q_rows, where + "o_proj"));
    L.o.bias = std::move(o_bias);
    if (L.moe) {
      RILL_ASSIGN_OR_RETURN(L.moe, slice_moe(*L.moe, split.rank, split.size, where + "experts"));
      continue;
    }
    L.gate = slice_rows(L.gate, ff);
    L.up = slice_rows(L.up, ff);
    RILL_ASSIGN_OR_RETURN(L.down, slice_cols(L.down, ff, where + "down_proj"));
  }
  return Status::Ok();
}

Result<cpu::RopeTable> build_llama_rope(const ModelFiles& f, int64_t hd, int64_t n_ctx) {
  const ModelConfig& c = f.config;
  const int64_t rot_dim = c.rope_dim > 0 ? c.rope_dim : hd;
  if (rot_dim > hd || rot_dim % 2 != 0) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) + " must be even and at most head_dim " +
                 std::to_string(hd)};
  }
  if (c.rope_scaling.type == RopeScaling::Type::kProportional) {
    return Error{f.path + ": rope_type 'proportional' is not supported by the Llama family"};
  }
  const cpu::RopeScalingParams rs = rope_scaling_params(c.rope_scaling);
  cpu::RopeTable rope = cpu::make_rope_table(c.rope_theta, rot_dim, c.rope_style == RopeStyle::kInterleaved, rs);
  if (const TensorRef* freqs = f.find("rope_freqs.weight")) {
    // GGUF llama3 models bake the scaling into per-frequency divisors.
    if (freqs->dtype != DType::kF32 || freqs->n_elements() != rot_dim / 2) {
      return Error{freqs->file + ": tensor 'rope_freqs.weight' must be F32 [" + std::to_string(rot_dim / 2) + "]"};
    }
    const float* div = reinterpret_cast<const float*>(freqs->data);
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope.inv_freq[static_cast<size_t>(i)] /= div[i];
    rope.ggml_freq_divisor.assign(div, div + rot_dim / 2);
  }
  const bool longrope = c.rope_scaling.type == RopeScaling::Type::kLongRope;
  if (longrope && f.find("rope_freqs.weight")) {  // llama.cpp reads no rope_freqs under LongRoPE
    return Error{f.path + ": tensor 'rope_freqs.weight' beside LongRoPE's factors is not supported"};
  }
  if (longrope) {
    // MiniCPM 4: the short factors divide each pair's frequency up to
    // original_max_position; a longer context would need the long ones
    // (from its first token, in MiniCPM's modeling and llama.cpp alike).
    const RopeScaling& s = c.rope_scaling;
    // The context the runtimes serve: n_ctx, else max_position, else their
    // 4096 (cpu_paged_model.cpp, cuda_model_base.cpp).
    const int64_t ctx = n_ctx > 0 ? n_ctx : c.max_position > 0 ? c.max_position : 4096;
    if (ctx > s.original_max_position) {
      return Error{f.path + ": a context of " + std::to_string(ctx) +
                   " tokens is past LongRoPE's original_max_position_embeddings (" +
                   std::to_string(s.original_max_position) +
                   "), where its long factors apply: not supported (ask for a context of at most that)"};
    }
    if (static_cast<int64_t>(s.short_factor.size()) != rot_dim / 2) {
      return Error{f.path + ": LongRoPE's short_factor must list " + std::to_string(rot_dim / 2) + " factors"};
    }
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope.inv_freq[static_cast<size_t>(i)] /= s.short_factor[size_t(i)];
    if (f.format == ModelFormat::kGguf) rope.ggml_freq_divisor = s.short_factor;  // llama.cpp's freq_factors
  }
  if (f.format == ModelFormat::kGguf && (c.rope_scaling.type == RopeScaling::Type::kNone || longrope)) {
    // GGUF models are held to llama.cpp, which builds angles by repeated f32
    // multiplication; pos * inv_freq differs in the last bits, and quantized
    // activations turn such bits into visible logit differences.
    rope.ggml_theta_scale = std::pow(c.rope_theta, -2.0f / static_cast<float>(rot_dim));
  }
  return rope;
}

}  // namespace rill
