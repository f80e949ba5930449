// Paged attention: split-KV decode (+ combine) and a tiled prefill kernel.
// Both read K/V rows through the block tables; both keep scores and the
// softmax in f32 with the CPU reference's order (scale, softcap, max
// subtraction, exp, sum), and differ from it only by summation order (and
// exp2 for expf in attention_decode.cu's main path). Sink logits
// (AttentionArgs::sinks) join each head's denominator where its output is
// finished (detail::add_sink): once per head, outside the key loops.
// Decode goes to attention_decode.cu's kernel where it supports the cache
// (decode_fast_supported: head_dim 64/128/256), else to the general kernel
// here (head_dim 512, Gemma 4's full layers, among others). The general
// kernels read every KV type of kv_types.cuh (a head dequantized in
// registers as it is loaded) at every head_dim up to 512.
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_chan.h"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using detail::add_sink;
using detail::cache_row;
using detail::from_f32;
using detail::partial_at;
using detail::softcap_score;
using detail::splits_for;
using detail::store_out;
using detail::warp_max;
using detail::warp_sum;

[[maybe_unused]] constexpr int kMaxGroup = 8;  // q heads per KV head the decode kernel handles
constexpr int kDecodeThreads = 128;
constexpr int kDecodeChunk = 128;  // keys scored before each softmax update

// Keys each warp has in flight per round: 4 rows of f32/f16; 8 of a block
// type, whose rows are a quarter to a half the bytes (its rounds are
// latency bound: more loads per round, fewer rounds). A warp still takes
// keys w, w + 4, ... in order, so the arithmetic is the same. Measured with
// the prefetch below (docs/perf.md, Llama-3.1-8B q8_0, 1,024 tokens):
// batch 1 +10%, batch 64 -12% (registers: fewer resident blocks).
// Heads of 512 (kChunks 4) keep 2: the rows' registers are 4x head_dim 128's.
template <typename KvT, int kChunks>
inline constexpr int kKeysInFlight = kChunks >= 4      ? 2
                                     : KvT::kBlock > 1 ? 8
                                                       : 4;
// Grids of at most this many blocks (every block resident at once on an
// H200, as attention_decode.cu) prefetch their split's K/V rows into L2
// before waiting for the preceding kernel.
constexpr unsigned kPrefetchMaxBlocks = 264;

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// rows[u] = cache rows cache_rows[base + 4 u] (those below n), this lane's
// 4 * kChunks elements of each (KvT: a tag of kv_types.cuh).
// The head's elements start at element head_elem of each row.
template <typename KvT, int kRowsN, int kChunks>
__device__ __forceinline__ void load_rows(const uint8_t* plane, int64_t head_elem, const int32_t* cache_rows, int base,
                                          int n, int64_t row_bytes, int hd, int lane,
                                          float (&rows)[kRowsN][kChunks][4]) {
#pragma unroll
  for (int u = 0; u < kRowsN; ++u) {
    const int jj = base + 4 * u;
    if (jj < n) {
      const uint8_t* r = plane + cache_rows[jj] * row_bytes;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane * 4 + c * 128;
        if (d < hd) KvT::load4(r, head_elem + d, rows[u][c]);
      }
    }
  }
}
// One split of the decode kernel below: keys [k_begin, k_end) of token t's
// KV head kvh for its G query heads; writes the split's partials, or the
// output itself when the token has one split. Called by all threads of the
// block (it synchronizes).
template <typename KvT, int kChunks, int kG>
__device__ __forceinline__ void decode_split(const AttentionArgs& a, float* smem, float* m_s, float* corr_s, float* l_s,
                                             int32_t* rows_s, int kvh, int split, int z, int32_t t, int32_t k_begin,
                                             int32_t k_end, int32_t n_splits) {
  constexpr int kKeys = kKeysInFlight<KvT, kChunks>;
  const int G = a.n_head / a.n_head_kv, hd = a.head_dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* q_s = smem;                   // [G][hd]
  float* sc = q_s + G * hd;            // [G][kDecodeChunk]
  float* red = sc + G * kDecodeChunk;  // [4][G][hd]
  const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
  const float* q = a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(kvh) * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += kDecodeThreads) q_s[i] = q[i];
  if (threadIdx.x < G) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  const int64_t row_bytes = KvT::row_bytes(static_cast<int64_t>(a.n_head_kv) * hd);
  const int64_t head_elem = static_cast<int64_t>(kvh) * hd;
  const auto* kbase = static_cast<const uint8_t*>(a.k_cache);
  const auto* vbase = static_cast<const uint8_t*>(a.v_cache);
  float acc[kG][kChunks][4];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[g][c][e] = 0.0f;
  __syncthreads();

  for (int32_t c0 = k_begin; c0 < k_end; c0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, k_end - c0);
    // The chunk's cache rows, looked up once: otherwise a block-table load
    // would precede every K and V row load (two latencies per round).
    for (int jj = threadIdx.x; jj < n; jj += kDecodeThreads)
      rows_s[jj] = static_cast<int32_t>(cache_row(a, table, c0 + jj));
    __syncthreads();
    for (int base = warp; base < n; base += 4 * kKeys) {
      float kv[kKeys][kChunks][4];
      load_rows<KvT, kKeys, kChunks>(kbase, head_elem, rows_s, base, n, row_bytes, hd, lane, kv);
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        const int jj = base + 4 * u;
        if (jj >= n) break;
        float dot[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) dot[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane * 4 + c * 128;
          if (d < hd) {
#pragma unroll
            for (int g = 0; g < kG; ++g) {
              if (g < G) {
                const float* qg = q_s + g * hd + d;
                dot[g] += qg[0] * kv[u][c][0] + qg[1] * kv[u][c][1] + qg[2] * kv[u][c][2] + qg[3] * kv[u][c][3];
              }
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g < G) {
            const float s = warp_sum(dot[g]);
            if (lane == 0) sc[g * kDecodeChunk + jj] = softcap_score(s * a.scale, a.softcap);
          }
        }
      }
    }
    __syncthreads();
    // Softmax update: warp w owns heads w, w+4.
    for (int g = warp; g < G; g += 4) {
      float mx = -INFINITY;
      for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, sc[g * kDecodeChunk + jj]);
      mx = warp_max(mx);
      const float m_new = fmaxf(m_s[g], mx);
      float sum = 0.0f;
      for (int jj = lane; jj < n; jj += 32) {
        const float e = expf(sc[g * kDecodeChunk + jj] - m_new);
        sc[g * kDecodeChunk + jj] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = expf(m_s[g] - m_new);  // 0 on the first chunk
        corr_s[g] = corr;
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < G) {
        const float corr = corr_s[g];
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[g][c][e] *= corr;
      }
    }
    for (int base = warp; base < n; base += 4 * kKeys) {
      // (Loading the first round of V before the softmax overlaps its
      // latency but costs 11 registers: 6 -> 5 blocks per SM; not taken.)
      float vv[kKeys][kChunks][4];
      load_rows<KvT, kKeys, kChunks>(vbase, head_elem, rows_s, base, n, row_bytes, hd, lane, vv);
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        const int jj = base + 4 * u;
        if (jj >= n) break;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane * 4 + c * 128;
          if (d < hd) {
#pragma unroll
            for (int g = 0; g < kG; ++g) {
              if (g < G) {
                const float pr = sc[g * kDecodeChunk + jj];
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[g][c][e] += pr * vv[u][c][e];
              }
            }
          }
        }
      }
    }
    __syncthreads();  // sc is rewritten by the next chunk
  }
  // Sum the four warps' accumulators.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g < G) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane * 4 + c * 128;
        if (d < hd) {
#pragma unroll
          for (int e = 0; e < 4; ++e) red[(warp * G + g) * hd + d + e] = acc[g][c][e];
        }
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * hd; i += kDecodeThreads) {
    const int g = i / hd, d = i % hd;
    const float s =
        red[(0 * G + g) * hd + d] + red[(1 * G + g) * hd + d] + red[(2 * G + g) * hd + d] + red[(3 * G + g) * hd + d];
    if (n_splits == 1) {
      const int64_t h = kvh * G + g;
      float num = s, den = l_s[g];
      if (a.sinks) num *= add_sink(a.sinks[h], m_s[g], den);
      store_out(a.out_dtype, a.out, (static_cast<int64_t>(t) * a.n_head + h) * hd + d, num / den);
      continue;
    }
    float* part = partial_at(a, z, kvh * G + g, split);
    part[2 + d] = s;
    if (d == 0) {
      part[0] = m_s[g];
      part[1] = l_s[g];
    }
  }
}

// grid (n_head_kv, max splits, n_decode); 4 warps. Warp w scores keys
// w, w+4, ... of each chunk (lanes split head_dim, 4 elements each; kChunks
// = head_dim / 128 rounded up), kKeys keys' loads issued before any use so
// a warp has several rows in flight; then it accumulates V for the same
// keys the same way; the warps' sums meet in shared memory.
// Requires head_dim % 4 == 0 and head_dim <= 128 * kChunks.
// kG >= the q heads per KV head (a compile-time bound keeps the per-head
// accumulators in registers and the register count, hence occupancy, low).
// A token with one split writes out; with more, a.split_counts lets the
// last block of each (token, KV head) merge the splits (no combine kernel).
template <typename KvT, int kChunks, int kG>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(AttentionArgs a) {
  extern __shared__ float smem[];  // [G][hd] q, [G][kDecodeChunk] scores, [4][G][hd] sums
  __shared__ float m_s[kG], corr_s[kG], l_s[kG];
  __shared__ int32_t rows_s[kDecodeChunk];
  const int G = a.n_head / a.n_head_kv;
  const int kvh = blockIdx.x, split = blockIdx.y, z = blockIdx.z;
  // The step's indices and block tables are written before its first
  // kernel: read (and the split's rows prefetched) before the wait.
  const detail::DecodeSplit ds = detail::decode_split(a, z, split);
  const int32_t t = ds.t, n_splits = ds.n_splits, k_begin = ds.k_begin, k_end = ds.k_end;
  if (split < n_splits && gridDim.x * gridDim.y * gridDim.z <= kPrefetchMaxBlocks) {
    const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
    const int64_t row_bytes = KvT::row_bytes(static_cast<int64_t>(a.n_head_kv) * a.head_dim);
    // The head's bytes: from the block holding its first element, whole blocks.
    const int64_t first = static_cast<int64_t>(kvh) * a.head_dim / KvT::kBlock * KvT::kBlock;
    const int64_t head_off = KvT::row_bytes(first), head_bytes = KvT::row_bytes(max(a.head_dim, KvT::kBlock));
    for (int32_t j = k_begin + static_cast<int32_t>(threadIdx.x); j < k_end; j += kDecodeThreads) {
      const int64_t off = cache_row(a, table, j) * row_bytes + head_off;
      for (int64_t b = off & ~int64_t{127}; b < off + head_bytes; b += 128) {
        prefetch_l2(static_cast<const uint8_t*>(a.k_cache) + b);
        prefetch_l2(static_cast<const uint8_t*>(a.v_cache) + b);
      }
    }
  }
  detail::pdl_wait();  // every block waits before it exits (the chain stays transitive)
  detail::pdl_trigger();
  if (split >= n_splits) return;
  if (k_begin >= k_end) {
    if (threadIdx.x < G) {
      float* part = partial_at(a, z, kvh * G + threadIdx.x, split);
      part[0] = -INFINITY;
      part[1] = 0.0f;
    }
  } else {
    decode_split<KvT, kChunks, kG>(a, smem, m_s, corr_s, l_s, rows_s, kvh, split, z, t, k_begin, k_end, n_splits);
  }
  if (a.split_counts && n_splits > 1) detail::merge_if_last<kG>(a, z, t, kvh, G, n_splits);
}

// grid (n_decode, n_head): merges the splits of a token that has several
// (a token with one split was written by the decode kernel).
__global__ void combine_kernel(AttentionArgs a) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int z = blockIdx.x, h = blockIdx.y;
  const int32_t t = a.decode_tokens[z];
  const int32_t n_splits = splits_for(a.pos[t] + 1);
  if (n_splits > 1) detail::merge_heads<1>(a, z, t, h, 1, n_splits);
}

// grid (n_tiles, n_head); 128 threads: thread (r = tid / 4, sub = tid % 4)
// owns query row r of the tile and dims sub, sub + 4, ... of its output.
// K/V tiles of 32 keys are staged in shared memory as f32.
constexpr int kTileK = 32;
template <typename KvT, typename Out, int kDims>  // kDims = head_dim / 4 rounded up
__global__ void __launch_bounds__(128) prefill_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, ld = hd + 1;
  float* qs = smem;                     // [32][hd + 1]
  float* ks = qs + kPrefillTileQ * ld;  // [32][hd + 1]
  float* vs = ks + kTileK * ld;         // [32][hd]
  float* ps = vs + kTileK * hd;         // [32][33]
  const PrefillTile tile = a.tiles[blockIdx.x];
  const int h = blockIdx.y, kvh = h / (a.n_head / a.n_head_kv);
  const int r = threadIdx.x >> 2, sub = threadIdx.x & 3;
  const int32_t* table = a.block_tables + a.table_start[tile.seq];
  const int64_t row_bytes = KvT::row_bytes(static_cast<int64_t>(a.n_head_kv) * hd);
  const int64_t head_elem = static_cast<int64_t>(kvh) * hd;
  const auto* kbase = static_cast<const uint8_t*>(a.k_cache);
  const auto* vbase = static_cast<const uint8_t*>(a.v_cache);

  for (int i = threadIdx.x; i < kPrefillTileQ * hd; i += 128) {
    const int rr = i / hd, d = i % hd;
    qs[rr * ld + d] =
        rr < tile.n_q ? a.q[static_cast<int64_t>(tile.t0 + rr) * a.q_stride + static_cast<int64_t>(h) * hd + d] : 0.0f;
  }
  const bool row_ok = r < tile.n_q;
  const int32_t p_row = row_ok ? a.pos[tile.t0 + r] : -1;
  const int32_t lo_row = a.window > 0 ? max(0, p_row - a.window + 1) : 0;
  const int32_t p_first = a.pos[tile.t0], p_last = a.pos[tile.t0 + tile.n_q - 1];
  const int32_t k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;

  float acc[kDims];
#pragma unroll
  for (int i = 0; i < kDims; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int32_t kc = k_lo; kc < k_hi; kc += kTileK) {
    __syncthreads();  // previous tile fully used (and q staged on the first pass)
    for (int i = threadIdx.x; i < kTileK * hd; i += 128) {
      const int jj = i / hd, d = i % hd;
      const int32_t j = kc + jj;
      float kv = 0.0f, vv = 0.0f;
      if (j < k_hi) {
        const int64_t row = cache_row(a, table, j) * row_bytes;
        kv = KvT::load1(kbase + row, head_elem + d);
        vv = KvT::load1(vbase + row, head_elem + d);
      }
      ks[jj * ld + d] = kv;
      vs[jj * hd + d] = vv;
    }
    __syncthreads();
    float s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = 0.0f;
    for (int d = 0; d < hd; ++d) {
      const float qd = qs[r * ld + d];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] += qd * ks[(sub + 4 * i) * ld + d];
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int32_t j = kc + sub + 4 * i;
      const bool ok = row_ok && j <= p_row && j >= lo_row && j < k_hi;
      s[i] = ok ? softcap_score(s[i] * a.scale, a.softcap) : -INFINITY;
      tile_max = fmaxf(tile_max, s[i]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - m_new);
      ps[r * 33 + sub + 4 * i] = e;
      sum += e;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    if (m_new != -INFINITY) {
      l = l * corr + sum;
      m = m_new;
#pragma unroll
      for (int i = 0; i < kDims; ++i) acc[i] *= corr;
    }
    __syncwarp();
    for (int jj = 0; jj < kTileK; ++jj) {
      const float pr = ps[r * 33 + jj];
#pragma unroll
      for (int i = 0; i < kDims; ++i) {
        const int d = sub + 4 * i;
        if (d < hd) acc[i] += pr * vs[jj * hd + d];
      }
    }
  }
  if (!row_ok) return;
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (a.sinks) {
    const float corr = add_sink(a.sinks[h], m, l);
    inv = corr / l;
  }
  Out* out =
      static_cast<Out*>(a.out) + static_cast<int64_t>(tile.t0 + r) * a.n_head * hd + static_cast<int64_t>(h) * hd;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = sub + 4 * i;
    if (d < hd) out[d] = from_f32<Out>(acc[i] * inv);
  }
}

// Dynamic shared memory of the prefill kernel at head_dim hd (201 KB at 512).
constexpr size_t prefill_smem_bytes(int hd) {
  return sizeof(float) *
         (static_cast<size_t>(kPrefillTileQ + kTileK) * (hd + 1) + static_cast<size_t>(kTileK) * hd + 32 * 33);
}

template <typename KvT, typename Out, int kDims>
void launch_prefill(const AttentionArgs& a, cudaStream_t stream) {
  const size_t smem = prefill_smem_bytes(a.head_dim);
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(prefill_kernel<KvT, Out, kDims>), prefill_smem_bytes(4 * kDims));
  const dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.n_head));
  prefill_kernel<KvT, Out, kDims><<<grid, 128, smem, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

template <typename KvT, int kChunks, int kG>
void launch_decode_g(const AttentionArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(decode_kernel<KvT, kChunks, kG>),
                sizeof(float) * (kG * 128 * kChunks * 5 + kG * kDecodeChunk));
  launch_pdl(decode_kernel<KvT, kChunks, kG>, grid, kDecodeThreads, smem, stream, a);
}

template <typename KvT, int kChunks>
void launch_decode(const AttentionArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  const int G = a.n_head / a.n_head_kv;
  if (G <= 1) {
    launch_decode_g<KvT, kChunks, 1>(a, grid, smem, stream);
  } else if (G <= 2) {
    launch_decode_g<KvT, kChunks, 2>(a, grid, smem, stream);
  } else if (G <= 4) {
    launch_decode_g<KvT, kChunks, 4>(a, grid, smem, stream);
  } else {
    launch_decode_g<KvT, kChunks, 8>(a, grid, smem, stream);
  }
}

template <typename KvT, typename Out>
void launch(const AttentionArgs& a, cudaStream_t stream, int32_t decode_warps, int32_t decode_work) {
  if (a.n_decode > 0) {
    const int G = a.n_head / a.n_head_kv;
    const size_t smem = sizeof(float) * (static_cast<size_t>(G) * a.head_dim + static_cast<size_t>(G) * kDecodeChunk +
                                         4 * static_cast<size_t>(G) * a.head_dim);
    const int32_t n_splits = splits_for(a.max_decode_len);
    const dim3 grid(static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_splits),
                    static_cast<unsigned>(a.n_decode));
    if (!a.general_decode && decode_fast_supported(a.kv_dtype, a.head_dim, G)) {
      decode_attention_fast(a, n_splits, stream, decode_warps, decode_work);
    } else if (a.head_dim <= 128) {
      launch_decode<KvT, 1>(a, grid, smem, stream);
    } else if (a.head_dim <= 256) {
      launch_decode<KvT, 2>(a, grid, smem, stream);
    } else {
      launch_decode<KvT, 4>(a, grid, smem, stream);
    }
    if (!a.split_counts && n_splits > 1) {
      const dim3 cgrid(static_cast<unsigned>(a.n_decode), static_cast<unsigned>(a.n_head));
      launch_pdl(combine_kernel, cgrid, a.head_dim >= 128 ? 128 : 32, 0, stream, a);
    }
  }
  if (a.n_tiles > 0 && prefill_mma_supported(a.kv_dtype, a.head_dim)) {
    prefill_attention_mma(a, stream);
  } else if (a.n_tiles > 0) {
    if (a.head_dim <= 64) {
      launch_prefill<KvT, Out, 16>(a, stream);
    } else if (a.head_dim <= 128) {
      launch_prefill<KvT, Out, 32>(a, stream);
    } else if (a.head_dim <= 256) {
      launch_prefill<KvT, Out, 64>(a, stream);
    } else {
      launch_prefill<KvT, Out, 128>(a, stream);
    }
  }
}

// Rotated KV (AttentionArgs::k_rotated / v_rotated): head h of row t of in
// (rows in_stride floats apart) times H / sqrt(head_dim)
// (detail::hadamard_rotate_heads, the CPU's bits) into out, rows [n_rows,
// n_heads * head_dim] in Out. One block per (row, head): head_dim below 32
// only (4, 8, 16; the warp kernel below takes 32 to 512).
template <typename Out>
__global__ void rotate_heads_kernel(const float* in, int64_t in_stride, int n_heads, int hd, Out* out) {
  extern __shared__ float x[];  // [hd]
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  detail::pdl_wait();  // in may come from the kernel just before
  detail::pdl_trigger();
  const float* src = in + t * in_stride + static_cast<int64_t>(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = src[d];
  detail::hadamard_rotate_heads(x, hd, hd);  // synchronizes before and after
  Out* dst = out + (t * n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = from_f32<Out>(x[d]);
}

// The same transform with one warp per (row, head) and the head in its
// registers: lane l holds elements [l kPer, (l + 1) kPer). Each butterfly
// stage len pairs element i (bit len clear) with i + len: x[i] = a + b,
// x[i + len] = a - b of the old values, as hadamard_rotate_heads (the
// CPU's order of stages and operands, explicitly rounded): stages below
// kPer inside a lane, the others across lanes l and l ^ (len / kPer) by a
// shuffle. So the bits are the block kernel's. (That kernel's 7
// barrier-separated stages over 65,536 blocks of 64 threads took ~110 us a
// layer for q at 2,048 tokens of Llama-3.1-8B; this one reads and writes
// each row once from registers.)
constexpr int kRotateWarps = 4;
template <int HD, typename Out>
__global__ void __launch_bounds__(kRotateWarps * 32)
    rotate_heads_warp_kernel(const float* in, int64_t in_stride, int64_t n_rows, int n_heads, Out* out) {
  constexpr int kPer = HD / 32;
  static_assert(kPer >= 1 && (HD & (HD - 1)) == 0, "heads of 32 to 512, a power of two");
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kRotateWarps + (threadIdx.x >> 5);
  detail::pdl_wait();  // in may come from the kernel just before
  detail::pdl_trigger();
  if (w >= n_rows * n_heads) return;
  const int64_t t = w / n_heads;
  const int h = static_cast<int>(w % n_heads);
  const float* src = in + t * in_stride + static_cast<int64_t>(h) * HD + lane * kPer;
  float x[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) x[r] = src[r];
  detail::hadamard_rotate_warp<HD>(x);
  Out* dst = out + w * HD + lane * kPer;
#pragma unroll
  for (int r = 0; r < kPer; ++r) dst[r] = from_f32<Out>(x[r]);
}

template <typename Out>
void rotate_heads(const float* in, int64_t in_stride, int32_t n_rows, int32_t n_heads, int32_t hd, Out* out,
                  cudaStream_t stream) {
  const int64_t warps = static_cast<int64_t>(n_rows) * n_heads;
  const unsigned blocks = static_cast<unsigned>((warps + kRotateWarps - 1) / kRotateWarps);
  auto warp_kernel = [&](auto kernel) {
    launch_pdl(kernel, dim3(blocks), kRotateWarps * 32, 0, stream, in, in_stride, static_cast<int64_t>(n_rows),
               static_cast<int>(n_heads), out);
  };
  switch (hd) {
    case 32:
      return warp_kernel(rotate_heads_warp_kernel<32, Out>);
    case 64:
      return warp_kernel(rotate_heads_warp_kernel<64, Out>);
    case 128:
      return warp_kernel(rotate_heads_warp_kernel<128, Out>);
    case 256:
      return warp_kernel(rotate_heads_warp_kernel<256, Out>);
    case 512:
      return warp_kernel(rotate_heads_warp_kernel<512, Out>);
    default: {  // below 32: 4, 8, 16 (kv_rotation_supported: powers of two up to 512)
      const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>(n_heads));
      launch_pdl(rotate_heads_kernel<Out>, grid, 64, static_cast<size_t>(hd) * sizeof(float), stream, in, in_stride,
                 n_heads, hd, out);
    }
  }
}

void dispatch(const AttentionArgs& a, cudaStream_t stream, int32_t decode_warps, int32_t decode_work) {
  RILL_CUDA_DISPATCH_KV(a.kv_dtype,
                        RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, T>(a, stream, decode_warps, decode_work)));
}

}  // namespace

bool kv_rotation_supported(DType kv_dtype, int32_t head_dim, bool rotated) {
  // IQ4_NL, Q8_0_64 and IQ4_NL64: stored rotated only (iq4_nlh, q8_0h64, iq4_nlh64)
  if (!rotated) return kv_dtype != DType::kIQ4_NL && kv_dtype != kKvQ8_0x64 && kv_dtype != kKvIq4Nl64;
  const bool pow2 = head_dim > 0 && head_dim <= 512 && (head_dim & (head_dim - 1)) == 0;
  // q8_0h64 / iq4_nlh64: heads of whole blocks of 64 (the CPU's rule: a
  // block never spans two heads), so a power of two >= 64.
  if (kv_dtype == kKvQ8_0x64 || kv_dtype == kKvIq4Nl64) return pow2 && head_dim >= 64;
  return (kv_dtype == DType::kQ8_0 || kv_dtype == DType::kQ4_0 || kv_dtype == DType::kIQ4_NL) && pow2;
}

size_t attention_rotation_floats(int64_t n_tokens, int32_t n_head, int32_t head_dim) {
  return 2 * static_cast<size_t>(n_tokens) * static_cast<size_t>(n_head) * static_cast<size_t>(head_dim);
}

void rotate_heads_back(const float* in, int64_t in_stride, int32_t n_rows, int32_t n_heads, int32_t head_dim,
                       DType out_dtype, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  RILL_CUDA_DISPATCH_FLOAT(out_dtype,
                           rotate_heads(in, in_stride, n_rows, n_heads, head_dim, static_cast<T*>(out), stream));
}

bool kv_supported(DType kv_dtype) {
  bool supported = false;
  RILL_CUDA_DISPATCH_KV(kv_dtype, supported = KvT::kDtype == kv_dtype);
  return supported;
}

int32_t decode_splits(int32_t len) {
  return splits_for(len);
}

int32_t prefill_tile_q(DType kv_dtype, int32_t head_dim) {
  return prefill_mma_supported(kv_dtype, head_dim) ? kPrefillTileQMma : kPrefillTileQ;
}

size_t attention_partial_floats(int64_t n_decode, int32_t n_head, int32_t head_dim) {
  return static_cast<size_t>(n_decode) * static_cast<size_t>(n_head) * kMaxSplits * static_cast<size_t>(head_dim + 2);
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
  attention(a, stream, 0);
}

void attention(const AttentionArgs& a, cudaStream_t stream, int32_t decode_warps, int32_t decode_work) {
  assert(a.n_head % a.n_head_kv == 0 && a.n_head / a.n_head_kv <= kMaxGroup);
  assert(a.head_dim % 4 == 0 && a.head_dim <= kMaxHeadDim);
  assert(kv_supported(a.kv_dtype) && a.n_head_kv * a.head_dim % dtype_info(a.kv_dtype).block_size == 0);
  assert(kv_rotation_supported(a.kv_dtype, a.head_dim, a.k_rotated) &&
         kv_rotation_supported(a.kv_dtype, a.head_dim, a.v_rotated));
  if (!a.k_rotated && !a.v_rotated) return dispatch(a, stream, decode_warps, decode_work);
  // Rotated KV: q's heads rotated into the scratch's first half, the
  // kernels' f32 outputs into its second, rotated back into a.out.
  assert(kv_rotation_supported(a.kv_dtype, a.head_dim, true) && a.rotation && a.n_tokens > 0);
  const int64_t width = static_cast<int64_t>(a.n_head) * a.head_dim;
  float* rotated_out = a.rotation + a.n_tokens * width;
  AttentionArgs r = a;
  if (a.k_rotated) {
    rotate_heads(a.q, a.q_stride, a.n_tokens, a.n_head, a.head_dim, a.rotation, stream);
    r.q = a.rotation;
    r.q_stride = width;
  }
  if (a.v_rotated) {
    r.out_dtype = DType::kF32;
    r.out = rotated_out;
  }
  dispatch(r, stream, decode_warps, decode_work);
  if (a.v_rotated) {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, rotate_heads(rotated_out, width, a.n_tokens, a.n_head, a.head_dim,
                                                       static_cast<T*>(a.out), stream));
  }
}

}  // namespace rill::cuda
