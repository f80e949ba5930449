#pragma once
// Device helpers shared by the decode attention kernels (attention.cu's
// general one and attention_decode.cu's fast path): cache-row lookup, the
// split rule, the partial-result layout and the split merge.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"

namespace rill::cuda::detail {

__device__ __forceinline__ int64_t cache_row(const AttentionArgs& a, const int32_t* table, int32_t j) {
  const int32_t mask = (1 << a.block_shift) - 1;
  return (static_cast<int64_t>(table[j >> a.block_shift]) << a.block_shift) + (j & mask);
}

__device__ __forceinline__ float softcap_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// A sink logit joins a head's finished softmax state: the keys' sum l of
// exp(s - m) (m their max; -inf without keys) becomes the sum over the keys
// and the sink, both relative to max(m, sink); returns the factor the
// output accumulator (relative to m) takes. Callers divide by the updated
// l. The CPU's order (backend/cpu/attend_row_impl.h).
__device__ __forceinline__ float add_sink(float sink, float m, float& l) {
  const float m2 = fmaxf(m, sink);
  const float corr = expf(m - m2);  // 0 without keys
  l = l * corr + expf(sink - m2);
  return corr;
}

// Splits of a decode token whose keys span [0, len): a function of len only
// (batch invariance). Split s covers keys [s * split_len, (s + 1) * split_len).
__host__ __device__ __forceinline__ int32_t splits_for(int32_t len) {
  int32_t s = (len + kSplitKeys - 1) / kSplitKeys;
  return s < 1 ? 1 : s > kMaxSplits ? kMaxSplits : s;
}

// Decode token z's keys in split `split`: [k_begin, k_end) (splits_for's
// rule, from the window's first key; empty for a split past the token's
// own n_splits, which then has nothing to do). t is the token's flat index.
struct DecodeSplit {
  int32_t t, n_splits, k_begin, k_end;
};
__device__ __forceinline__ DecodeSplit decode_split(const AttentionArgs& a, int z, int split) {
  DecodeSplit s;
  s.t = a.decode_tokens[z];
  const int32_t p = a.pos[s.t], len = p + 1;
  s.n_splits = splits_for(len);
  const int32_t split_len = (len + s.n_splits - 1) / s.n_splits;
  const int32_t lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
  s.k_begin = max(split * split_len, lo);
  s.k_end = min(len, (split + 1) * split_len);
  return s;
}

// Partial results of split s of (decode token z, head h): m, l, then acc[head_dim].
__device__ __forceinline__ float* partial_at(const AttentionArgs& a, int z, int h, int s) {
  const int64_t rec = a.head_dim + 2;
  return a.partial + ((static_cast<int64_t>(z) * a.n_head + h) * kMaxSplits + s) * rec;
}

__device__ __forceinline__ void store_out(DType dtype, void* out, int64_t i, float v) {
  if (dtype == DType::kBF16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  } else if (dtype == DType::kF16) {
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

// The log-sum-exp merge of the n_splits partials of heads [h0, h0 +
// n_heads) of decode token z (flat token t) into out, in split order, by
// the whole block (every thread calls it; kHeads >= n_heads). The combine
// kernel and the decode kernels' last blocks all use it, so their outputs
// are equal. Partials are read through L2 (__ldcg): other blocks of the
// same launch may have written them; each pass issues its loads together.
template <int kHeads>
__device__ void merge_heads(const AttentionArgs& a, int z, int32_t t, int h0, int n_heads, int32_t n_splits) {
  __shared__ float ms[kHeads][kMaxSplits], ls[kHeads][kMaxSplits], ws[kHeads][kMaxSplits], inv_s[kHeads];
  for (int i = threadIdx.x; i < n_heads * n_splits; i += blockDim.x) {
    const int g = i / n_splits, s = i % n_splits;
    const float* part = partial_at(a, z, h0 + g, s);
    ms[g][s] = __ldcg(part);
    ls[g][s] = __ldcg(part + 1);
  }
  __syncthreads();
  for (int g = threadIdx.x; g < n_heads; g += blockDim.x) {
    float m = -INFINITY;
    for (int s = 0; s < n_splits; ++s) m = fmaxf(m, ms[g][s]);
    float den = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float l = ls[g][s], w = expf(ms[g][s] - m);
      ws[g][s] = l > 0.0f ? w : -1.0f;  // -1: an empty split, skipped
      if (l > 0.0f) den += w * l;
    }
    if (a.sinks) {  // the sink joins the merged denominator
      const float corr = add_sink(a.sinks[h0 + g], m, den);
      inv_s[g] = corr / den;
      continue;
    }
    inv_s[g] = den > 0.0f ? 1.0f / den : 0.0f;
  }
  __syncthreads();
  const int hd = a.head_dim;
  const int64_t out_base = static_cast<int64_t>(t) * a.n_head * hd + static_cast<int64_t>(h0) * hd;
  for (int i = threadIdx.x; i < n_heads * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    float v = 0.0f;
    for (int s0 = 0; s0 < n_splits; s0 += 8) {
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool use = s0 + k < n_splits && ws[g][s0 + k] >= 0.0f;
        x[k] = use ? __ldcg(partial_at(a, z, h0 + g, s0 + k) + 2 + d) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (s0 + k < n_splits && ws[g][s0 + k] >= 0.0f) v += ws[g][s0 + k] * x[k];
      }
    }
    store_out(a.out_dtype, a.out, out_base + i, v * inv_s[g]);
  }
}

// With a.split_counts, the last split block of (token z, KV head kvh) to
// finish merges its heads' splits into out (no combine kernel). Called by
// every thread of each block after its partial stores. The stores are
// ordered before the count by the barrier and one thread's fence (as a grid
// barrier does); the count is reset for the next launch.
template <int kG>
__device__ __forceinline__ void merge_if_last(const AttentionArgs& a, int z, int32_t t, int kvh, int n_group,
                                              int32_t n_splits) {
  __shared__ bool is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    int32_t* count = a.split_counts + static_cast<int64_t>(z) * a.n_head_kv + kvh;
    is_last = atomicAdd(count, 1) == n_splits - 1;
    if (is_last) {
      *count = 0;
      __threadfence();
    }
  }
  __syncthreads();
  if (is_last) merge_heads<kG>(a, z, t, kvh * n_group, n_group, n_splits);
}

// The kW warps of a decode block meet: each left its state of heads kvh kG
// + [0, kG) of token t over its own keys of split `split` in shared memory
// (acc_s[w][g][d]: the output sums relative to m_s[w][g], natural-log units;
// l_s[w][g] their denominators, 0 for a warp without keys). Merged in warp
// order by the whole block (every thread calls it after a barrier): the
// output where the token has one split, else the split's partial, merged
// by the last block when a.split_counts is set.
template <int kG, int kHd, int kW>
__device__ void combine_warps(const AttentionArgs& a, const float (*acc_s)[kG][kHd], const float (*m_s)[kG],
                              const float (*l_s)[kG], int z, int32_t t, int kvh, int split, int32_t n_splits) {
  for (int i = threadIdx.x; i < kG * kHd; i += kW * 32) {
    const int g = i / kHd, d = i % kHd;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kW; ++w) mx = fmaxf(mx, m_s[w][g]);
    float den = 0.0f, num = 0.0f;
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      if (l_s[w][g] > 0.0f) {
        const float wt = expf(m_s[w][g] - mx);
        den += wt * l_s[w][g];
        num += wt * acc_s[w][g][d];
      }
    }
    const int h = kvh * kG + g;
    if (n_splits == 1) {
      if (a.sinks) num *= add_sink(a.sinks[h], mx, den);
      store_out(a.out_dtype, a.out, (static_cast<int64_t>(t) * a.n_head + h) * kHd + d, num / den);
    } else {
      float* part = partial_at(a, z, h, split);
      part[2 + d] = num;
      if (d == 0) {
        part[0] = mx;
        part[1] = den;
      }
    }
  }
  if (a.split_counts && n_splits > 1) merge_if_last<kG>(a, z, t, kvh, kG, n_splits);
}

}  // namespace rill::cuda::detail
