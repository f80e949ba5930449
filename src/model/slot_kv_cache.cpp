#include "model/slot_kv_cache.h"

#include <cassert>
#include <cstring>

#include "core/half.h"

namespace rill {

Result<SlotKvCache> SlotKvCache::create(int64_t n_layer, int64_t n_slots, int64_t n_ctx,
                                        int64_t kv_width, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) return Error{"KV cache dtype must be F32 or F16"};
  SlotKvCache c;
  c.n_layer_ = n_layer;
  c.n_slots_ = n_slots;
  c.n_ctx_ = n_ctx;
  c.kv_width_ = kv_width;
  c.dtype_ = dtype;
  c.row_bytes_ = ::rill::row_bytes(dtype, kv_width);
  size_t total = 0;
  if (n_layer <= 0 || n_slots <= 0 || n_ctx <= 0 ||
      __builtin_mul_overflow(static_cast<size_t>(n_layer) * static_cast<size_t>(n_slots), 2 * c.plane_bytes(),
                             &total) ||
      c.plane_bytes() / c.row_bytes_ != static_cast<size_t>(n_ctx)) {
    return Error{"KV cache of " + std::to_string(n_ctx) + " tokens x " + std::to_string(n_slots) +
                 " slots is too large; lower the context size"};
  }
  RILL_ASSIGN_OR_RETURN(c.buffer_, LazyBuffer::allocate(total));
  return c;
}

void SlotKvCache::store(int64_t layer, int64_t slot, const float* k_rows, const float* v_rows,
                        const int32_t* pos, int64_t n, int64_t src_stride_k, int64_t src_stride_v) {
  uint8_t* kb = k(layer, slot);
  uint8_t* vb = v(layer, slot);
  for (int64_t i = 0; i < n; ++i) {
    assert(pos[i] >= 0 && pos[i] < n_ctx_);
    const float* ks = k_rows + i * src_stride_k;
    const float* vs = v_rows + i * src_stride_v;
    uint8_t* kd = kb + static_cast<size_t>(pos[i]) * row_bytes_;
    uint8_t* vd = vb + static_cast<size_t>(pos[i]) * row_bytes_;
    if (dtype_ == DType::kF32) {
      std::memcpy(kd, ks, row_bytes_);
      std::memcpy(vd, vs, row_bytes_);
    } else {
      auto* kh = reinterpret_cast<uint16_t*>(kd);
      auto* vh = reinterpret_cast<uint16_t*>(vd);
      for (int64_t j = 0; j < kv_width_; ++j) {
        kh[j] = f32_to_f16(ks[j]);
        vh[j] = f32_to_f16(vs[j]);
      }
    }
  }
}

}  // namespace rill
