#include "model/mup_scales.h"

#include <cmath>

namespace rill {
namespace {

// A finite positive number at raw[key]; absent or null: `fallback` (< 0:
// required).
Result<double> positive_number(const nlohmann::json& raw, const char* key, double fallback, const std::string& file,
                               const std::string& arch) {
  const auto it = raw.is_object() ? raw.find(key) : raw.end();
  if (!raw.is_object() || it == raw.end() || it->is_null()) {
    if (fallback >= 0) return fallback;
    return Error{file + ": field '" + key + "' is missing (needed by " + arch + ")"};
  }
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
    return Error{file + ": field '" + std::string(key) + "' must be a positive number"};
  }
  return it->get<double>();
}

}  // namespace

Result<MupScales> read_mup_scales(const ModelConfig& cfg, const std::string& file, bool required) {
  // A fallback below 0 makes the field required.
  const auto fallback = [required](double value) { return required ? -1.0 : value; };
  const std::string& arch = cfg.architecture;
  RILL_ASSIGN_OR_RETURN(const double scale_emb, positive_number(cfg.raw, "scale_emb", fallback(1.0), file, arch));
  RILL_ASSIGN_OR_RETURN(const double scale_depth, positive_number(cfg.raw, "scale_depth", fallback(1.0), file, arch));
  RILL_ASSIGN_OR_RETURN(const double dim_base, positive_number(cfg.raw, "dim_model_base",
                                                               fallback(static_cast<double>(cfg.n_embd)), file, arch));
  if (cfg.n_layer <= 0 || cfg.n_embd <= 0) return Error{file + ": no layers or no hidden size for the muP scales"};
  MupScales s;
  s.embed = static_cast<float>(scale_emb);
  s.residual = static_cast<float>(scale_depth / std::sqrt(static_cast<double>(cfg.n_layer)));
  s.logit = static_cast<float>(dim_base / static_cast<double>(cfg.n_embd));
  return s;
}

void scale_into(Backend& b, Tensor x, float s, Tensor out) {
  if (s != 1.0f) b.scale(x, s);
  if (out.data != x.data) b.convert(x, out);
}

}  // namespace rill
