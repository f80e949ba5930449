// The batch-invariant GEMM (gemm.h's gemm_invariant): the dense form of
// moe.cu's expert mma kernel.
//
// y[t, r] (+)= sum_c W[r, c] x[t, c], W [rows, cols] and x [n, cols] in
// bf16/f16, y f32. A block owns 16 weight rows and up to kTiles * 8 tokens
// (grid: row blocks x token blocks). Its 8 warps split the 64-column chunks
// of a row into 8 fixed ranges (a function of cols alone); each warp runs
// mma.m16n8k16 (f32 accumulation) over its chunks in increasing order, and
// warp j's partial sums are added in warp order through shared memory.
// An mma output element reads only its own weight row and token column, so
// every output is the same sequence of operations on the same values
// whatever n is and wherever the token sits in the batch: the result for
// (row, token) depends on that row and that token's activations alone.
//
// Fragments come straight from global memory: lane (g = lane / 4,
// c = lane % 4) loads 32 bytes of weight rows g and g + 8 and of token g of
// each 8-token tile, at columns 16c .. 16c + 15 of the chunk; the chunk's
// four k16 steps use one permutation of k for A and B (a dot product does
// not care which k goes where). A ragged last chunk (cols % 64 != 0) reads
// zeros past cols, which add exactly nothing.
#include <cassert>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 8, kTiles = 8, kRows = 16, kChunk = 64;

__device__ __forceinline__ uint4 load_or_zero(const uint4* p, int64_t v, int64_t n_vec) {
  return v < n_vec ? __ldg(p + v) : make_uint4(0, 0, 0, 0);
}

// R row groups of 16 rows per warp (R = 2 for long token counts: each token
// fragment then feeds two weight fragments). R and the token tiling change
// which outputs a block computes, never the order of any output's sum.
template <typename T, int R>
__global__ void __launch_bounds__(kWarps * 32)
    gemm_invariant_kernel(const T* __restrict__ w, const T* __restrict__ x, int64_t n, int64_t n_rows, int64_t n_cols,
                          float* __restrict__ y, bool accumulate) {
  __shared__ float4 red[kWarps][kTiles][32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (kRows * R);
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * (kTiles * 8);
  const int64_t cnt = min(static_cast<int64_t>(kTiles * 8), n - t0);
  const int tiles = static_cast<int>((cnt + 7) / 8);
  const uint4* wa[R];
  const uint4* wb[R];
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const int64_t rq = r0 + q * kRows;  // short last block: re-read the last row
    wa[q] = reinterpret_cast<const uint4*>(w + min(rq + g, n_rows - 1) * n_cols);
    wb[q] = reinterpret_cast<const uint4*>(w + min(rq + g + 8, n_rows - 1) * n_cols);
  }
  const int64_t n_vec = n_cols / 8;  // 16-byte vectors of a row
  const int64_t n_chunks = (n_cols + kChunk - 1) / kChunk, per = (n_chunks + kWarps - 1) / kWarps;
  const int64_t k0 = min(n_chunks, warp * per), k1 = min(n_chunks, k0 + per);
  const uint4* xr[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int64_t i = j * 8 + g;
    xr[j] = reinterpret_cast<const uint4*>(x + (t0 + min(i, cnt - 1)) * n_cols);  // past cnt: not stored
  }
  float acc[R][kTiles][4];
#pragma unroll
  for (int q = 0; q < R; ++q) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) acc[q][j][0] = acc[q][j][1] = acc[q][j][2] = acc[q][j][3] = 0.0f;
  }
#pragma unroll 2
  for (int64_t ch = k0; ch < k1; ++ch) {
    const int64_t v = ch * 8 + 2 * c;
    uint4 A0[R], A1[R], B0[R], B1[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      A0[q] = load_or_zero(wa[q], v, n_vec), A1[q] = load_or_zero(wa[q], v + 1, n_vec);
      B0[q] = load_or_zero(wb[q], v, n_vec), B1[q] = load_or_zero(wb[q], v + 1, n_vec);
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j >= tiles) break;
      const uint4 X0 = load_or_zero(xr[j], v, n_vec), X1 = load_or_zero(xr[j], v + 1, n_vec);
#pragma unroll
      for (int q = 0; q < R; ++q) {
        mma_m16n8k16<T>(acc[q][j], A0[q].x, B0[q].x, A0[q].y, B0[q].y, X0.x, X0.y);
        mma_m16n8k16<T>(acc[q][j], A0[q].z, B0[q].z, A0[q].w, B0[q].w, X0.z, X0.w);
        mma_m16n8k16<T>(acc[q][j], A1[q].x, B1[q].x, A1[q].y, B1[q].y, X1.x, X1.y);
        mma_m16n8k16<T>(acc[q][j], A1[q].z, B1[q].z, A1[q].w, B1[q].w, X1.z, X1.w);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
    if (q > 0) __syncthreads();  // the previous group's sums are read
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j < tiles) red[warp][j][lane] = make_float4(acc[q][j][0], acc[q][j][1], acc[q][j][2], acc[q][j][3]);
    }
    __syncthreads();
    if (warp < tiles) {  // warp j sums tile j over the warps, in warp order
      float4 s = red[0][warp][lane];
      for (int k = 1; k < kWarps; ++k) {
        const float4 o = red[k][warp][lane];
        s.x += o.x;
        s.y += o.y;
        s.z += o.z;
        s.w += o.w;
      }
      // s: rows g and g + 8 of group q, tokens 2c and 2c + 1 of tile `warp`.
      const int64_t i = warp * 8 + 2 * c, rq = r0 + q * kRows;
      auto put = [&](int64_t ti, int64_t row, float v) {
        if (ti < cnt && row < n_rows) {
          float* o = y + (t0 + ti) * n_rows + row;
          *o = accumulate ? *o + v : v;
        }
      };
      put(i, rq + g, s.x);
      put(i + 1, rq + g, s.y);
      put(i, rq + g + 8, s.z);
      put(i + 1, rq + g + 8, s.w);
    }
  }
}

template <typename T>
void launch(const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y, bool accumulate,
            cudaStream_t stream) {
  // Up to one token block: one row group per warp (more blocks to stream
  // the weights at decode sizes); beyond: two.
  const bool two = n > kTiles * 8;
  const int64_t block_rows = kRows * (two ? 2 : 1);
  const dim3 grid(static_cast<unsigned>((rows + block_rows - 1) / block_rows),
                  static_cast<unsigned>((n + kTiles * 8 - 1) / (kTiles * 8)));
  const auto* wt = static_cast<const T*>(w);
  const auto* xt = static_cast<const T*>(x);
  if (two) {
    launch_pdl(gemm_invariant_kernel<T, 2>, grid, kWarps * 32, 0, stream, wt, xt, n, rows, cols, y, accumulate);
  } else {
    launch_pdl(gemm_invariant_kernel<T, 1>, grid, kWarps * 32, 0, stream, wt, xt, n, rows, cols, y, accumulate);
  }
}

}  // namespace

bool gemm_invariant_supported(DType dtype, int64_t n_cols) {
  return (dtype == DType::kF16 || dtype == DType::kBF16) && n_cols % 8 == 0;
}

void gemm_invariant(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate, cudaStream_t stream) {
  assert(gemm_invariant_supported(dtype, cols));
  if (n <= 0 || rows <= 0) return;
  if (dtype == DType::kF16) {
    launch<__half>(w, x, n, rows, cols, y, accumulate, stream);
  } else {
    launch<__nv_bfloat16>(w, x, n, rows, cols, y, accumulate, stream);
  }
}

}  // namespace rill::cuda
