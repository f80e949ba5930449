#pragma once
// DraftModelSpeculator (`--spec draft=PATH`): a smaller model with the
// target's tokenizer proposes k tokens per speculating request, greedily,
// one forward per token. It runs on the target's device with its own paged
// KV (its own Model, BlockPool and KvManager), keyed by the request id:
// each propose() first rolls the draft's KV back to the longest prefix it
// shares with the request's tokens (so the target's rejections roll it
// back too), computes what is missing, then drafts. Nothing of it reaches
// the prefix cache (a truncate never meets a shared block).
//
// Engine thread only. A request the draft's KV pool cannot hold (after
// giving back every other request's draft KV) gets no drafts; release()
// ends a request's draft KV.
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
  void release(uint64_t seq) override;

 private:
  DraftModelSpeculator(std::unique_ptr<Model> model, int64_t n_target_vocab);
  // Reserves n more tokens of seq's draft KV, giving back the other
  // requests' when the pool is short; false when it cannot.
  bool grow(uint64_t seq, int32_t n);
  // Computes tokens [pos, pos + n) of seq (KV reserved) and returns the
  // greedy pick after the last; -1 on a failed forward.
  int32_t run(uint64_t seq, const int32_t* ids, int32_t n, int32_t pos, int32_t decode_from);

  std::unique_ptr<Model> model_;
  int64_t n_target_vocab_ = 0;
  BlockPool pool_;
  PrefixTree tree_;
  StatePool states_;
  KvManager kv_;
  struct Sequence {
    std::vector<int32_t> computed;  // the tokens in the draft's KV
    int32_t decode_from = 0;        // BatchSeq::decode_from: where its first propose()'s owed token is
  };
  std::unordered_map<uint64_t, Sequence> seqs_;  // by request id
  Batch batch_;
  std::vector<float> logits_;  // [n_vocab] without forward_greedy
};

}  // namespace rill
