// The fast k4c / k4a attention (attention_chan.h chan_attention_fast).
//
// Grid (token tile, KV head x head chunk, key split), kFastThreads threads.
// A block owns up to KG query heads of one KV head (the GQA group, 8 at most
// a block: a K group and a V row are decoded once for all of them) for the
// TT tokens of its tile (1 a decode step's; with a.tile_tokens 32 / KG, so
// prefill decodes a block once for several tokens), and the KV blocks of
// one split (attention_chan_split.h). Its rows (token, head) go in runs:
// the tile's consecutive tokens of one sequence whose keys start in the
// same block and end in the same own block share the split plan and every
// decoded value, so a row's arithmetic is the one it has alone (the masks
// are per row): tiling never changes a bit. For each run and each KV block
// of 32 keys:
//   1. decode: K into shared f32 rows k[r][c] = z_c + d_c / 16 * code_rc
//      (q4c's nibbles, or q4a's bit planes at the channel's width; the
//      query's own block from its q8_0 tail / step rows), V's 32 rows
//      (iq4_nlh64 levels, or q8_0) into v[r][c]; keys outside the query's
//      range get v = 0 (and a -inf score, so garbage never reaches out);
//   2. dots: a (key, quarter of the channels) a thread, every row of the
//      block at once (k's element read once for the rows);
//   3. scores: s[r][g] = capped(q_g . k_r * scale) from the quarters;
//   4. the running max per row (a thread a row, four chains over the
//      keys) and its correction;
//   5. p[r][g] = exp(s - m), a (key, row) a thread;
//   6. o[g][c] = o * corr + sum_r p[r][g] v[r][c] (a channel a thread,
//      every row at once, keys in order) and l[g] = l * corr + sum_r
//      p[r][g] (a thread a row, four partial sums).
// A thread's global loads of a phase go out together before its shared
// stores (an item's latency, not a chain of them: the own block's q8_0
// rows were 32 such rounds a thread).
// The split's (o, m, l) go to a.partials; chan_fast_combine_kernel merges a
// query's splits in split order (a thread a channel, each thread the same
// max and sum over the splits, so every output is a fixed sequence of f32
// operations: deterministic, and batch invariant since the plan depends on
// the query's own keys only).
//
// Everything between the phases lives in shared memory (the output
// accumulator too), so the same phase functions run on the host one thread
// after another (chan_attention_fast_host): the tests check the algorithm
// against the reference on any machine, and the device only for rounding.
//
// Why f32 rows and a q.k dot rather than the reference's q.z + sum_c (q_c
// d_c) code: the decoded row is shared by the KG heads (KG dots over one
// decode) and the product is equal up to f32 rounding (k = z + d/16 code
// exactly as the CPU's dequantize_chan_block computes it). Why not the
// tensor cores: a variant with both products as bf16 MMAs on the codes
// (commit b294ec7) was correct and slower on an H100 (batch 64: 350
// against 227 us a layer; prefill even): the multiply-adds are not the
// bound, the block decode, the barriers and the occupancy are.
//
// Bytes a decode step reads per (token, KV head, key) with head_dim 128:
// K 19 * 128 / 32 = 76 (q4c group amortized over its 32 keys), V 66
// (iq4_nlh64: 33 bytes per 64), 142 in all against f16's 512: 3.6x less.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "backend/cuda/attention_chan.h"
#include "backend/cuda/attention_chan_math.cuh"
#include "backend/cuda/attention_chan_split.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_rotated.cuh"
#include "backend/cuda/kv_types.cuh"

namespace rill::cuda {
namespace {

using detail::chan_capped;
using detail::chan_exp;
using detail::e4m3_to_float;
using detail::f16_value;
using detail::mul_rn;

constexpr int kT = cpu::kKvChanTokens;
static_assert(kT == kChanSplitTokens, "a split's unit is a KV block");
static_assert(cpu::kKvChanTailType == DType::kQ8_0, "the tail rows are q8_0");
constexpr int kFastThreads = 128;

#ifdef __CUDA_ARCH__
#define RILL_FAST_UNROLL8 _Pragma("unroll 8")
#else
#define RILL_FAST_UNROLL8
#endif

// 4 floats at a 16-byte aligned address (shared memory): one 128-bit load
// on the device, the same values on the host.
__host__ __device__ __forceinline__ void ld4(const float* p, float* v) {
#ifdef __CUDA_ARCH__
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x;
  v[1] = x.y;
  v[2] = x.z;
  v[3] = x.w;
#else
  for (int i = 0; i < 4; ++i) v[i] = p[i];
#endif
}

// A little-endian 2-byte value at a 2-aligned address (global or host memory).
__host__ __device__ __forceinline__ uint16_t half_at(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint16_t*>(p);
#else
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
#endif
}

// A 4-byte word at a 4-aligned address (global or host memory).
__host__ __device__ __forceinline__ uint32_t word_at(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
#endif
}

// One thread block's work: a run of tokens (up to TT, the same sequence's
// consecutive tokens of the batch whose keys start in the same KV block and
// end in the same own block: the same split plan and the same decoded
// blocks, the own block's q8_0 rows included), KV head kvh, query heads
// [h0, h0 + gh), the KV blocks [blk_lo, blk_hi) of split `split`. Row i of
// the block is token u = i / KG of the run and head g = i % KG.
struct FastRun {
  int kvh = 0, h0 = 0, gh = 0, seq = 0, split = 0, t0 = 0, n = 0;  // tokens [t0, t0 + n)
  int64_t lo = 0, hi = 0;                                          // the run's keys: [min j_begin, max j_end)
  int64_t own = 0, c0 = 0, tail_start = 0, blk_lo = 0, blk_hi = 0;
  const int32_t* table = nullptr;
  int64_t W = 0;
  size_t tail_row = 0;
};

__host__ __device__ inline ChanSplit token_plan(const ChanAttentionArgs& a, int t) {
  int64_t jb = 0, je = 0;
  chan_key_range(a.pos[t], a.window, &jb, &je);
  return chan_split_plan(jb, je);
}

// Whether tokens t and u may share a thread block: one sequence, keys from
// the same first block to the same own block.
__host__ __device__ inline bool same_run(const ChanAttentionArgs& a, int t, int u) {
  if (a.seq_of[t] != a.seq_of[u]) return false;
  int64_t tb = 0, te = 0, ub = 0, ue = 0;
  chan_key_range(a.pos[t], a.window, &tb, &te);
  chan_key_range(a.pos[u], a.window, &ub, &ue);
  return tb / kT == ub / kT && (te - 1) / kT == (ue - 1) / kT;
}

// The run starting at token t0 (ending before t_end): its end, and in f
// its split z's work (false: z is beyond its splits).
__host__ __device__ inline bool fast_run(const ChanAttentionArgs& a, int t0, int t_end, int y, int z, int kg,
                                         FastRun& f, int* run_end) {
  int t1 = t0 + 1;
  while (t1 < t_end && same_run(a, t0, t1)) ++t1;
  *run_end = t1;
  const ChanSplit plan = token_plan(a, t0);  // every token of the run has this plan
  if (z >= plan.n_splits) return false;
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + kg - 1) / kg, chunk = y % n_chunks;
  f.kvh = y / n_chunks;
  f.h0 = f.kvh * group + chunk * kg;
  f.gh = group - chunk * kg < kg ? group - chunk * kg : kg;
  f.split = z;
  f.t0 = t0;
  f.n = t1 - t0;
  f.lo = INT64_MAX;
  f.hi = 0;
  for (int t = t0; t < t1; ++t) {
    int64_t jb = 0, je = 0;
    chan_key_range(a.pos[t], a.window, &jb, &je);
    f.lo = jb < f.lo ? jb : f.lo;
    f.hi = je > f.hi ? je : f.hi;
  }
  f.own = (f.hi - 1) - (f.hi - 1) % kT;
  chan_split_blocks(plan, z, &f.blk_lo, &f.blk_hi);
  f.seq = a.seq_of[t0];
  f.c0 = a.c0[f.seq];
  f.tail_start = f.c0 - f.c0 % kT;
  f.table = a.block_tables + a.table_start[f.seq];
  f.W = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
  f.tail_row = static_cast<size_t>(f.W / 32 * 34);
  return true;
}

__host__ __device__ inline const uint8_t* own_row(const ChanAttentionArgs& a, const FastRun& f, const uint8_t* tail,
                                                  const uint8_t* step, int64_t j) {
  return j < f.c0 ? tail + static_cast<size_t>(j - f.tail_start) * f.tail_row
                  : step + static_cast<size_t>(a.q_start[f.seq] + (j - f.c0)) * f.tail_row;
}

// Shared memory of a block (floats; every region 16-byte aligned), R =
// TT * KG rows: q transposed [HD][R], k [32][HD + 4], v [32][HD], the dots'
// parts [4][R][32], s [32][R], o [R][HD], m, l, corr [R].
template <int HD, int KG, int TT, bool WR = false>
struct Cta {
  static constexpr int R = KG * TT;
  using Run = FastRun;
  // k's rows 16-byte aligned for the dot phase's 4-float loads, and 4
  // floats longer than HD: a quarter warp's rows r..r+7 then start 4 banks
  // apart (HD + 4 = 4 mod 32), so the loads are conflict-free.
  static constexpr int kKStride = HD + 4;
  static constexpr int kParts = kFastThreads / kT;  // the score phase's channel parts (4)
  static_assert(kParts == 4 && HD % (4 * kParts) == 0, "scores() sums 4 parts of whole float4s");
  static_assert(R <= kFastThreads, "rescale() and accumulate() give a row a thread");
  static constexpr int kQ = 0;                     // q transposed: [HD][R]
  static constexpr int kK = kQ + R * HD;           // [32][HD + 4]
  static constexpr int kV = kK + kT * kKStride;    // [32][HD]
  static constexpr int kP = kV + kT * HD;          // partial scores [kParts][R][32]
  static constexpr int kS = kP + kParts * R * kT;  // scores, then probabilities: [32][R]
  static constexpr int kO = kS + R * kT;
  static constexpr int kM = kO + R * HD;
  static constexpr int kL = kM + R;
  static constexpr int kC = kL + R;
  static constexpr int kFloats = kC + R;
  static constexpr size_t kBytes = sizeof(float) * kFloats;
  static_assert(kK % 4 == 0 && kV % 4 == 0 && kP % 4 == 0 && kS % 4 == 0, "16-byte aligned regions");

  __host__ __device__ static bool live(const Run& f, int i) { return i / KG < f.n && i % KG < f.gh; }

  __host__ __device__ static void init(const ChanAttentionArgs& a, const Run& f, float* sm, int tid) {
    for (int i = tid; i < R * HD; i += kFastThreads) {
      const int row = i / HD, c = i % HD;
      sm[kQ + c * R + row] =
          live(f, row) ? a.q[(f.t0 + row / KG) * a.q_stride + static_cast<int64_t>(f.h0 + row % KG) * HD + c] : 0.0f;
      sm[kO + i] = 0.0f;
    }
    if (tid < R) {
      sm[kM + tid] = -INFINITY;
      sm[kL + tid] = 0.0f;
      sm[kC + tid] = 1.0f;
    }
  }

  // q4a: channel c's codes of keys [16 half, 16 half + 16) of the pool
  // block at blk, from the channel's bit planes, each as put(key r within
  // the block, code).
  template <typename Put>
  __host__ __device__ static void alloc_k_codes(const ChanAttentionArgs& a, const Run& f, const uint8_t* blk, int c,
                                                int half, Put put) {
    const int64_t ch = static_cast<int64_t>(f.kvh) * HD + c;
    const int width = a.k_widths[ch];
    const uint8_t* p = blk + alloc_plane_offsets(a.k_widths, f.W)[ch];
    uint32_t code[16];
    RILL_DEVICE_UNROLL
    for (int r = 0; r < 16; ++r) code[r] = 0;
    for (int bit = 0; bit < width; ++bit) {
      const uint32_t plane = word_at(p + 4 * bit) >> (16 * half);
      RILL_DEVICE_UNROLL
      for (int r = 0; r < 16; ++r) code[r] |= ((plane >> r) & 1u) << bit;
    }
    RILL_DEVICE_UNROLL
    for (int r = 0; r < 16; ++r) put(16 * half + r, code[r]);
  }

  // Block b's keys [lo, hi) (within the run's keys) into k and v; v's rows
  // outside are zero (a key outside one row's range but within the run's is
  // a real key: finite, its probability 0 in that row).
  __host__ __device__ static void decode(const ChanAttentionArgs& a, const Run& f, int64_t b, float* sm, int tid) {
    const int64_t b0 = b * kT;
    const int64_t lo = f.lo > b0 ? f.lo : b0, hi = f.hi < b0 + kT ? f.hi : b0 + kT;
    float* k = sm + kK;
    float* v = sm + kV;
    const int64_t head = static_cast<int64_t>(f.kvh) * HD;
    if (b0 < f.own) {  // a pool block: all 32 rows encoded
      const uint8_t* blk = a.k_blocks + static_cast<size_t>(f.table[b]) * a.block_stride;
      const auto* zs = reinterpret_cast<const uint16_t*>(blk) + head;
      const uint8_t* ds = blk + 2 * f.W + head;
      // K: a (channel, half of the keys) a thread. q4c's loads all first
      // (a thread's items' words in flight together, not one item's
      // latency after another's), then its values.
      if (!a.k_widths) {
        constexpr int kItems = 2 * HD / kFastThreads;
        static_assert(2 * HD % kFastThreads == 0, "whole K items a thread");
        uint16_t zr[kItems];
        uint8_t dr[kItems];
        uint32_t w[kItems][2];
        RILL_DEVICE_UNROLL
        for (int u = 0; u < kItems; ++u) {
          const int i = tid + u * kFastThreads, c = i % HD, half = i / HD;
          const uint8_t* qs = blk + 3 * f.W + (head + c) * (kT / 2) + 8 * half;
          zr[u] = zs[c];
          dr[u] = ds[c];
          w[u][0] = word_at(qs);
          w[u][1] = word_at(qs + 4);
        }
        RILL_DEVICE_UNROLL
        for (int u = 0; u < kItems; ++u) {
          const int i = tid + u * kFastThreads, c = i % HD, half = i / HD;
          const float z = f16_value(zr[u]), d = e4m3_to_float(dr[u]) * 0.0625f;
          RILL_DEVICE_UNROLL
          for (int e = 0; e < 8; ++e) {  // bytes [8 half, 8 half + 8): keys i (low) and i + 16 (high)
            const uint32_t byte = (w[u][e / 4] >> (8 * (e % 4))) & 0xFFu;
            const int r = 8 * half + e;
            k[r * kKStride + c] = z + d * static_cast<float>(byte & 0xFu);
            k[(r + 16) * kKStride + c] = z + d * static_cast<float>(byte >> 4);
          }
        }
      } else {  // q4a
        for (int i = tid; i < 2 * HD; i += kFastThreads) {
          const int c = i % HD, half = i / HD;
          const float z = f16_value(zs[c]), d = e4m3_to_float(ds[c]) * 0.0625f;
          alloc_k_codes(a, f, blk, c, half,
                        [&](int r, uint32_t code) { k[r * kKStride + c] = z + d * static_cast<float>(code); });
        }
      }
      // V: 4 channels of a row an item, a thread's items in groups of 4,
      // each group's loads first (4 in flight; more would spill under the
      // launch bound); rows outside [lo, hi) zero (their bytes are read: a
      // pool block holds 32 rows).
      const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
      const uint8_t* vblk = a.v_blocks + static_cast<size_t>(f.table[b]) * v_stride;
      constexpr int kVItems = kT * (HD / 4) / kFastThreads, kGroup = 4;
      static_assert(kVItems % kGroup == 0, "whole groups of V items a thread");
      for (int u0 = 0; u0 < kVItems; u0 += kGroup) {
        uint32_t codes[kGroup];
        uint8_t scales[kGroup];
        RILL_DEVICE_UNROLL
        for (int u = 0; u < kGroup; ++u) {
          const int i = tid + (u0 + u) * kFastThreads, r = i / (HD / 4), c = 4 * (i % (HD / 4));
          const uint8_t* vb =
              vblk + static_cast<size_t>(r) * a.v_row_bytes + (head + c) / 64 * detail::KvIq4Nl64::kBlockBytes;
          codes[u] = detail::KvIq4Nl64::code_bytes4(vb + 1 + ((head + c) & 31));
          scales[u] = vb[0];
        }
        RILL_DEVICE_UNROLL
        for (int u = 0; u < kGroup; ++u) {
          const int i = tid + (u0 + u) * kFastThreads, r = i / (HD / 4), c = 4 * (i % (HD / 4));
          float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (b0 + r >= lo && b0 + r < hi) {
            detail::KvIq4Nl::levels4(codes[u], ((head + c) & 63) >= 32 ? 4 : 0,
                                     mul_rn(e4m3_to_float(scales[u]), 0.0625f), x);
          }
          RILL_DEVICE_UNROLL
          for (int e = 0; e < 4; ++e) v[r * HD + c + e] = x[e];
        }
      }
      return;
    }
    // The own block: the q8_0 rows of the tail (before c0) and the step, a
    // (side, row, 32-element block) an item: its 17 two-byte loads issued
    // together, then its 32 values (chan_q8_value's, d * level). Rows
    // outside [lo, hi) zero.
    constexpr int kQ8Blocks = HD / 32;
    for (int i = tid; i < 2 * kT * kQ8Blocks; i += kFastThreads) {
      const int side = i / (kT * kQ8Blocks), r = i / kQ8Blocks % kT, q = i % kQ8Blocks;
      const int64_t j = b0 + r;
      float* dst = side == 0 ? k + r * kKStride + 32 * q : v + r * HD + 32 * q;
      if (j < lo || j >= hi) {
        RILL_DEVICE_UNROLL
        for (int e = 0; e < 32; ++e) dst[e] = 0.0f;
        continue;
      }
      const uint8_t* row =
          side == 0 ? own_row(a, f, a.tail_k[f.seq], a.step_k, j) : own_row(a, f, a.tail_v[f.seq], a.step_v, j);
      const uint8_t* blk = row + (head / 32 + q) * 34;  // 2-byte aligned: rows and blocks are even
      uint16_t h[17];
      RILL_DEVICE_UNROLL
      for (int e = 0; e < 17; ++e) h[e] = half_at(blk + 2 * e);
      const float d = f16_value(h[0]);
      RILL_DEVICE_UNROLL
      for (int e = 0; e < 16; ++e) {
        dst[2 * e] = mul_rn(d, static_cast<float>(static_cast<int8_t>(h[e + 1] & 0xFFu)));
        dst[2 * e + 1] = mul_rn(d, static_cast<float>(static_cast<int8_t>(h[e + 1] >> 8)));
      }
    }
  }

  // Partial dots: a (key r, channel part) a thread, every row at once (the
  // key's element read once for the R rows, q's a broadcast).
  __host__ __device__ static void dots(float* sm, int tid) {
    for (int i = tid; i < kParts * kT; i += kFastThreads) {
      const int part = i / kT, r = i % kT;
      const float* k = sm + kK + r * kKStride;
      float acc[R];
      RILL_DEVICE_UNROLL
      for (int g = 0; g < R; ++g) acc[g] = 0.0f;
      RILL_FAST_UNROLL8
      for (int c = part * (HD / kParts); c < (part + 1) * (HD / kParts); c += 4) {
        float kc[4];
        ld4(k + c, kc);
        RILL_DEVICE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const float* q = sm + kQ + (c + e) * R;
          if constexpr (R % 4 == 0) {
            RILL_DEVICE_UNROLL
            for (int g = 0; g < R; g += 4) {
              float qv[4];
              ld4(q + g, qv);
              RILL_DEVICE_UNROLL
              for (int u = 0; u < 4; ++u) acc[g + u] += qv[u] * kc[e];
            }
          } else {
            RILL_DEVICE_UNROLL
            for (int g = 0; g < R; ++g) acc[g] += q[g] * kc[e];
          }
        }
      }
      RILL_DEVICE_UNROLL
      for (int g = 0; g < R; ++g) sm[kP + (part * R + g) * kT + r] = acc[g];
    }
  }

  // s[r][row]: key b0 + r's capped, scaled score for the row (-inf outside
  // the row's token's keys).
  __host__ __device__ static void scores(const ChanAttentionArgs& a, const Run& f, int64_t b, float* sm, int tid) {
    const int64_t b0 = b * kT;
    for (int i = tid; i < R * kT; i += kFastThreads) {
      const int row = i / kT, r = i % kT;
      int64_t jb = 0, je = 0;
      if (live(f, row)) chan_key_range(a.pos[f.t0 + row / KG], a.window, &jb, &je);
      float sc = -INFINITY;
      if (b0 + r >= jb && b0 + r < je) {
        const float* p = sm + kP + row * kT + r;  // part j at p[j * R * kT]
        const float dot = (p[0] + p[R * kT]) + (p[2 * R * kT] + p[3 * R * kT]);
        sc = chan_capped(dot * a.scale, a.softcap);
      }
      sm[kS + r * R + row] = sc;
    }
  }

  // Row `tid`'s running max over the block and the old sums' correction.
  // Four running maxima over keys r = 0, 1, 2, 3 mod 4, so four loads are
  // in flight rather than a chain of 32: the max of a set is exact in any
  // order (NaN scores ignored, as one chain would).
  __host__ __device__ static void rescale(float* sm, int tid) {
    if (tid >= R) return;
    const float m_old = sm[kM + tid];
    float mx[4] = {m_old, -INFINITY, -INFINITY, -INFINITY};
    RILL_FAST_UNROLL8
    for (int r = 0; r < kT; r += 4) {
      RILL_DEVICE_UNROLL
      for (int u = 0; u < 4; ++u) {
        const float x = sm[kS + (r + u) * R + tid];
        mx[u] = x > mx[u] ? x : mx[u];
      }
    }
    const float m01 = mx[1] > mx[0] ? mx[1] : mx[0], m23 = mx[3] > mx[2] ? mx[3] : mx[2];
    const float m = m23 > m01 ? m23 : m01;
    sm[kC + tid] = m == -INFINITY ? 1.0f : chan_exp(m_old - m);  // exp(-inf) = 0 for the first block
    sm[kM + tid] = m;
  }

  __host__ __device__ static void probs(float* sm, int tid) {
    for (int i = tid; i < R * kT; i += kFastThreads) {
      const float s = sm[kS + i];
      sm[kS + i] = s == -INFINITY ? 0.0f : chan_exp(s - sm[kM + i % R]);
    }
  }

  // Key b0 + r's capped, scaled score for the row (-inf outside the row's
  // token's keys): the scores phase's value.
  __host__ __device__ static float row_score(const ChanAttentionArgs& a, const Run& f, int64_t b, const float* sm,
                                             int row, int r) {
    int64_t jb = 0, je = 0;
    if (live(f, row)) chan_key_range(a.pos[f.t0 + row / KG], a.window, &jb, &je);
    const int64_t key = b * kT + r;
    if (key < jb || key >= je) return -INFINITY;
    const float* p = sm + kP + row * kT + r;  // part j at p[j * R * kT]
    const float dot = (p[0] + p[R * kT]) + (p[2 * R * kT] + p[3 * R * kT]);
    return chan_capped(dot * a.scale, a.softcap);
  }

  // WR (a.warp_softmax): phases 3-5 and the sums in one, a warp a row (a
  // lane a key): the score, the block's max by shuffles (exact in any
  // order), the probability, the sum by the xor butterfly (lane 0's value),
  // the row's m, l and corr; two barriers a block fewer and no thread
  // walking 32 keys alone. The host run emulates the butterfly's order.
  __host__ __device__ static void softmax_rows(const ChanAttentionArgs& a, const Run& f, int64_t b, float* sm,
                                               int tid) {
#ifdef __CUDA_ARCH__
    const int warp = tid >> 5, lane = tid & 31;
    for (int row = warp; row < R; row += kFastThreads / 32) {
      const float s = row_score(a, f, b, sm, row, lane);
      float m = s;
      RILL_DEVICE_UNROLL
      for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, m, o);
        m = x > m ? x : m;
      }
      const float m_old = sm[kM + row];
      m = m > m_old ? m : m_old;
      const float p = s == -INFINITY ? 0.0f : chan_exp(s - m);
      sm[kS + lane * R + row] = p;
      float sum = p;
      RILL_DEVICE_UNROLL
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();  // every lane has read m_old
      if (lane == 0) {
        const float corr = m == -INFINITY ? 1.0f : chan_exp(m_old - m);
        sm[kC + row] = corr;
        sm[kL + row] = sm[kL + row] * corr + sum;
        sm[kM + row] = m;
      }
    }
#else
    if (tid != 0) return;
    for (int row = 0; row < R; ++row) {
      float s[kT], v[kT];
      float m = sm[kM + row];
      const float m_old = m;
      for (int r = 0; r < kT; ++r) {
        s[r] = row_score(a, f, b, sm, row, r);
        m = s[r] > m ? s[r] : m;
      }
      for (int r = 0; r < kT; ++r) {
        v[r] = s[r] == -INFINITY ? 0.0f : chan_exp(s[r] - m);
        sm[kS + r * R + row] = v[r];
      }
      for (int o = kT / 2; o > 0; o >>= 1) {  // lane i: v_i + v_(i xor o), as __shfl_xor_sync's butterfly
        float w[kT];
        for (int i = 0; i < kT; ++i) w[i] = v[i] + v[i ^ o];
        for (int i = 0; i < kT; ++i) v[i] = w[i];
      }
      const float corr = m == -INFINITY ? 1.0f : chan_exp(m_old - m);
      sm[kC + row] = corr;
      sm[kL + row] = sm[kL + row] * corr + v[0];
      sm[kM + row] = m;
    }
#endif
  }

  // A channel a thread, every row at once (V's element read once for the
  // R rows, the probabilities a broadcast), keys in order; then the sums
  // (WR: softmax_rows took them).
  __host__ __device__ static void accumulate(float* sm, int tid) {
    for (int c = tid; c < HD; c += kFastThreads) {
      float acc[R];
      RILL_DEVICE_UNROLL
      for (int g = 0; g < R; ++g) acc[g] = 0.0f;
      RILL_FAST_UNROLL8
      for (int r = 0; r < kT; ++r) {
        const float v = sm[kV + r * HD + c];
        const float* p = sm + kS + r * R;
        if constexpr (R % 4 == 0) {
          RILL_DEVICE_UNROLL
          for (int g = 0; g < R; g += 4) {
            float pv[4];
            ld4(p + g, pv);
            RILL_DEVICE_UNROLL
            for (int u = 0; u < 4; ++u) acc[g + u] += pv[u] * v;
          }
        } else {
          RILL_DEVICE_UNROLL
          for (int g = 0; g < R; ++g) acc[g] += p[g] * v;
        }
      }
      RILL_DEVICE_UNROLL
      for (int g = 0; g < R; ++g) sm[kO + g * HD + c] = sm[kO + g * HD + c] * sm[kC + g] + acc[g];
    }
    if constexpr (!WR) sums(sm, tid);
  }

  // Row `tid`'s running sum: l = l * corr + the block's probabilities.
  // In four partial sums (keys r = 0, 1, 2, 3 mod 4, then (0 + 1) + (2 +
  // 3)): four loads in flight rather than a chain of 32.
  __host__ __device__ static void sums(float* sm, int tid) {
    if (tid < R) {
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      RILL_FAST_UNROLL8
      for (int r = 0; r < kT; r += 4) {
        RILL_DEVICE_UNROLL
        for (int u = 0; u < 4; ++u) part[u] += sm[kS + (r + u) * R + tid];
      }
      const float sum = (part[0] + part[1]) + (part[2] + part[3]);
      sm[kL + tid] = sm[kL + tid] * sm[kC + tid] + sum;
    }
  }

  // The split's unnormalized outputs, max and sum into a.partials.
  __host__ __device__ static void store(const ChanAttentionArgs& a, const Run& f, const float* sm, int tid) {
    const int64_t n_ml = static_cast<int64_t>(a.n_tokens) * a.n_head * kChanMaxSplits;
    float* po = a.partials;
    float* pml = a.partials + n_ml * HD;
    for (int i = tid; i < R * HD; i += kFastThreads) {
      const int row = i / HD, c = i % HD;
      if (!live(f, row)) continue;
      const int64_t slot =
          (static_cast<int64_t>(f.t0 + row / KG) * a.n_head + f.h0 + row % KG) * kChanMaxSplits + f.split;
      po[slot * HD + c] = sm[kO + i];
    }
    if (tid < R && live(f, tid)) {
      const int64_t slot =
          (static_cast<int64_t>(f.t0 + tid / KG) * a.n_head + f.h0 + tid % KG) * kChanMaxSplits + f.split;
      pml[2 * slot] = sm[kM + tid];
      pml[2 * slot + 1] = sm[kL + tid];
    }
  }

  // The split's work for each run of the tokens [t_tile, t_tile + TT) in
  // turn: phase(f, b, step) for b in the run's blocks and step 0 (init), 1..6
  // (decode, dots, scores, rescale, probs, accumulate; WR: decode, dots,
  // softmax_rows, accumulate), then 7 (store), a
  // barrier after each (the device's __syncthreads; the host runs each phase
  // for every thread before the next).
  template <typename Phase>
  __host__ __device__ static void each_phase(const ChanAttentionArgs& a, int t_tile, int y, int z, Phase phase) {
    const int t_end = t_tile + TT < a.n_tokens ? t_tile + TT : a.n_tokens;
    for (int t0 = t_tile; t0 < t_end;) {
      Run f;
      int t1 = t0;
      const bool has = fast_run(a, t0, t_end, y, z, KG, f, &t1);  // uniform across the block
      t0 = t1;
      if (!has) continue;
      phase(f, int64_t{0}, 0);
      for (int64_t b = f.blk_lo; b < f.blk_hi; ++b) {
        for (int step = 1; step <= 6; ++step) {
          if (WR && (step == 4 || step == 5)) continue;  // softmax_rows (step 3) did them
          phase(f, b, step);
        }
      }
      phase(f, int64_t{0}, 7);
    }
  }

  __host__ __device__ static void run_phase(const ChanAttentionArgs& a, const Run& f, int64_t b, int step, float* sm,
                                            int tid) {
    switch (step) {
      case 0:
        return init(a, f, sm, tid);
      case 1:
        return decode(a, f, b, sm, tid);
      case 2:
        return dots(sm, tid);
      case 3:
        return WR ? softmax_rows(a, f, b, sm, tid) : scores(a, f, b, sm, tid);
      case 4:
        return rescale(sm, tid);
      case 5:
        return probs(sm, tid);
      case 6:
        return accumulate(sm, tid);
      default:
        return store(a, f, sm, tid);
    }
  }
};

template <int HD, int KG, int TT, bool WR>
__global__ void __launch_bounds__(kFastThreads, TT == 1 ? 5 : 2) chan_fast_kernel(ChanAttentionArgs a) {
  extern __shared__ float4 fast_sm4[];  // float4: 16-byte aligned (the 4-float loads)
  float* sm = reinterpret_cast<float*>(fast_sm4);
  using C = Cta<HD, KG, TT, WR>;
  const int tid = static_cast<int>(threadIdx.x);
  C::each_phase(a, static_cast<int>(blockIdx.x) * TT, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
                [&](const typename C::Run& f, int64_t b, int step) {
                  C::run_phase(a, f, b, step, sm, tid);
                  __syncthreads();
                });
}

// Query t, head h, channel c: its splits merged in split order.
__host__ __device__ inline float combine_one(const ChanAttentionArgs& a, int n_splits, int t, int h, int c) {
  const int hd = a.head_dim;
  const int64_t n_ml = static_cast<int64_t>(a.n_tokens) * a.n_head * kChanMaxSplits;
  const int64_t slot0 = (static_cast<int64_t>(t) * a.n_head + h) * kChanMaxSplits;
  const float* po = a.partials;
  const float* pml = a.partials + n_ml * hd;
  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = pml[2 * (slot0 + s)] > m ? pml[2 * (slot0 + s)] : m;
  float l = 0.0f, o = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float ms = pml[2 * (slot0 + s)];
    const float w = ms == -INFINITY ? 0.0f : chan_exp(ms - m);
    l += w * pml[2 * (slot0 + s) + 1];
    o += w * po[(slot0 + s) * hd + c];
  }
  return o / l;
}

__global__ void chan_fast_combine_kernel(ChanAttentionArgs a) {
  const int t = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int n_splits = token_plan(a, t).n_splits;
  float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * a.head_dim;
  for (int c = static_cast<int>(threadIdx.x); c < a.head_dim; c += static_cast<int>(blockDim.x)) {
    out[c] = n_splits > 0 ? combine_one(a, n_splits, t, h, c) : 0.0f;
  }
}

// chan_fast_combine_kernel with the rotation back fused
// (ChanAttentionArgs::rotated_out): a thread block of HD threads a (token,
// head), thread c combining channel c (combine_one, as the plain combine
// spreads it), then warp 0 rotating the head (hadamard_rotate_warp, lane i
// holding channels i * HD / 32 ..) and writing it in Out:
// rotate_heads_back's bits over the combine's outputs.
template <int HD, typename Out>
__global__ void __launch_bounds__(HD) chan_fast_combine_rotate_kernel(ChanAttentionArgs a) {
  constexpr int kPer = HD / 32;
  __shared__ float head[HD];
  const int t = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), c = static_cast<int>(threadIdx.x);
  const int n_splits = token_plan(a, t).n_splits;
  head[c] = n_splits > 0 ? combine_one(a, n_splits, t, h, c) : 0.0f;
  __syncthreads();
  if (c >= 32) return;  // warp 0 rotates
  float x[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) x[r] = head[c * kPer + r];
  detail::hadamard_rotate_warp<HD>(x);
  Out* dst = static_cast<Out*>(a.rotated_out) + (static_cast<int64_t>(t) * a.n_head + h) * HD + c * kPer;
#pragma unroll
  for (int r = 0; r < kPer; ++r) dst[r] = detail::from_f32<Out>(x[r]);
}

template <int HD>
void combine_rotate(const ChanAttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head));
  RILL_CUDA_DISPATCH_FLOAT(a.rotated_dtype, chan_fast_combine_rotate_kernel<HD, T><<<grid, HD, 0, stream>>>(a));
}

// The smallest block head count (1, 2, 4, 8) that holds the group, 8 at most.
int fast_kg(int group) {
  return group >= 8 ? 8 : group >= 4 ? (group == 4 ? 4 : 8) : group >= 2 ? (group == 2 ? 2 : 4) : 1;
}

template <int HD, int KG, int TT, bool WR = false>
void launch(const ChanAttentionArgs& a, cudaStream_t stream) {
  using C = Cta<HD, KG, TT, WR>;
  if constexpr (C::kBytes > 48 * 1024) {  // the opt-in above 48 KiB (once a kernel)
    static const bool attr = [] {
      RILL_CUDA_CHECK(cudaFuncSetAttribute(chan_fast_kernel<HD, KG, TT, WR>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kBytes)));
      return true;
    }();
    (void)attr;
  }
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + KG - 1) / KG;
  const dim3 grid(static_cast<unsigned>((a.n_tokens + TT - 1) / TT), static_cast<unsigned>(a.n_head_kv * n_chunks),
                  static_cast<unsigned>(chan_split_grid(a.max_keys)));
  chan_fast_kernel<HD, KG, TT, WR><<<grid, kFastThreads, C::kBytes, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

// The host's barrier: each phase for every thread before the next.
template <typename C>
struct HostPhase {
  const ChanAttentionArgs* a;
  float* sm;
  __host__ __device__ void operator()(const FastRun& f, int64_t b, int step) const {
    for (int tid = 0; tid < kFastThreads; ++tid) C::run_phase(*a, f, b, step, sm, tid);
  }
};

template <int HD, int KG, int TT, bool WR = false>
void run_host(const ChanAttentionArgs& a) {
  using C = Cta<HD, KG, TT, WR>;
  std::vector<float> sm(C::kFloats);
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + KG - 1) / KG;
  for (int x = 0; x < (a.n_tokens + TT - 1) / TT; ++x) {
    for (int y = 0; y < a.n_head_kv * n_chunks; ++y) {
      for (int z = 0; z < kChanMaxSplits; ++z) {
        C::each_phase(a, x * TT, y, z, HostPhase<C>{&a, sm.data()});
      }
    }
  }
  for (int t = 0; t < a.n_tokens; ++t) {
    const int n_splits = token_plan(a, t).n_splits;
    for (int h = 0; h < a.n_head; ++h) {
      float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * a.head_dim;
      for (int c = 0; c < a.head_dim; ++c) out[c] = n_splits > 0 ? combine_one(a, n_splits, t, h, c) : 0.0f;
    }
  }
}

// A thread block's rows: kFastTileRows query rows (tokens x heads) when
// a.tile_tokens, so a decoded block serves several tokens.
constexpr int kFastTileRows = 32;

template <int HD, int KG>
void dispatch_tile(const ChanAttentionArgs& a, cudaStream_t stream, bool host) {
  constexpr int TT = kFastTileRows / KG;
  if (a.tile_tokens) return host ? run_host<HD, KG, TT>(a) : launch<HD, KG, TT>(a, stream);
  if (a.warp_softmax) return host ? run_host<HD, KG, 1, true>(a) : launch<HD, KG, 1, true>(a, stream);
  return host ? run_host<HD, KG, 1>(a) : launch<HD, KG, 1>(a, stream);
}

template <int HD>
void dispatch_kg(const ChanAttentionArgs& a, cudaStream_t stream, bool host) {
  switch (fast_kg(a.n_head / a.n_head_kv)) {
    case 1:
      return dispatch_tile<HD, 1>(a, stream, host);
    case 2:
      return dispatch_tile<HD, 2>(a, stream, host);
    case 4:
      return dispatch_tile<HD, 4>(a, stream, host);
    default:
      return dispatch_tile<HD, 8>(a, stream, host);
  }
}

void dispatch(const ChanAttentionArgs& a, cudaStream_t stream, bool host) {
  switch (a.head_dim) {
    case 64:
      return dispatch_kg<64>(a, stream, host);
    case 128:
      return dispatch_kg<128>(a, stream, host);
    default:
      return dispatch_kg<256>(a, stream, host);
  }
}

[[noreturn]] void unsupported(int32_t head_dim) {
  std::fprintf(stderr, "chan_attention_fast: head_dim %d (64, 128 or 256 only)\n", head_dim);
  std::abort();
}

}  // namespace

bool chan_attention_fast_supported(int32_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

size_t chan_fast_partial_floats(int64_t n_tokens, int32_t n_head, int32_t head_dim) {
  return static_cast<size_t>(n_tokens) * static_cast<size_t>(n_head) * kChanMaxSplits *
         (static_cast<size_t>(head_dim) + 2);
}

void chan_attention_fast(const ChanAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0 || a.n_head <= 0) return;
  if (!chan_attention_fast_supported(a.head_dim)) unsupported(a.head_dim);
  dispatch(a, stream, false);
  if (a.rotated_out) {
    if (a.head_dim == 64) combine_rotate<64>(a, stream);
    if (a.head_dim == 128) combine_rotate<128>(a, stream);
    if (a.head_dim == 256) combine_rotate<256>(a, stream);
  } else {
    const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head));
    chan_fast_combine_kernel<<<grid, 128, 0, stream>>>(a);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void chan_attention_fast_host(const ChanAttentionArgs& a) {
  if (a.n_tokens <= 0 || a.n_head <= 0) return;
  if (!chan_attention_fast_supported(a.head_dim)) unsupported(a.head_dim);
  dispatch(a, nullptr, true);
}

}  // namespace rill::cuda
