#pragma once
// Speculator: proposes draft tokens for a decoding request, which the engine
// verifies in the request's next step (speculative decoding). A speculator
// only guesses: the engine computes the request's last sampled token and
// its k drafts in one step (1 + k logit rows), takes at each position the
// token non-speculative decoding would take from that row (the same
// sampler, mask and seeded draw), keeps the drafts while they equal it and
// drops the rest (engine/engine.cpp: verify). So the output does not depend
// on what a speculator proposes, only the number of steps does.
//
// Chosen per server (EngineOptions::spec, `--spec`), opted out of per
// request (GenerationRequest::speculative). Engine thread only; the engine
// asks once per step for every speculating row (propose_batch), which
// must not allocate once its buffers have grown.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/model.h"
#include "rill/engine.h"
#include "text/tokenizer.h"

namespace rill {

// Rows of one request's step that a speculator reading the target's hidden
// states sees (Speculator::observe): positions [first, first + n), whose
// KV the target kept (rejected drafts' rows are not among them).
struct HiddenRows {
  uint64_t seq = 0;
  std::span<const int32_t> tokens;  // the request's tokens now: more than first + n of them
  int32_t first = 0;
  int32_t n = 0;
  const float* hidden = nullptr;  // [n, n_embd]: final-normed (Model::forward_hidden)
  // The request's KV blocks (group 0), covering first + n + n_drafts - 1
  // positions: past first + n, the request's own tail block or scratch
  // blocks leased for this observe() only, where a chained draft may write
  // rows that nothing reads after it (the next observe() rewrites every
  // kept position before a draft reads it).
  std::span<const int32_t> block_table;
  int32_t decode_from = 0;  // BatchSeq::decode_from: the request's prompt length
  int32_t n_drafts = 0;     // the most drafts the request's next step takes (0: none)
  // The request's own blocks (of block_table's, the first n_own_blocks) and
  // its tables of the other KV groups 1.. (n_own_blocks entries each, end
  // to end, as model/batch.h's group_tables; -1 where a group holds no
  // block): for a drafter that reads the target's KV of every group
  // (Gemma 4's assistant).
  int32_t n_own_blocks = 0;
  std::span<const int32_t> group_tables;
};

// One request's part of a step's propose_batch().
struct DraftRequest {
  uint64_t seq = 0;                 // the request's id
  std::span<const int32_t> tokens;  // its prompt and output so far (at least one token)
  int32_t max_tokens = 0;           // >= 1
  int32_t n_drafts = 0;             // set by propose_batch: how many of `out` are its drafts
};

class Speculator {
 public:
  virtual ~Speculator() = default;
  // The name /metrics labels its counters with ("ngram", ...).
  virtual const char* name() const = 0;
  // Appends up to max_tokens (>= 1) guesses of what follows `tokens` (the
  // request's prompt and output so far, at least one token) to `out`;
  // appends nothing when it has no guess. `seq` is the request's id: a
  // stateful speculator (a draft model's KV) keeps its state under it, and
  // finds in `tokens` which of its earlier guesses were kept.
  virtual void propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                       std::vector<int32_t>& out) = 0;
  // propose() for every request of one step: appends each request's drafts
  // to `out` in request order and sets its n_drafts. A request's drafts are
  // what propose() alone would give it; a speculator that runs a model
  // overrides this to compute every request's draft position in one
  // forward (k forwards per step instead of k per request). Default:
  // propose() per request. Requests must have distinct seqs.
  virtual void propose_batch(std::span<DraftRequest> requests, std::vector<int32_t>& out);
  // A speculator that reads the target's hidden states (MTP) returns true;
  // the engine then computes them in every step (ModelRunner::
  // set_want_hidden) and hands each speculating request's kept rows to
  // observe() after the step's verification.
  virtual bool wants_hidden() const { return false; }
  // Whether observe()'s chained drafts write KV rows past the kept
  // positions (an MTP layer's): the engine then leases scratch blocks for
  // them (HiddenRows::block_table). A drafter that only reads the target's
  // KV (Gemma 4's assistant) needs none.
  virtual bool chain_writes_kv() const { return true; }
  virtual void observe(std::span<const HiddenRows> rows) { (void)rows; }
  // Request `seq` ended: drop what propose() kept for it.
  virtual void release(uint64_t seq) { (void)seq; }
};

// Prompt lookup: finds the latest earlier occurrence of the last n tokens
// (n = max_ngram down to min_ngram, the longest match wins) in the prompt
// and output, and proposes the tokens that followed it. Strong where the
// output copies its input (edits, code refactors, retrieval answers); it
// proposes nothing when the tail never occurred before.
class NgramSpeculator final : public Speculator {
 public:
  explicit NgramSpeculator(int32_t max_ngram = 3, int32_t min_ngram = 1);
  const char* name() const override { return "ngram"; }
  void propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& out) override;

 private:
  int32_t max_ngram_, min_ngram_;
};

// What a speculator serves: the target model, its tokenizer (may be null),
// where it came from (for messages) and the engine's options (a draft
// model runs on the same device with the same threads and context).
struct SpeculatorTarget {
  Model* model = nullptr;  // an MTP speculator runs the target's MTP layer
  const Tokenizer* tokenizer = nullptr;
  std::string model_path;
  EngineOptions options;
};

// The server's choice (`--spec`): "off", "ngram", "draft=PATH" (a draft
// model, engine/draft_speculator.h; needs target.model), "mtp" (the
// target's multi-token-prediction layer, engine/mtp_speculator.h; needs
// target.model loaded with ModelOptions::mtp) or "assistant=PATH" (Gemma
// 4's assistant, engine/assistant_speculator.h; needs target.model loaded
// with ModelOptions::gemma4_assistant = PATH); anything else is refused
// naming the accepted values. "off" gives null.
Result<std::unique_ptr<Speculator>> make_speculator(const std::string& spec, const SpeculatorTarget& target = {});

}  // namespace rill
