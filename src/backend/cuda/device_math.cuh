#pragma once
// Device-side helpers shared by the kernels: element conversions, warp and
// block reductions, and the dtype -> C++ type dispatch of the launchers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_context.h"
#include "core/dtype.h"

namespace rill::cuda::detail {

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A warp reduction over the block (blockDim.x a multiple of 32, <= 1024;
// warp_reduce: warp_sum or warp_max), the warps' results in warp order, absent warps
// 0; every thread gets the result. `red` is __shared__ float[32].
template <typename WarpReduce>
__device__ __forceinline__ float block_reduce(float v, float* red, WarpReduce warp_reduce) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_reduce(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const float s = lane < n_warps ? red[lane] : 0.0f;
  return warp_reduce(s);
}
__device__ __forceinline__ float block_sum(float v, float* red) {
  return block_reduce(v, red, [](float x) { return warp_sum(x); });
}
// Of values >= 0 (absent warps count 0).
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce(v, red, [](float x) { return warp_max(x); });
}

// Programmatic dependent launch, device side. pdl_wait() blocks until the
// grid this one was launched behind has completed and its writes are
// visible; a kernel must call it before touching anything its predecessor
// reads or writes, and every block must reach it before exiting (so that a
// kernel never completes before its predecessor: the chain stays
// transitive). pdl_trigger() lets the next kernel start launching.
// Without a programmatic launch both return at once.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace rill::cuda::detail

namespace rill::cuda {

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic
// dependent launch allowed: the kernel must call
// detail::pdl_wait() as described above. Aborts on a launch error.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check_or_die(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...), "cudaLaunchKernelEx", __FILE__,
               __LINE__);
}

// The 8 elements of 16 bytes of T (f32: 4, f16/bf16: 8; the overload is
// picked by a null T pointer) as f32 in f[0..7] (f32 fills f[0..3]).
__device__ __forceinline__ void unpack8(const uint4& u, const float*, float* f) {
  f[0] = __uint_as_float(u.x);
  f[1] = __uint_as_float(u.y);
  f[2] = __uint_as_float(u.z);
  f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack8(const uint4& u, const __half*, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void unpack8(const uint4& u, const __nv_bfloat16*, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// d += A * B on the tensor cores, mma.sync m16n8k16 with f32 accumulation;
// T (__half or __nv_bfloat16) picks the input type; a0..a3 / b0, b1 are the
// PTX fragment registers.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

}  // namespace rill::cuda

// Calls MACRO(T) with T the C++ type of a float dtype (F32/F16/BF16).
#define RILL_CUDA_DISPATCH_FLOAT(dtype, ...) \
  do {                                       \
    switch (dtype) {                         \
      case ::rill::DType::kF16: {            \
        using T = __half;                    \
        __VA_ARGS__;                         \
      } break;                               \
      case ::rill::DType::kBF16: {           \
        using T = __nv_bfloat16;             \
        __VA_ARGS__;                         \
      } break;                               \
      default: {                             \
        using T = float;                     \
        __VA_ARGS__;                         \
      } break;                               \
    }                                        \
  } while (0)
