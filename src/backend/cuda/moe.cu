// Mixture-of-experts kernels (see moe.h for the contracts).
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <type_traits>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_blocks.cuh"

namespace rill::cuda {
namespace {

using detail::from_f32;
using detail::warp_max;
using detail::warp_sum;

// --- routing and grouping ---------------------------------------------------

// The score rows of the warps live in dynamic shared memory, at most this
// many bytes: 32 warps for up to 192 experts (96 where the choice scores
// need a row of their own), fewer above.
constexpr int kRouteProbBytes = 24 * 1024;

// Whether the choice scores differ from the weights' scores (their own row).
__host__ __device__ inline bool separate_choice(const MoeRouter& m) {
  return m.sigmoid_scores || m.score_bias != nullptr || m.n_group > 1;
}

// Keeps only the topk_group best groups' choice scores of one token (the
// others become 0), as cpu::choice_scores: a group's score is the sum of
// its two best (a + b, a >= b); groups are picked by repeated arg-max,
// ties to the lower group. Lane g owns group g.
__device__ void mask_groups(float* cs, const MoeRouter& m, int lane) {
  const int32_t G = m.n_group, per = m.n_expert / G;
  float gv = -INFINITY;
  if (lane < G) {
    float a = -INFINITY, b = -INFINITY;
    for (int32_t e = lane * per; e < (lane + 1) * per; ++e) {
      const float v = cs[e];
      if (v > a) {
        b = a;
        a = v;
      } else if (v > b) {
        b = v;
      }
    }
    gv = a + b;
  }
  uint32_t kept = 0;
  for (int k = 0; k < m.topk_group; ++k) {
    float bv = gv;
    int32_t bg = lane < G ? lane : kMoeMaxGroups;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int32_t og = __shfl_xor_sync(0xffffffffu, bg, o);
      if (ov > bv || (ov == bv && og < bg)) {
        bv = ov;
        bg = og;
      }
    }
    bg = min(bg, G - 1);
    kept |= 1u << bg;
    if (lane == bg) gv = -INFINITY;
  }
  __syncwarp();
  for (int32_t e = lane; e < m.n_expert; e += 32) {
    if (!((kept >> (e / per)) & 1u)) cs[e] = 0.0f;
  }
  __syncwarp();
}

// Routing, part 1 (blocks of n_warps warps, as many as the tokens need):
// each warp routes its tokens (scores, K arg-max passes, the K picks
// ordered by id) into r.ids / r.weights. A token's picks depend on its
// logits only.
__global__ void route_pick_kernel(const float* __restrict__ logits, int32_t n, MoeRouter m, MoeRouting r) {
  extern __shared__ float probs_all[];  // [n_warps, X] (or [n_warps, 2X]: scores, choice scores)
  detail::pdl_wait();
  detail::pdl_trigger();
  const int32_t X = m.n_expert, K = m.n_expert_used;
  const bool separate = separate_choice(m);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  float* pr = probs_all + static_cast<size_t>(warp) * X * (separate ? 2 : 1);
  float* cs = separate ? pr + X : pr;  // the choice scores; a picked one becomes -inf
  for (int32_t t = blockIdx.x * n_warps + warp; t < n; t += gridDim.x * n_warps) {
    const float* l = logits + static_cast<int64_t>(t) * X;
    if (m.softmax_after_topk) {
      for (int e = lane; e < X; e += 32) pr[e] = m.router_bias ? l[e] + m.router_bias[e] : l[e];
    } else if (m.sigmoid_scores) {
      for (int e = lane; e < X; e += 32) {
        const float v = m.router_bias ? l[e] + m.router_bias[e] : l[e];
        pr[e] = 1.0f / (1.0f + expf(-v));
      }
    } else {
      float mx = -FLT_MAX;
      for (int e = lane; e < X; e += 32) {
        const float v = m.router_bias ? l[e] + m.router_bias[e] : l[e];
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
    }
    if (separate) {
      for (int e = lane; e < X; e += 32) cs[e] = pr[e] + (m.score_bias ? m.score_bias[e] : 0.0f);
    }
    __syncwarp();
    if (m.n_group > 1) mask_groups(cs, m, lane);
    // K arg-max passes over the choice scores. Lane k keeps pick k: its id
    // and its weight's score (pr: the probability, gpt-oss: the logit).
    int32_t my_id = 0;
    float my_p = 0.0f, picked_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      float bv = -INFINITY;
      int32_t be = X;
      for (int e = lane; e < X; e += 32) {
        const float v = cs[e];
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
      const float pv = separate ? pr[be] : bv;
      if (lane == k) {
        my_id = be;
        my_p = pv;
      }
      picked_sum += pv;  // in pick order, as the CPU
      __syncwarp();
      if (lane == 0) cs[be] = -INFINITY;
      __syncwarp();
    }
    float my_w;
    if (m.softmax_after_topk) {
      // The first pick is the largest logit; the sum in pick order.
      const float mx = __shfl_sync(0xffffffffu, my_p, 0);
      const float ex = expf(my_p - mx);
      float sum = 0.0f;
      for (int k = 0; k < K; ++k) sum += __shfl_sync(0xffffffffu, ex, k);
      my_w = ex / sum;
    } else {
      my_w = my_p;
      if (m.norm_topk_prob) my_w = my_p / (m.sigmoid_scores ? picked_sum + 1e-20f : picked_sum);
      if (m.routed_scaling_factor != 1.0f) my_w *= m.routed_scaling_factor;
      if (m.expert_scale && lane < K) my_w *= m.expert_scale[my_id];
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
      r.weights[at] = my_w;
    }
    __syncwarp();
  }
}

// Routing, part 2 (one block): pairs per expert counted from r.ids, then
// (warp 0) offsets by an exclusive scan over experts, and the pairs placed
// in increasing index, 32 at a time, ranks among equal experts from
// __match_any_sync, so the grouping is the same on every run.
__global__ void route_group_kernel(int32_t n, MoeRouter m, int32_t pad, MoeRouting r) {
  __shared__ int32_t cnt[kMoeMaxExperts];    // pairs per expert, then the fill cursor
  __shared__ int32_t off_s[kMoeMaxExperts];  // offsets[e]
  __shared__ int32_t pad_s[kMoeMaxExperts];  // padded[e]
  detail::pdl_wait();
  detail::pdl_trigger();
  const int32_t X = m.n_expert, K = m.n_expert_used;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < X; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n * K; i += blockDim.x) atomicAdd(&cnt[r.ids[i]], 1);
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

  // Stable fill (the ids: route_pick_kernel's, visible after pdl_wait).
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

// --- expert-indexed GEMV over quantized blocks ---------------------------------

constexpr int kQuantWarps = 4;  // one row per warp

// 4 consecutive x elements as f32 (x rows start 16-byte aligned and c is a
// multiple of 4).
__device__ __forceinline__ void load_x4(const float* p, float* v) {
  const float4 u = *reinterpret_cast<const float4*>(p);
  v[0] = u.x;
  v[1] = u.y;
  v[2] = u.z;
  v[3] = u.w;
}
template <typename T>
__device__ __forceinline__ void load_x4(const T* p, float* v) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  uint4 w = make_uint4(u.x, u.y, 0, 0);
  float f[8];
  unpack8(w, static_cast<const T*>(nullptr), f);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = f[i];
}

// Grid: (row blocks, active expert slots); warp w of block (b, a) computes
// row b kQuantWarps + w of active expert a for all of its pairs,
// kPairsPerPass at a time (the row's blocks decoded again each pass: they
// come from L1/L2 after the first). Lane L takes items L, L + 32, ... of the
// row in order, then the warp's xor tree: a pair's sum has one order,
// whatever the other pairs are.
template <class Q, typename T>
__global__ void __launch_bounds__(kQuantWarps * 32)
    moe_quant_kernel(const uint8_t* __restrict__ w, size_t stride, int64_t n_rows, int64_t n_cols,
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
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kQuantWarps + warp;
  if (row >= n_rows) return;
  const int64_t n_blocks = n_cols / Q::kElems;
  const uint8_t* wr = w + static_cast<size_t>(e) * stride + static_cast<size_t>(row * n_blocks * Q::kBytes);
  const int64_t n_items = n_blocks * Q::kItems;
  for (int32_t c = p0; c < p1; c += kPairsPerPass) {
    const int cnt = min(kPairsPerPass, p1 - c);
    const T* xs[kPairsPerPass];
#pragma unroll
    for (int t = 0; t < kPairsPerPass; ++t) {
      xs[t] = x + static_cast<int64_t>(pairs[c + min(t, cnt - 1)] / x_div) * n_cols;
    }
    float acc[kPairsPerPass];
#pragma unroll
    for (int t = 0; t < kPairsPerPass; ++t) acc[t] = 0.0f;
    for (int64_t it = lane; it < n_items; it += 32) {
      const int64_t b = it / Q::kItems;
      const int k = static_cast<int>(it % Q::kItems);
      float wf[8];
      Q::decode(wr + b * Q::kBytes, k, wf);
      const int64_t c0 = b * Q::kElems + Q::col0(k), c1 = b * Q::kElems + Q::col1(k);
#pragma unroll
      for (int t = 0; t < kPairsPerPass; ++t) {
        if (t < cnt) {
          float xa[4], xb[4];
          load_x4(xs[t] + c0, xa);
          load_x4(xs[t] + c1, xb);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t] = fmaf(wf[i], xa[i], acc[t]);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t] = fmaf(wf[4 + i], xb[i], acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kPairsPerPass; ++t) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0 && t < cnt) y[static_cast<int64_t>(pairs[c + t]) * n_rows + row] = sum;
    }
  }
}

// --- the experts' activation ----------------------------------------------------

// Grid: one block per row.
template <typename Out>
__global__ void glu_kernel(const float* __restrict__ gate_up, int64_t n_ff, MoeGlu g, Out* __restrict__ out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.x;
  const float* gu = gate_up + r * 2 * n_ff;
  const float* bias = nullptr;
  if (g.bias) {
    int32_t e = 0;
    if (g.row_expert) {
      e = g.row_expert[r];
    } else {  // the last e with padded[e] <= r
      int32_t lo = 0, hi = g.n_expert - 1;
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (g.padded[mid] <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      e = lo;
    }
    bias = g.bias + static_cast<int64_t>(e) * 2 * n_ff;
  }
  for (int64_t i = threadIdx.x; i < n_ff; i += blockDim.x) {
    const float x = bias ? gu[i] + bias[i] : gu[i];
    const float u = bias ? gu[n_ff + i] + bias[n_ff + i] : gu[n_ff + i];
    float v;
    if (g.act == MoeAct::kClampedSwiglu) {
      const float gc = fminf(x, g.limit);
      const float uc = fminf(fmaxf(u, -g.limit), g.limit);
      v = gc * (1.0f / (1.0f + expf(-(g.alpha * gc)))) * (uc + 1.0f);
    } else if (g.act == MoeAct::kGeluTanh) {
      v = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * u;
    } else {
      v = x / (1.0f + expf(-x)) * u;
    }
    out[r * n_ff + i] = from_f32<Out>(v);
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

__global__ void combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, int32_t K, int64_t dim,
                               MoeCombine c, float* __restrict__ out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  __shared__ int64_t rows[kMoeMaxExpertsUsed];
  __shared__ const float* biases[kMoeMaxExpertsUsed];
  __shared__ float ws[kMoeMaxExpertsUsed];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < K) {
    const int64_t p = t * K + threadIdx.x;
    rows[threadIdx.x] = c.row_of_pair ? c.row_of_pair[p] : p;
    ws[threadIdx.x] = weights[p];
    biases[threadIdx.x] = c.down_bias ? c.down_bias + static_cast<int64_t>(c.ids[p]) * dim : nullptr;
  }
  __syncthreads();
  const float g = !c.shared_y ? 0.0f : c.shared_logit ? 1.0f / (1.0f + expf(-c.shared_logit[t])) : 1.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.0f;
    if (c.down_bias) {
      for (int k = 0; k < K; ++k) acc += ws[k] * (y[rows[k] * dim + j] + biases[k][j]);
    } else {
      for (int k = 0; k < K; ++k) acc += ws[k] * y[rows[k] * dim + j];
    }
    if (c.shared_y) acc += g * c.shared_y[t * dim + j];
    out[t * dim + j] = c.accumulate ? out[t * dim + j] + acc : acc;
  }
}

}  // namespace

void moe_route(const float* logits, int64_t n, const MoeRouter& m, int32_t pad, const MoeRouting& r,
               cudaStream_t stream) {
  assert(m.n_expert >= 1 && m.n_expert <= kMoeMaxExperts && m.n_expert_used >= 1 &&
         m.n_expert_used <= std::min(m.n_expert, kMoeMaxExpertsUsed) && pad >= 1);
  assert(m.n_group >= 1 && m.n_group <= kMoeMaxGroups && m.n_expert % m.n_group == 0 && m.topk_group >= 1 &&
         m.topk_group <= m.n_group);
  if (n <= 0) return;
  const int row_bytes = m.n_expert * 4 * (separate_choice(m) ? 2 : 1);
  const int n_warps = std::clamp(kRouteProbBytes / row_bytes, 1, 32);
  const size_t smem = static_cast<size_t>(n_warps) * row_bytes;
  const auto blocks = static_cast<unsigned>((n + n_warps - 1) / n_warps);
  launch_pdl(route_pick_kernel, blocks, n_warps * 32, smem, stream, logits, static_cast<int32_t>(n), m, r);
  launch_pdl(route_group_kernel, 1, 1024, 0, stream, static_cast<int32_t>(n), m, pad, r);
}

bool moe_mma_supported(DType w, int64_t n_cols) {
  return (w == DType::kF16 || w == DType::kBF16) && n_cols % kMmaChunk == 0;
}

bool moe_gemv_supported(DType w, int64_t n_cols) {
  if (w != kFp8Rows && quant_supported(w)) return n_cols % dtype_info(w).block_size == 0;
  return (w == DType::kF32 && n_cols % 4 == 0) || ((w == DType::kF16 || w == DType::kBF16) && n_cols % 8 == 0);
}

void moe_gemv(const MoeExperts& w, const void* x, DType x_dtype, int32_t x_div, const MoeRouting& r, int32_t max_active,
              float* y, bool tensor_cores, cudaStream_t stream) {
  assert(moe_gemv_supported(w.dtype, w.n_cols));
  if (max_active <= 0 || w.n_rows <= 0) return;
  if (dtype_info(w.dtype).quantized) {
    const dim3 grid(static_cast<unsigned>((w.n_rows + kQuantWarps - 1) / kQuantWarps),
                    static_cast<unsigned>(max_active));
    const auto* base = static_cast<const uint8_t*>(w.data);
    const auto* off = static_cast<const int32_t*>(r.offsets);
    const auto* act = static_cast<const int32_t*>(r.active);
    const auto* n_act = static_cast<const int32_t*>(r.n_active);
    const auto* pairs = static_cast<const int32_t*>(r.sorted_pairs);
    RILL_CUDA_DISPATCH_QUANT(
        w.dtype,
        RILL_CUDA_DISPATCH_FLOAT(
            x_dtype, launch_pdl(moe_quant_kernel<Q, T>, grid, kQuantWarps * 32, 0, stream, base, w.stride, w.n_rows,
                                w.n_cols, static_cast<const T*>(x), x_div, off, act, n_act, pairs, y)));
    return;
  }
  assert(w.stride % 16 == 0 && x_dtype == w.dtype);
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

void moe_glu(const float* gate_up, int64_t n_rows, int64_t n_ff, const MoeGlu& g, DType out_dtype, void* out,
             cudaStream_t stream) {
  assert(!g.bias || g.row_expert || (g.padded && g.n_expert >= 1));
  if (n_rows <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(256, (n_ff + 31) / 32 * 32));
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(glu_kernel<T>, static_cast<unsigned>(n_rows), threads, 0, stream,
                                                 gate_up, n_ff, g, static_cast<T*>(out)));
}

void moe_combine(const float* y, const float* weights, int64_t n, int32_t n_expert_used, int64_t dim,
                 const MoeCombine& c, float* out, cudaStream_t stream) {
  assert(n_expert_used >= 1 && n_expert_used <= kMoeMaxExpertsUsed && (!c.down_bias || c.ids));
  if (n <= 0) return;
  launch_pdl(combine_kernel, static_cast<unsigned>(n), 256, 0, stream, y, weights, n_expert_used, dim, c, out);
}

}  // namespace rill::cuda
