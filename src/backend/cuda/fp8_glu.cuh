#pragma once
// The GLU of the FP8 paths' fused epilogues (fp8.cu's fp8_scale_glu,
// fp8_mma.cu's GLU epilogue): act(x) * u in ops.cu's silu_mul /
// ops_gemma.cu's gelu_tanh_mul form, so each output is the same bits those
// kernels give from the same gate and up values. Written out, not shared
// with them: those kernels are not to change here.
#include <cuda_runtime.h>

namespace rill::cuda::detail {

template <bool kGelu>
__device__ __forceinline__ float fp8_glu_times(float x, float u) {
  if constexpr (kGelu) {
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * u;
  } else {
    return x / (1.0f + expf(-x)) * u;
  }
}

}  // namespace rill::cuda::detail
