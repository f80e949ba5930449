#include "model/paged_kv_cache.h"

#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/kv_quant.h"
#include "core/e4m3.h"

namespace rill {

Result<PagedKvCache> PagedKvCache::create(int64_t n_layer, int32_t n_blocks, int32_t block_size, int64_t kv_width,
                                          DType dtype) {
  if (n_layer <= 0 || n_layer > (int64_t{1} << 20)) return Error{"KV cache of " + std::to_string(n_layer) + " layers"};
  return create_layers(std::vector<int64_t>(static_cast<size_t>(n_layer), kv_width), n_blocks, block_size, dtype);
}

Result<PagedKvCache> PagedKvCache::create_layers(const std::vector<int64_t>& layer_widths, int32_t n_blocks,
                                                 int32_t block_size, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) return Error{"KV cache dtype must be F32 or F16"};
  const KvType t{dtype, false};
  std::vector<LayerSpec> layers;
  for (const int64_t w : layer_widths) layers.push_back({1, w, {t, t}});
  return create_layers(std::move(layers), n_blocks, block_size);
}

Result<PagedKvCache> PagedKvCache::create(int32_t n_blocks, int32_t block_size, int64_t n_head_kv, int64_t head_dim,
                                          std::vector<KvLayerTypes> types) {
  std::vector<LayerSpec> layers;
  for (const KvLayerTypes& t : types) layers.push_back({n_head_kv, head_dim, t});
  return create_layers(std::move(layers), n_blocks, block_size);
}

Result<PagedKvCache> PagedKvCache::create_layers(std::vector<LayerSpec> layers, int32_t n_blocks, int32_t block_size) {
  if (block_size <= 0 || !std::has_single_bit(static_cast<uint32_t>(block_size))) {
    return Error{"KV block size " + std::to_string(block_size) + " is not a power of two"};
  }
  PagedKvCache c;
  c.n_layer_ = static_cast<int64_t>(layers.size());
  c.n_blocks_ = n_blocks;
  c.block_size_ = block_size;
  c.block_shift_ = std::countr_zero(static_cast<uint32_t>(block_size));
  bool overflow = c.n_layer_ <= 0 || n_blocks <= 0;
  for (size_t l = 0; l < layers.size() && !overflow; ++l) {
    const LayerSpec& spec = layers[l];
    if (spec.n_head_kv <= 0 || spec.head_dim <= 0 || spec.head_dim > (int64_t{1} << 24) ||
        spec.n_head_kv > (int64_t{1} << 24) / spec.head_dim) {
      overflow = true;
      break;
    }
    RILL_TRY(check_kv_layer_types(static_cast<int64_t>(l), spec.types, spec.n_head_kv, spec.head_dim));
    for (KvType side : {spec.types.k, spec.types.v}) {
      if (!cpu::kv_dtype_supported(side.dtype)) return Error{"KV type " + kv_type_name(side) + " is not supported"};
    }
    if (kv_chan_k(spec.types.k.dtype) && block_size != cpu::kKvChanTokens) {
      return Error{"KV layer " + std::to_string(l) + ": K type " + kv_type_name(spec.types.k) + " groups a block's " +
                   std::to_string(cpu::kKvChanTokens) + " tokens, not " + std::to_string(block_size)};
    }
    const int64_t width = spec.n_head_kv * spec.head_dim;
    Layer L;
    L.spec = spec;
    L.k_row = ::rill::row_bytes(spec.types.k.dtype, width);
    L.v_row = ::rill::row_bytes(spec.types.v.dtype, width);
    if (spec.types.k.dtype == kKvQ4Alloc) L.k_widths.assign(static_cast<size_t>(width), 4);
    size_t k_block = 0, v_block = 0;
    L.k_off = c.span_;
    overflow = __builtin_mul_overflow(static_cast<size_t>(block_size), L.k_row, &k_block) ||
               __builtin_add_overflow(c.span_, k_block, &L.v_off) ||
               __builtin_mul_overflow(static_cast<size_t>(block_size), L.v_row, &v_block) ||
               __builtin_add_overflow(L.v_off, v_block, &c.span_);
    c.token_bytes_ += L.k_row + L.v_row;
    c.layers_.push_back(L);
  }
  size_t total = 0;
  if (overflow || __builtin_mul_overflow(static_cast<size_t>(n_blocks), c.span_, &total)) {
    return Error{"KV cache of " + std::to_string(n_blocks) + " blocks x " + std::to_string(block_size) +
                 " tokens is too large; lower the KV cache size"};
  }
  RILL_ASSIGN_OR_RETURN(c.buffer_, LazyBuffer::allocate(total));
  return c;
}

Status PagedKvCache::create_tails(int32_t n_slots) {
  std::vector<int64_t> widths;
  for (int64_t l = 0; l < n_layer_; ++l) widths.push_back(kv_chan_k(types(l).k.dtype) ? width(l) : 0);
  RILL_ASSIGN_OR_RETURN(tails_, KvTails::create(widths, n_slots));
  return {};
}

void PagedKvCache::store(int64_t layer, std::span<const int32_t> table, const float* k_rows, const float* v_rows,
                         const int32_t* pos, int64_t n, int64_t src_stride) const {
  const LayerSpec& spec = at(layer).spec;
  const KvLayerTypes& t = spec.types;
  assert(!kv_chan_k(t.k.dtype));
  for (int64_t i = 0; i < n; ++i) {
    assert(pos[i] >= 0 && static_cast<size_t>(pos[i] >> block_shift_) < table.size());
    assert(table[static_cast<size_t>(pos[i] >> block_shift_)] >= 0);
    uint8_t* kd = row(k_base(layer), table, pos[i], k_row_bytes(layer));
    uint8_t* vd = row(v_base(layer), table, pos[i], v_row_bytes(layer));
    cpu::store_kv_row(t.k.dtype, t.k.rotated, k_rows + i * src_stride, kd, spec.n_head_kv, spec.head_dim);
    cpu::store_kv_row(t.v.dtype, t.v.rotated, v_rows + i * src_stride, vd, spec.n_head_kv, spec.head_dim);
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
  tails_.attach(layer, v);
  if (!at(layer).k_widths.empty()) v.k_widths = at(layer).k_widths.data();
  if (!calibration_.empty()) v.calibration = const_cast<KvCalibrationStats*>(&calibration_[static_cast<size_t>(layer)]);
  return v;
}

void PagedKvCache::set_k_widths(int64_t layer, std::vector<uint8_t> widths) {
  Layer& L = layers_[static_cast<size_t>(layer)];
  assert(L.spec.types.k.dtype == kKvQ4Alloc && static_cast<int64_t>(widths.size()) == width(layer));
  L.k_widths = std::move(widths);
}

void PagedKvCache::begin_calibration() {
  calibration_.assign(static_cast<size_t>(n_layer_), {});
  for (int64_t l = 0; l < n_layer_; ++l) {
    KvCalibrationStats& s = calibration_[static_cast<size_t>(l)];
    const auto w = static_cast<size_t>(width(l));
    s.query_energy.assign(w, 0.0);
    s.block_range_sq.assign(w, 0.0);
    s.block_min.assign(w, INFINITY);
    s.block_max.assign(w, -INFINITY);
  }
}

std::vector<KvCalibrationStats> PagedKvCache::end_calibration() {
  std::vector<KvCalibrationStats> out;
  out.swap(calibration_);
  return out;
}

}  // namespace rill
