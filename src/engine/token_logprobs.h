#pragma once
// The logprob of one token and the most likely alternatives, from one row
// of logits: what sampled tokens (Sampler) and scored prompt tokens
// (GenerationRequest::prompt_logprobs) report.
#include <cstdint>

#include "engine/sampler.h"

namespace rill {

// out = {id, log_softmax(logits)[id], n_top, the n_top most likely tokens
// (descending logprob, ties by lower id)}. The log-sum-exp accumulates in
// double (float sums over 150k exp terms lose the tail the top entries are
// compared against). Requires 0 <= n_top <= min(kMaxTopLogprobs, n_vocab).
// No allocation: O(n_vocab log n_top). Returns the log-sum-exp of the row;
// id < 0 leaves out.id and out.logprob to the caller (the Sampler fills the
// top entries before a token mask changes the row, and the token after).
double token_logprobs(const float* logits, int64_t n_vocab, int32_t id, int n_top, SampledToken& out);

}  // namespace rill
