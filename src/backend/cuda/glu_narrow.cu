// glu_narrow.h's kernel: a row's gate and up halves read as 16-bit values,
// eight at a time where the row allows (16-byte loads), the activation and
// product in f32, one rounding to the output type.
#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/glu_narrow.h"

namespace rill::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

template <bool kGelu>
__device__ __forceinline__ float glu_value(float x, float u) {
  if constexpr (kGelu) {
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * u;
  } else {
    return x / (1.0f + expf(-x)) * u;
  }
}

// One grid row per token; kVec values a thread a round (8: n_ff a multiple
// of 8 and every row 16-byte aligned, else 1).
template <bool kGelu, int kVec, typename In, typename Out>
__global__ void glu_narrow_kernel(const In* gate_up, int64_t n_ff, Out* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const In* g = gate_up + r * 2 * n_ff;
  const In* u = g + n_ff;
  Out* o = out + r * n_ff;
  const int64_t n = n_ff / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if constexpr (kVec == 1) {
      o[i] = from_f32<Out>(glu_value<kGelu>(to_f32(g[i]), to_f32(u[i])));
    } else {
      const uint4 gv = reinterpret_cast<const uint4*>(g)[i], uv = reinterpret_cast<const uint4*>(u)[i];
      const In* ge = reinterpret_cast<const In*>(&gv);
      const In* ue = reinterpret_cast<const In*>(&uv);
      alignas(16) Out res[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) res[k] = from_f32<Out>(glu_value<kGelu>(to_f32(ge[k]), to_f32(ue[k])));
      if constexpr (sizeof(Out) == 2) {
        reinterpret_cast<uint4*>(o)[i] = *reinterpret_cast<const uint4*>(res);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) o[kVec * i + k] = res[k];
      }
    }
  }
}

template <bool kGelu, typename In, typename Out>
void launch(const In* gate_up, int64_t n_rows, int64_t n_ff, Out* out, cudaStream_t stream) {
  const bool vec =
      n_ff % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t per_row = vec ? n_ff / 8 : n_ff;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((per_row + 255) / 256, 1024)), static_cast<unsigned>(n_rows));
  if (vec) {
    launch_pdl(glu_narrow_kernel<kGelu, 8, In, Out>, grid, 256, 0, stream, gate_up, n_ff, out);
  } else {
    launch_pdl(glu_narrow_kernel<kGelu, 1, In, Out>, grid, 256, 0, stream, gate_up, n_ff, out);
  }
}

template <typename In>
void dispatch_out(bool gelu, const In* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype, void* out,
                  cudaStream_t stream) {
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, gelu ? launch<true>(gate_up, n_rows, n_ff, static_cast<T*>(out), stream)
                                           : launch<false>(gate_up, n_rows, n_ff, static_cast<T*>(out), stream));
}

}  // namespace

void glu_narrow(bool gelu, DType in_dtype, const void* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype,
                void* out, cudaStream_t stream) {
  if (n_rows <= 0 || n_ff <= 0) return;
  assert(n_rows <= 65535 && (in_dtype == DType::kF16 || in_dtype == DType::kBF16));
  if (in_dtype == DType::kF16) {
    dispatch_out(gelu, static_cast<const __half*>(gate_up), n_rows, n_ff, out_dtype, out, stream);
  } else {
    dispatch_out(gelu, static_cast<const __nv_bfloat16*>(gate_up), n_rows, n_ff, out_dtype, out, stream);
  }
}

bool glu_narrow_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_GLU_NARROW");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

}  // namespace rill::cuda
