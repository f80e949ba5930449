// The per-channel K encoders of k4c and k4a on the device (kv_chan.h), a
// port of cpu::quantize_chan_values (backend/cpu/kv_quant.cpp, encoder
// revision cpu::kKvChanEncoder) at 4 bits (q4c) or a channel's own width
// (q4a, 0..8 bits) that gives the CPU's bytes for the same floats: every
// operation the CPU does in order is done here in the same order with
// explicitly rounded intrinsics (no FMA contraction; the CPU file is
// compiled without FMA), the minimum and maximum by the CPU's own
// comparisons (std::min / std::max: NaNs skipped, a zero's sign as they
// leave it), and each error a serial sum over the channel's 32 tokens.
// q4c: one thread a channel. q4a: one warp a channel (docs/perf.md's plan),
// its lanes over the search's candidates rather than the tokens: every
// candidate's error is a serial double sum over the 32 tokens in the CPU's
// order, so lanes over tokens would still wait on that chain, while a
// channel at 8 bits in a sequence's first block has 1,290 candidates to
// try; the planes then come from one __ballot_sync each (lane j: token j).
#include "backend/cuda/kv_chan.h"

#include <cuda_fp16.h>

#include <cassert>
#include <cstring>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/kv_rotated.cuh"

namespace rill::cuda {
namespace {

// A new CPU revision fails the build here until the kernel follows it.
static_assert(cpu::kKvChanEncoder == 3, "update chan_encode_kernel to the CPU's quantize_chan_block");
constexpr int kT = cpu::kKvChanTokens;
static_assert(kT == 32, "a channel's codes pack into 8 words of 4 bytes, a plane into one word");
static_assert(cpu::kKvChanMaxBits == 8, "a code fits a byte");
constexpr int kThreads = 128;

using detail::add_rn;
using detail::dadd_rn;
using detail::ddiv_rn;
using detail::div_rn;
using detail::dmul_rn;
using detail::double_to_float_rn;
using detail::dsub_rn;
using detail::e4m3_round_bits;
using detail::e4m3_to_float;
using detail::f16_value;
using detail::mul_rn;
using detail::sub_rn;

// f16 bits of the largest f16 value <= x (the CPU's f16_at_or_below).
__host__ __device__ __forceinline__ uint16_t f16_at_or_below(float x) {
  auto h = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(x)));
  if (f16_value(static_cast<uint16_t>(h)) > x) h = (h & 0x8000u) ? h + 1 : h == 0 ? 0x8001u : h - 1;
  return static_cast<uint16_t>(h);
}
// The CPU's f32_to_f16 of a finite or infinite x (a NaN z never wins a
// search: its error is NaN).
__host__ __device__ __forceinline__ uint16_t f16_of(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
// The CPU's nearest_code(y, 0, n_levels): nearbyint, NaN -> 0, clamped.
__host__ __device__ __forceinline__ int nearest_code(float y, int n_levels) {
  const float r = rintf(y);
  if (isnan(r)) return 0;
  return static_cast<int>(r < 0.0f ? 0.0f : static_cast<float>(n_levels) < r ? static_cast<float>(n_levels) : r);
}

// The codes of a channel, 0..255 (token j in byte j % 4 of word j / 4).
struct Codes {
  uint32_t w[kT / 4] = {};
  __host__ __device__ int at(int j) const { return static_cast<int>((w[j / 4] >> (8 * (j % 4))) & 0xFFu); }
};

// The squared error of x stored as zero zh and step code `code` (token 0
// weighted w0) with codes 0..n_levels, its codes into cand: the CPU's
// error_of.
__host__ __device__ __forceinline__ double error_of(const float (&x)[kT], int n_levels, uint16_t zh, uint32_t code,
                                                    double w0, Codes& cand) {
  const float zf = f16_value(zh), step = mul_rn(e4m3_to_float(code), 0.0625f);
  const float inv = step > 0.0f ? div_rn(1.0f, step) : 0.0f;
  double err = 0.0;
  RILL_DEVICE_UNROLL
  for (int w = 0; w < kT / 4; ++w) cand.w[w] = 0;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    const int c = nearest_code(mul_rn(sub_rn(x[j], zf), inv), n_levels);
    cand.w[j / 4] |= static_cast<uint32_t>(c) << (8 * (j % 4));
    const double e =
        dsub_rn(static_cast<double>(x[j]), static_cast<double>(add_rn(zf, mul_rn(step, static_cast<float>(c)))));
    err = dadd_rn(err, dmul_rn(j == 0 ? w0 : 1.0, dmul_rn(e, e)));
  }
  return err;
}

// One channel's 32 values x encoded at `bits` bits (1..8; q4c calls it at
// 4): the CPU's quantize_chan_values, in its order: the zero's f16 bits,
// the step's e4m3 code and the 32 codes.
__host__ __device__ inline void encode_channel(const float (&x)[kT], int bits, bool sequence_start, uint16_t* z_out,
                                               uint8_t* d_out, Codes& q) {
  const int n_levels = (1 << bits) - 1;
  const double w0 = sequence_start ? cpu::kKvChanSinkWeight : 1.0;
  float mn = INFINITY, mx = -INFINITY;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    mn = x[j] < mn ? x[j] : mn;  // std::min(mn, x[j])
    mx = mx < x[j] ? x[j] : mx;  // std::max(mx, x[j])
  }
  uint16_t best_z = f16_at_or_below(mn);
  uint32_t best_code = 0;
  RILL_DEVICE_UNROLL
  for (int w = 0; w < kT / 4; ++w) q.w[w] = 0;
  Codes cand;
  double best = INFINITY;
  auto consider = [&](uint16_t zh, uint32_t code) {
    const double err = error_of(x, n_levels, zh, code, w0, cand);
    if (err < best) {
      best = err;
      best_z = zh;
      best_code = code;
      q = cand;
    }
  };
  const float z_lo = f16_value(best_z);
  if (mx > z_lo) {
    const int c0 =
        static_cast<int>(e4m3_round_bits(mul_rn(div_rn(sub_rn(mx, z_lo), static_cast<float>(n_levels)), 16.0f)));
    const uint16_t z0 = best_z;
    const int first = c0 - 1 > 1 ? c0 - 1 : 1, last = c0 + 3 < 0x7e ? c0 + 3 : 0x7e;
    for (int code = first; code <= last; ++code) {
      const auto k = static_cast<uint32_t>(code);
      consider(z0, k);  // cand: z0's codes (the CPU computes them a second time)
      const float step = mul_rn(e4m3_to_float(k), 0.0625f);
      double sum = 0.0;
      RILL_DEVICE_UNROLL
      for (int j = 0; j < kT; ++j) {
        sum = dadd_rn(sum, dsub_rn(static_cast<double>(x[j]),
                                   dmul_rn(static_cast<double>(step), static_cast<double>(cand.at(j)))));
      }
      consider(f16_of(double_to_float_rn(ddiv_rn(sum, static_cast<double>(kT)))), k);
      if (sequence_start) {
        for (int code0 = 0; code0 <= n_levels; ++code0) {
          consider(f16_of(sub_rn(x[0], mul_rn(step, static_cast<float>(code0)))), k);
        }
      }
    }
  }
  *z_out = best_z;
  *d_out = static_cast<uint8_t>(best_code);
}

// q4c's channel: 4 bits, 16 code bytes (token j < 16 low nibble of byte j).
__host__ __device__ inline void encode_chan4(const float (&x)[kT], bool sequence_start, uint16_t* z_out, uint8_t* d_out,
                                             uint8_t* qs_out) {
  Codes q;
  encode_channel(x, 4, sequence_start, z_out, d_out, q);
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT / 2; ++j) qs_out[j] = static_cast<uint8_t>(q.at(j) | (q.at(j + kT / 2) << 4));
}

// q4a's channel search spread over a warp's lanes by candidate (the
// channel's encoder in chan_encode_warp_kernel): the CPU tries its
// candidates one after the other and keeps the first of least error
// (a strict <, so a NaN or infinite error never wins); here candidate i
// (in the CPU's trial order) goes to lane i % 32, each lane keeps its
// first least error, and the warp takes the least (error, i) pair: the
// same winner. Each candidate's error is still one serial sum over the 32
// tokens in the CPU's order, so the bits are the CPU's. A sequence's
// first block at 8 bits has 5 x 258 candidates (q4c's: 5 x 18), which one
// thread tried in turn (measured on the host: 204 us a channel against
// 15 us at 4 bits and 2.6 us for a later block), so that block's kernel
// waited on its widest channels.
struct ChanSearch {
  int n_levels = 0;
  double w0 = 1.0;
  uint16_t z_lo = 0;  // the f16 at or below the minimum: every step's z0, and z without a candidate
  int first = 0;      // the first step code tried
  int per_code = 1;   // candidates per step code: z0, the refit, then the sink's grids
  int n_cand = 0;     // 0: none (one value, or bits 0)
};

__host__ __device__ inline ChanSearch plan_search(const float (&x)[kT], int bits, bool sequence_start) {
  ChanSearch s;
  s.n_levels = (1 << bits) - 1;
  s.w0 = sequence_start ? cpu::kKvChanSinkWeight : 1.0;
  float mn = INFINITY, mx = -INFINITY;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    mn = x[j] < mn ? x[j] : mn;  // std::min(mn, x[j])
    mx = mx < x[j] ? x[j] : mx;  // std::max(mx, x[j])
  }
  s.z_lo = f16_at_or_below(mn);
  const float z_lo = f16_value(s.z_lo);
  if (bits > 0 && mx > z_lo) {
    const int c0 =
        static_cast<int>(e4m3_round_bits(mul_rn(div_rn(sub_rn(mx, z_lo), static_cast<float>(s.n_levels)), 16.0f)));
    s.first = c0 - 1 > 1 ? c0 - 1 : 1;
    const int last = c0 + 3 < 0x7e ? c0 + 3 : 0x7e;
    s.per_code = 2 + (sequence_start ? s.n_levels + 1 : 0);
    s.n_cand = (last - s.first + 1) * s.per_code;
  }
  return s;
}

// Candidate i's zero (f16 bits) and step code: z0; z refit to the mean of
// x - step q with q z0's codes; z through x_0 at code i - 2 (the sink).
__host__ __device__ inline uint16_t candidate_z(const float (&x)[kT], const ChanSearch& s, int i, uint32_t* code) {
  const int o = i % s.per_code;
  *code = static_cast<uint32_t>(s.first + i / s.per_code);
  if (o == 0) return s.z_lo;
  const float step = mul_rn(e4m3_to_float(*code), 0.0625f);
  if (o >= 2) return f16_of(sub_rn(x[0], mul_rn(step, static_cast<float>(o - 2))));
  const float zf = f16_value(s.z_lo), inv = step > 0.0f ? div_rn(1.0f, step) : 0.0f;
  double sum = 0.0;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    const int c = nearest_code(mul_rn(sub_rn(x[j], zf), inv), s.n_levels);
    sum = dadd_rn(sum, dsub_rn(static_cast<double>(x[j]), dmul_rn(static_cast<double>(step), static_cast<double>(c))));
  }
  return f16_of(double_to_float_rn(ddiv_rn(sum, static_cast<double>(kT))));
}

// error_of's sum without the codes.
__host__ __device__ inline double candidate_error(const float (&x)[kT], const ChanSearch& s, uint16_t zh,
                                                  uint32_t code) {
  const float zf = f16_value(zh), step = mul_rn(e4m3_to_float(code), 0.0625f);
  const float inv = step > 0.0f ? div_rn(1.0f, step) : 0.0f;
  double err = 0.0;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    const int c = nearest_code(mul_rn(sub_rn(x[j], zf), inv), s.n_levels);
    const double e =
        dsub_rn(static_cast<double>(x[j]), static_cast<double>(add_rn(zf, mul_rn(step, static_cast<float>(c)))));
    err = dadd_rn(err, dmul_rn(j == 0 ? s.w0 : 1.0, dmul_rn(e, e)));
  }
  return err;
}

// A lane's candidates lane, lane + 32, ...: its first least error.
constexpr int kNoCandidate = 0x7fffffff;
__host__ __device__ inline void lane_best(const float (&x)[kT], const ChanSearch& s, int lane, double* best,
                                          int* best_i) {
  *best = INFINITY;
  *best_i = kNoCandidate;
  for (int i = lane; i < s.n_cand; i += 32) {
    uint32_t code = 0;
    const uint16_t zh = candidate_z(x, s, i, &code);
    const double err = candidate_error(x, s, zh, code);
    if (err < *best) {
      *best = err;
      *best_i = i;
    }
  }
}

// (err, i) pairs by error, then index: associative, so the warp's
// butterfly and the host's loop over lanes agree.
__host__ __device__ inline void keep_better(double* best, int* best_i, double err, int i) {
  if (err < *best || (err == *best && i < *best_i)) {
    *best = err;
    *best_i = i;
  }
}

// A channel of 0 bits: z alone, the mean (token 0 at a sequence's start)
// when finite, else z_lo (quantize_chan_values' bits 0).
__host__ __device__ inline uint16_t zero_bits_z(const float (&x)[kT], const ChanSearch& s, bool sequence_start) {
  double mean = static_cast<double>(x[0]);
  if (!sequence_start) {
    double sum = 0.0;
    for (int j = 0; j < kT; ++j) sum = dadd_rn(sum, static_cast<double>(x[j]));
    mean = ddiv_rn(sum, static_cast<double>(kT));
  }
  return isfinite(mean) ? f16_of(double_to_float_rn(mean)) : s.z_lo;
}

// Token xj's code under the winner (zh, code); 0 without one.
__host__ __device__ inline int winner_code(float xj, const ChanSearch& s, int best_i, uint16_t zh, uint32_t code) {
  if (best_i == kNoCandidate) return 0;
  const float zf = f16_value(zh), step = mul_rn(e4m3_to_float(code), 0.0625f);
  const float inv = step > 0.0f ? div_rn(1.0f, step) : 0.0f;
  return nearest_code(mul_rn(sub_rn(xj, zf), inv), s.n_levels);
}

// Element c of a row of width elements in dtype Q8_0 (f16 d times the int8
// code, the CPU's dequant_q8_0) or F32.
template <bool kQ8>
__device__ __forceinline__ float row_value(const uint8_t* row, int c) {
  if constexpr (kQ8) {
    const uint8_t* blk = row + (c / 32) * 34;
    const float d = __half2float(*reinterpret_cast<const __half*>(blk));
    return mul_rn(static_cast<float>(static_cast<int8_t>(blk[2 + c % 32])), d);
  } else {
    return reinterpret_cast<const float*>(row)[c];
  }
}

// Grid (n_units, channel groups of kThreads): thread c of unit u encodes
// channel c of u's block.
template <bool kQ8>
__global__ void __launch_bounds__(kThreads) chan_encode_kernel(ChanEncodeArgs a) {
  const int u = blockIdx.x;
  const int c = blockIdx.y * kThreads + threadIdx.x;
  if (c >= a.width || (a.n_units_dev && u >= *a.n_units_dev)) return;
  const int64_t width = a.width;
  float x[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) x[j] = row_value<kQ8>(a.rows[static_cast<int64_t>(u) * kT + j], c);
  uint8_t* dst = a.dst[u];
  const bool start = a.sequence_start[u] != 0;
  auto* z = reinterpret_cast<uint16_t*>(dst) + c;
  encode_chan4(x, start, z, dst + 2 * width + c, dst + 3 * width + static_cast<int64_t>(c) * (kT / 2));
}

// q4a: grid (n_units, channel groups of kThreads / 32): warp w of block y
// of unit u encodes channel y * 4 + w of u's block; lane j reads token j,
// the warp shares the 32 values, searches by candidate (lane_best), takes
// the least (error, index) by a butterfly, and lane j codes token j, so
// plane k is one __ballot_sync (bit j = token j), written by lane k.
template <bool kQ8>
__global__ void __launch_bounds__(kThreads) chan_encode_warp_kernel(ChanEncodeArgs a) {
  constexpr int kWarps = kThreads / 32;
  const int u = blockIdx.x, lane = static_cast<int>(threadIdx.x % 32);
  const int c = static_cast<int>(blockIdx.y) * kWarps + static_cast<int>(threadIdx.x / 32);
  if (c >= a.width || (a.n_units_dev && u >= *a.n_units_dev)) return;  // whole warps
  const int64_t width = a.width;
  const float xj = row_value<kQ8>(a.rows[static_cast<int64_t>(u) * kT + lane], c);
  float x[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) x[j] = __shfl_sync(~0u, xj, j);
  const bool start = a.sequence_start[u] != 0;
  const int bits = a.widths[c];
  const ChanSearch s = plan_search(x, bits, start);
  uint8_t* dst = a.dst[u];
  uint16_t zh = s.z_lo;
  uint32_t code = 0;
  if (bits == 0) {
    zh = zero_bits_z(x, s, start);
  } else {
    double best = INFINITY;
    int best_i = kNoCandidate;
    lane_best(x, s, lane, &best, &best_i);
#pragma unroll
    for (int m = 16; m > 0; m /= 2) {
      const double other = __shfl_xor_sync(~0u, best, m);
      const int other_i = __shfl_xor_sync(~0u, best_i, m);
      keep_better(&best, &best_i, other, other_i);
    }
    if (best_i != kNoCandidate) zh = candidate_z(x, s, best_i, &code);
    const int q = winner_code(xj, s, best_i, zh, code);
    uint8_t* planes = dst + alloc_plane_offsets(a.widths, width)[c];
    for (int k = 0; k < bits; ++k) {
      const uint32_t plane = __ballot_sync(~0u, (q >> k) & 1);
      if (lane == k) {
        for (int i = 0; i < 4; ++i) planes[4 * k + i] = static_cast<uint8_t>(plane >> (8 * i));
      }
    }
  }
  if (lane == 0) {
    reinterpret_cast<uint16_t*>(dst)[c] = zh;
    dst[2 * width + c] = static_cast<uint8_t>(code);
  }
}

}  // namespace

void quantize_chan_blocks(const ChanEncodeArgs& a, cudaStream_t stream) {
  if (a.n_units <= 0 || a.width <= 0) return;
  const bool q8 = a.row_dtype == DType::kQ8_0;
  if (a.widths) {  // q4a: a warp a channel
    constexpr int kWarps = kThreads / 32;
    const dim3 grid(static_cast<unsigned>(a.n_units), static_cast<unsigned>((a.width + kWarps - 1) / kWarps));
    if (q8) {
      chan_encode_warp_kernel<true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      chan_encode_warp_kernel<false><<<grid, kThreads, 0, stream>>>(a);
    }
  } else {
    const dim3 grid(static_cast<unsigned>(a.n_units), static_cast<unsigned>((a.width + kThreads - 1) / kThreads));
    if (q8) {
      chan_encode_kernel<true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      chan_encode_kernel<false><<<grid, kThreads, 0, stream>>>(a);
    }
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void fill_alloc_table(const uint8_t* widths, int64_t width, uint8_t* table) {
  assert(width % 32 == 0);
  std::memcpy(table, widths, static_cast<size_t>(width));
  int64_t bits = 0;
  for (int64_t c = 0; c < width; ++c) {
    const auto off = static_cast<int32_t>(3 * width + 4 * bits);
    std::memcpy(table + width + 4 * c, &off, 4);
    bits += widths[c];
  }
}

namespace detail {

void quantize_chan_block_host(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst, bool sequence_start) {
  for (int64_t c = 0; c < width; ++c) {
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    encode_chan4(x, sequence_start, reinterpret_cast<uint16_t*>(dst) + c, dst + 2 * width + c,
                 dst + 3 * width + c * (kT / 2));
  }
}

void quantize_alloc_block_host(const float* rows, int64_t src_stride, int64_t width, const uint8_t* widths,
                               uint8_t* dst, bool sequence_start) {
  std::vector<uint8_t> table(alloc_table_bytes(width));
  fill_alloc_table(widths, width, table.data());
  const int32_t* offsets = alloc_plane_offsets(table.data(), width);
  for (int64_t c = 0; c < width; ++c) {  // chan_encode_warp_kernel's steps, its lanes in turn
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    const int bits = widths[c];
    const ChanSearch s = plan_search(x, bits, sequence_start);
    uint16_t zh = s.z_lo;
    uint32_t code = 0;
    if (bits == 0) {
      zh = zero_bits_z(x, s, sequence_start);
    } else {
      double best = INFINITY;
      int best_i = kNoCandidate;
      for (int lane = 0; lane < 32; ++lane) {
        double lb = INFINITY;
        int li = kNoCandidate;
        lane_best(x, s, lane, &lb, &li);
        keep_better(&best, &best_i, lb, li);
      }
      if (best_i != kNoCandidate) zh = candidate_z(x, s, best_i, &code);
      uint8_t* planes = dst + offsets[c];
      for (int k = 0; k < bits; ++k) {
        uint32_t plane = 0;
        for (int j = 0; j < kT; ++j) {
          plane |= static_cast<uint32_t>((winner_code(x[j], s, best_i, zh, code) >> k) & 1) << j;
        }
        for (int i = 0; i < 4; ++i) planes[4 * k + i] = static_cast<uint8_t>(plane >> (8 * i));
      }
    }
    reinterpret_cast<uint16_t*>(dst)[c] = zh;
    dst[2 * width + c] = static_cast<uint8_t>(code);
  }
}

}  // namespace detail

}  // namespace rill::cuda
