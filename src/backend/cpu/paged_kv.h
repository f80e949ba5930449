#pragma once
// The paged KV view attention reads (cpu::attention, attention_f16_rounded,
// the per-ISA attention kernels). Kept apart from ops.h so the kernel
// table (kernels.h) can use it without the public op declarations.
#include <cstddef>
#include <cstdint>

namespace rill::cpu {

// One layer's paged K and V as attention reads them. Position j of the
// sequence lives in physical block table[j >> block_shift], row
// (j & (block_size - 1)); a row holds n_head_kv * head_dim elements of the
// KV dtype (row_bytes bytes). Blocks are block_bytes apart (block_size *
// row_bytes for a dense pool). Table entries for blocks wholly outside every
// query's window may be -1 (never read: attention reads only rows
// [j_begin, j_end) of each query, and computes no address for other rows).
struct PagedKv {
  const uint8_t* k = nullptr;      // physical block 0 of K
  const uint8_t* v = nullptr;      // physical block 0 of V
  const int32_t* table = nullptr;  // [ceil(n_kv / block_size)]
  int32_t block_shift = 4;         // block_size = 1 << block_shift
  size_t block_bytes = 0;
  size_t row_bytes = 0;
  // V rows' bytes where V is stored in another type than K (quantized KV,
  // attention_quant.h); 0: row_bytes.
  size_t v_row_bytes = 0;

  // Byte offset of position j's row from physical block 0 (j >= 0).
  size_t row_offset(int64_t j) const {
    const int64_t mask = (int64_t{1} << block_shift) - 1;
    return static_cast<size_t>(table[j >> block_shift]) * block_bytes + static_cast<size_t>(j & mask) * row_bytes;
  }
  const uint8_t* k_row(int64_t j) const { return k + row_offset(j); }
  const uint8_t* v_row(int64_t j) const {
    if (v_row_bytes == 0) return v + row_offset(j);
    const int64_t mask = (int64_t{1} << block_shift) - 1;
    return v + static_cast<size_t>(table[j >> block_shift]) * block_bytes + static_cast<size_t>(j & mask) * v_row_bytes;
  }
};

// Calls f(j, row) for j in [j_begin, j_end) in order, row = base +
// kv.row_offset(j) where base is kv.k or kv.v (or either offset to a head):
// one table lookup per block, then rows step by row_bytes. The hot loops of
// the attention kernels walk keys this way.
template <typename F>
inline void for_each_row(const PagedKv& kv, const uint8_t* base, int64_t j_begin, int64_t j_end, F&& f) {
  const int64_t last = (int64_t{1} << kv.block_shift) - 1;  // row index of a block's last row
  const size_t row_bytes = kv.row_bytes;
  for (int64_t j = j_begin; j < j_end;) {
    const int64_t block_end = (j | last) + 1;
    const int64_t end = block_end < j_end ? block_end : j_end;
    const uint8_t* row = base + kv.row_offset(j);
    for (; j < end; ++j, row += row_bytes) f(j, row);
  }
}

// block_shift of make_contiguous_kv: one block of 2^40 rows.
inline constexpr int32_t kContiguousKvShift = 40;
inline constexpr int32_t kContiguousKvTable[1] = {0};

// A contiguous K/V region ([n_kv, row_bytes] each, position j at
// k + j * row_bytes) as a PagedKv: a single block 0 of 2^40 rows, so the
// table is one static 0 entry and n_kv may be anything below 2^40. The
// result points at k/v and the static table; it owns nothing.
inline PagedKv make_contiguous_kv(const void* k, const void* v, size_t row_bytes) {
  PagedKv kv;
  kv.k = static_cast<const uint8_t*>(k);
  kv.v = static_cast<const uint8_t*>(v);
  kv.table = kContiguousKvTable;
  kv.block_shift = kContiguousKvShift;
  kv.block_bytes = 0;  // only block 0 is ever addressed
  kv.row_bytes = row_bytes;
  return kv;
}

}  // namespace rill::cpu
