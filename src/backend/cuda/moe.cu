// Mixture-of-experts kernels (see moe.h for the contracts).
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/moe.h"

namespace rill::cuda {
namespace {

using detail::warp_max;
using detail::warp_sum;

// --- routing and grouping ---------------------------------------------------

// The softmax rows of the warps live in dynamic shared memory, at most
// this many bytes: 32 warps for up to 192 experts, fewer above.
constexpr int kRouteProbBytes = 24 * 1024;

// One block. Phase 1: each warp routes tokens warp, warp + n_warps, ...
// (softmax, K arg-max passes, the K picks ordered by id) and counts pairs
// per expert. Phase 2 (warp 0): offsets by an exclusive scan over experts.
// Phase 3 (warp 0): pairs placed in increasing index, 32 at a time, ranks
// among equal experts from __match_any_sync, so the grouping is the same
// on every run.
__global__ void route_kernel(const float* __restrict__ logits, int32_t n, int32_t X, int32_t K, bool norm, int32_t pad,
                             MoeRouting r) {
  extern __shared__ float probs_all[];       // [n_warps, X]
  __shared__ int32_t cnt[kMoeMaxExperts];    // pairs per expert, then the fill cursor
  __shared__ int32_t off_s[kMoeMaxExperts];  // offsets[e]
  __shared__ int32_t pad_s[kMoeMaxExperts];  // padded[e]
  detail::pdl_wait();
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int e = threadIdx.x; e < X; e += blockDim.x) cnt[e] = 0;
  __syncthreads();

  float* pr = probs_all + static_cast<size_t>(warp) * X;
  for (int32_t t = warp; t < n; t += n_warps) {
    const float* l = logits + static_cast<int64_t>(t) * X;
    float mx = -FLT_MAX;
    for (int e = lane; e < X; e += 32) {
      const float v = l[e];
      pr[e] = v;
      mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < X; e += 32) {
      const float v = expf(pr[e] - mx);
      pr[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < X; e += 32) pr[e] = pr[e] / sum;
    __syncwarp();
    // K arg-max passes; a picked expert's probability becomes -1 (all
    // others are >= 0). Lane k keeps pick k.
    int32_t my_id = 0;
    float my_p = 0.0f, picked_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      float bv = -1.0f;
      int32_t be = X;
      for (int e = lane; e < X; e += 32) {
        const float v = pr[e];
        if (v > bv) {  // ascending e: ties keep the lower id
          bv = v;
          be = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ov > bv || (ov == bv && oe < be)) {
          bv = ov;
          be = oe;
        }
      }
      be = min(be, X - 1);  // only NaN logits leave nothing to pick
      if (lane == k) {
        my_id = be;
        my_p = bv;
      }
      picked_sum += bv;  // in pick order, as the CPU
      __syncwarp();
      if (lane == 0) pr[be] = -1.0f;
      __syncwarp();
    }
    // Order the picks by id: lane k's place is the number of smaller ids.
    int32_t rank = 0;
    for (int j = 0; j < K; ++j) {
      const int32_t other = __shfl_sync(0xffffffffu, my_id, j);
      rank += other < my_id ? 1 : 0;
    }
    if (lane < K) {
      const int64_t at = static_cast<int64_t>(t) * K + rank;
      r.ids[at] = my_id;
      r.weights[at] = norm ? my_p / picked_sum : my_p;
      atomicAdd(&cnt[my_id], 1);
    }
    __syncwarp();
  }
  __syncthreads();
  if (warp != 0) return;

  // Exclusive scans over experts: lane L owns experts [L c, L c + c).
  const int per = (X + 31) / 32;
  const int e0 = min(X, lane * per), e1 = min(X, e0 + per);
  int32_t s_pairs = 0, s_pad = 0, s_act = 0;
  for (int e = e0; e < e1; ++e) {
    s_pairs += cnt[e];
    s_pad += (cnt[e] + pad - 1) / pad * pad;
    s_act += cnt[e] > 0 ? 1 : 0;
  }
  int32_t i_pairs = s_pairs, i_pad = s_pad, i_act = s_act;  // inclusive
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t a = __shfl_up_sync(0xffffffffu, i_pairs, o);
    const int32_t b = __shfl_up_sync(0xffffffffu, i_pad, o);
    const int32_t c = __shfl_up_sync(0xffffffffu, i_act, o);
    if (lane >= o) {
      i_pairs += a;
      i_pad += b;
      i_act += c;
    }
  }
  int32_t o_pairs = i_pairs - s_pairs, o_pad = i_pad - s_pad, o_act = i_act - s_act;
  for (int e = e0; e < e1; ++e) {
    const int32_t c = cnt[e];
    off_s[e] = o_pairs;
    pad_s[e] = o_pad;
    r.offsets[e] = o_pairs;
    r.padded[e] = o_pad;
    if (c > 0) r.active[o_act++] = e;
    o_pairs += c;
    o_pad += (c + pad - 1) / pad * pad;
    cnt[e] = 0;  // now the fill cursor
  }
  if (lane == 31) {
    r.offsets[X] = i_pairs;
    r.padded[X] = i_pad;
    *r.n_active = i_act;
  }
  __syncwarp();

  // Stable fill. The ids were written above by this block (visible after
  // __syncthreads).
  const int32_t n_pairs = n * K;
  for (int32_t base = 0; base < n_pairs; base += 32) {
    const int32_t i = base + lane;
    const int32_t id = i < n_pairs ? r.ids[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, id);
    const int32_t before = __popc(same & ((1u << lane) - 1u));
    if (id >= 0) {
      const int32_t pos = cnt[id] + before;
      r.sorted_pairs[off_s[id] + pos] = i;
      r.row_of_pair[i] = pad_s[id] + pos;
    }
    __syncwarp();
    if (id >= 0 && before == 0) cnt[id] += __popc(same);
    __syncwarp();
  }
}

// --- expert-indexed GEMV ------------------------------------------------------

constexpr int kWarps = 8;         // warps per block
constexpr int kRowsPerWarp = 2;   // each x vector load serves two weight rows
constexpr int kPairsPerPass = 8;  // pairs per read of the weights

__device__ __forceinline__ uint4 load_w(const uint4* p, bool streaming) {
  return streaming ? __ldcs(p) : __ldg(p);
}

// N pairs (x rows xs[0, N)) through kRowsPerWarp rows wr of one expert.
// Lane L accumulates vectors L, L + 32, ... in that order, 4 loads in
// flight; the order depends on nothing but n_vec.
template <typename T, int N>
__device__ __forceinline__ void gemv_pass(const uint4* const (&wr)[kRowsPerWarp], const uint4* const (&xs)[N],
                                          int64_t n_vec, bool streaming, int lane, float (&acc)[kRowsPerWarp][N]) {
  constexpr int kVec = 16 / sizeof(T);
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[k][t] = 0.0f;
  int64_t v = lane;
  for (; v + 96 < n_vec; v += 128) {
    uint4 wv[kRowsPerWarp][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) wv[k][u] = load_w(wr[k] + v + 32 * u, streaming);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float xf[8];
        unpack8(xs[t][v + 32 * u], static_cast<const T*>(nullptr), xf);
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) {
          float wf[8];
          unpack8(wv[k][u], static_cast<const T*>(nullptr), wf);
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[k][t] += wf[e] * xf[e];
        }
      }
    }
  }
  for (; v < n_vec; v += 32) {
    uint4 wv[kRowsPerWarp];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) wv[k] = load_w(wr[k] + v, streaming);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float xf[8];
      unpack8(xs[t][v], static_cast<const T*>(nullptr), xf);
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        float wf[8];
        unpack8(wv[k], static_cast<const T*>(nullptr), wf);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[k][t] += wf[e] * xf[e];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[k][t] = warp_sum(acc[k][t]);
}

template <typename T, int N>
__device__ __forceinline__ void gemv_pairs(const uint4* const (&wr)[kRowsPerWarp], const T* x, int32_t x_div,
                                           const int32_t* pairs, int64_t n_rows, int64_t n_cols, int64_t r0,
                                           bool streaming, int lane, float* y) {
  constexpr int kVec = 16 / sizeof(T);
  const uint4* xs[N];
  int32_t ps[N];
#pragma unroll
  for (int t = 0; t < N; ++t) {
    ps[t] = pairs[t];
    xs[t] = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(ps[t] / x_div) * n_cols);
  }
  float acc[kRowsPerWarp][N];
  gemv_pass<T, N>(wr, xs, n_cols / kVec, streaming, lane, acc);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      if (r0 + k >= n_rows) continue;
#pragma unroll
      for (int t = 0; t < N; ++t) y[static_cast<int64_t>(ps[t]) * n_rows + r0 + k] = acc[k][t];
    }
  }
}

// Grid: (row blocks, active expert slots). Block (b, a) computes rows
// [b kWarps kRows, ...) of active expert a for all of its pairs, 8 at a time.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    moe_gemv_kernel(const uint8_t* __restrict__ w, size_t stride, int64_t n_rows, int64_t n_cols,
                    const T* __restrict__ x, int32_t x_div, const int32_t* __restrict__ offsets,
                    const int32_t* __restrict__ active, const int32_t* __restrict__ n_active,
                    const int32_t* __restrict__ pairs, float* __restrict__ y) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int a = blockIdx.y;
  if (a >= *n_active) return;
  const int32_t e = active[a];
  const int32_t p0 = offsets[e], p1 = offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  if (r0 >= n_rows) return;
  const T* we = reinterpret_cast<const T*>(w + static_cast<size_t>(e) * stride);
  const uint4* wr[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int64_t row = r0 + k < n_rows ? r0 + k : n_rows - 1;  // a short last warp re-reads a valid row
    wr[k] = reinterpret_cast<const uint4*>(we + row * n_cols);
  }
  // One pass reads the weights once from memory: stream them past L1. More
  // passes re-read them: keep them cached.
  const bool streaming = p1 - p0 <= kPairsPerPass;
  for (int32_t c = p0; c < p1; c += kPairsPerPass) {
    const int32_t* ps = pairs + c;
    switch (min(kPairsPerPass, p1 - c)) {
      case 1:
        gemv_pairs<T, 1>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 2:
        gemv_pairs<T, 2>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 3:
        gemv_pairs<T, 3>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 4:
        gemv_pairs<T, 4>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 5:
        gemv_pairs<T, 5>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 6:
        gemv_pairs<T, 6>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      case 7:
        gemv_pairs<T, 7>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
      default:
        gemv_pairs<T, 8>(wr, x, x_div, ps, n_rows, n_cols, r0, streaming, lane, y);
        break;
    }
  }
}

// --- expert-indexed product on tensor cores (bf16 / f16) ----------------------

// One block per 16 weight rows of one active expert; its 8 warps split the
// columns (each a contiguous range of 64-column chunks) and their partial
// sums meet in shared memory in warp order. Pairs go 32 per pass, as four
// 8-column tiles of mma.m16n8k16 (f32 accumulation).
//
// Fragments straight from global memory: lane (g = lane / 4, c = lane % 4)
// loads 32 bytes of weight rows g and g + 8 and of its tile's pair g, at
// columns 16c .. 16c + 15 of the chunk (each row's 128 bytes come from one
// quad of lanes). A chunk's 64 columns are four k16 steps under one
// permutation of k shared by A and B (a dot product does not care which k
// goes where): step s takes each lane's columns 16c + 4s .. 16c + 4s + 3.
// Every output is the same sequence of mma steps and the same warp-order
// sum whatever the other pairs are (an mma output element reads only its
// own row and column), so results do not depend on the batch.
constexpr int kMmaWarps = 8, kMmaTiles = 4, kMmaRows = 16, kMmaChunk = 64;

template <typename T>
__global__ void __launch_bounds__(kMmaWarps * 32)
    moe_mma_kernel(const uint8_t* __restrict__ w, size_t stride, int64_t n_rows, int64_t n_cols,
                   const T* __restrict__ x, int32_t x_div, const int32_t* __restrict__ offsets,
                   const int32_t* __restrict__ active, const int32_t* __restrict__ n_active,
                   const int32_t* __restrict__ pairs, float* __restrict__ y) {
  __shared__ float4 red[kMmaWarps][kMmaTiles][32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int a = blockIdx.y;
  if (a >= *n_active) return;
  const int32_t e = active[a];
  const int32_t p0 = offsets[e], p1 = offsets[e + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const T* we = reinterpret_cast<const T*>(w + static_cast<size_t>(e) * stride);
  const int64_t ra = min(r0 + g, n_rows - 1), rb = min(r0 + g + 8, n_rows - 1);  // short last block: re-read
  const uint4* wa = reinterpret_cast<const uint4*>(we + ra * n_cols);
  const uint4* wb = reinterpret_cast<const uint4*>(we + rb * n_cols);
  const int64_t n_chunks = n_cols / kMmaChunk, per = (n_chunks + kMmaWarps - 1) / kMmaWarps;
  const int64_t k0 = min(n_chunks, warp * per), k1 = min(n_chunks, k0 + per);
  const bool streaming = p1 - p0 <= kMmaTiles * 8;  // weights read once: past L1
  for (int32_t q = p0; q < p1; q += kMmaTiles * 8) {
    const int32_t cnt = min(kMmaTiles * 8, p1 - q), tiles = (cnt + 7) / 8;
    const uint4* xr[kMmaTiles];
#pragma unroll
    for (int j = 0; j < kMmaTiles; ++j) {
      const int32_t i = j * 8 + g;
      xr[j] =
          i < cnt ? reinterpret_cast<const uint4*>(x + static_cast<int64_t>(pairs[q + i] / x_div) * n_cols) : nullptr;
    }
    float acc[kMmaTiles][4];
#pragma unroll
    for (int j = 0; j < kMmaTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll 2
    for (int64_t ch = k0; ch < k1; ++ch) {
      const int64_t v = ch * 8 + 2 * c;  // 16-byte vectors
      const uint4 A0 = load_w(wa + v, streaming), A1 = load_w(wa + v + 1, streaming);
      const uint4 B0 = load_w(wb + v, streaming), B1 = load_w(wb + v + 1, streaming);
#pragma unroll
      for (int j = 0; j < kMmaTiles; ++j) {
        if (j >= tiles) break;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 X0 = xr[j] ? __ldg(xr[j] + v) : zero, X1 = xr[j] ? __ldg(xr[j] + v + 1) : zero;
        mma_m16n8k16<T>(acc[j], A0.x, B0.x, A0.y, B0.y, X0.x, X0.y);
        mma_m16n8k16<T>(acc[j], A0.z, B0.z, A0.w, B0.w, X0.z, X0.w);
        mma_m16n8k16<T>(acc[j], A1.x, B1.x, A1.y, B1.y, X1.x, X1.y);
        mma_m16n8k16<T>(acc[j], A1.z, B1.z, A1.w, B1.w, X1.z, X1.w);
      }
    }
#pragma unroll
    for (int j = 0; j < kMmaTiles; ++j) {
      if (j < tiles) red[warp][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    }
    __syncthreads();
    if (warp < tiles) {  // warp j sums tile j over the warps, in warp order
      float4 s = red[0][warp][lane];
      for (int k = 1; k < kMmaWarps; ++k) {
        const float4 o = red[k][warp][lane];
        s.x += o.x;
        s.y += o.y;
        s.z += o.z;
        s.w += o.w;
      }
      // s: rows g and g + 8, pairs 2c and 2c + 1 of tile `warp`.
      const int32_t i = warp * 8 + 2 * c;
      auto put = [&](int32_t pi, int64_t row, float v) {
        if (pi < cnt && row < n_rows) y[static_cast<int64_t>(pairs[q + pi]) * n_rows + row] = v;
      };
      put(i, r0 + g, s.x);
      put(i + 1, r0 + g, s.y);
      put(i, r0 + g + 8, s.z);
      put(i + 1, r0 + g + 8, s.w);
    }
    __syncthreads();
  }
}

// --- gather and combine -------------------------------------------------------

// One block per pair: 16-byte copies of its token's row.
__global__ void gather_kernel(const uint4* __restrict__ x, int32_t K, int64_t row_vecs,
                              const int32_t* __restrict__ row_of_pair, uint4* __restrict__ xg) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t p = blockIdx.x;
  const uint4* src = x + (p / K) * row_vecs;
  uint4* dst = xg + static_cast<int64_t>(row_of_pair[p]) * row_vecs;
  for (int64_t i = threadIdx.x; i < row_vecs; i += blockDim.x) dst[i] = src[i];
}

__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ row_of_pair,
                               const float* __restrict__ weights, int32_t K, int64_t dim,
                               const float* __restrict__ shared_y, const float* __restrict__ shared_logit,
                               float* __restrict__ out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  __shared__ int64_t rows[kMoeMaxExpertsUsed];
  __shared__ float ws[kMoeMaxExpertsUsed];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < K) {
    const int64_t p = t * K + threadIdx.x;
    rows[threadIdx.x] = row_of_pair ? row_of_pair[p] : p;
    ws[threadIdx.x] = weights[p];
  }
  __syncthreads();
  const float g = shared_y ? 1.0f / (1.0f + expf(-shared_logit[t])) : 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += ws[k] * y[rows[k] * dim + j];
    if (shared_y) acc += g * shared_y[t * dim + j];
    out[t * dim + j] += acc;
  }
}

}  // namespace

void moe_route(const float* logits, int64_t n, int32_t n_expert, int32_t n_expert_used, bool norm_topk_prob,
               int32_t pad, const MoeRouting& r, cudaStream_t stream) {
  assert(n_expert >= 1 && n_expert <= kMoeMaxExperts && n_expert_used >= 1 &&
         n_expert_used <= std::min(n_expert, kMoeMaxExpertsUsed) && pad >= 1);
  if (n <= 0) return;
  const int n_warps = std::clamp(kRouteProbBytes / (n_expert * 4), 1, 32);
  const size_t smem = static_cast<size_t>(n_warps) * n_expert * sizeof(float);
  launch_pdl(route_kernel, 1, n_warps * 32, smem, stream, logits, static_cast<int32_t>(n), n_expert, n_expert_used,
             norm_topk_prob, pad, r);
}

bool moe_mma_supported(DType w, int64_t n_cols) {
  return (w == DType::kF16 || w == DType::kBF16) && n_cols % kMmaChunk == 0;
}

bool moe_gemv_supported(DType w, int64_t n_cols) {
  return (w == DType::kF32 && n_cols % 4 == 0) || ((w == DType::kF16 || w == DType::kBF16) && n_cols % 8 == 0);
}

void moe_gemv(const MoeExperts& w, const void* x, int32_t x_div, const MoeRouting& r, int32_t max_active, float* y,
              bool tensor_cores, cudaStream_t stream) {
  assert(moe_gemv_supported(w.dtype, w.n_cols) && w.stride % 16 == 0);
  if (max_active <= 0 || w.n_rows <= 0) return;
  if (tensor_cores && moe_mma_supported(w.dtype, w.n_cols)) {
    const dim3 grid(static_cast<unsigned>((w.n_rows + kMmaRows - 1) / kMmaRows), static_cast<unsigned>(max_active));
    const auto* base = static_cast<const uint8_t*>(w.data);
    const auto* off = static_cast<const int32_t*>(r.offsets);
    const auto* act = static_cast<const int32_t*>(r.active);
    const auto* n_act = static_cast<const int32_t*>(r.n_active);
    const auto* pairs = static_cast<const int32_t*>(r.sorted_pairs);
    if (w.dtype == DType::kF16) {
      launch_pdl(moe_mma_kernel<__half>, grid, kMmaWarps * 32, 0, stream, base, w.stride, w.n_rows, w.n_cols,
                 static_cast<const __half*>(x), x_div, off, act, n_act, pairs, y);
    } else {
      launch_pdl(moe_mma_kernel<__nv_bfloat16>, grid, kMmaWarps * 32, 0, stream, base, w.stride, w.n_rows, w.n_cols,
                 static_cast<const __nv_bfloat16*>(x), x_div, off, act, n_act, pairs, y);
    }
    return;
  }
  const int64_t rows_per_block = int64_t{kWarps} * kRowsPerWarp;
  const dim3 grid(static_cast<unsigned>((w.n_rows + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(max_active));
  const auto* base = static_cast<const uint8_t*>(w.data);
  RILL_CUDA_DISPATCH_FLOAT(
      w.dtype, launch_pdl(moe_gemv_kernel<T>, grid, kWarps * 32, 0, stream, base, w.stride, w.n_rows, w.n_cols,
                          static_cast<const T*>(x), x_div, static_cast<const int32_t*>(r.offsets),
                          static_cast<const int32_t*>(r.active), static_cast<const int32_t*>(r.n_active),
                          static_cast<const int32_t*>(r.sorted_pairs), y));
}

void moe_gather(DType dtype, const void* x, int64_t n, int32_t n_expert_used, int64_t n_cols,
                const int32_t* row_of_pair, void* xg, cudaStream_t stream) {
  const int64_t row_bytes = n_cols * (dtype == DType::kF32 ? 4 : 2);
  assert(row_bytes % 16 == 0);
  if (n <= 0) return;
  launch_pdl(gather_kernel, static_cast<unsigned>(n * n_expert_used), 128, 0, stream, static_cast<const uint4*>(x),
             n_expert_used, row_bytes / 16, row_of_pair, static_cast<uint4*>(xg));
}

void moe_combine(const float* y, const int32_t* row_of_pair, const float* weights, int64_t n, int32_t n_expert_used,
                 int64_t dim, const float* shared_y, const float* shared_logit, float* out, cudaStream_t stream) {
  assert(n_expert_used >= 1 && n_expert_used <= kMoeMaxExpertsUsed);
  if (n <= 0) return;
  launch_pdl(combine_kernel, static_cast<unsigned>(n), 256, 0, stream, y, row_of_pair, weights, n_expert_used, dim,
             shared_y, shared_logit, out);
}

}  // namespace rill::cuda
