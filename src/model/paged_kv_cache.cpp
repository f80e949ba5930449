#include "model/paged_kv_cache.h"

#include <bit>
#include <cassert>
#include <cstring>
#include <string>

#include "backend/cpu/kv_quant.h"

namespace rill {

Result<PagedKvCache> PagedKvCache::create(int64_t n_layer, int32_t n_blocks, int32_t block_size, int64_t kv_width,
                                          DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) return Error{"KV cache dtype must be F32 or F16"};
  if (n_layer <= 0) return Error{"KV cache of " + std::to_string(n_layer) + " layers"};
  const KvType t{dtype, false};
  return create(n_blocks, block_size, 1, kv_width, std::vector<KvLayerTypes>(static_cast<size_t>(n_layer), {t, t}));
}

Result<PagedKvCache> PagedKvCache::create(int32_t n_blocks, int32_t block_size, int64_t n_head_kv, int64_t head_dim,
                                          std::vector<KvLayerTypes> types) {
  if (block_size <= 0 || !std::has_single_bit(static_cast<uint32_t>(block_size))) {
    return Error{"KV block size " + std::to_string(block_size) + " is not a power of two"};
  }
  RILL_TRY(check_kv_types(types, n_head_kv, head_dim));
  for (const KvLayerTypes& t : types) {
    for (KvType side : {t.k, t.v}) {
      if (!cpu::kv_dtype_supported(side.dtype)) return Error{"KV type " + kv_type_name(side) + " is not supported"};
    }
  }
  PagedKvCache c;
  c.n_layer_ = static_cast<int64_t>(types.size());
  c.n_blocks_ = n_blocks;
  c.block_size_ = block_size;
  c.block_shift_ = std::countr_zero(static_cast<uint32_t>(block_size));
  c.n_head_kv_ = n_head_kv;
  c.head_dim_ = head_dim;
  const int64_t kv_width = n_head_kv * head_dim;
  if (c.n_layer_ <= 0 || n_blocks <= 0 || kv_width <= 0) {
    return Error{"KV cache of " + std::to_string(n_blocks) + " blocks x " + std::to_string(block_size) +
                 " tokens is too large; lower the KV cache size"};
  }
  size_t off = 0;
  for (const KvLayerTypes& t : types) {
    c.k_row_.push_back(::rill::row_bytes(t.k.dtype, kv_width));
    c.v_row_.push_back(::rill::row_bytes(t.v.dtype, kv_width));
    c.k_off_.push_back(off);
    off += c.k_row_.back() * static_cast<size_t>(block_size);
    c.v_off_.push_back(off);
    off += c.v_row_.back() * static_cast<size_t>(block_size);
    c.token_bytes_ += c.k_row_.back() + c.v_row_.back();
  }
  c.span_ = off;
  c.types_ = std::move(types);
  size_t total = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n_blocks), c.span_, &total)) {
    return Error{"KV cache of " + std::to_string(n_blocks) + " blocks x " + std::to_string(block_size) +
                 " tokens is too large; lower the KV cache size"};
  }
  RILL_ASSIGN_OR_RETURN(c.buffer_, LazyBuffer::allocate(total));
  return c;
}

void PagedKvCache::store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
                         const int32_t* pos, int64_t n, int64_t src_stride) const {
  const KvLayerTypes& t = types(layer);
  for (int64_t i = 0; i < n; ++i) {
    assert(pos[i] >= 0 && static_cast<size_t>(pos[i] >> block_shift_) < table.size());
    assert(table[static_cast<size_t>(pos[i] >> block_shift_)] >= 0);
    uint8_t* kd = row(k_base(layer), table, pos[i], k_row_bytes(layer));
    uint8_t* vd = row(v_base(layer), table, pos[i], v_row_bytes(layer));
    cpu::store_kv_row(t.k.dtype, t.k.rotated, k_rows + i * src_stride, kd, n_head_kv_, head_dim_);
    cpu::store_kv_row(t.v.dtype, t.v.rotated, v_rows + i * src_stride, vd, n_head_kv_, head_dim_);
  }
}

void PagedKvCache::copy_block_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  const size_t off = static_cast<size_t>(block) * span_bytes(), bs = static_cast<size_t>(block_size_);
  std::memcpy(k, k_base(layer) + off, bs * k_row_bytes(layer));
  std::memcpy(v, v_base(layer) + off, bs * v_row_bytes(layer));
}

void PagedKvCache::copy_block_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) const {
  const size_t off = static_cast<size_t>(block) * span_bytes(), bs = static_cast<size_t>(block_size_);
  std::memcpy(k_base(layer) + off, k, bs * k_row_bytes(layer));
  std::memcpy(v_base(layer) + off, v, bs * v_row_bytes(layer));
}

PagedKv PagedKvCache::view(int64_t layer, std::span<const int32_t> table) const {
  PagedKv v;
  v.k = k_base(layer);
  v.v = v_base(layer);
  v.table = table.data();
  v.block_shift = block_shift_;
  v.block_bytes = span_bytes();
  v.row_bytes = k_row_bytes(layer);
  v.v_row_bytes = v_row_bytes(layer) == k_row_bytes(layer) ? 0 : v_row_bytes(layer);
  return v;
}

KvCacheView PagedKvCache::layer_view(int64_t layer) const {
  const KvLayerTypes& t = types(layer);
  KvCacheView v{k_base(layer), v_base(layer), t.k.dtype, block_shift_, span_bytes(), k_row_bytes(layer)};
  v.v_dtype = t.v.dtype;
  v.v_row_bytes = v_row_bytes(layer);
  v.k_rotated = t.k.rotated;
  v.v_rotated = t.v.rotated;
  return v;
}

}  // namespace rill
