// The lightning indexer's kernels (lightning_index.h): key store and RoPE,
// per-token scores and top-k selection; and LayerNorm.
#include <cassert>
#include <cmath>

#include "backend/cuda/latent_rows.cuh"
#include "backend/cuda/lightning_index.h"

namespace rill::cuda {
namespace {

constexpr int kStoreThreads = 128, kSelectThreads = 256;

// One block per token: its key rotated and stored at key_col of its row,
// every query head rotated in place.
__global__ void index_store_kernel(LightningIndexArgs a) {
  extern __shared__ float key[];  // [head_dim]
  const int64_t t = blockIdx.x;
  const int32_t p = a.pos[t];
  const int D = a.head_dim, n_pairs = a.rope.rot_dim / 2;
  for (int i = threadIdx.x; i < D; i += blockDim.x) key[i] = a.k[t * a.k_stride + i];
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) detail::rope_pair(a.rope, p, i, key);
  for (int idx = threadIdx.x; idx < a.n_head * n_pairs; idx += blockDim.x) {
    detail::rope_pair(a.rope, p, idx % n_pairs, a.q + t * a.q_stride + int64_t{idx / n_pairs} * D);
  }
  __syncthreads();
  const size_t at = detail::latent_slot_offset(a.cache, a.slots[t]);
  for (int i = threadIdx.x; i < D; i += blockDim.x) detail::latent_write(a.cache, at, a.key_col + i, key[i]);
}

// (score, position) as one unsigned key: larger is better, so equal scores
// rank the later position first (the CPU's total order). -0 counts as +0.
__device__ __forceinline__ uint64_t rank_key(float s, int32_t j) {
  uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t{u} << 32) | static_cast<uint32_t>(j);
}

// Blocks take tokens in turn; a token's scores go to the block's row.
__global__ void __launch_bounds__(kSelectThreads) index_select_kernel(LightningIndexArgs a) {
  extern __shared__ float qs[];  // [n_head head_dim]
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_count[kSelectThreads / 32];
  __shared__ uint32_t s_digit, s_rem;
  const int H = a.n_head, D = a.head_dim;
  float* scores = a.scores + int64_t{blockIdx.x} * a.max_keys;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < a.n_tokens; t += gridDim.x) {
    const int32_t n_kv = a.pos[t] + 1;
    int32_t* sel = a.selected + t * a.topk;
    if (n_kv <= a.topk) {  // every key
      for (int32_t j = threadIdx.x; j < n_kv; j += blockDim.x) sel[j] = j;
      if (threadIdx.x == 0) a.n_selected[t] = n_kv;
      continue;
    }
    __syncthreads();  // qs and the histogram of the previous token are done with
    for (int i = threadIdx.x; i < H * D; i += blockDim.x) qs[i] = a.q[t * a.q_stride + i];
    __syncthreads();
    const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
    const float* w = a.w + t * a.w_stride;
    for (int32_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
      const size_t at = detail::latent_key_offset(a.cache, table, j);
      float total = 0.0f;
      for (int h = 0; h < H; ++h) {
        float dot = 0.0f;
        for (int i = 0; i < D; ++i) dot += qs[h * D + i] * detail::latent_read(a.cache, at, a.key_col + i);
        total += a.weight_scale * w[h] * fmaxf(0.0f, a.score_scale * dot);
      }
      scores[j] = total;
    }
    // The topk-th largest rank key, a byte at a time from the top.
    uint64_t prefix = 0, mask = 0;
    uint32_t rem = static_cast<uint32_t>(a.topk);
    for (int shift = 56; shift >= 0; shift -= 8) {
      __syncthreads();  // scores written; the previous pass's hist read
      for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
      __syncthreads();
      for (int32_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
        const uint64_t k = rank_key(scores[j], j);
        if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 0xFF], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t above = 0;
        int d = 255;
        for (; d > 0 && above + hist[d] < rem; --d) above += hist[d];
        s_digit = static_cast<uint32_t>(d);
        s_rem = rem - above;
      }
      __syncthreads();
      prefix |= uint64_t{s_digit} << shift;
      mask |= uint64_t{0xFF} << shift;
      rem = s_rem;
    }
    // Keys >= the threshold, exactly topk of them, in ascending positions.
    int32_t base = 0;
    for (int32_t j0 = 0; j0 < n_kv; j0 += blockDim.x) {
      const int32_t j = j0 + static_cast<int32_t>(threadIdx.x);
      const bool take = j < n_kv && rank_key(scores[j], j) >= prefix;
      const uint32_t ballot = __ballot_sync(0xffffffffu, take);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int32_t before = 0, total = 0;
      for (int k = 0; k < kSelectThreads / 32; ++k) {
        before += k < warp ? static_cast<int32_t>(warp_count[k]) : 0;
        total += static_cast<int32_t>(warp_count[k]);
      }
      if (take) sel[base + before + __popc(ballot & ((1u << lane) - 1u))] = j;
      base += total;
      __syncthreads();  // warp_count read before the next chunk writes it
    }
    if (threadIdx.x == 0) a.n_selected[t] = a.topk;
  }
}

__device__ __forceinline__ double block_sum_double(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) s += red[w];
  return s;
}

__global__ void layer_norm_kernel(const float* x, int64_t x_stride, const float* w, const float* b, int64_t n_cols,
                                  float eps, float* out, int64_t out_stride) {
  __shared__ double red[32];
  const float* src = x + blockIdx.x * x_stride;
  float* dst = out + blockIdx.x * out_stride;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) sum += src[i];
  const double mean = block_sum_double(sum, red) / static_cast<double>(n_cols);
  double sq = 0.0;
  for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) sq += (src[i] - mean) * (src[i] - mean);
  const double var = block_sum_double(sq, red) / static_cast<double>(n_cols);
  const auto inv = static_cast<float>(1.0 / sqrt(var + eps));
  const auto m = static_cast<float>(mean);
  __syncthreads();  // every thread has read its src before any writes an aliased out
  for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) dst[i] = (src[i] - m) * inv * w[i] + b[i];
}

}  // namespace

void lightning_index(const LightningIndexArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  assert(a.topk > 0 && a.scores && a.max_keys > 0);
  index_store_kernel<<<static_cast<unsigned>(a.n_tokens), kStoreThreads, sizeof(float) * a.head_dim, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
  const auto blocks = static_cast<unsigned>(a.n_tokens < kIndexBlocks ? a.n_tokens : kIndexBlocks);
  const size_t smem = sizeof(float) * static_cast<size_t>(a.n_head) * a.head_dim;
  index_select_kernel<<<blocks, kSelectThreads, smem, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void layer_norm(const float* x, int64_t x_stride, const float* w, const float* b, int64_t n_rows, int64_t n_cols,
                float eps, float* out, int64_t out_stride, cudaStream_t stream) {
  if (n_rows <= 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(n_rows), 128, 0, stream>>>(x, x_stride, w, b, n_cols, eps, out, out_stride);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
