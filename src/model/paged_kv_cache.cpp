#include "model/paged_kv_cache.h"

#include <bit>
#include <cassert>
#include <cstring>
#include <string>

#include "core/half.h"

namespace rill {

Result<PagedKvCache> PagedKvCache::create(int64_t n_layer, int32_t n_blocks, int32_t block_size, int64_t kv_width,
                                          DType dtype) {
  if (n_layer <= 0 || n_layer > (int64_t{1} << 20)) return Error{"KV cache of " + std::to_string(n_layer) + " layers"};
  return create_layers(std::vector<int64_t>(static_cast<size_t>(n_layer), kv_width), n_blocks, block_size, dtype);
}

Result<PagedKvCache> PagedKvCache::create_layers(const std::vector<int64_t>& layer_widths, int32_t n_blocks,
                                                 int32_t block_size, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) return Error{"KV cache dtype must be F32 or F16"};
  if (block_size <= 0 || !std::has_single_bit(static_cast<uint32_t>(block_size))) {
    return Error{"KV block size " + std::to_string(block_size) + " is not a power of two"};
  }
  PagedKvCache c;
  c.n_layer_ = static_cast<int64_t>(layer_widths.size());
  c.n_blocks_ = n_blocks;
  c.block_size_ = block_size;
  c.block_shift_ = std::countr_zero(static_cast<uint32_t>(block_size));
  c.dtype_ = dtype;
  bool overflow = c.n_layer_ <= 0 || n_blocks <= 0;
  for (const int64_t w : layer_widths) {
    overflow = overflow || w <= 0;
    if (overflow) break;
    Layer l;
    l.width = w;
    l.row_bytes = ::rill::row_bytes(dtype, w);
    l.offset = c.span_bytes_;
    c.layers_.push_back(l);
    size_t two_blocks = 0;
    overflow = __builtin_mul_overflow(static_cast<size_t>(block_size) * 2, l.row_bytes, &two_blocks) ||
               __builtin_add_overflow(c.span_bytes_, two_blocks, &c.span_bytes_);
    c.token_bytes_ += 2 * l.row_bytes;
  }
  size_t total = 0;
  if (overflow || __builtin_mul_overflow(static_cast<size_t>(n_blocks), c.span_bytes_, &total)) {
    return Error{"KV cache of " + std::to_string(n_blocks) + " blocks x " + std::to_string(block_size) +
                 " tokens is too large; lower the KV cache size"};
  }
  RILL_ASSIGN_OR_RETURN(c.buffer_, LazyBuffer::allocate(total));
  return c;
}

void PagedKvCache::store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
                         const int32_t* pos, int64_t n, int64_t src_stride) const {
  uint8_t* kb = k_base(layer);
  uint8_t* vb = v_base(layer);
  const Layer& l = layers_[static_cast<size_t>(layer)];
  for (int64_t i = 0; i < n; ++i) {
    assert(pos[i] >= 0 && static_cast<size_t>(pos[i] >> block_shift_) < table.size());
    assert(table[static_cast<size_t>(pos[i] >> block_shift_)] >= 0);
    const float* ks = k_rows + i * src_stride;
    const float* vs = v_rows + i * src_stride;
    uint8_t* kd = row(kb, l.row_bytes, table, pos[i]);
    uint8_t* vd = row(vb, l.row_bytes, table, pos[i]);
    if (dtype_ == DType::kF32) {
      std::memcpy(kd, ks, l.row_bytes);
      std::memcpy(vd, vs, l.row_bytes);
    } else {
      auto* kh = reinterpret_cast<uint16_t*>(kd);
      auto* vh = reinterpret_cast<uint16_t*>(vd);
      for (int64_t j = 0; j < l.width; ++j) {
        kh[j] = f32_to_f16(ks[j]);
        vh[j] = f32_to_f16(vs[j]);
      }
    }
  }
}

void PagedKvCache::copy_block_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  const size_t off = static_cast<size_t>(block) * span_bytes();
  std::memcpy(k, k_base(layer) + off, block_bytes(layer));
  std::memcpy(v, v_base(layer) + off, block_bytes(layer));
}

void PagedKvCache::copy_block_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) const {
  const size_t off = static_cast<size_t>(block) * span_bytes();
  std::memcpy(k_base(layer) + off, k, block_bytes(layer));
  std::memcpy(v_base(layer) + off, v, block_bytes(layer));
}

PagedKv PagedKvCache::view(int64_t layer, std::span<const int32_t> table) const {
  PagedKv v;
  v.k = k_base(layer);
  v.v = v_base(layer);
  v.table = table.data();
  v.block_shift = block_shift_;
  v.block_bytes = span_bytes();
  v.row_bytes = row_bytes(layer);
  return v;
}

}  // namespace rill
