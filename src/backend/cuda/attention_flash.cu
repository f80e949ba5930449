// Prefill attention with the fragments in registers (FlashAttention-2's
// loop on mma.sync m16n8k16) for head_dim 64 or 128 and every KV type the
// tensor-core kernels read (f16, fp8 e4m3, q8_0, q4_0, iq4_nl, bf16, q4_1,
// q5_0, q5_1: mma_tile.cuh kv_reads_as_f16; templated on the kv_types.cuh tag): one block per 64
// queries of one head, 4 warps of 16 query rows each. Each warp holds its
// Q fragments, its scores and its output accumulators in registers; K/V
// tiles of 64 keys are read from shared memory with ldmatrix (V
// transposed). The probabilities go from the score accumulators straight
// into the A fragments of P V.
// How the tiles get there: f16 KV comes through a two-stage cp.async ring
// of f16 tiles. Every other type comes through a two-stage cp.async ring
// of its raw bytes (a head is whole blocks: 136 bytes of q8_0 at 128, 72
// of q4_0 / iq4_nl, copied in 16-, 8- or 4-byte pieces as the head's size
// allows), converted to one f16 K and V tile in shared memory once a tile
// has landed (load8h: the same f16 values as the WMMA kernel's); so the
// copies stay a tile ahead of the products for every type, and shared
// memory is at most the f16 kernel's (at 128: f16 and q8_0 69,632 bytes,
// fp8 67,584, q4_0 / iq4_nl 53,248; Q borrows a K/V tile, see Layout), so
// three blocks share an SM (registers capped to allow it, kMinBlocks;
// ncu found two blocks of 4 warps latency-bound; bf16's raw heads are
// f16's bytes, so it takes 100,352 at 128 and two blocks). A type whose head is
// not a multiple of 4 bytes runs the WMMA kernel: q8_0h64's 66-byte head
// at head_dim 64 (at 128 its 132 bytes come here in 4-byte pieces);
// iq4_nlh64's 33- and 66-byte heads come here as aligned 16-byte spans
// (Layout::kSpan; not yet run on a GPU).
// Arithmetic as attention_mma.cu's WMMA kernel: q rounded to f16 before
// Q K^T, probabilities to f16 before P V (their f16 values summed into the
// denominator), scores and the online softmax in f32 (base 2, the scale
// folded in), so outputs differ from the f32 reference by ~1e-3 relative.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

constexpr int kBQ = 64, kBK = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

using detail::cp_async;
using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_one;
using detail::ldmatrix_x4;
using detail::load8h;
using detail::smem_addr;

template <typename KvT, int HD>
struct Layout {
  // f16 KV: cp.async straight into the f16 tiles; other types: staged raw.
  static constexpr bool kDirect = std::is_same_v<KvT, detail::KvF16>;
  static constexpr int kLd = HD + 8;  // halves per row: a 16-byte pad keeps ldmatrix free of bank conflicts
  static constexpr uint32_t kTile = sizeof(__half) * kBK * kLd;
  static constexpr uint32_t kKV = 0;  // direct: stage s: K at 2s, V at 2s + 1 (tiles); staged: K, then V (one stage)
  // Q ([kBQ][kLd], read into registers before the loop) borrows a tile no
  // copy writes before every warp has its fragments: stage 1's K (direct:
  // its copy is issued after a barrier that follows the fragments' loads),
  // or the f16 K tile (staged: converted after the loop's first barrier).
  static constexpr uint32_t kQ = kDirect ? kKV + 2 * kTile : kKV;
  static_assert(kBQ == kBK, "Q fills one tile");
  // Staged types: a head's bytes, the pieces they are copied in, and the
  // raw ring after the f16 tiles (stage s: K at 2s, V at 2s + 1).
  static constexpr int kHeadBytes = detail::kv_head_bytes<KvT>(HD);
  static constexpr int kPiece = kHeadBytes % 16 == 0 ? 16 : kHeadBytes % 8 == 0 ? 8 : 4;
  static constexpr int kRowPieces = kHeadBytes / kPiece;
  // kSpan (iq4_nlh64: 33-byte blocks, heads of 33 / 66 bytes at any byte /
  // any even byte): each raw head is copied as the aligned 16-byte words
  // from the one holding its first byte to the one holding its last (the
  // fast decode kernel's span copy), into a slot of kSlot bytes with room
  // for a lead of kMaxLead, the head at its address mod 16 there; the
  // copying threads note each key's lead (kLeads: a byte a key and stage,
  // after the raw tiles; K and V planes are 16-byte aligned, so one lead
  // serves both). Not yet run on a GPU.
  static constexpr bool kSpan = std::is_same_v<KvT, detail::KvIq4Nl64>;
  static constexpr int kHeadAlign = kHeadBytes % 16 == 0  ? 16
                                    : kHeadBytes % 8 == 0 ? 8
                                    : kHeadBytes % 4 == 0 ? 4
                                    : kHeadBytes % 2 == 0 ? 2
                                                          : 1;
  static constexpr int kSlot = kSpan ? (kHeadBytes + (16 - kHeadAlign) + 15) / 16 * 16 : kHeadBytes;
  static constexpr uint32_t kRawTile = (kBK * kSlot + 15) / 16 * 16;
  static constexpr uint32_t kRaw = kKV + 2 * kTile;
  static constexpr uint32_t kLeads = kRaw + 4 * kRawTile;  // [2 stages][kBK] (kSpan)
  static constexpr size_t kBytes =
      kDirect ? static_cast<size_t>(kKV) + 4 * kTile : static_cast<size_t>(kLeads) + (kSpan ? 2 * kBK : 0);
};

// Blocks per SM the registers are capped for: three at head_dim 128 (168
// registers a thread, a few spilled; shared memory, at most 69,632 bytes a
// block, allows three too), which hides more of a block's serial softmax
// than two; RILL_CUDA_FLASH_BLOCKS=2 takes the two-block build (up to 255
// registers), for comparisons. At 64: four (128 registers).
template <int HD>
constexpr int kMinBlocks = HD <= 64 ? 4 : 3;

// Whether the kernel takes tag KvT at head_dim HD (see the file comment).
template <typename KvT, int HD>
constexpr bool flash_takes() {
  if constexpr (!detail::kv_reads_as_f16<KvT>) {
    return false;
  } else {
    return HD % KvT::kBlock == 0 && (detail::kv_head_bytes<KvT>(HD) % 4 == 0 || Layout<KvT, HD>::kSpan) &&
           Layout<KvT, HD>::kBytes <= 113 * 1024;
  }
}

template <typename KvT, int HD, typename Out, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks) flash_prefill_kernel(AttentionArgs a) {
  using L = Layout<KvT, HD>;
  extern __shared__ __align__(128) uint8_t smem[];
  __half* qs = reinterpret_cast<__half*>(smem + L::kQ);
  const uint32_t kv_smem = smem_addr(smem + L::kKV);

  // The longest tiles (latest queries) first, over every head: blocks
  // start in x-fastest order, so a head-major grid (x the tile) started
  // the last head's longest tile near the end (a greedy schedule of 2,048
  // tokens' 32 tiles x 32 heads on 264 block slots ends 29% later than
  // longest-first across heads).
  const PrefillTile tile = a.tiles[gridDim.y - 1 - blockIdx.y];
  const int h = blockIdx.x, kvh = h / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t* table = a.block_tables + a.table_start[tile.seq];
  const int32_t p_first = a.pos[tile.t0], p_last = a.pos[tile.t0 + tile.n_q - 1];
  const int32_t k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;
  const int n_kv_tiles = (k_hi - k_lo + kBK - 1) / kBK;

  // Direct (f16): thread i copies 16-byte piece i % kVecs of keys i / kVecs
  // + m kKeyStep (m < kPieces) of each tile. Staged: thread i copies pieces
  // i % 4 + 4 u of the raw heads of keys i / 4 + 32 m (m < kPieces), kPiece
  // bytes each (at 136 bytes a q8_0 head, 17 pieces of 8: 4 threads read
  // 32 consecutive bytes of a row). A tile's block-table lookups are issued
  // a tile ahead of its copies (while the tile before is computed): their
  // latency hides behind the products. A warp's threads copy 16 keys of a
  // tile; lane i < 16 looks up one of them (key_of_lane) and the copy
  // takes each piece's row from its lane by a shuffle, so a thread holds
  // one row across the products rather than kPieces (registers: the
  // kernel is capped at 168 a thread, kMinBlocks).
  constexpr int kVecs = HD / 8;  // 16-byte f16 pieces per row
  constexpr int kPer = L::kDirect ? kVecs : 4;
  constexpr int kKeyStep = kThreads / kPer, kPieces = kBK / kKeyStep;
  static_assert(kThreads % kPer == 0 && kBK % kKeyStep == 0, "the copy loops below");
  const int my_vec = threadIdx.x % kPer, my_key = threadIdx.x / kPer;
  constexpr int kLaneKeys = 32 / kPer;  // keys of a warp per piece
  static_assert(kPer <= 32 && 32 % kPer == 0 && kLaneKeys * kPieces <= 32, "a warp's keys in its lanes");
  const int key_of_lane = warp * kLaneKeys + lane % kLaneKeys + kKeyStep * (lane / kLaneKeys);
  // The cache row of this lane's key of the next tile to copy (kNoRow: past
  // k_hi, or no key).
  constexpr uint32_t kNoRow = 0xffffffffu;
  uint32_t row = kNoRow;
  const int64_t row_elems = static_cast<int64_t>(a.n_head_kv) * HD;
  const int64_t row_bytes = KvT::row_bytes(row_elems);
  const int64_t head_byte = KvT::row_bytes(static_cast<int64_t>(kvh) * HD);  // the head's first byte in a row
  auto look_up = [&](int it) {
    const int32_t j = k_lo + it * kBK + key_of_lane;
    // (A negative row, a hole in the table, is no row either, as the
    // kernel before zero-filled it.)
    const int64_t r = lane < kLaneKeys * kPieces && j < k_hi ? detail::cache_row(a, table, j) : -1;
    row = r < 0 ? kNoRow : static_cast<uint32_t>(r);
  };
  // The row of this thread's key my_key + m kKeyStep.
  auto row_of = [&](int m) { return __shfl_sync(0xffffffffu, row, lane / kPer + kLaneKeys * m); };
  auto copy_tile = [&](int it) {
    if constexpr (L::kDirect) {
      const __half* kbase = static_cast<const __half*>(a.k_cache) + static_cast<int64_t>(kvh) * HD;
      const __half* vbase = static_cast<const __half*>(a.v_cache) + static_cast<int64_t>(kvh) * HD;
      const uint32_t ks = kv_smem + 2 * (it & 1) * L::kTile, vs = ks + L::kTile;
#pragma unroll
      for (int m = 0; m < kPieces; ++m) {
        const uint32_t off = static_cast<uint32_t>((my_key + m * kKeyStep) * L::kLd + my_vec * 8) * 2;
        const uint32_t r = row_of(m);
        const bool ok = r != kNoRow;
        const int64_t src = ok ? r * row_elems + my_vec * 8 : 0;
        cp_async16(ks + off, kbase + src, ok);
        cp_async16(vs + off, vbase + src, ok);
      }
    } else {
      const auto* kbase = static_cast<const uint8_t*>(a.k_cache);
      const auto* vbase = static_cast<const uint8_t*>(a.v_cache);
      const uint32_t ks = smem_addr(smem + L::kRaw) + 2 * (it & 1) * L::kRawTile, vs = ks + L::kRawTile;
      if constexpr (L::kSpan) {
        constexpr int kWords = L::kSlot / 16;
        uint8_t* leads = smem + L::kLeads + (it & 1) * kBK;
#pragma unroll
        for (int m = 0; m < kPieces; ++m) {
          const uint32_t r = row_of(m);
          const bool ok = r != kNoRow;
          const int64_t src = ok ? r * row_bytes + head_byte : 0;
          const int key = my_key + m * kKeyStep;
          // The planes are 16-byte aligned (flash_align), so the lead is the
          // same in K and V.
          const int lead = static_cast<int>(reinterpret_cast<uintptr_t>(kbase + src) & 15);
          if (my_vec == 0) leads[key] = static_cast<uint8_t>(lead);
#pragma unroll
          for (int u = 0; u < (kWords + kPer - 1) / kPer; ++u) {
            const int w = my_vec + u * kPer;
            if (w < kWords) {
              // The head's bytes in word w (none past its last: the last
              // head of a plane may end where its allocation does).
              const int n = ok ? max(0, min(16, lead + L::kHeadBytes - 16 * w)) : 0;
              const int64_t at = src - lead + 16 * w;
              const uint32_t dst = static_cast<uint32_t>(key * L::kSlot + 16 * w);
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ks + dst),
                           "l"(kbase + (n > 0 ? at : 0)), "r"(n)
                           : "memory");
              asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vs + dst),
                           "l"(vbase + (n > 0 ? at : 0)), "r"(n)
                           : "memory");
            }
          }
        }
        cp_async_commit();
        return;
      }
#pragma unroll
      for (int m = 0; m < kPieces; ++m) {
        const uint32_t r = row_of(m);
        const bool ok = r != kNoRow;
        const int64_t src = ok ? r * row_bytes + head_byte : 0;
        const uint32_t off = static_cast<uint32_t>((my_key + m * kKeyStep) * L::kHeadBytes);
#pragma unroll
        for (int u = 0; u < (L::kRowPieces + kPer - 1) / kPer; ++u) {
          const int p = my_vec + u * kPer;
          if (p < L::kRowPieces) {
            cp_async<L::kPiece>(ks + off + p * L::kPiece, kbase + src + p * L::kPiece, ok);
            cp_async<L::kPiece>(vs + off + p * L::kPiece, vbase + src + p * L::kPiece, ok);
          }
        }
      }
    }
    cp_async_commit();
  };
  // Staged types: the raw tile `it` (landed, visible to all) to f16 in the
  // one K/V stage; keys past k_hi as zeros. Loads issued kBatch at a time
  // before their stores (the compiler cannot move a shared load above a
  // shared store).
  auto convert_tile = [&](int it) {
    if constexpr (!L::kDirect) {
      const uint8_t* rk = smem + L::kRaw + 2 * (it & 1) * L::kRawTile;
      const uint8_t* rv = rk + L::kRawTile;
      __half* ks = reinterpret_cast<__half*>(smem + L::kKV);
      __half* vs = ks + kBK * L::kLd;
      const int32_t n_keys = k_hi - (k_lo + it * kBK);
      constexpr int kEach = kBK * kVecs / kThreads, kBatch = 4;
      static_assert(kEach % kBatch == 0, "whole batches");
#pragma unroll
      for (int u0 = 0; u0 < kEach; u0 += kBatch) {
        uint4 kx[kBatch], vx[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = threadIdx.x + (u0 + u) * kThreads, key = i / kVecs, v = i % kVecs;
          kx[u] = vx[u] = make_uint4(0, 0, 0, 0);
          if (key < n_keys) {
            // kSpan: the head at its lead in its slot.
            const int at = key * L::kSlot + (L::kSpan ? smem[L::kLeads + (it & 1) * kBK + key] : 0);
            kx[u] = load8h<KvT>(rk + at, v * 8);
            vx[u] = load8h<KvT>(rv + at, v * 8);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = threadIdx.x + (u0 + u) * kThreads, key = i / kVecs, v = i % kVecs;
          *reinterpret_cast<uint4*>(ks + key * L::kLd + v * 8) = kx[u];
          *reinterpret_cast<uint4*>(vs + key * L::kLd + v * 8) = vx[u];
        }
      }
    }
  };
  look_up(0);
  copy_tile(0);
  if (n_kv_tiles > 1) look_up(1);

  // Q rounded to f16, rows past n_q zero; float4 loads issued together
  // where q's rows allow them.
  const float* q_tile = a.q + static_cast<int64_t>(tile.t0) * a.q_stride + static_cast<int64_t>(h) * HD;
  if (a.q_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
    constexpr int kQuads = kBQ * HD / 4 / kThreads;
    float4 qv[kQuads];
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int i = (threadIdx.x + u * kThreads) * 4, r = i / HD, d = i % HD;
      qv[u] = r < tile.n_q ? *reinterpret_cast<const float4*>(q_tile + static_cast<int64_t>(r) * a.q_stride + d)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int i = (threadIdx.x + u * kThreads) * 4, r = i / HD, d = i % HD;
      __half2* dst = reinterpret_cast<__half2*>(qs + r * L::kLd + d);
      dst[0] = __floats2half2_rn(qv[u].x, qv[u].y);
      dst[1] = __floats2half2_rn(qv[u].z, qv[u].w);
    }
  } else {
    for (int i = threadIdx.x; i < kBQ * HD; i += kThreads) {
      const int r = i / HD, d = i % HD;
      qs[r * L::kLd + d] = __float2half_rn(r < tile.n_q ? q_tile[static_cast<int64_t>(r) * a.q_stride + d] : 0.0f);
    }
  }
  __syncthreads();
  // This warp's Q as A fragments: rows warp * 16 + [0, 16), HD / 16 chunks.
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = k * 16 + (lane >> 4) * 8;
    ldmatrix_x4(qf[k], smem_addr(qs + row * L::kLd + col));
  }
  if constexpr (L::kDirect) __syncthreads();  // Q's tile is stage 1's K: free once every warp has its fragments

  // This lane's two rows (fragment rows lane / 4 and lane / 4 + 8).
  const bool warp_active = warp * 16 < tile.n_q;
  int32_t p_row[2], lo_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + (lane >> 2) + 8 * r;
    p_row[r] = row < tile.n_q ? a.pos[tile.t0 + row] : -1;
    lo_row[r] = a.window > 0 ? max(0, p_row[r] - a.window + 1) : 0;
  }
  const int32_t warp_last = warp_active ? a.pos[tile.t0 + min(tile.n_q - 1, warp * 16 + 15)] : -1;
  const int32_t warp_lo = a.window > 0 && warp_active ? max(0, a.pos[tile.t0 + warp * 16] - a.window + 1) : 0;

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in log2 units; l this lane's part of the row's sum

  for (int it = 0; it < n_kv_tiles; ++it) {
    if (it + 1 < n_kv_tiles) {
      copy_tile(it + 1);
      if (it + 2 < n_kv_tiles) look_up(it + 2);
    } else {
      cp_async_commit();  // an empty group: the wait below stays "all but the newest"
    }
    cp_async_wait_one();
    __syncthreads();
    if constexpr (!L::kDirect) {
      convert_tile(it);
      __syncthreads();
    }
    const int32_t kc = k_lo + it * kBK;
    if (warp_active && kc <= warp_last && kc + kBK > warp_lo) {
      const uint32_t ks = kv_smem + (L::kDirect ? 2 * (it & 1) * L::kTile : 0), vs = ks + L::kTile;
      // S = Q K^T: 16 rows x 64 keys, 8 fragments of 8 keys.
      float s[kBK / 8][4];
      detail::warp_qk<HD, kBK>(s, qf, ks, L::kLd);
      // Scale, softcap, mask; the rows' maxima over the 4 lanes sharing a row.
      // A tile every key of which every row of the warp sees (all but the
      // diagonal's and a window's edge) skips the mask: the same values.
      float mx[2] = {-INFINITY, -INFINITY};
      auto scale_mask = [&](auto masked) {
#pragma unroll
        for (int n = 0; n < kBK / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            float x = s[n][e] * a.scale;
            if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
            if constexpr (decltype(masked)::value) {
              const int32_t j = kc + n * 8 + (lane & 3) * 2 + (e & 1);
              const bool ok = j < k_hi && j <= p_row[r] && j >= lo_row[r];
              s[n][e] = ok ? x * kLog2e : -INFINITY;
            } else {
              s[n][e] = x * kLog2e;
            }
            mx[r] = fmaxf(mx[r], s[n][e]);
          }
        }
      };
      const bool full = __all_sync(
          0xffffffffu, kc + kBK <= k_hi && kc + kBK - 1 <= min(p_row[0], p_row[1]) && kc >= max(lo_row[0], lo_row[1]));
      if (full) {
        scale_mask(std::false_type{});
      } else {
        scale_mask(std::true_type{});
      }
      float base[2], corr[2];
      detail::warp_softmax_step(mx, m, l, base, corr);
      // Where no row's maximum moved (every corr 1: most tiles past the
      // first few), the rescale is x * 1 and is skipped: the same bits.
      if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          o[n][0] *= corr[0];
          o[n][1] *= corr[0];
          o[n][2] *= corr[1];
          o[n][3] *= corr[1];
        }
      }
      // O += P V, P straight from the score fragments.
      detail::warp_pv<HD, kBK>(o, s, base, l, vs, L::kLd);
    }
    __syncthreads();  // this stage is free for the load two tiles on
  }
  if (!warp_active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = warp * 16 + (lane >> 2) + 8 * r;
    if (row >= tile.n_q) continue;
    float scale = 1.0f;
    if (a.sinks) scale = detail::add_sink(a.sinks[h], m[r] / kLog2e, l[r]);  // the sink joins the denominator
    scale = l[r] > 0.0f ? scale / l[r] : 0.0f;
    Out* out =
        static_cast<Out*>(a.out) + static_cast<int64_t>(tile.t0 + row) * a.n_head * HD + static_cast<int64_t>(h) * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + (lane & 3) * 2;
      out[d] = detail::from_f32<Out>(o[n][2 * r] * scale);
      out[d + 1] = detail::from_f32<Out>(o[n][2 * r + 1] * scale);
    }
  }
}

template <typename KvT, int HD, typename Out, int kBlocks>
void launch_blocks(const AttentionArgs& a, cudaStream_t stream) {
  using L = Layout<KvT, HD>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(flash_prefill_kernel<KvT, HD, Out, kBlocks>), L::kBytes,
                /*max_shared=*/true);
  // The tiles along y (at most 65,535 a launch).
  constexpr int32_t kMaxY = 65535;
  for (int32_t first = 0; first < a.n_tiles; first += kMaxY) {
    AttentionArgs part = a;
    part.tiles = a.tiles + first;
    part.n_tiles = std::min(kMaxY, a.n_tiles - first);
    const dim3 grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(part.n_tiles));
    flash_prefill_kernel<KvT, HD, Out, kBlocks><<<grid, kThreads, L::kBytes, stream>>>(part);
    RILL_CUDA_CHECK_LAUNCH();
  }
}

template <typename KvT, int HD, typename Out>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  static const bool two = [] {
    const char* env = std::getenv("RILL_CUDA_FLASH_BLOCKS");
    return env && std::string(env) == "2";
  }();
  if constexpr (HD == 128) {
    if (two) return launch_blocks<KvT, HD, Out, 2>(a, stream);
  }
  launch_blocks<KvT, HD, Out, kMinBlocks<HD>>(a, stream);
}

// Alignment the kernel needs of the cache planes: the pieces' (a row is
// whole heads, so every head then starts on a piece).
template <typename KvT, int HD>
constexpr uintptr_t flash_align() {
  if constexpr (flash_takes<KvT, HD>()) {
    return Layout<KvT, HD>::kDirect || Layout<KvT, HD>::kSpan ? 16 : static_cast<uintptr_t>(Layout<KvT, HD>::kPiece);
  } else {
    return 0;
  }
}

// a's head_dim (64 or 128) for tag KvT; a type the kernel does not take
// (flash_takes) launches nothing: prefill_flash_supported refuses it first.
template <typename KvT>
void launch_kv(const AttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim == 64) {
    if constexpr (flash_takes<KvT, 64>()) RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 64, T>(a, stream));
  } else {
    if constexpr (flash_takes<KvT, 128>()) RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 128, T>(a, stream));
  }
}

}  // namespace

bool prefill_flash_supported(const AttentionArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128) return false;
  uintptr_t align = 0;
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, align = a.head_dim == 64 ? flash_align<KvT, 64>() : flash_align<KvT, 128>());
  return align > 0 && reinterpret_cast<uintptr_t>(a.k_cache) % align == 0 &&
         reinterpret_cast<uintptr_t>(a.v_cache) % align == 0;
}

void prefill_attention_flash(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return;
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, launch_kv<KvT>(a, stream));
}

}  // namespace rill::cuda
