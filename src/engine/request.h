#pragma once
// Request: the engine's state for one generation. State is counters, not
// phases: `tokens` holds the prompt followed by the output so far, and
// `n_computed` counts the leading tokens whose KV exists. Each step the
// scheduler gives a request some of its uncomputed tokens; prefill, chunked
// prefill, a prefix-cache hit (n_computed jumps forward at admission) and
// preemption (n_computed drops to what the cache still holds) all follow
// from that one rule: a step's work for a request is target minus computed
// tokens. A request samples when a step computes its last token.
//
// Draft tokens (speculative decoding): the last n_draft entries of `tokens`
// are a speculator's guesses following the last sampled token. They count
// toward the target (their KV is computed by the step that verifies them)
// but not toward the output; whoever verifies them keeps the accepted ones
// and truncates the rest. Without speculation n_draft is 0.
//
// Owned and touched only by the engine thread.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "rill/engine.h"
#include "text/detokenizer.h"
#include "text/grammar/grammar_matcher.h"
#include "text/stop_matcher.h"

namespace rill {

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished };

struct Request {
  using Clock = std::chrono::steady_clock;

  uint64_t id = 0;
  GenerationRequest params;
  std::shared_ptr<const EventCallback> on_event;  // null: no consumer (shared with queued events)
  RequestState state = RequestState::kWaiting;

  std::vector<int32_t> tokens;  // prompt, then output
  int32_t n_prompt = 0;
  int32_t n_computed = 0;  // leading tokens whose KV exists
  int32_t n_cached = 0;    // prompt tokens served by the prefix cache (first admission)
  bool admitted_once = false;
  int32_t n_preemptions = 0;
  uint64_t arrival = 0;  // submission order; preemption picks the newest
  uint64_t ns = 0;       // prefix-cache namespace (model fingerprint + cache_namespace)
  int32_t n_draft = 0;   // trailing draft tokens of `tokens` (see above)
  // Speculation (engine.cpp): the draft length for the next round (adapted
  // to this request's acceptance), a running acceptance rate, rounds left
  // without drafts after a poor streak, and the totals for Usage.
  struct Speculation {
    int32_t k = 0;
    float rate = 1.0f;
    int32_t n_skip = 0;
    int32_t n_drafted = 0, n_accepted = 0;
  } spec;

  // prompt_logprobs: entries for prompt tokens 1..n_prompt_scored, computed
  // so far (moved into the event that delivers them); n_prompt_scored stays,
  // so a resume after preemption does not score again.
  std::vector<SampledToken> prompt_scores;
  int32_t n_prompt_scored = 0;

  std::optional<Sampler> sampler;
  std::optional<IncrementalDecoder> decoder;
  std::optional<StopMatcher> stops;
  // Constrained requests (params.grammar): the position in the grammar and
  // the mask of the next token (vocabulary bits), both built when the
  // request first runs.
  std::optional<grammar::GrammarMatcher> matcher;
  std::vector<uint64_t> mask;
  // Where the output is relative to the thinking block
  // (GenerationRequest::Thinking): kUntracked without one; kMaybe before the
  // first token (which may open it); n_thinking counts the tokens inside.
  enum class Think { kUntracked, kMaybe, kInside, kAfter };
  Think think = Think::kUntracked;
  int32_t n_thinking = 0;
  int32_t n_reasoning = 0;  // output tokens of the block, its open and close included (Usage::reasoning_tokens)
  // The grammar constrains this token (not inside the thinking block).
  bool grammar_applies() const { return matcher && think != Think::kInside; }
  // The thinking budget is spent: the next token is the block's close.
  bool must_close_thinking() const {
    return think == Think::kInside && params.thinking.budget >= 0 && n_thinking >= params.thinking.budget;
  }

  Clock::time_point submitted, first_scheduled, first_token;
  int32_t prefill_steps = 0;
  double longest_prefill_step_s = 0;
  bool scheduled_once = false;

  int32_t n_output() const { return static_cast<int32_t>(tokens.size()) - n_prompt - n_draft; }
  // Tokens whose KV the request wants: prompt, output and drafts.
  int32_t n_target() const { return static_cast<int32_t>(tokens.size()); }
  int32_t n_uncomputed() const { return n_target() - n_computed; }
  // Everything before the last sampled token is computed: what is left is
  // one decode round, that token and its drafts (1 + n_draft tokens).
  bool decoding() const { return n_uncomputed() - n_draft == 1; }
  // Forgets the last n of the drafts (not scheduled, or rejected). Requires
  // their KV not to be counted as computed (roll n_computed back first).
  void drop_draft(int32_t n) {
    assert(n >= 0 && n <= n_draft && n_target() - n >= n_computed);
    n_draft -= n;
    tokens.resize(tokens.size() - static_cast<size_t>(n));
  }
  bool finished() const { return state == RequestState::kFinished; }

  // Prompt positions [lo, lo + n) of a chunk of n_tokens from n_computed
  // whose logit rows score the next prompt token (prompt_logprobs).
  int32_t first_scored_position() const { return std::max(n_computed, n_prompt_scored); }
  int32_t n_scored_rows(int32_t n_tokens) const {
    if (params.prompt_logprobs < 0) return 0;
    return std::max(0, std::min(n_computed + n_tokens, n_prompt - 1) - first_scored_position());
  }
  // The chunk of n_tokens from n_computed samples a token: it reaches the
  // target and the request generates.
  bool samples_after(int32_t n_tokens) const {
    return n_computed + n_tokens == n_target() && !params.prompt_only && !params.embed;
  }
  // Logit rows that chunk returns: its scored positions, then the sampling
  // row and one row per draft it verifies (drafts are only ever in a chunk
  // that ends at the target).
  int32_t logit_rows(int32_t n_tokens) const {
    return n_scored_rows(n_tokens) + (samples_after(n_tokens) ? 1 + n_draft : 0);
  }
  // The most prompt tokens admission may take from the prefix cache.
  // An embedding pools the states of its whole prompt: it computes them all.
  int32_t max_cached_tokens() const {
    if (params.embed) return 0;
    return params.prompt_logprobs >= 0 ? n_prompt_scored : INT32_MAX;
  }
};

}  // namespace rill
