#include "backend/cpu/lightning_index.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

// Columns [col, col + n) of a latent row split over the K and V planes
// (LatentKvRow): element i lives in plane i / plane_width.
struct LatentRows {
  const KvCacheView& kv;
  int64_t plane = 0;  // elements per plane
  size_t elem = 4;

  explicit LatentRows(const KvCacheView& v)
      : kv(v),
        plane(static_cast<int64_t>(v.row_bytes / (v.dtype == DType::kF32 ? 4 : 2))),
        elem(v.dtype == DType::kF32 ? 4 : 2) {}

  size_t slot_offset(int64_t slot) const {
    const int64_t mask = (int64_t{1} << kv.block_shift) - 1;
    return static_cast<size_t>(slot >> kv.block_shift) * kv.block_stride +
           static_cast<size_t>(slot & mask) * kv.row_bytes;
  }
  uint8_t* element(size_t at, int64_t i) const {
    auto* base = static_cast<uint8_t*>(i < plane ? kv.k : kv.v);
    return base + at + static_cast<size_t>(i % plane) * elem;
  }
  void write(int64_t slot, int64_t col, const float* x, int64_t n) const {
    const size_t at = slot_offset(slot);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* dst = element(at, col + i);
      if (elem == 4) {
        std::memcpy(dst, x + i, 4);
      } else {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  void read(int64_t slot, int64_t col, float* out, int64_t n) const {
    const size_t at = slot_offset(slot);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = element(at, col + i);
      if (elem == 4) {
        std::memcpy(out + i, src, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, src, 2);
        out[i] = f16_to_f32(h);
      }
    }
  }
};

}  // namespace

void lightning_index(const LightningIndexOp& op, const RopeTable& rope, const StepMetadata& step, ThreadPool& pool) {
  const int64_t H = op.n_head, D = op.head_dim;
  assert(op.q.dtype == DType::kF32 && op.k.dtype == DType::kF32 && op.w.dtype == DType::kF32);
  assert(op.k.cols >= D && op.q.cols >= H * D && op.w.cols >= H && op.topk > 0 && op.rope_dim <= D);
  const LatentRows rows(op.kv);
  assert(op.key_col + D <= 2 * rows.plane);
  const int32_t* slots = step.slots[op.kv_group];
  std::vector<float> key(static_cast<size_t>(D));
  for (int64_t t = 0; t < step.n_tokens; ++t) {
    const auto* k = static_cast<const float*>(op.k.at(t, 0));
    std::copy(k, k + D, key.begin());
    cpu::rope(key.data(), step.pos + t, 1, 1, D, rope);
    rows.write(slots[t], op.key_col, key.data(), D);
    cpu::rope(static_cast<float*>(op.q.at(t, 0)), step.pos + t, 1, H, D, rope);
  }

  const int32_t shift = op.kv.block_shift;
  pool.parallel_for(step.n_tokens, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores, k_j;  // grow to the longest context once per thread
    thread_local std::vector<int32_t> order;
    k_j.resize(static_cast<size_t>(D));
    for (int64_t t = begin; t < end; ++t) {
      const int32_t s = step.seq_of[t], n_kv = step.pos[t] + 1;
      int32_t* sel = op.selected + t * op.topk;
      if (n_kv <= op.topk) {  // every key: no scores needed
        for (int32_t j = 0; j < n_kv; ++j) sel[j] = j;
        op.n_selected[t] = n_kv;
        continue;
      }
      const int32_t* table = step.block_tables[op.kv_group] + step.table_start[s];
      const auto* q = static_cast<const float*>(op.q.at(t, 0));
      const auto* w = static_cast<const float*>(op.w.at(t, 0));
      scores.resize(static_cast<size_t>(n_kv));
      for (int32_t j = 0; j < n_kv; ++j) {
        const int64_t slot = (int64_t{table[j >> shift]} << shift) + (j & ((1 << shift) - 1));
        rows.read(slot, op.key_col, k_j.data(), D);
        float total = 0;
        for (int64_t h = 0; h < H; ++h) {
          float dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += q[h * D + i] * k_j[static_cast<size_t>(i)];
          total += op.weight_scale * w[h] * std::max(0.0f, op.score_scale * dot);
        }
        scores[static_cast<size_t>(j)] = total;
      }
      // The best topk under a total order (higher score, then later key):
      // nth_element picks the same set whatever its pivots.
      order.resize(static_cast<size_t>(n_kv));
      for (int32_t j = 0; j < n_kv; ++j) order[static_cast<size_t>(j)] = j;
      const auto before = [&](int32_t a, int32_t b) {
        const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
        return sa > sb || (sa == sb && a > b);
      };
      std::nth_element(order.begin(), order.begin() + op.topk, order.end(), before);
      std::sort(order.begin(), order.begin() + op.topk);
      std::copy(order.begin(), order.begin() + op.topk, sel);
      op.n_selected[t] = op.topk;
    }
  });
}

}  // namespace rill::cpu
