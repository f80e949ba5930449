// Q8_0 decode GEMV on int8 dot products (quant.h: q8_dp4a_gemv,
// repack_q8_0_rows; the arithmetic and work split: q8_dp4a_order.h).
//
// Why: the f32 GEMV (quant_gemv.cu) spends per 8 weights 5 loads, 8
// integer-to-float conversions, 8 multiplies by the scale and, per token,
// 8 x conversions and 8 FMAs; here a unit of 16 weights costs, per token,
// one 16-byte x load and 4 dp4a (4 multiply-adds each) and one
// multiply + FMA, with x quantized once per step by quantize_x8 (the
// int8 path's x: llama.cpp's mmvq computes the same way).
//
// Work: a block of kWarps warps; P = q8_dp4a_parts(n_cols) of them share a
// row group of kRows rows (one row at one token; two at 2..8 tokens, so
// each x word loaded serves two rows: at 8 tokens x's bytes through L1
// are otherwise 8 times the weights'). A warp step covers 32 consecutive
// units: 16 whole blocks of the row.
//
// Weight sources:
//  - GgufBlocks: the GGUF blocks as placed (34 bytes, 2-byte aligned): a
//    unit's 16 codes as eight 16-bit loads (the int8 path's way) and the
//    scale as one;
//  - PackedRows (repack_q8_0_rows): the same bytes rearranged, codes of a
//    row contiguous and in x's fragment order, then every scale: a unit
//    is one 16-byte load. Benchmarks and tests only (nothing places
//    weights in it yet; see quant.h).
// Both give the same values in the same order: the same bits.
#include <algorithm>
#include <cassert>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/q8_dp4a_order.h"
#include "backend/cuda/quant.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 4;  // per block
constexpr int kQ8Bytes = 34;

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
// Two 16-bit loads as one little-endian word (p 2-byte aligned).
__device__ __forceinline__ uint32_t ld_w_a2(const uint8_t* p) {
  return ld_u16(p) | (ld_u16(p + 2) << 16);
}
__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

struct GgufBlocks {
  const uint8_t* row;
  __device__ static GgufBlocks at(const uint8_t* w, int64_t r, int64_t /*n_rows*/, int n_blocks) {
    return {w + r * static_cast<int64_t>(n_blocks) * kQ8Bytes};
  }
  // Unit (b, h): x's words are columns 8h .., 16 + 8h .., 8h + 4 ..,
  // 20 + 8h .. (q8_dp4a_order.h); code c sits at byte 2 + c.
  __device__ void load(int b, int h, uint4& q, float& d) const {
    const uint8_t* p = row + static_cast<int64_t>(b) * kQ8Bytes;
    d = half_bits(ld_u16(p));
    const uint8_t* c = p + 2 + 8 * h;
    q.x = ld_w_a2(c);
    q.y = ld_w_a2(c + 16);
    q.z = ld_w_a2(c + 4);
    q.w = ld_w_a2(c + 20);
  }
};

struct PackedRows {
  const uint8_t* codes;         // this row's n_cols codes, 16-byte aligned
  const unsigned short* scale;  // this row's n_blocks f16 scales
  __device__ static PackedRows at(const uint8_t* w, int64_t r, int64_t n_rows, int n_blocks) {
    const int64_t codes_bytes = n_rows * 32 * static_cast<int64_t>(n_blocks);
    return {w + r * 32 * static_cast<int64_t>(n_blocks),
            reinterpret_cast<const unsigned short*>(w + codes_bytes) + r * n_blocks};
  }
  __device__ void load(int b, int h, uint4& q, float& d) const {
    d = half_bits(__ldg(scale + b));
    q = __ldg(reinterpret_cast<const uint4*>(codes + 32 * b + 16 * h));
  }
};

__device__ __forceinline__ int dot16(uint4 w, uint4 x) {
  int s = __dp4a(static_cast<int>(w.x), static_cast<int>(x.x), 0);
  s = __dp4a(static_cast<int>(w.y), static_cast<int>(x.y), s);
  s = __dp4a(static_cast<int>(w.z), static_cast<int>(x.z), s);
  return __dp4a(static_cast<int>(w.w), static_cast<int>(x.w), s);
}

// y[t, r] (+)= W[r, :] . x[t, :] for n_tok <= kMaxN tokens; xq / xds as
// quantize_x8 wrote them for these n_tok tokens. Rows past n_rows read row
// n_rows - 1 and are not written.
template <class Src, int kMaxN, int kRows>
__global__ void __launch_bounds__(kWarps * 32)
    q8_dp4a_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                   int n_tok, int64_t n_rows, int64_t n_cols, int n_parts, float* __restrict__ y, int64_t y_stride,
                   bool accumulate) {
  __shared__ float red[kWarps][kRows][kMaxN];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % n_parts;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / n_parts) + warp / n_parts) * kRows;
  const int n_blocks = static_cast<int>(n_cols / 32);
  const int n_units = 2 * n_blocks;
  const int step = 32 * n_parts;
  Src src[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) src[i] = Src::at(w, min(row0 + i, n_rows - 1), n_rows, n_blocks);
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kRows][kMaxN];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int t = 0; t < kMaxN; ++t) acc[i][t] = 0.0f;
  }
#pragma unroll 2
  for (int u = 32 * part + lane; u < n_units; u += step) {
    const int b = u >> 1, h = u & 1;
    uint4 q[kRows];
    float dw[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) src[i].load(b, h, q[i], dw[i]);
#pragma unroll
    for (int t = 0; t < kMaxN; ++t) {
      if (t < n_tok) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xq + t * n_cols + 32 * static_cast<int64_t>(b) + 16 * h));
        const float dx = xds[static_cast<int64_t>(t) * n_blocks + b].x;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          acc[i][t] = __fmaf_rn(dw[i], __fmul_rn(dx, static_cast<float>(dot16(q[i], xv))), acc[i][t]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int t = 0; t < kMaxN; ++t) {
      float v = acc[i][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) red[warp][i][t] = v;
    }
  }
  __syncthreads();
  if (part != 0) return;
  for (int k = lane; k < kRows * n_tok; k += 32) {
    const int i = k / n_tok, t = k % n_tok;
    const int64_t row = row0 + i;
    if (row >= n_rows) continue;
    float s = red[warp][i][t];
    for (int p = 1; p < n_parts; ++p) s = __fadd_rn(s, red[warp + p][i][t]);
    float* out = y + t * y_stride + row;
    *out = accumulate ? __fadd_rn(*out, s) : s;
  }
}

template <class Src, int kMaxN, int kRows>
void launch_rows(const uint8_t* w, const int8_t* q, const float2* ds, int n, int64_t n_rows, int64_t n_cols, float* y,
                 int64_t y_stride, bool accumulate, cudaStream_t stream) {
  const int n_parts = q8_dp4a_parts(n_cols);
  const int64_t rows_per_block = static_cast<int64_t>(kRows) * (kWarps / n_parts);
  const auto blocks = static_cast<unsigned>((n_rows + rows_per_block - 1) / rows_per_block);
  launch_pdl(q8_dp4a_kernel<Src, kMaxN, kRows>, blocks, kWarps * 32, 0, stream, w, q, ds, n, n_rows, n_cols, n_parts, y,
             y_stride, accumulate);
}

template <class Src>
void launch(const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride,
            bool accumulate, cudaStream_t stream) {
  const auto* wq = static_cast<const uint8_t*>(w);
  const auto* q = static_cast<const int8_t*>(xq);
  const auto* ds = reinterpret_cast<const float2*>(q + n_tokens * n_cols);
  const int64_t n_blocks = n_cols / 32;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kQ8Dp4aMaxTokens) {
    const int n = static_cast<int>(std::min<int64_t>(n_tokens - t0, kQ8Dp4aMaxTokens));
    const int8_t* qt = q + t0 * n_cols;
    const float2* dt = ds + t0 * n_blocks;
    float* yt = y + t0 * y_stride;
    if (n == 1) {
      launch_rows<Src, 1, 1>(wq, qt, dt, n, n_rows, n_cols, yt, y_stride, accumulate, stream);
    } else {
      launch_rows<Src, kQ8Dp4aMaxTokens, 2>(wq, qt, dt, n, n_rows, n_cols, yt, y_stride, accumulate, stream);
    }
  }
}

// Column c's byte in x's fragment order (quant_mma.cu's x8_pos).
__device__ __forceinline__ int x8_pos(int c) {
  return 8 * ((c & 15) >> 2) + 4 * (c >> 4) + (c & 3);
}

// One thread per block: codes to codes[r, 32 b + x8_pos(c)], the scale to
// scales[r, b].
__global__ void repack_q8_0_kernel(const uint8_t* __restrict__ src, int64_t n_rows, int64_t n_blocks,
                                   uint8_t* __restrict__ dst) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n_rows * n_blocks) return;
  const uint8_t* b = src + k * kQ8Bytes;
  uint8_t* codes = dst + k * 32;
  for (int c = 0; c < 32; ++c) codes[x8_pos(c)] = b[2 + c];
  auto* scales = reinterpret_cast<unsigned short*>(dst + n_rows * n_blocks * 32);
  scales[k] = static_cast<unsigned short>(b[0] | (b[1] << 8));
}

}  // namespace

void q8_dp4a_gemv(Q8Layout layout, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                  float* y, int64_t y_stride, bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  assert(n_cols % 32 == 0);
  if (y_stride <= 0) y_stride = n_rows;
  if (layout == Q8Layout::kGguf) {
    launch<GgufBlocks>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
  } else {
    launch<PackedRows>(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate, stream);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

void repack_q8_0_rows(const void* src, int64_t n_rows, int64_t n_cols, void* dst, cudaStream_t stream) {
  const int64_t n = n_rows * (n_cols / 32);
  if (n <= 0) return;
  repack_q8_0_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const uint8_t*>(src), n_rows, n_cols / 32, static_cast<uint8_t*>(dst));
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
