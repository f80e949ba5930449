#pragma once
// The recurrent-state pool of a hybrid model's runtime, written once for
// every device (issue 16): CpuPagedModel and CudaModelBase each hold one
// when their family has recurrent layers (the gated DeltaNet of
// model/arch/qwen3_next.cpp), in memory their Backend addresses.
//
// State ids: live slots [0, n_slots), then checkpoints (checkpoint c is
// n_slots + c, the prefix cache's and the KV tiers' snapshots), then one
// scratch state (CUDA decode graphs' padding rows end there; never read).
// State s of recurrent layer l starts at layer(l) + s * state_stride(): the
// layer's tensors (Model::StateTensor, f32) end to end; one state of every
// layer is contiguous.
//
// A step names per sequence the state it starts from and the one it ends
// in (RecurrentSeq, backend/backend.h): a sequence at position 0 starts
// from zeros, one the Batch restores from its checkpoint, the others from
// their slot; each ends in its slot. Backend::gated_delta() reads src and
// writes dst, so a reset or restore costs no step of its own.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "model/batch.h"
#include "model/model.h"

namespace rill {

class StatePool {
 public:
  // Live slots: at least options.n_state_slots (max_seqs when 0) and
  // options.n_kv_slots; checkpoints:
  // options.n_state_checkpoints, as many as slots when negative, then
  // options.n_spec_states per slot. The
  // memory comes from b.allocate() (zeroed). Errors name the sizes.
  static Result<StatePool> create(Backend& b, int64_t n_layers, std::vector<Model::StateTensor> layer_tensors,
                                  int32_t max_seqs, const ModelOptions& options);

  int32_t n_slots() const { return n_slots_; }
  int32_t n_checkpoints() const { return n_checkpoints_; }  // the prefix cache's, then the verify states
  int32_t n_spec_states() const { return n_spec_states_; }  // verify states per live slot
  int32_t scratch_id() const { return n_slots_ + n_checkpoints_; }
  int64_t n_layers() const { return n_layers_; }
  // Bytes of one state (every layer).
  size_t state_bytes() const { return static_cast<size_t>(state_stride_) * sizeof(float); }
  int64_t state_stride() const { return state_stride_; }
  // Layer l's part of state 0.
  float* layer(int64_t l) const { return static_cast<float*>(buf_.data()) + l * layer_floats_; }
  std::vector<std::vector<Model::StateTensor>> state_layers() const {
    return std::vector<std::vector<Model::StateTensor>>(static_cast<size_t>(n_layers_), tensors_);
  }

  // A batch's recurrent fields: every sequence has a live slot of its own,
  // restores and saves name existing checkpoints, saves are sorted and
  // inside their sequence's step.
  Status check(const Batch& batch) const;
  // The step's sequences (batch.seqs, then one per padding token [n_tokens,
  // n_run), each from zeros into the scratch state), saves and each
  // token's sequence, into host arrays of at least n_run entries each;
  // returns the counts with those arrays (the runtime points them at its
  // device copies where they differ).
  RecurrentStep plan(const Batch& batch, int64_t n_run, RecurrentSeq* seqs, RecurrentSave* saves,
                     int32_t* tok_seq) const;

  // Checkpoint `checkpoint` of layer `layer` (its tensors, contiguous) to
  // and from host memory, through b (ordered after the steps queued on it).
  Status copy_out(Backend& b, int32_t checkpoint, int64_t layer, uint8_t* out) const;
  Status copy_in(Backend& b, int32_t checkpoint, int64_t layer, const uint8_t* in);

 private:
  Status check_state(int32_t checkpoint, int64_t layer) const;
  float* at(int32_t checkpoint, int64_t l) const {
    return layer(l) + static_cast<int64_t>(n_slots_ + checkpoint) * state_stride_;
  }

  Buffer buf_;
  std::vector<Model::StateTensor> tensors_;
  int32_t n_slots_ = 0, n_checkpoints_ = 0, n_spec_states_ = 0;
  int64_t n_layers_ = 0, layer_floats_ = 0, state_stride_ = 0;
};

}  // namespace rill
