// k4c / k4a prefill attention on the tensor cores (attention_chan.h
// chan_attention_flash): FlashAttention-2's loop on mma.sync m16n8k16, as
// attention_flash.cu runs it for the row KV types, over k4c's blocks.
//
// Grid (KV head, token): the block of token t works only when t starts a
// tile (its sequence's first token in the batch, or a position that is a
// multiple of TT); the tile is t and the sequence's next tokens up to the
// next multiple of TT, TT = min(32, the power of two <= 64 / G) for a
// group of G query heads a KV head. So a tile never crosses a KV block of
// 32 positions: its rows share the own block (the block read from q8_0
// rows), and the tiles depend on positions alone (batch invariance).
// Grid y runs the tokens backwards: the longest tiles (latest positions)
// start first. 4 warps, 64 rows: row i is token i / G of the tile and
// query head kvh * G + i % G, so every decoded KV tile serves the group's
// heads together; warp w holds rows [16 w, 16 w + 16) (rows past the tile's
// TT * G are idle).
//
// KV tiles of 64 keys at multiples of 64 positions (two KV blocks; the
// same tiles for a row whatever the tile it is in), each half decoded into
// one f16 K and V tile in shared memory by the whole block:
//  - a block before the own block, from the pool: K's q4c groups (z + d /
//    16 * code, or q4a's bit planes at each channel's width) and V's
//    iq4_nlh64 rows (e4m3 scale x level), the values the fast kernel
//    computes in f32, rounded to f16 once;
//  - the own block, from the q8_0 rows of the tail (before the step's
//    first position c0) and the step (from c0 on): d x code rounded to f16;
//  - keys outside the tile's range [k_lo, k_hi) (a window's start, past the
//    last row): zeros (nothing is read there: those rows of the own block
//    need not be written, and a window may have given those pool blocks
//    back).
// Then S = Q K^T (Q rounded to f16), the online softmax in f32 (base 2, the
// scale folded in, each row's own mask: keys [pos - window + 1, pos]),
// O += P V with P rounded to f16 (their f16 values summed into the
// denominator), as attention_flash.cu. So the outputs differ from the
// reference (chan_attention_parallel, f32 throughout) by f16 rounding,
// ~1e-3 of the output's scale; each row's arithmetic depends only on its
// own keys (a tile wholly outside a row's keys leaves its state as it was),
// so a token's outputs are the same bits in any batch.
//
// Out: f32 in V's rotated basis (a.out), or, with a.rotated_out, each head
// rotated back (detail::hadamard_rotate_warp: rotate_heads_back's bits) in
// a.rotated_dtype.
//
// Why a kernel of its own rather than token tiles in the fast kernel
// (attention_chan_fast.cu): its f32 dots over a decoded block run at f32
// FMA speed, ~1 ms a layer for a 2,048-token prefill of Llama-3.1-8B even
// at the peak, while f16 KV's flash kernel takes ~0.1 ms; here the block
// decode (about 128 values a thread per 64 keys) is what k4c adds.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/attention_chan.h"
#include "backend/cuda/attention_chan_split.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_rotated.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"

namespace rill::cuda {
namespace {

using detail::e4m3_to_float;
using detail::f16_value;
using detail::ldmatrix_x4;
using detail::mul_rn;
using detail::smem_addr;

constexpr int kT = kChanSplitTokens;  // a KV block
constexpr int kRows = 64, kKeys = 2 * kT, kWarps = 4, kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kRows == 64, "chan_flash_tile_tokens' rows");

template <int HD>
struct FlashCta {
  static constexpr int kLd = HD + 8;                  // halves a row: ldmatrix without bank conflicts
  static constexpr int kTileHalves = kKeys * kLd;     // one K or V tile
  static constexpr int kBytes = 2 * kTileHalves * 2;  // K then V; Q borrows K, the output borrows both
  static_assert(kRows * kLd <= kTileHalves, "Q fits K's tile");
  static_assert(kRows * HD * 4 <= kBytes, "the f32 outputs fit the tiles");
};

// The q8_0 row of key j of the own block: the tail's before c0, the step's after.
__device__ __forceinline__ const uint8_t* own_row(const ChanAttentionArgs& a, int seq, int64_t c0, size_t tail_row,
                                                  const uint8_t* tail, const uint8_t* step, int64_t j) {
  return j < c0 ? tail + static_cast<size_t>(j - (c0 - c0 % kT)) * tail_row
                : step + static_cast<size_t>(a.q_start[seq] + (j - c0)) * tail_row;
}

// Channel c's keys of a q4c group's 8 code bytes w for half `half` of the
// block into K's f16 tile: byte e gives key 8 half + e (low nibble) and
// 8 half + e + 16 (high), each z + d x code rounded to f16 once.
template <int HD>
__device__ __forceinline__ void put_q4c_keys(__half* ks, int c, int half, const uint32_t (&w)[2], float z, float d) {
  using C = FlashCta<HD>;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint32_t byte = (w[e / 4] >> (8 * (e % 4))) & 0xFFu;
    const int r = 8 * half + e;
    ks[r * C::kLd + c] = __float2half_rn(z + d * static_cast<float>(byte & 0xFu));
    ks[(r + 16) * C::kLd + c] = __float2half_rn(z + d * static_cast<float>(byte >> 4));
  }
}

// A pool block's q4c K and iq4_nlh64 V (ChanAttentionArgs::flash_batched_loads):
// decode_block's values, with each thread's items a compile-time count and
// its loads read-only global ones (ld.global.nc), which the compiler may
// issue ahead of the shared stores of the items before them (decode_block's
// loops run an item's load latency after another's: a generic pointer may
// alias shared memory) as far as its registers allow. K a (channel, half of
// the keys) an item, V 4 channels of a row.
template <int HD>
__device__ void decode_pool_batched(const ChanAttentionArgs& a, int64_t head, int64_t W, const uint8_t* blk,
                                    const uint8_t* vblk, __half* ks, __half* vs) {
  using C = FlashCta<HD>;
  const int tid = threadIdx.x;
  constexpr int kKItems = 2 * HD / kThreads, kVItems = kT * (HD / 4) / kThreads;
  static_assert(2 * HD % kThreads == 0 && kT * (HD / 4) % kThreads == 0, "whole items a thread");
#pragma unroll
  for (int u = 0; u < kKItems; ++u) {
    const int i = tid + u * kThreads, c = i % HD, half = i / HD;
    const auto* qs = reinterpret_cast<const uint32_t*>(blk + 3 * W + (head + c) * (kT / 2) + 8 * half);
    const uint32_t w[2] = {__ldg(qs), __ldg(qs + 1)};
    const float z = f16_value(__ldg(reinterpret_cast<const unsigned short*>(blk) + head + c));
    const float d = e4m3_to_float(__ldg(blk + 2 * W + head + c)) * 0.0625f;
    put_q4c_keys<HD>(ks, c, half, w, z, d);
  }
#pragma unroll
  for (int u = 0; u < kVItems; ++u) {
    const int i = tid + u * kThreads, r = i / (HD / 4), c = 4 * (i % (HD / 4));
    const uint8_t* vb =
        vblk + static_cast<size_t>(r) * a.v_row_bytes + (head + c) / 64 * detail::KvIq4Nl64::kBlockBytes;
    // Bytes [p, p + 4) at any address: KvIq4Nl64::code_bytes4's words, read-only.
    const uint8_t* p = vb + 1 + ((head + c) & 31);
    const auto at = reinterpret_cast<uintptr_t>(p);
    const auto* w = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
    const int o = static_cast<int>(at & 3);
    const uint32_t codes = detail::KvIq4Nl64::funnel(__ldg(w), o ? __ldg(w + 1) : 0u, 8 * o);
    float x[4];
    detail::KvIq4Nl::levels4(codes, ((head + c) & 63) >= 32 ? 4 : 0, mul_rn(e4m3_to_float(__ldg(vb)), 0.0625f), x);
    __half2* dst = reinterpret_cast<__half2*>(vs + r * C::kLd + c);
    dst[0] = __floats2half2_rn(x[0], x[1]);
    dst[1] = __floats2half2_rn(x[2], x[3]);
  }
}

// KV block b (keys [32 b, 32 b + 32)) into rows [0, 32) of the f16 K and V
// tiles ks / vs (kLd halves a row), by the whole block. own: the block
// holding the tile's positions (q8_0 rows); keys outside [k_lo, k_hi)
// zero. kBatched: a q4c pool block through decode_pool_batched.
template <int HD, bool kBatched>
__device__ void decode_block(const ChanAttentionArgs& a, int kvh, int seq, int64_t b, int64_t own, int64_t k_lo,
                             int64_t k_hi, int64_t c0, const int32_t* table, __half* ks, __half* vs) {
  using C = FlashCta<HD>;
  const int tid = threadIdx.x;
  const int64_t b0 = b * kT;
  const int64_t W = static_cast<int64_t>(a.n_head_kv) * HD, head = static_cast<int64_t>(kvh) * HD;
  const __half zero = __float2half_rn(0.0f);
  if (b0 + kT <= k_lo || b0 >= k_hi) {  // no key of the block is the tile's
    for (int i = tid; i < kT * HD; i += kThreads) {
      ks[(i / HD) * C::kLd + i % HD] = zero;
      vs[(i / HD) * C::kLd + i % HD] = zero;
    }
    return;
  }
  if (b < own) {  // the pool: every row encoded
    const uint8_t* blk = a.k_blocks + static_cast<size_t>(table[b]) * a.block_stride;
    if (kBatched && !a.k_widths) {
      const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
      decode_pool_batched<HD>(a, head, W, blk, a.v_blocks + static_cast<size_t>(table[b]) * v_stride, ks, vs);
      return;
    }
    const auto* zs = reinterpret_cast<const uint16_t*>(blk) + head;
    const uint8_t* ds = blk + 2 * W + head;
    // K: a (channel, half of the keys) an item; q4c's 8 code bytes give
    // keys 8 half + e (low nibbles) and 8 half + e + 16 (high).
    for (int i = tid; i < 2 * HD; i += kThreads) {
      const int c = i % HD, half = i / HD;
      const float z = f16_value(zs[c]), d = e4m3_to_float(ds[c]) * 0.0625f;
      if (!a.k_widths) {
        const auto* qs = reinterpret_cast<const uint32_t*>(blk + 3 * W + (head + c) * (kT / 2) + 8 * half);
        const uint32_t w[2] = {qs[0], qs[1]};  // 4-byte aligned: the pool's K regions are
        put_q4c_keys<HD>(ks, c, half, w, z, d);
      } else {  // q4a: channel ch's codes from its bit planes (keys 16 half + r)
        const int64_t ch = head + c;
        const int width = a.k_widths[ch];
        const uint8_t* p = blk + alloc_plane_offsets(a.k_widths, W)[ch];
        uint32_t code[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) code[r] = 0;
        for (int bit = 0; bit < width; ++bit) {
          const uint32_t plane = *reinterpret_cast<const uint32_t*>(p + 4 * bit) >> (16 * half);
#pragma unroll
          for (int r = 0; r < 16; ++r) code[r] |= ((plane >> r) & 1u) << bit;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r)
          ks[(16 * half + r) * C::kLd + c] = __float2half_rn(z + d * static_cast<float>(code[r]));
      }
    }
    // V: 4 channels of a row an item (iq4_nlh64: an e4m3 scale and 64
    // nibbles a block of 64 channels).
    const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
    const uint8_t* vblk = a.v_blocks + static_cast<size_t>(table[b]) * v_stride;
    for (int i = tid; i < kT * (HD / 4); i += kThreads) {
      const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
      const uint8_t* vb =
          vblk + static_cast<size_t>(r) * a.v_row_bytes + (head + c) / 64 * detail::KvIq4Nl64::kBlockBytes;
      float x[4];
      detail::KvIq4Nl::levels4(detail::KvIq4Nl64::code_bytes4(vb + 1 + ((head + c) & 31)),
                               ((head + c) & 63) >= 32 ? 4 : 0, mul_rn(e4m3_to_float(vb[0]), 0.0625f), x);
      __half2* dst = reinterpret_cast<__half2*>(vs + r * C::kLd + c);
      dst[0] = __floats2half2_rn(x[0], x[1]);
      dst[1] = __floats2half2_rn(x[2], x[3]);
    }
    return;
  }
  // The own block: a (side, row, 32 channels) an item, d x code (q8_0's
  // 34-byte blocks: 2-byte aligned).
  const size_t tail_row = static_cast<size_t>(W / 32 * 34);
  constexpr int kQ8 = HD / 32;
  for (int i = tid; i < 2 * kT * kQ8; i += kThreads) {
    const int side = i / (kT * kQ8), r = i / kQ8 % kT, q = i % kQ8;
    const int64_t j = b0 + r;
    __half* dst = (side == 0 ? ks : vs) + r * C::kLd + 32 * q;
    if (j < k_lo || j >= k_hi) {
#pragma unroll
      for (int e = 0; e < 32; ++e) dst[e] = zero;
      continue;
    }
    const uint8_t* row = side == 0 ? own_row(a, seq, c0, tail_row, a.tail_k[seq], a.step_k, j)
                                   : own_row(a, seq, c0, tail_row, a.tail_v[seq], a.step_v, j);
    const auto* h = reinterpret_cast<const uint16_t*>(row + (head / 32 + q) * 34);
    uint16_t w[17];
#pragma unroll
    for (int e = 0; e < 17; ++e) w[e] = h[e];
    const float d = f16_value(w[0]);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      reinterpret_cast<__half2*>(dst)[e] =
          __floats2half2_rn(mul_rn(d, static_cast<float>(static_cast<int8_t>(w[e + 1] & 0xFFu))),
                            mul_rn(d, static_cast<float>(static_cast<int8_t>(w[e + 1] >> 8))));
    }
  }
}

template <int HD, typename Out, bool kBatched>
__global__ void __launch_bounds__(kThreads, 3) chan_flash_kernel(ChanAttentionArgs a, int group, int tt) {
  using C = FlashCta<HD>;
  extern __shared__ __align__(128) uint8_t smem[];
  __half* ks = reinterpret_cast<__half*>(smem);
  __half* vs = ks + C::kTileHalves;
  const int kvh = blockIdx.x;
  const int t = a.n_tokens - 1 - static_cast<int>(blockIdx.y);
  const int seq = a.seq_of[t];
  const int32_t p0 = a.pos[t];
  const int n = chan_flash_tile_at(a.pos, a.seq_of, a.n_tokens, t, tt);
  if (n == 0) return;  // not a tile's first token
  const int n_rows = n * group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  int64_t k_lo = 0, k_hi = 0, unused = 0;
  chan_key_range(p0, a.window, &k_lo, &unused);
  chan_key_range(a.pos[t + n - 1], a.window, &unused, &k_hi);
  const int64_t own = (k_hi - 1) / kT;
  const int64_t c0 = a.c0[seq];
  const int32_t* table = a.block_tables + a.table_start[seq];

  // Q rounded to f16 into K's tile: row i = token i / group, head kvh *
  // group + i % group; rows past n_rows zero.
  for (int i = threadIdx.x; i < kRows * (HD / 4); i += kThreads) {
    const int r = i / (HD / 4), d = 4 * (i % (HD / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows) {
      const float* q = a.q + static_cast<int64_t>(t + r / group) * a.q_stride +
                       static_cast<int64_t>(kvh * group + r % group) * HD + d;
      v = make_float4(q[0], q[1], q[2], q[3]);
    }
    __half2* dst = reinterpret_cast<__half2*>(ks + r * C::kLd + d);
    dst[0] = __floats2half2_rn(v.x, v.y);
    dst[1] = __floats2half2_rn(v.z, v.w);
  }
  __syncthreads();
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = k * 16 + (lane >> 4) * 8;
    ldmatrix_x4(qf[k], smem_addr(ks + row * C::kLd + col));
  }

  // This lane's two rows (fragment rows lane / 4 and lane / 4 + 8): their
  // positions and first keys; the warp's key span.
  const bool warp_active = warp * 16 < n_rows;
  int32_t p_row[2], lo_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + (lane >> 2) + 8 * r;
    p_row[r] = row < n_rows ? a.pos[t + row / group] : -1;
    lo_row[r] = a.window > 0 ? max(0, p_row[r] - a.window + 1) : 0;
  }
  const int last_row = min(n_rows - 1, warp * 16 + 15);
  const int32_t warp_last = warp_active ? a.pos[t + last_row / group] : -1;
  const int32_t warp_lo = a.window > 0 && warp_active ? max(0, a.pos[t + warp * 16 / group] - a.window + 1) : 0;

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in log2 units; l this lane's part

  for (int64_t kc = k_lo / kKeys * kKeys; kc < k_hi; kc += kKeys) {
    __syncthreads();  // the previous tile (or Q) fully read
    decode_block<HD, kBatched>(a, kvh, seq, kc / kT, own, k_lo, k_hi, c0, table, ks, vs);
    decode_block<HD, kBatched>(a, kvh, seq, kc / kT + 1, own, k_lo, k_hi, c0, table, ks + kT * C::kLd,
                               vs + kT * C::kLd);
    __syncthreads();
    if (!warp_active || kc > warp_last || kc + kKeys <= warp_lo) continue;
    // S = Q K^T: 16 rows x 64 keys, 8 fragments of 8 keys.
    float s[kKeys / 8][4];
    detail::warp_qk<HD, kKeys>(s, qf, smem_addr(ks), C::kLd);
    // Scale, softcap, each row's mask; the rows' maxima over the 4 lanes of a row.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float x = s[i][e] * a.scale;
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        const int64_t j = kc + i * 8 + (lane & 3) * 2 + (e & 1);
        const bool ok = j <= p_row[r] && j >= lo_row[r];
        s[i][e] = ok ? x * kLog2e : -INFINITY;
        mx[r] = fmaxf(mx[r], s[i][e]);
      }
    }
    float base[2], corr[2];
    detail::warp_softmax_step(mx, m, l, base, corr);
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      o[i][0] *= corr[0];
      o[i][1] *= corr[0];
      o[i][2] *= corr[1];
      o[i][3] *= corr[1];
    }
    // O += P V, P from the score fragments.
    detail::warp_pv<HD, kKeys>(o, s, base, l, smem_addr(vs), C::kLd);
  }

  // Each row's sum over its 4 lanes, then the normalized f32 outputs.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  if (!a.rotated_out) {
    if (!warp_active) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + (lane >> 2) + 8 * r;
      if (row >= n_rows) continue;
      float* out = a.out + static_cast<int64_t>(t + row / group) * a.n_head * HD +
                   static_cast<int64_t>(kvh * group + row % group) * HD;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        const int d = i * 8 + (lane & 3) * 2;
        out[d] = o[i][2 * r] * inv[r];
        out[d + 1] = o[i][2 * r + 1] * inv[r];
      }
    }
    return;
  }
  // Rotated back: the warp's rows through shared memory (f32), then a warp
  // a row, lane l holding elements [l HD / 32, (l + 1) HD / 32).
  __syncthreads();  // every warp done with the K / V tiles
  float* rows = reinterpret_cast<float*>(smem);
  if (warp_active) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + (lane >> 2) + 8 * r;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        const int d = i * 8 + (lane & 3) * 2;
        rows[row * HD + d] = o[i][2 * r] * inv[r];
        rows[row * HD + d + 1] = o[i][2 * r + 1] * inv[r];
      }
    }
  }
  __syncwarp();
  constexpr int kPer = HD / 32;
  for (int row = warp * 16; row < min(n_rows, warp * 16 + 16); ++row) {
    float x[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) x[e] = rows[row * HD + lane * kPer + e];
    detail::hadamard_rotate_warp<HD>(x);
    Out* dst = static_cast<Out*>(a.rotated_out) + static_cast<int64_t>(t + row / group) * a.n_head * HD +
               static_cast<int64_t>(kvh * group + row % group) * HD + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) dst[e] = detail::from_f32<Out>(x[e]);
  }
}

template <int HD, bool kBatched>
void launch(const ChanAttentionArgs& a, cudaStream_t stream) {
  using C = FlashCta<HD>;
  const int group = a.n_head / a.n_head_kv;
  const int tt = chan_flash_tile_tokens(group);
  const dim3 grid(static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(a.n_tokens));
  if (a.rotated_out) {
    RILL_CUDA_DISPATCH_FLOAT(a.rotated_dtype,
                             chan_flash_kernel<HD, T, kBatched><<<grid, kThreads, C::kBytes, stream>>>(a, group, tt));
  } else {
    chan_flash_kernel<HD, float, kBatched><<<grid, kThreads, C::kBytes, stream>>>(a, group, tt);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

template <int HD>
void launch(const ChanAttentionArgs& a, cudaStream_t stream) {
  if (a.flash_batched_loads && !a.k_widths) {
    launch<HD, true>(a, stream);
  } else {
    launch<HD, false>(a, stream);
  }
}

}  // namespace

bool chan_attention_flash_supported(int32_t head_dim, int32_t group) {
  return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= kRows;
}

void chan_attention_flash(const ChanAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0 || a.n_head <= 0) return;
  if (a.n_tokens > 65535 || !chan_attention_flash_supported(a.head_dim, a.n_head / a.n_head_kv)) {
    std::fprintf(stderr,
                 "chan_attention_flash: %d tokens, head_dim %d, %d query heads a KV head (at most 65,535 "
                 "tokens, head_dim 64 or 128, at most 64 heads)\n",
                 a.n_tokens, a.head_dim, a.n_head / a.n_head_kv);
    std::abort();
  }
  if (a.head_dim == 64) {
    launch<64>(a, stream);
  } else {
    launch<128>(a, stream);
  }
}

}  // namespace rill::cuda
