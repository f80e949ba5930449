#pragma once
// --device, --gpu-memory-fraction, --tensor-parallel, --batch-invariant, --host-sampling and
// --quantize, shared by rill run, bench and serve.
#include <CLI/CLI.hpp>

#include <string>

#include "cli/kv_type_flags.h"
#include "model/model.h"

namespace rill::cli {

struct DeviceFlags {
  std::string device = "cpu";
  double gpu_memory_fraction = 0.9;
  int tensor_parallel = 1;
  bool batch_invariant = false;
  bool host_sampling = false;
  std::string quantize = "none";
  KvTypeFlags kv_types;  // --kv-type, --kv-type-k, --kv-type-v, --kv-config

  Device value() const { return device == "cuda" ? Device::kCuda : Device::kCpu; }
  WeightQuantization quantization() const {
    return quantize == "fp8" ? WeightQuantization::kFp8 : WeightQuantization::kNone;
  }
  void add_to(CLI::App* app) {
    app->add_option("--device", device, "where the model runs: cpu or cuda (GPU 0; needs a CUDA build)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    app->add_option("--gpu-memory-fraction", gpu_memory_fraction,
                    "with --device cuda: share of GPU memory rill may use; the KV cache gets what weights and "
                    "activations leave (default 0.9)")
        ->check(CLI::Range(0.05, 0.99));
    app->add_option("--tensor-parallel", tensor_parallel,
                    "split the model over this many devices: with --device cuda, GPUs 0..N-1 over NCCL (heads, "
                    "KV heads and vocabulary divided evenly); on the CPU, simulated ranks (a reference, not faster)")
        ->check(CLI::Range(1, 64));
    app->add_flag("--batch-invariant", batch_invariant,
                  "with --device cuda: every matmul in a fixed order per token, so a request's output does not "
                  "depend on what else runs with it (slower; the CPU is always batch invariant)");
    app->add_flag("--host-sampling", host_sampling,
                  "with --device cuda: copy the logits of sampled (non-greedy) rows to the host and sample there "
                  "instead of on the device (the same tokens; for comparing the two)");
    app->add_option("--quantize", quantize,
                    "quantize float weights at load: fp8 (with --device cuda: e4m3 with a scale per row, every "
                    "matrix but the embedding table; half the bytes of bf16) or none. FP8 checkpoints (a "
                    "quantization_config in config.json) need no flag: CUDA runs them in FP8")
        ->check(CLI::IsMember({"none", "fp8"}));
    kv_types.add_to(app);
  }
};

}  // namespace rill::cli
