#pragma once
// Model profiles and the implementation registry.
//
// A profile declares how a model is run: its graph (architecture), loader,
// generation loop and, optionally, the exact implementation id and the
// artifact/config fingerprints it was validated with. An implementation is
// one graph on one device (ids "<graph family>.<device>": "llama.cpu",
// "llama.cuda"); select() returns exactly the declared implementation for
// the device asked for, or fails: it never falls back to another numerical
// implementation nor to another device. A registry is immutable; with()
// returns a new registry with one more implementation.
//
// The device is select()'s argument, not a profile field: create_model
// passes ModelOptions::device, the one the factory builds for, so the
// profile and the options cannot disagree about it.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"

namespace rill {

struct ModelProfile {
  std::string graph;            // architecture, e.g. "llama"
  std::string loader;           // "gguf" or "hf"
  std::string generation_loop;  // "autoregressive", or "encoder" (embeddings only: bert)
  std::optional<std::string> implementation_id;
  std::optional<std::string> artifact_fingerprint;
  std::optional<std::string> config_fingerprint;
};

// The profile a model's files imply (no pinned implementation or fingerprints).
ModelProfile infer_profile(const ModelFiles& files);

using ModelFactory =
    std::function<Result<std::unique_ptr<Model>>(std::shared_ptr<const ModelFiles>, const ModelOptions&)>;

// "cpu" or "cuda", as in the ids and --device.
const char* device_name(Device device);

struct Implementation {
  std::string id;                    // unique, e.g. "llama.cpu"
  std::vector<std::string> graphs;   // architectures it implements
  std::vector<std::string> loaders;  // loaders it accepts
  std::string generation_loop = "autoregressive";
  Device device = Device::kCpu;  // where create() builds the model; it never looks at options.device
  ModelFactory create;
  // Whether create() accepts ModelOptions::tensor_parallel > 1 (a mode of
  // the implementation: simulated ranks on the CPU, NCCL on CUDA);
  // create_model refuses such options for implementations without it.
  bool tensor_parallel = false;
};

class ImplementationRegistry {
 public:
  // Errors on an empty id, a duplicate id, no graphs, or no factory.
  static Result<ImplementationRegistry> create(std::vector<Implementation> impls);
  // A new registry holding this one's implementations plus `impl`.
  Result<ImplementationRegistry> with(Implementation impl) const;

  // The declared implementation (profile.implementation_id) if it exists,
  // implements the profile's graph/loader/loop and runs on `device`;
  // otherwise the single implementation registered for the graph on
  // `device`. Any mismatch (including an implementation of the graph on
  // another device only) is an error that says it refuses to fall back.
  Result<const Implementation*> select(const ModelProfile& profile, Device device) const;

  const std::vector<Implementation>& implementations() const { return impls_; }

 private:
  std::vector<Implementation> impls_;
};

// rill's built-in implementations.
const ImplementationRegistry& builtin_registry();

// Checks the profile's pinned fingerprints against `files`, selects for
// options.device, creates.
Result<std::unique_ptr<Model>> create_model(const ImplementationRegistry& registry, const ModelProfile& profile,
                                            std::shared_ptr<const ModelFiles> files, const ModelOptions& options);

}  // namespace rill
