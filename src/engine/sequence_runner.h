#pragma once
// SequenceRunner: generates for one sequence at a time on one KV slot of a
// Model: chunked prefill, then decode a token per step. It remembers which
// tokens the slot holds, so a follow-up prompt that extends the previous one
// (the next turn of a chat) recomputes only the new tokens; at least one
// token is always recomputed so there are logits to sample. Models with
// recurrent layers use state slot `kv_slot` and reuse only a follow-up that
// continues everything the slot holds (the state cannot step back).
//
// The slot is a fixed carving of the model's KV pool (slot_block_table()):
// slot s owns blocks [s * per_slot, (s + 1) * per_slot), in every KV group of
// the model (a group's layers have KV planes of their own, so groups may
// name the same block ids). Used by `rill run/score` and tests; the Engine
// pages KV through its KvManager instead.
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/result.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "rill/engine.h"

namespace rill {

struct GenerationOptions {
  int max_tokens = 256;
  std::vector<int32_t> eos_ids;  // generation stops after emitting one of these
  bool ignore_eos = false;
  SamplingParams sampling;
};

struct GenerationTimings {
  int n_prompt = 0;  // prompt tokens
  int n_cached = 0;  // of those, reused from the slot
  int n_generated = 0;
  double prefill_s = 0;      // computing the prompt up to the first sampled token
  double decode_s = 0;       // every later step
  double first_token_s = 0;  // from the call to the first token
};

struct GenerationResult {
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::kLength;
  GenerationTimings timings;
};

class SequenceRunner {
 public:
  explicit SequenceRunner(Model& model, int32_t kv_slot = 0);

  // on_token(id) is called for each generated token (including a final EOS);
  // returning false aborts. The prompt must fit: prompt + max_tokens <= n_ctx.
  Result<GenerationResult> generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                                    const std::function<bool(int32_t)>& on_token);

  // Logits for every position of `ids`, computed from an empty slot:
  // [ids.size(), n_vocab] row-major.
  Result<std::vector<float>> score(std::span<const int32_t> ids);

  // Forget what the slot holds.
  void reset() { cached_.clear(); }

 private:
  // Computes tokens [from, ids.size()) given KV for [0, from); fills logits_
  // with the last token's row when sample_last.
  Status prefill(std::span<const int32_t> ids, size_t from, bool want_all_rows);
  // batch_ = one chunk of n tokens at [pos0, pos0 + n) with the slot's table in every group.
  void set_chunk(const int32_t* ids, int32_t n, int32_t pos0, bool sample_last);

  Model& model_;
  int32_t slot_;
  std::vector<int32_t> table_;   // the slot's blocks
  std::vector<int32_t> cached_;  // tokens whose KV the slot holds, in order
  // BatchSeq::decode_from of the chunks: the prompt's length while
  // generating (its output tokens decode), unbounded while scoring.
  int32_t decode_from_ = -1;
  Batch batch_;
  std::vector<float> logits_;  // [max_batch_tokens or 1, n_vocab]
};

}  // namespace rill
