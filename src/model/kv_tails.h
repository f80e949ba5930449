#pragma once
// KvTails: the keys and values of each sequence's newest partial KV block
// in q8_0 (cpu::kKvChanTailType), for KV types that encode K per block
// (k4c's q4c, model/kv_types.h).
//
// Why per sequence and not in the block pool: a block's K group can only
// be encoded once its 32 tokens exist, while a query reads the keys of its
// own block at 8 bits, keys and values (docs/perf.md: the newest tokens
// matter most). Only full
// blocks are ever shared, cached, saved to a tier or written to a KV file,
// and a prefix resumes at a block boundary, where a tail is empty, so
// the pool and the prefix cache hold quantized groups only and stay exact;
// the tail is private to its running sequence, like a recurrent state
// slot. Memory: slots x (layers with a tail) x (a 64-byte head + 32 K and
// 32 V rows in q8_0), leased one per running sequence (KvManager) or per fixed slot
// (SequenceRunner), counted in the KV budget (CpuPagedModel::create_kv).
//
// A tail is written by the CPU backend (KvCacheView::tail): rope_store_kv
// encodes each block its step completes from the tail and the step's rows
// (which the backend keeps); attention reads both and then leaves in the
// tail the step's last partial block (KvTailHeader: its first position and
// row count).
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/lazy_buffer.h"
#include "core/result.h"
#include "model/batch.h"

namespace rill {

class KvTails {
 public:
  // A tail per slot for each layer l with widths[l] > 0 (its K row's
  // elements; 0: the layer keeps none).
  static Result<KvTails> create(const std::vector<int64_t>& widths, int32_t n_slots);
  // Bytes of one slot's tails for these widths.
  static size_t slot_bytes(const std::vector<int64_t>& widths);

  bool empty() const { return n_slots_ == 0; }
  int32_t n_slots() const { return n_slots_; }
  // Bytes of every slot's tails (the step rows are scratch, not counted).
  size_t bytes() const { return static_cast<size_t>(n_slots_) * slot_bytes_; }

  // Points v's tail fields at layer `layer`'s (no-op for a layer without).
  void attach(int64_t layer, KvCacheView& v) const;

  // Every sequence of the batch names a distinct slot, and continues at a
  // block boundary (block_size tokens) or where its tail stopped. Errors
  // name the sequence and slot.
  Status check(const Batch& batch, int32_t block_size) const;

 private:
  std::vector<size_t> offset_;  // per layer: its tail within a slot; SIZE_MAX: none
  int32_t n_slots_ = 0;
  size_t slot_bytes_ = 0;
  LazyBuffer tails_;
};

}  // namespace rill
