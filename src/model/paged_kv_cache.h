#pragma once
// PagedKvCache: K and V of every attention layer in fixed-size blocks.
// Block b of layer l holds block_size consecutive positions of whichever
// sequence the caller's block table assigns it to.
//
// Layout, block-major: block b is one span of every layer's K then V rows,
// [n_blocks][n_layer][K, V][block_size, row bytes of that layer and side],
// so a sequence's KV for all layers sits in a few large regions. Each layer
// has its own row shape (n_head_kv heads of head_dim: Gemma 4's full layers
// are wider than its sliding ones) and its K and V their own KV type
// (model/kv_types.h: f32, f16, bf16 or GGML blocks, optionally
// Hadamard-rotated), so row bytes differ by layer and side and layers sit
// at per-layer offsets within a span. Memory is
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
#include "model/kv_tails.h"
#include "model/kv_types.h"

namespace rill {

class PagedKvCache {
 public:
  // One layer's shape and types: K and V rows of n_head_kv heads of
  // head_dim elements (the types' blocks must fit: check_kv_types()).
  struct LayerSpec {
    int64_t n_head_kv = 1, head_dim = 0;
    KvLayerTypes types;
  };
  // One layer per entry of layers; block_size: a power of two. Errors name
  // a layer whose types do not fit its rows.
  static Result<PagedKvCache> create_layers(std::vector<LayerSpec> layers, int32_t n_blocks, int32_t block_size);
  // Every layer alike in shape: types[l] for layer l.
  static Result<PagedKvCache> create(int32_t n_blocks, int32_t block_size, int64_t n_head_kv, int64_t head_dim,
                                     std::vector<KvLayerTypes> types);
  // Every layer's K and V in dtype (F32 or F16), rows of kv_width.
  static Result<PagedKvCache> create(int64_t n_layer, int32_t n_blocks, int32_t block_size, int64_t kv_width,
                                     DType dtype);
  // One layer per entry of layer_widths (elements of a K or V row), K and V
  // in dtype (F32 or F16).
  static Result<PagedKvCache> create_layers(const std::vector<int64_t>& layer_widths, int32_t n_blocks,
                                            int32_t block_size, DType dtype);

  int64_t n_layers() const { return n_layer_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t block_size() const { return block_size_; }
  const KvLayerTypes& types(int64_t layer) const { return at(layer).spec.types; }
  // Elements of one K (or V) row of the layer: n_head_kv x head_dim.
  int64_t width(int64_t layer) const { return at(layer).spec.n_head_kv * at(layer).spec.head_dim; }
  int64_t head_dim(int64_t layer) const { return at(layer).spec.head_dim; }
  size_t k_row_bytes(int64_t layer) const { return at(layer).k_row; }
  size_t v_row_bytes(int64_t layer) const { return at(layer).v_row; }
  // Bytes one token takes in every layer, K and V.
  size_t bytes_per_token() const { return token_bytes_; }

  // The tails of the layers whose K is q4c (k4c, model/kv_tails.h):
  // n_slots slots; layer_view() then points at them. No-op without such a
  // layer.
  Status create_tails(int32_t n_slots);
  const KvTails& tails() const { return tails_; }

  // q4a's widths of a layer whose K is kKvQ4Alloc ([width(layer)], 0..8
  // bits a channel, summing to 4 * width: backend/cpu/kv_alloc.h); every
  // channel 4 until set_k_widths. Empty for other layers. layer_view()
  // points at them, so set them before the KV holds any q4a block.
  const std::vector<uint8_t>& k_widths(int64_t layer) const { return at(layer).k_widths; }
  void set_k_widths(int64_t layer, std::vector<uint8_t> widths);
  // While calibrating (begin_calibration() to end_calibration()),
  // layer_view() attaches each layer's KvCalibrationStats (zeroed, sized
  // [width]); end_calibration() returns them, one per layer.
  void begin_calibration();
  std::vector<KvCalibrationStats> end_calibration();

  // Stores f32 rows [n, width(layer)] of one sequence at positions pos[i],
  // placed through the sequence's block table, in the layer's types. Rows
  // are src_stride floats apart. Requires table[pos[i] / block_size] to be
  // a valid block, and the layer's K not to be q4c (its blocks are encoded
  // a block at a time by the CPU backend's rope_store_kv).
  void store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
             const int32_t* pos, int64_t n, int64_t src_stride) const;

  // Copies one layer's K and V rows of one block (block_size rows of
  // k_row_bytes() / v_row_bytes()) out to k / v, or in from them
  // (prefix-cache tiers).
  void copy_block_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const;
  void copy_block_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) const;

  // The view attention reads for one sequence of one layer.
  PagedKv view(int64_t layer, std::span<const int32_t> table) const;
  // One layer's K/V as a Backend addresses them (block-major: blocks
  // span_bytes() apart).
  KvCacheView layer_view(int64_t layer) const;

 private:
  struct Layer {
    LayerSpec spec;
    size_t k_row = 0, v_row = 0;    // bytes of one K / V row
    size_t k_off = 0, v_off = 0;    // of its K / V rows within a block's span
    std::vector<uint8_t> k_widths;  // q4a's, else empty
  };
  const Layer& at(int64_t layer) const { return layers_[static_cast<size_t>(layer)]; }
  // Bytes of one block across all layers: the distance between blocks.
  size_t span_bytes() const { return span_; }
  // K (V) rows of `layer` in block 0.
  uint8_t* k_base(int64_t layer) const { return buffer_.data() + at(layer).k_off; }
  uint8_t* v_base(int64_t layer) const { return buffer_.data() + at(layer).v_off; }
  uint8_t* row(uint8_t* base, std::span<const int32_t> table, int32_t pos, size_t row_bytes) const {
    return base + static_cast<size_t>(table[static_cast<size_t>(pos >> block_shift_)]) * span_bytes() +
           static_cast<size_t>(pos & (block_size_ - 1)) * row_bytes;
  }

  LazyBuffer buffer_;
  KvTails tails_;
  int64_t n_layer_ = 0;
  int32_t n_blocks_ = 0, block_size_ = 16, block_shift_ = 4;
  std::vector<Layer> layers_;
  std::vector<KvCalibrationStats> calibration_;  // per layer while calibrating, else empty
  size_t span_ = 0, token_bytes_ = 0;
};

}  // namespace rill
