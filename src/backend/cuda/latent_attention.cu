// Multi-head latent attention kernels (latent_attention.h): the per-head
// products, RoPE with the latent row's store, and the absorbed attention.
#include <cassert>
#include <cmath>

#include "backend/cuda/latent_attention.h"
#include "backend/cuda/latent_rows.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using detail::block_sum;
using detail::to_f32;
using detail::warp_max;
using detail::warp_sum;

// --- matmul_heads -------------------------------------------------------------

// A block computes kRows rows of one head for kTokens tokens; each thread
// one output, summed over c in ascending order (tiles of kChunk columns in
// shared memory), so a token's values never depend on the others.
constexpr int kRows = 32, kTokens = 8, kChunk = 32;

template <typename W>
__global__ void matmul_heads_kernel(HeadsMatmulArgs a) {
  __shared__ float ws[kRows][kChunk + 1];
  __shared__ float xs[kTokens][kChunk];
  const int h = blockIdx.z;
  const int64_t r0 = int64_t{blockIdx.x} * kRows, t0 = int64_t{blockIdx.y} * kTokens;
  const int r_local = threadIdx.x % kRows, t_local = threadIdx.x / kRows;
  const W* w = static_cast<const W*>(a.w) + (h * a.R) * a.C;
  const float* x = a.x + int64_t{h} * a.x_step;
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < a.C; c0 += kChunk) {
    for (int e = threadIdx.x; e < kRows * kChunk; e += blockDim.x) {
      const int row = e / kChunk, col = e % kChunk;
      const bool in = r0 + row < a.R && c0 + col < a.C;
      ws[row][col] = in ? to_f32(w[(r0 + row) * a.C + c0 + col]) : 0.0f;
    }
    {
      const int tok = threadIdx.x / kChunk, col = threadIdx.x % kChunk;
      const bool in = t0 + tok < a.n_tokens && c0 + col < a.C;
      xs[tok][col] = in ? x[(t0 + tok) * a.x_stride + c0 + col] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kChunk; ++c) acc += ws[r_local][c] * xs[t_local][c];
    __syncthreads();
  }
  const int64_t r = r0 + r_local, t = t0 + t_local;
  if (r < a.R && t < a.n_tokens) a.y[t * a.y_stride + int64_t{h} * a.y_step + r] = acc;
}

// --- rope_store_latent ----------------------------------------------------------

// One block per token; the row staged in shared memory ([L + R] floats).
__global__ void rope_store_latent_kernel(LatentStoreArgs a) {
  extern __shared__ float row[];
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int32_t p = a.pos[t];
  const int L = a.kv_lora_rank, W = L + a.rope_dim, n_pairs = a.rope.rot_dim / 2;
  for (int idx = threadIdx.x; idx < a.n_head * n_pairs; idx += blockDim.x) {
    const int h = idx / n_pairs;
    detail::rope_pair(a.rope, p, idx % n_pairs, a.q + t * a.q_stride + int64_t{h} * a.q_head_dim + a.q_rope_col);
  }
  const float* src = a.kv + t * a.kv_stride;
  for (int i = threadIdx.x; i < W; i += blockDim.x) row[i] = src[i];
  __syncthreads();
  float ss = 0.0f;
  for (int i = threadIdx.x; i < L; i += blockDim.x) ss += row[i] * row[i];
  ss = block_sum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(L) + a.norm_eps);
  for (int i = threadIdx.x; i < L; i += blockDim.x) row[i] = row[i] * scale * a.kv_norm[i];
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) detail::rope_pair(a.rope, p, i, row + L);
  __syncthreads();
  const size_t at = detail::latent_slot_offset(a.cache, a.slots[t]);
  for (int i = threadIdx.x; i < 2 * a.cache.plane; i += blockDim.x) {
    detail::latent_write(a.cache, at, i, i < W ? row[i] : 0.0f);
  }
}

// --- latent_attention -------------------------------------------------------------

// A block serves one token and up to kGroup heads; keys go in chunks of
// kKeys (one per lane of a warp in the softmax update). Shared memory, in
// floats: q [G, W], the chunk's rows [kKeys, W], scores [G, kKeys], the
// output accumulators [G, L], then m, l and the rescale per head.
constexpr int kGroup = 8, kKeys = 32, kThreads = 256;

size_t latent_smem_bytes(int32_t W, int32_t L) {
  return sizeof(float) * (static_cast<size_t>(kGroup) * W + static_cast<size_t>(kKeys) * W + kGroup * kKeys +
                          static_cast<size_t>(kGroup) * L + 3 * kGroup);
}

__global__ void __launch_bounds__(kThreads) latent_attention_kernel(LatentAttentionArgs a) {
  extern __shared__ float smem[];
  __shared__ size_t offsets[kKeys];  // the chunk's rows' byte offsets
  const int L = a.kv_lora_rank, R = a.rope_dim, W = L + R;
  float* qs = smem;
  float* rows = qs + kGroup * W;
  float* sc = rows + kKeys * W;
  float* acc = sc + kGroup * kKeys;
  float* m = acc + kGroup * L;
  float* l = m + kGroup;
  float* corr = l + kGroup;
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * kGroup;
  const int G = min(kGroup, a.n_head - h0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;

  for (int idx = threadIdx.x; idx < kGroup * W; idx += blockDim.x) {
    const int g = idx / W, i = idx % W;
    float v = 0.0f;
    if (g < G) {
      const int h = h0 + g;
      v = i < L ? a.q_latent[t * a.q_latent_stride + int64_t{h} * L + i]
                : a.q_rope[t * a.q_rope_stride + int64_t{h} * a.q_rope_step + (i - L)];
    }
    qs[idx] = v;
  }
  for (int idx = threadIdx.x; idx < kGroup * L; idx += blockDim.x) acc[idx] = 0.0f;
  if (threadIdx.x < kGroup) {
    m[threadIdx.x] = -INFINITY;
    l[threadIdx.x] = 0.0f;
  }
  const int32_t* sel = a.selected ? a.selected + t * a.selected_stride : nullptr;
  const int32_t n_kv = sel ? a.n_selected[t] : a.pos[t] + 1;
  const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
  __syncthreads();

  for (int32_t j0 = 0; j0 < n_kv; j0 += kKeys) {
    const int nk = min(kKeys, n_kv - j0);
    // The chunk's row offsets once (the selection and block table reads),
    // then the rows a warp each, lanes over the row: independent loads, so
    // a thread has several in flight instead of one dependent pair each.
    if (static_cast<int>(threadIdx.x) < nk) {
      const int32_t key = sel ? sel[j0 + threadIdx.x] : j0 + static_cast<int32_t>(threadIdx.x);
      offsets[threadIdx.x] = detail::latent_key_offset(a.cache, table, key);
    }
    __syncthreads();
    for (int j = warp; j < nk; j += n_warps) {
      const size_t at = offsets[j];
#pragma unroll 8
      for (int i = lane; i < W; i += 32) rows[j * W + i] = detail::latent_read(a.cache, at, i);
    }
    __syncthreads();
    for (int pair = warp; pair < kGroup * kKeys; pair += n_warps) {
      const int g = pair / kKeys, j = pair % kKeys;
      if (j >= nk) continue;
      float dot = 0.0f;
      for (int i = lane; i < W; i += 32) dot += qs[g * W + i] * rows[j * W + i];
      dot = warp_sum(dot);
      if (lane == 0) sc[g * kKeys + j] = dot * a.scale;
    }
    __syncthreads();
    for (int g = warp; g < kGroup; g += n_warps) {
      const float s = lane < nk ? sc[g * kKeys + lane] : -INFINITY;
      const float m_old = m[g], m_new = fmaxf(m_old, warp_max(s));
      const float e = lane < nk ? expf(s - m_new) : 0.0f;
      if (lane < nk) sc[g * kKeys + lane] = e;
      const float total = warp_sum(e);
      if (lane == 0) {
        const float c = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        corr[g] = c;
        l[g] = l[g] * c + total;
        m[g] = m_new;
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kGroup * L; idx += blockDim.x) {
      const int g = idx / L, i = idx % L;
      float v = acc[idx] * corr[g];
      for (int j = 0; j < nk; ++j) v += sc[g * kKeys + j] * rows[j * W + i];
      acc[idx] = v;
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < G * L; idx += blockDim.x) {
    const int g = idx / L, i = idx % L;
    a.out[t * a.out_stride + int64_t{h0 + g} * L + i] = acc[idx] / l[g];
  }
}

}  // namespace

void matmul_heads(const HeadsMatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  static_assert(kRows * kTokens == 256 && kTokens * kChunk == 256);
  const dim3 grid(static_cast<unsigned>((a.R + kRows - 1) / kRows),
                  static_cast<unsigned>((a.n_tokens + kTokens - 1) / kTokens), static_cast<unsigned>(a.n_heads));
  RILL_CUDA_DISPATCH_FLOAT(a.w_dtype, matmul_heads_kernel<T><<<grid, 256, 0, stream>>>(a));
  RILL_CUDA_CHECK_LAUNCH();
}

void rope_store_latent(const LatentStoreArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  assert(a.cache.dtype == DType::kF32 || a.cache.dtype == DType::kF16);
  const size_t smem = sizeof(float) * static_cast<size_t>(a.kv_lora_rank + a.rope_dim);
  rope_store_latent_kernel<<<static_cast<unsigned>(a.n_tokens), 128, smem, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void latent_attention(const LatentAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  assert(a.kv_lora_rank + a.rope_dim <= kLatentMaxRow);
  assert(a.cache.dtype == DType::kF32 || a.cache.dtype == DType::kF16);
  const size_t smem = latent_smem_bytes(a.kv_lora_rank + a.rope_dim, a.kv_lora_rank);
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(latent_attention_kernel),
                latent_smem_bytes(kLatentMaxRow, kLatentMaxRow));
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>((a.n_head + kGroup - 1) / kGroup));
  latent_attention_kernel<<<grid, kThreads, smem, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
