#include "loader/mtp_layers.h"

#include "loader/gguf.h"

namespace rill {
namespace {

// The declared MTP layer count and the key that declares it ("" when none).
struct Declared {
  int64_t n = 0;
  std::string key;
  MtpLayers::Naming naming = MtpLayers::Naming::kNextn;
};

Declared declared_layers(const ModelFiles& files) {
  if (files.gguf) {
    const auto arch = files.gguf->get_string("general.architecture");
    if (!arch) return {};
    const std::string key = *arch + ".nextn_predict_layers";
    const auto n = files.gguf->get_int(key);
    return n && *n > 0 ? Declared{*n, key} : Declared{};
  }
  const nlohmann::json& raw = files.config.raw;
  if (!raw.is_object()) return {};
  auto count = [](const nlohmann::json& j, const char* key) -> int64_t {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  if (const int64_t n = count(raw, "num_nextn_predict_layers"); n > 0) return {n, "num_nextn_predict_layers"};
  if (const int64_t n = count(raw, "mtp_num_hidden_layers"); n > 0)
    return {n, "mtp_num_hidden_layers", MtpLayers::Naming::kQwenMtp};
  if (const auto tc = raw.find("text_config"); tc != raw.end() && tc->is_object()) {
    if (const int64_t n = count(*tc, "mtp_num_hidden_layers"); n > 0)
      return {n, "text_config.mtp_num_hidden_layers", MtpLayers::Naming::kQwenMtp};
  }
  return {};
}

}  // namespace

Result<MtpLayers> find_mtp_layers(const ModelFiles& files) {
  const Declared d = declared_layers(files);
  MtpLayers out;
  out.naming = d.naming;
  if (d.n == 0) return out;
  const int64_t E = files.config.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> required;  // name, shape
  for (int64_t i = 0; i < d.n; ++i) {
    required.clear();
    if (d.naming == MtpLayers::Naming::kNextn) {
      const std::string p = "model.layers." + std::to_string(files.config.n_layer + i) + ".";
      out.prefixes.push_back(p);
      required = {{p + "eh_proj.weight", {E, 2 * E}},
                  {p + "enorm.weight", {E}},
                  {p + "hnorm.weight", {E}},
                  {p + "shared_head.norm.weight", {E}},
                  {p + "input_layernorm.weight", {E}}};
    } else {
      if (i == 0) {
        required = {{"mtp.fc.weight", {E, 2 * E}},
                    {"mtp.pre_fc_norm_embedding.weight", {E}},
                    {"mtp.pre_fc_norm_hidden.weight", {E}},
                    {"mtp.norm.weight", {E}}};
      }
      const std::string p = "mtp.layers." + std::to_string(i) + ".";
      out.prefixes.push_back(p);
      required.push_back({p + "input_layernorm.weight", {E}});
    }
    for (const auto& [name, shape] : required) {
      if (!files.find(name)) {
        return Error{files.path + ": the config declares " + std::to_string(d.n) + " multi-token-prediction layer" +
                     (d.n == 1 ? "" : "s") + " (" + d.key + ") but the files hold no '" + name +
                     "' (a conversion that left the MTP weights out?)"};
      }
      RILL_TRY(files.require(name, shape));
    }
  }
  return out;
}

}  // namespace rill
