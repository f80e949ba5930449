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

class ModelRunner {
 public:
  ModelRunner(Model& model, const KvManager& kv);

  // Computes the plan's chunks. With greedy_ids false, on success logits(i)
  // is the row of the i-th sampling chunk (plan order). With greedy_ids true
  // (only when model().has_forward_greedy()) the model picks each row's
  // argmax where it runs and only token(i) is valid: no logits cross to the
  // host.
  Status run(const StepPlan& plan, bool greedy_ids = false);
  float* logits(int32_t sample_index) {
    return logits_.data() + static_cast<size_t>(sample_index) * static_cast<size_t>(model_.n_vocab());
  }
  int32_t token(int32_t sample_index) const { return ids_[static_cast<size_t>(sample_index)]; }
  const Batch& batch() const { return batch_; }

 private:
  Model& model_;
  const KvManager& kv_;
  int32_t recurrent_group_ = -1;  // the kv spec's recurrent group; -1: none
  Batch batch_;
  std::vector<float> logits_;  // [n_sample, n_vocab]
  std::vector<int32_t> ids_;   // [n_sample], greedy_ids steps
};

}  // namespace rill
