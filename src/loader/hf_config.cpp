#include "loader/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace rill {
namespace {

using nlohmann::json;

// Upper bound for every count and size; keeps later products in int64.
constexpr int64_t kMaxDim = int64_t{1} << 31;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_float:
      return "float";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    default:
      return "value";
  }
}

// Typed field access on one JSON object; null counts as absent. Every error
// names the file and the field ("dir/config.json: field 'hidden_size' missing").
class Fields {
 public:
  Fields(const json& obj, const std::string& name, std::string prefix = "")
      : obj_(obj), name_(name), prefix_(std::move(prefix)) {}

  const json* get(const char* key) const {
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  Error missing(const char* key) const { return Error{name_ + ": field '" + prefix_ + key + "' missing"}; }
  Error wrong(const char* key, const char* want, const json& v) const {
    return Error{name_ + ": field '" + prefix_ + key + "' must be " + want + ", got " + type_name(v)};
  }
  Error invalid(const char* key, const std::string& why) const {
    return Error{name_ + ": field '" + prefix_ + key + "' " + why};
  }

  Result<std::optional<int64_t>> opt_int(const char* key) const {
    const json* v = get(key);
    if (!v) return std::optional<int64_t>{};
    if (v->is_number_integer() && !v->is_number_unsigned()) return std::optional<int64_t>{v->get<int64_t>()};
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return invalid(key, "is out of range");
      return std::optional<int64_t>{int64_t(u)};
    }
    if (v->is_number_float()) {  // tolerate 4096.0, not 4096.5
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return std::optional<int64_t>{int64_t(d)};
    }
    return wrong(key, "an integer", *v);
  }
  Result<std::optional<double>> opt_float(const char* key) const {
    const json* v = get(key);
    if (!v) return std::optional<double>{};
    if (!v->is_number()) return wrong(key, "a number", *v);
    double d = v->get<double>();
    if (!std::isfinite(d)) return invalid(key, "is not finite");
    return std::optional<double>{d};
  }
  Result<std::optional<bool>> opt_bool(const char* key) const {
    const json* v = get(key);
    if (!v) return std::optional<bool>{};
    if (!v->is_boolean()) return wrong(key, "a boolean", *v);
    return std::optional<bool>{v->get<bool>()};
  }
  Result<std::optional<std::string>> opt_string(const char* key) const {
    const json* v = get(key);
    if (!v) return std::optional<std::string>{};
    if (!v->is_string()) return wrong(key, "a string", *v);
    return std::optional<std::string>{v->get<std::string>()};
  }
  // A count in [lo, kMaxDim]; required.
  Result<int64_t> req_dim(const char* key, int64_t lo = 1) const {
    RILL_ASSIGN_OR_RETURN(auto v, opt_int(key));
    if (!v) return missing(key);
    if (*v < lo || *v > kMaxDim) return invalid(key, "is out of range (" + std::to_string(*v) + ")");
    return *v;
  }
  Result<std::optional<int64_t>> opt_dim(const char* key, int64_t lo = 0) const {
    RILL_ASSIGN_OR_RETURN(auto v, opt_int(key));
    if (v && (*v < lo || *v > kMaxDim)) return invalid(key, "is out of range (" + std::to_string(*v) + ")");
    return v;
  }
  // An int or a list of ints (eos_token_id); nullopt when absent.
  Result<std::optional<std::vector<int32_t>>> opt_token_ids(const char* key) const {
    const json* v = get(key);
    if (!v) return std::optional<std::vector<int32_t>>{};
    std::vector<int32_t> ids;
    auto take = [&](const json& e) -> bool {
      if (!e.is_number_integer()) return false;
      if (e.is_number_unsigned() ? e.get<uint64_t>() > uint64_t(INT32_MAX)
                                 : (e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX))
        return false;
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
      return true;
    };
    if (v->is_array()) {
      for (const auto& e : *v)
        if (!take(e)) return wrong(key, "a token id or a list of token ids", e);
    } else if (!take(*v)) {
      return wrong(key, "a token id or a list of token ids", *v);
    }
    return std::optional<std::vector<int32_t>>{std::move(ids)};
  }

 private:
  const json& obj_;
  const std::string& name_;
  std::string prefix_;
};

// MiniCPM 4's LongRoPE (modeling_minicpm.py's MiniCPMLongRoPE): the short
// and long per-pair divisors, and cos and sin multiplied by the magnitude
// scale sqrt(1 + ln(max / original) / ln(original)) at every length. Only
// max_position_embeddings == original_max_position_embeddings makes that
// scale 1 (above, the long factors also apply at every length; below, the
// scale is under 1), and only there do rill's short factors without a scale
// compute MiniCPM's rotation: every other pair is refused here, and
// contexts past the original length by the Llama family.
Status parse_longrope(const Fields& s, ModelConfig& c) {
  RopeScaling& r = c.rope_scaling;
  const size_t n = static_cast<size_t>(c.rope_dim / 2);
  for (const char* key : {"short_factor", "long_factor"}) {
    const nlohmann::json* v = s.get(key);
    if (!v) return s.missing(key);
    if (!v->is_array() || v->size() != n)
      return s.invalid(key, "must list " + std::to_string(n) + " numbers (one per rotated pair)");
    std::vector<float>& out = std::string(key) == "short_factor" ? r.short_factor : r.long_factor;
    for (const nlohmann::json& e : *v) {
      if (!e.is_number() || !std::isfinite(e.get<double>()) || e.get<double>() <= 0)
        return s.invalid(key, "must list positive numbers");
      out.push_back(static_cast<float>(e.get<double>()));
    }
  }
  if (r.attention_factor) return s.invalid("attention_factor", "is not part of MiniCPM's LongRoPE");
  if (r.original_max_position <= 0) return s.missing("original_max_position_embeddings");
  if (c.max_position != r.original_max_position)
    return s.invalid("original_max_position_embeddings",
                     "(" + std::to_string(r.original_max_position) + ") differs from max_position_embeddings (" +
                         std::to_string(c.max_position) +
                         "): MiniCPM's LongRoPE then scales cos and sin at every length (and above, applies "
                         "the long factors); only equal lengths are supported");
  return Status::Ok();
}

Status parse_rope(const Fields& top, const std::string& name, ModelConfig& c) {
  // v5: rope_parameters (flat, or keyed by layer type); v4: rope_theta + rope_scaling.
  const json* params = top.get("rope_parameters");
  std::string prefix = "rope_parameters.";
  if (params) {
    if (!params->is_object()) return top.wrong("rope_parameters", "an object", *params);
    auto full = params->find("full_attention");
    if (full != params->end() && full->is_object()) {
      params = &*full;
      prefix += "full_attention.";
    } else if (!params->contains("rope_theta") && !params->contains("rope_type") && !params->empty()) {
      // Keyed by some other layer type only: take the first dict.
      for (auto it = params->begin(); it != params->end(); ++it)
        if (it->is_object()) {
          prefix += it.key() + ".";
          params = &*it;
          break;
        }
    }
  }
  const json* scaling = params;
  std::string scaling_prefix = prefix;
  if (!scaling) {
    scaling = top.get("rope_scaling");
    scaling_prefix = "rope_scaling.";
    if (scaling && !scaling->is_object()) return top.wrong("rope_scaling", "an object", *scaling);
  }

  std::optional<double> theta;
  if (params) {
    RILL_ASSIGN_OR_RETURN(theta, Fields(*params, name, prefix).opt_float("rope_theta"));
  }
  if (!theta) {
    RILL_ASSIGN_OR_RETURN(theta, top.opt_float("rope_theta"));
  }
  if (theta) {
    if (*theta <= 0) return top.invalid("rope_theta", "must be positive");
    c.rope_theta = static_cast<float>(*theta);
  }

  std::optional<double> partial;
  RILL_ASSIGN_OR_RETURN(partial, top.opt_float("partial_rotary_factor"));
  if (!partial && params) {
    RILL_ASSIGN_OR_RETURN(partial, Fields(*params, name, prefix).opt_float("partial_rotary_factor"));
  }
  c.rope_dim = c.head_dim;
  if (partial) {
    if (!(*partial > 0 && *partial <= 1)) return top.invalid("partial_rotary_factor", "must be in (0, 1]");
    c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * *partial);
  }
  if (c.rope_dim <= 0 || c.rope_dim % 2 != 0)
    return Error{name + ": rotary dimension " + std::to_string(c.rope_dim) + " (head_dim " +
                 std::to_string(c.head_dim) + ") must be positive and even"};
  c.rope_style = RopeStyle::kHalf;

  if (!scaling) return Status::Ok();
  Fields s(*scaling, name, scaling_prefix);
  RILL_ASSIGN_OR_RETURN(auto type, s.opt_string("rope_type"));
  if (!type) {
    RILL_ASSIGN_OR_RETURN(type, s.opt_string("type"));
  }
  RopeScaling& r = c.rope_scaling;
  if (!type || *type == "default") {
    r.type = RopeScaling::Type::kNone;
    return Status::Ok();
  }
  if (*type == "linear")
    r.type = RopeScaling::Type::kLinear;
  else if (*type == "llama3")
    r.type = RopeScaling::Type::kLlama3;
  else if (*type == "yarn")
    r.type = RopeScaling::Type::kYarn;
  else if (*type == "proportional")
    r.type = RopeScaling::Type::kProportional;
  else if (*type == "longrope" && c.architecture == "minicpm")
    r.type = RopeScaling::Type::kLongRope;
  else
    return s.invalid("rope_type", "'" + *type + "' is not supported (default, linear, llama3, yarn, proportional" +
                                      (*type == "longrope" ? "; longrope for minicpm only)" : ")"));

  RILL_ASSIGN_OR_RETURN(auto factor, s.opt_float("factor"));
  if (factor) {
    if (*factor <= 0) return s.invalid("factor", "must be positive");
    r.factor = static_cast<float>(*factor);
  }
  RILL_ASSIGN_OR_RETURN(auto low, s.opt_float("low_freq_factor"));
  RILL_ASSIGN_OR_RETURN(auto high, s.opt_float("high_freq_factor"));
  RILL_ASSIGN_OR_RETURN(auto orig, s.opt_dim("original_max_position_embeddings", 1));
  RILL_ASSIGN_OR_RETURN(auto beta_fast, s.opt_float("beta_fast"));
  RILL_ASSIGN_OR_RETURN(auto beta_slow, s.opt_float("beta_slow"));
  RILL_ASSIGN_OR_RETURN(auto attn_factor, s.opt_float("attention_factor"));
  if (low) r.low_freq_factor = static_cast<float>(*low);
  if (high) r.high_freq_factor = static_cast<float>(*high);
  if (beta_fast) r.beta_fast = static_cast<float>(*beta_fast);
  if (beta_slow) r.beta_slow = static_cast<float>(*beta_slow);
  if (attn_factor) r.attention_factor = static_cast<float>(*attn_factor);
  RILL_ASSIGN_OR_RETURN(auto truncate, s.opt_bool("truncate"));
  if (truncate) r.truncate = *truncate;
  // transformers falls back to max_position_embeddings when absent.
  r.original_max_position = orig ? *orig : c.max_position;
  if (r.type == RopeScaling::Type::kLlama3) {
    if (r.low_freq_factor <= 0 || r.high_freq_factor <= r.low_freq_factor)
      return s.invalid("high_freq_factor", "must exceed low_freq_factor > 0");
    if (r.original_max_position <= 0) return s.missing("original_max_position_embeddings");
  }
  if (r.type == RopeScaling::Type::kLongRope) RILL_TRY(parse_longrope(s, c));
  return Status::Ok();
}

// The DeepSeek-V3 / GLM-4.5 MoE fields beside n_routed_experts: ungated
// shared experts of n_shared_experts x moe_intermediate_size, the first
// first_k_dense_replace layers dense, and the router's fields, checked here
// and read by moe_params() (model/moe.h) from the raw config.
Status parse_routed_moe(const Fields& f, ModelConfig& c) {
  RILL_ASSIGN_OR_RETURN(auto n_shared, f.opt_dim("n_shared_experts"));
  if (n_shared && c.n_ff_shared_expert == 0) c.n_ff_shared_expert = *n_shared * c.n_ff_expert;
  RILL_ASSIGN_OR_RETURN(auto first_dense, f.opt_dim("first_k_dense_replace"));
  if (first_dense && *first_dense > c.n_layer)
    return f.invalid("first_k_dense_replace", "exceeds num_hidden_layers (" + std::to_string(c.n_layer) + ")");
  for (int64_t il = 0; il < first_dense.value_or(0); ++il) c.dense_layers.push_back(il);
  RILL_ASSIGN_OR_RETURN(auto n_group, f.opt_dim("n_group", 1));
  RILL_ASSIGN_OR_RETURN(auto topk_group, f.opt_dim("topk_group", 1));
  if (n_group && (c.n_expert % *n_group != 0 || topk_group.value_or(1) > *n_group))
    return f.invalid("n_group",
                     "(" + std::to_string(*n_group) + ") must divide the experts and be at least topk_group");
  RILL_ASSIGN_OR_RETURN(auto scaling, f.opt_float("routed_scaling_factor"));
  if (scaling && !(*scaling > 0)) return f.invalid("routed_scaling_factor", "must be positive");
  RILL_ASSIGN_OR_RETURN(auto method, f.opt_string("topk_method"));
  if (method && *method != "noaux_tc") return f.invalid("topk_method", "'" + *method + "' is not supported (noaux_tc)");
  RILL_ASSIGN_OR_RETURN(auto scoring, f.opt_string("scoring_func"));
  if (scoring && *scoring != "sigmoid")
    return f.invalid("scoring_func", "'" + *scoring + "' is not supported (sigmoid)");
  return Status::Ok();
}

// Mixture-of-experts fields (Mixtral, Qwen3-MoE, Qwen3-Next); none: dense.
Status parse_moe(const Fields& f, ModelConfig& c) {
  RILL_ASSIGN_OR_RETURN(auto n_expert, f.opt_dim("num_local_experts"));
  const char* experts_key = "num_local_experts";
  if (!n_expert) {
    RILL_ASSIGN_OR_RETURN(n_expert, f.opt_dim("num_experts"));
    experts_key = "num_experts";
  }
  if (!n_expert) {  // DeepSeek-V3, GLM-4.5: the sigmoid router (model/moe.h's moe_params)
    RILL_ASSIGN_OR_RETURN(n_expert, f.opt_dim("n_routed_experts"));
    experts_key = "n_routed_experts";
  }
  if (!n_expert || *n_expert == 0) return Status::Ok();
  c.n_expert = *n_expert;
  // Gemma 4 names the experts per token top_k_experts.
  RILL_ASSIGN_OR_RETURN(auto top_k, f.opt_dim("top_k_experts"));
  if (top_k) {
    c.n_expert_used = *top_k;
  } else {
    RILL_ASSIGN_OR_RETURN(c.n_expert_used, f.req_dim("num_experts_per_tok"));
  }
  if (c.n_expert_used > c.n_expert)
    return f.invalid("num_experts_per_tok", "(" + std::to_string(c.n_expert_used) + ") exceeds " + experts_key + " (" +
                                                std::to_string(c.n_expert) + ")");
  RILL_ASSIGN_OR_RETURN(auto n_ff_expert, f.opt_dim("moe_intermediate_size", 1));
  c.n_ff_expert = n_ff_expert.value_or(c.n_ff);
  if (c.n_ff_expert <= 0) return f.missing("moe_intermediate_size");
  RILL_ASSIGN_OR_RETURN(auto n_ff_shared, f.opt_dim("shared_expert_intermediate_size"));
  c.n_ff_shared_expert = n_ff_shared.value_or(0);
  // transformers: Mixtral always renormalises the top-k weights; the
  // config's default is false for Qwen3-MoE and true for Qwen3-Next.
  RILL_ASSIGN_OR_RETURN(auto norm, f.opt_bool("norm_topk_prob"));
  const bool routed = std::string(experts_key) == "n_routed_experts";
  c.norm_topk_prob = c.architecture == "mixtral" || norm.value_or(c.architecture == "qwen3_next" || routed);
  if (routed) RILL_TRY(parse_routed_moe(f, c));
  RILL_ASSIGN_OR_RETURN(auto step, f.opt_dim("decoder_sparse_step", 1));
  c.moe_layer_step = step.value_or(1);
  if (const json* dense = f.get("mlp_only_layers")) {
    if (!dense->is_array()) return f.wrong("mlp_only_layers", "a list of layer indices", *dense);
    for (const json& v : *dense) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layer)
        return f.invalid("mlp_only_layers",
                         "must list layer indices below num_hidden_layers (" + std::to_string(c.n_layer) + ")");
      c.dense_layers.push_back(v.get<int64_t>());
    }
  }
  return Status::Ok();
}

}  // namespace

Status apply_generation_config(const json& gen, const std::string& name, GenerationDefaults* out) {
  if (!gen.is_object()) return Error{name + ": not a JSON object"};
  Fields g(gen, name);
  RILL_ASSIGN_OR_RETURN(auto temperature, g.opt_float("temperature"));
  RILL_ASSIGN_OR_RETURN(auto top_p, g.opt_float("top_p"));
  RILL_ASSIGN_OR_RETURN(auto top_k, g.opt_int("top_k"));
  RILL_ASSIGN_OR_RETURN(auto min_p, g.opt_float("min_p"));
  RILL_ASSIGN_OR_RETURN(auto rep, g.opt_float("repetition_penalty"));
  RILL_ASSIGN_OR_RETURN(auto do_sample, g.opt_bool("do_sample"));
  RILL_ASSIGN_OR_RETURN(auto eos, g.opt_token_ids("eos_token_id"));
  RILL_ASSIGN_OR_RETURN(auto bos, g.opt_token_ids("bos_token_id"));
  if (temperature) out->temperature = static_cast<float>(*temperature);
  if (top_p) out->top_p = static_cast<float>(*top_p);
  if (top_k) {
    if (*top_k < 0 || *top_k > INT32_MAX) return g.invalid("top_k", "is out of range");
    out->top_k = static_cast<int>(*top_k);
  }
  if (min_p) out->min_p = static_cast<float>(*min_p);
  if (rep) out->repetition_penalty = static_cast<float>(*rep);
  if (do_sample) out->do_sample = *do_sample;
  if (eos) out->eos_token_ids = std::move(*eos);
  if (bos) {
    if (bos->size() != 1) return g.invalid("bos_token_id", "must be a single token id");
    out->bos_token_id = (*bos)[0];
  }
  return Status::Ok();
}

Result<ModelConfig> parse_hf_config(const json& config, const std::string& name) {
  if (!config.is_object()) return Error{name + ": not a JSON object"};
  try {
    // Multimodal wrappers keep the language model's fields in text_config.
    const json* src = &config;
    auto tc = config.find("text_config");
    if (tc != config.end() && tc->is_object() && !config.contains("hidden_size")) src = &*tc;
    Fields f(*src, name, src == &config ? "" : "text_config.");
    Fields top(config, name);

    ModelConfig c;
    RILL_ASSIGN_OR_RETURN(auto model_type, f.opt_string("model_type"));
    if (!model_type) {
      RILL_ASSIGN_OR_RETURN(model_type, top.opt_string("model_type"));
    }
    if (!model_type) return top.missing("model_type");
    c.architecture = *model_type;

    RILL_ASSIGN_OR_RETURN(c.n_vocab, f.req_dim("vocab_size"));
    RILL_ASSIGN_OR_RETURN(c.n_embd, f.req_dim("hidden_size"));
    RILL_ASSIGN_OR_RETURN(c.n_layer, f.req_dim("num_hidden_layers"));
    if (c.n_layer > kMaxLayers)
      return f.invalid("num_hidden_layers", "is out of range (" + std::to_string(c.n_layer) + "; at most " +
                                                std::to_string(kMaxLayers) + ")");
    RILL_ASSIGN_OR_RETURN(c.n_head, f.req_dim("num_attention_heads"));
    RILL_ASSIGN_OR_RETURN(auto n_head_kv, f.opt_dim("num_key_value_heads", 1));
    c.n_head_kv = n_head_kv ? *n_head_kv : c.n_head;
    if (c.n_head % c.n_head_kv != 0)
      return f.invalid(
          "num_key_value_heads",
          "(" + std::to_string(c.n_head_kv) + ") must divide num_attention_heads (" + std::to_string(c.n_head) + ")");
    RILL_ASSIGN_OR_RETURN(auto head_dim, f.opt_dim("head_dim", 1));
    if (head_dim) {
      c.head_dim = *head_dim;
    } else {
      if (c.n_embd % c.n_head != 0)
        return f.invalid("hidden_size", "(" + std::to_string(c.n_embd) +
                                            ") is not a multiple of num_attention_heads and head_dim is absent");
      c.head_dim = c.n_embd / c.n_head;
    }
    RILL_ASSIGN_OR_RETURN(auto n_ff, f.opt_dim("intermediate_size"));
    c.n_ff = n_ff.value_or(0);
    RILL_ASSIGN_OR_RETURN(auto max_pos, f.opt_dim("max_position_embeddings"));
    c.max_position = max_pos.value_or(0);
    RILL_ASSIGN_OR_RETURN(auto eps, f.opt_float("rms_norm_eps"));
    if (eps) {
      if (*eps < 0) return f.invalid("rms_norm_eps", "must not be negative");
      c.rms_norm_eps = static_cast<float>(*eps);
    }
    RILL_ASSIGN_OR_RETURN(auto tie, f.opt_bool("tie_word_embeddings"));
    if (!tie && src != &config) {
      RILL_ASSIGN_OR_RETURN(tie, top.opt_bool("tie_word_embeddings"));
    }
    c.tie_word_embeddings = tie.value_or(false);

    // Gemma names it hidden_activation (and its hidden_act, when both exist, is stale).
    RILL_ASSIGN_OR_RETURN(auto act, f.opt_string("hidden_activation"));
    if (!act) {
      RILL_ASSIGN_OR_RETURN(act, f.opt_string("hidden_act"));
    }
    if (act) c.hidden_act = *act;

    RILL_ASSIGN_OR_RETURN(auto window, f.opt_dim("sliding_window"));
    RILL_ASSIGN_OR_RETURN(auto use_window, f.opt_bool("use_sliding_window"));
    c.sliding_window = (use_window && !*use_window) ? 0 : window.value_or(0);

    RILL_TRY(parse_rope(f, name, c));
    RILL_TRY(parse_moe(f, c));

    RILL_ASSIGN_OR_RETURN(auto eos, f.opt_token_ids("eos_token_id"));
    if (!eos && src != &config) {
      RILL_ASSIGN_OR_RETURN(eos, top.opt_token_ids("eos_token_id"));
    }
    if (eos) c.generation.eos_token_ids = std::move(*eos);
    RILL_ASSIGN_OR_RETURN(auto bos, f.opt_token_ids("bos_token_id"));
    if (bos && bos->size() == 1) c.generation.bos_token_id = (*bos)[0];

    c.raw = config;
    return c;
  } catch (const std::exception& e) {  // defensive: Fields checks types before every get<>
    return Error{name + ": " + e.what()};
  }
}

Result<ModelConfig> parse_hf_config_text(std::string_view text, const std::string& name) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{name + ": not valid JSON"};
  return parse_hf_config(j, name);
}

namespace {

Result<json> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open"};
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{path + ": not valid JSON"};
  return j;
}

}  // namespace

Result<ModelConfig> load_hf_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec)) return Error{config_path + ": missing"};
  RILL_ASSIGN_OR_RETURN(json config, read_json_file(config_path));
  RILL_ASSIGN_OR_RETURN(ModelConfig c, parse_hf_config(config, config_path));
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::is_regular_file(gen_path, ec)) {
    RILL_ASSIGN_OR_RETURN(json gen, read_json_file(gen_path));
    RILL_TRY(apply_generation_config(gen, gen_path, &c.generation));
  }
  return c;
}

}  // namespace rill
