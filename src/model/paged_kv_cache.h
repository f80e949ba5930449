#pragma once
// PagedKvCache: K and V of every attention layer in fixed-size blocks.
// Block b of layer l holds block_size consecutive positions of whichever
// sequence the caller's block table assigns it to.
//
// Layout per layer: K [n_blocks, block_size, kv_width], then V the same, in
// `dtype` (F32 or F16). Memory is reserved lazily (LazyBuffer): pages become
// resident as blocks are first written, and the pool hands out low block ids
// first, so resident size follows the peak number of blocks in use.
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/lazy_buffer.h"
#include "core/result.h"

namespace rill {

class PagedKvCache {
 public:
  // block_size: a power of two.
  static Result<PagedKvCache> create(int64_t n_layer, int32_t n_blocks, int32_t block_size,
                                     int64_t kv_width, DType dtype);

  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  DType dtype() const { return dtype_; }
  size_t row_bytes() const { return row_bytes_; }
  size_t bytes_per_token() const { return 2 * static_cast<size_t>(n_layer_) * row_bytes_; }

  // Stores f32 rows [n, kv_width] of one sequence at positions pos[i],
  // placed through the sequence's block table. Rows are src_stride floats
  // apart. Requires table[pos[i] / block_size] to be a valid block.
  void store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
             const int32_t* pos, int64_t n, int64_t src_stride) const;

  // The view attention reads for one sequence of one layer.
  PagedKv view(int64_t layer, std::span<const int32_t> table) const;

 private:
  size_t block_bytes() const { return static_cast<size_t>(block_size_) * row_bytes_; }
  size_t plane_bytes() const { return static_cast<size_t>(n_blocks_) * block_bytes(); }
  uint8_t* k_base(int64_t layer) const { return buffer_.data() + static_cast<size_t>(layer) * 2 * plane_bytes(); }
  uint8_t* v_base(int64_t layer) const { return k_base(layer) + plane_bytes(); }
  uint8_t* row(uint8_t* base, std::span<const int32_t> table, int32_t pos) const {
    return base + static_cast<size_t>(table[static_cast<size_t>(pos >> block_shift_)]) * block_bytes() +
           static_cast<size_t>(pos & (block_size_ - 1)) * row_bytes_;
  }

  LazyBuffer buffer_;
  int64_t n_layer_ = 0, kv_width_ = 0;
  int32_t n_blocks_ = 0, block_size_ = 16, block_shift_ = 4;
  size_t row_bytes_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace rill
