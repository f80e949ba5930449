#pragma once
// MtpSpeculator (`--spec mtp`): the target's own multi-token-prediction
// layer drafts (DeepSeek-V3's MTP module, loader/mtp_layers.h; the target
// is loaded with ModelOptions::mtp). After each step the engine hands it
// the hidden states of every speculating request's kept positions
// (observe); one forward_mtp over all of them writes the MTP layer's KV
// rows of those positions (in the target's own blocks, a layer beside its
// layers) and, for a request whose last kept position p is followed only
// by its newest token t, takes the MTP head's argmax at p: the guess d_1
// of the token after t. For up to HiddenRows::n_drafts drafts it chains
// the one MTP layer on its own output: draft j + 1 is the head's argmax at
// position p + j with token d_j and, as the hidden row, the layer's output
// at p + j - 1 (Model::forward_mtp's mtp_hidden), every chaining request
// at once: n_drafts - 1 more forwards of one token per request, not one
// per request. propose() returns the chain. The chain's rows past p lie
// in the request's tail or in scratch blocks (HiddenRows::block_table)
// and are rewritten by the next observe before any draft reads them.
// Rows of positions the MTP never saw (a prompt prefix taken from the
// prefix cache) keep what an earlier request wrote there, or nothing: they
// change acceptance only.
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

class MtpSpeculator final : public Speculator {
 public:
  // Requires target.n_mtp_layers() > 0.
  explicit MtpSpeculator(Model& target);
  const char* name() const override { return "mtp"; }
  bool wants_hidden() const override { return true; }
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
  // One forward_mtp over batch_ (hidden_ its rows): false on failure.
  bool run_head(bool want_hidden);
  // Appends each sampled row's argmax to chains_[i].draft, in order.
  void take_argmax(std::span<const size_t> chain_of_row);

  Model& model_;
  std::unordered_map<uint64_t, Draft> drafts_;  // by request id
  Batch batch_;
  std::vector<int32_t> ids_;         // a request's shifted tokens
  std::vector<float> hidden_;        // [batch tokens, n_embd]: the head's hidden input
  std::vector<float> out_;           // [batch tokens, n_embd]: the layer's output
  std::vector<float> chain_hidden_;  // [chains, n_embd]: each chain's last output row
  std::vector<float> logits_;        // [sample rows, n_vocab]
  std::vector<Chain> chains_;        // requests drafting this step
  std::vector<size_t> sampled_;      // batch sample row -> chains_ index
};

}  // namespace rill
