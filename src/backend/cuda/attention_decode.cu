// Split-KV decode attention for the common caches. One block of 8 warps per
// (decode token, KV head, split); a split holds up to kSplitKeys keys, so a
// short context is one block per KV head that writes the output itself (no
// partials, no combine kernel). Grids too large to be resident at once in
// 8-warp blocks (large batches) take blocks of 4 or 2 warps for f16, bf16
// and fp8 KV (launch_one; decode_attention_fast's `warps`).
//
// Latency, not bandwidth, bounds decode attention at small batches, so:
//  - the step metadata and block table (uploaded before the step's first
//    kernel) are read, and every K/V row of the split is prefetched into
//    L2, before waiting for the preceding kernel (rope_store_kv, which
//    writes q and the step's own K/V rows): the lookups and most of the
//    DRAM latency overlap that kernel;
//  - the prefetch happens only for grids that fit on the GPU at once in
//    8-warp blocks (small batches); at large batches the lines would be
//    evicted before use (prefetching the resident grids of 4- and 2-warp
//    blocks too was slower at batch 64 and 128: docs/perf.md, dec23);
//  - each warp streams its rounds (8 keys for f16 KV, head_dim 128) through
//    a ring of kStages shared-memory stages with cp.async (3; 5 for fp8 and
//    block KV, whose stages are half the bytes: the same bytes of shared
//    memory keep more rows in flight): the loads of the
//    next kStages - 1 rounds are in flight while it computes one, so a warp
//    pays about one memory latency per split, not one per round. Each lane
//    reads back only the 16-byte pieces it copied itself (no barrier).
// Layout of a round: a K/V row is kL lanes of 16-byte loads (kL = head_dim /
// elements per 16 bytes; fp8 KV: 8-byte loads, 8 elements, so its lanes
// hold as many elements as f16's and the kernel's registers are f16's), so
// one warp-wide load covers kR = 32 / kL rows.
// Block KV (q8_0, q4_0, iq4_nl: GGML's 34 / 18-byte blocks; q4_1's 20,
// q5_0's 22, q5_1's 24; q8_0h64's 66, iq4_nlh64's 33,
// backend/cuda/kv_types.cuh) cannot be cut into aligned 8-element pieces,
// so its rounds copy whole heads instead: the warp's lanes copy the round's
// K and V heads (kHeadBytes each, 16/8/4-byte words: a head's blocks start
// at a multiple of the word; q8_0h64 / iq4_nlh64: each head's aligned 16-byte span,
// Shape::kSpan) into the stage, the warp synchronizes, and lane (rr, c) converts its 8
// elements from shared memory (KvT::load8: scale x level in f32, the CPU's
// values). The lanes and registers are then f16's.
// Lane (rr, c) holds elements [c * kE, (c + 1) * kE) of its q heads and
// accumulators and scores rows rr, rr + kR, ... of the round; a score is a
// sum over the kL lanes of its row (shuffles), the softmax max is shared by
// the warp, and l and the output accumulators stay per-lane partials until
// the end. The 8 warps' (m, l, acc) meet in shared memory in warp order.
// Scores, softmax and sums are f32 (the contract in ops.h; the kOwn path
// below takes exp2 of log2(e)-scaled scores, within an ulp or two of expf);
// the order of every sum depends only on the sequence length, never on the
// batch.
#include <cuda_fp8.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using detail::cache_row;
using detail::partial_at;
using detail::softcap_score;
using detail::splits_for;
using detail::store_out;

constexpr int kWarps = 8;
constexpr int kChunkKeys = kSplitKeys;        // cache rows staged in shared memory per pass
constexpr unsigned kPrefetchMaxBlocks = 264;  // 2 blocks per SM on an H200: every block resident at once
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Whether KV is a block type's tag (its rows are blocks, not elements).
template <typename KV>
inline constexpr bool kIsBlocks =
    std::is_same_v<KV, detail::KvQ8_0> || std::is_same_v<KV, detail::KvQ4_0> || std::is_same_v<KV, detail::KvIq4Nl> ||
    std::is_same_v<KV, detail::KvQ8_0x64> || std::is_same_v<KV, detail::KvIq4Nl64> ||
    std::is_same_v<KV, detail::KvQ4_1> || std::is_same_v<KV, detail::KvQ5_0> || std::is_same_v<KV, detail::KvQ5_1>;
// Block types whose heads are copied as aligned 16-byte spans (Shape::kSpan).
template <typename KV>
inline constexpr bool kSpanCopy = std::is_same_v<KV, detail::KvQ8_0x64> || std::is_same_v<KV, detail::KvIq4Nl64>;

// Bytes of one head of kHd elements.
template <typename KV, int kHd>
constexpr int head_bytes() {
  if constexpr (kIsBlocks<KV>) {
    return kHd / KV::kBlock * KV::kBlockBytes;
  } else {
    return kHd * static_cast<int>(sizeof(KV));
  }
}

template <typename KV, int kHd, int kG>
struct Shape {
  static constexpr bool kBlocks = kIsBlocks<KV>;
  static constexpr int kHeadBytes = head_bytes<KV, kHd>();
  // kSpan (q8_0h64: 66-byte blocks, so a head starts at any even byte and
  // its own words would be 2 or 4 bytes; iq4_nlh64: 33-byte blocks, a head
  // of 64 at any byte): each head is copied as the
  // aligned 16-byte words from the one holding its first byte through the
  // one holding its last, words past the head zero-filled; the head then
  // sits at its address mod 16 (`lead`) in a slot of kSlotBytes (room for
  // a lead of kMaxLead: 14 for q8_0h64; iq4_nlh64's heads start at
  // multiples of the largest power of two (<= 16) dividing kHeadBytes, so
  // 16 less that). A head of 128 is 10 copies instead of 33.
  static constexpr bool kSpan = kSpanCopy<KV>;
  static constexpr int kHeadAlign = kHeadBytes % 16 == 0  ? 16
                                    : kHeadBytes % 8 == 0 ? 8
                                    : kHeadBytes % 4 == 0 ? 4
                                    : kHeadBytes % 2 == 0 ? 2
                                                          : 1;
  static constexpr int kMaxLead = std::is_same_v<KV, detail::KvQ8_0x64> ? 14 : 16 - kHeadAlign;
  static constexpr int kSlotBytes = kSpan ? (kHeadBytes + kMaxLead + 15) / 16 * 16 : kHeadBytes;
  // Block types: the word of the heads' copies (a head starts at a multiple of it).
  static constexpr int kWordBytes = kSpan || kHeadBytes % 16 == 0 ? 16 : kHeadBytes % 8 == 0 ? 8 : 4;
  static constexpr int kWords = kSlotBytes / kWordBytes;
  static constexpr int kLoadBytes = kBlocks ? 16 : sizeof(KV) == 1 ? 8 : 16;  // bytes per lane per load (elements)
  static constexpr int kE = kBlocks ? 8 : kLoadBytes / static_cast<int>(sizeof(KV));  // elements per lane per row
  using Piece = std::conditional_t<kLoadBytes == 16, uint4, uint2>;
  static constexpr int kL = kHd / kE;  // lanes per row
  static constexpr int kR = 32 / kL;   // rows per warp-wide load
  // K (and V) loads per lane per round: registers for 2 blocks per SM at up
  // to 4 q heads (q and the accumulators take 2 * kG * kE of them).
  static constexpr int kLoads = kG >= 8 ? 2 : 4;
  static constexpr int kMinBlocks = kG >= 8 ? 1 : 2;
  // kOwn: a round's kLoads * kG scores are exactly one per lane of a row
  // (head_dim 128 f16 KV with 4 or 8 q heads): the score sums are reduced
  // with halving exchanges (15 shuffles instead of 64 for 16 scores) and
  // each lane then keeps the softmax state of the one (key, head) it holds.
  static constexpr bool kOwn = kLoads * kG == kL;
  static constexpr int kRoundKeys = kR * kLoads;
  // 128-byte lines a head touches (a block type's head need not start a line).
  static constexpr int kRowLines = (kHeadBytes + 127) / 128 + (kBlocks ? 1 : 0);
  static_assert(kL >= 1 && kL <= 32 && 32 % kL == 0, "a row must be a power-of-two number of lanes");
  // Shared memory: per warp kStages stages of K then V pieces [kLoads][32
  // lanes] of kLoadBytes; block types: K then V heads [kRoundKeys][kSlotBytes]
  // (rounded to 16 bytes). After the rounds the same bytes hold the warps'
  // accumulators.
  static constexpr int kPieceBytes = 32 * kLoadBytes;  // one warp-wide load
  static constexpr size_t kStageBytes =
      kBlocks ? (2 * static_cast<size_t>(kRoundKeys) * kSlotBytes + 15) / 16 * 16 : 2 * kLoads * kPieceBytes;
  static constexpr int kStages = kBlocks || kLoadBytes == 8 ? 5 : 3;  // rounds in flight per warp (see above)
  // A block of kW warps: their rings, or after the rounds their accumulators.
  template <int kW>
  static constexpr size_t smem_bytes() {
    const size_t ring = static_cast<size_t>(kW) * kStages * kStageBytes, acc = sizeof(float) * kW * kG * kHd;
    return ring > acc ? ring : acc;
  }
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// kBytes (16, 8 or 4) global -> shared (16: bypassing L1, which .cg allows
// for 16 only); zeros when !valid (src unread).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
  } else {
    static_assert(kBytes == 8 || kBytes == 4);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(kBytes),
                 "r"(valid ? kBytes : 0)
                 : "memory");
  }
}

// 8 e4m3 bytes (fp8 KV, backend/cuda/kv_types.cuh) as f32: exact (e4m3 ->
// f16 -> f32 are exact conversions). With device_math.cuh's overloads (this
// one would hide them).
using ::rill::cuda::unpack8;
__device__ __forceinline__ void unpack8(const uint2& u, const __nv_fp8_e4m3*, float* f) {
  const uint32_t w[2] = {u.x, u.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const auto two = static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * j)) & 0xffff);
      const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
      f[4 * i + 2 * j] = v.x;
      f[4 * i + 2 * j + 1] = v.y;
    }
  }
}
// Word `word` of the aligned 16-byte span of the head at h (Shape::kSpan)
// into dst: the bytes up to the head's last, zeros after it (a word past
// kHeadBytes, or all of it when !ok), so no byte past the head is read (the
// last head of a plane may end where its allocation does). The span's lead
// bytes before h are the row's own (a head never starts a plane unaligned).
template <int kHeadBytes>
__device__ __forceinline__ void cp_async_span(void* dst, const uint8_t* h, int word, bool ok) {
  const auto at = reinterpret_cast<uintptr_t>(h);
  const int left = static_cast<int>(at & 15) + kHeadBytes - 16 * word;  // head bytes from this word on
  const int n = ok ? max(0, min(16, left)) : 0;
  const auto* src = reinterpret_cast<const uint8_t*>((at & ~uintptr_t{15}) + (n > 0 ? 16 * word : 0));
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Sums v[0, 2 kO) over the lanes of a row of 2 kO lanes, halving the values
// each step: at offset o a lane keeps the half its bit o selects and adds
// the partner's copy of it. Lane c of the row ends with v[0] = the row's
// sum of the original v[c].
template <int kO, int kN>
__device__ __forceinline__ void halving_sum(float (&v)[kN], int lane) {
  if constexpr (kO >= 1) {
    const bool upper = (lane & kO) != 0;
#pragma unroll
    for (int j = 0; j < kO; ++j) {
      const float send = upper ? v[j] : v[j + kO];
      const float keep = upper ? v[j + kO] : v[j];
      v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
    }
    halving_sum<kO / 2>(v, lane);
  }
}

// kW warps a block (kWarps, or 4 / 2 for grids that fit on the GPU only in
// smaller blocks: decode_attention_fast); the same registers a thread, so
// kWarps / kW times the blocks an SM.
template <typename KV, int kHd, int kG, int kW>
__global__ void __launch_bounds__(kW * 32, (Shape<KV, kHd, kG>::kMinBlocks * kWarps / kW))
    decode_fast_kernel(AttentionArgs a, bool prefetch) {
  using S = Shape<KV, kHd, kG>;
  constexpr int kE = S::kE, kL = S::kL, kR = S::kR, kLoads = S::kLoads;
  extern __shared__ __align__(16) uint8_t smem[];  // S::smem_bytes<kW>(): the warps' rings, then acc_s
  __shared__ int32_t rows_s[kChunkKeys];
  __shared__ float m_s[kW][kG], l_s[kW][kG];
  __shared__ __align__(16) float p_all[kW][32 + kG];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kStages = S::kStages;
  uint8_t* ring_w = smem + static_cast<size_t>(warp) * kStages * S::kStageBytes;  // this warp's stages
  uint8_t* ring = ring_w + lane * S::kLoadBytes;                                  // element types: this lane's pieces
  const int rr = lane / kL, c = lane % kL;
  const int kvh = blockIdx.x, split = blockIdx.y, z = blockIdx.z;

  const detail::DecodeSplit ds = detail::decode_split(a, z, split);
  const int32_t t = ds.t, n_splits = ds.n_splits, k_begin = ds.k_begin, k_end = ds.k_end;
  if (split >= n_splits) {
    detail::pdl_wait();
    return;
  }
  const int32_t* table = a.block_tables + a.table_start[a.seq_of[t]];
  const int64_t row_bytes = static_cast<int64_t>(a.n_head_kv) * S::kHeadBytes;
  // This head's first byte in row 0.
  const auto* kbytes = static_cast<const uint8_t*>(a.k_cache) + static_cast<int64_t>(kvh) * S::kHeadBytes;
  const auto* vbytes = static_cast<const uint8_t*>(a.v_cache) + static_cast<int64_t>(kvh) * S::kHeadBytes;

  float q[kG][kE], m[kG], l[kG], acc[kG][kE];
  // kOwn: lane (rr, c) holds the score of key rr + (c / kG) kR of the round
  // and head c % kG; its running max (log2 units, the same in every lane of
  // that head) and its share of the head's sum.
  float m_own = -INFINITY, l_own = 0.0f;
  float* p_s = p_all[warp];  // [32] this round's probabilities by lane, then [kG] rescale factors
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[g][e] = 0.0f;
  }
  bool waited = false;
  for (int32_t c0 = k_begin; c0 < k_end; c0 += kChunkKeys) {
    const int n = min(kChunkKeys, k_end - c0);
    for (int jj = threadIdx.x; jj < n; jj += kW * 32) {
      const int64_t row = cache_row(a, table, c0 + jj);
      rows_s[jj] = static_cast<int32_t>(row);
      if (prefetch) {
        const uint8_t* kp = kbytes + row * row_bytes;
        const uint8_t* vp = vbytes + row * row_bytes;
#pragma unroll
        for (int li = 0; li < S::kRowLines; ++li) {
          const int at = min(128 * li, S::kHeadBytes - 1);
          prefetch_l2(kp + at);
          prefetch_l2(vp + at);
        }
      }
    }
    if (!waited) {  // q and this step's K/V rows come from the preceding kernel
      detail::pdl_wait();
      detail::pdl_trigger();
      waited = true;
      const float* qp = a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(kvh) * kG * kHd + c * kE;
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int e = 0; e < kE; e += 4) {
          const float4 v = *reinterpret_cast<const float4*>(qp + g * kHd + e);
          q[g][e] = v.x;
          q[g][e + 1] = v.y;
          q[g][e + 2] = v.z;
          q[g][e + 3] = v.w;
        }
    }
    __syncthreads();
    // This warp's rounds of the chunk: k = 0, 1, ... start at key (warp + k
    // kW) kRoundKeys; round k streams through stage k % kStages.
    const int n_rounds = (n + S::kRoundKeys - 1) / S::kRoundKeys;
    const int my_rounds = n_rounds > warp ? (n_rounds - warp + kW - 1) / kW : 0;
    auto issue = [&](int k) {
      if constexpr (S::kBlocks) {  // the round's heads, word by word, by the whole warp
        const int round0 = (warp + k * kW) * S::kRoundKeys;
        uint8_t* st = ring_w + (k % kStages) * S::kStageBytes;
        constexpr int kAll = S::kRoundKeys * S::kWords;
#pragma unroll
        for (int w0 = 0; w0 < kAll; w0 += 32) {
          const int w = w0 + lane;
          if (kAll % 32 == 0 || w < kAll) {
            const int qq = w / S::kWords, word = w % S::kWords, jj = round0 + qq;
            uint8_t* dst = st + qq * S::kSlotBytes + word * S::kWordBytes;
            if constexpr (S::kSpan) {
              const int64_t off = jj < n ? static_cast<int64_t>(rows_s[jj]) * row_bytes : 0;
              cp_async_span<S::kHeadBytes>(dst, kbytes + off, word, jj < n);
              cp_async_span<S::kHeadBytes>(dst + S::kRoundKeys * S::kSlotBytes, vbytes + off, word, jj < n);
            } else {
              const int64_t off = jj < n ? static_cast<int64_t>(rows_s[jj]) * row_bytes + word * S::kWordBytes : 0;
              cp_async<S::kWordBytes>(dst, kbytes + off, jj < n);
              cp_async<S::kWordBytes>(dst + S::kRoundKeys * S::kSlotBytes, vbytes + off, jj < n);
            }
          }
        }
      } else {
        const int base = (warp + k * kW) * S::kRoundKeys + rr;
        uint8_t* st = ring + (k % kStages) * S::kStageBytes;
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          const int jj = base + i * kR;
          const int64_t off = jj < n ? static_cast<int64_t>(rows_s[jj]) * row_bytes + c * kE * sizeof(KV) : 0;
          cp_async<S::kLoadBytes>(st + i * S::kPieceBytes, kbytes + off, jj < n);
          cp_async<S::kLoadBytes>(st + (kLoads + i) * S::kPieceBytes, vbytes + off, jj < n);
        }
      }
    };
#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) {
      if (k < my_rounds) issue(k);
      cp_async_commit();
    }
    for (int k = 0; k < my_rounds; ++k) {
      if constexpr (S::kBlocks) __syncwarp();  // every lane is done reading the stage issue() refills
      if (k + kStages - 1 < my_rounds) issue(k + kStages - 1);
      cp_async_commit();
      cp_async_wait<kStages - 1>();                           // round k's copies (this thread's) have landed
      if constexpr (S::kBlocks) __syncwarp();                 // and every lane's
      const int base = (warp + k * kW) * S::kRoundKeys + rr;  // this lane's first row (chunk-relative)
      using Piece = typename S::Piece;
      Piece kr[kLoads], vr[kLoads];
      // Block types: this lane's K (V) head of load i in the stage (kSpan:
      // at its lead, the low 4 bits of its address, in its slot).
      const uint8_t* st_w = ring_w + (k % kStages) * S::kStageBytes;
      auto head_at = [&](int i, bool v) {
        const uint8_t* slot = st_w + (v ? S::kRoundKeys * S::kSlotBytes : 0) + (i * kR + rr) * S::kSlotBytes;
        if constexpr (S::kSpan) {
          const int jj = base + i * kR;
          const uint32_t row = jj < n ? static_cast<uint32_t>(rows_s[jj]) : 0u;
          const auto at = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(v ? vbytes : kbytes)) +
                          row * static_cast<uint32_t>(row_bytes);
          return slot + (at & 15u);
        } else {
          return slot;
        }
      };
      // Elements [c kE, (c + 1) kE) of load i's K or V row as f32.
      auto unpack = [&](int i, bool v, float* f) {
        if constexpr (S::kBlocks) {
          KV::load8(head_at(i, v), c * kE, f);
        } else {
          unpack8(v ? vr[i] : kr[i], static_cast<const KV*>(nullptr), f);
        }
      };
      if constexpr (!S::kBlocks) {
        const uint8_t* st = ring + (k % kStages) * S::kStageBytes;
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          kr[i] = *reinterpret_cast<const Piece*>(st + i * S::kPieceBytes);
          vr[i] = *reinterpret_cast<const Piece*>(st + (kLoads + i) * S::kPieceBytes);
        }
      }
      float s[kLoads][kG];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        float kf[kE];
        unpack(i, false, kf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < kE; ++e) d += q[g][e] * kf[e];
          s[i][g] = d;
        }
      }
      if constexpr (S::kOwn) {
        // Lane c ends with score index c = i * kG + g, summed over its row.
        float v[S::kL];
#pragma unroll
        for (int i = 0; i < kLoads; ++i)
#pragma unroll
          for (int g = 0; g < kG; ++g) v[i * kG + g] = s[i][g];
        halving_sum<kL / 2>(v, lane);
        const bool valid = base + (c / kG) * kR < n;
        const float x = valid ? softcap_score(v[0] * a.scale, a.softcap) * kLog2e : -INFINITY;
        float mx = x;
#pragma unroll
        for (int o = kG; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m_own, mx);
        const float corr = exp2f(m_own - m_new);  // 0 on the warp's first round
        const float pr = exp2f(x - m_new);
        m_own = m_new;
        l_own = l_own * corr + pr;
        p_s[lane] = pr;
        if (lane < kG) p_s[32 + lane] = corr;
        __syncwarp();
        if (__any_sync(0xffffffffu, corr != 1.0f)) {  // the max moved for some head: rescale
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            const float cg = p_s[32 + g];
#pragma unroll
            for (int e = 0; e < kE; ++e) acc[g][e] *= cg;
          }
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          float vf[kE], pg[kG];
          unpack(i, true, vf);
          const float* pp = p_s + rr * kL + i * kG;
          if constexpr (kG % 4 == 0) {
#pragma unroll
            for (int g = 0; g < kG; g += 4) {
              const float4 p4 = *reinterpret_cast<const float4*>(pp + g);
              pg[g] = p4.x;
              pg[g + 1] = p4.y;
              pg[g + 2] = p4.z;
              pg[g + 3] = p4.w;
            }
          } else {
#pragma unroll
            for (int g = 0; g < kG; ++g) pg[g] = pp[g];
          }
#pragma unroll
          for (int g = 0; g < kG; ++g)
#pragma unroll
            for (int e = 0; e < kE; ++e) acc[g][e] += pg[g] * vf[e];
        }
        __syncwarp();  // p_s is rewritten by the next round
      } else {
#pragma unroll
        for (int o = kL / 2; o >= 1; o >>= 1)
#pragma unroll
          for (int i = 0; i < kLoads; ++i)
#pragma unroll
            for (int g = 0; g < kG; ++g) s[i][g] += __shfl_xor_sync(0xffffffffu, s[i][g], o);
        float m_new[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          float mx = -INFINITY;
#pragma unroll
          for (int i = 0; i < kLoads; ++i) {
            s[i][g] = base + i * kR < n ? softcap_score(s[i][g] * a.scale, a.softcap) : -INFINITY;
            mx = fmaxf(mx, s[i][g]);
          }
#pragma unroll
          for (int o = kL; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          m_new[g] = fmaxf(m[g], mx);
          const float corr = expf(m[g] - m_new[g]);  // 0 on the warp's first round
          m[g] = m_new[g];
          l[g] *= corr;
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[g][e] *= corr;
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          float vf[kE];
          unpack(i, true, vf);
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            const float pr = expf(s[i][g] - m_new[g]);
            l[g] += pr;
#pragma unroll
            for (int e = 0; e < kE; ++e) acc[g][e] += pr * vf[e];
          }
        }
      }
    }
    __syncthreads();  // rows_s and the rings are reused by the next pass (and the merge)
  }
  if (!waited) {  // an empty split (all its keys before the window)
    detail::pdl_wait();
    detail::pdl_trigger();
  }
  // The warp's rows meet in lanes rr == 0, then the warps in shared memory.
  auto acc_s = reinterpret_cast<float(*)[kG][kHd]>(smem);  // [kW][kG][kHd]
#pragma unroll
  for (int o = kL; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if constexpr (!S::kOwn) l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
  }
  if constexpr (S::kOwn) {  // a head's sum over the lanes holding it; lane g (rr 0, key 0) reports head g
#pragma unroll
    for (int o = kG; o < 32; o <<= 1) l_own += __shfl_xor_sync(0xffffffffu, l_own, o);
    if (lane < kG) {
      m_s[warp][lane] = m_own * kLn2;  // natural units, as the partials and merge_heads use
      l_s[warp][lane] = l_own;
    }
  }
  if (rr == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int e = 0; e < kE; ++e) acc_s[warp][g][c * kE + e] = acc[g][e];
      if (!S::kOwn && c == 0) {
        m_s[warp][g] = m[g];
        l_s[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  detail::combine_warps<kG, kHd, kW>(a, acc_s, m_s, l_s, z, t, kvh, split, n_splits);
}

template <typename KV, int kHd, int kG, int kW>
void launch_w(const AttentionArgs& a, dim3 grid, bool prefetch, cudaStream_t stream) {
  constexpr size_t smem = Shape<KV, kHd, kG>::template smem_bytes<kW>();
  static SmemOptIn opt_in;
  // Blocks of 4 and 2 warps fit 4 and 8 an SM only with the largest
  // shared-memory carveout (as resident_blocks assumes).
  opt_in.ensure(reinterpret_cast<const void*>(decode_fast_kernel<KV, kHd, kG, kW>), smem, true);
  launch_pdl(decode_fast_kernel<KV, kHd, kG, kW>, grid, kW * 32, smem, stream, a, prefetch);
}

// Blocks of kW warps resident on the whole GPU at once (the current device's).
template <typename KV, int kHd, int kG, int kW>
int64_t resident_blocks() {
  static const int64_t blocks = [] {
    constexpr size_t smem = Shape<KV, kHd, kG>::template smem_bytes<kW>();
    const void* kernel = reinterpret_cast<const void*>(decode_fast_kernel<KV, kHd, kG, kW>);
    RILL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    RILL_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    int per_sm = 0, device = 0, sms = 0;
    RILL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kW * 32, smem));
    RILL_CUDA_CHECK(cudaGetDevice(&device));
    RILL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // No block of this size fits on an SM (shared memory or registers past
    // the device's): every launch of it would fail, so stop here with the
    // reason rather than at the launch.
    if (per_sm <= 0 || sms <= 0) {
      std::fprintf(stderr,
                   "rill: decode attention: %d blocks of %d warps (%zu bytes of shared memory) fit an SM of %d SMs\n",
                   per_sm, kW, smem, sms);
      std::abort();
    }
    return static_cast<int64_t>(per_sm) * sms;
  }();
  return blocks;
}

// RILL_DECODE_WARPS=8/4/2 in the environment (parse_decode_warps): that
// block size wherever decode_attention_fast's `warps` is 0 (comparisons).
int env_decode_warps() {
  static const int w = ::rill::cuda::parse_decode_warps(std::getenv("RILL_DECODE_WARPS"));
  return w;
}

// Element KV (f16, bf16, fp8) also has blocks of 4 and 2 warps: a grid of more
// blocks than fit on the GPU at once in blocks of 8 warps (many decode
// tokens with short contexts: batch 64 of the 8B at ~160 keys is 512
// blocks, two waves of 8-warp blocks whose loads, math and merges run in
// step, the DRAM idle between) takes the largest block that lets it all be
// resident (else 2 warps): the warps' rounds then pipeline through their
// rings and the blocks' phases interleave. A warp's keys and the order of
// every sum change with kW, so batch-invariant mode keeps the 8-warp block
// whatever the grid (warps = 8).
template <typename KV>
inline constexpr bool kFewerWarps =
    std::is_same_v<KV, __half> || std::is_same_v<KV, __nv_bfloat16> || std::is_same_v<KV, __nv_fp8_e4m3>;

// The block size (warps) launch_one takes for a grid of `units` blocks.
template <typename KV, int kHd, int kG>
int pick_warps(int32_t warps, int64_t units) {
  if constexpr (!kFewerWarps<KV>) {
    return kWarps;
  } else {
    const int w = warps != 0 ? warps : env_decode_warps();
    if (w == 8 || w == 4 || w == 2) return w;
    return units <= resident_blocks<KV, kHd, kG, kWarps>() ? kWarps
           : units <= resident_blocks<KV, kHd, kG, 4>()    ? 4
                                                           : 2;
  }
}

// The blocks of `grid` that read keys: n_head_kv x `work` where the
// runtime gives it (splits past a token's own count leave at once, so they
// do not count), else every block.
int64_t working_blocks(dim3 grid, int32_t work) {
  const int64_t all = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (work <= 0) return all;
  const int64_t working = static_cast<int64_t>(grid.x) * work;
  return working < all ? working : all;
}

template <typename KV, int kHd, int kG>
void launch_one(const AttentionArgs& a, dim3 grid, int32_t warps, int32_t work, cudaStream_t stream) {
  const int64_t units = working_blocks(grid, work);
  // Prefetch into L2 before the wait only where every working block is
  // resident at once in 8-warp blocks (small batches; see the top of the
  // file).
  const bool prefetch = units <= kPrefetchMaxBlocks;
  if constexpr (kFewerWarps<KV>) {
    const int w = pick_warps<KV, kHd, kG>(warps, units);
    // (No prefetch in the smaller blocks: measured slower, perf.md's dec23.)
    if (w == 4) return launch_w<KV, kHd, kG, 4>(a, grid, false, stream);
    if (w == 2) return launch_w<KV, kHd, kG, 2>(a, grid, false, stream);
  }
  launch_w<KV, kHd, kG, kWarps>(a, grid, prefetch, stream);
}

// f(KV, kHd, kG) for a's cache (decode_fast_supported).
template <typename KV, int kHd, typename F>
void for_group(const AttentionArgs& a, F&& f) {
  switch (a.n_head / a.n_head_kv) {
    case 1:
      f.template operator()<KV, kHd, 1>();
      break;
    case 2:
      f.template operator()<KV, kHd, 2>();
      break;
    case 4:
      f.template operator()<KV, kHd, 4>();
      break;
    default:
      if constexpr (kHd <= 128) f.template operator()<KV, kHd, 8>();
      break;
  }
}

template <typename KV, typename F>
void for_head_dim(const AttentionArgs& a, F&& f) {
  if (a.head_dim == 64) {
    for_group<KV, 64>(a, f);
  } else if (a.head_dim == 128 || std::is_same_v<KV, float>) {
    for_group<KV, 128>(a, f);
  } else {
    if constexpr (!std::is_same_v<KV, float>) for_group<KV, 256>(a, f);
  }
}

template <typename F>
void for_shape(const AttentionArgs& a, F&& f) {
  if (a.kv_dtype == DType::kF16) {
    for_head_dim<__half>(a, f);
  } else if (a.kv_dtype == DType::kBF16) {
    for_head_dim<__nv_bfloat16>(a, f);
  } else if (a.kv_dtype == kF8E4M3) {
    for_head_dim<__nv_fp8_e4m3>(a, f);
  } else if (a.kv_dtype == DType::kQ8_0) {
    for_head_dim<detail::KvQ8_0>(a, f);
  } else if (a.kv_dtype == DType::kQ4_0) {
    for_head_dim<detail::KvQ4_0>(a, f);
  } else if (a.kv_dtype == DType::kQ4_1) {
    for_head_dim<detail::KvQ4_1>(a, f);
  } else if (a.kv_dtype == DType::kQ5_0) {
    for_head_dim<detail::KvQ5_0>(a, f);
  } else if (a.kv_dtype == DType::kQ5_1) {
    for_head_dim<detail::KvQ5_1>(a, f);
  } else if (a.kv_dtype == DType::kIQ4_NL) {
    for_head_dim<detail::KvIq4Nl>(a, f);
  } else if (a.kv_dtype == kKvQ8_0x64) {
    for_head_dim<detail::KvQ8_0x64>(a, f);
  } else if (a.kv_dtype == kKvIq4Nl64) {
    for_head_dim<detail::KvIq4Nl64>(a, f);
  } else {
    for_head_dim<float>(a, f);
  }
}

dim3 decode_grid(const AttentionArgs& a, int32_t n_splits_grid) {
  return dim3(static_cast<unsigned>(a.n_head_kv), static_cast<unsigned>(n_splits_grid),
              static_cast<unsigned>(a.n_decode));
}

}  // namespace

int32_t parse_decode_warps(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (errno == 0 && end != value && *end == '\0' && (v == 8 || v == 4 || v == 2)) return static_cast<int32_t>(v);
  std::fprintf(stderr, "rill: RILL_DECODE_WARPS=\"%s\" ignored (it takes 8, 4 or 2)\n", value);
  return 0;
}

bool decode_fast_supported(DType kv_dtype, int32_t head_dim, int32_t group) {
  const bool group_ok = group == 1 || group == 2 || group == 4 || (group == 8 && head_dim <= 128);
  if (kv_dtype == DType::kF16 || kv_dtype == DType::kBF16 || kv_dtype == kF8E4M3 || kv_dtype == DType::kQ8_0 ||
      kv_dtype == DType::kQ4_0 || kv_dtype == DType::kQ4_1 || kv_dtype == DType::kQ5_0 || kv_dtype == DType::kQ5_1 ||
      kv_dtype == DType::kIQ4_NL || kv_dtype == kKvQ8_0x64 || kv_dtype == kKvIq4Nl64) {
    return group_ok && (head_dim == 64 || head_dim == 128 || head_dim == 256);
  }
  if (kv_dtype == DType::kF32) return group_ok && (head_dim == 64 || head_dim == 128);
  return false;
}

int32_t decode_fast_warps(const AttentionArgs& a, int32_t n_splits_grid, int32_t warps, int32_t work) {
  const dim3 grid = decode_grid(a, n_splits_grid);
  int32_t w = kWarps;
  for_shape(a, [&]<typename KV, int kHd, int kG>() { w = pick_warps<KV, kHd, kG>(warps, working_blocks(grid, work)); });
  return w;
}

void decode_attention_fast(const AttentionArgs& a, int32_t n_splits_grid, cudaStream_t stream, int32_t warps,
                           int32_t work) {
  const dim3 grid = decode_grid(a, n_splits_grid);
  // The quantized types on the tensor cores (attention_decode_mma.cu),
  // whatever the batch; planes aligned as its 16-, 8- or 4-byte copies need.
  if (decode_mma_takes(a.kv_dtype, a.head_dim, a.n_head / a.n_head_kv) &&
      reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0) {
    return decode_attention_mma(a, n_splits_grid, working_blocks(grid, work) <= kPrefetchMaxBlocks, stream);
  }
  for_shape(a, [&]<typename KV, int kHd, int kG>() { launch_one<KV, kHd, kG>(a, grid, warps, work, stream); });
}

}  // namespace rill::cuda
