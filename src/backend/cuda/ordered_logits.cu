// Backend::ordered_logits on CUDA (ops_gemma4.h): Gemma 4's assistant's
// head over ordered embeddings, as the CPU Backend computes it
// (backend/cpu/ordered_logits.h), in four launches, none of which
// synchronizes with the host (decode steps capture them in a graph):
//   pick    one block per row: the top_k groups by score, one block-wide
//           argmax per pick over the groups below the previous pick in
//           (score desc, index asc) order, then the groups' tokens;
//   dots    one warp per picked token: hidden . lm_head[token] in f32 (the
//           rows' values widened, products summed by lane then across the
//           warp: the CPU's sum order differs, within f32 rounding);
//   fill    each block recomputes its row's smallest dot (4,096 floats per
//           row at Gemma 4 E2B's sizes) and fills its share of the row
//           with it minus 1;
//   scatter the dots to their tokens (distinct: token_ordering is a
//           permutation and the groups are distinct).
// At E2B's sizes (2,048 groups of 128 tokens, top 32, hidden 256) a row
// reads 4,096 head rows (2 MiB in bf16) instead of the 262,144 of a full
// head, and writes its 1 MiB of logits.
#include <cassert>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops_gemma4.h"

namespace rill::cuda {
namespace {

constexpr int kPickThreads = 256;
constexpr int kDotWarps = 8;
constexpr int kFillThreads = 256;
constexpr int64_t kFillPerBlock = 8192;  // logits a fill block writes

// (score, index) is before (best score, best index) in the pick order.
__device__ __forceinline__ bool before(float s, int32_t i, float bs, int32_t bi) {
  return bi < 0 || s > bs || (s == bs && i < bi);
}

// Scores staged in shared memory ([C] floats, dynamic); NaN staged as
// -infinity (the CPU's rank for it): with every score ordered, each of the
// top_k <= C rounds finds a group below the previous pick, so `chosen` is
// never -1 (a NaN pick left later rounds with none: reads before the
// ordering's start).
__global__ void pick_kernel(const float* scores, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering,
                            int64_t per, int32_t* picked) {
  extern __shared__ float s[];
  __shared__ float red_s[32];
  __shared__ int32_t red_i[32];
  __shared__ int32_t prev_shared;
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.x;
  const float* row = scores + r * n_centroids;
  for (int32_t c = threadIdx.x; c < n_centroids; c += blockDim.x) s[c] = isnan(row[c]) ? -INFINITY : row[c];
  if (threadIdx.x == 0) prev_shared = -1;
  __syncthreads();
  const int64_t n_picked = int64_t{top_k} * per;
  int32_t* out = picked + r * n_picked;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int32_t k = 0; k < top_k; ++k) {
    const int32_t prev = prev_shared;
    const float ps = prev >= 0 ? s[prev] : 0.0f;
    float bs = 0.0f;
    int32_t bi = -1;
    for (int32_t c = threadIdx.x; c < n_centroids; c += blockDim.x) {
      const float v = s[c];
      const bool below = prev < 0 || v < ps || (v == ps && c > prev);
      if (below && before(v, c, bs, bi)) {
        bs = v;
        bi = c;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float os = __shfl_xor_sync(0xffffffffu, bs, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && before(os, oi, bs, bi)) {
        bs = os;
        bi = oi;
      }
    }
    if (lane == 0) {
      red_s[warp] = bs;
      red_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float best_s = red_s[0];
      int32_t best_i = red_i[0];
      for (int w = 1; w < n_warps; ++w) {
        if (red_i[w] >= 0 && before(red_s[w], red_i[w], best_s, best_i)) {
          best_s = red_s[w];
          best_i = red_i[w];
        }
      }
      prev_shared = best_i;
    }
    __syncthreads();
    const int32_t chosen = prev_shared;  // >= 0: k < top_k <= C, scores ordered
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) out[k * per + j] = token_ordering[chosen * per + j];
  }
}

template <typename T>
__global__ void dots_kernel(const float* hidden, const T* head, int64_t E, int64_t n_picked, const int32_t* picked,
                            float* dots) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const int64_t i = int64_t{blockIdx.x} * kDotWarps + (threadIdx.x >> 5);
  if (i >= n_picked) return;
  const int lane = threadIdx.x & 31;
  const float* h = hidden + r * E;
  const T* w = head + static_cast<int64_t>(picked[r * n_picked + i]) * E;
  float acc = 0.0f;
  for (int64_t e = lane; e < E; e += 32) acc += h[e] * detail::to_f32(w[e]);
  acc = detail::warp_sum(acc);
  if (lane == 0) dots[r * n_picked + i] = acc;
}

__global__ void fill_kernel(const float* dots, int64_t n_picked, float* logits, int64_t V) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const float* d = dots + r * n_picked;
  float lo = INFINITY;
  for (int64_t i = threadIdx.x; i < n_picked; i += blockDim.x) lo = fminf(lo, d[i]);
  for (int o = 16; o > 0; o >>= 1) lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (lane == 0) red[warp] = lo;
  __syncthreads();
  lo = lane < n_warps ? red[lane] : INFINITY;
  for (int o = 16; o > 0; o >>= 1) lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
  const float fill = lo - 1.0f;
  const int64_t v0 = int64_t{blockIdx.x} * kFillPerBlock, v1 = v0 + kFillPerBlock < V ? v0 + kFillPerBlock : V;
  float* out = logits + r * V;
  for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) out[v] = fill;
}

__global__ void scatter_kernel(const float* dots, const int32_t* picked, int64_t n_picked, float* logits, int64_t V) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n_picked) logits[r * V + picked[r * n_picked + i]] = dots[r * n_picked + i];
}

unsigned blocks(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace

void ordered_logits(const float* hidden, const float* scores, DType head_dtype, const void* head, int64_t n, int64_t E,
                    int64_t V, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering, int32_t* picked,
                    float* dots, float* logits, cudaStream_t stream) {
  if (n <= 0) return;
  assert(n_centroids > 0 && n_centroids <= kMaxOrderedGroups && V % n_centroids == 0);
  assert(top_k >= 1 && top_k <= n_centroids);
  assert(head_dtype == DType::kF32 || head_dtype == DType::kF16 || head_dtype == DType::kBF16);
  const int64_t per = V / n_centroids, n_picked = int64_t{top_k} * per;
  const auto rows = static_cast<unsigned>(n);
  launch_pdl(pick_kernel, rows, kPickThreads, static_cast<size_t>(n_centroids) * sizeof(float), stream, scores,
             n_centroids, top_k, token_ordering, per, picked);
  RILL_CUDA_DISPATCH_FLOAT(
      head_dtype, launch_pdl(dots_kernel<T>, dim3(blocks(n_picked, kDotWarps), rows), kDotWarps * 32, 0, stream, hidden,
                             static_cast<const T*>(head), E, n_picked, picked, dots));
  launch_pdl(fill_kernel, dim3(blocks(V, kFillPerBlock), rows), kFillThreads, 0, stream, dots, n_picked, logits, V);
  launch_pdl(scatter_kernel, dim3(blocks(n_picked, 256), rows), 256, 0, stream, dots, picked, n_picked, logits, V);
}

}  // namespace rill::cuda
