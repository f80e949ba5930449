#pragma once
// The Hadamard-rotated KV types on CUDA (model/kv_types.h q8_0h / q4_0h /
// iq4_nlh, and q8_0h64 / iq4_nlh64 in blocks of 64):
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
// fit_rotated_block below too, and in kv_rotated_pair.cuh's
// fit_rotated_block64_pair (the blocks of 64): they are the device
// functions the rotated block types call (over their level sets).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
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

// The same rotation of one head of HD elements (32 to 512, a power of two)
// held by a warp, lane i holding elements i * HD / 32 .. in x: butterflies
// within a lane's elements first, then across lanes by shuffles (the low
// element's lane keeps a + b, the other a - b), then the scale: each
// element's operations and operands are hadamard_rotate_heads', so the same
// bits. All 32 lanes call it together.
template <int HD>
__device__ __forceinline__ void hadamard_rotate_warp(float (&x)[HD / 32]) {
  constexpr int kPer = HD / 32;
  static_assert(kPer >= 1 && (HD & (HD - 1)) == 0, "heads of 32 to 512, a power of two");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int len = 1; len < HD; len <<= 1) {
    if (len < kPer) {
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        if ((r & len) == 0) {
          const float a = x[r], b = x[r + len];
          x[r] = __fadd_rn(a, b);
          x[r + len] = __fsub_rn(a, b);
        }
      }
    } else {
      const int d = len / kPer;  // the partner lane's distance
      const bool low = (lane & d) == 0;
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const float other = __shfl_xor_sync(0xffffffffu, x[r], d);
        x[r] = low ? __fadd_rn(x[r], other) : __fsub_rn(other, x[r]);
      }
    }
  }
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(static_cast<float>(HD)));
#pragma unroll
  for (int r = 0; r < kPer; ++r) x[r] = __fmul_rn(x[r], s);
}

// #pragma unroll in functions built for the host too (the host compiler
// does not know the pragma, and warnings are errors).
#ifdef __CUDA_ARCH__
#define RILL_DEVICE_UNROLL _Pragma("unroll")
#else
#define RILL_DEVICE_UNROLL
#endif

// f32 / f64 operations rounded once each: on the device the _rn
// intrinsics (nvcc would otherwise contract a multiply and an add into an
// FMA); in the host pass (the host runs of device code the tests use where
// no GPU is present, kv_probe.h) plain operators, which the host build
// (no FMA instructions) never contracts. Either way the CPU's roundings.
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ __forceinline__ float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
__host__ __device__ __forceinline__ double dadd_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ __forceinline__ double dsub_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
__host__ __device__ __forceinline__ double dmul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ double ddiv_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
__host__ __device__ __forceinline__ float double_to_float_rn(double a) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(a);
#else
  return static_cast<float>(a);
#endif
}

// A NaN scale (a block holding a NaN or an inf) is stored as 0x7e00, as
// the CPU's F16Scale stores it: the devices' NaNs differ in sign.
__host__ __device__ __forceinline__ uint16_t f16_bits(float x) {
  return isnan(x) ? uint16_t{0x7e00} : __half_as_ushort(__float2half_rn(x));
}
__host__ __device__ __forceinline__ float f16_value(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// The value of an e4m3 byte (core/e4m3.h e4m3_value): exact through f16.
__host__ __device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte & 0xffu), __NV_E4M3)));
}
// core/e4m3.h e4m3_round on the device, step for step (round to nearest
// even, +-448 saturating, NaN -> 0x7f, subnormals in steps of 2^-9), so the
// bytes are the CPU's whatever the hardware conversion does at the edges.
__host__ __device__ __forceinline__ uint32_t e4m3_round_bits(float x) {
  if (isnan(x)) return 0x7fu;
  const uint32_t sign = signbit(x) ? 0x80u : 0u;
  const float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7eu;
  if (a < 0.015625f) return sign | static_cast<uint32_t>(rintf(mul_rn(a, 512.0f)));
  int ex = 0;
  const float f = frexpf(a, &ex);                     // a = f 2^ex, f in [0.5, 1)
  int m = static_cast<int>(rintf(mul_rn(f, 16.0f)));  // 8 .. 16
  int e = ex - 1 + 7;
  if (m == 16) {
    m = 8;
    ++e;
  }
  return sign | static_cast<uint32_t>((e << 3) | (m - 8));
}

// How a rotated block's scale d is stored (cpu::kv_quant.cpp F16Scale /
// E4m3x16Scale): round(d) gives the stored bits, value(bits) the d the
// candidates are scored with. F16: q8_0h / q4_0h / iq4_nlh / q8_0h64;
// E4m3x16: iq4_nlh64's byte, the e4m3 code of d * 16 (d = value / 16, 2^-13
// .. 28: both multiplies by powers of two are exact).
struct F16Scale {
  __device__ uint16_t round(float d) const { return f16_bits(d); }
  __device__ float value(uint16_t bits) const { return f16_value(bits); }
};
struct E4m3x16Scale {
  __device__ uint16_t round(float d) const { return static_cast<uint16_t>(e4m3_round_bits(mul_rn(d, 16.0f))); }
  __device__ float value(uint16_t bits) const { return mul_rn(e4m3_to_float(bits), 0.0625f); }
};

// The level sets of the rotated types: code q of a block stands for
// value(q) * d; code(y) is the code of y = x / d (cpu::kv_quant.cpp's
// UniformLevels / NlLevels, the same results for the same y).
//
// Uniform: the integers [lo, hi] (q8_0h: -127..127, q4_0h: -8..7), the
// nearest (ties to even, as nearbyint), clamped; the code is the level.
struct UniformLevels {
  int lo, hi;
  __device__ float first() const { return static_cast<float>(lo); }
  __device__ float last() const { return static_cast<float>(hi); }
  __device__ int code(float y) const { return min(hi, max(lo, __float2int_rn(y))); }
  __device__ float value(int q) const { return static_cast<float>(q); }
  // value(code(y)) as a double (fit_rotated_block's search; any value for
  // a NaN y): clamped, then rounded (the same level: the bounds are
  // integers) by adding 1.5 * 2^23, ties to even as nearbyint.
  __device__ double level_d(float y) const;
};

// iq4_nl's 16 levels (cpu::kIq4nlValues, GGML's IQ4_NL) as int8 bytes,
// four to a word (levels 4w .. 4w + 3 in word w, the first in the low
// byte), and the midpoints between neighbours: 0.5 (v[i] + v[i + 1]), exact
// in f32. Checked against the CPU's table at compile time below.
__host__ __device__ constexpr uint32_t iq4nl_word(int w) {
  return w == 0 ? 0xBFAD9881u : w == 1 ? 0xF6EADDCFu : w == 2 ? 0x26190D01u : 0x71594535u;
}
__host__ __device__ constexpr float iq4nl_mid(int i) {
  constexpr float kMid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                              7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
  return kMid[i];
}
constexpr bool iq4nl_tables_are_the_cpus() {
  for (int q = 0; q < 16; ++q) {
    if (static_cast<int8_t>((iq4nl_word(q / 4) >> (8 * (q % 4))) & 0xff) != cpu::kIq4nlValues[q]) return false;
  }
  for (int i = 0; i < 15; ++i) {
    if (iq4nl_mid(i) != 0.5f * static_cast<float>(cpu::kIq4nlValues[i] + cpu::kIq4nlValues[i + 1])) return false;
  }
  return true;
}
static_assert(iq4nl_tables_are_the_cpus(), "iq4_nl's device tables must be cpu::kIq4nlValues");

// Four iq4_nl codes (one in the low nibble of each byte of `codes`) to
// their four levels (int8, in the same bytes): each code's low 3 bits pick
// a byte of levels 0-7 and of levels 8-15 (two byte permutes), its bit 3
// picks between the two (a third).
// __byte_perm(x, y, s) (PTX prmt, default mode): byte i of the result is
// byte (s >> 4 i) & 7 of y:x; in the host pass the same by shifts.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t xy = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((xy >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
#endif
}
__host__ __device__ __forceinline__ uint32_t iq4nl_levels4(uint32_t codes) {
  const uint32_t t = codes | (codes >> 4);
  const uint32_t sel = (t & 0xffu) | ((t >> 8) & 0xff00u);  // code i in nibble i
  const uint32_t lo = byte_perm(iq4nl_word(0), iq4nl_word(1), sel & 0x7777u);
  const uint32_t hi = byte_perm(iq4nl_word(2), iq4nl_word(3), sel & 0x7777u);
  return byte_perm(lo, hi, 0x3210u | ((sel & 0x8888u) >> 1));
}
// Byte i of a word of int8 levels as f32.
__host__ __device__ __forceinline__ float level_byte(uint32_t levels, int i) {
  return static_cast<float>(static_cast<int8_t>((levels >> (8 * i)) & 0xff));
}

// iq4_nl's levels (iq4_nlh): the code of y is the number of midpoints
// strictly below y (the nearest level, the lower one on a tie; NaN: 0).
// The midpoints ascend, so y > mid(i) holds exactly for i below the code:
// the code's bits come from 4 of those compares, high bit first (mid(7),
// then mid(q + 3), mid(q + 1), mid(q) for the bits q found so far), each
// midpoint picked by selects on the bits before it. The same count as
// comparing y with all 15 (the CPU's NlLevels::code), so the same bytes;
// a NaN fails every compare, code 0, as there.
struct Iq4nlLevels {
  __device__ float first() const { return -127.0f; }
  __device__ float last() const { return 113.0f; }
  __device__ int code(float y) const {
    const bool b8 = y > iq4nl_mid(7);
    const bool b4 = y > (b8 ? iq4nl_mid(11) : iq4nl_mid(3));
    const bool b2 = y > (b8 ? (b4 ? iq4nl_mid(13) : iq4nl_mid(9)) : (b4 ? iq4nl_mid(5) : iq4nl_mid(1)));
    const float m1 = b8 ? (b4 ? (b2 ? iq4nl_mid(14) : iq4nl_mid(12)) : (b2 ? iq4nl_mid(10) : iq4nl_mid(8)))
                        : (b4 ? (b2 ? iq4nl_mid(6) : iq4nl_mid(4)) : (b2 ? iq4nl_mid(2) : iq4nl_mid(0)));
    return (b8 ? 8 : 0) + (b4 ? 4 : 0) + (b2 ? 2 : 0) + (y > m1 ? 1 : 0);
  }
  __device__ float value(int q) const { return level_byte(iq4nl_levels4(static_cast<uint32_t>(q)), 0); }
  // value(code(y)) as a double (fit_rotated_block's search): the level's
  // byte + 128 (the table's words with the sign bits flipped) by one byte
  // permute, then 2^52 + it less 2^52 + 128.
  __device__ double level_d(float y) const {
    const int q = code(y);
    const uint32_t lo = (q & 8) ? iq4nl_word(2) : iq4nl_word(0), hi = (q & 8) ? iq4nl_word(3) : iq4nl_word(1);
    const uint32_t biased = __byte_perm(lo ^ 0x80808080u, hi ^ 0x80808080u, static_cast<uint32_t>(q & 7)) & 0xffu;
    return __dsub_rn(__hiloint2double(0x43300000, static_cast<int>(biased)), 4503599627370496.0 + 128.0);
  }
};
static_assert(cpu::kIq4nlValues[0] == -127 && cpu::kIq4nlValues[15] == 113, "Iq4nlLevels::first / last");

// One block of N = 32 or 64 values, encoded: lane i holds the codes of
// elements i + 32 k (k < N / 32).
template <int N>
struct RotatedBlock {
  static_assert(N == 32 || N == 64, "a warp encodes blocks of 32 or 64");
  static constexpr int kPerLane = N / 32;
  uint16_t d = 0;        // the block's scale bits (f16; iq4_nlh64: the e4m3 byte)
  int q[kPerLane] = {};  // this lane's codes: x[lane + 32 k] ~ value(q[k]) * d
};

// The CPU's signed absolute maximum of a block of 32 kK values, lane i
// holding elements i + 32 k in v[k]: the first element of largest
// magnitude in index order (NaNs never count: fmaxf and the CPU's `<`
// skip them); 0 for a block of zeros or NaNs. Every lane gets it.
template <int kK>
__device__ __forceinline__ float signed_absmax(const float (&v)[kK]) {
  constexpr unsigned kAll = 0xffffffffu;
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < kK; ++k) a = fmaxf(a, fabsf(v[k]));
  const float amax = warp_max(a);
  // The first element at amax in index order: the first k that has one,
  // its lowest lane.
  unsigned at_max = 0;
  float first_max = 0.0f;
#pragma unroll
  for (int k = kK - 1; k >= 0; --k) {
    const unsigned at = __ballot_sync(kAll, fabsf(v[k]) == amax);
    const float f = __shfl_sync(kAll, v[k], (__ffs(at) - 1) & 31);
    if (at) {
      at_max = at;
      first_max = f;
    }
  }
  return amax > 0.0f && at_max ? first_max : 0.0f;
}

// Integer levels (|v| < 2^22) as doubles without a conversion instruction
// (conversions issue at a quarter of f64's rate on sm_90, and the search
// needs one per element and candidate): t = v + 1.5 * 2^23 in f32 holds v
// in its low mantissa bits, read as the low word of 2^52 + bits(t).
constexpr float kLevelMagic = 12582912.0f;                        // 1.5 * 2^23: bits 0x4B400000
constexpr double kLevelMagicD = 4503599627370496.0 + 0x4B400000;  // 2^52 + bits(kLevelMagic)
__device__ __forceinline__ double magic_to_double(float t) {
  return __dsub_rn(__hiloint2double(0x43300000, __float_as_int(t)), kLevelMagicD);
}
__device__ __forceinline__ double UniformLevels::level_d(float y) const {
  const float c = fminf(fmaxf(y, first()), last());  // a NaN y: first()
  return magic_to_double(__fadd_rn(c, kLevelMagic));
}

// The per-warp scratch of fit_rotated_block: the block's elements as
// doubles and floats and kMaxChains rows of per-element terms (rows of 34
// doubles: 16-byte aligned, the rows' banks apart). In dynamic shared
// memory (rope_store_kv's launch adds one a warp for the rotated types'
// blocks of 32): static, it would cut every store kernel's occupancy.
constexpr int kMaxChains = 3, kChainStride = 34;
struct __align__(16) RotatedScratch {
  double x[32];
  float xf[32];
  double terms[kMaxChains * kChainStride];
};
// Warp threadIdx.x / 32's scratch when the caller's dynamic shared memory
// holds n floats at x (16-byte aligned, n a multiple of 32) and then
// blockDim.x / 32 RotatedScratch.
__device__ __forceinline__ RotatedScratch& rotated_scratch(const float* x, int n) {
  return reinterpret_cast<RotatedScratch*>(const_cast<float*>(x) + n)[threadIdx.x >> 5];
}

// K sums over the block, each in index order (the CPU's sequence), of terms
// spread one element a lane (t[k] on lane j: chain k's term j): lane k adds
// up row k, the other lanes' results are unused. Returns chain k's sum in
// t[k] on every lane. All 32 lanes call it together.
template <int K>
__device__ __forceinline__ void ordered_sums(double (&t)[K], RotatedScratch& s) {
  static_assert(K <= kMaxChains, "RotatedScratch holds kMaxChains rows");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < K; ++k) s.terms[k * kChainStride + lane] = t[k];
  __syncwarp();
  const double2* row = reinterpret_cast<const double2*>(s.terms + (lane % K) * kChainStride);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const double2 two = row[j];
    sum = __dadd_rn(__dadd_rn(sum, two.x), two.y);
  }
  __syncwarp();  // the rows are read before the next call writes them
#pragma unroll
  for (int k = 0; k < K; ++k) t[k] = __shfl_sync(0xffffffffu, sum, k);
}

// The rotated types' encoder (cpu::quantize_rotated_row's fit_scale) of one
// block of N = 32 (q8_0h / q4_0h / iq4_nlh; q8_0h64's blocks of 64 take
// fit_rotated_block64_pair in kv_rotated_pair.cuh, two warps a block) already-rotated
// floats x (shared memory; lane i reads element i) into
// codes of the level set lv (q8_0h / q8_0h64: UniformLevels{-127, 127},
// q4_0h: UniformLevels{-8, 7}, iq4_nlh: Iq4nlLevels) and an f16 scale.
// m, the signed maximum, is the first element of largest magnitude in
// index order (NaNs never count: fmaxf and the CPU's `<` skip them).
// Candidates: d = m / top * (1 - 0.025 i), top the first level (c = i in
// 0..16) then the last (c = 17 + i), each scored with d rounded to f16
// over the whole block (a serial sum: the CPU's order); the first of least
// error wins. Then the least-squares scale of the winner's levels is
// scored as a 35th candidate, and the scale returned is the one that does
// not shrink the block (x . x / x . v) with the winner's levels. A zero
// block (or one no candidate fits: a NaN, every scale overflowing f16)
// keeps the codes of 0.
//
// For throughput (a prefill stores every token's K and V: docs/perf.md),
// no lane repeats work another lane could do in the same instruction:
// lane c scores candidate c < 32 and sums x . v and v . v of its codes as
// it goes (the refit's sums: the winner's lane has them); candidates 32
// and 33, x . x, and the refit's error and x . v are each one element a
// lane, summed in order by one lane a sum (ordered_sums). Each element's
// arithmetic is the CPU's, rewritten where that is exact: a level v times
// an f16 d is exact in f32 (at most 18 significant bits), so the CPU's
// double(x) - double(v * d) is one f64 FMA; x . v and v . v terms are exact
// in f64 (an f32 times an integer below 2^8), so their add is an FMA too;
// e * e is not, and stays a multiply, then an add. The levels come as
// doubles from Levels::level_d, which may return anything for a NaN y (the
// error is then NaN or inf: that candidate never wins, as on the CPU); the
// stored codes come from Levels::code, the CPU's rule. All 32 lanes of a
// warp call it together, each warp with its own scratch s.
template <int N, class Levels>
__device__ __forceinline__ RotatedBlock<N> fit_rotated_block(const float* x, const Levels& lv, RotatedScratch& s) {
  static_assert(N == 32, "blocks of 64: fit_rotated_block64_pair");
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const float v[1] = {x[lane]};
  const double xd = static_cast<double>(v[0]);
  const float m = signed_absmax<1>(v);
  RotatedBlock<N> out;
  const int zero_code = lv.code(0.0f);
  out.q[0] = zero_code;
  if (m == 0.0f) return out;  // uniform across the warp: d = +0, the codes of 0
  s.x[lane] = xd;
  s.xf[lane] = v[0];
  __syncwarp();
  auto candidate_d = [&](int c) {
    const float top = c < 17 ? lv.first() : lv.last();
    const int i = c < 17 ? c : c - 17;
    const float factor = __fsub_rn(1.0f, __fmul_rn(0.025f, static_cast<float>(i)));
    return f16_bits(__fmul_rn(__fdiv_rn(m, top), factor));
  };
  // Candidates 32 and 33 and x . x, one element a lane.
  double spread[3];
  {
    const float d32 = f16_value(candidate_d(32)), d33 = f16_value(candidate_d(33));
    const float id32 = d32 != 0.0f ? __fdiv_rn(1.0f, d32) : 0.0f, id33 = d33 != 0.0f ? __fdiv_rn(1.0f, d33) : 0.0f;
    const double e32 = __fma_rn(-lv.level_d(__fmul_rn(v[0], id32)), static_cast<double>(d32), xd);
    const double e33 = __fma_rn(-lv.level_d(__fmul_rn(v[0], id33)), static_cast<double>(d33), xd);
    spread[0] = __dmul_rn(e32, e32);
    spread[1] = __dmul_rn(e33, e33);
    spread[2] = __dmul_rn(xd, xd);  // exact: 48 significant bits
  }
  // Candidate `lane`, with its codes' x . v and v . v.
  const uint16_t dh_lane = candidate_d(lane);
  double err = 0.0, xq = 0.0, qq = 0.0;
  {
    const float d = f16_value(dh_lane);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const double dd = static_cast<double>(d);
    const float4* x4 = reinterpret_cast<const float4*>(s.xf);
    const double2* xd2 = reinterpret_cast<const double2*>(s.x);
#pragma unroll
    for (int j4 = 0; j4 < 8; ++j4) {
      const float4 f = x4[j4];
      const double2 a = xd2[2 * j4], b = xd2[2 * j4 + 1];
      const float fj[4] = {f.x, f.y, f.z, f.w};
      const double dj[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const double vq = lv.level_d(__fmul_rn(fj[u], id));
        const double e = __fma_rn(-vq, dd, dj[u]);
        err = __dadd_rn(err, __dmul_rn(e, e));
        xq = __fma_rn(dj[u], vq, xq);
        qq = __fma_rn(vq, vq, qq);
      }
    }
  }
  ordered_sums<3>(spread, s);
  const double xx = spread[2];
  // The first of least (error, c): the lanes' candidates, then 32, 33.
  double best = err < INFINITY ? err : INFINITY;  // NaN errors never win, as on the CPU
  int best_c = best < INFINITY ? lane : 64;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double ob = __shfl_xor_sync(kAll, best, o);
    const int oc = __shfl_xor_sync(kAll, best_c, o);
    if (ob < best || (ob == best && oc < best_c)) {
      best = ob;
      best_c = oc;
    }
  }
  if (spread[0] < best) {
    best = spread[0];
    best_c = 32;
  }
  if (spread[1] < best) {
    best = spread[1];
    best_c = 33;
  }
  // No candidate (NaN in the block, or every scale overflowing f16): the
  // codes of 0 and d 0 unless the refit below wins, the CPU's, whose refit
  // sums are then over the codes of 0.
  const bool found = best_c < 64;
  const uint16_t best_d = found ? candidate_d(best_c) : uint16_t{0};
  xq = __shfl_sync(kAll, xq, best_c & 31);
  qq = __shfl_sync(kAll, qq, best_c & 31);
  if (best_c >= 32) {  // 32, 33 or none: the sums over those codes, spread
    const float d = f16_value(best_d);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const double vq = found ? lv.level_d(__fmul_rn(v[0], id)) : lv.level_d(0.0f);
    double sums[2] = {__dmul_rn(xd, vq), __dmul_rn(vq, vq)};  // exact
    ordered_sums<2>(sums, s);
    xq = sums[0];
    qq = sums[1];
  }
  // The refit's error and, over its codes, x . v (the final sums if it wins).
  uint16_t dh = best_d;
  bool coded = found;  // whether the codes are those of dh (else of 0)
  if (qq > 0.0) {
    const uint16_t dh_r = f16_bits(__double2float_rn(__ddiv_rn(xq, qq)));
    const float d = f16_value(dh_r);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const double vq = lv.level_d(__fmul_rn(v[0], id));
    const double e = __fma_rn(-vq, static_cast<double>(d), xd);
    double sums[2] = {__dmul_rn(e, e), __dmul_rn(xd, vq)};
    ordered_sums<2>(sums, s);
    if (sums[0] < best) {
      dh = dh_r;
      xq = sums[1];
      coded = true;
    }
  }
  if (coded) {
    const float d = f16_value(dh);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    out.q[0] = lv.code(__fmul_rn(v[0], id));
  }
  out.d = xq != 0.0 ? f16_bits(__double2float_rn(__ddiv_rn(xx, xq))) : dh;
  return out;
}

}  // namespace rill::cuda::detail
