#pragma once
// PagedKvCache: K and V of every attention layer in fixed-size blocks.
// Block b of layer l holds block_size consecutive positions of whichever
// sequence the caller's block table assigns it to.
//
// Layout, block-major: block b is one span of every layer's K then V rows,
// [n_blocks][n_layer][K, V][block_size, kv_width(layer)] in `dtype` (F32 or
// F16; layers may differ in width: Gemma 4's full layers are wider),
// so a sequence's KV for all layers sits in a few large regions. Memory is
// reserved lazily in transparent huge pages (LazyBuffer): pages become
// resident as blocks are first written, and the pool hands out low block ids
// first, so resident size follows the peak number of blocks in use (in 2 MiB
// steps), and decode attention at many streams walks a handful of TLB
// entries instead of one per 4 KiB of K/V.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/host_ops.h"
#include "core/dtype.h"
#include "core/lazy_buffer.h"
#include "core/result.h"

namespace rill {

class PagedKvCache {
 public:
  // block_size: a power of two.
  static Result<PagedKvCache> create(int64_t n_layer, int32_t n_blocks, int32_t block_size, int64_t kv_width,
                                     DType dtype);
  // One layer per entry of layer_widths (elements of a K or V row).
  static Result<PagedKvCache> create_layers(const std::vector<int64_t>& layer_widths, int32_t n_blocks,
                                            int32_t block_size, DType dtype);

  int64_t n_layers() const { return n_layer_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  DType dtype() const { return dtype_; }
  // Layer 0's row (every layer's when the widths are equal).
  size_t row_bytes() const { return layers_.empty() ? 0 : layers_[0].row_bytes; }
  size_t row_bytes(int64_t layer) const { return layers_[static_cast<size_t>(layer)].row_bytes; }
  size_t bytes_per_token() const { return token_bytes_; }

  // Stores f32 rows [n, kv_width] of one sequence at positions pos[i],
  // placed through the sequence's block table. Rows are src_stride floats
  // apart. Requires table[pos[i] / block_size] to be a valid block.
  void store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
             const int32_t* pos, int64_t n, int64_t src_stride) const;

  // Copies one layer's K and V rows of one block (block_size rows of
  // row_bytes()) out to k / v, or in from them (prefix-cache tiers).
  void copy_block_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const;
  void copy_block_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) const;

  // The view attention reads for one sequence of one layer.
  PagedKv view(int64_t layer, std::span<const int32_t> table) const;
  // One layer's K/V as a Backend addresses them (block-major: blocks
  // span_bytes() apart).
  KvCacheView layer_view(int64_t layer) const {
    return {k_base(layer), v_base(layer), dtype_, block_shift_, span_bytes(), row_bytes(layer)};
  }

 private:
  struct Layer {
    int64_t width = 0;     // elements of a K (or V) row
    size_t row_bytes = 0;  // bytes of that row
    size_t offset = 0;     // of its K rows within a block's span
  };
  // Bytes of one layer's K (or V) rows of one block.
  size_t block_bytes(int64_t layer) const { return static_cast<size_t>(block_size_) * row_bytes(layer); }
  // Bytes of one block across all layers: the distance between blocks.
  size_t span_bytes() const { return span_bytes_; }
  // K (V) rows of `layer` in block 0.
  uint8_t* k_base(int64_t layer) const { return buffer_.data() + layers_[static_cast<size_t>(layer)].offset; }
  uint8_t* v_base(int64_t layer) const { return k_base(layer) + block_bytes(layer); }
  uint8_t* row(uint8_t* base, size_t row_bytes, std::span<const int32_t> table, int32_t pos) const {
    return base + static_cast<size_t>(table[static_cast<size_t>(pos >> block_shift_)]) * span_bytes() +
           static_cast<size_t>(pos & (block_size_ - 1)) * row_bytes;
  }

  LazyBuffer buffer_;
  int64_t n_layer_ = 0;
  int32_t n_blocks_ = 0, block_size_ = 16, block_shift_ = 4;
  std::vector<Layer> layers_;
  size_t span_bytes_ = 0, token_bytes_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace rill
