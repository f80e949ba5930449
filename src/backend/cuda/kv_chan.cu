// The per-channel K encoders of k4c and k4a on the device (kv_chan.h), a
// port of cpu::quantize_chan_values (backend/cpu/kv_quant.cpp, encoder
// revision cpu::kKvChanEncoder) at 4 bits (q4c) or a channel's own width
// (q4a, 0..8 bits) that gives the CPU's bytes for the same floats: every
// operation the CPU does in order is done here in the same order with
// explicitly rounded intrinsics (no FMA contraction; the CPU file is
// compiled without FMA), the minimum and maximum by the CPU's own
// comparisons (std::min / std::max: NaNs skipped, a zero's sign as they
// leave it), and each error a serial sum over the channel's 32 tokens.
// One thread a channel for both (docs/perf.md's plan had a warp a channel
// for q4a, lane j holding token j, planes by __ballot_sync): every
// candidate's error is a serial double sum over the 32 tokens in the CPU's
// order, so a warp would wait on one lane's chain as one thread does,
// with 32 times fewer channels at once; a thread holds its 32 codes in 8
// words and packs its planes itself (at most 8 words of 32 bits).
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

// One channel's 32 values x encoded at `bits` bits (0..8): the CPU's
// quantize_chan_values, in its order: the zero's f16 bits, the step's e4m3
// code and the 32 codes (all 0 for bits 0).
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
  if (bits == 0) {  // z alone: the mean (token 0 at a sequence's start), when finite
    double mean = static_cast<double>(x[0]);
    if (!sequence_start) {
      double sum = 0.0;
      for (int j = 0; j < kT; ++j) sum = dadd_rn(sum, static_cast<double>(x[j]));
      mean = ddiv_rn(sum, static_cast<double>(kT));
    }
    if (isfinite(mean)) best_z = f16_of(double_to_float_rn(mean));
    *z_out = best_z;
    *d_out = 0;
    return;
  }
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

// q4a's channel at `bits` bits: its planes (plane k: bit j is bit k of
// token j's code), 4 little-endian bytes each, from planes_out.
__host__ __device__ inline void encode_alloc(const float (&x)[kT], int bits, bool sequence_start, uint16_t* z_out,
                                             uint8_t* d_out, uint8_t* planes_out) {
  Codes q;
  encode_channel(x, bits, sequence_start, z_out, d_out, q);
  for (int k = 0; k < bits; ++k) {
    uint32_t plane = 0;
    RILL_DEVICE_UNROLL
    for (int j = 0; j < kT; ++j) plane |= static_cast<uint32_t>((q.at(j) >> k) & 1) << j;
    RILL_DEVICE_UNROLL
    for (int i = 0; i < 4; ++i) planes_out[4 * k + i] = static_cast<uint8_t>(plane >> (8 * i));
  }
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
  if (a.widths) {
    encode_alloc(x, a.widths[c], start, z, dst + 2 * width + c, dst + alloc_plane_offsets(a.widths, width)[c]);
  } else {
    encode_chan4(x, start, z, dst + 2 * width + c, dst + 3 * width + static_cast<int64_t>(c) * (kT / 2));
  }
}

}  // namespace

void quantize_chan_blocks(const ChanEncodeArgs& a, cudaStream_t stream) {
  if (a.n_units <= 0 || a.width <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.n_units), static_cast<unsigned>((a.width + kThreads - 1) / kThreads));
  if (a.row_dtype == DType::kQ8_0) {
    chan_encode_kernel<true><<<grid, kThreads, 0, stream>>>(a);
  } else {
    chan_encode_kernel<false><<<grid, kThreads, 0, stream>>>(a);
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
  for (int64_t c = 0; c < width; ++c) {
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    encode_alloc(x, widths[c], sequence_start, reinterpret_cast<uint16_t*>(dst) + c, dst + 2 * width + c,
                 dst + offsets[c]);
  }
}

}  // namespace detail

}  // namespace rill::cuda
