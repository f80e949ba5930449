// Split-KV decode attention on the tensor cores for the quantized KV types
// (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl and fp8 e4m3; head_dim 64 or 128;
// 1, 2, 4 or 8 q heads per KV head). Why: the fast decode kernel
// (attention_decode.cu) converts each element to f32 and spends 2 kG
// multiply-adds a lane on it; with half or a quarter of f16's bytes that
// arithmetic, not the bytes, bounded it (docs/perf.md: q8_0 at 0.82x f16's
// attention time at batch 64, fp8 no faster than f16). Here a warp takes 16
// keys a round and both products are mma.sync m16n8k16 with the GQA
// group's kG heads as the A rows (rows kG..15 zero): S = Q K^T is 2 x HD / 16
// MMAs, O += P V HD / 8.
//
// Fragments come straight from the raw heads in shared memory (no f16
// tile): lane (c, r) = (lane % 4, lane / 4)
//  - for S: K of keys r and r + 8 of the round, dims [c HD / 4, (c + 1) HD / 4)
//    (load8h: 8 f16 values a call), the MMA's contraction order permuted
//    alike in Q's fragments (k-step j, B rows 2c, 2c + 1 / 2c + 8, 2c + 9
//    are dims c HD / 4 + 4 j + 0, 1 / 2, 3), so each lane reads whole
//    blocks of its keys;
//  - for P V: V of keys 2c, 2c + 1, 2c + 8, 2c + 9 (P's columns as the
//    score fragments hold them), dims [r HD / 8, (r + 1) HD / 8): n-tile t's
//    column r is dim r HD / 8 + t, so the output fragment o[t][e] of head r
//    is dim (2c + e) HD / 8 + t.
// Rounds stream through a ring of kStages stages a warp (cp.async of the
// heads' 16/8/4-byte words, as the fast kernel's block path copies them).
//
// Arithmetic as the tensor-core prefill (attention_flash.cu): q rounded to
// f16, K and V as load8h gives them (a block's scale x level rounded to f16
// once), probabilities rounded to f16 before P V (their f16 values summed
// into the denominator), scores and the online softmax in f32 (base 2, the
// scale folded in). So outputs differ from f32 attention over the same
// values by ~1e-3 relative (tests/cuda/cuda_attention_test.cpp), as prefill
// rows do. The split rule, the partials and the in-kernel merge are the fast
// kernel's, and the block shape does not depend on the batch: a token's
// bits depend on its own keys alone. RILL_DECODE_MMA=0 in the environment
// sends these types back to the fast kernel (comparisons); this one is the
// default (kDefaultOn).
#include <cuda_fp16.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/flash_warp.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using detail::cp_async;
using detail::load8h;
using detail::smem_addr;

constexpr int kW = 2;      // warps a block
constexpr int kKeys = 16;  // keys a warp's round
// Rounds in flight per warp (kStages) and the blocks an SM the registers
// are capped for (kBlocksSm), two shapes:
//  - Occ6: 4 stages, 6 blocks. Shared memory fits 6 of them at q8_0's
//    head_dim 128 up to a group of 4 (about 37 KB each; 8 a group: 40 KB,
//    5 fit); 141-165 registers, no spills. ncu on the H100 (q8_0, 8,192
//    keys x 64): 18% achieved occupancy, 6.7 cycles a warp instruction,
//    DRAM at 51%: latency bound.
//  - Occ8: 3 stages, 8 blocks (27 KB each; 128 registers, spills of 10-46
//    bytes in some instantiations): a third more warps an SM.
// The shape changes no arithmetic: the same bits (tested).
// RILL_DECODE_MMA_OCC=8 takes Occ8.
struct Occ6 {
  static constexpr int kStages = 4, kBlocksSm = 6;
};
struct Occ8 {
  static constexpr int kStages = 3, kBlocksSm = 8;
};
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Whether the kernel takes tag KvT at head_dim HD: the types load8h reads
// whose heads are whole 4-byte words (the blocks of 64, whose heads start
// at any byte, stay on the fast kernel's span copy), not f16 / bf16 / f32
// (their decode keeps f32 q and products on the fast kernel).
template <typename KvT, int HD>
constexpr bool mma_takes() {
  if constexpr (std::is_same_v<KvT, detail::KvF16> || std::is_same_v<KvT, detail::KvBf16> ||
                std::is_same_v<KvT, detail::KvF32> || std::is_same_v<KvT, detail::KvQ8_0x64> ||
                std::is_same_v<KvT, detail::KvIq4Nl64> || !detail::kv_reads_as_f16<KvT>) {
    return false;
  } else {
    return (HD == 64 || HD == 128) && HD % KvT::kBlock == 0 && detail::kv_head_bytes<KvT>(HD) % 4 == 0;
  }
}

template <typename KvT, int HD, int kStages>
struct Ring {
  static constexpr int kHeadBytes = detail::kv_head_bytes<KvT>(HD);
  static constexpr int kWord = kHeadBytes % 16 == 0 ? 16 : kHeadBytes % 8 == 0 ? 8 : 4;
  static constexpr int kWords = kHeadBytes / kWord;
  // A stage: the round's K heads [kKeys][kHeadBytes], then its V heads.
  static constexpr int kStageBytes = (2 * kKeys * kHeadBytes + 15) / 16 * 16;
  static constexpr int kKDims = HD / 4;  // K dims a lane holds of each of its keys
  static constexpr int kVDims = HD / 8;  // V dims a lane holds of each of its keys
  // The warps' rings, or after the rounds their accumulators [kW][kG][HD].
  template <int kG>
  static constexpr size_t smem_bytes() {
    const size_t ring = static_cast<size_t>(kW) * kStages * kStageBytes, acc = sizeof(float) * kW * kG * HD;
    return ring > acc ? ring : acc;
  }
};

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  return *reinterpret_cast<const __half2*>(&u);
}

template <typename KvT, int HD, int kG, typename Occ>
__global__ void __launch_bounds__(kW * 32, Occ::kBlocksSm) decode_mma_kernel(AttentionArgs a, bool prefetch) {
  constexpr int kStages = Occ::kStages;
  using R = Ring<KvT, HD, kStages>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int32_t rows_s[kSplitKeys];
  __shared__ float m_s[kW][kG], l_s[kW][kG];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c = lane & 3, r = lane >> 2;
  const int kvh = blockIdx.x, split = blockIdx.y, z = blockIdx.z;

  const detail::DecodeSplit ds = detail::decode_split(a, z, split);
  const int32_t t = ds.t, n_splits = ds.n_splits, k_begin = ds.k_begin, k_end = ds.k_end;
  if (split >= n_splits) {
    detail::pdl_wait();
    return;
  }
  const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
  const int64_t row_bytes = static_cast<int64_t>(a.n_head_kv) * R::kHeadBytes;
  const auto* kbytes = static_cast<const uint8_t*>(a.k_cache) + static_cast<int64_t>(kvh) * R::kHeadBytes;
  const auto* vbytes = static_cast<const uint8_t*>(a.v_cache) + static_cast<int64_t>(kvh) * R::kHeadBytes;
  uint8_t* ring = smem + static_cast<size_t>(warp) * kStages * R::kStageBytes;

  uint32_t qa[HD / 16][2];  // this lane's Q A-fragments a0 / a2 (rows r < kG; a1 / a3, rows r + 8, are zero)
  float o[HD / 8][4];       // the output fragments (rows r + 8 stay zero)
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // row r's (log2 units; l this lane's share)
  bool waited = false;
  for (int32_t c0 = k_begin; c0 < k_end; c0 += kSplitKeys) {
    const int nc = min(kSplitKeys, k_end - c0);
    for (int jj = threadIdx.x; jj < nc; jj += kW * 32) {
      const int64_t row = detail::cache_row(a, table, c0 + jj);
      rows_s[jj] = static_cast<int32_t>(row);
      if (prefetch) {  // into L2 before the wait: small grids (see attention_decode.cu)
#pragma unroll
        for (int li = 0; li < (R::kHeadBytes + 127) / 128 + 1; ++li) {
          const int at = min(128 * li, R::kHeadBytes - 1);
          asm volatile("prefetch.global.L2 [%0];" ::"l"(kbytes + row * row_bytes + at));
          asm volatile("prefetch.global.L2 [%0];" ::"l"(vbytes + row * row_bytes + at));
        }
      }
    }
    if (!waited) {  // q and this step's K/V rows come from the preceding kernel
      detail::pdl_wait();
      detail::pdl_trigger();
      waited = true;
      const float* qp =
          a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(kvh * kG + r) * HD + c * R::kKDims;
#pragma unroll
      for (int j = 0; j < HD / 16; ++j) {
        const float4 v = r < kG ? *reinterpret_cast<const float4*>(qp + 4 * j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        qa[j][0] = half2_bits(__floats2half2_rn(v.x, v.y));
        qa[j][1] = half2_bits(__floats2half2_rn(v.z, v.w));
      }
    }
    __syncthreads();
    const int n_rounds = (nc + kKeys - 1) / kKeys;
    const int my_rounds = n_rounds > warp ? (n_rounds - warp + kW - 1) / kW : 0;
    // Round k of this warp: keys (warp + k kW) kKeys + [0, 16) of the chunk,
    // through stage k % kStages, copied word by word by the whole warp.
    auto issue = [&](int k) {
      const int round0 = (warp + k * kW) * kKeys;
      const uint32_t st = smem_addr(ring + (k % kStages) * R::kStageBytes);
      constexpr int kAll = kKeys * R::kWords;
#pragma unroll
      for (int w0 = 0; w0 < kAll; w0 += 32) {
        const int w = w0 + lane;
        if (kAll % 32 == 0 || w < kAll) {
          const int key = w / R::kWords, word = w % R::kWords, jj = round0 + key;
          const bool ok = jj < nc;
          const int64_t off = ok ? static_cast<int64_t>(rows_s[jj]) * row_bytes + word * R::kWord : 0;
          const uint32_t dst = st + static_cast<uint32_t>(key * R::kHeadBytes + word * R::kWord);
          cp_async<R::kWord>(dst, kbytes + off, ok);
          cp_async<R::kWord>(dst + kKeys * R::kHeadBytes, vbytes + off, ok);
        }
      }
    };
#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) {
      if (k < my_rounds) issue(k);
      detail::cp_async_commit();
    }
    for (int k = 0; k < my_rounds; ++k) {
      __syncwarp();  // every lane is done reading the stage issue() refills
      if (k + kStages - 1 < my_rounds) issue(k + kStages - 1);
      detail::cp_async_commit();
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");  // round k's copies (this lane's)
      __syncwarp();                                                           // and every lane's
      const uint8_t* ks = ring + (k % kStages) * R::kStageBytes;
      const uint8_t* vs = ks + kKeys * R::kHeadBytes;
      const int round0 = (warp + k * kW) * kKeys;

      // S = Q K^T: n-tile nt holds keys nt 8 + [0, 8); this lane's B
      // columns are key nt 8 + r.
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint8_t* kh = ks + (nt * 8 + r) * R::kHeadBytes;
#pragma unroll
        for (int u = 0; u < R::kKDims / 8; ++u) {
          const uint4 h = load8h<KvT>(kh, c * R::kKDims + 8 * u);
          mma_m16n8k16<__half>(s[nt], qa[2 * u][0], 0u, qa[2 * u][1], 0u, h.x, h.y);
          mma_m16n8k16<__half>(s[nt], qa[2 * u + 1][0], 0u, qa[2 * u + 1][1], 0u, h.z, h.w);
        }
      }
      // Row r's scores (keys nt 8 + 2c + e): scale, softcap, mask; the max
      // over its 4 lanes. Rows r + 8 have none (-inf: their step is inert).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = detail::softcap_score(s[nt][e] * a.scale, a.softcap) * kLog2e;
          s[nt][e] = round0 + nt * 8 + 2 * c + e < nc ? x : -INFINITY;
          mx[0] = fmaxf(mx[0], s[nt][e]);
        }
      }
      float base[2], corr[2];
      detail::warp_softmax_step(mx, m, l, base, corr);
      if (__any_sync(0xffffffffu, corr[0] != 1.0f)) {  // the max moved for some head: rescale
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          o[n][0] *= corr[0];
          o[n][1] *= corr[0];
        }
      }
      // P as the A fragment of P V (keys 2c, 2c + 1 and 2c + 8, 2c + 9).
      const uint32_t pa0 = detail::pack_half2(exp2f(s[0][0] - base[0]), exp2f(s[0][1] - base[0]), l[0]);
      const uint32_t pa2 = detail::pack_half2(exp2f(s[1][0] - base[0]), exp2f(s[1][1] - base[0]), l[0]);
      // V's B fragments: keys 2c, 2c + 1 (b0) and 2c + 8, 2c + 9 (b1) at dim
      // r kVDims + n for n-tile n: each pair of dims a load8h half2 gives
      // makes two n-tiles (low halves, high halves).
#pragma unroll
      for (int u = 0; u < R::kVDims / 8; ++u) {
        const int e0 = r * R::kVDims + 8 * u;
        const uint4 v0 = load8h<KvT>(vs + (2 * c) * R::kHeadBytes, e0);
        const uint4 v1 = load8h<KvT>(vs + (2 * c + 1) * R::kHeadBytes, e0);
        const uint4 v2 = load8h<KvT>(vs + (2 * c + 8) * R::kHeadBytes, e0);
        const uint4 v3 = load8h<KvT>(vs + (2 * c + 9) * R::kHeadBytes, e0);
        const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w}, w1[4] = {v1.x, v1.y, v1.z, v1.w};
        const uint32_t w2[4] = {v2.x, v2.y, v2.z, v2.w}, w3[4] = {v3.x, v3.y, v3.z, v3.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = 8 * u + 2 * i;
          mma_m16n8k16<__half>(o[n], pa0, 0u, pa2, 0u, half2_bits(__lows2half2(as_half2(w0[i]), as_half2(w1[i]))),
                               half2_bits(__lows2half2(as_half2(w2[i]), as_half2(w3[i]))));
          mma_m16n8k16<__half>(o[n + 1], pa0, 0u, pa2, 0u, half2_bits(__highs2half2(as_half2(w0[i]), as_half2(w1[i]))),
                               half2_bits(__highs2half2(as_half2(w2[i]), as_half2(w3[i]))));
        }
      }
    }
    __syncthreads();  // rows_s and the rings are reused by the next pass (and the merge)
  }
  if (!waited) {  // an empty split (all its keys before the window)
    detail::pdl_wait();
    detail::pdl_trigger();
  }
  // Row r's sum over its 4 lanes; the warps meet in shared memory.
  l[0] += __shfl_xor_sync(0xffffffffu, l[0], 1);
  l[0] += __shfl_xor_sync(0xffffffffu, l[0], 2);
  auto acc_s = reinterpret_cast<float(*)[kG][HD]>(smem);  // [kW][kG][HD]
  if (r < kG) {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      acc_s[warp][r][(2 * c) * R::kVDims + n] = o[n][0];
      acc_s[warp][r][(2 * c + 1) * R::kVDims + n] = o[n][1];
    }
    if (c == 0) {
      m_s[warp][r] = m[0] * kLn2;  // natural units, as the partials and merge_heads use
      l_s[warp][r] = l[0];
    }
  }
  __syncthreads();
  detail::combine_warps<kG, HD, kW>(a, acc_s, m_s, l_s, z, t, kvh, split, n_splits);
}

template <typename KvT, int HD, int kG, typename Occ>
void launch(const AttentionArgs& a, dim3 grid, bool prefetch, cudaStream_t stream) {
  constexpr size_t smem = Ring<KvT, HD, Occ::kStages>::template smem_bytes<kG>();
  static SmemOptIn opt_in;
  // Occ::kBlocksSm blocks an SM fit only with the largest shared-memory carveout.
  opt_in.ensure(reinterpret_cast<const void*>(decode_mma_kernel<KvT, HD, kG, Occ>), smem, true);
  launch_pdl(decode_mma_kernel<KvT, HD, kG, Occ>, grid, kW * 32, smem, stream, a, prefetch);
}

template <typename KvT, int HD, typename Occ>
void launch_group(const AttentionArgs& a, dim3 grid, bool prefetch, cudaStream_t stream) {
  if constexpr (mma_takes<KvT, HD>()) {
    switch (a.n_head / a.n_head_kv) {
      case 1:
        return launch<KvT, HD, 1, Occ>(a, grid, prefetch, stream);
      case 2:
        return launch<KvT, HD, 2, Occ>(a, grid, prefetch, stream);
      case 4:
        return launch<KvT, HD, 4, Occ>(a, grid, prefetch, stream);
      default:
        return launch<KvT, HD, 8, Occ>(a, grid, prefetch, stream);
    }
  }
}

template <typename Occ>
void launch_occ(const AttentionArgs& a, dim3 grid, bool prefetch, cudaStream_t stream) {
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, a.head_dim == 64 ? launch_group<KvT, 64, Occ>(a, grid, prefetch, stream)
                                                     : launch_group<KvT, 128, Occ>(a, grid, prefetch, stream));
}

// RILL_DECODE_MMA: 1 takes the kernel, 0 leaves these types on the fast
// kernel; unset: kDefaultOn.
// On since its first GPU run (H100, 2026-12-07): every attention, KV-type,
// batch-invariance, tier and HF-golden test passed with it, and at batch 64
// it took q8_0's decode attention at 4k from 483 to 378 us a layer
// (docs/perf.md).
constexpr bool kDefaultOn = true;
bool env_decode_mma() {
  static const bool on = [] {
    const char* v = std::getenv("RILL_DECODE_MMA");
    if (v == nullptr || *v == '\0') return kDefaultOn;
    return std::strcmp(v, "0") != 0;
  }();
  return on;
}
std::atomic<int> g_forced{-1};  // force_decode_mma's choice; -1: none
bool decode_mma_on() {
  const int f = g_forced.load(std::memory_order_relaxed);
  return f >= 0 ? f != 0 : env_decode_mma();
}
std::atomic<int> g_forced_blocks{0};  // force_decode_mma_blocks' choice; 0: none
bool occ8() {
  static const bool env = [] {
    const char* v = std::getenv("RILL_DECODE_MMA_OCC");
    return v != nullptr && std::strcmp(v, "8") == 0;
  }();
  const int f = g_forced_blocks.load(std::memory_order_relaxed);
  return f != 0 ? f == 8 : env;
}

}  // namespace

bool decode_mma_takes(DType kv_dtype, int32_t head_dim, int32_t group) {
  if (!decode_mma_on() || (group != 1 && group != 2 && group != 4 && group != 8)) return false;
  bool takes = false;
  RILL_CUDA_DISPATCH_KV(kv_dtype, takes = head_dim == 64    ? mma_takes<KvT, 64>()
                                          : head_dim == 128 ? mma_takes<KvT, 128>()
                                                            : false);
  return takes;
}

void force_decode_mma(int on) {
  g_forced.store(on < 0 ? -1 : on != 0 ? 1 : 0, std::memory_order_relaxed);
}

void force_decode_mma_blocks(int blocks_per_sm) {
  g_forced_blocks.store(blocks_per_sm == 6 || blocks_per_sm == 8 ? blocks_per_sm : 0, std::memory_order_relaxed);
}

void decode_attention_mma(const AttentionArgs& a, int32_t n_splits_grid, bool prefetch, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_splits_grid),
                  static_cast<unsigned>(a.n_decode));
  if (occ8()) {
    launch_occ<Occ8>(a, grid, prefetch, stream);
  } else {
    launch_occ<Occ6>(a, grid, prefetch, stream);
  }
}

}  // namespace rill::cuda
