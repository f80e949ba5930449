// Decode-sized matmuls over GGUF blocks on the int8 tensor cores (quant.h:
// quantize_x8, quant_mma).
//
// quantize_x8: one warp per 32 columns of one token; d = max |x| / 127,
// q = x / d rounded to nearest even (|q| <= 127), and d * sum(q) for the
// block types with a min term.
//
// quant_mma: a block of kSplit warps owns 16 rows; warp w takes the w-th
// of kSplit equal ranges of the row's units (a unit: kCols columns, whole
// 32-column blocks, quant_mma_units.cuh) and, per 32-column block, runs
// mma.m16n8k32 (m16n8k16 twice for Q6_K's 16-column scales) of the 16 rows'
// int8 weights with 8 tokens' int8 x per token tile: an exact int32 dot of
// 32 (16) products. Each (row, token) then takes, in block order,
//   acc = fma(d_w, d_x * dot, acc)  [and  acc = fma(-m_w, d_x * sum q_x, acc)]
// with every rounding explicit (__fmul_rn / __fmaf_rn: no contraction can
// differ between instantiations); the warps' partial sums are added in warp
// order. Nothing a (row, token) computes depends on the other tokens or on
// their number: batch invariant per row like quant_gemv. Every block
// re-reads all of x through L1, which made this kernel lose to dequantize
// + cuBLASLt past 16 tokens and, on tall matrices, to quant_mmq from 9:
// quant_mma hands quant_mmq_eligible calls to it (quant_mmq.cu), which
// computes the same sums in the same order.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_mma_units.cuh"

namespace rill::cuda {
namespace {

using namespace mma_units;

constexpr int kWarps = kSplit;  // per block: one range of the K split each
constexpr int kMaxTiles = kMmaMaxTokens / 8;

// ---------------------------------------------------------------- x to int8

template <typename T>
__global__ void quantize_x8_kernel(const T* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ q,
                                   float2* __restrict__ ds) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= n_blocks) return;
  const float v = detail::to_f32(x[b * 32 + lane]);
  const float amax = detail::warp_max(fabsf(v));
  const float d = __fdiv_rn(amax, 127.0f);
  const int qi = amax > 0.0f ? __float2int_rn(__fdiv_rn(v, d)) : 0;
  q[b * 32 + x8_pos(lane)] = static_cast<int8_t>(qi);
  int s = qi;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) ds[b] = make_float2(d, __fmul_rn(d, static_cast<float>(s)));
}

// y[t, row] (+)= sum_c W[row, c] x[t, c] over kTiles tiles of 8 tokens
// (tiles at or past n_tok are skipped; tokens past it read token n_tok - 1
// and are not written).
template <class Q, int kTiles>
__global__ void __launch_bounds__(kWarps * 32)
    quant_mma_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                     int n_tok, int64_t n_rows, int64_t n_cols, float* __restrict__ y, int64_t y_stride,
                     bool accumulate) {
  static_assert(!(Q::kHalves && Q::kMin), "a type with 16-column scales and a min term");
  __shared__ float red[kWarps][kTiles * 8][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t row_bytes = n_cols / Q::kElems * Q::kBytes;
  const uint8_t* wa = w + min(row0 + g, n_rows - 1) * row_bytes;
  const uint8_t* wb = w + min(row0 + g + 8, n_rows - 1) * row_bytes;
  const int n_units = static_cast<int>(n_cols / Q::kCols);
  const int per = (n_units + kWarps - 1) / kWarps;
  const int u_begin = warp * per, u_end = min(n_units, u_begin + per);
  const int64_t x_blocks = n_cols / 32;  // per token
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  typename Q::Raw ra, rb;  // rows g and g + 8
#pragma unroll Q::kUnroll
  for (int u = u_begin; u < u_end; ++u) {
    typename Q::Unit A, B;
    Q::template fetch<GlobalLoads>(wa, u, t, ra);
    Q::template fetch<GlobalLoads>(wb, u, t, rb);
    Q::decode(ra, A);
    Q::decode(rb, B);
#pragma unroll
    for (int blk = 0; blk < Q::kBlocks; ++blk) {
      const int64_t xb = static_cast<int64_t>(u) * Q::kBlocks + blk;
      // Every tile's x words and scales first (addresses clamped to valid
      // tokens), so their loads overlap; then the tiles' mma and scaling.
      int2 bx[kTiles];
      float2 dx0[kTiles], dx1[kTiles];
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        bx[j] = *reinterpret_cast<const int2*>(xq + min(j * 8 + g, n_tok - 1) * n_cols + xb * 32 + 8 * t);  // x8_pos
        dx0[j] = xds[min(j * 8 + 2 * t, n_tok - 1) * x_blocks + xb];
        dx1[j] = xds[min(j * 8 + 2 * t + 1, n_tok - 1) * x_blocks + xb];
      }
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        if (j * 8 >= n_tok) break;
        const int b0 = bx[j].x, b1 = bx[j].y;
        int c[4] = {0, 0, 0, 0};
        if constexpr (Q::kHalves) {
          int c1[4] = {0, 0, 0, 0};
          mma_k16(c, A.q[blk][0], B.q[blk][0], b0);
          mma_k16(c1, A.q[blk][1], B.q[blk][1], b1);
          // Each 16-column half with its own scale d * h (|dot| < 2^17: exact in f32).
          const float da0 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][0]));
          const float da1 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][1]));
          const float db0 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][0]));
          const float db1 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][1]));
          acc[j][0] = apply(apply(acc[j][0], da0, 0.0f, c[0], dx0[j], false), da1, 0.0f, c1[0], dx0[j], false);
          acc[j][1] = apply(apply(acc[j][1], da0, 0.0f, c[1], dx1[j], false), da1, 0.0f, c1[1], dx1[j], false);
          acc[j][2] = apply(apply(acc[j][2], db0, 0.0f, c[2], dx0[j], false), db1, 0.0f, c1[2], dx0[j], false);
          acc[j][3] = apply(apply(acc[j][3], db0, 0.0f, c[3], dx1[j], false), db1, 0.0f, c1[3], dx1[j], false);
        } else {
          mma_k32(c, A.q[blk][0], B.q[blk][0], A.q[blk][1], B.q[blk][1], b0, b1);
          float ma = 0.0f, mb = 0.0f;
          if constexpr (Q::kMin) {
            ma = A.m[blk];
            mb = B.m[blk];
          }
          acc[j][0] = apply(acc[j][0], A.d[blk], ma, c[0], dx0[j], Q::kMin);
          acc[j][1] = apply(acc[j][1], A.d[blk], ma, c[1], dx1[j], Q::kMin);
          acc[j][2] = apply(acc[j][2], B.d[blk], mb, c[2], dx0[j], Q::kMin);
          acc[j][3] = apply(acc[j][3], B.d[blk], mb, c[3], dx1[j], Q::kMin);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    red[warp][j * 8 + 2 * t][g] = acc[j][0];
    red[warp][j * 8 + 2 * t + 1][g] = acc[j][1];
    red[warp][j * 8 + 2 * t][g + 8] = acc[j][2];
    red[warp][j * 8 + 2 * t + 1][g + 8] = acc[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_tok * 16; i += kWarps * 32) {
    const int tok = i >> 4, r = i & 15;
    if (row0 + r >= n_rows) continue;
    float s = red[0][tok][r];
#pragma unroll
    for (int p = 1; p < kWarps; ++p) s = __fadd_rn(s, red[p][tok][r]);
    float* out = y + tok * y_stride + row0 + r;
    *out = accumulate ? __fadd_rn(*out, s) : s;
  }
}

template <class Q, int kTiles>
void launch_tiles(const uint8_t* w, const int8_t* xq, const float2* xds, int n_tok, int64_t n_rows, int64_t n_cols,
                  float* y, int64_t y_stride, bool accumulate, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((n_rows + 15) / 16);
  launch_pdl(quant_mma_kernel<Q, kTiles>, blocks, kWarps * 32, 0, stream, w, xq, xds, n_tok, n_rows, n_cols, y,
             y_stride, accumulate);
}

template <class Q>
void launch(const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride,
            bool accumulate, cudaStream_t stream) {
  const auto* wq = static_cast<const uint8_t*>(w);
  const auto* q = static_cast<const int8_t*>(xq);
  const auto* ds = reinterpret_cast<const float2*>(q + n_tokens * n_cols);
  const int n = static_cast<int>(n_tokens);
  // Tiles of 8 tokens: 1, 2, 4 or 8 of them (a tile past n_tok is skipped).
  if (n <= 8) {
    launch_tiles<Q, 1>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else if (n <= 16) {
    launch_tiles<Q, 2>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else if (n <= 32) {
    launch_tiles<Q, 4>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else {
    launch_tiles<Q, kMaxTiles>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
  }
}

}  // namespace

bool quant_mma_supported(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K;
}

size_t quantized_x_bytes(int64_t n_tokens, int64_t n_cols) {
  // int8 values, then a float2 (d, d sum q) per 32 columns.
  return static_cast<size_t>(n_tokens * n_cols) + static_cast<size_t>(n_tokens * (n_cols / 32)) * sizeof(float2);
}

void quantize_x8(DType x_dtype, const void* x, int64_t n_tokens, int64_t n_cols, void* xq, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const int64_t n_blocks = n_tokens * (n_cols / 32);
  auto* q = static_cast<int8_t*>(xq);
  auto* ds = reinterpret_cast<float2*>(q + n_tokens * n_cols);
  const auto grid = static_cast<unsigned>((n_blocks + 7) / 8);
  if (x_dtype == DType::kF32) {
    launch_pdl(quantize_x8_kernel<float>, grid, 256, 0, stream, static_cast<const float*>(x), n_blocks, q, ds);
  } else {
    launch_pdl(quantize_x8_kernel<__nv_bfloat16>, grid, 256, 0, stream, static_cast<const __nv_bfloat16*>(x), n_blocks,
               q, ds);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void quant_mma(DType w_dtype, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
               int64_t y_stride, bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (quant_mmq_eligible(w_dtype, w, n_tokens, n_rows, n_cols)) {
    quant_mmq(w_dtype, w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
    return;
  }
  switch (w_dtype) {
    case DType::kQ8_0:
      launch<MmaQ8_0>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case DType::kQ4_K:
      launch<MmaQ4_K>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case DType::kQ6_K:
      launch<MmaQ6_K>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    default:
      break;
  }
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
