#pragma once
// Options of `rill run`, shared by the one-shot path and the chat loop.
#include <optional>
#include <string>

#include "cli/device_flags.h"
#include "engine/sampler.h"
#include "loader/model_config.h"

namespace rill::cli {

struct RunOptions {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::string system;
  int max_tokens = 256;
  std::optional<float> temperature, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  float presence_penalty = 0, frequency_penalty = 0;
  bool json = false;
  bool raw = false;  // --prompt without the chat template
  bool ignore_eos = false;
  int threads = 0;
  int64_t ctx_size = 4096;
  DeviceFlags device;
};

// Flags first, then the model's generation_config defaults, then rill's
// (temperature 0.7, top_p 0.9: a sensible chat default when the model
// declares nothing).
SamplingParams resolve_sampling(const RunOptions& o, const GenerationDefaults& d);

}  // namespace rill::cli
