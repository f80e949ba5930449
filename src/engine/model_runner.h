#pragma once
// ModelRunner: turns a StepPlan into the flat Batch (tokens, positions,
// block tables, recurrent state slots, checkpoint restores and saves from the
// KvManager) and runs the model once. Buffers grow to
// the largest step seen and are reused: no allocation per step after warm-up.
#include <cstdint>
#include <vector>

#include "core/result.h"
#include "engine/scheduler.h"
#include "kv/kv_manager.h"
#include "model/model.h"

namespace rill {

// Where a step's sampled tokens are chosen.
enum class StepIds {
  kHost,    // logits come back; the engine samples them
  kGreedy,  // the model takes each row's argmax (Model::forward_greedy)
  kSample,  // the model draws each row under its request's parameters (Model::forward_sample)
};

class ModelRunner {
 public:
  ModelRunner(Model& model, const KvManager& kv);

  // Where a chunk's logit rows are (Request::logit_rows, as planned): rows
  // [first, first + n_scored) score the prompt positions from the chunk's
  // Request::first_scored_position(), then row first + n_scored samples
  // when `samples`, followed by n_draft rows: the positions of the drafts
  // the chunk verifies (row sample_row() + j predicts what follows draft j).
  struct ChunkRows {
    int32_t first = 0;
    int32_t n_scored = 0;
    bool samples = false;
    int32_t n_draft = 0;
    int32_t pool_index = -1;  // GenerationRequest::embed: its row of pooled()
    int32_t sample_row() const { return first + n_scored; }
  };

  // Computes the plan's chunks. kHost: on success logits(i) is row i
  // (chunk_rows() says whose). kGreedy (only when
  // model().has_forward_greedy()) and kSample (only when
  // model().has_forward_sample(); every sampling chunk's request has a
  // sampler whose logits are not edited, and each takes one draw of it) pick
  // the token where the model runs and only token(i) is valid: no logits
  // cross to the host; they require a plan without scored rows,
  // and kSample one without drafts (a draw is taken per accepted token).
  // In both, a sampling chunk whose request grammar_applies() draws under
  // its Request::mask, which the caller filled for this token (and such a
  // chunk verifies no drafts: their masks depend on the drafts before them).
  Status run(const StepPlan& plan, StepIds mode = StepIds::kHost);
  // One entry per plan chunk, in plan order.
  const std::vector<ChunkRows>& chunk_rows() const { return chunk_rows_; }
  float* logits(int32_t sample_index) {
    return logits_.data() + static_cast<size_t>(sample_index) * static_cast<size_t>(model_.n_vocab());
  }
  // Pooled embedding `i` of the step (ChunkRows::pool_index): n_dims floats.
  const float* pooled(int32_t i) const {
    return pooled_.data() + static_cast<size_t>(i) * static_cast<size_t>(model_.embedding().n_dims);
  }
  int32_t token(int32_t sample_index) const { return ids_[static_cast<size_t>(sample_index)]; }
  // Speculators that read the target's hidden states (Speculator::
  // wants_hidden): kHost steps without pooled rows then compute every
  // token's final-normed hidden state (Model::forward_hidden); hidden(t) is
  // batch token t's row of n_embd floats.
  void set_want_hidden(bool want) { want_hidden_ = want; }
  const float* hidden(int32_t token_index) const {
    return hidden_.data() + static_cast<size_t>(token_index) * static_cast<size_t>(model_.config().n_embd);
  }
  const Batch& batch() const { return batch_; }

 private:
  Model& model_;
  const KvManager& kv_;
  int32_t recurrent_group_ = -1;  // the kv spec's recurrent group; -1: none
  Batch batch_;
  std::vector<float> logits_;               // [n_sample, n_vocab]
  std::vector<int32_t> ids_;                // [n_sample], kGreedy and kSample steps
  std::vector<DeviceSamplingParams> rows_;  // [n_sample], kSample steps
  std::vector<int32_t> row_masks_;          // [n_sample], kGreedy and kSample steps: TokenMasks::row_mask
  std::vector<uint32_t> mask_words_;        // [n_masked, token_mask_words(n_vocab)]: TokenMasks::words
  std::vector<ChunkRows> chunk_rows_;       // [plan chunks]
  std::vector<float> pooled_;               // [pool_seqs, n_dims]
  bool want_hidden_ = false;
  std::vector<float> hidden_;  // [n_tokens, n_embd] with want_hidden_
};

}  // namespace rill
