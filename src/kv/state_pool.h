#pragma once
// StatePool: fixed-size per-sequence state slots for recurrent layer groups
// (SSM / linear-attention state), plus checkpoint slots that snapshot a
// sequence's state at a block boundary so a cached prefix can be resumed
// without recomputing the recurrence from the start.
//
// This class is bookkeeping only: ids and ownership. The state tensors live
// with the backend, indexed by slot id (live states) and checkpoint id
// (snapshots); copying a live state into a checkpoint is the backend's job.
//
// A checkpoint is keyed by the id of the block whose end boundary it follows
// (the state after the block's last token). A checkpoint must be dropped
// before its block id holds other tokens, otherwise the id would resolve to
// a stale state (the KvManager drops it when the id is allocated again).
//
// Speculative decoding on a hybrid model: each live slot also owns
// n_spec_states "verify states" (checkpoint ids after the prefix cache's,
// spec_state()), where a verify step saves the state after each of its
// positions but the last, so a rejection restores the accepted one.
//
// Not thread-safe (engine thread). Neither copyable nor movable: StateSlot
// leases point to the pool, which must outlive them.
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace rill {

class StatePool;

// Exclusive ownership of one live state slot. Move-only; returns the slot
// when destroyed or on release(). Default-constructed / moved-from: empty.
class StateSlot {
 public:
  StateSlot() = default;
  StateSlot(StateSlot&& other) noexcept : pool_(other.pool_), slot_(other.slot_) { other.pool_ = nullptr; }
  StateSlot& operator=(StateSlot&& other) noexcept;
  StateSlot(const StateSlot&) = delete;
  StateSlot& operator=(const StateSlot&) = delete;
  ~StateSlot() { release(); }

  bool valid() const { return pool_ != nullptr; }
  int32_t slot() const { return slot_; }  // requires valid()
  void release();                         // no-op when empty

 private:
  friend class StatePool;
  StateSlot(StatePool* pool, int32_t slot) : pool_(pool), slot_(slot) {}
  StatePool* pool_ = nullptr;
  int32_t slot_ = -1;
};

class StatePool {
 public:
  // n_slots >= 0 live slots, n_checkpoints >= 0 checkpoint slots (the
  // prefix cache's), n_spec_states >= 0 verify states per live slot.
  StatePool(int32_t n_slots, int32_t n_checkpoints, int32_t n_spec_states = 0);
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  // A free live slot; an error (nothing changes) when all are leased.
  Result<StateSlot> acquire();

  int32_t n_slots() const { return static_cast<int32_t>(leased_.size()); }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t n_leased() const { return n_slots() - n_free(); }
  bool is_leased(int32_t slot) const { return leased_[slot] != 0; }

  // The checkpoint slot to fill with the state after `block`'s last token.
  // Reuses the block's existing checkpoint if any; otherwise takes a free
  // checkpoint slot, and when none is free recycles the least recently
  // taken or used one (its old block loses its checkpoint), never one
  // taken or used at or after clock stamp `keep_since` (a step's own
  // checkpoints: two saves of one step must not share a slot). Fails when
  // the pool has no checkpoint slots or every one is kept.
  Result<int32_t> take_checkpoint(int32_t block, uint64_t keep_since = UINT64_MAX);
  // The checkpoint slot of `block`, if any; marks it recently used.
  std::optional<int32_t> find_checkpoint(int32_t block);
  // The same without marking (for checks).
  std::optional<int32_t> checkpoint_of(int32_t block) const;
  // Stamps of later takes and finds are > clock().
  uint64_t clock() const { return clock_; }
  // Forgets `block`'s checkpoint (no-op when it has none).
  void drop_checkpoint(int32_t block);
  // Re-keys `from`'s checkpoint to `to` (a block holding the same tokens);
  // when `to` already has one, `from`'s is dropped. No-op when `from` has none.
  void move_checkpoint(int32_t from, int32_t to);

  int32_t n_checkpoints() const { return static_cast<int32_t>(ckpt_block_.size()); }
  // Verify state j of live slot `slot`: a checkpoint id past the prefix
  // cache's (the model's pool holds them there, ModelOptions::n_spec_states).
  int32_t n_spec_states() const { return n_spec_states_; }
  int32_t spec_state(int32_t slot, int32_t j) const { return n_checkpoints() + slot * n_spec_states_ + j; }
  // Every checkpoint id a restore or save may name.
  int32_t n_state_ids() const { return n_checkpoints() + n_slots() * n_spec_states_; }
  // A pinned checkpoint is never recycled by take_checkpoint() (a pending
  // restore of a rolled-back verify reads it in the next step).
  void set_pinned(int32_t checkpoint, bool pinned) { ckpt_pinned_[static_cast<size_t>(checkpoint)] = pinned; }
  int32_t n_checkpoints_used() const { return static_cast<int32_t>(ckpt_of_block_.size()); }

  // Verifies: free list and leased flags agree, no duplicates; the
  // block->checkpoint index and checkpoint->block table are inverse.
  Status check_integrity() const;

 private:
  friend class StateSlot;
  void release(int32_t slot);

  std::vector<uint8_t> leased_;
  std::vector<int32_t> free_;         // stack of free live slots
  std::vector<int32_t> ckpt_block_;   // by checkpoint; -1 = free
  std::vector<uint64_t> ckpt_stamp_;  // last take/find time
  std::vector<uint8_t> ckpt_pinned_;  // by checkpoint
  std::unordered_map<int32_t, int32_t> ckpt_of_block_;
  uint64_t clock_ = 0;
  int32_t n_spec_states_ = 0;
};

}  // namespace rill
