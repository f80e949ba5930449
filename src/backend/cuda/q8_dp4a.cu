// Q8_0 decode GEMV on int8 dot products (quant.h: q8_dp4a_gemv,
// repack_q8_0_rows; the arithmetic and work split: q8_dp4a_order.h).
//
// Why: the f32 GEMV (quant_gemv.cu) converts every weight and x value to
// f32 and spends an FMA per weight per token: 158 SASS instructions per
// 17 weight bytes at one token (9.3 a byte, past the ~7.9 a byte an H200
// issues at its copy bandwidth), 573 at 8. Here x is quantized once per
// matmul by quantize_x8 (the int8 path's x; llama.cpp's mmvq computes the
// same way) and a unit of 16 weights costs, per token, one 16-byte x load,
// 4 dp4a (4 multiply-adds each), one conversion, multiply and FMA: 109
// instructions per 68 weight bytes at one token from the GGUF blocks (77
// from packed rows), 435 (422) at 8 (sm_90 SASS of the loop bodies).
//
// Work: a block of kWarps warps; P = q8_dp4a_parts(n_cols) of them (a
// template argument: no division at run time) share a row group of kRows
// rows: one at one token, two at 2..8 (each x word loaded serves two rows:
// at 8 tokens x's bytes through L1 are otherwise 8 times the weights'). A
// warp step covers 32 consecutive units: 16 whole blocks of the row. The
// first group's weights are prefetched to L2 before the programmatic-launch
// wait.
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
// Blocks an SM must hold (one fewer at 8 tokens, whose accumulators
// spilled at 80): ptxas then keeps to 80 (96) registers and issues a
// lane's kUnroll units of loads before their first use. Without it, it
// chose 32-40 registers and interleaved each unit's loads with the
// previous unit's dots (one memory round trip per unit, seen in the SASS).
constexpr int kMinBlocks = 6;
constexpr int kQ8Bytes = 34;

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// A source's fetch issues a unit's loads into Raw as loaded; codes / scale
// decode them. Apart so that a lane's loads for kUnroll units all issue
// before the first use: joining 16-bit halves as they arrive made the
// compiler reuse the load registers, one round trip per word.
struct GgufBlocks {
  struct Raw {
    uint32_t d, half[8];
  };
  const uint8_t* row;
  __device__ static GgufBlocks at(const uint8_t* w, int64_t r, int64_t /*n_rows*/, int n_blocks) {
    return {w + r * static_cast<int64_t>(n_blocks) * kQ8Bytes};
  }
  // Unit (b, h): x's words are columns 8h .., 16 + 8h .., 8h + 4 ..,
  // 20 + 8h .. (q8_dp4a_order.h); code c sits at byte 2 + c.
  __device__ void fetch(int b, int h, Raw& r) const {
    const uint8_t* p = row + static_cast<int64_t>(b) * kQ8Bytes;
    const uint8_t* c = p + 2 + 8 * h;
    r.d = ld_u16(p);
    const int off[4] = {0, 16, 4, 20};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r.half[2 * k] = ld_u16(c + off[k]);
      r.half[2 * k + 1] = ld_u16(c + off[k] + 2);
    }
  }
  __device__ void prefetch(int b, int h) const {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + static_cast<int64_t>(b) * kQ8Bytes + 2 + 8 * h));
  }
  __device__ static uint4 codes(const Raw& r) {
    return make_uint4(r.half[0] | (r.half[1] << 16), r.half[2] | (r.half[3] << 16), r.half[4] | (r.half[5] << 16),
                      r.half[6] | (r.half[7] << 16));
  }
  __device__ static float scale(const Raw& r) {
    return half_bits(r.d);
  }
};

struct PackedRows {
  struct Raw {
    uint4 q;
    uint32_t d;
  };
  const uint8_t* row_codes;         // this row's n_cols codes, 16-byte aligned
  const unsigned short* row_scale;  // this row's n_blocks f16 scales
  __device__ static PackedRows at(const uint8_t* w, int64_t r, int64_t n_rows, int n_blocks) {
    const int64_t codes_bytes = n_rows * 32 * static_cast<int64_t>(n_blocks);
    return {w + r * 32 * static_cast<int64_t>(n_blocks),
            reinterpret_cast<const unsigned short*>(w + codes_bytes) + r * n_blocks};
  }
  __device__ void fetch(int b, int h, Raw& r) const {
    r.d = __ldg(row_scale + b);
    r.q = __ldg(reinterpret_cast<const uint4*>(row_codes + 32 * b + 16 * h));
  }
  __device__ void prefetch(int b, int h) const {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row_codes + 32 * b + 16 * h));
  }
  __device__ static uint4 codes(const Raw& r) { return r.q; }
  __device__ static float scale(const Raw& r) { return half_bits(r.d); }
};

__device__ __forceinline__ int dot16(uint4 w, uint4 x) {
  int s = __dp4a(static_cast<int>(w.x), static_cast<int>(x.x), 0);
  s = __dp4a(static_cast<int>(w.y), static_cast<int>(x.y), s);
  s = __dp4a(static_cast<int>(w.z), static_cast<int>(x.z), s);
  return __dp4a(static_cast<int>(w.w), static_cast<int>(x.w), s);
}

// kU units of a lane (blocks b, b + b_step, .., half h) into acc, in
// that order per (row, token): every weight load first, then per token
// the units' x loads, then their dots. No predicates: the caller passes
// whole groups (branches around loads made ptxas issue them one unit at a
// time).
template <class Src, int kMaxN, int kRows, int kU>
__device__ __forceinline__ void unit_group(const Src (&src)[kRows], int b, int b_step, int h,
                                           const int8_t* __restrict__ xq, const float2* __restrict__ xds, int n_tok,
                                           int n_blocks, float (&acc)[kRows][kMaxN]) {
  typename Src::Raw raw[kU][kRows];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) src[i].fetch(b + j * b_step, h, raw[j][i]);
  }
  uint4 q[kU][kRows];
  float dw[kU][kRows];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      q[j][i] = Src::codes(raw[j][i]);
      dw[j][i] = Src::scale(raw[j][i]);
    }
  }
  // Unit j's x codes and scales for token 0, stepped a token at a time
  // (one 64-bit add a pointer; offsets recomputed per token cost ~3x).
  const uint4* xp[kU];
  const float2* dp[kU];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    xp[j] = reinterpret_cast<const uint4*>(xq + (32 * (b + j * b_step) + 16 * h));
    dp[j] = xds + (b + j * b_step);
  }
  const int x_step = 2 * n_blocks;  // uint4s a token
#pragma unroll
  for (int t = 0; t < kMaxN; ++t) {
    if (t < n_tok) {
      uint4 xv[kU];
      float dx[kU];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        xv[j] = __ldg(xp[j]);
        dx[j] = dp[j]->x;
        xp[j] += x_step;
        dp[j] += n_blocks;
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const int isum = dot16(q[j][i], xv[j]);
          acc[i][t] = __fmaf_rn(dw[j][i], __fmul_rn(dx[j], static_cast<float>(isum)), acc[i][t]);
        }
      }
    }
  }
}

// y[t, r] (+)= W[r, :] . x[t, :] for n_tok <= kMaxN tokens; xq / xds as
// quantize_x8 wrote them for these n_tok tokens; kParts warps a row.
// Rows past n_rows read row n_rows - 1 and are not written.
//
// A lane's units are those of one half h = lane % 2 (the warp step, 32 kParts
// units, is even) in blocks b0, b0 + 16 kParts, ...; they go kUnroll at a
// time (unit_group), then the rest 2 and 1 at a time.
template <class Src, int kMaxN, int kRows, int kParts>
__global__ void __launch_bounds__(kWarps * 32, kMaxN == 1 ? kMinBlocks : kMinBlocks - 1)
    q8_dp4a_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                   int n_tok, int64_t n_rows, int64_t n_cols, float* __restrict__ y, int64_t y_stride,
                   bool accumulate) {
  constexpr int kUnroll = kMaxN == 1 ? 4 : 2;  // units in flight a lane (times kRows rows)
  constexpr int kBlockStep = 16 * kParts;
  __shared__ float red[kWarps][kRows][kMaxN];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % kParts;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / kParts) + warp / kParts) * kRows;
  const int n_blocks = static_cast<int>(n_cols / 32);
  const int h = lane & 1;
  const int b0 = (32 * part + lane) >> 1;
  const int n_mine = b0 < n_blocks ? (n_blocks - 1 - b0) / kBlockStep + 1 : 0;
  Src src[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) src[i] = Src::at(w, min(row0 + i, n_rows - 1), n_rows, n_blocks);
    // The first group's weights toward L2 while the kernel before (x's
    // quantization) finishes: weights are never written by a kernel.
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    if (j < n_mine) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) src[i].prefetch(b0 + j * kBlockStep, h);
    }
  }
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kRows][kMaxN];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int t = 0; t < kMaxN; ++t) acc[i][t] = 0.0f;
  }
  int k = 0;
  for (; k + kUnroll <= n_mine; k += kUnroll) {
    unit_group<Src, kMaxN, kRows, kUnroll>(src, b0 + k * kBlockStep, kBlockStep, h, xq, xds, n_tok, n_blocks, acc);
  }
  if (kUnroll > 2 && k + 2 <= n_mine) {
    unit_group<Src, kMaxN, kRows, 2>(src, b0 + k * kBlockStep, kBlockStep, h, xq, xds, n_tok, n_blocks, acc);
    k += 2;
  }
  if (k < n_mine) {
    unit_group<Src, kMaxN, kRows, 1>(src, b0 + k * kBlockStep, kBlockStep, h, xq, xds, n_tok, n_blocks, acc);
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
  for (int o = lane; o < kRows * n_tok; o += 32) {
    const int i = o / n_tok, t = o % n_tok;
    const int64_t row = row0 + i;
    if (row >= n_rows) continue;
    float s = red[warp][i][t];
#pragma unroll
    for (int p = 1; p < kParts; ++p) s = __fadd_rn(s, red[warp + p][i][t]);
    float* out = y + t * y_stride + row;
    *out = accumulate ? __fadd_rn(*out, s) : s;
  }
}

template <class Src, int kMaxN, int kRows, int kParts>
void launch_parts(const uint8_t* w, const int8_t* q, const float2* ds, int n, int64_t n_rows, int64_t n_cols, float* y,
                  int64_t y_stride, bool accumulate, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = static_cast<int64_t>(kRows) * (kWarps / kParts);
  const auto blocks = static_cast<unsigned>((n_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  launch_pdl(q8_dp4a_kernel<Src, kMaxN, kRows, kParts>, blocks, kWarps * 32, 0, stream, w, q, ds, n, n_rows, n_cols, y,
             y_stride, accumulate);
}

template <class Src, int kMaxN, int kRows>
void launch_rows(const uint8_t* w, const int8_t* q, const float2* ds, int n, int64_t n_rows, int64_t n_cols, float* y,
                 int64_t y_stride, bool accumulate, cudaStream_t stream) {
  switch (q8_dp4a_parts(n_cols)) {
    case 4:
      launch_parts<Src, kMaxN, kRows, 4>(w, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case 2:
      launch_parts<Src, kMaxN, kRows, 2>(w, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    default:
      launch_parts<Src, kMaxN, kRows, 1>(w, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
  }
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
