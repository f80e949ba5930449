#pragma once
// Sampler: turns one row of logits into a token id under a request's
// sampling parameters. Each request owns one Sampler with its own seeded RNG
// stream, so its tokens do not depend on what else runs in the batch.
//
// Order (as Hugging Face generate applies its processors, with OpenAI's
// logit_bias first): logit bias, repetition penalty, presence/frequency
// penalties, temperature, top-k, top-p, min-p, then a draw. temperature <= 0
// is greedy (argmax; ties go to the lowest id).
//
// The draw follows backend/sampling.h, the rule the CUDA sampler shares:
// candidates rank by tempered probability then lower id; top-k, top-p and
// min-p each keep a prefix of that ranking; the token is found by inverse
// CDF over the kept set in increasing id order with the uniform number of
// Philox(seed, draw index). So a request whose logits are not edited (no
// bias, no penalties) gets the same tokens whether its rows are sampled here
// or on the device (Model::forward_sample).
//
// Logprobs are the log-softmax of the logits after logit bias and penalties
// but BEFORE temperature, top-k, top-p and min-p (vLLM's "processed logits"
// minus the temperature): they describe the model's distribution as adjusted
// by the request, not the truncated distribution the token was drawn from.
//
// A token mask (constrained decoding: text/grammar) is such a truncation:
// after bias and penalties (and the logprobs) every token outside it gets
// -inf, then the draw runs as above, so the token is always one the mask
// allows (when the inverse CDF's rounding fallback lands outside it, the
// allowed token with the largest logit is taken instead).
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "backend/sampling.h"

namespace rill {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // CTRL-style, over prompt + output
  float presence_penalty = 0.0f;    // OpenAI-style, over output
  float frequency_penalty = 0.0f;   // OpenAI-style, over output
  std::optional<uint64_t> seed;     // unset: a random seed
  // OpenAI logit_bias: (token id, bias) added to the logits before anything
  // else. Ids outside [0, n_vocab) are ignored (the server validates them).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

inline constexpr int kMaxTopLogprobs = 20;  // OpenAI's top_logprobs limit

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// The sampled token with its logprob and the n_top most likely tokens
// (descending logprob, ties by lower id); top[n_top..] is unspecified.
struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;
  int n_top = 0;
  std::array<TokenLogprob, kMaxTopLogprobs> top{};
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t n_vocab);

  // Records tokens the penalties look at: prompt tokens (repetition only)
  // and generated tokens (all penalties).
  void add_prompt_tokens(std::span<const int32_t> ids);
  void add_output_token(int32_t id);

  // Picks a token from logits[n_vocab]. The logits are modified in place
  // (logit bias and penalties; temperature is not written back). No
  // allocation after construction.
  int32_t sample(float* logits) { return sample(logits, -1, nullptr); }

  // Same draw as sample(logits) (the RNG stream does not depend on logprobs).
  // n_top_logprobs < 0: logprobs off, `out` may be null. Otherwise `out`
  // receives the token, its logprob and min(n_top_logprobs, kMaxTopLogprobs,
  // n_vocab) top entries. Costs one extra pass over the vocabulary
  // (log-sum-exp in double) and no allocation.
  int32_t sample(float* logits, int n_top_logprobs, SampledToken* out) {
    return sample(logits, n_top_logprobs, out, {});
  }

  // Same, restricted to the tokens whose bit is set in `allowed` (bit t of
  // word t / 64; tokens past the mask's words are not allowed). Empty: no
  // mask. At least one allowed token must be in [0, n_vocab). The draw
  // consumes the RNG stream exactly as an unmasked one.
  int32_t sample(float* logits, int n_top_logprobs, SampledToken* out, std::span<const uint64_t> allowed);

  const SamplingParams& params() const { return params_; }

  // True when logit bias or penalties change the logits before the draw:
  // such a request's rows must be sampled here, from its logits.
  bool edits_logits() const;

  // True when sample() is exactly argmax(logits) (lowest id on ties) and
  // consumes no randomness: greedy temperature or top_k == 1, no logit bias,
  // no penalties. Such rows may be picked where the model runs
  // (Model::forward_greedy) with the same token.
  bool is_plain_greedy() const;

  // The next draw for a sampler where the model runs (Model::forward_sample),
  // which picks the token sample() would pick from the same logits. Takes
  // the draw: the stream advances as in sample(). Requires !edits_logits();
  // the caller still records the chosen token with add_output_token().
  DeviceSamplingParams take_device_draw();

  // The kept set of a draw from logits[n_vocab] (after bias and penalties):
  // token i may be drawn iff sampling_key(p_i, i) >= the result, p_i =
  // sampling_prob(logits[i], max, 1 / temperature). Meaningful when the draw
  // is not an argmax; takes no draw. For tests of other samplers.
  uint64_t kept_bound(const float* logits);

  // The token Model::forward_sample must give for `row` and logits[n_vocab]
  // (not modified) under the row's token mask `allowed` (one mask of
  // TokenMasks words, backend/sampling.h; null: unmasked): a Sampler of
  // row's parameters at draw index row.counter, sampling under that mask.
  // The host reference for device samplers and fakes; allocates.
  static int32_t reference_draw(const DeviceSamplingParams& row, const float* logits, int64_t n_vocab,
                                const uint32_t* allowed = nullptr);

  uint64_t seed() const { return seed_; }
  uint64_t n_draws() const { return n_draws_; }

 private:
  void apply_logit_bias(float* logits) const;
  void apply_penalties(float* logits) const;
  int32_t draw(const float* logits);
  void apply_mask(float* logits, std::span<const uint64_t> allowed) const;

  SamplingParams params_;
  int64_t n_vocab_;
  uint64_t seed_;
  uint64_t n_draws_ = 0;                               // random draws taken (argmax draws take none)
  std::vector<int32_t> output_counts_;                 // [n_vocab]
  std::vector<uint8_t> seen_;                          // [n_vocab] prompt or output
  std::vector<int32_t> touched_;                       // ids with a nonzero count or seen flag
  std::vector<float> probs_;                           // [n_vocab] tempered probabilities, reused per call
  std::vector<std::pair<float, int32_t>> candidates_;  // reused per call
};

// Index of the largest value; ties go to the lowest index.
int32_t argmax(const float* x, int64_t n);

}  // namespace rill
