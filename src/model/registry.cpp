#include "model/registry.h"

#include <algorithm>
#include <set>

#include "model/arch/families.h"
#include "model/fingerprint.h"

namespace rill {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string describe(const ModelProfile& p) {
  return "graph '" + p.graph + "', loader '" + p.loader + "', loop '" + p.generation_loop + "'";
}

}  // namespace

ModelProfile infer_profile(const ModelFiles& files) {
  ModelProfile p;
  p.graph = files.config.architecture;
  p.loader = files.format == ModelFormat::kGguf ? "gguf" : "hf";
  p.generation_loop = "autoregressive";
  return p;
}

Result<ImplementationRegistry> ImplementationRegistry::create(std::vector<Implementation> impls) {
  std::set<std::string> ids;
  for (const Implementation& impl : impls) {
    if (impl.id.empty()) return Error{"model registry: implementation with an empty id"};
    if (!ids.insert(impl.id).second) {
      return Error{"model registry: duplicate implementation id '" + impl.id + "'"};
    }
    if (impl.graphs.empty()) return Error{"model registry: implementation '" + impl.id + "' has no graphs"};
    if (!impl.create) return Error{"model registry: implementation '" + impl.id + "' has no factory"};
  }
  ImplementationRegistry r;
  r.impls_ = std::move(impls);
  return r;
}

Result<ImplementationRegistry> ImplementationRegistry::with(Implementation impl) const {
  std::vector<Implementation> all = impls_;
  all.push_back(std::move(impl));
  return create(std::move(all));
}

Result<const Implementation*> ImplementationRegistry::select(const ModelProfile& profile) const {
  auto fits = [&](const Implementation& impl) {
    return contains(impl.graphs, profile.graph) && contains(impl.loaders, profile.loader) &&
           impl.generation_loop == profile.generation_loop;
  };
  if (profile.implementation_id) {
    for (const Implementation& impl : impls_) {
      if (impl.id != *profile.implementation_id) continue;
      if (!fits(impl)) {
        return Error{"model registry: implementation '" + impl.id + "' does not implement " + describe(profile) +
                     "; refusing to fall back to another implementation"};
      }
      return &impl;
    }
    return Error{"model registry: declared implementation '" + *profile.implementation_id +
                 "' is not registered; refusing to fall back to another implementation"};
  }
  const Implementation* found = nullptr;
  for (const Implementation& impl : impls_) {
    if (!fits(impl)) continue;
    if (found) {
      return Error{"model registry: both '" + found->id + "' and '" + impl.id + "' implement " + describe(profile) +
                   "; the profile must declare implementation_id"};
    }
    found = &impl;
  }
  if (!found) {
    return Error{"model registry: no implementation for " + describe(profile) + " (unsupported architecture)"};
  }
  return found;
}

const ImplementationRegistry& builtin_registry() {
  static const ImplementationRegistry registry = [] {
    std::vector<Implementation> impls;
    impls.push_back({"cpu.llama",
                     {"llama", "mistral", "qwen2", "qwen3", "smollm", "mixtral", "qwen3_moe"},
                     {"gguf", "hf"},
                     "autoregressive",
                     &create_llama_model,
                     /*tensor_parallel=*/true});
    impls.push_back(
        {"cpu.gemma", {"gemma2", "gemma3_text", "gemma3"}, {"gguf", "hf"}, "autoregressive", &create_gemma_model});
    impls.push_back(
        {"cpu.qwen3_next", {"qwen3_5_text", "qwen3_next"}, {"gguf", "hf"}, "autoregressive", &create_qwen3_next_model});
    auto r = ImplementationRegistry::create(std::move(impls));
    return std::move(r).value();
  }();
  return registry;
}

Result<std::unique_ptr<Model>> create_model(const ImplementationRegistry& registry, const ModelProfile& profile,
                                            std::shared_ptr<const ModelFiles> files, const ModelOptions& options) {
  if (profile.config_fingerprint) {
    const std::string actual = config_fingerprint(files->config);
    if (actual != *profile.config_fingerprint) {
      return Error{files->path + ": config fingerprint " + actual + " differs from the profile's " +
                   *profile.config_fingerprint + "; refusing to fall back"};
    }
  }
  if (profile.artifact_fingerprint) {
    const std::string actual = artifact_fingerprint(*files);
    if (actual != *profile.artifact_fingerprint) {
      return Error{files->path + ": artifact fingerprint " + actual + " differs from the profile's " +
                   *profile.artifact_fingerprint + "; refusing to fall back"};
    }
  }
  RILL_ASSIGN_OR_RETURN(const Implementation* impl, registry.select(profile));
  if (options.tensor_parallel > 1 && !impl->tensor_parallel) {
    return Error{files->path + ": " + impl->id + " (" + profile.graph +
                 ") has no tensor-parallel implementation; run it with --tensor-parallel 1"};
  }
  return impl->create(std::move(files), options);
}

}  // namespace rill
