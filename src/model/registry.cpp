#include "model/registry.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

#include "backend/cuda/kv_stored_types.h"  // host-only: what CUDA stores, in words
#include "core/e4m3.h"
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

const char* device_name(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

ModelProfile infer_profile(const ModelFiles& files) {
  ModelProfile p;
  p.graph = files.config.architecture;
  p.loader = files.format == ModelFormat::kGguf ? "gguf" : "hf";
  // Encoders compute embeddings, never tokens: their profile says so, and
  // only an implementation of that loop takes them.
  p.generation_loop = p.graph == "bert" ? "encoder" : "autoregressive";
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

Result<const Implementation*> ImplementationRegistry::select(const ModelProfile& profile, Device device) const {
  auto fits = [&](const Implementation& impl) {
    return contains(impl.graphs, profile.graph) && contains(impl.loaders, profile.loader) &&
           impl.generation_loop == profile.generation_loop;
  };
  const std::string on = std::string(device_name(device));
  if (profile.implementation_id) {
    for (const Implementation& impl : impls_) {
      if (impl.id != *profile.implementation_id) continue;
      if (!fits(impl)) {
        return Error{"model registry: implementation '" + impl.id + "' does not implement " + describe(profile) +
                     "; refusing to fall back to another implementation"};
      }
      if (impl.device != device) {
        return Error{"model registry: implementation '" + impl.id + "' runs on " + device_name(impl.device) +
                     ", not on " + on + "; refusing to fall back to another implementation"};
      }
      return &impl;
    }
    return Error{"model registry: declared implementation '" + *profile.implementation_id +
                 "' is not registered; refusing to fall back to another implementation"};
  }
  const Implementation* found = nullptr;
  std::string elsewhere;  // implementations of the profile on other devices, for the error
  for (const Implementation& impl : impls_) {
    if (!fits(impl)) continue;
    if (impl.device != device) {
      elsewhere += (elsewhere.empty() ? "'" : ", '") + impl.id + "'";
      continue;
    }
    if (found) {
      return Error{"model registry: both '" + found->id + "' and '" + impl.id + "' implement " + describe(profile) +
                   " on " + on + "; the profile must declare implementation_id"};
    }
    found = &impl;
  }
  if (!found && !elsewhere.empty()) {
    return Error{"model registry: no " + on + " implementation of " + describe(profile) + " (there is " + elsewhere +
                 "); refusing to fall back to another device"};
  }
  if (!found) {
    return Error{"model registry: no implementation for " + describe(profile) + " (unsupported architecture)"};
  }
  return found;
}

const ImplementationRegistry& builtin_registry() {
  static const ImplementationRegistry registry = [] {
    const std::vector<std::string> llama = {"llama",   "mistral",   "qwen2",    "qwen3",  "smollm",
                                            "mixtral", "qwen3_moe", "glm4_moe", "minicpm"};
    const std::vector<std::string> gemma = {"gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4"};
    const std::vector<std::string> qwen3_next = {"qwen3_5_text", "qwen3_next"};
    const std::vector<std::string> loaders = {"gguf", "hf"};
    // A CUDA implementation is registered in every build: in one without
    // CUDA its factory says so (cuda_not_built) rather than the id missing.
    std::vector<Implementation> impls = {
        {"llama.cpu", llama, loaders, "autoregressive", Device::kCpu, &create_llama_cpu_model,
         /*tensor_parallel=*/true},
        {"llama.cuda", llama, loaders, "autoregressive", Device::kCuda, &create_llama_cuda_model,
         /*tensor_parallel=*/true},
        {"gemma.cpu", gemma, loaders, "autoregressive", Device::kCpu, &create_gemma_cpu_model,
         /*tensor_parallel=*/false},
        {"gemma.cuda", gemma, loaders, "autoregressive", Device::kCuda, &create_gemma_cuda_model,
         /*tensor_parallel=*/false},
        {"qwen3_next.cpu", qwen3_next, loaders, "autoregressive", Device::kCpu, &create_qwen3_next_cpu_model,
         /*tensor_parallel=*/false},
        {"qwen3_next.cuda", qwen3_next, loaders, "autoregressive", Device::kCuda, &create_qwen3_next_cuda_model,
         /*tensor_parallel=*/false},
        {"gpt_oss.cpu",
         {"gpt_oss"},
         loaders,
         "autoregressive",
         Device::kCpu,
         &create_gpt_oss_cpu_model,
         /*tensor_parallel=*/false},
        {"gpt_oss.cuda",
         {"gpt_oss"},
         loaders,
         "autoregressive",
         Device::kCuda,
         &create_gpt_oss_cuda_model,
         /*tensor_parallel=*/false},
        {"bert.cpu", {"bert"}, {"hf"}, "encoder", Device::kCpu, &create_bert_cpu_model, /*tensor_parallel=*/false},
        {"bert.cuda", {"bert"}, {"hf"}, "encoder", Device::kCuda, &create_bert_cuda_model, /*tensor_parallel=*/false},
        {"deepseek_v3.cpu",
         {"deepseek_v3"},
         loaders,
         "autoregressive",
         Device::kCpu,
         &create_mla_cpu_model,
         /*tensor_parallel=*/false},
        {"deepseek_v3.cuda",
         {"deepseek_v3"},
         loaders,
         "autoregressive",
         Device::kCuda,
         &create_mla_cuda_model,
         /*tensor_parallel=*/false},
        {"minicpm3.cpu",
         {"minicpm3"},
         loaders,
         "autoregressive",
         Device::kCpu,
         &create_mla_cpu_model,
         /*tensor_parallel=*/false},
        {"minicpm3.cuda",
         {"minicpm3"},
         loaders,
         "autoregressive",
         Device::kCuda,
         &create_mla_cuda_model,
         /*tensor_parallel=*/false},
        {"glm_moe_dsa.cpu",
         {"glm_moe_dsa"},
         loaders,
         "autoregressive",
         Device::kCpu,
         &create_mla_cpu_model,
         /*tensor_parallel=*/false},
        {"glm_moe_dsa.cuda",
         {"glm_moe_dsa"},
         loaders,
         "autoregressive",
         Device::kCuda,
         &create_mla_cuda_model,
         /*tensor_parallel=*/false},
    };
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
  RILL_ASSIGN_OR_RETURN(const Implementation* impl, registry.select(profile, options.device));
  if (options.quantize == WeightQuantization::kFp8 && options.device != Device::kCuda) {
    return Error{files->path + ": --quantize fp8 runs on --device cuda only (the CPU kernels read GGUF types)"};
  }
  std::vector<std::optional<KvType>> sides = {options.kv_types.k, options.kv_types.v};
  for (const KvTypeOptions::Entry& e : options.kv_types.layers) sides.insert(sides.end(), {e.k, e.v});
  auto chan_name = [](DType t) { return t == kKvQ4Alloc ? std::string("q4a (k4a)") : std::string("q4c (k4c)"); };
  // k4c's q4c K needs a per-sequence KV tail (model/kv_tails.h), which only
  // the Llama and Gemma families' models keep: said first, on either
  // device, before the CUDA switch below (which would not make it run).
  // (A Gemma model on CUDA says itself when it keeps none: KV sharing.)
  const bool keeps_tails = impl->id.rfind("llama.", 0) == 0 || impl->id == "gemma.cpu" || impl->id == "gemma.cuda";
  for (const std::optional<KvType>& side : sides) {
    if (side && kv_chan_k(side->dtype) && !keeps_tails) {
      return Error{files->path + ": KV type " + chan_name(side->dtype) +
                   " runs on the Llama and Gemma families' models only (it needs a per-sequence KV tail, which " +
                   "only they keep), not on " + impl->id + "; use another KV type"};
    }
  }
  if (options.device == Device::kCuda) {
    // CUDA stores f16 KV (f32 for f32 checkpoints), q8_0, q4_0, the
    // rotated q8_0h / q4_0h / iq4_nlh / q8_0h64 / iq4_nlh64, k4c's q4c K
    // and k4a's q4a K (as their pairs alone: choose_kv_type), fp8, bf16,
    // q4_1, q5_0 or q5_1; it reads no other type. Which plain type the model stores, that one type
    // covers every layer and side, and the head_dim a rotation needs,
    // CudaModelBase::choose_kv_type checks.
    const std::string stored = cuda::kv_types_cuda_stores();
    for (const std::optional<KvType>& side : sides) {
      if (!side) continue;
      const DType t = side->dtype;
      const bool rotatable =
          t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kIQ4_NL || t == kKvQ8_0x64 || t == kKvIq4Nl64;
      const bool plain = t == DType::kF16 || t == DType::kF32 || t == DType::kBF16 || t == DType::kQ8_0 ||
                         t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
                         t == kF8E4M3 || kv_chan_k(t);
      if (!(side->rotated ? rotatable : plain)) {
        return Error{files->path + ": KV type " + kv_type_name(*side) + " runs on the CPU only (" + stored +
                     "); use one of those, or --device cpu"};
      }
    }
  }
  // k4c's per-sequence KV tails (model/kv_tails.h) live in one CPU model,
  // not in a tensor-parallel group of ranks.
  for (const std::optional<KvType>& side : sides) {
    if (side && kv_chan_k(side->dtype) && options.tensor_parallel != 1) {
      return Error{files->path + ": KV type " + chan_name(side->dtype) + " does not run with --tensor-parallel " +
                   std::to_string(options.tensor_parallel) + "; use another KV type"};
    }
  }
  // No family splits its MTP layer over ranks (the Llama family's shards
  // carry no MTP weights): refused here, before any rank is built.
  if (options.mtp && options.tensor_parallel != 1) {
    return Error{files->path + ": --spec mtp does not run with --tensor-parallel " +
                 std::to_string(options.tensor_parallel) +
                 " (no family splits its MTP layer over ranks yet); run it with --tensor-parallel 1"};
  }
  if (options.tensor_parallel > 1 && !impl->tensor_parallel) {
    return Error{files->path + ": " + impl->id + " (" + profile.graph +
                 ") has no tensor-parallel implementation; run it with --tensor-parallel 1"};
  }
  const std::string path = files->path;
  auto model = impl->create(std::move(files), options);
  if (model.ok() && options.mtp && (*model)->n_mtp_layers() == 0) {
    return Error{path + ": " + impl->id + " does not run multi-token-prediction layers (--spec mtp)"};
  }
  return model;
}

}  // namespace rill
