#include "model/pooling.h"

#include <cassert>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace rill {

const char* pooling_name(EmbeddingSpec::Pooling p) {
  switch (p) {
    case EmbeddingSpec::Pooling::kMean:
      return "mean";
    case EmbeddingSpec::Pooling::kCls:
      return "cls";
    case EmbeddingSpec::Pooling::kLast:
      return "last";
    case EmbeddingSpec::Pooling::kNone:
      break;
  }
  return "none";
}

namespace {

Result<nlohmann::json> read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path.string() + ": cannot open"};
  std::ostringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return Error{path.string() + ": not valid JSON"};
  return j;
}

bool flag(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

Result<SentenceTransformersConfig> read_sentence_transformers(const std::string& dir, int64_t n_dims) {
  namespace fs = std::filesystem;
  SentenceTransformersConfig out;
  out.spec.n_dims = n_dims;
  std::error_code ec;
  const fs::path modules_path = fs::path(dir) / "modules.json";
  if (!fs::is_regular_file(modules_path, ec)) return out;
  RILL_ASSIGN_OR_RETURN(nlohmann::json modules, read_json(modules_path));
  if (!modules.is_array()) return Error{modules_path.string() + ": not a list of modules"};
  bool pooled = false;
  for (const auto& m : modules) {
    if (!m.is_object() || !m.contains("type") || !m.at("type").is_string())
      return Error{modules_path.string() + ": a module without a \"type\" string"};
    const std::string type = m.at("type").get<std::string>();
    const std::string sub = m.contains("path") && m.at("path").is_string() ? m.at("path").get<std::string>() : "";
    if (type.ends_with(".Pooling")) {
      const fs::path cfg_path = fs::path(dir) / sub / "config.json";
      RILL_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json(cfg_path));
      if (!cfg.is_object()) return Error{cfg_path.string() + ": not a JSON object"};
      if (flag(cfg, "pooling_mode_max_tokens") || flag(cfg, "pooling_mode_mean_sqrt_len_tokens") ||
          flag(cfg, "pooling_mode_weightedmean_tokens"))
        return Error{cfg_path.string() + ": only mean, cls and lasttoken pooling are supported"};
      const int n_modes = flag(cfg, "pooling_mode_mean_tokens") + flag(cfg, "pooling_mode_cls_token") +
                          flag(cfg, "pooling_mode_lasttoken");
      if (n_modes != 1) return Error{cfg_path.string() + ": exactly one pooling mode must be set"};
      out.spec.pooling = flag(cfg, "pooling_mode_mean_tokens") ? EmbeddingSpec::Pooling::kMean
                         : flag(cfg, "pooling_mode_cls_token") ? EmbeddingSpec::Pooling::kCls
                                                               : EmbeddingSpec::Pooling::kLast;
      auto dim = cfg.find("word_embedding_dimension");
      if (dim != cfg.end() && (!dim->is_number_integer() || dim->get<int64_t>() != n_dims))
        return Error{cfg_path.string() + ": word_embedding_dimension differs from the model's hidden size " +
                     std::to_string(n_dims)};
      pooled = true;
    } else if (type.ends_with(".Normalize")) {
      if (!pooled) return Error{modules_path.string() + ": Normalize before Pooling is not supported"};
      out.spec.normalize = true;
    } else if (!type.ends_with(".Transformer")) {
      return Error{modules_path.string() + ": module type '" + type + "' is not supported"};
    }
  }
  if (!pooled) return Error{modules_path.string() + ": no Pooling module"};
  const fs::path sbert = fs::path(dir) / "sentence_bert_config.json";
  if (fs::is_regular_file(sbert, ec)) {
    RILL_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json(sbert));
    auto len = cfg.is_object() ? cfg.find("max_seq_length") : cfg.end();
    if (cfg.is_object() && len != cfg.end()) {
      if (!len->is_number_integer() || len->get<int64_t>() < 2)
        return Error{sbert.string() + ": max_seq_length must be an integer >= 2"};
      out.max_seq_length = len->get<int64_t>();
    }
  }
  return out;
}

Result<EmbeddingSpec> declared_pooling(const ModelFiles& files) {
  const ModelConfig& c = files.config;
  if (files.format == ModelFormat::kHuggingFace) {
    RILL_ASSIGN_OR_RETURN(SentenceTransformersConfig st, read_sentence_transformers(files.path, c.n_embd));
    return st.spec;
  }
  EmbeddingSpec spec;
  spec.n_dims = c.n_embd;
  const nlohmann::json& raw = c.raw;
  auto arch = raw.find("general.architecture");
  if (!raw.is_object() || arch == raw.end() || !arch->is_string()) return spec;
  auto type = raw.find(arch->get<std::string>() + ".pooling_type");
  if (type == raw.end()) return spec;
  if (!type->is_number_integer()) return Error{files.path + ": " + type.key() + " is not an integer"};
  switch (type->get<int64_t>()) {
    case 0:
      return spec;
    case 1:
      spec.pooling = EmbeddingSpec::Pooling::kMean;
      break;
    case 2:
      spec.pooling = EmbeddingSpec::Pooling::kCls;
      break;
    case 3:
      spec.pooling = EmbeddingSpec::Pooling::kLast;
      break;
    default:
      return Error{files.path + ": " + type.key() + " " + std::to_string(type->get<int64_t>()) +
                   " is not supported (0 none, 1 mean, 2 cls, 3 last)"};
  }
  spec.normalize = true;
  return spec;
}

void pool_rows(const EmbeddingSpec& spec, const float* rows, int64_t n_rows, int64_t n_dims, float* out) {
  assert(n_rows >= 1);
  if (spec.pooling == EmbeddingSpec::Pooling::kMean) {
    std::vector<double> sum(static_cast<size_t>(n_dims), 0.0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < n_dims; ++i) sum[static_cast<size_t>(i)] += rows[r * n_dims + i];
    for (int64_t i = 0; i < n_dims; ++i) out[i] = static_cast<float>(sum[static_cast<size_t>(i)] / double(n_rows));
  } else {
    const float* src = rows + (spec.pooling == EmbeddingSpec::Pooling::kLast ? (n_rows - 1) * n_dims : 0);
    std::copy(src, src + n_dims, out);
  }
  if (spec.normalize) {
    double sq = 0;
    for (int64_t i = 0; i < n_dims; ++i) sq += double(out[i]) * out[i];
    // sentence-transformers' Normalize: x / max(||x||, 1e-12).
    const double norm = std::max(std::sqrt(sq), 1e-12);
    for (int64_t i = 0; i < n_dims; ++i) out[i] = static_cast<float>(out[i] / norm);
  }
}

}  // namespace rill
