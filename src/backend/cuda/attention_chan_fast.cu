// The fast k4c / k4a attention (attention_chan.h chan_attention_fast).
//
// Grid (query token, KV head x head chunk, key split), kFastThreads threads.
// A block owns up to KG query heads of one KV head (the GQA group, 8 at most
// a block: a K group and a V row are decoded once for all of them) and the
// KV blocks of one split (attention_chan_split.h). For each KV block of 32
// keys:
//   1. decode: K into shared f32 rows k[r][c] = z_c + d_c / 16 * code_rc
//      (q4c's nibbles, or q4a's bit planes at the channel's width; the
//      query's own block from its q8_0 tail / step rows), V's 32 rows
//      (iq4_nlh64 levels, or q8_0) into v[r][c]; keys outside the query's
//      range get v = 0 (and a -inf score, so garbage never reaches out);
//   2. dots: a (key, quarter of the channels) a thread, every head of the
//      block at once (k's element read once for the KG heads);
//   3. scores: s[r][g] = capped(q_g . k_r * scale) from the quarters;
//   4. the running max per head (a thread a head) and its correction;
//   5. p[r][g] = exp(s - m), a (key, head) a thread;
//   6. o[g][c] = o * corr + sum_r p[r][g] v[r][c] (a channel a thread,
//      every head at once, keys in order) and l[g] = l * corr + sum_r
//      p[r][g] (a thread a head).
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
// exactly as the CPU's dequantize_chan_block computes it).
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
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_rotated.cuh"
#include "backend/cuda/kv_types.cuh"

namespace rill::cuda {
namespace {

using detail::chan_capped;
using detail::chan_exp;
using detail::chan_q8_value;
using detail::e4m3_to_float;
using detail::f16_value;

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

// One thread block's work: token t, KV head kvh, query heads [h0, h0 + gh),
// the KV blocks [blk_lo, blk_hi) of split `split`.
struct FastQuery {
  int t = 0, kvh = 0, h0 = 0, gh = 0, seq = 0, split = 0;
  int64_t j_begin = 0, j_end = 0, own = 0, c0 = 0, tail_start = 0, blk_lo = 0, blk_hi = 0;
  const int32_t* table = nullptr;
  int64_t W = 0;
  size_t tail_row = 0;
};

__host__ __device__ inline ChanSplit token_plan(const ChanAttentionArgs& a, int t) {
  int64_t jb = 0, je = 0;
  chan_key_range(a.pos[t], a.window, &jb, &je);
  return chan_split_plan(jb, je);
}

// n_chunks: thread blocks a KV head (ceil(group / KG)). False: no work.
__host__ __device__ inline bool fast_query(const ChanAttentionArgs& a, int t, int y, int z, int kg, FastQuery& f) {
  const ChanSplit plan = token_plan(a, t);
  if (z >= plan.n_splits) return false;
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + kg - 1) / kg, chunk = y % n_chunks;
  f.t = t;
  f.kvh = y / n_chunks;
  f.h0 = f.kvh * group + chunk * kg;
  f.gh = group - chunk * kg < kg ? group - chunk * kg : kg;
  f.split = z;
  chan_key_range(a.pos[t], a.window, &f.j_begin, &f.j_end);
  f.own = (f.j_end - 1) - (f.j_end - 1) % kT;
  chan_split_blocks(plan, z, &f.blk_lo, &f.blk_hi);
  f.seq = a.seq_of[t];
  f.c0 = a.c0[f.seq];
  f.tail_start = f.c0 - f.c0 % kT;
  f.table = a.block_tables + a.table_start[f.seq];
  f.W = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
  f.tail_row = static_cast<size_t>(f.W / 32 * 34);
  return true;
}

__host__ __device__ inline const uint8_t* own_row(const ChanAttentionArgs& a, const FastQuery& f, const uint8_t* tail,
                                                  const uint8_t* step, int64_t j) {
  return j < f.c0 ? tail + static_cast<size_t>(j - f.tail_start) * f.tail_row
                  : step + static_cast<size_t>(a.q_start[f.seq] + (j - f.c0)) * f.tail_row;
}

// Shared memory of a block (floats; every region 16-byte aligned): q
// transposed [HD][KG], k [32][HD + 4], v [32][HD], the dots' parts
// [4][KG][32], s [32][KG], o [KG][HD], m, l, corr [KG].
template <int HD, int KG>
struct Cta {
  // k's rows 16-byte aligned for the dot phase's 4-float loads, and 4
  // floats longer than HD: a quarter warp's rows r..r+7 then start 4 banks
  // apart (HD + 4 = 4 mod 32), so the loads are conflict-free.
  static constexpr int kKStride = HD + 4;
  static constexpr int kParts = kFastThreads / kT;  // the score phase's channel parts (4)
  static_assert(kParts == 4 && HD % (4 * kParts) == 0, "scores() sums 4 parts of whole float4s");
  static constexpr int kQ = 0;                      // q transposed: [HD][KG]
  static constexpr int kK = kQ + KG * HD;           // [32][HD + 1]
  static constexpr int kV = kK + kT * kKStride;     // [32][HD]
  static constexpr int kP = kV + kT * HD;           // partial scores [kParts][KG][32]
  static constexpr int kS = kP + kParts * KG * kT;  // scores, then probabilities: [32][KG]
  static constexpr int kO = kS + KG * kT;
  static constexpr int kM = kO + KG * HD;
  static constexpr int kL = kM + KG;
  static constexpr int kC = kL + KG;
  static constexpr int kFloats = kC + KG;
  static constexpr size_t kBytes = sizeof(float) * kFloats;
  static_assert(kK % 4 == 0 && kV % 4 == 0 && kP % 4 == 0 && kS % 4 == 0, "16-byte aligned regions");

  __host__ __device__ static void init(const ChanAttentionArgs& a, const FastQuery& f, float* sm, int tid) {
    for (int i = tid; i < KG * HD; i += kFastThreads) {
      const int g = i / HD, c = i % HD;
      sm[kQ + c * KG + g] = g < f.gh ? a.q[f.t * a.q_stride + static_cast<int64_t>(f.h0 + g) * HD + c] : 0.0f;
      sm[kO + i] = 0.0f;
    }
    if (tid < KG) {
      sm[kM + tid] = -INFINITY;
      sm[kL + tid] = 0.0f;
      sm[kC + tid] = 1.0f;
    }
  }

  // Block b's keys [lo, hi) (within the query's range) into k and v.
  __host__ __device__ static void decode(const ChanAttentionArgs& a, const FastQuery& f, int64_t b, float* sm,
                                         int tid) {
    const int64_t b0 = b * kT;
    const int64_t lo = f.j_begin > b0 ? f.j_begin : b0, hi = f.j_end < b0 + kT ? f.j_end : b0 + kT;
    float* k = sm + kK;
    float* v = sm + kV;
    const int64_t head = static_cast<int64_t>(f.kvh) * HD;
    if (b0 < f.own) {  // a pool block: all 32 rows encoded
      const uint8_t* blk = a.k_blocks + static_cast<size_t>(f.table[b]) * a.block_stride;
      const auto* zs = reinterpret_cast<const uint16_t*>(blk) + head;
      const uint8_t* ds = blk + 2 * f.W + head;
      // K: a (channel, half of the keys) a thread.
      for (int i = tid; i < 2 * HD; i += kFastThreads) {
        const int c = i % HD, half = i / HD;
        const float z = f16_value(zs[c]), d = e4m3_to_float(ds[c]) * 0.0625f;
        if (a.k_widths) {  // q4a: keys [16 half, 16 half + 16) from the channel's planes
          const int width = a.k_widths[head + c];
          const uint8_t* p = blk + alloc_plane_offsets(a.k_widths, f.W)[head + c];
          uint32_t code[16];
          RILL_DEVICE_UNROLL
          for (int r = 0; r < 16; ++r) code[r] = 0;
          for (int bit = 0; bit < width; ++bit) {
            const uint32_t plane = word_at(p + 4 * bit) >> (16 * half);
            RILL_DEVICE_UNROLL
            for (int r = 0; r < 16; ++r) code[r] |= ((plane >> r) & 1u) << bit;
          }
          RILL_DEVICE_UNROLL
          for (int r = 0; r < 16; ++r) k[(16 * half + r) * kKStride + c] = z + d * static_cast<float>(code[r]);
        } else {  // q4c: bytes [8 half, 8 half + 8) of the channel's 16: keys i (low) and i + 16 (high)
          const uint8_t* qs = blk + 3 * f.W + (head + c) * (kT / 2) + 8 * half;
          const uint32_t w[2] = {word_at(qs), word_at(qs + 4)};
          RILL_DEVICE_UNROLL
          for (int e = 0; e < 8; ++e) {
            const uint32_t byte = (w[e / 4] >> (8 * (e % 4))) & 0xFFu;
            const int r = 8 * half + e;
            k[r * kKStride + c] = z + d * static_cast<float>(byte & 0xFu);
            k[(r + 16) * kKStride + c] = z + d * static_cast<float>(byte >> 4);
          }
        }
      }
      // V: 4 channels of a row a thread; rows outside [lo, hi) zero.
      const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
      const uint8_t* vblk = a.v_blocks + static_cast<size_t>(f.table[b]) * v_stride;
      for (int i = tid; i < kT * (HD / 4); i += kFastThreads) {
        const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (b0 + r >= lo && b0 + r < hi) {
          detail::KvIq4Nl64::load4(vblk + static_cast<size_t>(r) * a.v_row_bytes, head + c, x);
        }
        RILL_DEVICE_UNROLL
        for (int e = 0; e < 4; ++e) v[r * HD + c + e] = x[e];
      }
      return;
    }
    // The own block: the q8_0 rows of the tail (before c0) and the step.
    for (int i = tid; i < kT * HD; i += kFastThreads) {
      const int r = i / HD, c = i % HD;
      const int64_t j = b0 + r;
      float kx = 0.0f, vx = 0.0f;
      if (j >= lo && j < hi) {
        kx = chan_q8_value(own_row(a, f, a.tail_k[f.seq], a.step_k, j), head + c);
        vx = chan_q8_value(own_row(a, f, a.tail_v[f.seq], a.step_v, j), head + c);
      }
      k[r * kKStride + c] = kx;
      v[r * HD + c] = vx;
    }
  }

  // Partial dots: a (key r, channel part) a thread, every head at once (the
  // key's element read once for the KG heads, q's a broadcast).
  __host__ __device__ static void dots(float* sm, int tid) {
    for (int i = tid; i < kParts * kT; i += kFastThreads) {
      const int part = i / kT, r = i % kT;
      const float* k = sm + kK + r * kKStride;
      float acc[KG];
      RILL_DEVICE_UNROLL
      for (int g = 0; g < KG; ++g) acc[g] = 0.0f;
      RILL_FAST_UNROLL8
      for (int c = part * (HD / kParts); c < (part + 1) * (HD / kParts); c += 4) {
        float kc[4];
        ld4(k + c, kc);
        RILL_DEVICE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const float* q = sm + kQ + (c + e) * KG;
          if constexpr (KG % 4 == 0) {
            RILL_DEVICE_UNROLL
            for (int g = 0; g < KG; g += 4) {
              float qv[4];
              ld4(q + g, qv);
              RILL_DEVICE_UNROLL
              for (int u = 0; u < 4; ++u) acc[g + u] += qv[u] * kc[e];
            }
          } else {
            RILL_DEVICE_UNROLL
            for (int g = 0; g < KG; ++g) acc[g] += q[g] * kc[e];
          }
        }
      }
      RILL_DEVICE_UNROLL
      for (int g = 0; g < KG; ++g) sm[kP + (part * KG + g) * kT + r] = acc[g];
    }
  }

  // s[r][g]: key b0 + r's capped, scaled score for head g (-inf outside).
  __host__ __device__ static void scores(const ChanAttentionArgs& a, const FastQuery& f, int64_t b, float* sm,
                                         int tid) {
    const int64_t b0 = b * kT;
    const int64_t lo = f.j_begin > b0 ? f.j_begin : b0, hi = f.j_end < b0 + kT ? f.j_end : b0 + kT;
    for (int i = tid; i < KG * kT; i += kFastThreads) {
      const int g = i / kT, r = i % kT;
      float sc = -INFINITY;
      if (g < f.gh && b0 + r >= lo && b0 + r < hi) {
        const float* p = sm + kP + g * kT + r;  // part j at p[j * KG * kT]
        const float dot = (p[0] + p[KG * kT]) + (p[2 * KG * kT] + p[3 * KG * kT]);
        sc = chan_capped(dot * a.scale, a.softcap);
      }
      sm[kS + r * KG + g] = sc;
    }
  }

  // Head g's running max over the block and the old sums' correction.
  __host__ __device__ static void rescale(float* sm, int tid) {
    if (tid >= KG) return;
    const float m_old = sm[kM + tid];
    float m = m_old;
    for (int r = 0; r < kT; ++r) m = sm[kS + r * KG + tid] > m ? sm[kS + r * KG + tid] : m;
    sm[kC + tid] = m == -INFINITY ? 1.0f : chan_exp(m_old - m);  // exp(-inf) = 0 for the first block
    sm[kM + tid] = m;
  }

  __host__ __device__ static void probs(float* sm, int tid) {
    for (int i = tid; i < KG * kT; i += kFastThreads) {
      const float s = sm[kS + i];
      sm[kS + i] = s == -INFINITY ? 0.0f : chan_exp(s - sm[kM + i % KG]);
    }
  }

  // A channel a thread, every head at once (V's element read once for the
  // KG heads, the probabilities a broadcast), keys in order.
  __host__ __device__ static void accumulate(float* sm, int tid) {
    for (int c = tid; c < HD; c += kFastThreads) {
      float acc[KG];
      RILL_DEVICE_UNROLL
      for (int g = 0; g < KG; ++g) acc[g] = 0.0f;
      RILL_FAST_UNROLL8
      for (int r = 0; r < kT; ++r) {
        const float v = sm[kV + r * HD + c];
        const float* p = sm + kS + r * KG;
        if constexpr (KG % 4 == 0) {
          RILL_DEVICE_UNROLL
          for (int g = 0; g < KG; g += 4) {
            float pv[4];
            ld4(p + g, pv);
            RILL_DEVICE_UNROLL
            for (int u = 0; u < 4; ++u) acc[g + u] += pv[u] * v;
          }
        } else {
          RILL_DEVICE_UNROLL
          for (int g = 0; g < KG; ++g) acc[g] += p[g] * v;
        }
      }
      RILL_DEVICE_UNROLL
      for (int g = 0; g < KG; ++g) sm[kO + g * HD + c] = sm[kO + g * HD + c] * sm[kC + g] + acc[g];
    }
    if (tid < KG) {
      float sum = 0.0f;
      for (int r = 0; r < kT; ++r) sum += sm[kS + r * KG + tid];
      sm[kL + tid] = sm[kL + tid] * sm[kC + tid] + sum;
    }
  }

  // The split's unnormalized outputs, max and sum into a.partials.
  __host__ __device__ static void store(const ChanAttentionArgs& a, const FastQuery& f, const float* sm, int tid) {
    const int64_t n_ml = static_cast<int64_t>(a.n_tokens) * a.n_head * kChanMaxSplits;
    float* po = a.partials;
    float* pml = a.partials + n_ml * HD;
    for (int i = tid; i < KG * HD; i += kFastThreads) {
      const int g = i / HD, c = i % HD;
      if (g >= f.gh) continue;
      const int64_t slot = (static_cast<int64_t>(f.t) * a.n_head + f.h0 + g) * kChanMaxSplits + f.split;
      po[slot * HD + c] = sm[kO + i];
    }
    if (tid < f.gh) {
      const int64_t slot = (static_cast<int64_t>(f.t) * a.n_head + f.h0 + tid) * kChanMaxSplits + f.split;
      pml[2 * slot] = sm[kM + tid];
      pml[2 * slot + 1] = sm[kL + tid];
    }
  }
};

template <int HD, int KG>
__global__ void __launch_bounds__(kFastThreads) chan_fast_kernel(ChanAttentionArgs a) {
  extern __shared__ float4 fast_sm4[];  // float4: 16-byte aligned (the 4-float loads)
  float* fast_sm = reinterpret_cast<float*>(fast_sm4);
  using C = Cta<HD, KG>;
  FastQuery f;
  if (!fast_query(a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z), KG, f)) {
    return;  // beyond this query's splits (uniform across the block)
  }
  const int tid = static_cast<int>(threadIdx.x);
  C::init(a, f, fast_sm, tid);
  __syncthreads();
  for (int64_t b = f.blk_lo; b < f.blk_hi; ++b) {
    C::decode(a, f, b, fast_sm, tid);
    __syncthreads();
    C::dots(fast_sm, tid);
    __syncthreads();
    C::scores(a, f, b, fast_sm, tid);
    __syncthreads();
    C::rescale(fast_sm, tid);
    __syncthreads();
    C::probs(fast_sm, tid);
    __syncthreads();
    C::accumulate(fast_sm, tid);
    __syncthreads();
  }
  C::store(a, f, fast_sm, tid);
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

// The smallest block head count (1, 2, 4, 8) that holds the group, 8 at most.
int fast_kg(int group) {
  return group >= 8 ? 8 : group >= 4 ? (group == 4 ? 4 : 8) : group >= 2 ? (group == 2 ? 2 : 4) : 1;
}

template <int HD, int KG>
void launch(const ChanAttentionArgs& a, cudaStream_t stream) {
  using C = Cta<HD, KG>;
  if constexpr (C::kBytes > 48 * 1024) {  // head_dim 256: the opt-in (once; 64 and 128 never call it)
    static const bool attr = [] {
      RILL_CUDA_CHECK(cudaFuncSetAttribute(chan_fast_kernel<HD, KG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(C::kBytes)));
      return true;
    }();
    (void)attr;
  }
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + KG - 1) / KG;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head_kv * n_chunks),
                  static_cast<unsigned>(chan_split_grid(a.max_keys)));
  chan_fast_kernel<HD, KG><<<grid, kFastThreads, C::kBytes, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

template <int HD, int KG>
void run_host(const ChanAttentionArgs& a) {
  using C = Cta<HD, KG>;
  std::vector<float> sm(C::kFloats);
  const int group = a.n_head / a.n_head_kv, n_chunks = (group + KG - 1) / KG;
  for (int t = 0; t < a.n_tokens; ++t) {
    for (int y = 0; y < a.n_head_kv * n_chunks; ++y) {
      for (int z = 0; z < kChanMaxSplits; ++z) {
        FastQuery f;
        if (!fast_query(a, t, y, z, KG, f)) continue;
        for (int tid = 0; tid < kFastThreads; ++tid) C::init(a, f, sm.data(), tid);
        for (int64_t b = f.blk_lo; b < f.blk_hi; ++b) {
          for (int tid = 0; tid < kFastThreads; ++tid) C::decode(a, f, b, sm.data(), tid);
          for (int tid = 0; tid < kFastThreads; ++tid) C::dots(sm.data(), tid);
          for (int tid = 0; tid < kFastThreads; ++tid) C::scores(a, f, b, sm.data(), tid);
          for (int tid = 0; tid < kFastThreads; ++tid) C::rescale(sm.data(), tid);
          for (int tid = 0; tid < kFastThreads; ++tid) C::probs(sm.data(), tid);
          for (int tid = 0; tid < kFastThreads; ++tid) C::accumulate(sm.data(), tid);
        }
        for (int tid = 0; tid < kFastThreads; ++tid) C::store(a, f, sm.data(), tid);
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

template <int HD>
void dispatch_kg(const ChanAttentionArgs& a, cudaStream_t stream, bool host) {
  switch (fast_kg(a.n_head / a.n_head_kv)) {
    case 1:
      return host ? run_host<HD, 1>(a) : launch<HD, 1>(a, stream);
    case 2:
      return host ? run_host<HD, 2>(a) : launch<HD, 2>(a, stream);
    case 4:
      return host ? run_host<HD, 4>(a) : launch<HD, 4>(a, stream);
    default:
      return host ? run_host<HD, 8>(a) : launch<HD, 8>(a, stream);
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
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head));
  chan_fast_combine_kernel<<<grid, 128, 0, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void chan_attention_fast_host(const ChanAttentionArgs& a) {
  if (a.n_tokens <= 0 || a.n_head <= 0) return;
  if (!chan_attention_fast_supported(a.head_dim)) unsupported(a.head_dim);
  dispatch(a, nullptr, true);
}

}  // namespace rill::cuda
