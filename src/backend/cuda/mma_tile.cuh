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

// Elements [e, e + 8) of a KV row (e % 8 == 0) as 8 f16 values: f16 as it
// is, e4m3 exactly, a q8_0/q4_0 element's scale x level rounded to f16 once.
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
