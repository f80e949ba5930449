// Prefill attention for wide heads (head_dim 256 and 512: Gemma 3/4,
// Qwen3.5) with the fragments in registers (FlashAttention-2's loop on
// mma.sync m16n8k16), for f16, fp8 (e4m3), q8_0 and q4_0 KV (and the
// other types load8h reads: iq4_nl, the blocks of 64, bf16, q4_1, q5_0,
// q5_1).
//
// A warp's output accumulator at head_dim 512 (16 rows x 512 f32) would
// take 256 registers a lane, so a block's 64 queries split over RG row
// groups x 4 column groups of warps (RG 2 at 256: 8 warps; 4 at 512: 16):
// warp (rg, cg) owns query rows [64 / RG rg, 64 / RG (rg + 1)) and
//   - in S = Q K^T, score columns (keys) [16 cg, 16 cg + 16) of each
//     64-key tile, over the whole head (Q and K fragments by ldmatrix from
//     shared memory);
//   - in O += P V, output dims [cg HD / 4, (cg + 1) HD / 4) (at 512: 16 x
//     128 f32, 64 registers a lane), over all 64 keys.
// The 4 warps of a row group meet in shared memory twice a tile: their
// rows' partial maxima (each takes the maximum of the 4, so all hold the
// same running max and rescale alike), and the probabilities P (f16),
// which every warp of the group reads whole as A fragments. Each keeps the
// part of the rows' sums over its own columns; the 4 parts are added in
// column-group order at the end.
//
// K and V have a shared-memory tile each; K of the next tile is copied
// while P V runs, V of the next while Q K^T runs (cp.async for f16; the
// other types converted to f16 as load8h reads them, in the same places).
// 205 KB of shared memory at 512 (Q, K, V of 64 rows), one block per SM;
// 109 KB at 256, two. Within a sequence, blocks run the longest tiles
// first (grid order).
//
// Arithmetic as the other tensor-core kernels: q rounded to f16 before
// Q K^T, probabilities to f16 before P V (their f16 values summed into the
// denominator), scores and the online softmax in f32 (base 2, the scale
// folded in). A row's result depends on its own keys and on its tile's
// first key (as in every prefill kernel), not on other tiles or heads.
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_one;
using detail::ldmatrix_x4;
using detail::ldmatrix_x4_trans;
using detail::load8h;
using detail::pack_half2;
using detail::smem_addr;

constexpr int kBQ = kPrefillTileQMma, kBK = 64;
constexpr int kColGroups = 4;
constexpr int kKeys = kBK / kColGroups;  // score columns per warp
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kKeys == 16, "S takes one 16-key ldmatrix of K per warp and k-step");

// The block's shape at head_dim HD with RG row groups (RG x 4 warps).
template <int HD, int RG>
struct Layout {
  static constexpr int kWarps = RG * kColGroups, kThreads = kWarps * 32;
  static constexpr int kRows = kBQ / RG;         // query rows per warp
  static constexpr int kMT = kRows / 16;         // their 16-row m-tiles
  static constexpr int kDims = HD / kColGroups;  // output dims per warp
  static constexpr int kLd = HD + 8;             // halves per Q/K/V row: a 16-byte pad keeps ldmatrix conflict-free
  static constexpr int kLdP = kBK + 8;           // halves per probability row
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(__half) * kBQ * kLd;
  static constexpr size_t kV = kK + sizeof(__half) * kBK * kLd;
  static constexpr size_t kP = kV + sizeof(__half) * kBK * kLd;
  static constexpr size_t kRed = kP + sizeof(__half) * kBQ * kLdP;  // [kColGroups][kBQ] f32: maxima, then sums
  static constexpr size_t kBytes = kRed + sizeof(float) * kColGroups * kBQ;
  static constexpr int kMinBlocks = kBytes * 2 <= 226 * 1024 ? 2 : 1;  // blocks an SM holds
  // Copies: kPer threads per key, each kPieces 16-byte pieces of its row.
  static constexpr int kPer = kThreads / kBK, kPieces = HD / 8 / kPer;
  static_assert(kBytes <= 227 * 1024, "a block must fit an SM's shared memory");
  static_assert(kDims % 64 == 0, "P V takes V fragments 4 at a time");
  static_assert(kRows % 16 == 0 && kThreads % kBK == 0 && kPieces % 4 == 0, "the loops below");
};

// Stores (x, y) at p[0], p[1] (p 8-byte aligned for f32, 4 for 16-bit types).
template <typename Out>
__device__ __forceinline__ void store2(Out* p, float x, float y) {
  if constexpr (std::is_same_v<Out, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  } else if constexpr (std::is_same_v<Out, __half>) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
  }
}

template <typename KvT, int HD, int RG, typename Out>
__global__ void __launch_bounds__(Layout<HD, RG>::kThreads, Layout<HD, RG>::kMinBlocks)
    wide_prefill_kernel(AttentionArgs a) {
  using L = Layout<HD, RG>;
  constexpr int kThreads = L::kThreads, kRows = L::kRows, kMT = L::kMT, kR = 2 * kMT;  // kR: rows per lane
  extern __shared__ __align__(128) uint8_t smem[];
  __half* qs = reinterpret_cast<__half*>(smem + L::kQ);
  __half* ks = reinterpret_cast<__half*>(smem + L::kK);
  __half* vs = reinterpret_cast<__half*>(smem + L::kV);
  __half* ps = reinterpret_cast<__half*>(smem + L::kP);
  float* red = reinterpret_cast<float*>(smem + L::kRed);

  // Blocks start in index order: every head of the last tile first, then of
  // the tile before, ... Tiles are listed sequence by sequence, so within
  // one sequence the latest queries (the most keys) start first, for less
  // of a tail; across sequences the order is only the reverse listing.
  const PrefillTile tile = a.tiles[a.n_tiles - 1 - static_cast<int32_t>(blockIdx.x) / a.n_head];
  const int h = static_cast<int>(blockIdx.x % static_cast<unsigned>(a.n_head)), kvh = h / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp / kColGroups, cg = warp % kColGroups;
  const int32_t* table = a.block_tables + a.table_start[tile.seq];
  const int64_t row_bytes = KvT::row_bytes(static_cast<int64_t>(a.n_head_kv) * HD);
  const auto* kbase = static_cast<const uint8_t*>(a.k_cache);
  const auto* vbase = static_cast<const uint8_t*>(a.v_cache);
  const int64_t head_e = static_cast<int64_t>(kvh) * HD;  // the head's first element in a row
  const int32_t p_first = a.pos[tile.t0], p_last = a.pos[tile.t0 + tile.n_q - 1];
  const int32_t k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;
  const int n_kv_tiles = (k_hi - k_lo + kBK - 1) / kBK;

  // Thread i copies 16-byte pieces (i % kPer) + kPer u (u < kPieces) of key
  // i / kPer of each tile: kPer threads read 16 kPer consecutive bytes of
  // an f16 row. The key's cache row is looked up a tile ahead of its copies.
  const int my_key = threadIdx.x / L::kPer, my_sub = threadIdx.x % L::kPer;
  int64_t row = -1;  // byte offset of this thread's key's row in the next tile to copy; -1: past k_hi
  auto look_up = [&](int it) {
    const int32_t j = k_lo + it * kBK + my_key;
    row = j < k_hi ? detail::cache_row(a, table, j) * row_bytes : -1;
  };
  auto copy = [&](const uint8_t* base, __half* dst_tile) {
    __half* dst = dst_tile + my_key * L::kLd;
    if constexpr (std::is_same_v<KvT, detail::KvF16>) {
      const uint32_t d0 = smem_addr(dst);
#pragma unroll
      for (int u = 0; u < L::kPieces; ++u) {
        const int v = my_sub + L::kPer * u;
        cp_async16(d0 + v * 16, base + (row >= 0 ? row + 2 * (head_e + v * 8) : 0), row >= 0);
      }
    } else {
      constexpr int kBatch = 4;  // loads issued together before their stores
#pragma unroll
      for (int u0 = 0; u0 < L::kPieces; u0 += kBatch) {
        uint4 x[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int v = my_sub + L::kPer * (u0 + u);
          x[u] = row >= 0 ? load8h<KvT>(base + row, head_e + v * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) *reinterpret_cast<uint4*>(dst + (my_sub + L::kPer * (u0 + u)) * 8) = x[u];
      }
    }
    cp_async_commit();  // (empty for the converted types: the waits below then return at once)
  };
  look_up(0);
  copy(kbase, ks);
  copy(vbase, vs);
  if (n_kv_tiles > 1) look_up(1);

  // Q rounded to f16, rows past n_q zero; float4 loads where q's rows allow them.
  const float* q_tile = a.q + static_cast<int64_t>(tile.t0) * a.q_stride + static_cast<int64_t>(h) * HD;
  if (a.q_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
    constexpr int kQuads = kBQ * HD / 4 / kThreads, kBatch = 8;
#pragma unroll
    for (int u0 = 0; u0 < kQuads; u0 += kBatch) {
      float4 qv[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = (threadIdx.x + (u0 + u) * kThreads) * 4, r = i / HD, d = i % HD;
        qv[u] = r < tile.n_q ? *reinterpret_cast<const float4*>(q_tile + static_cast<int64_t>(r) * a.q_stride + d)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = (threadIdx.x + (u0 + u) * kThreads) * 4, r = i / HD, d = i % HD;
        __half2* dst = reinterpret_cast<__half2*>(qs + r * L::kLd + d);
        dst[0] = __floats2half2_rn(qv[u].x, qv[u].y);
        dst[1] = __floats2half2_rn(qv[u].z, qv[u].w);
      }
    }
  } else {
    for (int i = threadIdx.x; i < kBQ * HD; i += kThreads) {
      const int r = i / HD, d = i % HD;
      qs[r * L::kLd + d] = __float2half_rn(r < tile.n_q ? q_tile[static_cast<int64_t>(r) * a.q_stride + d] : 0.0f);
    }
  }

  // This lane's kR rows, index 2 mt + hf: row kRows rg + 16 mt + lane / 4 +
  // 8 hf (fragment rows of S and O alike).
  auto local_row = [&](int idx) { return rg * kRows + (idx >> 1) * 16 + (lane >> 2) + 8 * (idx & 1); };
  int32_t p_row[kR], lo_row[kR];
#pragma unroll
  for (int idx = 0; idx < kR; ++idx) {
    const int r = local_row(idx);
    p_row[idx] = r < tile.n_q ? a.pos[tile.t0 + r] : -1;
    lo_row[idx] = a.window > 0 ? max(0, p_row[idx] - a.window + 1) : 0;
  }
  // The keys any row of this row group sees: [group_lo, group_last].
  const bool group_active = rg * kRows < tile.n_q;
  const int32_t group_last = group_active ? a.pos[tile.t0 + min(tile.n_q - 1, rg * kRows + kRows - 1)] : -1;
  const int32_t group_lo = a.window > 0 && group_active ? max(0, a.pos[tile.t0 + rg * kRows] - a.window + 1) : 0;

  constexpr int kN = L::kDims / 8;  // n-tiles of this warp's output
  float o[kMT][kN][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kN; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  float m[kR], l[kR];  // m in log2 units, the same in the group's 4 warps; l this lane's columns' part
#pragma unroll
  for (int idx = 0; idx < kR; ++idx) {
    m[idx] = -INFINITY;
    l[idx] = 0.0f;
  }

  const uint32_t q_lane = smem_addr(qs + (rg * kRows + (lane & 7) + ((lane >> 3) & 1) * 8) * L::kLd + (lane >> 4) * 8);
  const uint32_t k_lane =
      smem_addr(ks + (cg * kKeys + ((lane >> 4) << 3) + (lane & 7)) * L::kLd + (((lane >> 3) & 1) << 3));
  const uint32_t p_lane = smem_addr(ps + (rg * kRows + (lane & 7) + ((lane >> 3) & 1) * 8) * L::kLdP + (lane >> 4) * 8);
  const uint32_t v_lane =
      smem_addr(vs + ((((lane >> 3) & 1) << 3) + (lane & 7)) * L::kLd + cg * L::kDims + ((lane >> 4) << 3));

  for (int it = 0; it < n_kv_tiles; ++it) {
    const int32_t kc = k_lo + it * kBK, key0 = kc + cg * kKeys;
    cp_async_wait_one();  // K of this tile (V's copy may still be in flight)
    __syncthreads();      // K (and on the first pass Q) visible to every warp

    // S = Q K^T: kRows rows x this warp's 16 keys, kMT x 2 fragments.
    float s[kMT][2][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
    if (key0 <= group_last && key0 + kKeys > group_lo) {  // else every key is masked below
#pragma unroll
      for (int k = 0; k < HD / 16; ++k) {
        uint32_t qa[kMT][4], kb[4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(qa[mt], q_lane + (mt * 16 * L::kLd + k * 16) * 2);
        ldmatrix_x4(kb, k_lane + k * 32);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_m16n8k16<__half>(s[mt][0], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], kb[0], kb[1]);
          mma_m16n8k16<__half>(s[mt][1], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], kb[2], kb[3]);
        }
      }
    }
    // Scale, softcap, mask; the rows' maxima over this warp's columns.
    float mx[kR];
#pragma unroll
    for (int idx = 0; idx < kR; ++idx) mx[idx] = -INFINITY;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int idx = 2 * mt + (e >> 1);
          const int32_t j = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
          float x = s[mt][nt][e] * a.scale;
          if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
          const bool ok = j < k_hi && j <= p_row[idx] && j >= lo_row[idx];
          s[mt][nt][e] = ok ? x * kLog2e : -INFINITY;
          mx[idx] = fmaxf(mx[idx], s[mt][nt][e]);
        }
      }
    }
#pragma unroll
    for (int idx = 0; idx < kR; ++idx) {
      mx[idx] = fmaxf(mx[idx], __shfl_xor_sync(0xffffffffu, mx[idx], 1));
      mx[idx] = fmaxf(mx[idx], __shfl_xor_sync(0xffffffffu, mx[idx], 2));
      if ((lane & 3) == 0) red[cg * kBQ + local_row(idx)] = mx[idx];
    }
    __syncthreads();  // the maxima visible; K's tile free
    if (it + 1 < n_kv_tiles) {
      copy(kbase, ks);
    } else {
      cp_async_commit();  // an empty group: the waits stay "all but the newest"
    }

    // The group's running maxima; O and l rescaled; P (f16) into shared memory.
    float base[kR];
#pragma unroll
    for (int idx = 0; idx < kR; ++idx) {
      const int r = local_row(idx);
      const float tile_max = fmaxf(fmaxf(red[r], red[kBQ + r]), fmaxf(red[2 * kBQ + r], red[3 * kBQ + r]));
      const float m_new = fmaxf(m[idx], tile_max);
      base[idx] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: every p is 0
      const float corr = exp2f(m[idx] - base[idx]);   // 0 while m is -inf
      l[idx] *= corr;
      m[idx] = m_new;
      const int mt = idx >> 1, hf = idx & 1;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        o[mt][n][2 * hf] *= corr;
        o[mt][n][2 * hf + 1] *= corr;
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int r0 = rg * kRows + mt * 16 + (lane >> 2), col = cg * kKeys + nt * 8 + (lane & 3) * 2;
        const float b0 = base[2 * mt], b1 = base[2 * mt + 1];
        *reinterpret_cast<uint32_t*>(ps + r0 * L::kLdP + col) =
            pack_half2(exp2f(s[mt][nt][0] - b0), exp2f(s[mt][nt][1] - b0), l[2 * mt]);
        *reinterpret_cast<uint32_t*>(ps + (r0 + 8) * L::kLdP + col) =
            pack_half2(exp2f(s[mt][nt][2] - b1), exp2f(s[mt][nt][3] - b1), l[2 * mt + 1]);
      }
    }
    cp_async_wait_one();  // V of this tile (K's next copy may still be in flight)
    __syncthreads();      // P and V visible

    // O += P V over the tile's 64 keys, this warp's output dims.
    if (kc <= group_last && kc + kBK > group_lo) {
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(pa[mt], p_lane + (mt * 16 * L::kLdP + kk * 16) * 2);
        constexpr int kGroup = 4;  // V fragments loaded ahead of their products
#pragma unroll
        for (int n0 = 0; n0 < L::kDims / 16; n0 += kGroup) {
          uint32_t b[kGroup][4];
#pragma unroll
          for (int g = 0; g < kGroup; ++g)
            ldmatrix_x4_trans(b[g], v_lane + static_cast<uint32_t>(kk * 16 * L::kLd + (n0 + g) * 16) * 2);
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              mma_m16n8k16<__half>(o[mt][2 * (n0 + g)], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[g][0], b[g][1]);
              mma_m16n8k16<__half>(o[mt][2 * (n0 + g) + 1], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[g][2],
                                   b[g][3]);
            }
          }
        }
      }
    }
    __syncthreads();  // V's tile and P free
    if (it + 1 < n_kv_tiles) {
      copy(vbase, vs);
      if (it + 2 < n_kv_tiles) look_up(it + 2);
    } else {
      cp_async_commit();
    }
  }

  // The rows' sums: this lane's columns, then the quad's, then the 4
  // column groups' in order.
#pragma unroll
  for (int idx = 0; idx < kR; ++idx) {
    l[idx] += __shfl_xor_sync(0xffffffffu, l[idx], 1);
    l[idx] += __shfl_xor_sync(0xffffffffu, l[idx], 2);
    if ((lane & 3) == 0) red[cg * kBQ + local_row(idx)] = l[idx];
  }
  __syncthreads();
#pragma unroll
  for (int idx = 0; idx < kR; ++idx) {
    const int r = local_row(idx);
    if (r >= tile.n_q) continue;
    float sum = ((red[r] + red[kBQ + r]) + red[2 * kBQ + r]) + red[3 * kBQ + r];
    float scale = 1.0f;
    if (a.sinks) scale = detail::add_sink(a.sinks[h], m[idx] / kLog2e, sum);  // the sink joins the denominator
    scale = sum > 0.0f ? scale / sum : 0.0f;
    Out* out = static_cast<Out*>(a.out) + static_cast<int64_t>(tile.t0 + r) * a.n_head * HD +
               static_cast<int64_t>(h) * HD + cg * L::kDims;
    const int mt = idx >> 1, hf = idx & 1;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      store2(out + n * 8 + (lane & 3) * 2, o[mt][n][2 * hf] * scale, o[mt][n][2 * hf + 1] * scale);
    }
  }
}

template <typename KvT, int HD, int RG, typename Out>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  using L = Layout<HD, RG>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(wide_prefill_kernel<KvT, HD, RG, Out>), L::kBytes, L::kMinBlocks > 1);
  const unsigned grid = static_cast<unsigned>(a.n_tiles) * static_cast<unsigned>(a.n_head);
  wide_prefill_kernel<KvT, HD, RG, Out><<<grid, L::kThreads, L::kBytes, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

// 256: 2 row groups (8 warps, 128 registers: two blocks per SM); 512: 4 (16
// warps, 128 registers, one block per SM). 512 with 2 row groups (254
// registers) took 576 us for f16 and 1,245 for q8_0 KV where 4 take 559 and
// 940, q4_0 1,041 and 1,045 (its 16-warp build spills 124 bytes; docs/perf.md,
// bench_prefill_attention).
template <typename KvT>
void launch_hd(const AttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim == 256) {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 256, 2, T>(a, stream));
  } else {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 512, 4, T>(a, stream));
  }
}

}  // namespace

bool prefill_wide_supported(DType kv_dtype, int32_t head_dim) {
  return prefill_tile_kv(kv_dtype) && (head_dim == 256 || head_dim == 512);
}

void prefill_attention_wide(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return;
  require_prefill_tile_kv(a.kv_dtype, "prefill_attention_wide");
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, if constexpr (!std::is_same_v<KvT, detail::KvF32>) launch_hd<KvT>(a, stream));
}

}  // namespace rill::cuda
