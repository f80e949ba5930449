#pragma once
// SlotKvCache: K and V for every attention layer, one contiguous region per
// sequence slot, indexed by position. This is the foundation's simple cache;
// the paged block pool of kv/ replaces it when the engine batches requests.
//
// Layout per (layer, slot): K [n_ctx, n_head_kv * head_dim], then V the same,
// in `dtype` (F32 or F16). Memory is reserved lazily (LazyBuffer), so
// resident size follows the positions written.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/lazy_buffer.h"
#include "core/result.h"

namespace rill {

class SlotKvCache {
 public:
  static Result<SlotKvCache> create(int64_t n_layer, int64_t n_slots, int64_t n_ctx,
                                    int64_t kv_width, DType dtype);

  int64_t n_ctx() const { return n_ctx_; }
  DType dtype() const { return dtype_; }
  size_t bytes_per_token() const { return 2 * static_cast<size_t>(n_layer_) * row_bytes_; }

  // Start of K (or V) rows of `layer` in `slot`; row p holds position p.
  uint8_t* k(int64_t layer, int64_t slot) const { return base(layer, slot); }
  uint8_t* v(int64_t layer, int64_t slot) const { return base(layer, slot) + plane_bytes(); }
  size_t row_bytes() const { return row_bytes_; }

  // Stores f32 rows [n, kv_width] at positions pos[i] of (layer, slot).
  void store(int64_t layer, int64_t slot, const float* k_rows, const float* v_rows,
             const int32_t* pos, int64_t n, int64_t src_stride_k, int64_t src_stride_v);

 private:
  size_t plane_bytes() const { return static_cast<size_t>(n_ctx_) * row_bytes_; }
  uint8_t* base(int64_t layer, int64_t slot) const {
    return buffer_.data() + (static_cast<size_t>(layer * n_slots_ + slot)) * 2 * plane_bytes();
  }

  LazyBuffer buffer_;
  int64_t n_layer_ = 0, n_slots_ = 0, n_ctx_ = 0, kv_width_ = 0;
  size_t row_bytes_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace rill
