#include "model/arch/deepseek_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace rill {
namespace {

class RawFields {
 public:
  RawFields(const nlohmann::json& raw, std::string file) : raw_(raw), file_(std::move(file)) {}
  // A positive integer; absent or null: `fallback` (-1: required).
  Result<int64_t> dim(const char* key, int64_t fallback = -1) const {
    auto it = raw_.find(key);
    if (it == raw_.end() || it->is_null()) {
      if (fallback >= 0) return fallback;
      return Error{file_ + ": field '" + key + "' is missing (needed by " + arch() + ")"};
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (int64_t{1} << 24)) {
      return Error{file_ + ": field '" + std::string(key) + "' must be a positive integer"};
    }
    return it->get<int64_t>();
  }
  Result<double> number(const char* key, double fallback) const {
    auto it = raw_.find(key);
    if (it == raw_.end() || it->is_null()) return fallback;
    if (!it->is_number() || !std::isfinite(it->get<double>())) {
      return Error{file_ + ": field '" + std::string(key) + "' must be a number"};
    }
    return it->get<double>();
  }
  Result<bool> flag(const char* key, bool fallback) const {
    auto it = raw_.find(key);
    if (it == raw_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error{file_ + ": field '" + std::string(key) + "' must be true or false"};
    return it->get<bool>();
  }
  // The field, absent or null: nullptr.
  const nlohmann::json* get(const char* key) const {
    auto it = raw_.find(key);
    return it != raw_.end() && !it->is_null() ? &*it : nullptr;
  }
  const nlohmann::json* object(const char* key) const {
    auto it = raw_.find(key);
    return it != raw_.end() && it->is_object() ? &*it : nullptr;
  }
  std::string arch() const { return raw_.value("model_type", std::string("this model")); }

 private:
  const nlohmann::json& raw_;
  std::string file_;
};

// transformers' yarn_get_mscale.
double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// Per layer, "full" or "shared" (a string of F and S, or a list): the
// index_topk_pattern / indexer_types entries as transformers reads them.
Result<std::vector<bool>> indexer_pattern(const nlohmann::json& v, const char* key, int64_t n_layer,
                                          const std::string& file) {
  const std::string what = file + ": '" + key + "' ";
  const size_t n = v.is_string() ? v.get<std::string>().size() : v.is_array() ? v.size() : 0;
  if (n != static_cast<size_t>(n_layer)) {
    return Error{what + "must name one indexer type per layer (" + std::to_string(n_layer) + ")"};
  }
  std::vector<bool> shared(n);
  for (size_t i = 0; i < n; ++i) {
    std::string t = v.is_string()      ? std::string(1, v.get<std::string>()[i])
                    : v[i].is_string() ? v[i].get<std::string>()
                                       : "";
    if (t == "F") t = "full";
    if (t == "S") t = "shared";
    if (t != "full" && t != "shared") return Error{what + "entry " + std::to_string(i) + " must be full or shared"};
    shared[i] = t == "shared";
  }
  if (n > 0 && shared[0]) return Error{what + "layer 0 must be full (a shared layer reuses an earlier selection)"};
  return shared;
}

// glm_moe_dsa's indexer (DsaParams) and its layer lists.
Status read_dsa_params(const RawFields& r, const ModelConfig& cfg, const std::string& file, MlaParams& p) {
  DsaParams& d = p.dsa;
  RILL_ASSIGN_OR_RETURN(d.topk, r.dim("index_topk"));
  RILL_ASSIGN_OR_RETURN(d.head_dim, r.dim("index_head_dim"));
  RILL_ASSIGN_OR_RETURN(d.n_head, r.dim("index_n_heads"));
  if (p.q_lora_rank == 0) return Error{file + ": field 'q_lora_rank' is missing (the indexer's queries read it)"};
  if (d.head_dim < p.rope) {
    return Error{file + ": index_head_dim " + std::to_string(d.head_dim) + " is below qk_rope_head_dim " +
                 std::to_string(p.rope)};
  }
  if (const nlohmann::json* types = r.get("indexer_types")) {
    RILL_ASSIGN_OR_RETURN(d.shared, indexer_pattern(*types, "indexer_types", cfg.n_layer, file));
  } else if (const nlohmann::json* pattern = r.get("index_topk_pattern")) {
    RILL_ASSIGN_OR_RETURN(d.shared, indexer_pattern(*pattern, "index_topk_pattern", cfg.n_layer, file));
  } else {  // transformers' schedule: full where max(i - offset + 1, 0) % freq == 0
    RILL_ASSIGN_OR_RETURN(const int64_t freq, r.dim("index_topk_freq", 1));
    RILL_ASSIGN_OR_RETURN(const double offset, r.number("index_skip_topk_offset", 2));
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      d.shared.push_back(std::max<int64_t>(i - static_cast<int64_t>(offset) + 1, 0) % freq != 0);
    }
    if (!d.shared.empty() && d.shared[0]) return Error{file + ": index_skip_topk_offset makes layer 0 shared"};
  }
  // The FFN kinds come from first_k_dense_replace; a list must agree.
  if (const nlohmann::json* mlp = r.get("mlp_layer_types")) {
    if (!mlp->is_array() || mlp->size() != static_cast<size_t>(cfg.n_layer)) {
      return Error{file + ": 'mlp_layer_types' must list " + std::to_string(cfg.n_layer) + " layer types"};
    }
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      const char* want = is_moe_layer(cfg, i) ? "sparse" : "dense";
      if ((*mlp)[static_cast<size_t>(i)] != want) {
        return Error{file + ": mlp_layer_types[" + std::to_string(i) + "] must be " + want +
                     " (as first_k_dense_replace says)"};
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<MlaParams> read_mla_params(const ModelFiles& f) {
  const ModelConfig& cfg = f.config;
  const std::string file = f.format == ModelFormat::kGguf ? f.path : f.path + "/config.json";
  const RawFields r(cfg.raw, file);
  MlaParams p;
  RILL_ASSIGN_OR_RETURN(p.q_lora_rank, r.dim("q_lora_rank", 0));
  RILL_ASSIGN_OR_RETURN(p.kv_lora_rank, r.dim("kv_lora_rank"));
  RILL_ASSIGN_OR_RETURN(p.nope, r.dim("qk_nope_head_dim"));
  RILL_ASSIGN_OR_RETURN(p.rope, r.dim("qk_rope_head_dim"));
  RILL_ASSIGN_OR_RETURN(p.v_dim, r.dim("v_head_dim"));
  if (p.rope % 2 != 0) return Error{file + ": qk_rope_head_dim " + std::to_string(p.rope) + " must be even"};
  RILL_ASSIGN_OR_RETURN(const bool bias, r.flag("attention_bias", false));
  if (bias) return Error{file + ": attention_bias true is not supported by the MLA family yet"};
  const bool minicpm = cfg.architecture == "minicpm3";
  RILL_ASSIGN_OR_RETURN(p.interleaved, r.flag("rope_interleave", !minicpm));
  if (minicpm && p.interleaved) return Error{file + ": rope_interleave is not part of minicpm3"};
  if (cfg.architecture == "glm_moe_dsa" && !p.interleaved) {
    return Error{file + ": rope_interleave false is not part of glm_moe_dsa (its RoPE pairs dims (2i, 2i+1))"};
  }
  if (cfg.hidden_act != "silu") return Error{file + ": hidden_act '" + cfg.hidden_act + "' (the MLA family: silu)"};

  double scale = 1.0 / std::sqrt(static_cast<double>(p.qk_dim()));
  if (cfg.rope_scaling.type == RopeScaling::Type::kYarn) {
    const nlohmann::json* s = r.object("rope_parameters");
    if (!s || !s->contains("rope_type")) s = r.object("rope_scaling");
    const nlohmann::json empty = nlohmann::json::object();  // RawFields keeps a reference: no temporary
    const RawFields sf(s ? *s : empty, file);
    RILL_ASSIGN_OR_RETURN(const double mscale, sf.number("mscale", 0));
    RILL_ASSIGN_OR_RETURN(const double mscale_all, sf.number("mscale_all_dim", 0));
    const double factor = cfg.rope_scaling.factor;
    if (mscale_all != 0) scale *= yarn_mscale(factor, mscale_all) * yarn_mscale(factor, mscale_all);
    if (!cfg.rope_scaling.attention_factor && mscale != 0 && mscale_all != 0) {
      p.rope_attention_factor = static_cast<float>(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all));
    }
  } else if (cfg.rope_scaling.type != RopeScaling::Type::kNone) {
    return Error{file + ": the MLA family supports default and yarn RoPE only"};
  }
  p.attn_scale = static_cast<float>(scale);

  if (minicpm) {
    RILL_ASSIGN_OR_RETURN(const bool mlp_bias, r.flag("mlp_bias", false));
    if (mlp_bias) return Error{file + ": mlp_bias true is not supported by minicpm3 here yet"};
    RILL_ASSIGN_OR_RETURN(p.mup, read_mup_scales(cfg, file, /*required=*/false));
    return p;
  }

  // n_routed_experts: the sigmoid, group-limited router, ungated shared
  // experts, the first first_k_dense_replace layers dense (hf_config.cpp
  // checked the fields; is_moe_layer() picks the layers).
  p.moe = moe_params(cfg);
  if (cfg.architecture == "glm_moe_dsa") RILL_TRY(read_dsa_params(r, cfg, file, p));
  return p;
}

}  // namespace rill
