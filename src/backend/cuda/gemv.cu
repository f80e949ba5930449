// Hand GEMV for decode: y[t, r] (+)= W[r, :] . x[t, :] for up to 8 tokens
// per launch, W and x in f32/f16/bf16. Memory bound: every weight byte is
// read once with 16-byte loads, one warp per row, four loads in flight per
// lane; x rows come through L1/L2. Accumulation is f32 in a fixed order per
// row, the same for every token count (batch invariant).
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 8;

// Streaming 16-byte load: weights are read once per step, keep them out of L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  return __ldcs(p);
}

// One warp per kRows rows (their loads interleaved), kUnroll 16-byte loads
// per row in flight per lane. Every row accumulates its vectors in the same
// ascending order whatever kRows, kUnroll and N are.
template <typename T, int N, int kRows, int kUnroll, int kBlockWarps>
__global__ void __launch_bounds__(kBlockWarps * 32)
    gemv_kernel(const T* __restrict__ w, const T* __restrict__ x, int64_t n_rows, int64_t n_cols, float* __restrict__ y,
                bool accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kBlockWarps + warp) * kRows;
  if (r0 >= n_rows) {
    detail::pdl_wait();
    return;
  }
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte vector
  const int64_t n_vec = n_cols / kVec;
  const uint4* wr[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int64_t r = r0 + k < n_rows ? r0 + k : n_rows - 1;  // a short last warp re-reads a valid row
    wr[k] = reinterpret_cast<const uint4*>(w + r * n_cols);
  }
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[kRows][N];
#pragma unroll
  for (int k = 0; k < kRows; ++k)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[k][t] = 0.0f;
  int64_t v = lane;
  // The first round of weight loads goes out before waiting for the kernel
  // that writes x (weights are never written): under programmatic launch it
  // overlaps that kernel's tail.
  uint4 wv[kRows][kUnroll];
  bool loaded = false;
  if (v + 32 * (kUnroll - 1) < n_vec) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kRows; ++k) wv[k][u] = load_stream(wr[k] + v + 32 * u);
    loaded = true;
  }
  detail::pdl_wait();
  detail::pdl_trigger();
  for (; v + 32 * (kUnroll - 1) < n_vec; v += 32 * kUnroll) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int k = 0; k < kRows; ++k) wv[k][u] = load_stream(wr[k] + v + 32 * u);
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float xf[8];
        unpack8(xv[t * n_vec + v + 32 * u], static_cast<const T*>(nullptr), xf);
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          float wf[8];
          unpack8(wv[k][u], static_cast<const T*>(nullptr), wf);
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[k][t] += wf[e] * xf[e];
        }
      }
    }
  }
  for (; v < n_vec; v += 32) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float xf[8];
      unpack8(xv[t * n_vec + v], static_cast<const T*>(nullptr), xf);
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        float wf[8];
        unpack8(load_stream(wr[k] + v), static_cast<const T*>(nullptr), wf);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[k][t] += wf[e] * xf[e];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float s = detail::warp_sum(acc[k][t]);
      if (lane == 0 && r0 + k < n_rows) {
        float* out = y + t * n_rows + r0 + k;
        *out = accumulate ? *out + s : s;
      }
    }
  }
}

// Long rows (>= kSplitMinVecs 16-byte vectors, e.g. the 14,336-wide
// down_proj): kSplit warps share a row, each streaming a contiguous quarter,
// and their sums meet in shared memory in a fixed order. One warp alone
// would walk its row in many dependent rounds and leave bandwidth unused.
constexpr int kSplit = 4, kSplitMinVecs = 1024;
template <typename T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_splitk_kernel(const T* __restrict__ w, const T* __restrict__ x, int64_t n_rows, int64_t n_cols,
                       float* __restrict__ y, bool accumulate) {
  __shared__ float red[kWarps][N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kWarps / kSplit) + warp / kSplit;
  const int part = warp % kSplit;
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n_vec = n_cols / kVec;
  const int64_t per = (n_vec + kSplit - 1) / kSplit;
  const int64_t v_end = min(n_vec, (part + 1) * per);
  const uint4* wr = reinterpret_cast<const uint4*>(w + (r < n_rows ? r : n_rows - 1) * n_cols);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.0f;
  int64_t v = part * per + lane;
  uint4 wv[4];
  bool loaded = false;
  if (v + 96 < v_end) {  // first round before the wait (see gemv_kernel)
#pragma unroll
    for (int u = 0; u < 4; ++u) wv[u] = load_stream(wr + v + 32 * u);
    loaded = true;
  }
  detail::pdl_wait();
  detail::pdl_trigger();
  for (; v + 96 < v_end; v += 128) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = load_stream(wr + v + 32 * u);
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float wf[8];
      unpack8(wv[u], static_cast<const T*>(nullptr), wf);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float xf[8];
        unpack8(xv[t * n_vec + v + 32 * u], static_cast<const T*>(nullptr), xf);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[t] += wf[e] * xf[e];
      }
    }
  }
  for (; v < v_end; v += 32) {
    float wf[8];
    unpack8(load_stream(wr + v), static_cast<const T*>(nullptr), wf);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float xf[8];
      unpack8(xv[t * n_vec + v], static_cast<const T*>(nullptr), xf);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[t] += wf[e] * xf[e];
    }
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float s = detail::warp_sum(acc[t]);
    if (lane == 0) red[warp][t] = s;
  }
  __syncthreads();
  if (part == 0 && lane < N && r < n_rows) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kSplit; ++k) s += red[warp + k][lane];
    float* out = y + lane * n_rows + r;
    *out = accumulate ? *out + s : s;
  }
}

// The configuration the model uses (see gemv_variant for the others timed).
constexpr int kRowsPerWarp = 1, kUnrollLoads = 4;

template <typename T, int N, int kRows = kRowsPerWarp, int kUnroll = kUnrollLoads, int kBlockWarps = kWarps>
void launch(const void* w, const void* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
            cudaStream_t stream) {
  if (kRows == kRowsPerWarp && kUnroll == kUnrollLoads && kBlockWarps == kWarps &&
      n_cols / (16 / static_cast<int64_t>(sizeof(T))) >= kSplitMinVecs) {
    const auto blocks = static_cast<unsigned>((n_rows + kWarps / kSplit - 1) / (kWarps / kSplit));
    launch_pdl(gemv_splitk_kernel<T, N>, blocks, kWarps * 32, 0, stream, static_cast<const T*>(w),
               static_cast<const T*>(x), n_rows, n_cols, y, accumulate);
    return;
  }
  const int64_t rows_per_block = int64_t{kBlockWarps} * kRows;
  const auto blocks = static_cast<unsigned>((n_rows + rows_per_block - 1) / rows_per_block);
  launch_pdl(gemv_kernel<T, N, kRows, kUnroll, kBlockWarps>, blocks, kBlockWarps * 32, 0, stream,
             static_cast<const T*>(w), static_cast<const T*>(x), n_rows, n_cols, y, accumulate);
}

template <typename T>
void dispatch(int64_t n_tokens, const void* w, const void* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
              cudaStream_t stream) {
  for (; n_tokens > kGemvMaxTokens; n_tokens -= kGemvMaxTokens) {  // groups of 8: rows' results do not change
    launch<T, kGemvMaxTokens>(w, x, n_rows, n_cols, y, accumulate, stream);
    x = static_cast<const T*>(x) + kGemvMaxTokens * n_cols;
    y += kGemvMaxTokens * n_rows;
  }
  switch (n_tokens) {
    case 1:
      launch<T, 1>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 2:
      launch<T, 2>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 3:
      launch<T, 3>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 4:
      launch<T, 4>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 5:
      launch<T, 5>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 6:
      launch<T, 6>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    case 7:
      launch<T, 7>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
    default:
      launch<T, 8>(w, x, n_rows, n_cols, y, accumulate, stream);
      break;
  }
}

}  // namespace

bool gemv_supported(DType w, int64_t n_cols) {
  return (w == DType::kF32 && n_cols % 4 == 0) || ((w == DType::kF16 || w == DType::kBF16) && n_cols % 8 == 0);
}

int gemv_n_variants() {
  return 7;
}

void gemv_variant(int variant, const void* w, const void* x, int64_t n_rows, int64_t n_cols, float* y,
                  cudaStream_t stream) {
  using T = __nv_bfloat16;
  switch (variant) {
    case 0:
      launch<T, 1, 1, 4, 8>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 1:
      launch<T, 1, 2, 4, 8>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 2:
      launch<T, 1, 1, 8, 8>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 3:
      launch<T, 1, 1, 4, 4>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 4:
      launch<T, 1, 4, 2, 4>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 5:
      launch<T, 1, 2, 8, 4>(w, x, n_rows, n_cols, y, false, stream);
      break;
    default:
      launch<T, 1>(w, x, n_rows, n_cols, y, false, stream);
      break;  // what gemv() runs (split-K for long rows)
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void gemv(DType w_dtype, const void* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
          bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (w_dtype == DType::kF32) {
    dispatch<float>(n_tokens, w, x, n_rows, n_cols, y, accumulate, stream);
  } else if (w_dtype == DType::kF16) {
    dispatch<__half>(n_tokens, w, x, n_rows, n_cols, y, accumulate, stream);
  } else {
    dispatch<__nv_bfloat16>(n_tokens, w, x, n_rows, n_cols, y, accumulate, stream);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
