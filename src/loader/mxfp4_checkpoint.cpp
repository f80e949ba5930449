#include "loader/mxfp4_checkpoint.h"

#include <algorithm>
#include <cassert>
#include <new>
#include <optional>

#include "core/thread_pool.h"
#include "loader/module_pattern.h"

namespace rill {
namespace {

using json = nlohmann::json;

constexpr int64_t kGroup = 32;       // weights per scale
constexpr int64_t kGroupBytes = 16;  // two codes a byte
constexpr size_t kBlockBytes = 17;   // GGML block_mxfp4: the scale, then the 16 code bytes
constexpr size_t kMaxPatternChars = 256;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "model.layers.3.mlp.experts.gate_up_proj" -> {"model.layers.3.mlp.experts", "gate_up_proj"}
std::pair<std::string, std::string> split_module(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

bool is_experts_module(const std::string& module) {
  return module == "experts" || ends_with(module, ".experts");
}

}  // namespace

Result<Mxfp4Scheme> parse_mxfp4_scheme(const json& config, const std::string& config_path) {
  Mxfp4Scheme s;
  auto q = config.find("quantization_config");
  if (q == config.end() || !q->is_object() || q->value("quant_method", json()) != "mxfp4") return s;
  auto bad = [&](const std::string& field, const std::string& what) {
    return Error{config_path + ": quantization_config." + field + " " + what};
  };
  for (auto it = q->begin(); it != q->end(); ++it) {
    if (it.key() != "quant_method" && it.key() != "modules_to_not_convert" && it.key() != "dequantize") {
      return bad(it.key(), "is not supported (mxfp4 reads quant_method, modules_to_not_convert, dequantize)");
    }
  }
  if (auto d = q->find("dequantize"); d != q->end() && *d != false) {
    return bad("dequantize", "must be false (rill keeps the MXFP4 experts as stored)");
  }
  auto m = q->find("modules_to_not_convert");
  if (m != q->end() && !m->is_null()) {
    if (!m->is_array()) return bad("modules_to_not_convert", "must be a list of module names or patterns");
    for (const json& p : *m) {
      if (!p.is_string() || p.get<std::string>().empty() || p.get<std::string>().size() > kMaxPatternChars) {
        return bad("modules_to_not_convert", "entry " + p.dump() + " must be a non-empty string of at most " +
                                                 std::to_string(kMaxPatternChars) + " characters");
      }
      auto re = ModulePattern::compile(p.get<std::string>());
      if (!re.ok()) {
        return bad("modules_to_not_convert",
                   "entry " + p.dump() + " is not a valid regular expression: " + re.error().message);
      }
      s.not_convert_res.push_back(std::move(*re));
      s.modules_to_not_convert.push_back(p.get<std::string>());
    }
  }
  s.enabled = true;
  return s;
}

Result<bool> mxfp4_converts(const Mxfp4Scheme& scheme, const std::string& module) {
  assert(scheme.not_convert_res.size() == scheme.modules_to_not_convert.size());
  assert(module.size() <= kMaxMxfp4ModuleChars);
  for (size_t i = 0; i < scheme.modules_to_not_convert.size(); ++i) {
    if (ends_with(module, scheme.modules_to_not_convert[i])) return false;
    // re.match(key, name): a match anchored at the start, of any length
    // (re.match(key + "\\.", name) is one of them).
    RILL_ASSIGN_OR_RETURN(const bool hit, scheme.not_convert_res[i]->matches_prefix(module));
    if (hit) return false;
  }
  return true;
}

void mxfp4_group_to_ggml(const uint8_t* codes, uint8_t scale, uint8_t* out) {
  uint8_t v[kGroup];
  for (int k = 0; k < kGroupBytes; ++k) {
    v[2 * k] = codes[k] & 0xF;
    v[2 * k + 1] = codes[k] >> 4;
  }
  out[0] = scale;
  for (int j = 0; j < kGroupBytes; ++j) out[1 + j] = static_cast<uint8_t>(v[j] | (v[j + kGroupBytes] << 4));
}

Result<Mxfp4Weights> read_mxfp4_weights(const SafetensorsCheckpoint& ck, const Mxfp4Scheme& scheme,
                                        const std::string& model_type, const std::string& config_path) {
  Mxfp4Weights out;
  if (scheme.enabled && model_type != "gpt_oss") {
    return Error{config_path + ": quantization_config mxfp4 is read for gpt_oss checkpoints only (transformers " +
                 "converts gpt-oss's experts only); model_type is '" + model_type + "'"};
  }
  auto tensor_at = [&](const std::pair<size_t, size_t>& loc) -> const SafetensorsTensor& {
    return ck.files[loc.first].tensors[loc.second];
  };
  struct Job {
    const SafetensorsTensor* blocks;
    const SafetensorsTensor* scales;
  };
  std::vector<Job> jobs;  // parallel to out.tensors
  for (const auto& [name, loc] : ck.tensors) {
    const SafetensorsTensor& t = tensor_at(loc);
    const std::string& file = ck.file_paths[loc.first];
    auto bad = [&, &tensor = name](const std::string& what) {
      return Error{file + ": tensor '" + tensor + "' " + what};
    };
    if (scheme.enabled && name.size() > kMaxMxfp4ModuleChars) {
      return bad("has a name of " + std::to_string(name.size()) + " characters; an MXFP4 checkpoint's are at most " +
                 std::to_string(kMaxMxfp4ModuleChars));
    }
    const bool is_blocks = ends_with(name, "_blocks"), is_scales = ends_with(name, "_scales");
    if (!is_blocks && !is_scales) {
      // A dense expert matrix the config converts: transformers' MXFP4
      // experts would not take it.
      const auto [module, param] = split_module(name);
      bool converts = false;
      if (scheme.enabled && !t.u8 && is_experts_module(module) && (param == "gate_up_proj" || param == "down_proj")) {
        auto c = mxfp4_converts(scheme, module);
        if (!c.ok()) return Error{config_path + ": quantization_config.modules_to_not_convert: " + c.error().message};
        converts = *c;
      }
      if (converts) {
        return bad("is stored unquantized, but " + config_path + "'s quantization_config (mxfp4) converts '" + module +
                   "': expected '" + name + "_blocks' and '" + name + "_scales' (or list '" + module +
                   "' in modules_to_not_convert)");
      }
      continue;
    }
    if (!scheme.enabled) {
      if (!t.u8) continue;  // a float tensor that happens to end so: not MXFP4
      return bad("is MXFP4 " + std::string(is_blocks ? "blocks" : "scales") + " but " + config_path +
                 " has no quantization_config with quant_method \"mxfp4\"");
    }
    const std::string base = name.substr(0, name.size() - 7);  // both suffixes are 7 characters
    const auto [module, param] = split_module(base);
    if (!is_experts_module(module) || (param != "gate_up_proj" && param != "down_proj")) {
      return bad(
          "is MXFP4, which rill reads for the experts' gate_up_proj and down_proj only "
          "('<...>.experts.gate_up_proj_blocks' / '_scales', as transformers' Mxfp4GptOssExperts)");
    }
    const std::string other = base + (is_blocks ? "_scales" : "_blocks");
    auto o = ck.tensors.find(other);
    if (o == ck.tensors.end())
      return bad("is MXFP4 but its " + std::string(is_blocks ? "scales" : "blocks") + " '" + other + "' are missing");
    if (!t.u8) return bad("must be U8 (MXFP4 " + std::string(is_blocks ? "codes" : "e8m0 scales") + ")");
    if (is_scales) {
      out.stored.insert(name);
      continue;  // checked with its blocks
    }
    auto converts = mxfp4_converts(scheme, module);
    if (!converts.ok())
      return Error{config_path + ": quantization_config.modules_to_not_convert: " + converts.error().message};
    if (!*converts) {
      return bad("is MXFP4, but " + config_path + "'s modules_to_not_convert excludes '" + module +
                 "' (its experts would be stored unquantized)");
    }
    const std::vector<int64_t>& b = t.shape;
    if (b.size() != 4 || b[3] != kGroupBytes || b[0] <= 0 || b[1] <= 0 || b[2] <= 0) {
      return bad("has shape " + shape_string(b) +
                 "; MXFP4 blocks are [n_expert, rows, cols / 32, 16] (16 bytes of codes per 32 weights)");
    }
    const SafetensorsTensor& s = tensor_at(o->second);
    const std::string& scale_file = ck.file_paths[o->second.first];
    if (!s.u8) return Error{scale_file + ": tensor '" + other + "' must be U8 (MXFP4 e8m0 scales)"};
    const std::vector<int64_t> want = {b[0], b[1], b[2]};
    if (s.shape != want) {
      return Error{scale_file + ": tensor '" + other + "' has shape " + shape_string(s.shape) + ", expected " +
                   shape_string(want) + " (one scale per 32 weights of '" + name + "' " + shape_string(b) + ")"};
    }
    Mxfp4Tensor m;
    m.name = base;
    m.file = loc.first;
    m.shape = {b[0], b[1], b[2] * kGroup};
    const auto n_groups = static_cast<size_t>(b[0] * b[1] * b[2]);
    m.n_bytes = n_groups * kBlockBytes;
    m.blocks.reset(new (std::nothrow) uint8_t[m.n_bytes]);  // written below: no zero-fill pass
    if (!m.blocks) return bad("does not fit in host memory re-laid as GGML MXFP4 blocks");
    out.stored.insert(name);
    out.tensors.push_back(std::move(m));
    jobs.push_back({&t, &s});
  }
  // The re-layout: a few byte operations per 32 weights, over all cores
  // for the large tensors (gpt-oss-120b holds ~1.2e11 MXFP4 weights).
  std::optional<ThreadPool> pool;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    Mxfp4Tensor& m = out.tensors[i];
    auto groups = [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        mxfp4_group_to_ggml(job.blocks->data + g * kGroupBytes, job.scales->data[g], m.blocks.get() + g * kBlockBytes);
      }
    };
    const auto n_groups = static_cast<int64_t>(m.n_bytes / kBlockBytes);
    if (n_groups < (int64_t{1} << 16)) {
      groups(0, n_groups);
      continue;
    }
    if (!pool) pool.emplace(0);
    pool->parallel_for(n_groups, int64_t{1} << 14, groups);
  }
  return out;
}

}  // namespace rill
