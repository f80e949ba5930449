#pragma once
// k4c's per-layer step on CUDA around the encoder (kv_chan.h) and the
// reference attention (attention_chan.h): where each sequence's tail, the
// step's q8_0 rows and the pool's blocks are, found on the device from the
// step's per-sequence arrays (no host work per layer, nothing per step but
// those arrays), and the tail update after attention. The CPU backend's
// contract (backend/cpu/cpu_backend.cpp rope_store_kv / encode_chan_blocks /
// attention_chan; model/kv_tails.h):
//   - the units: for each sequence s (c0 = kv_len - q_len, c1 = kv_len), one
//     per block start g = c0 - c0 % 32, g + 32, ... with g + 32 <= c1, in
//     sequence order; row r of unit (s, g) is position g + r: tail row r of
//     s's tail when g + r < c0, else step row q_start[s] + g + r - c0; its
//     block is block_tables[table_start[s] + g / 32]; sequence_start: g == 0.
//   - after attention, s's tail holds positions [g1, c1), g1 = c1 - c1 % 32:
//     the step's rows from max(g1, c0) (the rows before c0 stay: they are
//     [g1, c0) only when g1 == g0), and its header (group_start g1, n_rows
//     c1 - g1).
// Not yet run on a GPU (docs/perf.md, branch k4cwire22); the same source
// built for the host (plan_chan_step_host, update_chan_tails_host) runs in
// the tests.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rill::cuda {

struct ChanStepArgs {
  int32_t n_seqs = 0;
  // Per sequence [n_seqs] (StepMetadata's arrays on the device).
  const int32_t* q_start = nullptr;
  const int32_t* q_len = nullptr;
  const int32_t* kv_len = nullptr;
  const int32_t* kv_tail = nullptr;      // the sequence's tail slot
  const int32_t* table_start = nullptr;  // into block_tables
  const int32_t* block_tables = nullptr;
  // The layer's tails (KvCacheView::tail: slot 0's header; slot s at
  // tails + s * tail_stride: a 64-byte header, 32 K rows, 32 V rows).
  uint8_t* tails = nullptr;
  size_t tail_stride = 0;
  // The step's q8_0 rows [n_tokens] (RopeKvArgs::k_rows / v_rows).
  const uint8_t* step_k = nullptr;
  const uint8_t* step_v = nullptr;
  // The pool's K plane: block b's q4c group at k_blocks + b * k_block_stride.
  uint8_t* k_blocks = nullptr;
  size_t k_block_stride = 0;
  int32_t width = 0;      // a K (V) row's elements, a multiple of 32
  int32_t max_units = 0;  // the room in the outputs below

  // Outputs of plan_chan_step (device scratch). Units past max_units are
  // not written (n_units then says how many there were: an error).
  const uint8_t** rows = nullptr;     // [max_units * 32] (ChanEncodeArgs::rows)
  uint8_t** dst = nullptr;            // [max_units]
  uint8_t* sequence_start = nullptr;  // [max_units]
  int32_t* n_units = nullptr;         // [1]
  int32_t* units = nullptr;           // [max_units * 2]: each unit's sequence and block start
  int32_t* c0 = nullptr;              // [n_seqs] (ChanAttentionArgs::c0)
  const uint8_t** tail_k = nullptr;   // [n_seqs] (ChanAttentionArgs::tail_k)
  const uint8_t** tail_v = nullptr;   // [n_seqs]
};

// Whether a and b plan the same step of the same layer into the same
// outputs (every field equal): a plan made for a still holds for b while
// nothing its inputs point at has changed.
inline bool same_plan(const ChanStepArgs& a, const ChanStepArgs& b) {
  return a.n_seqs == b.n_seqs && a.q_start == b.q_start && a.q_len == b.q_len && a.kv_len == b.kv_len &&
         a.kv_tail == b.kv_tail && a.table_start == b.table_start && a.block_tables == b.block_tables &&
         a.tails == b.tails && a.tail_stride == b.tail_stride && a.step_k == b.step_k && a.step_v == b.step_v &&
         a.k_blocks == b.k_blocks && a.k_block_stride == b.k_block_stride && a.width == b.width &&
         a.max_units == b.max_units && a.rows == b.rows && a.dst == b.dst && a.sequence_start == b.sequence_start &&
         a.n_units == b.n_units && a.units == b.units && a.c0 == b.c0 && a.tail_k == b.tail_k && a.tail_v == b.tail_v;
}

// The most units a step of n_tokens tokens in n_seqs sequences completes:
// a sequence's q_len tokens complete at most q_len / 32 + 1 blocks (the
// one begun before the step), and at most q_len.
int32_t chan_max_units(int64_t n_tokens, int64_t n_seqs);

// Fills the plan's outputs (one thread block).
void plan_chan_step(const ChanStepArgs& a, cudaStream_t stream);
// After attention: each sequence's tail takes its newest partial block.
void update_chan_tails(const ChanStepArgs& a, cudaStream_t stream);

// The same code over host pointers (tests).
void plan_chan_step_host(const ChanStepArgs& a);
void update_chan_tails_host(const ChanStepArgs& a);

}  // namespace rill::cuda
