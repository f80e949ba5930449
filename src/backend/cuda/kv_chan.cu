// k4c's per-channel K encoder on the device (kv_chan.h), a port of
// cpu::quantize_chan_block (backend/cpu/kv_quant.cpp, encoder revision
// cpu::kKvChanEncoder) that gives its bytes for the same floats: every
// operation the CPU does in order is done here in the same order with
// explicitly rounded intrinsics (no FMA contraction; the CPU file is
// compiled without FMA), the minimum and maximum by the CPU's own
// comparisons (std::min / std::max: NaNs skipped, a zero's sign as they
// leave it), and each error a serial sum over the channel's 32 tokens.
#include "backend/cuda/kv_chan.h"

#include <cuda_fp16.h>

#include "backend/cpu/kv_quant.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/kv_rotated.cuh"

namespace rill::cuda {
namespace {

// A new CPU revision fails the build here until the kernel follows it.
static_assert(cpu::kKvChanEncoder == 3, "update chan_encode_kernel to the CPU's quantize_chan_block");
constexpr int kT = cpu::kKvChanTokens;
static_assert(kT == 32, "a channel's codes pack into 4 words of 8 nibbles");
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
// The CPU's nearest_code(y, 0, 15): nearbyint, NaN -> 0, clamped.
__host__ __device__ __forceinline__ int nearest_code(float y) {
  const float r = rintf(y);
  if (isnan(r)) return 0;
  return static_cast<int>(r < 0.0f ? 0.0f : 15.0f < r ? 15.0f : r);
}

// The codes of a channel, 8 nibbles a word (token j in nibble j % 8 of word j / 8).
struct Codes {
  uint32_t w[kT / 8] = {};
  __host__ __device__ int at(int j) const { return static_cast<int>((w[j / 8] >> (4 * (j % 8))) & 0xFu); }
};

// The squared error of x stored as zero zh and step code `code` (token 0
// weighted w0), its codes into cand: the CPU's error_of.
__host__ __device__ __forceinline__ double error_of(const float (&x)[kT], uint16_t zh, uint32_t code, double w0,
                                                    Codes& cand) {
  const float zf = f16_value(zh), step = mul_rn(e4m3_to_float(code), 0.0625f);
  const float inv = step > 0.0f ? div_rn(1.0f, step) : 0.0f;
  double err = 0.0;
  RILL_DEVICE_UNROLL
  for (int w = 0; w < kT / 8; ++w) cand.w[w] = 0;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    const int c = nearest_code(mul_rn(sub_rn(x[j], zf), inv));
    cand.w[j / 8] |= static_cast<uint32_t>(c) << (4 * (j % 8));
    const double e =
        dsub_rn(static_cast<double>(x[j]), static_cast<double>(add_rn(zf, mul_rn(step, static_cast<float>(c)))));
    err = dadd_rn(err, dmul_rn(j == 0 ? w0 : 1.0, dmul_rn(e, e)));
  }
  return err;
}

// One channel's 32 values x encoded (the CPU's loop body for channel c):
// its zero's f16 bits, its step's e4m3 code, its 16 code bytes.
__host__ __device__ __forceinline__ void encode_channel(const float (&x)[kT], bool sequence_start, uint16_t* z_out,
                                                        uint8_t* d_out, uint8_t* qs_out) {
  const double w0 = sequence_start ? cpu::kKvChanSinkWeight : 1.0;
  float mn = INFINITY, mx = -INFINITY;
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT; ++j) {
    mn = x[j] < mn ? x[j] : mn;  // std::min(mn, x[j])
    mx = mx < x[j] ? x[j] : mx;  // std::max(mx, x[j])
  }
  uint16_t best_z = f16_at_or_below(mn);
  uint32_t best_code = 0;
  Codes q, cand;
  double best = INFINITY;
  auto consider = [&](uint16_t zh, uint32_t code) {
    const double err = error_of(x, zh, code, w0, cand);
    if (err < best) {
      best = err;
      best_z = zh;
      best_code = code;
      q = cand;
    }
  };
  const float z_lo = f16_value(best_z);
  if (mx > z_lo) {
    const int c0 = static_cast<int>(e4m3_round_bits(mul_rn(div_rn(sub_rn(mx, z_lo), 15.0f), 16.0f)));
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
        for (int code0 = 0; code0 < 16; ++code0) {
          consider(f16_of(sub_rn(x[0], mul_rn(step, static_cast<float>(code0)))), k);
        }
      }
    }
  }
  *z_out = best_z;
  *d_out = static_cast<uint8_t>(best_code);
  RILL_DEVICE_UNROLL
  for (int j = 0; j < kT / 2; ++j) qs_out[j] = static_cast<uint8_t>(q.at(j) | (q.at(j + kT / 2) << 4));
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
  encode_channel(x, a.sequence_start[u] != 0, reinterpret_cast<uint16_t*>(dst) + c, dst + 2 * width + c,
                 dst + 3 * width + static_cast<int64_t>(c) * (kT / 2));
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

namespace detail {

void quantize_chan_block_host(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst, bool sequence_start) {
  for (int64_t c = 0; c < width; ++c) {
    float x[kT];
    for (int j = 0; j < kT; ++j) x[j] = rows[j * src_stride + c];
    encode_channel(x, sequence_start, reinterpret_cast<uint16_t*>(dst) + c, dst + 2 * width + c,
                   dst + 3 * width + c * (kT / 2));
  }
}

}  // namespace detail

}  // namespace rill::cuda
