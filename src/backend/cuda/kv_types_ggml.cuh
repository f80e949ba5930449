#pragma once
// The KV types CUDA stores beside kv_types.cuh's first ones (issue 22):
// bf16, and GGML's q4_1, q5_0 and q5_1 blocks in backend/cpu/quants.h's
// layouts, byte for byte the CPU's kBF16 / kQ4_1 / kQ5_0 / kQ5_1 KV, so the
// prefix-cache tiers and KV files carry them between devices. Each tag has
// kv_types.cuh's members (row_bytes, load4, load1, load8, store; q5_0's
// levels are integers, so it has load8_biased too). First run on a GPU
// (an H200) on 2026-12-06: their store, attention, probe and model tests.
//
// The stores are the CPU's quantizers (backend/cpu/kv_quant.cpp, llama.cpp's
// reference) operation for operation: f32 throughout, each operation
// rounded once as the CPU (built without FMA) rounds it (kv_rotated.cuh's
// mul_rn, ...: nvcc would contract (x - min) * id + 0.5 into one FMA),
// codes by truncation (the CPU's int8_t conversion of a value in
// [0, 33)). A block's minimum, maximum or element of largest magnitude is
// a warp reduction, then the value of the first lane holding it: the CPU's
// scans keep the first of equal elements, so a zero's sign is the first
// zero's, which m's bytes show. The loads are built for the host too
// (kv_probe.h's host runs, the tests that need no GPU), and so is the
// blocks' arithmetic (Scale / code, which those runs feed from a serial
// scan).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_rotated.cuh"
#include "core/dtype.h"

namespace rill::cuda::detail {

// Bytes [p, p + 4), little-endian, read 2 bytes at a time: q5_0's 22-byte
// blocks are only 2-byte aligned (the others are read alike).
__host__ __device__ __forceinline__ uint32_t bytes4_at(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return h[0] | (static_cast<uint32_t>(h[1]) << 16);
}
__host__ __device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}
__host__ __device__ __forceinline__ float float_of_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
__host__ __device__ __forceinline__ uint32_t bits_of_float(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// v of the first lane (the lowest) where `hit` holds; `none` where no
// lane's does (a block of NaNs: the CPU's scans then keep their initial
// values).
__device__ __forceinline__ float first_lane_where(bool hit, float v, float none) {
  const unsigned at = __ballot_sync(0xffffffffu, hit);
  const float w = __shfl_sync(0xffffffffu, v, at ? __ffs(at) - 1 : 0);
  return at ? w : none;
}

// bf16 (the CPU's kBF16 KV): f32's exponent range (f16 KV stops at 65504)
// with 8 significant bits. Stored as core/half.h f32_to_bf16 stores it,
// step for step (round to nearest even; a NaN kept, quieted: CUDA's
// conversion makes every NaN 0x7fff). The tensor-core prefill reads it
// through load8 into f16 (mma_tile.cuh load8h's f32 route): exact for
// |x| in [2^-14, 65504], the range f16 KV holds, and f16's limits outside it,
// as the prefill's q (rounded to f16) has; the decode kernels read it in f32.
struct KvBf16 {
  static constexpr DType kDtype = DType::kBF16;
  static constexpr int kBlock = 1;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n * 2; }
  __host__ __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint2 raw = *reinterpret_cast<const uint2*>(row + 2 * e);
    v[0] = float_of_bits(raw.x << 16);
    v[1] = float_of_bits(raw.x & 0xffff0000u);
    v[2] = float_of_bits(raw.y << 16);
    v[3] = float_of_bits(raw.y & 0xffff0000u);
  }
  __host__ __device__ static float load1(const uint8_t* row, int64_t e) {
    return float_of_bits(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e]) << 16);
  }
  __host__ __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + 2 * e);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    RILL_DEVICE_UNROLL
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = float_of_bits(w[i] << 16);
      v[2 * i + 1] = float_of_bits(w[i] & 0xffff0000u);
    }
  }
  __host__ __device__ static uint16_t encode(float x) {
    uint32_t u = bits_of_float(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) reinterpret_cast<uint16_t*>(row)[e0 + i] = encode(x[i]);
  }
};

// The codes of elements [j, j + 4) of a block (j % 4 == 0) as bytes 0..3:
// GGML's nibbles (element j < 16 the low nibble of qs[j], element j + 16
// its high one) and, for q5, bit 4 from bit j of qh (0 for q4_1).
__host__ __device__ __forceinline__ uint32_t ggml_codes4(const uint8_t* qs, uint32_t qh, int j) {
  const uint32_t nibbles = (bytes4_at(qs + (j & 15)) >> (j >= 16 ? 4 : 0)) & 0x0F0F0F0Fu;
  const uint32_t h = qh >> j;
  return nibbles | ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

// GGML's classic blocks of 32 beyond q8_0 / q4_0 (kv_types.cuh):
//   q4_1 (kBits 4, kMin): f16 d, f16 m, 16 bytes of nibbles; x = d q + m
//   q5_0 (kBits 5):       f16 d, 4 bytes qh, 16 bytes; x = d (q - 16)
//   q5_1 (kBits 5, kMin): f16 d, f16 m, qh, 16 bytes; x = d q + m
// (q in 0..2^kBits - 1; qh little-endian, bit j bit 4 of element j). Values
// in f32 as the CPU's dequantization: d q + m a rounded product, then a
// rounded sum. Blocks of 20, 22 and 24 bytes.
// The quantizer (llama.cpp's reference): kMin: lo / hi the block's minimum
// and maximum, d = (hi - lo) / (2^kBits - 1), m = lo, q = min(2^kBits - 1,
// trunc((x - lo) id + 0.5)); q5_0: top the element of largest magnitude
// (the first on ties, +0 for a block of zeros), d = top / -16,
// q = min(31, trunc(x id + 16.5)); id = 1 / d (0 for d = 0), from d's f32
// value, not its f16 bytes.
template <DType kT, int kBits, bool kMin>
struct KvGgmlBlock {
  static constexpr DType kDtype = kT;
  static constexpr int kBlock = 32;
  static constexpr int kQhAt = kMin ? 4 : 2;  // qh's first byte (q5)
  static constexpr int kQsAt = kBits == 5 ? kQhAt + 4 : kQhAt;
  static constexpr int kBlockBytes = kQsAt + 16;
  static constexpr int kMaxCode = (1 << kBits) - 1;
  static constexpr int kOffset = kMin ? 0 : (kMaxCode + 1) / 2;  // q5_0's level q - 16
  static constexpr bool kHasMin = kMin;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }

  __host__ __device__ static uint32_t qh_bits(const uint8_t* blk) {
    if constexpr (kBits == 5) {
      return bytes4_at(blk + kQhAt);
    } else {
      return 0u;
    }
  }
  __host__ __device__ static float min_of(const uint8_t* blk) {
    if constexpr (kMin) {
      return f16_at(blk + 2);
    } else {
      return 0.0f;
    }
  }
  __host__ __device__ static float value(float d, [[maybe_unused]] float mn, int q) {
    if constexpr (kMin) {
      return add_rn(mul_rn(static_cast<float>(q), d), mn);
    } else {
      return mul_rn(static_cast<float>(q - kOffset), d);  // exact: 11 by 5 significant bits
    }
  }
  __host__ __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float d = f16_at(blk), mn = min_of(blk);
    const uint32_t c = ggml_codes4(blk + kQsAt, qh_bits(blk), static_cast<int>(e & 31));
    RILL_DEVICE_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = value(d, mn, static_cast<int>((c >> (8 * i)) & 0xFFu));
  }
  __host__ __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const int j = static_cast<int>(e & 31);
    const uint32_t c = ggml_codes4(blk + kQsAt, qh_bits(blk), j & ~3);
    return value(f16_at(blk), min_of(blk), static_cast<int>((c >> (8 * (j & 3))) & 0xFFu));
  }
  __host__ __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float d = f16_at(blk), mn = min_of(blk);
    const uint32_t h = qh_bits(blk);
    const int j = static_cast<int>(e & 31);
    const uint32_t c[2] = {ggml_codes4(blk + kQsAt, h, j), ggml_codes4(blk + kQsAt, h, j + 4)};
    RILL_DEVICE_UNROLL
    for (int i = 0; i < 8; ++i) v[i] = value(d, mn, static_cast<int>((c[i / 4] >> (8 * (i % 4))) & 0xFFu));
  }

  // The quantizer's arithmetic (see above), shared by the device store and
  // the host runs. kMin: scale(lo, hi); q5_0: scale(top, 0).
  __host__ __device__ static float scale(float lo_or_top, [[maybe_unused]] float hi) {
    if constexpr (kMin) {
      return div_rn(sub_rn(hi, lo_or_top), static_cast<float>(kMaxCode));
    } else {
      return div_rn(lo_or_top, -static_cast<float>(kOffset));
    }
  }
  __host__ __device__ static float inverse(float d) { return d != 0.0f ? div_rn(1.0f, d) : 0.0f; }
  __host__ __device__ static int code(float x, float lo, float id) {
    const float y =
        kMin ? add_rn(mul_rn(sub_rn(x, lo), id), 0.5f) : add_rn(mul_rn(x, id), static_cast<float>(kOffset) + 0.5f);
    const int q = static_cast<int>(y);  // y >= 0 up to rounding: truncation, as the CPU's int8_t cast
    return q < kMaxCode ? q : kMaxCode;
  }

  // Warp w quantizes blocks w, w + n_warps, ...: lane i holds element i of
  // the block; lane j < 16 packs elements j and j + 16, qh is a ballot.
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const float v = x[i0 + lane];
      float lo = 0.0f, d = 0.0f;
      if constexpr (kMin) {
        lo = first_lane_where(v == -warp_max(-v), v, INFINITY);
        const float hi = first_lane_where(v == warp_max(v), v, -INFINITY);
        d = scale(lo, hi);
      } else {
        const float amax = warp_max(fabsf(v));
        const float top = first_lane_where(fabsf(v) == amax, v, 0.0f);
        d = scale(amax > 0.0f ? top : 0.0f, 0.0f);
      }
      const int q = code(v, lo, inverse(d));
      const int hi_q = __shfl_down_sync(0xffffffffu, q, 16);
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) {
        *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
        if constexpr (kMin) *reinterpret_cast<__half*>(blk + 2) = __float2half_rn(lo);
      }
      if constexpr (kBits == 5) {
        const uint32_t bits = __ballot_sync(0xffffffffu, (q & 0x10) != 0);
        if (lane < 4) blk[kQhAt + lane] = static_cast<uint8_t>(bits >> (8 * lane));
      }
      if (lane < 16) blk[kQsAt + lane] = static_cast<uint8_t>((q & 0xF) | ((hi_q & 0xF) << 4));
    }
  }
};

struct KvQ4_1 : KvGgmlBlock<DType::kQ4_1, 4, true> {};
struct KvQ5_1 : KvGgmlBlock<DType::kQ5_1, 5, true> {};
// q5_0's levels q - 16 are integers in [-16, 15]: load8_biased gives the
// codes q as the bytes (kv_types.cuh's contract), for load8h's f16
// arithmetic (the f32 route's bits: the product is exact).
struct KvQ5_0 : KvGgmlBlock<DType::kQ5_0, 5, false> {
  static constexpr int kLevelBias = 16;
  __host__ __device__ static __half load8_biased(const uint8_t* row, int64_t e, uint32_t (&u)[2]) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const uint32_t h = qh_bits(blk);
    const int j = static_cast<int>(e & 31);
    u[0] = ggml_codes4(blk + kQsAt, h, j);
    u[1] = ggml_codes4(blk + kQsAt, h, j + 4);
    return *reinterpret_cast<const __half*>(blk);
  }
};

}  // namespace rill::cuda::detail
