#include "kv/state_pool.h"

#include <cassert>
#include <string>

namespace rill {

StateSlot& StateSlot::operator=(StateSlot&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = other.pool_;
    slot_ = other.slot_;
    other.pool_ = nullptr;
  }
  return *this;
}

void StateSlot::release() {
  if (pool_ == nullptr) return;
  pool_->release(slot_);
  pool_ = nullptr;
  slot_ = -1;
}

StatePool::StatePool(int32_t n_slots, int32_t n_checkpoints, int32_t n_spec_states)
    : leased_(static_cast<size_t>(n_slots), 0),
      ckpt_block_(static_cast<size_t>(n_checkpoints), -1),
      ckpt_stamp_(static_cast<size_t>(n_checkpoints), 0),
      ckpt_pinned_(static_cast<size_t>(n_checkpoints), 0),
      n_spec_states_(n_spec_states) {
  assert(n_slots >= 0 && n_checkpoints >= 0 && n_spec_states >= 0);
  // Stack order: slot 0 is handed out first.
  for (int32_t s = n_slots - 1; s >= 0; --s) free_.push_back(s);
}

Result<StateSlot> StatePool::acquire() {
  if (free_.empty()) {
    return Error{"state pool: all " + std::to_string(n_slots()) + " recurrent state slots are leased"};
  }
  int32_t slot = free_.back();
  free_.pop_back();
  leased_[slot] = 1;
  return StateSlot(this, slot);
}

void StatePool::release(int32_t slot) {
  assert(leased_[slot]);
  leased_[slot] = 0;
  free_.push_back(slot);
}

Result<int32_t> StatePool::take_checkpoint(int32_t block, uint64_t keep_since) {
  if (auto it = ckpt_of_block_.find(block); it != ckpt_of_block_.end()) {
    ckpt_stamp_[it->second] = ++clock_;
    return it->second;
  }
  if (ckpt_block_.empty()) return Error{"state pool: no checkpoint slots configured"};
  // A free checkpoint if any, else the least recently used one not kept.
  // O(n) over checkpoint slots: taken once per checkpointed block, not per token.
  int32_t pick = -1;
  for (int32_t c = 0; c < n_checkpoints(); ++c) {
    if (ckpt_pinned_[c]) continue;  // even when its block lost it: a restore still reads it
    if (ckpt_block_[c] < 0) {
      pick = c;
      break;
    }
    if (ckpt_stamp_[c] >= keep_since) continue;
    if (pick < 0 || ckpt_stamp_[c] < ckpt_stamp_[pick]) pick = c;
  }
  if (pick < 0) return Error{"state pool: every checkpoint slot is in use by this step"};
  if (ckpt_block_[pick] >= 0) ckpt_of_block_.erase(ckpt_block_[pick]);
  ckpt_block_[pick] = block;
  ckpt_stamp_[pick] = ++clock_;
  ckpt_of_block_[block] = pick;
  return pick;
}

std::optional<int32_t> StatePool::find_checkpoint(int32_t block) {
  auto it = ckpt_of_block_.find(block);
  if (it == ckpt_of_block_.end()) return std::nullopt;
  ckpt_stamp_[it->second] = ++clock_;
  return it->second;
}

std::optional<int32_t> StatePool::checkpoint_of(int32_t block) const {
  auto it = ckpt_of_block_.find(block);
  if (it == ckpt_of_block_.end()) return std::nullopt;
  return it->second;
}

void StatePool::move_checkpoint(int32_t from, int32_t to) {
  auto it = ckpt_of_block_.find(from);
  if (it == ckpt_of_block_.end() || from == to) return;
  const int32_t c = it->second;
  ckpt_of_block_.erase(it);
  if (ckpt_of_block_.count(to) != 0) {
    ckpt_block_[c] = -1;
    return;
  }
  ckpt_block_[c] = to;
  ckpt_of_block_[to] = c;
}

void StatePool::drop_checkpoint(int32_t block) {
  auto it = ckpt_of_block_.find(block);
  if (it == ckpt_of_block_.end()) return;
  ckpt_block_[it->second] = -1;
  ckpt_of_block_.erase(it);
}

Status StatePool::check_integrity() const {
  std::vector<uint8_t> on_free(leased_.size(), 0);
  for (int32_t s : free_) {
    if (s < 0 || s >= n_slots()) return Error{"state pool: free list holds bad slot " + std::to_string(s)};
    if (on_free[s]) return Error{"state pool: slot " + std::to_string(s) + " twice on the free list"};
    on_free[s] = 1;
  }
  for (int32_t s = 0; s < n_slots(); ++s) {
    if (on_free[s] == leased_[s]) {
      return Error{"state pool: slot " + std::to_string(s) + " leased flag disagrees with the free list"};
    }
  }
  int32_t n_used = 0;
  for (int32_t c = 0; c < n_checkpoints(); ++c) {
    if (ckpt_block_[c] < 0) continue;
    ++n_used;
    auto it = ckpt_of_block_.find(ckpt_block_[c]);
    if (it == ckpt_of_block_.end() || it->second != c) {
      return Error{"state pool: checkpoint " + std::to_string(c) + " not indexed by its block"};
    }
  }
  if (n_used != n_checkpoints_used()) return Error{"state pool: checkpoint index has stale entries"};
  return Status::Ok();
}

}  // namespace rill
