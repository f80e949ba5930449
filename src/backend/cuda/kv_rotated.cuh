#pragma once
// The Hadamard-rotated KV types on CUDA (model/kv_types.h q8_0h / q4_0h):
// the per-head Walsh-Hadamard transform and the rotated types' block
// encoder, device copies of the CPU's cpu::hadamard_rotate and
// cpu::quantize_rotated_row (backend/cpu/kv_quant.cpp, encoder revision
// cpu::kKvRotatedEncoder) that give the same bits for the same floats.
//
// Why bit-identical: KV computed on one device is resumed on the other
// (prefix-cache tiers, KV files), and the tests hold the stored blocks to
// the CPU's byte for byte. So every float and double operation the CPU does
// in order is done here in the same order with explicitly rounded
// intrinsics (__fmul_rn, __dadd_rn, ...): nvcc would otherwise contract a
// multiply and an add into one FMA (one rounding where the CPU, compiled
// without FMA, rounds twice). The CPU's sums over a block run j = 0..31 in
// sequence; here one lane does each sum in the same sequence (reading the
// block from shared memory), not a tree reduction. The loops over a block
// are unrolled: only the chain of double adds stays serial (the loads,
// conversions and products of all 32 elements issue ahead of it), which
// cut the decode step's store from most of the rotated types' overhead.
//
// A change to the CPU's encoder (a new kKvRotatedEncoder) must be made in
// fit_rotated_block below too: it is the one device function both rotated
// block types call.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cpu/kv_quant.h"
#include "backend/cuda/device_math.cuh"

namespace rill::cuda::detail {

// The CPU encoder revision this file reproduces: a new revision there fails
// the build here until fit_rotated_block follows it (the stored bytes, and
// the numerics that name the revision, must be the CPU's).
static_assert(cpu::kKvRotatedEncoder == 2, "update fit_rotated_block to the CPU's rotated encoder");

// x = H x / sqrt(n) for each of the width / n heads of n floats (n a power
// of two) in shared memory x: cpu::hadamard_rotate's butterflies, stage by
// stage (len = 1, 2, 4, ...: x[i] = a + b, x[i + len] = a - b), then the
// product with the f32 1 / sqrt(n). Each element's operations and their
// operands are the CPU's, so the result is its bits. Every thread of the
// block calls it; x is complete and visible to all on return.
__device__ __forceinline__ void hadamard_rotate_heads(float* x, int width, int n) {
  const int half = n / 2;
  for (int len = 1; len < n; len <<= 1) {
    __syncthreads();
    for (int p = threadIdx.x; p < width / 2; p += blockDim.x) {
      const int head = p / half, r = p % half;
      const int i = head * n + (r / len) * 2 * len + r % len;
      const float a = x[i], b = x[i + len];
      x[i] = __fadd_rn(a, b);
      x[i + len] = __fsub_rn(a, b);
    }
  }
  __syncthreads();
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(static_cast<float>(n)));
  for (int i = threadIdx.x; i < width; i += blockDim.x) x[i] = __fmul_rn(x[i], s);
  __syncthreads();
}

__device__ __forceinline__ uint16_t f16_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float f16_value(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// The level of x under scale d: nearest (ties to even, as nearbyint), in
// [q_min, q_max]; id = 1 / d (0 for d = 0).
__device__ __forceinline__ int rotated_level(float x, float id, int q_min, int q_max) {
  return min(q_max, max(q_min, __float2int_rn(__fmul_rn(x, id))));
}

// The CPU's block_error: the squared error of block x (32 floats) stored as
// level * d, summed in double over j = 0..31 in order.
__device__ __forceinline__ double rotated_block_error(const float* x, float d, int q_min, int q_max) {
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  double err = 0.0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int q = rotated_level(x[j], id, q_min, q_max);
    const double e = __dsub_rn(static_cast<double>(x[j]), static_cast<double>(__fmul_rn(static_cast<float>(q), d)));
    err = __dadd_rn(err, __dmul_rn(e, e));
  }
  return err;
}

struct RotatedBlock {
  uint16_t d = 0;  // the block's f16 scale bits
  int q = 0;       // this lane's level: x[lane] ~ q * d
};

// The rotated types' encoder (cpu::quantize_rotated_row's fit_scale) of one
// block of 32 already-rotated floats x (shared memory; v = x[lane]) into
// levels in [q_min, q_max] (q8_0h: -127..127, q4_0h: -8..7) and a scale.
// Candidates: d = m / top * (1 - 0.025 i), m the signed maximum, top q_min
// (c = i in 0..16) then q_max (c = 17 + i), each scored with d rounded to
// f16; the first of least error wins (lane c % 32 scores candidate c, the
// warp takes the least (error, c)). Then the least-squares scale of the
// winner's levels is scored as a 35th candidate, and the scale returned is
// the one that does not shrink the block (x . x / x . q) with the winner's
// levels. All 32 lanes of a warp call it together.
__device__ __forceinline__ RotatedBlock fit_rotated_block(const float* x, float v, int q_min, int q_max) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const float amax = warp_max(fabsf(v));
  const unsigned at_max = __ballot_sync(kAll, fabsf(v) == amax);
  const float first_max = __shfl_sync(kAll, v, (__ffs(at_max) - 1) & 31);
  const float m = amax > 0.0f && at_max ? first_max : 0.0f;  // the CPU's signed_absmax
  RotatedBlock out;
  if (m == 0.0f) return out;  // uniform across the warp: d = +0, levels 0
  double best = INFINITY;
  int best_c = 64;
  uint16_t best_d = 0;
  for (int c = lane; c < 34; c += 32) {
    const int top = c < 17 ? q_min : q_max, i = c % 17;
    const float factor = __fsub_rn(1.0f, __fmul_rn(0.025f, static_cast<float>(i)));
    const uint16_t dh = f16_bits(__fmul_rn(__fdiv_rn(m, static_cast<float>(top)), factor));
    const double err = rotated_block_error(x, f16_value(dh), q_min, q_max);
    if (err < best) {  // NaN errors never win, as on the CPU
      best = err;
      best_c = c;
      best_d = dh;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double ob = __shfl_xor_sync(kAll, best, o);
    const int oc = __shfl_xor_sync(kAll, best_c, o);
    const uint16_t od = static_cast<uint16_t>(__shfl_xor_sync(kAll, static_cast<int>(best_d), o));
    if (ob < best || (ob == best && oc < best_c)) {
      best = ob;
      best_c = oc;
      best_d = od;
    }
  }
  // No candidate (NaN in the block, or every scale overflowing f16): levels
  // 0 and d 0, the CPU's.
  const bool found = best_c < 64;
  auto level_of = [&](uint16_t dh) {
    const float d = f16_value(dh);
    return rotated_level(v, d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f, q_min, q_max);
  };
  int q = found ? level_of(best_d) : 0;
  double xq = 0.0, qq = 0.0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const double qj = static_cast<double>(__shfl_sync(kAll, q, j));
    xq = __dadd_rn(xq, __dmul_rn(static_cast<double>(x[j]), qj));
    qq = __dadd_rn(qq, __dmul_rn(qj, qj));
  }
  if (qq > 0.0) {
    const uint16_t dh = f16_bits(__double2float_rn(__ddiv_rn(xq, qq)));
    const double err = rotated_block_error(x, f16_value(dh), q_min, q_max);
    if (err < best) {
      best_d = dh;
      q = level_of(dh);
    }
  }
  double xx = 0.0;
  xq = 0.0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const double xj = static_cast<double>(x[j]);
    xx = __dadd_rn(xx, __dmul_rn(xj, xj));
    xq = __dadd_rn(xq, __dmul_rn(xj, static_cast<double>(__shfl_sync(kAll, q, j))));
  }
  out.d = xq != 0.0 ? f16_bits(__double2float_rn(__ddiv_rn(xx, xq))) : best_d;
  out.q = q;
  return out;
}

}  // namespace rill::cuda::detail
