#pragma once
// Host-and-device arithmetic shared by the k4c / k4a attention kernels
// (attention_chan.cu, the reference, and attention_chan_fast.cu): the same
// expression on the device and, for the host runs of the tests, on the CPU.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/kv_rotated.cuh"

namespace rill::cuda::detail {

__host__ __device__ __forceinline__ float chan_exp(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}

// softcap * tanh(x / softcap), or x without a softcap (Gemma 2).
__host__ __device__ __forceinline__ float chan_capped(float x, float softcap) {
#ifdef __CUDA_ARCH__
  return softcap > 0.0f ? mul_rn(softcap, tanhf(x / softcap)) : x;
#else
  return softcap > 0.0f ? softcap * std::tanh(x / softcap) : x;
#endif
}

// Element e of a q8_0 row (f16 d times the int8 code).
__host__ __device__ __forceinline__ float chan_q8_value(const uint8_t* row, int64_t e) {
  const uint8_t* blk = row + (e / 32) * 34;
  const auto d = static_cast<uint16_t>(blk[0] | (blk[1] << 8));
  return mul_rn(f16_value(d), static_cast<float>(static_cast<int8_t>(blk[2 + e % 32])));
}

}  // namespace rill::cuda::detail
