// The Gemma family's kernels (declared in ops.h; Gemma 4's in
// ops_gemma4.h): GeGLU, the sandwich norm's residual add fused with the
// next pre-norm, logit softcapping and the embedding scale, Gemma 4's split
// GLU and V norm, its assistant's position shift and strided conversion.
// Each computes what the CPU model does, in its order.
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_gemma4.h"

namespace rill::cuda {
namespace {

using detail::block_sum;
using detail::from_f32;

template <typename Out>
__global__ void gelu_tanh_mul_kernel(const float* gate_up, int64_t n_ff, Out* out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const float* g = gate_up + r * 2 * n_ff;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n_ff; i += gridDim.x * blockDim.x) {
    const float x = g[i];
    out[r * n_ff + i] =
        from_f32<Out>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * g[n_ff + i]);
  }
}

// One block per row; a thread keeps the same columns through both norms, so
// it reads back only the x values it wrote itself.
template <typename Out>
__global__ void post_norm_add_kernel(const float* y, const float* w_post, float* x, const float* w_next, int64_t dim,
                                     float eps, float w_offset, Out* out) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.x;
  const float* yr = y + r * dim;
  float* xr = x + r * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += yr[i] * yr[i];
  ss = block_sum(ss, red);
  const float post = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  float ss_x = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] + (yr[i] * post) * (w_offset + w_post[i]);
    xr[i] = v;
    ss_x += v * v;
  }
  if (!w_next) return;
  ss_x = block_sum(ss_x, red);
  const float next = 1.0f / sqrtf(ss_x / static_cast<float>(dim) + eps);
  Out* o = out + r * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = from_f32<Out>((xr[i] * next) * (w_offset + w_next[i]));
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

template <typename Out>
__global__ void glu_split_kernel(bool gelu, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride,
                                 int64_t n_ff, Out* out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  const float* g = gate + r * gate_stride;
  const float* u = up + r * up_stride;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n_ff; i += gridDim.x * blockDim.x) {
    const float x = g[i];
    const float act =
        gelu ? 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) : x / (1.0f + expf(-x));
    out[r * n_ff + i] = from_f32<Out>(act * u[i]);
  }
}

// One block per (row, head).
__global__ void head_rms_norm_kernel(float* x, int64_t stride, int64_t col0, int32_t head_dim, float eps) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  float* h = x + blockIdx.x * stride + col0 + static_cast<int64_t>(blockIdx.y) * head_dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) ss += h[d] * h[d];
  ss = block_sum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) h[d] *= scale;
}

__global__ void shift_positions_kernel(const int32_t* pos, int64_t n, int32_t offset, int32_t* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = pos[i] + offset;
  }
}

template <typename Out>
__global__ void convert_rows_kernel(const float* x, int64_t x_stride, int64_t cols, Out* out, int64_t out_stride) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cols; i += int64_t{gridDim.x} * blockDim.x) {
    out[r * out_stride + i] = from_f32<Out>(x[r * x_stride + i]);
  }
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

void gelu_tanh_mul(const float* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype, void* out,
                   cudaStream_t stream) {
  if (n_rows <= 0) return;
  const dim3 grid(blocks_for(n_ff, 256), static_cast<unsigned>(n_rows));
  RILL_CUDA_DISPATCH_FLOAT(
      out_dtype, launch_pdl(gelu_tanh_mul_kernel<T>, grid, 256, 0, stream, gate_up, n_ff, static_cast<T*>(out)));
}

void post_norm_add(const float* y, const float* w_post, float* x, const float* w_next, int64_t n_rows, int64_t dim,
                   float eps, float w_offset, DType out_dtype, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 256 : 64;
  RILL_CUDA_DISPATCH_FLOAT(
      out_dtype, launch_pdl(post_norm_add_kernel<T>, static_cast<unsigned>(n_rows), threads, 0, stream, y, w_post, x,
                            w_next, dim, eps, w_offset, static_cast<T*>(out)));
}

void glu_split(bool gelu, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n_rows,
               int64_t n_ff, DType out_dtype, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  const dim3 grid(blocks_for(n_ff, 256), static_cast<unsigned>(n_rows));
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(glu_split_kernel<T>, grid, 256, 0, stream, gelu, gate, gate_stride, up,
                                                 up_stride, n_ff, static_cast<T*>(out)));
}

void head_rms_norm(float* x, int64_t stride, int64_t n_rows, int64_t col0, int32_t n_heads, int32_t head_dim, float eps,
                   cudaStream_t stream) {
  if (n_rows <= 0 || n_heads <= 0) return;
  const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>(n_heads));
  launch_pdl(head_rms_norm_kernel, grid, head_dim >= 128 ? 64 : 32, 0, stream, x, stride, col0, head_dim, eps);
}

void shift_positions(const int32_t* pos, int64_t n, int32_t offset, int32_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(shift_positions_kernel, blocks_for(n, 256), 256, 0, stream, pos, n, offset, out);
}

void convert_f32_rows(const float* x, int64_t x_stride, int64_t rows, int64_t cols, DType out_dtype, void* out,
                      int64_t out_stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(blocks_for(cols, 256), static_cast<unsigned>(rows));
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(convert_rows_kernel<T>, grid, 256, 0, stream, x, x_stride, cols,
                                                 static_cast<T*>(out), out_stride));
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(softcap_kernel, blocks_for(n, 256), 256, 0, stream, x, n, cap);
}

void scale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(scale_kernel, blocks_for(n, 256), 256, 0, stream, x, n, s);
}

}  // namespace rill::cuda
