// Elementwise and per-row kernels: embedding gather, RMSNorm, SwiGLU, bias,
// conversion, and RoPE fused with the paged K/V store.
#include <algorithm>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_kv.h"

namespace rill::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::from_f32;
using detail::to_f32;
using detail::warp_sum;

template <typename T>
__global__ void embed_kernel(const T* table, int64_t n_cols, const int32_t* ids, float* out) {
  const int64_t i = blockIdx.x;
  const T* row = table + static_cast<int64_t>(ids[i]) * n_cols;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) out[i * n_cols + c] = to_f32(row[c]);
}

// Four values to o[0..3] in one store (o 4 * sizeof(Out)-byte aligned),
// each converted as from_f32 does.
template <typename Out>
__device__ __forceinline__ void store4(Out* o, float a, float b, float c, float d) {
  if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float4*>(o) = make_float4(a, b, c, d);
  } else {
    Out e[4] = {from_f32<Out>(a), from_f32<Out>(b), from_f32<Out>(c), from_f32<Out>(d)};
    *reinterpret_cast<uint2*>(o) = *reinterpret_cast<const uint2*>(e);
  }
}

// One block per row. Squares summed in f32 (the CPU sums in double: the
// difference is far below the tests' tolerance); scale = 1 / sqrtf(mean + eps).
// Rows whose length is a multiple of 4 are read as float4.
template <typename Out>
__global__ void rms_norm_kernel(const float* x, int64_t x_stride, const int32_t* row_ids, const float* w, int64_t dim,
                                float eps, float w_offset, Out* out) {
  __shared__ float red[32];
  const bool vec = (dim & 3) == 0 && (x_stride & 3) == 0;
  const int64_t r = blockIdx.x;
  const int64_t row = row_ids ? row_ids[r] : r;  // step metadata: read before the wait
  detail::pdl_wait();
  detail::pdl_trigger();
  const float* xr = x + row * x_stride;
  Out* o = out + r * dim;
  float ss = 0.0f;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = block_sum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < dim / 4; i += blockDim.x) {
      const float4 v = x4[i];
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float y = e[k] * scale;
        o[4 * i + k] = from_f32<Out>(w ? y * (w_offset + w[4 * i + k]) : y);
      }
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * scale;
    o[i] = from_f32<Out>(w ? v * (w_offset + w[i]) : v);
  }
}

// rms_norm_kernel's arithmetic for rows of at most one float4 per thread
// (dim a multiple of 4, dim / 4 <= blockDim.x; the same threads per row, so
// the same sums): kRows rows a block, all read into registers before the
// first row's sum (the next rows' loads in flight while it reduces), each
// read once and written 4 elements a store (out 4 * sizeof(Out)-byte
// aligned). The weights (never written) and the row ids (step metadata)
// are read before waiting for x.
template <typename Out, int kRows>
__global__ void rms_norm_held_kernel(const float* x, int64_t x_stride, const int32_t* row_ids, const float* w,
                                     int64_t n_rows, int64_t dim, float eps, float w_offset, Out* out, uint8_t* xq,
                                     float* xs) {
  __shared__ float red[32];
  const bool mine = threadIdx.x < dim / 4;
  float4 wv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (w && mine) wv = reinterpret_cast<const float4*>(w)[threadIdx.x];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  int64_t rows[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) rows[k] = r0 + k < n_rows ? (row_ids ? row_ids[r0 + k] : r0 + k) : -1;
  detail::pdl_wait();
  detail::pdl_trigger();
  float4 v[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (mine && rows[k] >= 0) v[k] = reinterpret_cast<const float4*>(x + rows[k] * x_stride)[threadIdx.x];
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    if (rows[k] < 0) return;  // the same for every thread
    float ss = 0.0f;
    if (mine) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (mine) {
      const float y[4] = {v[k].x * scale, v[k].y * scale, v[k].z * scale, v[k].w * scale};
      for (int i = 0; i < 4; ++i) e[i] = y[i];
      if (w) {
        e[0] = y[0] * (w_offset + wv.x);
        e[1] = y[1] * (w_offset + wv.y);
        e[2] = y[2] * (w_offset + wv.z);
        e[3] = y[3] * (w_offset + wv.w);
      }
      store4(out + (r0 + k) * dim + 4 * static_cast<int64_t>(threadIdx.x), e[0], e[1], e[2], e[3]);
    }
    if (!xq) continue;
    // The row's FP8 form from its stored values, as quantize_fp8_tokens
    // makes it from out (fp8.h): the same max, scale and rounding.
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      e[i] = to_f32(from_f32<Out>(e[i]));
      m = fmaxf(m, fabsf(e[i]));
    }
    m = block_max(m, red);
    const float qs = m > 0.0f ? m / kE4m3Max : 1.0f;
    if (threadIdx.x == 0) xs[r0 + k] = qs;
    if (!mine) continue;
    uint8_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = __nv_cvt_float_to_fp8(e[i] / qs, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint32_t*>(xq + (r0 + k) * dim + 4 * static_cast<int64_t>(threadIdx.x)) =
        *reinterpret_cast<const uint32_t*>(q);
  }
}

__device__ __forceinline__ float silu_times(float x, float u) {
  return x / (1.0f + expf(-x)) * u;
}

template <typename Out>
__global__ void silu_mul_kernel(const float* gate_up, int64_t n_ff, Out* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const float* g = gate_up + r * 2 * n_ff;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n_ff; i += gridDim.x * blockDim.x) {
    out[r * n_ff + i] = from_f32<Out>(silu_times(g[i], g[n_ff + i]));
  }
}

// The same per element, 4 at a time (n_ff a multiple of 4, gate_up and out
// 16- and 4 * sizeof(Out)-byte aligned): one float4 load of the gate and one
// of the up half per thread, one store of the 4 results.
template <typename Out>
__global__ void silu_mul4_kernel(const float* gate_up, int64_t n_ff, Out* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const float4* g = reinterpret_cast<const float4*>(gate_up + r * 2 * n_ff);
  const int64_t n4 = n_ff / 4;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    const float4 x = g[i], u = g[n4 + i];
    store4(out + r * n_ff + 4 * i, silu_times(x.x, u.x), silu_times(x.y, u.y), silu_times(x.z, u.z),
           silu_times(x.w, u.w));
  }
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t n_cols, int64_t n) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += b[i % n_cols];
  }
}

template <typename Out>
__global__ void convert_kernel(const float* x, int64_t n, Out* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = from_f32<Out>(x[i]);
  }
}

// cos and sin (times attn_factor) of pair i at position p.
__device__ __forceinline__ void rope_angle(const RopeKvArgs& a, int32_t p, int i, float* cs, float* sn) {
  const float pos = static_cast<float>(p);
  float theta;
  if (a.ggml_theta_scale > 0.0f) {  // llama.cpp's f32 recurrence theta_{i+1} = theta_i * scale
    theta = pos;
    for (int k = 0; k < i; ++k) theta *= a.ggml_theta_scale;
    if (a.freq_divisor) theta = theta / a.freq_divisor[i];
  } else {
    theta = pos * a.inv_freq[i];
  }
  *cs = cosf(theta) * a.attn_factor;
  *sn = sinf(theta) * a.attn_factor;
}

// K/V heads one block of the rope kernel stores together: a head, or as
// many as share one block of the KV type (head_dim 16 in q8_0's blocks of
// 32: two; the block's scale needs all of its elements).
template <typename KvT>
__host__ __device__ __forceinline__ int kv_heads_per_block(int head_dim) {
  return KvT::kBlock > head_dim ? KvT::kBlock / head_dim : 1;
}

// One block per (token, q head) and per (token, group of n_sub K or V
// heads, kv_heads_per_block): y (blockIdx.y reversed) q heads [0, n_head),
// then the K groups, then the V groups. The heads are staged in shared memory.
template <typename KvT>
__global__ void rope_kv_kernel(RopeKvArgs a) {
  extern __shared__ __align__(16) float h[];  // [n_sub * head_dim], then the rotated encoder's scratch
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int hd = a.head_dim;
  const int n_sub_kv = kv_heads_per_block<KvT>(hd), n_groups = a.n_head_kv / n_sub_kv;
  // The grid's y runs backwards: V's groups (the rotated types' long
  // encoder) are dispatched first, so the short q and K blocks fill in
  // around them instead of leaving them a last wave of their own.
  const int y = static_cast<int>(gridDim.y - 1 - blockIdx.y);
  const bool is_q = y < a.n_head, is_k = !is_q && y < a.n_head + n_groups;
  const int n_sub = is_q ? 1 : n_sub_kv;
  // The first head of this block, counting q, then k, then v heads.
  const int head = is_q   ? y
                   : is_k ? a.n_head + (y - a.n_head) * n_sub
                          : a.n_head + a.n_head_kv + (y - a.n_head - n_groups) * n_sub;
  const int n_pairs = a.rot_dim / 2;
  // The angle of this thread's pair, when every thread has at most one:
  // computed after the wait, since positions can come from the kernel
  // before (Gemma 4's assistant layers shift them on the device,
  // shift_positions).
  const bool pre = (is_q || is_k) && n_sub * n_pairs <= static_cast<int>(blockDim.x);
  float pre_cs = 0.0f, pre_sn = 0.0f;
  detail::pdl_wait();
  detail::pdl_trigger();
  if (pre && static_cast<int>(threadIdx.x) < n_sub * n_pairs) {
    rope_angle(a, a.positions[t], threadIdx.x % n_pairs, &pre_cs, &pre_sn);
  }
  const int width = n_sub * hd;
  float* src = a.qkv + t * a.qkv_stride + static_cast<int64_t>(head) * hd;
  for (int d = threadIdx.x; d < width; d += blockDim.x) h[d] = src[d];
  const float* norm_w = is_q ? a.q_norm : is_k ? a.k_norm : nullptr;
  if (norm_w) {  // per-head RMSNorm (qwen3, gemma3), as cpu::rms_norm over head_dim
    for (int sub = 0; sub < n_sub; ++sub) {
      float* hs = h + sub * hd;
      __syncthreads();
      float ss = 0.0f;
      for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += hs[d] * hs[d];
      ss = block_sum(ss, red);
      const float scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.norm_eps);
      for (int d = threadIdx.x; d < hd; d += blockDim.x) hs[d] = (hs[d] * scale) * (a.norm_offset + norm_w[d]);
    }
  }
  __syncthreads();
  if (is_q || is_k) {
    for (int i = threadIdx.x; i < n_sub * n_pairs; i += blockDim.x) {
      float cs = pre_cs, sn = pre_sn;
      const int sub = i / n_pairs, pair = i % n_pairs;
      if (!pre) rope_angle(a, a.positions[t], pair, &cs, &sn);
      float* hs = h + sub * hd;
      const int i0 = a.interleaved ? 2 * pair : pair, i1 = a.interleaved ? 2 * pair + 1 : pair + n_pairs;
      const float x0 = hs[i0], x1 = hs[i1];
      hs[i0] = x0 * cs - x1 * sn;
      hs[i1] = x0 * sn + x1 * cs;
    }
    __syncthreads();
  }
  if (is_q) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) src[d] = h[d];
    return;
  }
  const int kv_head = is_k ? head - a.n_head : head - a.n_head - a.n_head_kv;
  const int64_t row_elems = static_cast<int64_t>(a.n_head_kv) * hd;
  auto* row = static_cast<uint8_t*>(is_k ? a.k_cache : a.v_cache) + KvT::row_bytes(a.slots[t] * row_elems);
  if constexpr (detail::kv_rotated_only<KvT>) {
    if (a.k_rows) {  // k4c: the q8_0 tail rows (RopeKvArgs::k_rows)
      const int64_t tail_row = detail::KvQ8_0::row_bytes(row_elems);
      const int64_t e0 = static_cast<int64_t>(kv_head) * hd;
      if (is_k) {
        detail::KvQ8_0::store(h, static_cast<uint8_t*>(a.k_rows) + t * tail_row, e0, width);
        return;
      }
      detail::hadamard_rotate_heads(h, width, hd);
      detail::KvQ8_0::store(h, static_cast<uint8_t*>(a.v_rows) + t * tail_row, e0, width);
      KvT::store_rotated(h, row, e0, width);  // reads h as the q8_0 store does: no barrier between
      return;
    }
  }
  if constexpr (detail::kv_rotatable<KvT>) {
    // q8_0h / q4_0h / iq4_nlh / q8_0h64 / iq4_nlh64: each head rotated,
    // then the rotated encoder (IQ4_NL, Q8_0_64 and IQ4_NL64 always:
    // rope_store_kv refuses them unrotated)
    if (detail::kv_rotated_only<KvT> || (is_k ? a.k_rotated : a.v_rotated)) {
      detail::hadamard_rotate_heads(h, width, hd);
      KvT::store_rotated(h, row, static_cast<int64_t>(kv_head) * hd, width);
      return;
    }
  }
  if constexpr (!detail::kv_rotated_only<KvT>) KvT::store(h, row, static_cast<int64_t>(kv_head) * hd, width);
}

// Element types (kBlock 1: F32, F16, BF16, F8_E4M3): element e of a row
// from x, the bytes KvT::store writes for it.
__device__ __forceinline__ void store_kv_element(detail::KvF32, uint8_t* row, int64_t e, float x) {
  reinterpret_cast<float*>(row)[e] = x;
}
__device__ __forceinline__ void store_kv_element(detail::KvF16, uint8_t* row, int64_t e, float x) {
  reinterpret_cast<__half*>(row)[e] = __float2half_rn(x);
}
__device__ __forceinline__ void store_kv_element(detail::KvBf16, uint8_t* row, int64_t e, float x) {
  reinterpret_cast<uint16_t*>(row)[e] = detail::KvBf16::encode(x);
}
__device__ __forceinline__ void store_kv_element(detail::KvFp8, uint8_t* row, int64_t e, float x) {
  row[e] = detail::KvFp8::encode(x);
}
template <typename KvT>
inline constexpr bool kv_element_type = KvT::kBlock == 1 && !detail::kv_rotatable<KvT>;

// rope_kv_kernel's results for the element types, a warp per head: block
// (t, y) takes heads [y kRopeBlockHeads, (y + 1) kRopeBlockHeads) of token
// t, counting q, then k, then v heads, kRopeHeads a warp. The heads come
// into shared memory by cp.async while the block's threads compute the
// token's angles once (rope_kv_kernel computed them once per head and
// waited for them before its loads); then each warp works on its own heads
// and syncs only itself. The arithmetic is rope_kv_kernel's, element by
// element, and the q/k norm's sum of squares is that kernel's tree: its
// thread i (of 32, or 64 at head_dim >= 128) summed elements i, i + 64,
// ... in order, then warp sums, then their sum; here lane l does threads
// l and l + 32, so the bits are the same (tests/cuda/cuda_ops_test.cpp
// holds the two kernels to each other bit for bit).
constexpr int kRopeWarps = 8, kRopeHeads = 2;  // heads per warp
constexpr int kRopeBlockHeads = kRopeWarps * kRopeHeads;
// Six blocks an SM: 40 registers a thread (none spilled; eight spill).
template <typename KvT>
__global__ void __launch_bounds__(kRopeWarps * 32, 6) rope_kv_warp_kernel(RopeKvArgs a) {
  // cos [n_pairs], sin [n_pairs], pad to 4, heads [kRopeBlockHeads][head_dim]
  extern __shared__ __align__(16) float sm[];
  const int64_t t = blockIdx.x;
  const int hd = a.head_dim, n_pairs = a.rot_dim / 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_heads = a.n_head + 2 * a.n_head_kv, first = blockIdx.y * kRopeBlockHeads;
  float* cs = sm;
  float* sn = sm + n_pairs;
  float* heads = sm + (2 * n_pairs + 3) / 4 * 4;
  const bool angles = first < a.n_head + a.n_head_kv;  // the block holds a q or k head
  detail::pdl_wait();
  detail::pdl_trigger();
  // After the wait: positions can come from the kernel before (Gemma 4's
  // assistant layers shift them on the device, shift_positions).
  const int32_t p = angles ? a.positions[t] : 0;
  // This warp's heads first + u kRopeWarps + warp (u < kRopeHeads) into
  // shared memory, by cp.async where 16-byte pieces allow it: the angles
  // are computed while the copies are in flight.
  const bool vec = (hd & 3) == 0 && (a.qkv_stride & 3) == 0 && (reinterpret_cast<uintptr_t>(a.qkv) & 15) == 0;
#pragma unroll
  for (int u = 0; u < kRopeHeads; ++u) {
    const int head = first + u * kRopeWarps + warp;
    if (head >= n_heads) break;
    const float* src = a.qkv + t * a.qkv_stride + static_cast<int64_t>(head) * hd;
    float* h = heads + (u * kRopeWarps + warp) * hd;
    if (vec) {
      for (int i = lane; i < hd / 4; i += 32) detail::cp_async16(detail::smem_addr(h + 4 * i), src + 4 * i, true);
    } else {
      for (int d = lane; d < hd; d += 32) h[d] = src[d];
    }
  }
  detail::cp_async_commit();
  if (angles) {
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) rope_angle(a, p, i, &cs[i], &sn[i]);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
#pragma unroll 1
  for (int u = 0; u < kRopeHeads; ++u) {
    const int head = first + u * kRopeWarps + warp;
    if (head >= n_heads) return;
    float* h = heads + (u * kRopeWarps + warp) * hd;
    const bool is_q = head < a.n_head, is_k = !is_q && head < a.n_head + a.n_head_kv;
    const float* norm_w = is_q ? a.q_norm : is_k ? a.k_norm : nullptr;
    if (norm_w) {
      const int n_threads = hd >= 128 ? 64 : 32;  // rope_kv_kernel's block at this head_dim
      float ss_lo = 0.0f, ss_hi = 0.0f;           // its threads lane and lane + 32
      for (int d = lane; d < hd; d += n_threads) ss_lo += h[d] * h[d];
      if (n_threads == 64) {
        for (int d = lane + 32; d < hd; d += n_threads) ss_hi += h[d] * h[d];
      }
      float ss = warp_sum(ss_lo);
      if (n_threads == 64) ss = ss + warp_sum(ss_hi);
      const float scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.norm_eps);
      __syncwarp();
      for (int d = lane; d < hd; d += 32) h[d] = (h[d] * scale) * (a.norm_offset + norm_w[d]);
      __syncwarp();
    }
    if (is_q || is_k) {
      for (int i = lane; i < n_pairs; i += 32) {
        const int i0 = a.interleaved ? 2 * i : i, i1 = a.interleaved ? 2 * i + 1 : i + n_pairs;
        const float x0 = h[i0], x1 = h[i1];
        h[i0] = x0 * cs[i] - x1 * sn[i];
        h[i1] = x0 * sn[i] + x1 * cs[i];
      }
      __syncwarp();
    }
    if (is_q) {
      float* dst = a.qkv + t * a.qkv_stride + static_cast<int64_t>(head) * hd;
      if (vec) {
        for (int i = lane; i < hd / 4; i += 32) {
          reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(h)[i];
        }
      } else {
        for (int d = lane; d < hd; d += 32) dst[d] = h[d];
      }
      continue;
    }
    const int kv_head = is_k ? head - a.n_head : head - a.n_head - a.n_head_kv;
    const int64_t row_elems = static_cast<int64_t>(a.n_head_kv) * hd;
    auto* row = static_cast<uint8_t*>(is_k ? a.k_cache : a.v_cache) + KvT::row_bytes(a.slots[t] * row_elems);
    const int64_t e0 = static_cast<int64_t>(kv_head) * hd;
    for (int d = lane; d < hd; d += 32) store_kv_element(KvT{}, row, e0 + d, h[d]);
  }
}

__global__ void argmax_kernel(const float* logits, int64_t n_cols, int32_t* ids) {
  __shared__ float best_v[32];
  __shared__ int64_t best_i[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const float* row = logits + blockIdx.x * n_cols;
  float v = -INFINITY;
  int64_t idx = n_cols;
  // Each thread visits its elements in increasing index order and keeps the
  // first maximum (strictly greater). Rows of whole float4s are read four
  // float4 loads at a time: one load in flight per thread left a 128k-wide
  // row latency-bound.
  int64_t c = threadIdx.x;
  if ((n_cols & 3) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = n_cols / 4, step = blockDim.x;
    int64_t i = threadIdx.x;
    for (; i + 3 * step < n4; i += 4 * step) {
      float4 q[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) q[u] = row4[i + u * step];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float e[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (e[k] > v) {
            v = e[k];
            idx = 4 * (i + u * step) + k;
          }
        }
      }
    }
    for (; i < n4; i += step) {
      const float4 q = row4[i];
      const float e[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (e[k] > v) {
          v = e[k];
          idx = 4 * i + k;
        }
      }
    }
    c = n_cols;  // done
  }
  for (; c < n_cols; c += blockDim.x) {
    if (row[c] > v) {  // strictly greater: the first index of a maximum within the thread
      v = row[c];
      idx = c;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x >> 5;
    v = lane < n_warps ? best_v[lane] : -INFINITY;
    idx = lane < n_warps ? best_i[lane] : n_cols;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > v || (ov == v && oi < idx)) {
        v = ov;
        idx = oi;
      }
    }
    if (lane == 0) ids[blockIdx.x] = static_cast<int32_t>(idx < n_cols ? idx : 0);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// rope_kv_warp_kernel for the element types (false: KvT is a block type).
template <typename KvT>
bool launch_rope_kv_warp(const RopeKvArgs& a, cudaStream_t stream) {
  if constexpr (kv_element_type<KvT>) {
    assert(a.rot_dim <= a.head_dim && a.rot_dim % 2 == 0 && !a.k_rotated && !a.v_rotated);
    const int n_heads = a.n_head + 2 * a.n_head_kv;
    const dim3 grid(static_cast<unsigned>(a.n_tokens),
                    static_cast<unsigned>((n_heads + kRopeBlockHeads - 1) / kRopeBlockHeads));
    const size_t smem = static_cast<size_t>((a.rot_dim + 3) / 4 * 4 + kRopeBlockHeads * a.head_dim) * sizeof(float);
    launch_pdl(rope_kv_warp_kernel<KvT>, grid, kRopeWarps * 32, smem, stream, a);
    return true;
  } else {
    return false;
  }
}

}  // namespace

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
    return count > 0 ? count : 1;
  }();
  return n;
}

void embed_rows(DType table_dtype, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out,
                cudaStream_t stream) {
  if (n_ids <= 0) return;
  RILL_CUDA_DISPATCH_FLOAT(table_dtype, embed_kernel<T><<<static_cast<unsigned>(n_ids), 256, 0, stream>>>(
                                            static_cast<const T*>(table), n_cols, ids, out));
  RILL_CUDA_CHECK_LAUNCH();
}

namespace {

// Whether rms_norm takes the held kernel (a row in registers, a float4 a
// thread) for this shape, and its block size.
int norm_threads(int64_t dim) {
  return dim >= 4096 ? 1024 : dim >= 1024 ? 256 : 64;
}
bool norm_held(const float* x, int64_t stride, int64_t dim, DType out_dtype, const void* out) {
  return dim % 4 == 0 && stride % 4 == 0 && dim / 4 <= norm_threads(dim) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % (4 * dtype_info(out_dtype).block_bytes) == 0;
}

void launch_norm_held(const float* x, int64_t stride, const int32_t* row_ids, const float* w, int64_t n_rows,
                      int64_t dim, float eps, float w_offset, DType out_dtype, void* out, uint8_t* xq, float* xs,
                      cudaStream_t stream) {
  const int threads = norm_threads(dim);
  if (n_rows >= 1024) {  // two rows a block where the grid still fills the GPU
    const auto grid = static_cast<unsigned>((n_rows + 1) / 2);
    RILL_CUDA_DISPATCH_FLOAT(
        out_dtype, launch_pdl(rms_norm_held_kernel<T, 2>, grid, threads, 0, stream, x, stride, row_ids, w, n_rows, dim,
                              eps, w_offset, static_cast<T*>(out), xq, xs));
  } else {
    RILL_CUDA_DISPATCH_FLOAT(
        out_dtype, launch_pdl(rms_norm_held_kernel<T, 1>, static_cast<unsigned>(n_rows), threads, 0, stream, x, stride,
                              row_ids, w, n_rows, dim, eps, w_offset, static_cast<T*>(out), xq, xs));
  }
}

}  // namespace

void rms_norm(const float* x, int64_t x_stride, const int32_t* row_ids, const float* w, int64_t n_rows, int64_t dim,
              float eps, float w_offset, DType out_dtype, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const int64_t stride = x_stride > 0 ? x_stride : dim;
  if (norm_held(x, stride, dim, out_dtype, out)) {
    launch_norm_held(x, stride, row_ids, w, n_rows, dim, eps, w_offset, out_dtype, out, nullptr, nullptr, stream);
  } else {
    RILL_CUDA_DISPATCH_FLOAT(
        out_dtype, launch_pdl(rms_norm_kernel<T>, static_cast<unsigned>(n_rows), norm_threads(dim), 0, stream, x,
                              stride, row_ids, w, dim, eps, w_offset, static_cast<T*>(out)));
  }
}

bool rms_norm_fp8_supported(const float* x, int64_t x_stride, int64_t dim, DType out_dtype, const void* out) {
  return norm_held(x, x_stride > 0 ? x_stride : dim, dim, out_dtype, out);
}

void rms_norm_fp8(const float* x, int64_t x_stride, const float* w, int64_t n_rows, int64_t dim, float eps,
                  float w_offset, DType out_dtype, void* out, uint8_t* xq, float* xs, cudaStream_t stream) {
  if (n_rows <= 0) return;
  assert(rms_norm_fp8_supported(x, x_stride, dim, out_dtype, out) && reinterpret_cast<uintptr_t>(xq) % 4 == 0);
  launch_norm_held(x, x_stride > 0 ? x_stride : dim, nullptr, w, n_rows, dim, eps, w_offset, out_dtype, out, xq, xs,
                   stream);
}

void silu_mul(const float* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  if (n_ff % 4 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % (4 * dtype_info(out_dtype).block_bytes) == 0) {
    const dim3 grid(static_cast<unsigned>(grid_for(n_ff / 4, 256)), static_cast<unsigned>(n_rows));
    RILL_CUDA_DISPATCH_FLOAT(
        out_dtype, launch_pdl(silu_mul4_kernel<T>, grid, 256, 0, stream, gate_up, n_ff, static_cast<T*>(out)));
    return;
  }
  const dim3 grid(static_cast<unsigned>(grid_for(n_ff, 256)), static_cast<unsigned>(n_rows));
  RILL_CUDA_DISPATCH_FLOAT(out_dtype,
                           launch_pdl(silu_mul_kernel<T>, grid, 256, 0, stream, gate_up, n_ff, static_cast<T*>(out)));
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n_cols, cudaStream_t stream) {
  const int64_t n = n_rows * n_cols;
  if (n <= 0) return;
  launch_pdl(add_bias_kernel, grid_for(n, 256), 256, 0, stream, y, b, n_cols, n);
}

void convert_f32(const float* x, int64_t n, DType dtype, void* out, cudaStream_t stream) {
  if (n <= 0) return;
  RILL_CUDA_DISPATCH_FLOAT(dtype, convert_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(x, n, static_cast<T*>(out)));
  RILL_CUDA_CHECK_LAUNCH();
}

void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int32_t* ids, cudaStream_t stream) {
  if (n_rows <= 0) return;
  // A plain launch: it follows a graph launch, not a kernel.
  argmax_kernel<<<static_cast<unsigned>(n_rows), 1024, 0, stream>>>(logits, n_cols, ids);
  RILL_CUDA_CHECK_LAUNCH();
}

void rope_store_kv_general(const RopeKvArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  assert(a.rot_dim <= a.head_dim && a.rot_dim % 2 == 0);
  // (k4c's K goes to k_rows in q8_0, whatever k_rotated says: only V's side is kv_dtype's.)
  assert(kv_supported(a.kv_dtype) && (a.k_rows || kv_rotation_supported(a.kv_dtype, a.head_dim, a.k_rotated)) &&
         kv_rotation_supported(a.kv_dtype, a.head_dim, a.v_rotated));
  assert(!a.k_rows || (a.v_rows && a.v_rotated && (a.n_head_kv * a.head_dim) % 32 == 0));
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, {
    const int n_sub = kv_heads_per_block<KvT>(a.head_dim);
    // A K or V group is whole blocks of the type: head_dim a multiple of
    // the block, or a divisor of it with the row whole groups.
    assert((a.head_dim * n_sub) % KvT::kBlock == 0 && a.n_head_kv % n_sub == 0);
    const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head + 2 * (a.n_head_kv / n_sub)));
    // Rotated types: a warp per 32 values (a block of 32; q8_0h64 and
    // iq4_nlh64: two warps a block of 64): each block's encoder is a serial search, so warps in
    // parallel are what shortens the store.
    const int width = a.head_dim * n_sub;
    // A rotated-only type always takes the rotated store (whatever the
    // flags say: q8_0h64's / iq4_nlh64's pairs of warps need at least 64 threads).
    const bool rotated = detail::kv_rotated_only<KvT> || a.k_rotated || a.v_rotated;
    // The blocks of 64 take at most 8 warps (a head of 512 in two rounds):
    // their scratch, 4.6 KB a warp, stays within the default 48 KB.
    const int threads = !rotated                                         ? (width >= 128 ? 64 : 32)
                        : KvT::kBlock == 64 && detail::kv_rotatable<KvT> ? std::min(width, 256)
                                                                         : std::min(width, 1024);
    // The rotated blocks' scratch, a warp's after the heads: blocks of 32
    // (fit_rotated_block) rotated_scratch, of 64 (the pairs) pair_scratch.
    size_t scratch = 0;
    if (rotated && detail::kv_rotatable<KvT>) {
      scratch = KvT::kBlock == 64 ? sizeof(detail::PairScratch) : sizeof(detail::RotatedScratch);
    }
    const size_t smem = static_cast<size_t>(width) * sizeof(float) + static_cast<size_t>(threads / 32) * scratch;
    launch_pdl(rope_kv_kernel<KvT>, grid, threads, smem, stream, a);
  });
}

void rope_store_kv(const RopeKvArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  bool done = false;
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, done = launch_rope_kv_warp<KvT>(a, stream));
  if (!done) rope_store_kv_general(a, stream);
}

}  // namespace rill::cuda
