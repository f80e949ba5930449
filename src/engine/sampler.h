#pragma once
// Sampler: turns one row of logits into a token id under a request's
// sampling parameters. Each request owns one Sampler with its own seeded RNG
// stream, so its tokens do not depend on what else runs in the batch.
//
// Order (as Hugging Face generate applies its processors): repetition
// penalty, presence/frequency penalties, temperature, top-k, top-p, min-p,
// then a draw. temperature <= 0 is greedy (argmax; ties go to the lowest id).
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace rill {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;        // 0: off
  float top_p = 1.0f;   // 1: off
  float min_p = 0.0f;   // 0: off
  float repetition_penalty = 1.0f;  // CTRL-style, over prompt + output
  float presence_penalty = 0.0f;    // OpenAI-style, over output
  float frequency_penalty = 0.0f;   // OpenAI-style, over output
  std::optional<uint64_t> seed;     // unset: a random seed
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t n_vocab);

  // Records tokens the penalties look at: prompt tokens (repetition only)
  // and generated tokens (all penalties).
  void add_prompt_tokens(std::span<const int32_t> ids);
  void add_output_token(int32_t id);

  // Picks a token from logits[n_vocab]. The logits are modified in place
  // (penalties and temperature). No allocation after construction.
  int32_t sample(float* logits);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(float* logits) const;

  SamplingParams params_;
  int64_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<int32_t> output_counts_;  // [n_vocab]
  std::vector<uint8_t> seen_;           // [n_vocab] prompt or output
  std::vector<int32_t> touched_;        // ids with a nonzero count or seen flag
  std::vector<std::pair<float, int32_t>> candidates_;  // reused per call
};

// Index of the largest value; ties go to the lowest index.
int32_t argmax(const float* x, int64_t n);

}  // namespace rill
