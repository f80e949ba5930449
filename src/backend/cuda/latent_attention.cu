// Multi-head latent attention kernels (latent_attention.h): the per-head
// products, RoPE with the latent row's store, and the absorbed attention.
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>

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

// On the tensor cores (F16 / BF16 W, C a multiple of 64, x rows 16-byte
// aligned): a block computes 16 tokens x 32 rows of one head; its 4 warps
// split C's 64-column chunks into 4 contiguous ranges (the same split at
// every token count) and their partial sums meet in shared memory in warp
// order. Fragments come straight from global memory: lane (g, c) loads 16
// consecutive columns of x rows g and g + 8 and of its weight rows, and a
// chunk's 4 k16 steps share one permutation of k between A and B (step s
// takes each lane's columns 4s .. 4s + 3), as moe.cu's expert kernel does.
// x is split into two values of W's type, hi = round(x) and lo =
// round(x - hi), both through the same f32 accumulators (hi then lo): W hi
// + W lo is W x within ~2^-16 relative, with every product exact. A
// token's outputs depend on nothing but its own x.
constexpr int kHeadsRows = 32, kHeadsWarps = 4, kHeadsChunk = 64;

__device__ __forceinline__ void split_pair(float x0, float x1, const __nv_bfloat16*, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
__device__ __forceinline__ void split_pair(float x0, float x1, const __half*, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// 16 floats from p (16-byte aligned), or zeros.
__device__ __forceinline__ void load16(const float* p, bool valid, float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 u = valid ? __ldg(reinterpret_cast<const float4*>(p) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    v[4 * i] = u.x;
    v[4 * i + 1] = u.y;
    v[4 * i + 2] = u.z;
    v[4 * i + 3] = u.w;
  }
}

template <typename W>
__global__ void __launch_bounds__(kHeadsWarps * 32) matmul_heads_mma_kernel(HeadsMatmulArgs a) {
  constexpr int NT = kHeadsRows / 8;
  __shared__ float4 red[kHeadsWarps][NT][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int h = blockIdx.z;
  const int64_t t0 = int64_t{blockIdx.y} * 16, r0 = int64_t{blockIdx.x} * kHeadsRows;
  const W* w = static_cast<const W*>(a.w) + (h * a.R) * a.C;
  const float* x = a.x + int64_t{h} * a.x_step;
  const int64_t ta = t0 + g, tb = t0 + g + 8;
  const bool va = ta < a.n_tokens, vb = tb < a.n_tokens;
  const float* xa = x + (va ? ta : 0) * a.x_stride;
  const float* xb = x + (vb ? tb : 0) * a.x_stride;
  const W* wr[NT];
  bool vr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int64_t row = r0 + 8 * nt + g;
    vr[nt] = row < a.R;
    wr[nt] = w + (vr[nt] ? row : 0) * a.C;
  }
  const int64_t n_chunks = a.C / kHeadsChunk, per = (n_chunks + kHeadsWarps - 1) / kHeadsWarps;
  const int64_t k0 = min(n_chunks, warp * per), k1 = min(n_chunks, k0 + per);
  float acc[NT][4] = {};
  for (int64_t ch = k0; ch < k1; ++ch) {
    const int64_t col = ch * kHeadsChunk + 16 * c;
    float fa[16], fb[16];
    load16(xa + col, va, fa);
    load16(xb + col, vb, fb);
    uint4 wv[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4* p = reinterpret_cast<const uint4*>(wr[nt] + col);
      wv[nt][0] = vr[nt] ? __ldg(p) : make_uint4(0, 0, 0, 0);
      wv[nt][1] = vr[nt] ? __ldg(p + 1) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      uint32_t hi[4], lo[4];
      split_pair(fa[4 * st], fa[4 * st + 1], static_cast<const W*>(nullptr), hi[0], lo[0]);
      split_pair(fb[4 * st], fb[4 * st + 1], static_cast<const W*>(nullptr), hi[1], lo[1]);
      split_pair(fa[4 * st + 2], fa[4 * st + 3], static_cast<const W*>(nullptr), hi[2], lo[2]);
      split_pair(fb[4 * st + 2], fb[4 * st + 3], static_cast<const W*>(nullptr), hi[3], lo[3]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t* words = &wv[nt][st / 2].x;  // halves 4 st .. 4 st + 3 of the lane's 16
        const uint32_t b0 = words[2 * (st % 2)], b1 = words[2 * (st % 2) + 1];
        mma_m16n8k16<W>(acc[nt], hi[0], hi[1], hi[2], hi[3], b0, b1);
        mma_m16n8k16<W>(acc[nt], lo[0], lo[1], lo[2], lo[3], b0, b1);
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) red[warp][nt][lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  __syncthreads();
  // Warp nt sums n-tile nt over the warps, in warp order.
  const int nt = warp;
  float4 s4 = red[0][nt][lane];
  for (int k = 1; k < kHeadsWarps; ++k) {
    const float4 o = red[k][nt][lane];
    s4.x += o.x;
    s4.y += o.y;
    s4.z += o.z;
    s4.w += o.w;
  }
  const float v[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t r = r0 + 8 * nt + 2 * c + e % 2, tok = e < 2 ? ta : tb;
    if (r < a.R && (e < 2 ? va : vb)) a.y[tok * a.y_stride + int64_t{h} * a.y_step + r] = v[e];
  }
}

// RILL_MLA_MMA=0 in the environment: matmul_heads and latent_attention on
// their f32 CUDA-core kernels only (a before/after switch for benchmarks),
// read once.
bool mla_mma_off() {
  static const bool off = [] {
    const char* e = std::getenv("RILL_MLA_MMA");
    return e && e[0] == '0';
  }();
  return off;
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

// --- latent_attention on the tensor cores (F16 rows) ------------------------------

// A block serves one token and up to 16 heads (the rows of the m16n8k16
// tiles: every head of a token reads the same key rows); 4 warps; keys in
// chunks of 64. Per chunk: the rows staged in shared memory as f16 (the
// cache's values, columns past W zero), S = Q K^T on the tensor cores (q
// rounded to f16, f32 accumulation over the padded row, warp w the keys
// [16w, 16w + 16)), an f32 online softmax (scores times `scale`, rows
// split over the warps), the probabilities rounded to f16 (l sums the
// rounded values) and O += P C with C the rows' first L columns (warp w
// the output columns [w L/4, (w + 1) L/4), in registers). A token's
// outputs depend on nothing but its query and keys: batch invariant.
constexpr int kMmaHeads = 16, kMmaKeys = 64, kMmaThreads = 128;
constexpr int kLdS = kMmaKeys + 4;  // floats per score row
constexpr int kLdP = kMmaKeys + 8;  // halves per probability row

// Padded row width (halves): W rounded up to the k-step, then 8 more (rows
// 16-byte aligned for ldmatrix, and consecutive rows off each other's banks).
__host__ __device__ inline int mma_row_ld(int32_t W) {
  return ((W + 15) & ~15) + 8;
}

size_t latent_mma_smem_bytes(int32_t W) {
  const auto ld = static_cast<size_t>(mma_row_ld(W));
  return sizeof(__half) * (kMmaHeads + kMmaKeys) * ld + sizeof(float) * kMmaHeads * kLdS +
         sizeof(__half) * kMmaHeads * kLdP + sizeof(float) * 3 * kMmaHeads;
}

__device__ __forceinline__ uint32_t lds32(const __half* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}

// NT: the output's n8 tiles per warp (L = 32 NT).
template <int NT>
__global__ void __launch_bounds__(kMmaThreads) latent_attention_mma_kernel(LatentAttentionArgs a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ size_t offsets[kMmaKeys];
  const int L = a.kv_lora_rank, W = L + a.rope_dim, ld = mma_row_ld(W), Wp = ld - 8;
  __half* qs = reinterpret_cast<__half*>(smem_raw);
  __half* ks = qs + kMmaHeads * ld;
  float* sc = reinterpret_cast<float*>(ks + kMmaKeys * ld);
  __half* ps = reinterpret_cast<__half*>(sc + kMmaHeads * kLdS);
  float* m = reinterpret_cast<float*>(ps + kMmaHeads * kLdP);
  float* l = m + kMmaHeads;
  float* corr = l + kMmaHeads;
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * kMmaHeads;
  const int G = min(kMmaHeads, a.n_head - h0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;

  for (int idx = threadIdx.x; idx < kMmaHeads * Wp; idx += kMmaThreads) {
    const int r = idx / Wp, i = idx % Wp;
    float v = 0.0f;
    if (r < G && i < W) {
      const int h = h0 + r;
      v = i < L ? a.q_latent[t * a.q_latent_stride + int64_t{h} * L + i]
                : a.q_rope[t * a.q_rope_stride + int64_t{h} * a.q_rope_step + (i - L)];
    }
    qs[r * ld + i] = __float2half_rn(v);
  }
  if (threadIdx.x < kMmaHeads) {
    m[threadIdx.x] = -INFINITY;
    l[threadIdx.x] = 0.0f;
  }
  const int32_t* sel = a.selected ? a.selected + t * a.selected_stride : nullptr;
  const int32_t n_kv = sel ? a.n_selected[t] : a.pos[t] + 1;
  const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
  // Whole 16-byte groups of a plane (no group straddles the K and V planes).
  const bool vec = a.cache.plane % 8 == 0 && W % 8 == 0;
  float o[NT][4] = {};

  for (int32_t j0 = 0; j0 < n_kv; j0 += kMmaKeys) {
    const int nk = min(kMmaKeys, n_kv - j0);
    if (static_cast<int>(threadIdx.x) < nk) {
      const int32_t key = sel ? sel[j0 + threadIdx.x] : j0 + static_cast<int32_t>(threadIdx.x);
      offsets[threadIdx.x] = detail::latent_key_offset(a.cache, table, key);
    }
    __syncthreads();
    // The chunk's rows; rows past nk and columns past W are zeros (their
    // probabilities and q's columns are 0, and 0 * garbage could be NaN).
    if (vec) {
      // Every 16-byte piece of the chunk in flight at once (cp.async; a
      // piece past nk or W is zero-filled: source size 0).
      const int groups = Wp / 8;
      for (int idx = threadIdx.x; idx < kMmaKeys * groups; idx += kMmaThreads) {
        const int j = idx / groups, e = (idx % groups) * 8;
        const bool in = j < nk && e < W, in_k = e < a.cache.plane;
        const uint8_t* src = static_cast<const uint8_t*>(in_k ? a.cache.k : a.cache.v);
        if (in) src += offsets[j] + 2 * (in_k ? e : e - a.cache.plane);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(ks + j * ld + e)), "l"(src),
                     "r"(in ? 16 : 0)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    } else {
      for (int idx = threadIdx.x; idx < kMmaKeys * Wp; idx += kMmaThreads) {
        const int j = idx / Wp, i = idx % Wp;
        const float v = j < nk && i < W ? detail::latent_read(a.cache, offsets[j], i) : 0.0f;
        ks[j * ld + i] = __float2half_rn(v);
      }
    }
    __syncthreads();
    {
      float s[2][4] = {};
      for (int k0 = 0; k0 < Wp; k0 += 16) {
        const __half* qa = qs + g * ld + k0 + 2 * c;
        const uint32_t a0 = lds32(qa), a1 = lds32(qa + 8 * ld), a2 = lds32(qa + 8), a3 = lds32(qa + 8 * ld + 8);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const __half* kb = ks + (16 * warp + 8 * nt + g) * ld + k0 + 2 * c;
          mma_m16n8k16<__half>(s[nt], a0, a1, a2, a3, lds32(kb), lds32(kb + 8));
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = 16 * warp + 8 * nt + 2 * c;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = g + 8 * (e / 2), j = col + e % 2;
          sc[row * kLdS + j] = j < nk ? s[nt][e] * a.scale : -INFINITY;
        }
      }
    }
    __syncthreads();
    for (int r = warp * (kMmaHeads / 4); r < (warp + 1) * (kMmaHeads / 4); ++r) {
      const float x0 = sc[r * kLdS + lane], x1 = sc[r * kLdS + lane + 32];
      const float m_old = m[r], m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
      const __half p0 = __float2half_rn(lane < nk ? expf(x0 - m_new) : 0.0f);
      const __half p1 = __float2half_rn(lane + 32 < nk ? expf(x1 - m_new) : 0.0f);
      ps[r * kLdP + lane] = p0;
      ps[r * kLdP + lane + 32] = p1;
      const float total = warp_sum(__half2float(p0) + __half2float(p1));
      if (lane == 0) {
        const float cr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        corr[r] = cr;
        l[r] = l[r] * cr + total;
        m[r] = m_new;
      }
    }
    __syncthreads();
    {
      const float c0 = corr[g], c1 = corr[g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[nt][0] *= c0;
        o[nt][1] *= c0;
        o[nt][2] *= c1;
        o[nt][3] *= c1;
      }
      const int n_base = warp * 8 * NT;
      for (int kk = 0; kk < kMmaKeys; kk += 16) {
        const __half* pa = ps + g * kLdP + kk + 2 * c;
        const uint32_t a0 = lds32(pa), a1 = lds32(pa + 8 * kLdP), a2 = lds32(pa + 8), a3 = lds32(pa + 8 * kLdP + 8);
        // ldmatrix.trans: lane's row address, matrix lane / 8: keys kk +
        // (lane % 8) + 8 (matrix & 1), columns + 8 (matrix >> 1).
        const int key = kk + (lane % 8) + 8 * ((lane / 8) & 1), col = 8 * (lane / 16);
#pragma unroll
        for (int nt = 0; nt + 1 < NT; nt += 2) {
          uint32_t b[4];
          ldsm_x4_trans(b, ks + key * ld + n_base + 8 * nt + col);
          mma_m16n8k16<__half>(o[nt], a0, a1, a2, a3, b[0], b[1]);
          mma_m16n8k16<__half>(o[nt + 1], a0, a1, a2, a3, b[2], b[3]);
        }
        if constexpr (NT % 2 == 1) {
          uint32_t b[2];
          ldsm_x2_trans(b, ks + key * ld + n_base + 8 * (NT - 1));
          mma_m16n8k16<__half>(o[NT - 1], a0, a1, a2, a3, b[0], b[1]);
        }
      }
    }
    __syncthreads();
  }
  const float inv0 = 1.0f / l[g], inv1 = 1.0f / l[g + 8];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = warp * 8 * NT + 8 * nt + 2 * c;
    if (g < G) {
      float* y = a.out + t * a.out_stride + int64_t{h0 + g} * L + col;
      y[0] = o[nt][0] * inv0;
      y[1] = o[nt][1] * inv0;
    }
    if (g + 8 < G) {
      float* y = a.out + t * a.out_stride + int64_t{h0 + g + 8} * L + col;
      y[0] = o[nt][2] * inv1;
      y[1] = o[nt][3] * inv1;
    }
  }
}

template <int NT>
void launch_latent_mma(const LatentAttentionArgs& a, cudaStream_t stream) {
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(latent_attention_mma_kernel<NT>), latent_mma_smem_bytes(kLatentMaxRow));
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>((a.n_head + kMmaHeads - 1) / kMmaHeads));
  latent_attention_mma_kernel<NT><<<grid, kMmaThreads, latent_mma_smem_bytes(a.kv_lora_rank + a.rope_dim), stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool mla_tensor_cores_off() {
  return mla_mma_off();
}

void matmul_heads(const HeadsMatmulArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  static_assert(kRows * kTokens == 256 && kTokens * kChunk == 256);
  static_assert(kHeadsRows / 8 == kHeadsWarps, "one n-tile per warp in the reduction");
  const bool aligned = a.x_stride % 4 == 0 && a.x_step % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.w) % 16 == 0;  // W's rows are read as 16-byte vectors
  if ((a.w_dtype == DType::kBF16 || a.w_dtype == DType::kF16) && a.C % kHeadsChunk == 0 && aligned && !mla_mma_off()) {
    const dim3 grid(static_cast<unsigned>((a.R + kHeadsRows - 1) / kHeadsRows),
                    static_cast<unsigned>((a.n_tokens + 15) / 16), static_cast<unsigned>(a.n_heads));
    if (a.w_dtype == DType::kBF16) {
      matmul_heads_mma_kernel<__nv_bfloat16><<<grid, kHeadsWarps * 32, 0, stream>>>(a);
    } else {
      matmul_heads_mma_kernel<__half><<<grid, kHeadsWarps * 32, 0, stream>>>(a);
    }
    RILL_CUDA_CHECK_LAUNCH();
    return;
  }
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
  // F16 rows on the tensor cores where the latent width has a kernel
  // (L = 32 NT); F32 rows (the f32 checkpoints' exact path) and other
  // widths on the f32 kernel below.
  if (a.cache.dtype == DType::kF16 && !mla_mma_off()) {
    switch (a.kv_lora_rank) {
      case 32:
        return launch_latent_mma<1>(a, stream);
      case 64:
        return launch_latent_mma<2>(a, stream);
      case 128:
        return launch_latent_mma<4>(a, stream);
      case 256:
        return launch_latent_mma<8>(a, stream);
      case 512:
        return launch_latent_mma<16>(a, stream);
      default:
        break;
    }
  }
  const size_t smem = latent_smem_bytes(a.kv_lora_rank + a.rope_dim, a.kv_lora_rank);
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(latent_attention_kernel),
                latent_smem_bytes(kLatentMaxRow, kLatentMaxRow));
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>((a.n_head + kGroup - 1) / kGroup));
  latent_attention_kernel<<<grid, kThreads, smem, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
