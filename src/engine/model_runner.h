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
#include "model/step_overlap.h"

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
  Status run(const StepPlan& plan, StepIds mode = StepIds::kHost) {
    RILL_TRY(launch(plan, mode));
    return collect();
  }

  // run() in two halves (pipelined decode, model/step_overlap.h): launch()
  // starts the step, collect() completes the oldest step launched and makes
  // its results readable (chunk_rows(), token(), logits()). A kGreedy or
  // kSample step without token masks on a model that queues steps
  // (can_queue()) is queued and returns at once; any other step is computed
  // within launch() and requires no step in flight. At most two steps are
  // in flight. chain: the plan's tokens are the ids the step in flight
  // draws, read on the device (StepOverlap::launch_ids: one token per
  // chunk, one chunk per sample row of that step, in its row order);
  // requires can_queue() and a queued step. The plan's token ids at those
  // positions are placeholders.
  Status launch(const StepPlan& plan, StepIds mode, bool chain = false);
  Status collect();
  int n_in_flight() const { return n_launched_; }
  // The oldest step in flight is queued on the model (a chained step may follow it).
  bool oldest_queued() const { return n_launched_ > 0 && launched_[oldest_].queued; }
  bool can_queue() const { return overlap_ != nullptr && overlap_->can_queue_steps(); }

  // One entry per plan chunk of the step collected last, in plan order.
  const std::vector<ChunkRows>& chunk_rows() const { return launched_[current_].rows; }
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
  // A launched step: its chunks' rows and how it completes.
  struct Launched {
    std::vector<ChunkRows> rows;
    bool queued = false;  // on overlap_, completed by take_ids
    Status status;        // a step computed in launch(): its result
  };
  // Builds batch_ (and rows_, the masks) for the plan; returns the sample
  // row count and whether any row is masked.
  int32_t build(const StepPlan& plan, StepIds mode, std::vector<ChunkRows>& rows, int32_t& n_masked);
  // The model call of a step computed in launch().
  Status compute_now(StepIds mode, int32_t n_sample, int32_t n_masked);

  Model& model_;
  StepOverlap* overlap_ = nullptr;  // the model's, when it has one
  const KvManager& kv_;
  Launched launched_[2];
  int oldest_ = 0, n_launched_ = 0, current_ = 0;
  int32_t recurrent_group_ = -1;  // the kv spec's recurrent group; -1: none
  Batch batch_;
  std::vector<float> logits_;               // [n_sample, n_vocab]
  std::vector<int32_t> ids_;                // [n_sample], kGreedy and kSample steps
  std::vector<DeviceSamplingParams> rows_;  // [n_sample], kSample steps
  std::vector<int32_t> row_masks_;          // [n_sample], kGreedy and kSample steps: TokenMasks::row_mask
  std::vector<uint32_t> mask_words_;        // [n_masked, token_mask_words(n_vocab)]: TokenMasks::words
  std::vector<float> pooled_;               // [pool_seqs, n_dims]
  bool want_hidden_ = false;
  std::vector<float> hidden_;  // [n_tokens, n_embd] with want_hidden_
};

}  // namespace rill
