#include "model/state_pool.h"

#include <algorithm>
#include <string>

namespace rill {

Result<StatePool> StatePool::create(Backend& b, int64_t n_layers, std::vector<Model::StateTensor> layer_tensors,
                                    int32_t max_seqs, const ModelOptions& options) {
  StatePool p;
  p.tensors_ = std::move(layer_tensors);
  p.n_layers_ = n_layers;
  for (const Model::StateTensor& t : p.tensors_) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    p.layer_floats_ += n;
  }
  p.state_stride_ = n_layers * p.layer_floats_;
  p.n_slots_ = std::max(options.n_state_slots > 0 ? options.n_state_slots : max_seqs, std::max(1, options.n_kv_slots));
  p.n_checkpoints_ = options.n_state_checkpoints < 0 ? p.n_slots_ : options.n_state_checkpoints;
  p.n_spec_states_ = std::max(0, options.n_spec_states);
  p.n_checkpoints_ += p.n_slots_ * p.n_spec_states_;
  const size_t n_states = static_cast<size_t>(p.n_slots_) + static_cast<size_t>(p.n_checkpoints_) + 1;  // + scratch
  size_t total = 0;
  if (n_layers <= 0 || p.layer_floats_ <= 0 || p.n_checkpoints_ < 0 ||
      __builtin_mul_overflow(n_states, p.state_bytes(), &total)) {
    return Error{"recurrent state of " + std::to_string(p.n_slots_) + " slots + " + std::to_string(p.n_checkpoints_) +
                 " checkpoints is too large"};
  }
  RILL_ASSIGN_OR_RETURN(p.buf_, b.allocate(total, "the recurrent states (" + std::to_string(p.n_slots_) + " slots + " +
                                                      std::to_string(p.n_checkpoints_) + " checkpoints of " +
                                                      std::to_string(p.state_bytes() >> 10) + " KiB)"));
  return p;
}

Status StatePool::check(const Batch& batch) const {
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const BatchSeq& s = batch.seqs[i];
    if (s.state_slot < 0 || s.state_slot >= n_slots_) {
      return Error{"batch sequence " + std::to_string(i) + " has no recurrent state slot (" +
                   std::to_string(s.state_slot) + "; the model has " + std::to_string(n_slots_) + ")"};
    }
    if (s.state_restore >= n_checkpoints_ || s.state_restore < -1) {
      return Error{"batch sequence " + std::to_string(i) + " restores checkpoint " + std::to_string(s.state_restore) +
                   " (the model has " + std::to_string(n_checkpoints_) + ")"};
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch.seqs[j].state_slot == s.state_slot) {
        return Error{"batch sequences " + std::to_string(j) + " and " + std::to_string(i) + " share state slot " +
                     std::to_string(s.state_slot)};
      }
    }
  }
  for (size_t k = 0; k < batch.state_saves.size(); ++k) {
    const StateSave& v = batch.state_saves[k];
    if (v.seq < 0 || static_cast<size_t>(v.seq) >= batch.seqs.size() || v.checkpoint < 0 ||
        v.checkpoint >= n_checkpoints_) {
      return Error{"state save " + std::to_string(k) + " names sequence " + std::to_string(v.seq) + " / checkpoint " +
                   std::to_string(v.checkpoint) + ", which do not exist"};
    }
    const BatchSeq& s = batch.seqs[static_cast<size_t>(v.seq)];
    if (v.pos < s.kv_len - s.q_len || v.pos >= s.kv_len) {
      return Error{"state save " + std::to_string(k) + " at position " + std::to_string(v.pos) +
                   " is outside its sequence's step"};
    }
    if (k > 0) {
      const StateSave& u = batch.state_saves[k - 1];
      if (u.seq > v.seq || (u.seq == v.seq && u.pos >= v.pos)) {
        return Error{"state saves are not sorted by sequence and position"};
      }
    }
  }
  return Status::Ok();
}

RecurrentStep StatePool::plan(const Batch& batch, int64_t n_run, RecurrentSeq* seqs, RecurrentSave* saves,
                              int32_t* tok_seq) const {
  const int64_t n = batch.n_tokens();
  const auto n_seqs = static_cast<int32_t>(batch.seqs.size());
  int32_t n_saves = 0;
  for (int32_t i = 0; i < n_seqs; ++i) {
    const BatchSeq& q = batch.seqs[static_cast<size_t>(i)];
    const int32_t first_pos = q.kv_len - q.q_len;
    RecurrentSeq& s = seqs[i];
    s.q_start = q.q_start;
    s.q_len = q.q_len;
    s.src = first_pos == 0 ? -1 : q.state_restore >= 0 ? n_slots_ + q.state_restore : q.state_slot;
    s.dst = q.state_slot;
    s.save_begin = n_saves;
    while (n_saves < static_cast<int32_t>(batch.state_saves.size()) &&
           batch.state_saves[static_cast<size_t>(n_saves)].seq == i) {
      const StateSave& v = batch.state_saves[static_cast<size_t>(n_saves)];
      saves[n_saves++] = {v.pos - first_pos, n_slots_ + v.checkpoint};
    }
    s.n_saves = n_saves - s.save_begin;
  }
  std::copy(batch.seq_index.begin(), batch.seq_index.begin() + n, tok_seq);
  RecurrentStep r;
  r.n_seqs = n_seqs;
  for (int64_t t = n; t < n_run; ++t) {
    seqs[r.n_seqs] = {static_cast<int32_t>(t), 1, -1, scratch_id(), 0, 0};
    tok_seq[t] = r.n_seqs++;
  }
  r.seqs = seqs;
  r.saves = saves;
  r.n_saves = n_saves;
  r.tok_seq = tok_seq;
  r.n_tokens = n_run;
  return r;
}

Status StatePool::check_state(int32_t checkpoint, int64_t layer) const {
  if (checkpoint < 0 || checkpoint >= n_checkpoints_ || layer < 0 || layer >= n_layers_) {
    return Error{"recurrent state of checkpoint " + std::to_string(checkpoint) + " layer " + std::to_string(layer) +
                 " does not exist"};
  }
  return Status::Ok();
}

Status StatePool::copy_out(Backend& b, int32_t checkpoint, int64_t layer, uint8_t* out) const {
  RILL_TRY(check_state(checkpoint, layer));
  return b.copy_out(out, at(checkpoint, layer), static_cast<size_t>(layer_floats_) * sizeof(float));
}

Status StatePool::copy_in(Backend& b, int32_t checkpoint, int64_t layer, const uint8_t* in) {
  RILL_TRY(check_state(checkpoint, layer));
  return b.copy_in(at(checkpoint, layer), in, static_cast<size_t>(layer_floats_) * sizeof(float));
}

}  // namespace rill
