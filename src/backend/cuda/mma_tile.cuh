#pragma once
// Device helpers shared by the tensor-core prefill kernels
// (attention_mma.cu, attention_flash.cu, attention_wide.cu): shared-memory
// addresses, cp.async copies, ldmatrix fragment loads, f16 packing of
// probabilities, and a KV row's 8 elements as f16 for every KV type.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kv_types.cuh"

namespace rill::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zero-filled when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// N (4, 8 or 16) bytes global -> shared, both N-byte aligned, zero-filled
// when !valid (sizes under 16 go through L1: cp.async.cg takes 16 only).
template <int N>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, bool valid) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (N == 16) {
    cp_async16(dst, src, valid);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most one committed group of this thread is in flight.
__device__ __forceinline__ void cp_async_wait_one() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// (lo, hi) rounded to f16, lo in the low half; adds their rounded values to sum.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi, float& sum) {
  const __half2 h = __floats2half2_rn(lo, hi);
  sum += __low2float(h) + __high2float(h);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Whether tag KvT's blocks give 8 elements as biased level bytes
// (kv_types.cuh load8_biased): then load8h converts them in f16 arithmetic.
template <typename KvT>
inline constexpr bool kv_biased_levels = requires(const uint8_t* r, uint32_t (&u)[2]) {
  KvT::load8_biased(r, int64_t{0}, u);
  KvT::kLevelBias;
};

// Whether load8h reads tag KvT (f16, e4m3, or a type with load8: the block
// types and bf16): the types the tensor-core prefill kernels take.
template <typename KvT>
inline constexpr bool kv_reads_as_f16 = std::is_same_v<KvT, KvF16> || std::is_same_v<KvT, KvFp8> ||
                                        requires(const uint8_t* r, float* v) {
  KvT::load8(r, int64_t{0}, v);
};

// Bytes of one KV head of hd elements of tag KvT (hd a multiple of kBlock).
template <typename KvT>
constexpr int kv_head_bytes(int hd) {
  if constexpr (requires { KvT::kBlockBytes; }) {
    return hd / KvT::kBlock * KvT::kBlockBytes;
  } else if constexpr (std::is_same_v<KvT, KvFp8>) {
    return hd;
  } else if constexpr (std::is_same_v<KvT, KvF16> || std::is_same_v<KvT, KvBf16>) {
    return 2 * hd;
  } else {
    return 4 * hd;
  }
}

// Elements [e, e + 8) of a KV row (e % 8 == 0) as 8 f16 values: f16 as it
// is, e4m3 exactly, a block type's element scale x level (q4_1 / q5_1:
// plus the minimum) rounded to f16 once, bf16 rounded to f16. For the block types with load8_biased that product is
// taken in f16 arithmetic: 1024 + u is an exact f16 (u < 256, the byte put in the mantissa), minus 1024 + bias the
// level, exact; the f16 multiply by the f16 scale rounds the exact product once, as rounding the f32 product (exact: 11
// by 8 significant bits) to f16 does, so both give the same bits (NaN payloads aside). row may point to global or
// shared memory.
template <typename KvT>
__device__ __forceinline__ uint4 load8h(const uint8_t* row, int64_t e) {
  if constexpr (std::is_same_v<KvT, KvF16>) {
    return *reinterpret_cast<const uint4*>(row + 2 * e);
  } else if constexpr (std::is_same_v<KvT, KvFp8>) {
    const uint2 b = *reinterpret_cast<const uint2*>(row + e);
    uint4 h;
    uint32_t* w = &h.x;
    const uint32_t src[2] = {b.x, b.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 v = KvFp8::cvt2(static_cast<uint16_t>((src[i / 2] >> (16 * (i % 2))) & 0xffff));
      w[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return h;
  } else if constexpr (kv_biased_levels<KvT>) {
    uint32_t u[2];
    const __half2 s = __half2half2(KvT::load8_biased(row, e, u));
    const __half2 bias = __float2half2_rn(1024.0f + static_cast<float>(KvT::kLevelBias));
    uint4 h;
    uint32_t* w = &h.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Bytes 2 (i % 2) and 2 (i % 2) + 1 of u[i / 2], each under a 0x64
      // high byte: the f16 values 1024 + u.
      const uint32_t m = __byte_perm(u[i / 2], 0x64646464u, i % 2 == 0 ? 0x4140u : 0x4342u);
      const __half2 v = __hmul2_rn(__hsub2_rn(*reinterpret_cast<const __half2*>(&m), bias), s);
      w[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return h;
  } else {
    float f[8];
    KvT::load8(row, e, f);
    uint4 h;
    uint32_t* w = &h.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 v = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    return h;
  }
}

}  // namespace rill::cuda::detail
