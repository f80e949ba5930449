#include "model/arch/gemma4_assistant.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "model/layers.h"

namespace rill {
namespace {

using nlohmann::json;

// A field of `obj` as T, or `fallback` when absent or null; errors name
// the file and the field.
template <typename T>
Result<T> field(const json& obj, const char* key, T fallback, const std::string& file) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return Error{file + ": '" + key + "' must be a boolean"};
    return it->get<bool>();
  } else {
    if (!it->is_number_integer()) return Error{file + ": '" + key + "' must be an integer"};
    return static_cast<T>(it->get<int64_t>());
  }
}

// A string field of `obj`, or "" when absent or not a string (the callers
// compare it with what they need and name the field).
std::string string_field(const json& obj, const char* key) {
  if (!obj.is_object()) return {};
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// masked_embedding.token_ordering: an integer tensor, which the safetensors
// loader leaves out as an index buffer (loader/safetensors.cpp), read here
// from the mapped files. It must be a permutation of the vocabulary.
Result<std::vector<int32_t>> read_token_ordering(const ModelFiles& f, int64_t n_vocab) {
  const std::string name = "masked_embedding.token_ordering";
  for (const MappedFile& m : f.mappings) {
    if (m.size() < 8) continue;
    uint64_t n = 0;
    std::memcpy(&n, m.data(), 8);
    if (n > m.size() - 8) continue;
    const json header = json::parse(m.data() + 8, m.data() + 8 + n, nullptr, false);
    if (!header.is_object() || !header.contains(name)) continue;
    const json& e = header[name];
    const std::string where = m.path() + ": tensor '" + name + "'";
    if (!e.is_object()) return Error{where + " has no dtype, shape and data_offsets"};
    const std::string dtype = string_field(e, "dtype");
    const size_t width = dtype == "I64" ? 8 : dtype == "I32" ? 4 : 0;
    if (width == 0) return Error{where + " has dtype '" + dtype + "' (I64 or I32)"};
    if (!e.contains("shape") || e["shape"] != json::array({n_vocab})) {
      return Error{where + " has shape " + (e.contains("shape") ? e["shape"].dump() : std::string("(none)")) +
                   ", the vocabulary needs [" + std::to_string(n_vocab) + "]"};
    }
    if (!e.contains("data_offsets")) return Error{where + " has no data_offsets"};
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Error{where + " has no data_offsets"};
    }
    const auto begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    const uint64_t data_size = m.size() - 8 - n;
    if (begin > end || end > data_size || end - begin != static_cast<uint64_t>(n_vocab) * width) {
      return Error{where + " has data_offsets outside the file or of the wrong size"};
    }
    const uint8_t* p = m.data() + 8 + n + begin;
    std::vector<int32_t> out(static_cast<size_t>(n_vocab));
    std::vector<bool> seen(static_cast<size_t>(n_vocab), false);
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v = 0;
      if (width == 8) {
        std::memcpy(&v, p + i * 8, 8);
      } else {
        int32_t v32 = 0;
        std::memcpy(&v32, p + i * 4, 4);
        v = v32;
      }
      if (v < 0 || v >= n_vocab || seen[static_cast<size_t>(v)]) {
        return Error{where + " is not a permutation of the " + std::to_string(n_vocab) + " token ids (entry " +
                     std::to_string(i) + " is " + std::to_string(v) + ")"};
      }
      seen[static_cast<size_t>(v)] = true;
      out[i] = static_cast<int32_t>(v);
    }
    return out;
  }
  return Error{f.path + ": tensor '" + name + "' is missing (use_ordered_embeddings needs it)"};
}

// The target's layer whose KV an assistant layer of this kind reads: the
// last layer of the kind that stores KV (transformers' "store" layer:
// kv_donor of the kind's last layer); -1 when the target has none.
int64_t target_layer_of_kind(const GemmaParams& t, bool sliding) {
  int64_t last = -1;
  for (size_t il = 0; il < t.sliding.size(); ++il) last = t.sliding[il] == sliding ? static_cast<int64_t>(il) : last;
  return last < 0 ? -1 : t.kv_donor[static_cast<size_t>(last)];
}

}  // namespace

Result<Gemma4AssistantWeights> load_gemma4_assistant(const std::string& path, const ModelFiles& target,
                                                     const GemmaParams& target_params, int64_t max_head_dim) {
  RILL_ASSIGN_OR_RETURN(std::shared_ptr<ModelFiles> files, open_model_files(path));
  const std::string file = files->path + "/config.json";
  const json& raw = files->config.raw;
  if (files->format != ModelFormat::kHuggingFace || string_field(raw, "model_type") != "gemma4_assistant") {
    return Error{file + ": model_type '" + string_field(raw, "model_type") +
                 "' is not a Gemma 4 assistant (gemma4_assistant)"};
  }
  auto tc = raw.find("text_config");
  if (tc == raw.end() || !tc->is_object() || string_field(*tc, "model_type") != "gemma4_text") {
    return Error{file + ": 'text_config' must be a gemma4_text config"};
  }
  const ModelConfig& c = files->config;  // parse_hf_config read text_config
  // transformers' Gemma4AssistantConfig.validate_architecture.
  RILL_ASSIGN_OR_RETURN(const int64_t ple_dim, field<int64_t>(*tc, "hidden_size_per_layer_input", 0, file));
  RILL_ASSIGN_OR_RETURN(const int64_t ple_vocab, field<int64_t>(*tc, "vocab_size_per_layer_input", 0, file));
  RILL_ASSIGN_OR_RETURN(const bool moe, field<bool>(*tc, "enable_moe_block", false, file));
  RILL_ASSIGN_OR_RETURN(const bool double_wide, field<bool>(*tc, "use_double_wide_mlp", false, file));
  RILL_ASSIGN_OR_RETURN(const int64_t n_shared, field<int64_t>(*tc, "num_kv_shared_layers", c.n_layer, file));
  if (ple_dim != 0) return Error{file + ": 'text_config.hidden_size_per_layer_input' must be 0"};
  if (ple_vocab != 0) return Error{file + ": 'text_config.vocab_size_per_layer_input' must be 0"};
  if (moe) return Error{file + ": 'text_config.enable_moe_block' must be false"};
  if (double_wide) return Error{file + ": 'text_config.use_double_wide_mlp' must be false"};
  if (n_shared != c.n_layer && n_shared != 0) {  // transformers' post_init turns 0 into all
    return Error{file + ": 'text_config.num_kv_shared_layers' (" + std::to_string(n_shared) +
                 ") must equal num_hidden_layers (" + std::to_string(c.n_layer) +
                 "): every layer reads the target's KV"};
  }
  Gemma4AssistantWeights w;
  RILL_ASSIGN_OR_RETURN(w.backbone_embd, field<int64_t>(raw, "backbone_hidden_size", 1536, file));
  RILL_ASSIGN_OR_RETURN(w.ordered, field<bool>(raw, "use_ordered_embeddings", false, file));
  RILL_ASSIGN_OR_RETURN(w.n_centroids, field<int64_t>(raw, "num_centroids", 2048, file));
  RILL_ASSIGN_OR_RETURN(w.centroid_top_k, field<int64_t>(raw, "centroid_intermediate_top_k", 32, file));
  w.n_embd = c.n_embd;
  w.n_vocab = c.n_vocab;
  w.n_head = static_cast<int32_t>(c.n_head);
  w.eps = c.rms_norm_eps;
  if (w.ordered && (w.n_centroids <= 0 || c.n_vocab % w.n_centroids != 0)) {
    return Error{file + ": 'num_centroids' (" + std::to_string(w.n_centroids) + ") must divide the vocabulary (" +
                 std::to_string(c.n_vocab) + ")"};
  }
  if (w.ordered && (w.centroid_top_k <= 0 || w.centroid_top_k > w.n_centroids)) {
    return Error{file + ": 'centroid_intermediate_top_k' (" + std::to_string(w.centroid_top_k) +
                 ") must be in [1, num_centroids]"};
  }

  // The target: a Gemma 4 of the same hidden size (backbone) and vocabulary.
  const std::string both = files->path + " (assistant) and " + target.path + " (target)";
  if (!target_params.gemma4) {
    return Error{both + ": a Gemma 4 assistant drafts for Gemma 4 targets; the target is " +
                 target.config.architecture};
  }
  if (w.backbone_embd != target.config.n_embd) {
    return Error{both + ": backbone_hidden_size " + std::to_string(w.backbone_embd) + " differs from the target's " +
                 "hidden_size " + std::to_string(target.config.n_embd)};
  }
  if (c.n_vocab != target.config.n_vocab) {
    return Error{both + ": vocab_size " + std::to_string(c.n_vocab) + " differs from the target's " +
                 std::to_string(target.config.n_vocab)};
  }

  // The layers: Gemma 4's, read as if unshared (read_gemma_params would look
  // for an earlier donor of the assistant's own); their KV is the target's.
  files->config.raw["text_config"]["num_kv_shared_layers"] = 0;
  RILL_ASSIGN_OR_RETURN(w.params, read_gemma_params(*files));
  const bool has_sliding = std::find(w.params.sliding.begin(), w.params.sliding.end(), true) != w.params.sliding.end();
  // The window reaches int32 arithmetic (window + 2 keys kept by the target).
  constexpr int64_t kMaxWindow = int64_t{1} << 30;
  if (has_sliding && (c.sliding_window <= 0 || c.sliding_window > kMaxWindow)) {
    return Error{file + ": 'text_config.sliding_window' (" + std::to_string(c.sliding_window) +
                 ") must be in [1, 2^30] (the assistant has sliding layers)"};
  }
  // A target without a window runs its sliding-typed layers as full ones
  // and keeps no sliding KV group for the assistant's sliding layers.
  if (has_sliding && target.config.sliding_window <= 0) {
    return Error{both +
                 ": the assistant has sliding layers but the target has no sliding_window (it keeps no "
                 "sliding KV to read)"};
  }
  w.window = has_sliding ? static_cast<int32_t>(c.sliding_window) + 1 : 0;
  const GemmaNames names = gemma_tensor_names(*files);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const auto l = static_cast<size_t>(il);
    const bool sliding = w.params.sliding[l];
    const int64_t t = target_layer_of_kind(target_params, sliding);
    const std::string kind = sliding ? "sliding" : "full";
    if (t < 0) {
      return Error{both + ": assistant layer " + std::to_string(il) + " is a " + kind +
                   " attention layer; the target has none to read"};
    }
    const auto tl = static_cast<size_t>(t);
    if (w.params.head_dim[l] != target_params.head_dim[tl] || w.params.n_head_kv[l] != target_params.n_head_kv[tl]) {
      return Error{both + ": assistant layer " + std::to_string(il) + " (" + kind + ", head_dim " +
                   std::to_string(w.params.head_dim[l]) + ", " + std::to_string(w.params.n_head_kv[l]) +
                   " KV heads) cannot read target layer " + std::to_string(t) + " (head_dim " +
                   std::to_string(target_params.head_dim[tl]) + ", " + std::to_string(target_params.n_head_kv[tl]) +
                   " KV heads)"};
    }
    if (w.params.head_dim[l] > max_head_dim) {
      return Error{file + ": layer " + std::to_string(il) + "'s head_dim " + std::to_string(w.params.head_dim[l]) +
                   " is not supported (at most " + std::to_string(max_head_dim) + ")"};
    }
    w.target_layer.push_back(t);
    GemmaLayerDims d{};
    d.n_embd = c.n_embd;
    d.head_dim = w.params.head_dim[l];
    d.q_width = c.n_head * d.head_dim;
    d.kv_width = w.params.n_head_kv[l] * d.head_dim;
    d.n_ff = w.params.n_ff[l];
    d.has_kv = false;
    d.has_v = false;
    d.gemma4 = true;
    if (d.n_ff <= 0) return Error{file + ": 'text_config.intermediate_size' must be positive"};
    w.layer_dims.push_back(d);
    w.layers.emplace_back();
    RILL_TRY(bind_gemma_layer(*files, names, il, d, w.layers.back()));
  }
  const int64_t E = c.n_embd, V = c.n_vocab, Et = w.backbone_embd;
  RILL_ASSIGN_OR_RETURN(w.pre_projection, bind_matrix(*files, "pre_projection.weight", E, 2 * Et));
  RILL_ASSIGN_OR_RETURN(w.post_projection, bind_matrix(*files, "post_projection.weight", Et, E));
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(*files, names.base + "norm.weight", E));
  const bool own_head = files->find("lm_head.weight") != nullptr;
  RILL_ASSIGN_OR_RETURN(w.lm_head,
                        bind_matrix(*files, own_head ? "lm_head.weight" : names.base + "embed_tokens.weight", V, E));
  if (w.ordered) {
    RILL_ASSIGN_OR_RETURN(w.centroids, bind_matrix(*files, "masked_embedding.centroids.weight", w.n_centroids, E));
    RILL_ASSIGN_OR_RETURN(w.token_ordering, read_token_ordering(*files, V));
  }
  int64_t hd = c.head_dim;
  for (size_t l = 0; l < w.params.sliding.size(); ++l) hd = w.params.sliding[l] ? w.params.head_dim[l] : hd;
  w.rope = gemma_rope_tables(*files, w.params, hd);
  w.files = std::move(files);
  return w;
}

}  // namespace rill
