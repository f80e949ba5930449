#pragma once
// MtpSpeculator (`--spec mtp`): the target's own multi-token-prediction
// layer drafts (DeepSeek-V3's MTP module, loader/mtp_layers.h; the target
// is loaded with ModelOptions::mtp). After each step the engine hands it
// the hidden states of every speculating request's kept positions
// (observe); one forward_mtp over all of them writes the MTP layer's KV
// rows of those positions (in the target's own blocks, a layer beside its
// layers) and, for a request whose last kept position is followed only by
// its newest token t, takes the MTP head's argmax at that position: the
// guess of the token after t, which propose() returns as the request's one
// draft (one MTP layer, one draft per step). Rows of positions the MTP
// never saw (a prompt prefix taken from the prefix cache) keep what an
// earlier request wrote there, or nothing: they change acceptance only.
//
// Engine thread only.
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
    int32_t token = -1;
    size_t after = 0;  // the request's token count it follows
  };
  Model& model_;
  std::unordered_map<uint64_t, Draft> drafts_;  // by request id
  Batch batch_;
  std::vector<int32_t> ids_;                // a request's shifted tokens
  std::vector<float> hidden_;               // [batch tokens, n_embd]
  std::vector<float> logits_;               // [sample rows, n_vocab]
  std::vector<const HiddenRows*> sampled_;  // [sample rows]
};

}  // namespace rill
