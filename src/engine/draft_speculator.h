#pragma once
// DraftModelSpeculator (`--spec draft=PATH`): a smaller model with the
// target's tokenizer proposes k tokens per speculating request, greedily.
// It runs on the target's device with its own paged KV (its own Model,
// BlockPool and KvManager), keyed by the request id. A step's requests
// draft together (propose_batch): each first rolls the draft's KV back to
// the longest prefix it shares with the request's tokens (so the target's
// rejections roll it back too); the missing tokens of all requests are
// computed in shared forwards (chunks packed up to max_batch_tokens), then
// draft position j of every request still drafting is one forward. So a
// step costs k draft forwards, not k per request; a request's drafts do
// not depend on the others (the model's batch invariance, BatchSeq::
// decode_from). Nothing of it reaches the prefix cache (a truncate never
// meets a shared block).
//
// Engine thread only. A request the draft's KV pool cannot hold (after
// giving back the draft KV of requests outside the step) gets no drafts;
// release() ends a request's draft KV.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/speculator.h"
#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "kv/prefix_tree.h"
#include "kv/state_pool.h"
#include "model/batch.h"
#include "model/model.h"

namespace rill {

class DraftModelSpeculator final : public Speculator {
 public:
  // Loads the draft model at `path` for `target` (ModelOptions from the
  // target's engine options). Errors name both files: a tokenizer (or,
  // without tokenizers, a vocabulary size) other than the target's; a
  // draft with recurrent layers (its state is not rolled back) is refused.
  static Result<std::unique_ptr<Speculator>> load(const std::string& path, const SpeculatorTarget& target);

  const char* name() const override { return "draft"; }
  void propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& out) override;
  void propose_batch(std::span<DraftRequest> requests, std::vector<int32_t>& out) override;
  void release(uint64_t seq) override;

 private:
  struct Sequence {
    std::vector<int32_t> computed;  // the tokens in the draft's KV
    int32_t decode_from = 0;        // BatchSeq::decode_from: where its first propose()'s owed token is
    uint64_t round = 0;             // the last propose_batch round it took part in
  };
  // A request of the current round that drafts.
  struct Row {
    DraftRequest* request = nullptr;
    Sequence* seq = nullptr;  // stable: unordered_map nodes do not move
    int32_t next = -1;        // the greedy pick after `computed`; -1 until computed
    int32_t first_draft = 0;  // its drafts' start in drafted_
    int32_t n_drafts = 0;
  };

  DraftModelSpeculator(std::unique_ptr<Model> model, int64_t n_target_vocab);
  // Rolls r's draft KV back to what it shares with r.tokens and reserves
  // the rest plus r.max_tokens - 1 drafts, giving back the KV of requests
  // outside this round when the pool is short. False (its KV released)
  // when it cannot draft.
  bool prepare(DraftRequest& r);
  // Computes every row's missing tokens; false on a failed forward.
  bool catch_up();
  // Adds `n` tokens of row `row` at `pos` to batch_ (its whole reserved
  // block table), sampling the last when `sample`.
  void add_row(const Row& row, const int32_t* ids, int32_t n, int32_t pos, bool sample);
  // Runs batch_ and writes one greedy pick per sample row to picks_.
  bool forward();
  void release_round();

  std::unique_ptr<Model> model_;
  int64_t n_target_vocab_ = 0;
  BlockPool pool_;
  PrefixTree tree_;
  StatePool states_;
  KvManager kv_;
  std::unordered_map<uint64_t, Sequence> seqs_;  // by request id
  uint64_t round_ = 0;
  Batch batch_;
  std::vector<Row> rows_;              // this round's drafting requests, in request order
  std::vector<int32_t> sampled_rows_;  // [batch_ sample rows]: index into rows_
  std::vector<int32_t> picks_;         // [batch_ sample rows]: greedy ids
  std::vector<int32_t> drafted_;       // every row's drafts, row after row
  std::vector<float> logits_;          // [max_batch_seqs, n_vocab] without forward_greedy
};

}  // namespace rill
