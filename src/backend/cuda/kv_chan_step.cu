// k4c's step plan and tail update on the device (kv_chan_step.h).
#include "backend/cuda/kv_chan_step.h"

#include <algorithm>
#include <cstring>

#include "backend/backend.h"  // KvTailHeader
#include "backend/cpu/kv_quant.h"
#include "backend/cuda/cuda_context.h"

namespace rill::cuda {
namespace {

constexpr int kT = cpu::kKvChanTokens;
constexpr int kThreads = 256;
static_assert(sizeof(KvTailHeader) == 64, "the tail rows follow a 64-byte header");
static_assert(cpu::kKvChanTailType == DType::kQ8_0, "the tail rows are q8_0");

__host__ __device__ inline size_t tail_row_bytes(int32_t width) {
  return static_cast<size_t>(width / 32) * 34;
}

// The units, in sequence order (one thread: a step has few sequences).
__host__ __device__ inline void list_units(const ChanStepArgs& a) {
  int32_t n = 0;
  for (int32_t s = 0; s < a.n_seqs; ++s) {
    const int32_t c1 = a.kv_len[s], c0 = c1 - a.q_len[s];
    for (int32_t g = c0 - c0 % kT; g + kT <= c1; g += kT, ++n) {
      if (n >= a.max_units) continue;
      a.dst[n] = a.k_blocks + static_cast<size_t>(a.block_tables[a.table_start[s] + g / kT]) * a.k_block_stride;
      a.sequence_start[n] = g == 0 ? 1 : 0;
      a.units[2 * n] = s;
      a.units[2 * n + 1] = g;
    }
  }
  *a.n_units = n;
}

// Unit u's 32 row pointers (after list_units).
__host__ __device__ inline void fill_rows(const ChanStepArgs& a, int32_t u, int32_t s, int32_t g) {
  const size_t row = tail_row_bytes(a.width);
  const int32_t c0 = a.kv_len[s] - a.q_len[s];
  const uint8_t* tail_k = a.tails + static_cast<size_t>(a.kv_tail[s]) * a.tail_stride + sizeof(KvTailHeader);
  for (int r = 0; r < kT; ++r) {
    const int32_t pos = g + r;
    a.rows[static_cast<size_t>(u) * kT + r] = pos < c0 ? tail_k + static_cast<size_t>(r) * row
                                                       : a.step_k + static_cast<size_t>(a.q_start[s] + pos - c0) * row;
  }
}

__host__ __device__ inline void fill_seq(const ChanStepArgs& a, int32_t s) {
  const size_t row = tail_row_bytes(a.width);
  const uint8_t* base = a.tails + static_cast<size_t>(a.kv_tail[s]) * a.tail_stride + sizeof(KvTailHeader);
  a.c0[s] = a.kv_len[s] - a.q_len[s];
  a.tail_k[s] = base;
  a.tail_v[s] = base + static_cast<size_t>(kT) * row;
}

// Sequence s's tail update: byte i of the rows it takes (K then V), from
// `first` in steps of `step` (a thread block's threads; the host: 0, 1).
__host__ __device__ inline void update_seq(const ChanStepArgs& a, int32_t s, int first, int step) {
  const size_t row = tail_row_bytes(a.width);
  const int32_t c1 = a.kv_len[s], c0 = c1 - a.q_len[s];
  const int32_t g0 = c0 - c0 % kT, g1 = c1 - c1 % kT;
  const int32_t from = g1 == g0 ? c0 : g1;  // the step's rows the tail takes
  uint8_t* base = a.tails + static_cast<size_t>(a.kv_tail[s]) * a.tail_stride;
  uint8_t* tail_k = base + sizeof(KvTailHeader);
  uint8_t* tail_v = tail_k + static_cast<size_t>(kT) * row;
  const size_t src = static_cast<size_t>(a.q_start[s] + from - c0) * row;
  const size_t dst = static_cast<size_t>(from - g1) * row, n = static_cast<size_t>(c1 - from) * row;
  for (size_t i = static_cast<size_t>(first); i < n; i += static_cast<size_t>(step)) {
    tail_k[dst + i] = a.step_k[src + i];
    tail_v[dst + i] = a.step_v[src + i];
  }
  if (first == 0) {
    auto* h = reinterpret_cast<int32_t*>(base);  // KvTailHeader: group_start, n_rows
    h[0] = g1;
    h[1] = c1 - g1;
  }
}

__global__ void __launch_bounds__(kThreads) plan_kernel(ChanStepArgs a) {
  if (threadIdx.x == 0) list_units(a);
  __syncthreads();
  const int32_t n = min(*a.n_units, a.max_units);
  for (int32_t u = threadIdx.x; u < n; u += blockDim.x) fill_rows(a, u, a.units[2 * u], a.units[2 * u + 1]);
  for (int32_t s = threadIdx.x; s < a.n_seqs; s += blockDim.x) fill_seq(a, s);
}

__global__ void __launch_bounds__(kThreads) update_kernel(ChanStepArgs a) {
  update_seq(a, static_cast<int32_t>(blockIdx.x), static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

}  // namespace

int32_t chan_max_units(int64_t n_tokens, int64_t n_seqs) {
  return static_cast<int32_t>(std::min(n_tokens, n_tokens / kT + n_seqs));
}

void plan_chan_step(const ChanStepArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  plan_kernel<<<1, kThreads, 0, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void update_chan_tails(const ChanStepArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  update_kernel<<<static_cast<unsigned>(a.n_seqs), kThreads, 0, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void plan_chan_step_host(const ChanStepArgs& a) {
  if (a.n_seqs <= 0) return;
  list_units(a);
  const int32_t n = std::min(*a.n_units, a.max_units);
  for (int32_t u = 0; u < n; ++u) fill_rows(a, u, a.units[2 * u], a.units[2 * u + 1]);
  for (int32_t s = 0; s < a.n_seqs; ++s) fill_seq(a, s);
}

void update_chan_tails_host(const ChanStepArgs& a) {
  for (int32_t s = 0; s < a.n_seqs; ++s) update_seq(a, s, 0, 1);
}

}  // namespace rill::cuda
