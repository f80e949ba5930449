#pragma once
// AssistantSpeculator (`--spec assistant=PATH`): Gemma 4's assistant model
// drafts (model/arch/gemma4_assistant.h; the target is loaded with
// ModelOptions::gemma4_assistant = PATH, and runs it as its MTP head).
// After each step the engine hands it the hidden states of every
// speculating request's kept positions (observe); for a request whose last
// kept position p is followed only by its newest token t, one
// forward_mtp over all such requests (one token each: t at p, with h_p)
// gives the assistant's guess d_1 of the token after t. For up to
// HiddenRows::n_drafts drafts it chains: draft j + 1 is the assistant's
// argmax at the same position p with token d_j and, as the hidden row, its
// own post_projection of step j, every chaining request at once: n_drafts
// forwards of one token per request in all. The assistant writes no KV (it
// reads the target's), so rows before p need no forward and chains need
// no scratch blocks.
//
// Engine thread only; no allocation per step once the buffers have grown
// (a request's draft vector is kept until release()).
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/speculator.h"
#include "model/batch.h"
#include "model/model.h"

namespace rill {

class AssistantSpeculator final : public Speculator {
 public:
  // Requires target.n_mtp_layers() > 0 (the assistant bound).
  explicit AssistantSpeculator(Model& target);
  const char* name() const override { return "assistant"; }
  bool wants_hidden() const override { return true; }
  bool chain_writes_kv() const override { return false; }
  void observe(std::span<const HiddenRows> rows) override;
  void propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens, std::vector<int32_t>& out) override;
  void release(uint64_t seq) override { drafts_.erase(seq); }

 private:
  struct Draft {
    std::vector<int32_t> tokens;  // the chain d_1, d_2, ...
    size_t after = 0;             // the request's token count it follows
  };
  // A request whose chain grows: its rows, its drafts.
  struct Chain {
    const HiddenRows* rows = nullptr;
    Draft* draft = nullptr;
  };
  // Adds chain i's next token (at its last kept position) to batch_.
  void add_row(size_t i, int32_t token);

  Model& model_;
  std::unordered_map<uint64_t, Draft> drafts_;  // by request id
  Batch batch_;
  std::vector<float> hidden_;      // [batch rows, n_embd]: the assistant's hidden input
  std::vector<float> out_;         // [batch rows, n_embd]: its post_projection, the next input
  std::vector<float> logits_;      // [batch rows, n_vocab]
  std::vector<Chain> chains_;      // requests drafting this step
  std::vector<size_t> row_of_;     // batch row -> chains_ index
  std::vector<size_t> prev_rows_;  // row_of_ of the previous draft
};

}  // namespace rill
