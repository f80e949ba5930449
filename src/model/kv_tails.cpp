#include "model/kv_tails.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/kv_quant.h"

namespace rill {

size_t KvTails::slot_bytes(const std::vector<int64_t>& widths) {
  size_t bytes = 0;
  for (const int64_t w : widths) {
    if (w > 0) bytes += sizeof(KvTailHeader) + 2 * cpu::kKvChanTokens * row_bytes(cpu::kKvChanTailType, w);
  }
  return bytes;
}

Result<KvTails> KvTails::create(const std::vector<int64_t>& widths, int32_t n_slots) {
  KvTails t;
  for (const int64_t w : widths) {
    t.offset_.push_back(w > 0 ? t.slot_bytes_ : SIZE_MAX);
    t.slot_bytes_ += slot_bytes({w});
  }
  if (t.slot_bytes_ == 0 || n_slots <= 0) return t;  // no layer keeps a tail
  t.n_slots_ = n_slots;
  RILL_ASSIGN_OR_RETURN(t.tails_, LazyBuffer::allocate(t.bytes()));
  return t;
}

void KvTails::attach(int64_t layer, KvCacheView& v) const {
  const auto l = static_cast<size_t>(layer);
  if (empty() || l >= offset_.size() || offset_[l] == SIZE_MAX) return;
  v.tail = tails_.data() + offset_[l];
  v.tail_stride = slot_bytes_;
}

Status KvTails::check(const Batch& batch, int32_t block_size) const {
  if (empty()) return {};
  size_t first = 0;  // the first layer with a tail: every layer's head moves alike
  while (offset_[first] == SIZE_MAX) ++first;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const BatchSeq& q = batch.seqs[s];
    // Built only for an error's message (every sequence of every step passes here).
    const auto what = [&] {
      return "batch sequence " + std::to_string(s) + ": KV tail slot " + std::to_string(q.kv_tail);
    };
    if (q.kv_tail < 0 || q.kv_tail >= n_slots_) {
      return Error{what() + " is not one of the model's " + std::to_string(n_slots_) +
                   " (k4c KV keeps one per sequence)"};
    }
    for (size_t o = 0; o < s; ++o) {
      if (batch.seqs[o].kv_tail == q.kv_tail) return Error{what() + " is also sequence " + std::to_string(o) + "'s"};
    }
    const int32_t c0 = q.kv_len - q.q_len;
    if (c0 % block_size == 0) continue;
    KvTailHeader h;
    std::memcpy(&h, tails_.data() + static_cast<size_t>(q.kv_tail) * slot_bytes_ + offset_[first], sizeof h);
    if (h.group_start != c0 - c0 % block_size || h.n_rows < c0 % block_size) {
      return Error{what() + " holds positions [" + std::to_string(h.group_start) + ", " +
                   std::to_string(h.group_start + h.n_rows) + "), but the step continues at " + std::to_string(c0) +
                   ": k4c KV continues only at a multiple of " + std::to_string(block_size) +
                   " tokens or where its last step ended"};
    }
  }
  return {};
}

}  // namespace rill
