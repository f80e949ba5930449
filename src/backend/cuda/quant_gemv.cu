// Decode GEMV over quantized weights: y[t, r] (+)= W[r, :] . x[t, :] read
// straight from the GGUF blocks (quant_blocks.cuh), up to 8 tokens per
// launch, f32 accumulation.
//
// Work: one warp per row (kSplit warps for long rows); lane l takes items
// l, l + 32, ... of its range in ascending order (an item = 8 weights, see
// quant_blocks.cuh), so a warp step reads 32 consecutive items: 128
// contiguous quant bytes of a K-quant super-block, or 8 whole classic
// blocks. Each token's sum goes item by item, then the warp's xor tree,
// then (split rows) the warps' partial sums in part order: the order of a
// row is fixed by n_cols alone, so a token's result does not depend on the
// other tokens of the launch or on their number (batch invariance).
// Memory bound like the float GEMV: the quant bytes are read once; x rows
// come through L1/L2.
#include <cassert>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_blocks.cuh"

namespace rill::cuda {
namespace {

constexpr int kWarps = 4;             // per block
constexpr int kSplit = 4;             // warps per row for long rows
constexpr int kSplitMinItems = 1024;  // rows of >= 8,192 elements: 32 items per lane or more

__device__ __forceinline__ void load4(const float* p, float* v) {
  const float4 u = *reinterpret_cast<const float4*>(p);
  v[0] = u.x;
  v[1] = u.y;
  v[2] = u.z;
  v[3] = u.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float* v) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}

// n_tok <= kMaxN tokens; n_split warps per row (1 or kSplit).
template <class Q, typename T, int kMaxN>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_kernel(const uint8_t* __restrict__ w, const T* __restrict__ x, int n_tok, int64_t n_rows, int64_t n_cols,
                      int n_split, float* __restrict__ y, int64_t y_stride, bool accumulate) {
  __shared__ float red[kWarps][kMaxN];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarps / n_split) + warp / n_split;
  const int part = warp % n_split;
  const int n_blocks = static_cast<int>(n_cols / Q::kElems);
  const int n_items = n_blocks * Q::kItems;
  const int per = (n_items + n_split - 1) / n_split;
  const int end = min(n_items, (part + 1) * per);
  const uint8_t* wr = w + (row < n_rows ? row : n_rows - 1) * static_cast<int64_t>(n_blocks) * Q::kBytes;
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kMaxN];
#pragma unroll
  for (int t = 0; t < kMaxN; ++t) acc[t] = 0.0f;
#pragma unroll 2
  for (int it = part * per + lane; it < end; it += 32) {
    const int b = it / Q::kItems, k = it % Q::kItems;
    float wf[8];
    Q::decode(wr + static_cast<int64_t>(b) * Q::kBytes, k, wf);
    const int64_t c0 = static_cast<int64_t>(b) * Q::kElems + Q::col0(k);
    const int64_t c1 = static_cast<int64_t>(b) * Q::kElems + Q::col1(k);
#pragma unroll
    for (int t = 0; t < kMaxN; ++t) {
      if (t < n_tok) {
        float xa[4], xb[4];
        load4(x + t * n_cols + c0, xa);
        load4(x + t * n_cols + c1, xb);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t] = fmaf(wf[i], xa[i], acc[t]);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t] = fmaf(wf[4 + i], xb[i], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxN; ++t) {
    const float s = detail::warp_sum(acc[t]);
    if (lane == 0) red[warp][t] = s;
  }
  __syncthreads();
  if (part == 0 && lane < n_tok && row < n_rows) {
    float s = red[warp][lane];
    for (int p = 1; p < n_split; ++p) s += red[warp + p][lane];
    float* out = y + lane * y_stride + row;
    *out = accumulate ? *out + s : s;
  }
}

template <class Q, typename T>
void launch(const void* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
            cudaStream_t stream, int64_t y_stride) {
  const int64_t n_items = n_cols / Q::kElems * Q::kItems;
  const int n_split = n_items >= kSplitMinItems ? kSplit : 1;
  const int rows_per_block = kWarps / n_split;
  const auto blocks = static_cast<unsigned>((n_rows + rows_per_block - 1) / rows_per_block);
  const auto* wq = static_cast<const uint8_t*>(w);
  const auto* xt = static_cast<const T*>(x);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemvMaxTokens) {
    const int n = static_cast<int>(n_tokens - t0 < kGemvMaxTokens ? n_tokens - t0 : kGemvMaxTokens);
    if (n == 1) {
      launch_pdl(quant_gemv_kernel<Q, T, 1>, blocks, kWarps * 32, 0, stream, wq, xt + t0 * n_cols, n, n_rows, n_cols,
                 n_split, y + t0 * y_stride, y_stride, accumulate);
    } else {
      launch_pdl(quant_gemv_kernel<Q, T, kGemvMaxTokens>, blocks, kWarps * 32, 0, stream, wq, xt + t0 * n_cols, n,
                 n_rows, n_cols, n_split, y + t0 * y_stride, y_stride, accumulate);
    }
  }
}

}  // namespace

bool quant_supported(DType t) {
  if (t == kFp8Rows) return true;
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kMXFP4:
      return true;
    default:
      return false;
  }
}

void quant_gemv(DType w_dtype, const void* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows,
                int64_t n_cols, float* y, bool accumulate, cudaStream_t stream, int64_t y_stride) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (y_stride <= 0) y_stride = n_rows;
  if (w_dtype == kFp8Rows) {
    assert(y_stride == n_rows);  // fp8_gemv writes rows n_rows apart
    fp8_gemv(static_cast<const uint8_t*>(w), x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
    return;
  }
  if (x_dtype == DType::kF32) {
    RILL_CUDA_DISPATCH_QUANT(w_dtype,
                             launch<Q, float>(w, x, n_tokens, n_rows, n_cols, y, accumulate, stream, y_stride));
  } else {
    RILL_CUDA_DISPATCH_QUANT(w_dtype,
                             launch<Q, __nv_bfloat16>(w, x, n_tokens, n_rows, n_cols, y, accumulate, stream, y_stride));
  }
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
