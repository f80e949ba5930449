#pragma once
// The KV types the CUDA attention kernels read and rope_store_kv writes
// (model/kv_types.h: f32, f16, and q8_0 / q4_0 / iq4_nl (rotated: iq4_nlh)
// in GGML's block layouts, q8_0h64's and iq4_nlh64's blocks of 64 (the
// CPU's kKvQ8_0x64 / kKvIq4Nl64),
// byte for byte the CPU's, so the prefix-cache tiers and KV files carry it between
// devices; fp8: e4m3 bytes, the CPU's too; bf16, q4_1, q5_0 and q5_1 in
// kv_types_ggml.cuh, not yet run on a GPU). Each is a tag type with:
//   row_bytes(n)         bytes of n elements (n a multiple of kBlock); a KV
//                        row is n_head_kv heads end to end, head h at
//                        elements [h * head_dim, (h + 1) * head_dim)
//   load4(row, e, v)     elements [e, e + 4) of a row as f32 (e % 4 == 0)
//   load1(row, e)        element e as f32
//   load8(row, e, v)     block types and bf16: elements [e, e + 8) as f32
//                        (e % 8 == 0: one block, its scale read once)
//   load8_biased(row, e, u), kLevelBias   optional, block types whose
//                        levels are integers in [-kLevelBias, 255 -
//                        kLevelBias]: elements [e, e + 8) as their block's
//                        f16 scale (returned) and 8 bytes u (element i in
//                        byte i % 4 of u[i / 4]), x = scale * (u - kLevelBias)
//                        (mma_tile.cuh load8h converts these in f16)
//   store(x, row, e0, n) n f32 values x (shared memory) into elements
//                        [e0, e0 + n) of a row, e0 and n whole blocks, by
//                        the whole thread block (blockDim.x a multiple of
//                        32; every thread calls it after x is written)
//   store_rotated(...)   Q8_0 / Q4_0 / IQ4_NL / Q8_0_64 / IQ4_NL64 only (kRotatable):
//                        as store, for x already Hadamard-rotated per
//                        head, by the rotated types' encoder (kv_rotated.cuh
//                        fit_rotated_block, a warp per block of 32;
//                        Q8_0_64 / IQ4_NL64: fit_rotated_block64_pair,
//                        two warps per block of 64, so blockDim.x a
//                        multiple of 64): q8_0h / q4_0h / iq4_nlh /
//                        q8_0h64 / iq4_nlh64. IQ4_NL, Q8_0_64 and IQ4_NL64
//                        have no store (kRotatedOnly)
// Elements are addressed within the row, not the head: heads smaller than
// a block (head_dim 16: two heads share a q8_0 block, as on the CPU) are
// read in place like any other.
// The kernels are templated on the tag, so each type's loads compile into
// the same loop (no dequantized copy of the context: a head is converted
// in registers as it is read).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_rotated.cuh"
#include "backend/cuda/kv_rotated_pair.cuh"
#include "backend/cuda/kv_types_ggml.cuh"
#include "core/dtype.h"
#include "core/e4m3.h"

namespace rill::cuda::detail {

struct KvF32 {
  static constexpr DType kDtype = DType::kF32;
  static constexpr int kBlock = 1;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n * 4; }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const float4 x = *reinterpret_cast<const float4*>(row + 4 * e);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  }
  __device__ static float load1(const uint8_t* row, int64_t e) { return reinterpret_cast<const float*>(row)[e]; }
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) reinterpret_cast<float*>(row)[e0 + i] = x[i];
  }
};

struct KvF16 {
  static constexpr DType kDtype = DType::kF16;
  static constexpr int kBlock = 1;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n * 2; }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint2 raw = *reinterpret_cast<const uint2*>(row + 2 * e);
    const float2 fa = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 fb = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    v[0] = fa.x;
    v[1] = fa.y;
    v[2] = fb.x;
    v[3] = fb.y;
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    return __half2float(reinterpret_cast<const __half*>(row)[e]);
  }
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) reinterpret_cast<__half*>(row)[e0 + i] = __float2half_rn(x[i]);
  }
};

// GGML's block_q8_0: an f16 scale, then 32 int8 levels; x = scale * q.
// Blocks are 34 bytes, so a block's levels are only 2-byte aligned: loads
// go 2 bytes at a time. The quantizer is llama.cpp's reference
// (quantize_row_q8_0_ref, the CPU's ref::quantize_kv_row): scale =
// max|x| / 127 in f32, levels round(x / scale) via the f32 reciprocal, so
// the same floats give the same bytes on both devices.
struct KvQ8_0 {
  static constexpr DType kDtype = DType::kQ8_0;
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 34;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (e & 31));
    const uint16_t lo = q[0], hi = q[1];
    v[0] = s * static_cast<float>(static_cast<int8_t>(lo & 0xff));
    v[1] = s * static_cast<float>(static_cast<int8_t>(lo >> 8));
    v[2] = s * static_cast<float>(static_cast<int8_t>(hi & 0xff));
    v[3] = s * static_cast<float>(static_cast<int8_t>(hi >> 8));
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    return s * static_cast<float>(static_cast<int8_t>(blk[2 + (e & 31)]));
  }
  __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (e & 31));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t two = q[i];
      v[2 * i] = s * static_cast<float>(static_cast<int8_t>(two & 0xff));
      v[2 * i + 1] = s * static_cast<float>(static_cast<int8_t>(two >> 8));
    }
  }
  static constexpr int kLevelBias = 128;  // the int8 level q as the byte q + 128
  __device__ static __half load8_biased(const uint8_t* row, int64_t e, uint32_t (&u)[2]) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (e & 31));
    u[0] = (q[0] | (static_cast<uint32_t>(q[1]) << 16)) ^ 0x80808080u;
    u[1] = (q[2] | (static_cast<uint32_t>(q[3]) << 16)) ^ 0x80808080u;
    return *reinterpret_cast<const __half*>(blk);
  }
  // Warp w quantizes blocks w, w + n_warps, ...: lane i holds element i of
  // the block, the block's max|x| is a warp reduction.
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const float v = x[i0 + lane];
      const float amax = warp_max(fabsf(v));
      const float scale = amax / 127.0f;
      const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(scale);
      blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(v * inv)));
    }
  }
  static constexpr bool kRotatable = true;
  __device__ static void store_rotated(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const RotatedBlock<32> b = fit_rotated_block<32>(x + i0, UniformLevels{-127, 127}, rotated_scratch(x, n));
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = b.d;
      blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(b.q[0]));
    }
  }
};

// GGML's block_q4_0: an f16 scale d, then 16 bytes: element j < 16 in the
// low nibble of byte j, element j + 16 in its high nibble; x = d (q - 8).
// The quantizer is llama.cpp's reference: d = -(the element of largest
// magnitude, the first on ties) / 8, q = min(15, trunc(x / d + 8.5)).
struct KvQ4_0 {
  static constexpr DType kDtype = DType::kQ4_0;
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 18;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31), shift = j >= 16 ? 4 : 0;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
    const uint32_t b = q[0] | (static_cast<uint32_t>(q[1]) << 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = s * static_cast<float>(static_cast<int>((b >> (8 * i + shift)) & 0xF) - 8);
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31);
    const int q = (blk[2 + (j & 15)] >> (j >= 16 ? 4 : 0)) & 0xF;
    return s * static_cast<float>(q - 8);
  }
  __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31), shift = j >= 16 ? 4 : 0;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t two = q[i];
      v[2 * i] = s * static_cast<float>(static_cast<int>((two >> shift) & 0xF) - 8);
      v[2 * i + 1] = s * static_cast<float>(static_cast<int>((two >> (8 + shift)) & 0xF) - 8);
    }
  }
  static constexpr int kLevelBias = 8;  // the level q - 8 as the code q
  __device__ static __half load8_biased(const uint8_t* row, int64_t e, uint32_t (&u)[2]) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const int j = static_cast<int>(e & 31), shift = j >= 16 ? 4 : 0;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
    u[0] = ((q[0] | (static_cast<uint32_t>(q[1]) << 16)) >> shift) & 0x0F0F0F0Fu;
    u[1] = ((q[2] | (static_cast<uint32_t>(q[3]) << 16)) >> shift) & 0x0F0F0F0Fu;
    return *reinterpret_cast<const __half*>(blk);
  }
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const float v = x[i0 + lane];
      const float amax = warp_max(fabsf(v));
      const unsigned at_max = __ballot_sync(0xffffffffu, fabsf(v) == amax);
      const float max = __shfl_sync(0xffffffffu, v, __ffs(at_max) - 1);
      const float d = (amax > 0.0f ? max : 0.0f) / -8.0f;
      const float inv = d != 0.0f ? 1.0f / d : 0.0f;
      // Rounded multiply, then add (no FMA): the CPU reference's two roundings.
      const int q = min(15, static_cast<int>(__fadd_rn(__fmul_rn(v, inv), 8.5f)));
      const int hi = __shfl_down_sync(0xffffffffu, q, 16);
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
      if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(q | (hi << 4));
    }
  }
  static constexpr bool kRotatable = true;
  __device__ static void store_rotated(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const RotatedBlock<32> b = fit_rotated_block<32>(x + i0, UniformLevels{-8, 7}, rotated_scratch(x, n));
      const int q = b.q[0] + 8, hi = __shfl_down_sync(0xffffffffu, q, 16);
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = b.d;
      if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(q | (hi << 4));
    }
  }
};

// GGML's block_iq4_nl, stored rotated only (iq4_nlh): q4_0's layout (an
// f16 scale d, then 16 bytes: element j < 16 in the low nibble of byte j,
// element j + 16 in its high nibble) with x = d * kIq4nlValues[q], the 16
// non-uniform levels of iq4_nl (kv_rotated.cuh Iq4nlLevels), in f32 as the
// CPU's decoder (dq_iq4_nl). The levels are looked up four at a time by
// byte permutes (iq4nl_levels4). Written only by store_rotated, the CPU's
// rotated encoder: plain iq4_nl has no GGML encoder in rill (kRotatedOnly:
// the rope kernel never takes store for it, and kv_rotation_supported
// refuses it unrotated).
struct KvIq4Nl {
  static constexpr DType kDtype = DType::kIQ4_NL;
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 18;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }
  // Four codes of the bytes of word b (low nibbles, or high: shift 4), as
  // four levels times s.
  __host__ __device__ static void levels4(uint32_t b, int shift, float s, float* v) {
    const uint32_t levels = iq4nl_levels4((b >> shift) & 0x0F0F0F0Fu);
    RILL_DEVICE_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = s * level_byte(levels, i);
  }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31);
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
    levels4(q[0] | (static_cast<uint32_t>(q[1]) << 16), j >= 16 ? 4 : 0, s, v);
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31);
    const auto q = static_cast<uint32_t>((blk[2 + (j & 15)] >> (j >= 16 ? 4 : 0)) & 0xF);
    return s * level_byte(iq4nl_levels4(q), 0);
  }
  __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const int j = static_cast<int>(e & 31), shift = j >= 16 ? 4 : 0;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
    levels4(q[0] | (static_cast<uint32_t>(q[1]) << 16), shift, s, v);
    levels4(q[2] | (static_cast<uint32_t>(q[3]) << 16), shift, s, v + 4);
  }
  static constexpr int kLevelBias = 128;  // the int8 level l as the byte l + 128
  __device__ static __half load8_biased(const uint8_t* row, int64_t e, uint32_t (&u)[2]) {
    const uint8_t* blk = row + (e >> 5) * kBlockBytes;
    const int j = static_cast<int>(e & 31), shift = j >= 16 ? 4 : 0;
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (j & 15));
    u[0] = iq4nl_levels4(((q[0] | (static_cast<uint32_t>(q[1]) << 16)) >> shift) & 0x0F0F0F0Fu) ^ 0x80808080u;
    u[1] = iq4nl_levels4(((q[2] | (static_cast<uint32_t>(q[3]) << 16)) >> shift) & 0x0F0F0F0Fu) ^ 0x80808080u;
    return *reinterpret_cast<const __half*>(blk);
  }
  static constexpr bool kRotatable = true;
  static constexpr bool kRotatedOnly = true;
  __device__ static void store_rotated(const float* x, uint8_t* row, int64_t e0, int n) {
    const int lane = threadIdx.x & 31;
    uint8_t* first = row + (e0 >> 5) * kBlockBytes;
    for (int i0 = threadIdx.x & ~31; i0 < n; i0 += blockDim.x) {
      const RotatedBlock<32> b = fit_rotated_block<32>(x + i0, Iq4nlLevels{}, rotated_scratch(x, n));
      const int hi = __shfl_down_sync(0xffffffffu, b.q[0], 16);
      uint8_t* blk = first + (i0 >> 5) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = b.d;
      if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(b.q[0] | (hi << 4));
    }
  }
};

// q8_0h64's blocks (core/e4m3.h kKvQ8_0x64, cpu::kQ8_0x64Bytes): an f16
// scale d, then the int8 codes of 64 elements; x = d * q, q in -127..127.
// One scale per 64 values instead of 32 (66 bytes against two q8_0
// blocks' 68: 1.939x f16's tokens per GiB). Blocks are 66 bytes, so codes
// are 2-byte aligned (read 2 bytes at a time, as KvQ8_0). Written only by
// store_rotated (the CPU's rotated encoder over blocks of 64, two warps
// per block): q8_0h64 is stored rotated only (kRotatedOnly), as on the CPU,
// and needs head_dim a multiple of 64 (a block never spans two heads).
struct KvQ8_0x64 {
  static constexpr DType kDtype = kKvQ8_0x64;
  static constexpr int kBlock = 64;
  static constexpr int kBlockBytes = cpu::kQ8_0x64Bytes;
  static_assert(kBlockBytes == 2 + kBlock, "an f16 scale and 64 int8 codes");
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (e & 63));
    const uint16_t lo = q[0], hi = q[1];
    v[0] = s * static_cast<float>(static_cast<int8_t>(lo & 0xff));
    v[1] = s * static_cast<float>(static_cast<int8_t>(lo >> 8));
    v[2] = s * static_cast<float>(static_cast<int8_t>(hi & 0xff));
    v[3] = s * static_cast<float>(static_cast<int8_t>(hi >> 8));
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    return s * static_cast<float>(static_cast<int8_t>(blk[2 + (e & 63)]));
  }
  __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const float s = __half2float(*reinterpret_cast<const __half*>(blk));
    const auto* q = reinterpret_cast<const uint16_t*>(blk + 2 + (e & 63));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t two = q[i];
      v[2 * i] = s * static_cast<float>(static_cast<int8_t>(two & 0xff));
      v[2 * i + 1] = s * static_cast<float>(static_cast<int8_t>(two >> 8));
    }
  }
  static constexpr bool kRotatable = true;
  static constexpr bool kRotatedOnly = true;
  // Warps 2p and 2p + 1 encode blocks p, p + n_pairs, ... together
  // (fit_rotated_block64_pair; lane i: elements i and i + 32). Every thread
  // of the thread block calls it (blockDim.x a multiple of 64, at most
  // 1024): the pairs' loop runs as often in each, for the barrier inside.
  // x (n floats) is followed by blockDim.x / 32 PairScratch (pair_scratch).
  __device__ static void store_rotated(const float* x, uint8_t* row, int64_t e0, int n) {
    __shared__ PairExchange slots[2][16][2];  // [round parity][pair][warp]: a next round never overwrites a read
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = warp & 1, pair = warp >> 1;
    const int n_pairs = static_cast<int>(blockDim.x >> 6);
    uint8_t* first = row + (e0 >> 6) * kBlockBytes;
    for (int base = 0, round = 0; base < n; base += 64 * n_pairs, ++round) {
      const int i0 = base + 64 * pair;
      const bool mine = i0 < n;
      const RotatedBlock<64> b = fit_rotated_block64_pair(x + (mine ? i0 : 0), UniformLevels{-127, 127}, half,
                                                          slots[round & 1][pair], pair_scratch(x, n));
      if (!mine || half == 1) continue;
      uint8_t* blk = first + (i0 >> 6) * kBlockBytes;
      if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = b.d;
      blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(b.q[0]));
      blk[34 + lane] = static_cast<uint8_t>(static_cast<int8_t>(b.q[1]));
    }
  }
};

// iq4_nlh64's blocks (core/e4m3.h kKvIq4Nl64, cpu::kIq4Nl64Bytes; k4c's V):
// byte 0 the e4m3 code of 16 d, then 32 bytes of codes: element j < 32 in
// the low nibble of byte 1 + j, element j + 32 in its high nibble; x = d *
// kIq4nlValues[q] in f32 (the CPU's dq_iq4_nl64: the product is exact, 4
// by 8 significant bits). 33 bytes a block, so a head (33 bytes at
// head_dim 64, 66 at 128) starts at any byte and its codes are not
// aligned at all: 4 or 8 code bytes are read as the aligned words holding
// them, funnel-shifted into place (code_bytes4 / 8; only words holding one
// of the bytes asked for are read, so never a byte past a head's last
// word). Written only by store_rotated (the CPU's rotated encoder over
// blocks of 64 with iq4_nl's levels and the e4m3 scale, two warps per
// block, as KvQ8_0x64): rotated only (kRotatedOnly), head_dim a multiple of
// 64 (its tests passed on an H200, 2026-12-05).
struct KvIq4Nl64 {
  static constexpr DType kDtype = kKvIq4Nl64;
  static constexpr int kBlock = 64;
  static constexpr int kBlockBytes = cpu::kIq4Nl64Bytes;
  static_assert(kBlockBytes == 1 + kBlock / 2, "an e4m3 scale and 64 nibbles");
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n / kBlock * kBlockBytes; }
  // The loads below are also built for the host (kv_probe.h's host runs:
  // the same code over host memory, where no GPU is present).
  __host__ __device__ static float scale(const uint8_t* blk) { return mul_rn(e4m3_to_float(blk[0]), 0.0625f); }
  // (hi:lo) >> shift, low 32 bits (shift < 32): __funnelshift_r.
  __host__ __device__ static uint32_t funnel(uint32_t lo, uint32_t hi, int shift) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, shift);
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> shift);
#endif
  }
  // Bytes [p, p + 4) / [p, p + 8) at any address (global or shared).
  __host__ __device__ static uint32_t code_bytes4(const uint8_t* p) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    const auto* w = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
    const int o = static_cast<int>(at & 3);
    return funnel(w[0], o ? w[1] : 0u, 8 * o);
  }
  __host__ __device__ static uint2 code_bytes8(const uint8_t* p) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    const auto* w = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
    const int o = static_cast<int>(at & 3);
    const uint32_t w0 = w[0], w1 = w[1], w2 = o ? w[2] : 0u;
    return make_uint2(funnel(w0, w1, 8 * o), funnel(w1, w2, 8 * o));
  }
  __host__ __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const int j = static_cast<int>(e & 63);
    KvIq4Nl::levels4(code_bytes4(blk + 1 + (j & 31)), j >= 32 ? 4 : 0, scale(blk), v);
  }
  __host__ __device__ static float load1(const uint8_t* row, int64_t e) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const int j = static_cast<int>(e & 63);
    const auto q = static_cast<uint32_t>((blk[1 + (j & 31)] >> (j >= 32 ? 4 : 0)) & 0xF);
    return scale(blk) * level_byte(iq4nl_levels4(q), 0);
  }
  __host__ __device__ static void load8(const uint8_t* row, int64_t e, float* v) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const int j = static_cast<int>(e & 63), shift = j >= 32 ? 4 : 0;
    const float s = scale(blk);
    const uint2 b = code_bytes8(blk + 1 + (j & 31));
    KvIq4Nl::levels4(b.x, shift, s, v);
    KvIq4Nl::levels4(b.y, shift, s, v + 4);
  }
  // The scale as f16 is exact (e4m3 / 16: 2^-13 .. 28, 4 significant bits).
  static constexpr int kLevelBias = 128;  // the int8 level l as the byte l + 128
  __device__ static __half load8_biased(const uint8_t* row, int64_t e, uint32_t (&u)[2]) {
    const uint8_t* blk = row + (e >> 6) * kBlockBytes;
    const int j = static_cast<int>(e & 63), shift = j >= 32 ? 4 : 0;
    const uint2 b = code_bytes8(blk + 1 + (j & 31));
    u[0] = iq4nl_levels4((b.x >> shift) & 0x0F0F0F0Fu) ^ 0x80808080u;
    u[1] = iq4nl_levels4((b.y >> shift) & 0x0F0F0F0Fu) ^ 0x80808080u;
    return __float2half_rn(scale(blk));
  }
  static constexpr bool kRotatable = true;
  static constexpr bool kRotatedOnly = true;
  // As KvQ8_0x64::store_rotated (pairs of warps, every thread of the
  // thread block calls it, blockDim.x a multiple of 64): lane i's codes are
  // elements i and i + 32, the low and high nibble of code byte i.
  __device__ static void store_rotated(const float* x, uint8_t* row, int64_t e0, int n) {
    __shared__ PairExchange slots[2][16][2];  // [round parity][pair][warp]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = warp & 1, pair = warp >> 1;
    const int n_pairs = static_cast<int>(blockDim.x >> 6);
    uint8_t* first = row + (e0 >> 6) * kBlockBytes;
    for (int base = 0, round = 0; base < n; base += 64 * n_pairs, ++round) {
      const int i0 = base + 64 * pair;
      const bool mine = i0 < n;
      const RotatedBlock<64> b = fit_rotated_block64_pair(x + (mine ? i0 : 0), Iq4nlLevels{}, half,
                                                          slots[round & 1][pair], pair_scratch(x, n), E4m3x16Scale{});
      if (!mine || half == 1) continue;
      uint8_t* blk = first + (i0 >> 6) * kBlockBytes;
      if (lane == 0) blk[0] = static_cast<uint8_t>(b.d);
      blk[1 + lane] = static_cast<uint8_t>(b.q[0] | (b.q[1] << 4));
    }
  }
};

// fp8 (model/kv_types.h "fp8"): one OCP e4m3 (fn) byte per element, with
// no stored scale (x = e4m3 value: vLLM's fp8 KV without calibrated
// scales, k_scale = v_scale = 1). Stored by round to nearest even,
// saturating at +-448 (a NaN stays NaN).
// Why no per-head scale: a stored scale makes a row more than its
// elements (a head of 128 would be 128 + 2 or 4 bytes), so rows lose the
// 16-byte alignment that lets the fast decode kernel and the tensor-core
// prefill kernel read 8 or 16 elements in one load; a per-layer scale needs
// calibration data rill does not have (a scale fixed at load must hold
// every future token, which the store kernel cannot know). Scale 1 keeps
// the layout of a plain element type (tiers, KV files and /stats count a
// byte per element) and costs what e4m3 itself costs: 3 mantissa bits
// (relative rounding <= 2^-4) for |x| >= 2^-6, an absolute 2^-10 below
// that (subnormals down to 2^-9), and clipping above 448: a model whose
// K or V reach beyond +-448 (large K biases) should take q8_0 instead.
// e4m3 converts to f16 exactly (every e4m3 value is an f16 value), so the
// tensor-core prefill reads it through a cvt to f16 and nothing else.
struct KvFp8 {
  static constexpr DType kDtype = kF8E4M3;
  static constexpr int kBlock = 1;
  __host__ __device__ static int64_t row_bytes(int64_t n) { return n; }
  __device__ static __half2 cvt2(uint16_t two) {
    return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3));
  }
  __device__ static void load4(const uint8_t* row, int64_t e, float* v) {
    const uint32_t four = *reinterpret_cast<const uint32_t*>(row + e);
    const float2 a = __half22float2(cvt2(static_cast<uint16_t>(four & 0xffff)));
    const float2 b = __half22float2(cvt2(static_cast<uint16_t>(four >> 16)));
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
  }
  __device__ static float load1(const uint8_t* row, int64_t e) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(row[e]), __NV_E4M3)));
  }
  __device__ static uint8_t encode(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
  __device__ static void store(const float* x, uint8_t* row, int64_t e0, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[e0 + i] = encode(x[i]);
  }
};

// Whether tag KvT has the rotated types' encoder (store_rotated).
template <typename KvT>
inline constexpr bool kv_rotatable = requires {
  KvT::kRotatable;
};
// Whether tag KvT is stored rotated only (it has no plain store).
template <typename KvT>
inline constexpr bool kv_rotated_only = requires {
  KvT::kRotatedOnly;
};

}  // namespace rill::cuda::detail

// Calls MACRO(KvT) with KvT the tag of a KV dtype the CUDA kernels take
// (F32, F16, Q8_0, Q4_0, IQ4_NL, Q8_0_64 and IQ4_NL64 (rotated only),
// F8_E4M3; BF16, Q4_1, Q5_0, Q5_1: kv_types_ggml.cuh); for
// any other dtype nothing (callers check kv_supported(), which is this list).
#define RILL_CUDA_DISPATCH_KV(dtype, ...)          \
  do {                                             \
    if ((dtype) == ::rill::kF8E4M3) {              \
      using KvT = ::rill::cuda::detail::KvFp8;     \
      __VA_ARGS__;                                 \
      break;                                       \
    }                                              \
    if ((dtype) == ::rill::kKvQ8_0x64) {           \
      using KvT = ::rill::cuda::detail::KvQ8_0x64; \
      __VA_ARGS__;                                 \
      break;                                       \
    }                                              \
    if ((dtype) == ::rill::kKvIq4Nl64) {           \
      using KvT = ::rill::cuda::detail::KvIq4Nl64; \
      __VA_ARGS__;                                 \
      break;                                       \
    }                                              \
    switch (dtype) {                               \
      case ::rill::DType::kF32: {                  \
        using KvT = ::rill::cuda::detail::KvF32;   \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kF16: {                  \
        using KvT = ::rill::cuda::detail::KvF16;   \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kQ8_0: {                 \
        using KvT = ::rill::cuda::detail::KvQ8_0;  \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kQ4_0: {                 \
        using KvT = ::rill::cuda::detail::KvQ4_0;  \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kIQ4_NL: {               \
        using KvT = ::rill::cuda::detail::KvIq4Nl; \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kBF16: {                 \
        using KvT = ::rill::cuda::detail::KvBf16;  \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kQ4_1: {                 \
        using KvT = ::rill::cuda::detail::KvQ4_1;  \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kQ5_0: {                 \
        using KvT = ::rill::cuda::detail::KvQ5_0;  \
        __VA_ARGS__;                               \
      } break;                                     \
      case ::rill::DType::kQ5_1: {                 \
        using KvT = ::rill::cuda::detail::KvQ5_1;  \
        __VA_ARGS__;                               \
      } break;                                     \
      default:                                     \
        break;                                     \
    }                                              \
  } while (0)
