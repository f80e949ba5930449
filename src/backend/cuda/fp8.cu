// FP8 (e4m3, row-scaled) weights: quantization at load, the decode GEMV
// and dequantization for the GEMM path (fp8.h says the layout).
//
// The GEMV (fp8_gemv16_kernel) follows gemv.cu: memory bound, every weight
// byte read once with 16-byte streaming loads, R rows per warp sharing each
// activation load, the first round issued before waiting for the kernel
// that writes x; e4m3 pairs convert to f16 pairs in hardware
// (cvt.rn.f16x2.e4m3x2, exact), then to f32. Measured on the H200
// (bench_fp8_kernels, docs/perf.md): at one token 4 rows x 2 loads per
// lane reads the 8B's matrices at 54-96% of copy bandwidth, from 43-66%
// for the earlier kernel (one warp per row, a ring of eight 8-byte loads:
// fp8_gemv_kernel, kept as a benchmark variant); what is left at one
// token is each launch's fixed ~3 us, and at eight tokens the f32 FMAs
// (12-29% of bandwidth), so more tokens go to the FP8 GEMM.
#include <cuda_fp8.h>

#include <cassert>
#include <type_traits>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/fp8_glu.cuh"
#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 8;

// The 16 e4m3 values of u as f32.
__device__ __forceinline__ void unpack16_e4m3(const uint4& u, float* f) {
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i] >> (16 * h));
      const __half2 v = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
      const float2 g = __half22float2(v);
      f[4 * i + 2 * h] = g.x;
      f[4 * i + 2 * h + 1] = g.y;
    }
  }
}

// The 8 e4m3 values of u as f32.
__device__ __forceinline__ void unpack8_e4m3(const uint2& u, float* f) {
  const uint32_t words[2] = {u.x, u.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i] >> (16 * h));
      const float2 g = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[4 * i + 2 * h] = g.x;
      f[4 * i + 2 * h + 1] = g.y;
    }
  }
}

// 8 bf16 activations of token row xt from column c, as f32.
__device__ __forceinline__ void load8(const __nv_bfloat16* xt, int64_t c, float* f) {
  unpack8(*reinterpret_cast<const uint4*>(xt + c), static_cast<const __nv_bfloat16*>(nullptr), f);
}

// One warp per row and part `part` of its columns (vectors of 8 values):
// n_split warps of a block share a row, each walking vectors
// [part * per, (part + 1) * per), lane l every 32nd from part * per + l,
// with a ring of kRing 8-byte loads in flight per lane (q[i] holds vector
// v + 32 i; each round consumes q[0] and loads v + 32 kRing, so the loop
// body is one vector's work); the parts' sums meet in shared memory in part
// order. n_split depends on the shape alone, so a row's order of additions
// is the same for every token count (batch invariance). Per lane and
// token a round reads 16 bytes of x for 8 bytes of weights, as the bf16
// GEMV does for 16.
template <typename T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_gemv_kernel(const uint8_t* __restrict__ w, const T* __restrict__ x, int64_t n_rows, int64_t n_cols, int n_split,
                    float* __restrict__ y, bool accumulate) {
  constexpr int kRing = 8;
  __shared__ float red[kWarps][N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarps / n_split) + warp / n_split;
  const int part = warp % n_split;
  const int64_t n_vec = n_cols / 8;
  const int64_t per = (n_vec + n_split - 1) / n_split;
  const int64_t v_end = min(n_vec, (part + 1) * per);
  const uint8_t* wr = w + (row < n_rows ? row : n_rows - 1) * (kFp8RowHeader + n_cols);
  const uint2* wv = reinterpret_cast<const uint2*>(wr + kFp8RowHeader);
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.0f;
  int64_t v = part * per + lane;
  uint2 q[kRing];
#pragma unroll
  for (int i = 0; i < kRing; ++i)  // weights are never written: load before the wait
    q[i] = v + 32 * i < v_end ? __ldcs(wv + v + 32 * i) : uint2{};
  const float scale = *reinterpret_cast<const float*>(wr);
  detail::pdl_wait();
  detail::pdl_trigger();
  for (; v < v_end; v += 32) {
    float wf[8];
    unpack8_e4m3(q[0], wf);
#pragma unroll
    for (int i = 0; i + 1 < kRing; ++i) q[i] = q[i + 1];
    const int64_t next = v + 32 * kRing;
    q[kRing - 1] = next < v_end ? __ldcs(wv + next) : uint2{};
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float xf[8];
      load8(x + t * n_cols, v * 8, xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[t] = fmaf(wf[e], xf[e], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float s = detail::warp_sum(acc[t]);
    if (lane == 0) red[warp][t] = s;
  }
  __syncthreads();
  if (part == 0 && lane < N && row < n_rows) {
    float s = red[warp][lane];
    for (int p = 1; p < n_split; ++p) s += red[warp + p][lane];
    s *= scale;
    float* out = y + lane * n_rows + row;
    *out = accumulate ? *out + s : s;
  }
}

// Warps per row for the ring kernel: enough warps to fill the device
// (about 4,096), at least 64 vectors a part, at most the block's 8 warps.
int ring_split_for(int64_t n_rows, int64_t n_cols) {
  const int64_t n_vec = n_cols / 8;
  int n_split = 1;
  while (n_split < kWarps && n_rows * n_split < 4096 && n_vec / (2 * n_split) >= 64) n_split *= 2;
  return n_split;
}

template <typename T, int N>
void launch_ring(const uint8_t* w, const T* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                 cudaStream_t stream) {
  const int n_split = ring_split_for(n_rows, n_cols);
  const int64_t rows_per_block = kWarps / n_split;
  const auto blocks = static_cast<unsigned>((n_rows + rows_per_block - 1) / rows_per_block);
  launch_pdl(fp8_gemv_kernel<T, N>, blocks, kWarps * 32, 0, stream, w, x, n_rows, n_cols, n_split, y, accumulate);
}

// Weights: 16-byte streaming loads (read once per step, kept out of L1).
__device__ __forceinline__ uint4 load_w(const uint4* p) {
  return __ldcs(p);
}

// 16 activations of token row xt from column c as f32 (read-only path: the
// same x serves every row of the block).
__device__ __forceinline__ void load16(const __nv_bfloat16* xt, int64_t c, float* f) {
  const uint4* p = reinterpret_cast<const uint4*>(xt + c);
  unpack8(__ldg(p), static_cast<const __nv_bfloat16*>(nullptr), f);
  unpack8(__ldg(p + 1), static_cast<const __nv_bfloat16*>(nullptr), f + 8);
}
__device__ __forceinline__ void load16(const float* xt, int64_t c, float* f) {
  const uint4* p = reinterpret_cast<const uint4*>(xt + c);
#pragma unroll
  for (int i = 0; i < 4; ++i) unpack8(__ldg(p + i), static_cast<const float*>(nullptr), f + 4 * i);
}

// The 16-byte GEMV. A block takes groups of kWarps / n_split row groups
// (group g: rows from g * rows_per_block), blockIdx.x, then every gridDim.x-th
// (a grid smaller than n_groups stays resident and leaves room on each SM
// for the next kernel's blocks to start early); a warp takes R consecutive
// rows and part `part` of their 16-byte vectors (n_split warps share the
// rows); a round is U vectors per row and lane, lane l taking vectors
// base + l + 32 u, so lane l walks l, l + 32, l + 64, ... of its part in
// ascending order whatever R, U and the grid are. x is read once per round
// for all R rows. A part's sums meet in shared memory in part order, then
// the row's scale: n_split depends on the shape alone (split16_for), so a
// row's result for a token is the same bits for every token count and
// every (R, U, grid). The next group's first round is loaded before the
// block's barrier.
template <typename T, int N, int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_gemv16_kernel(const uint8_t* __restrict__ w, const T* __restrict__ x, int64_t n_rows, int64_t n_cols,
                      int n_split, int64_t n_groups, float* __restrict__ y, bool accumulate) {
  __shared__ float red[kWarps][R][N];
  constexpr int kRound = 32 * U;  // vectors per round of a warp
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % n_split;
  const int64_t n_vec = n_cols / 16;
  const int64_t per = ((n_vec + n_split - 1) / n_split + 31) / 32 * 32;
  const int64_t v0 = min(n_vec, part * per), v_end = min(n_vec, v0 + per);
  const int64_t ld = kFp8RowHeader + n_cols;
  const uint4* wr[R];
  float scale[R];
  int64_t row0 = 0;
  auto setup = [&](int64_t g) {
    row0 = (g * (kWarps / n_split) + warp / n_split) * R;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t r = row0 + k < n_rows ? row0 + k : n_rows - 1;  // a short last group re-reads a valid row
      wr[k] = reinterpret_cast<const uint4*>(w + r * ld + kFp8RowHeader);
      scale[k] = *reinterpret_cast<const float*>(w + r * ld);
    }
  };
  uint4 q[R][U];
  auto load_round = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + lane + 32 * u;
#pragma unroll
      for (int k = 0; k < R; ++k) q[k][u] = i < v_end ? load_w(wr[k] + i) : uint4{};
    }
  };
  int64_t g = blockIdx.x;
  setup(g);
  load_round(v0);  // weights are never written: the first round goes out before the wait
  detail::pdl_wait();
  detail::pdl_trigger();
  for (;;) {
    float acc[R][N];
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
      for (int t = 0; t < N; ++t) acc[k][t] = 0.0f;
    for (int64_t v = v0; v < v_end; v += kRound) {
      if (v != v0) load_round(v);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = v + lane + 32 * u;
        if (i < v_end) {
          float wf[R][16];
#pragma unroll
          for (int k = 0; k < R; ++k) unpack16_e4m3(q[k][u], wf[k]);
#pragma unroll
          for (int t = 0; t < N; ++t) {
            float xf[16];
            load16(x + t * n_cols, i * 16, xf);
#pragma unroll
            for (int k = 0; k < R; ++k)
#pragma unroll
              for (int e = 0; e < 16; ++e) acc[k][t] = fmaf(wf[k][e], xf[e], acc[k][t]);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const float s = detail::warp_sum(acc[k][t]);
        if (lane == 0) red[warp][k][t] = s;
      }
    }
    __syncthreads();
    static_assert(R * N <= 32, "one lane per (row, token) result");
    if (part == 0) {
#pragma unroll
      for (int k = 0; k < R; ++k) {
#pragma unroll
        for (int t = 0; t < N; ++t) {
          if (lane == k * N + t && row0 + k < n_rows) {
            float s = red[warp][k][t];
            for (int p = 1; p < n_split; ++p) s += red[warp + p][k][t];
            s = __fmul_rn(s, scale[k]);  // not contracted into the accumulation below
            float* out = y + t * n_rows + row0 + k;
            *out = accumulate ? *out + s : s;
          }
        }
      }
    }
    g += gridDim.x;
    if (g >= n_groups) break;
    setup(g);
    load_round(v0);
    __syncthreads();  // red is read above before the next group writes it
  }
}

// Warps per row group of the 16-byte GEMV, from the shape alone (batch
// invariance): split a row's vectors while the device has fewer than
// 8,192 row-warps and each part keeps 128+ vectors (4+ per lane).
int split16_for(int64_t n_rows, int64_t n_cols) {
  const int64_t n_vec = n_cols / 16;
  int n_split = 1;
  while (n_split < kWarps && n_rows * n_split < 8192 && n_vec / (2 * n_split) >= 128) n_split *= 2;
  return n_split;
}

// per_sm > 0: a grid of at most per_sm blocks per SM, each looping over
// groups; else one block per group.
template <typename T, int N, int R, int U>
void launch16(const uint8_t* w, const T* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate, int per_sm,
              cudaStream_t stream) {
  const int n_split = split16_for(n_rows, n_cols);
  const int64_t rows_per_block = int64_t{kWarps / n_split} * R;
  const int64_t n_groups = (n_rows + rows_per_block - 1) / rows_per_block;
  const int64_t cap = per_sm > 0 ? int64_t{per_sm} * sm_count() : n_groups;
  const auto blocks = static_cast<unsigned>(n_groups < cap ? n_groups : cap);
  launch_pdl(fp8_gemv16_kernel<T, N, R, U>, blocks, kWarps * 32, 0, stream, w, x, n_rows, n_cols, n_split, n_groups, y,
             accumulate);
}

// The configuration fp8_gemv runs (fp8_gemv_variant times others): four
// rows per warp, two loads each, one block per group (the best sum over
// the 8B's shapes of the configurations first timed, docs/perf.md).
constexpr int kRowsPerWarp = 4, kLoads = 2, kBlocksPerSm = 0;

template <typename T, int N>
void launch_n(const uint8_t* w, const T* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
              cudaStream_t stream) {
  // R * N results per warp go out one per lane
  constexpr int kR = kRowsPerWarp * N <= 32 ? kRowsPerWarp : 32 / N;
  launch16<T, N, kR, kLoads>(w, x, n_rows, n_cols, y, accumulate, kBlocksPerSm, stream);
}

template <typename T>
void launch_gemv(const uint8_t* w, const T* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
                 bool accumulate, cudaStream_t stream) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemvMaxTokens) {
    const int n = static_cast<int>(n_tokens - t0 < kGemvMaxTokens ? n_tokens - t0 : kGemvMaxTokens);
    const T* xt = x + t0 * n_cols;
    float* yt = y + t0 * n_rows;
    switch (n) {
      case 1:
        launch_n<T, 1>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 2:
        launch_n<T, 2>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 3:
        launch_n<T, 3>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 4:
        launch_n<T, 4>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 5:
        launch_n<T, 5>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 6:
        launch_n<T, 6>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      case 7:
        launch_n<T, 7>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
      default:
        launch_n<T, 8>(w, xt, n_rows, n_cols, yt, accumulate, stream);
        break;
    }
  }
}

// One block per row: the row's max |value|, then every value scaled and
// rounded; `header`: FP8 weight rows (a 16-byte header and the scale in
// scales[r] too), else dense rows of n_cols (activations).
template <typename T>
__global__ void __launch_bounds__(256) quantize_kernel(const T* __restrict__ src, int64_t n_cols, bool header,
                                                       uint8_t* __restrict__ dst, float* __restrict__ scales) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.x;
  const T* s = src + r * n_cols;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) m = fmaxf(m, fabsf(detail::to_f32(s[c])));
  // block max: warp max, then over the warps
  m = detail::warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : 0.0f;
  m = detail::warp_max(m);
  const float scale = m > 0.0f ? m / kE4m3Max : 1.0f;
  const int64_t skip = header ? kFp8RowHeader : 0;
  uint8_t* d = dst + r * (skip + n_cols);
  if (header && threadIdx.x < kFp8RowHeader / 4) {
    reinterpret_cast<float*>(d)[threadIdx.x] = threadIdx.x == 0 ? scale : 0.0f;
  }
  if (threadIdx.x == 0) scales[r] = scale;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) {
    d[skip + c] = __nv_cvt_float_to_fp8(detail::to_f32(s[c]) / scale, __NV_SATFINITE, __NV_E4M3);
  }
}

// Activations (quantize_fp8_tokens): one block per token row, its 16-byte
// vectors read once into registers (kPer per thread), the row's max, then
// the same rounding as quantize_kernel from the registers. The two-pass
// quantize_kernel serves rows longer than 256 kPer vectors.
template <typename T, int kPer>
__global__ void __launch_bounds__(256)
    quantize_tokens_kernel(const T* __restrict__ x, int64_t n_cols, uint8_t* __restrict__ xq, float* __restrict__ xs) {
  constexpr int kElems = 16 / sizeof(T);
  __shared__ float red[8];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t r = blockIdx.x, n_vec = n_cols / kElems;
  const uint4* xv = reinterpret_cast<const uint4*>(x + r * n_cols);
  uint4 v[kPer];
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t j = threadIdx.x + 256 * i;
    v[i] = j < n_vec ? __ldg(xv + j) : uint4{};
    float f[8];
    unpack8(v[i], static_cast<const T*>(nullptr), f);
#pragma unroll
    for (int e = 0; e < kElems; ++e) m = fmaxf(m, fabsf(f[e]));
  }
  m = detail::warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) m = fmaxf(m, red[i]);
  const float scale = m > 0.0f ? m / kE4m3Max : 1.0f;
  if (threadIdx.x == 0) xs[r] = scale;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t j = threadIdx.x + 256 * i;
    if (j >= n_vec) break;
    float f[8];
    unpack8(v[i], static_cast<const T*>(nullptr), f);
    uint8_t q[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) q[e] = __nv_cvt_float_to_fp8(f[e] / scale, __NV_SATFINITE, __NV_E4M3);
    uint8_t* out = xq + r * n_cols + j * kElems;
    if constexpr (kElems == 8) {
      *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(q);
    } else {
      *reinterpret_cast<uint32_t*>(out) = *reinterpret_cast<const uint32_t*>(q);
    }
  }
}

template <typename T>
void launch_quantize_tokens(const T* x, int64_t n, int64_t n_cols, uint8_t* xq, float* xs, cudaStream_t stream) {
  const int64_t per = (n_cols / (16 / static_cast<int64_t>(sizeof(T))) + 255) / 256;
  const auto blocks = static_cast<unsigned>(n);
  if (per <= 2) {
    launch_pdl(quantize_tokens_kernel<T, 2>, blocks, 256, 0, stream, x, n_cols, xq, xs);
  } else if (per <= 4) {
    launch_pdl(quantize_tokens_kernel<T, 4>, blocks, 256, 0, stream, x, n_cols, xq, xs);
  } else if (per <= 8) {
    launch_pdl(quantize_tokens_kernel<T, 8>, blocks, 256, 0, stream, x, n_cols, xq, xs);
  } else if (per <= 16) {
    launch_pdl(quantize_tokens_kernel<T, 16>, blocks, 256, 0, stream, x, n_cols, xq, xs);
  } else {
    launch_pdl(quantize_kernel<T>, blocks, 256, 0, stream, x, n_cols, false, xq, xs);
  }
}

template <typename Out>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, int64_t n_cols, int64_t row0, int64_t n_rows,
                               Out* __restrict__ out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t per_row = n_cols / 16, total = n_rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, v = i % per_row;
    const uint8_t* wr = w + (row0 + r) * (kFp8RowHeader + n_cols);
    const float scale = *reinterpret_cast<const float*>(wr);
    float f[16];
    unpack16_e4m3(reinterpret_cast<const uint4*>(wr + kFp8RowHeader)[v], f);
    Out* o = out + r * n_cols + v * 16;
#pragma unroll
    for (int e = 0; e < 16; ++e) o[e] = detail::from_f32<Out>(f[e] * scale);
  }
}

// fp8_scale_rows: blockIdx.y a token, x-blocks over its columns; kVec 4:
// float4 loads and stores (n_part, y_stride, col0 multiples of 4).
template <int kVec>
__global__ void scale_rows_kernel(const float* d, int64_t n_part, int64_t y_stride, int64_t col0,
                                  const float* __restrict__ xs, const float* __restrict__ ws, float* y,
                                  bool accumulate) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t t = blockIdx.y;
  const float st = xs[t];
  const float* dt = d + t * n_part;  // in place (d == y): y_stride == n_part, col0 == 0
  float* yt = y + t * y_stride + col0;
  const float* wt = ws + col0;
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < n_part;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    if constexpr (kVec == 4) {
      const float4 v = *reinterpret_cast<const float4*>(dt + j);
      const float4 s = *reinterpret_cast<const float4*>(wt + j);
      float4 o = {v.x * st * s.x, v.y * st * s.y, v.z * st * s.z, v.w * st * s.w};
      if (accumulate) {
        const float4 a = *reinterpret_cast<const float4*>(yt + j);
        o = {a.x + o.x, a.y + o.y, a.z + o.z, a.w + o.w};
      }
      *reinterpret_cast<float4*>(yt + j) = o;
    } else {
      const float v = dt[j] * st * wt[j];
      yt[j] = accumulate ? yt[j] + v : v;
    }
  }
}

// fp8_scale_rows_bf16: as scale_rows_kernel from bf16 d; kVec 8: one
// 16-byte load of d and two float4 stores per step (n_part a multiple of 8;
// y_stride and col0 of 4).
template <int kVec>
__global__ void scale_rows_bf16_kernel(const __nv_bfloat16* __restrict__ d, int64_t n_part, int64_t y_stride,
                                       int64_t col0, const float* __restrict__ xs, const float* __restrict__ ws,
                                       float* __restrict__ y, bool accumulate) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t t = blockIdx.y;
  const float st = xs[t];
  const __nv_bfloat16* dt = d + t * n_part;
  float* yt = y + t * y_stride + col0;
  const float* wt = ws + col0;
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < n_part;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    if constexpr (kVec == 8) {
      float v[8];
      unpack8(*reinterpret_cast<const uint4*>(dt + j), static_cast<const __nv_bfloat16*>(nullptr), v);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 s = *reinterpret_cast<const float4*>(wt + j + 4 * h);
        const float* u = v + 4 * h;
        float4 o = {u[0] * st * s.x, u[1] * st * s.y, u[2] * st * s.z, u[3] * st * s.w};
        if (accumulate) {
          const float4 a = *reinterpret_cast<const float4*>(yt + j + 4 * h);
          o = {a.x + o.x, a.y + o.y, a.z + o.z, a.w + o.w};
        }
        *reinterpret_cast<float4*>(yt + j + 4 * h) = o;
      }
    } else {
      const float v = __bfloat162float(dt[j]) * st * wt[j];
      yt[j] = accumulate ? yt[j] + v : v;
    }
  }
}

// fp8_scale_glu: the scale pass (scale_rows_kernel's products, in its
// order: d x xs[t] x ws[r]) of the gate and up halves, then the GLU
// (fp8_glu.cuh), so each output is the same bits as those three kernels give.
template <bool kGelu>
__device__ __forceinline__ float glu_times(float x, float u) {
  return detail::fp8_glu_times<kGelu>(x, u);
}

// blockIdx.y a token, x-blocks over its n_ff outputs; kVec 4: float4 loads
// of d's gate and up and of their scales, one 4-value store (n_ff a
// multiple of 4, d 16- and out 4 * sizeof(Out)-byte aligned).
template <typename Out, int kVec, bool kGelu>
__global__ void scale_glu_kernel(const float* __restrict__ d, int64_t n_ff, const float* __restrict__ xs,
                                 const float* __restrict__ ws, Out* __restrict__ out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t t = blockIdx.y;
  const float st = xs[t];
  const float* dt = d + t * 2 * n_ff;
  Out* ot = out + t * n_ff;
  for (int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < n_ff;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x * kVec) {
    if constexpr (kVec == 4) {
      const float4 g = *reinterpret_cast<const float4*>(dt + j), u = *reinterpret_cast<const float4*>(dt + n_ff + j);
      const float4 sg = *reinterpret_cast<const float4*>(ws + j), su = *reinterpret_cast<const float4*>(ws + n_ff + j);
      const float v[4] = {
          glu_times<kGelu>(g.x * st * sg.x, u.x * st * su.x), glu_times<kGelu>(g.y * st * sg.y, u.y * st * su.y),
          glu_times<kGelu>(g.z * st * sg.z, u.z * st * su.z), glu_times<kGelu>(g.w * st * sg.w, u.w * st * su.w)};
      if constexpr (std::is_same_v<Out, float>) {
        *reinterpret_cast<float4*>(ot + j) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        alignas(8) const Out e[4] = {detail::from_f32<Out>(v[0]), detail::from_f32<Out>(v[1]),
                                     detail::from_f32<Out>(v[2]), detail::from_f32<Out>(v[3])};
        *reinterpret_cast<uint2*>(ot + j) = *reinterpret_cast<const uint2*>(e);
      }
    } else {
      ot[j] = detail::from_f32<Out>(glu_times<kGelu>(dt[j] * st * ws[j], dt[n_ff + j] * st * ws[n_ff + j]));
    }
  }
}

unsigned grid_for(int64_t n_threads) {
  constexpr int64_t kMaxBlocks = 132 * 16;
  const int64_t b = (n_threads + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

}  // namespace

void quantize_fp8_rows(DType src_dtype, const void* src, int64_t n_rows, int64_t n_cols, uint8_t* dst, float* scales,
                       cudaStream_t stream) {
  assert(fp8_cols_ok(n_cols));
  if (n_rows <= 0) return;
  RILL_CUDA_DISPATCH_FLOAT(src_dtype, launch_pdl(quantize_kernel<T>, static_cast<unsigned>(n_rows), 256, 0, stream,
                                                 static_cast<const T*>(src), n_cols, true, dst, scales));
  RILL_CUDA_CHECK_LAUNCH();
}

void quantize_fp8_tokens(DType x_dtype, const void* x, int64_t n, int64_t n_cols, uint8_t* xq, float* xs,
                         cudaStream_t stream) {
  if (n <= 0) return;
  assert(fp8_cols_ok(n_cols));
  RILL_CUDA_DISPATCH_FLOAT(x_dtype, launch_quantize_tokens(static_cast<const T*>(x), n, n_cols, xq, xs, stream));
  RILL_CUDA_CHECK_LAUNCH();
}

int fp8_gemv_parts(int64_t n_rows, int64_t n_cols) {
  return split16_for(n_rows, n_cols);
}

void fp8_gemv(const uint8_t* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
              float* y, bool accumulate, cudaStream_t stream) {
  assert(fp8_cols_ok(n_cols) && (x_dtype == DType::kF32 || x_dtype == DType::kBF16));
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (fp8_gemv_stream_on() && n_tokens == 1) {  // the same bits; from 2 tokens its R = 1 costs more issue
    fp8_gemv_stream(w, x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
    return;
  }
  if (x_dtype == DType::kF32) {
    launch_gemv(w, static_cast<const float*>(x), n_tokens, n_rows, n_cols, y, accumulate, stream);
  } else {
    launch_gemv(w, static_cast<const __nv_bfloat16*>(x), n_tokens, n_rows, n_cols, y, accumulate, stream);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

int fp8_gemv_n_variants() {
  return 10;
}

const char* fp8_gemv_variant_name(int variant) {
  static const char* const kNames[] = {"ring8B",    "R4U2",      "R2U4",      "R1U4",      "R4U2 1/SM",
                                       "R4U2 2/SM", "R2U4 2/SM", "R2U4 3/SM", "R1U4 4/SM", "R1U8 2/SM"};
  return variant >= 0 && variant < fp8_gemv_n_variants() ? kNames[variant] : "fp8_gemv";
}

void fp8_gemv_variant(int variant, const uint8_t* w, const void* x_bf16, int64_t n_rows, int64_t n_cols, float* y,
                      cudaStream_t stream) {
  using T = __nv_bfloat16;
  const T* x = static_cast<const T*>(x_bf16);
  switch (variant) {
    case 0:
      launch_ring<T, 1>(w, x, n_rows, n_cols, y, false, stream);
      break;
    case 1:
      launch16<T, 1, 4, 2>(w, x, n_rows, n_cols, y, false, 0, stream);
      break;
    case 2:
      launch16<T, 1, 2, 4>(w, x, n_rows, n_cols, y, false, 0, stream);
      break;
    case 3:
      launch16<T, 1, 1, 4>(w, x, n_rows, n_cols, y, false, 0, stream);
      break;
    case 4:
      launch16<T, 1, 4, 2>(w, x, n_rows, n_cols, y, false, 1, stream);
      break;
    case 5:
      launch16<T, 1, 4, 2>(w, x, n_rows, n_cols, y, false, 2, stream);
      break;
    case 6:
      launch16<T, 1, 2, 4>(w, x, n_rows, n_cols, y, false, 2, stream);
      break;
    case 7:
      launch16<T, 1, 2, 4>(w, x, n_rows, n_cols, y, false, 3, stream);
      break;
    case 8:
      launch16<T, 1, 1, 4>(w, x, n_rows, n_cols, y, false, 4, stream);
      break;
    default:
      launch16<T, 1, 1, 8>(w, x, n_rows, n_cols, y, false, 2, stream);
      break;
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void fp8_scale_rows(const float* d, int64_t n, int64_t n_part, int64_t y_stride, int64_t col0, const float* xs,
                    const float* ws, float* y, bool accumulate, cudaStream_t stream) {
  if (n <= 0 || n_part <= 0) return;
  const bool vec4 = n_part % 4 == 0 && y_stride % 4 == 0 && col0 % 4 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(ws) % 16 == 0;
  const int64_t per_token = vec4 ? n_part / 4 : n_part;
  const int64_t want = (per_token + 255) / 256,
                cap = (int64_t{sm_count()} * 16 + n - 1) / n;  // about 16 blocks per SM in all
  const dim3 grid(static_cast<unsigned>(want < 1 ? 1 : want > cap ? cap : want), static_cast<unsigned>(n));
  if (vec4) {
    launch_pdl(scale_rows_kernel<4>, grid, 256, 0, stream, d, n_part, y_stride, col0, xs, ws, y, accumulate);
  } else {
    launch_pdl(scale_rows_kernel<1>, grid, 256, 0, stream, d, n_part, y_stride, col0, xs, ws, y, accumulate);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void fp8_scale_rows_bf16(const void* d, int64_t n, int64_t n_part, int64_t y_stride, int64_t col0, const float* xs,
                         const float* ws, float* y, bool accumulate, cudaStream_t stream) {
  if (n <= 0 || n_part <= 0) return;
  const auto* db = static_cast<const __nv_bfloat16*>(d);
  const bool vec8 = n_part % 8 == 0 && y_stride % 4 == 0 && col0 % 4 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(ws) % 16 == 0;
  const int64_t per_token = vec8 ? n_part / 8 : n_part;
  const int64_t want = (per_token + 255) / 256, cap = (int64_t{sm_count()} * 16 + n - 1) / n;
  const dim3 grid(static_cast<unsigned>(want < 1 ? 1 : want > cap ? cap : want), static_cast<unsigned>(n));
  if (vec8) {
    launch_pdl(scale_rows_bf16_kernel<8>, grid, 256, 0, stream, db, n_part, y_stride, col0, xs, ws, y, accumulate);
  } else {
    launch_pdl(scale_rows_bf16_kernel<1>, grid, 256, 0, stream, db, n_part, y_stride, col0, xs, ws, y, accumulate);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void fp8_scale_glu(const float* d, int64_t n, int64_t n_ff, const float* xs, const float* ws, bool gelu,
                   DType out_dtype, void* out, cudaStream_t stream) {
  if (n <= 0 || n_ff <= 0) return;
  const bool vec4 = n_ff % 4 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(ws) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % (4 * dtype_info(out_dtype).block_bytes) == 0;
  const int64_t per_token = vec4 ? n_ff / 4 : n_ff;
  const int64_t want = (per_token + 255) / 256, cap = (int64_t{sm_count()} * 16 + n - 1) / n;
  const dim3 grid(static_cast<unsigned>(want < 1 ? 1 : want > cap ? cap : want), static_cast<unsigned>(n));
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, {
    auto* o = static_cast<T*>(out);
    if (vec4) {
      if (gelu) {
        launch_pdl(scale_glu_kernel<T, 4, true>, grid, 256, 0, stream, d, n_ff, xs, ws, o);
      } else {
        launch_pdl(scale_glu_kernel<T, 4, false>, grid, 256, 0, stream, d, n_ff, xs, ws, o);
      }
    } else if (gelu) {
      launch_pdl(scale_glu_kernel<T, 1, true>, grid, 256, 0, stream, d, n_ff, xs, ws, o);
    } else {
      launch_pdl(scale_glu_kernel<T, 1, false>, grid, 256, 0, stream, d, n_ff, xs, ws, o);
    }
  });
  RILL_CUDA_CHECK_LAUNCH();
}

void dequantize_fp8_rows(const uint8_t* w, int64_t n_cols, int64_t row0, int64_t n_rows, DType out_dtype, void* out,
                         cudaStream_t stream) {
  assert(fp8_cols_ok(n_cols));
  if (n_rows <= 0) return;
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(dequant_kernel<T>, grid_for(n_rows * (n_cols / 16)), 256, 0, stream, w,
                                                 n_cols, row0, n_rows, static_cast<T*>(out)));
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
