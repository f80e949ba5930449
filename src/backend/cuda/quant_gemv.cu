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
//
// Q8_0 (34-byte blocks: at most 2-byte loads from global memory) takes
// q8_gemv_tiles_kernel where its ranges allow (q8_tiles_fit): the same
// work split and the same order (so the same bits as quant_gemv_kernel),
// but a warp copies its range's raw bytes into shared memory in chunks of
// 32 blocks (1,088 bytes) with 16-byte cp.async, up to kQ8Stages chunks in
// flight (a whole 4,096-column row at once), issued before the
// programmatic-launch wait; lanes then decode their items from shared
// memory with aligned 4-byte loads and read x's 8 columns of an item as one
// 16-byte load (bf16).
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <type_traits>

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

// 8 values of x at p: bf16 as one 16-byte load (p 16-byte aligned), f32
// as two.
__device__ __forceinline__ void load8(const float* p, float* v) {
  load4(p, v);
  load4(p + 4, v + 4);
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h[i]));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

constexpr int kQ8ChunkBlocks = 32;                                        // per cp.async chunk
constexpr int kQ8ChunkWords = kQ8ChunkBlocks * quant::Q8_0::kBytes / 16;  // 68 words of 16 bytes
constexpr int kQ8Stages = 4;                                              // chunks in flight per warp

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Item k of block b of a chunk in shared memory at t (16-byte aligned, one
// spare word after the chunk): the values Q8_0::decode gives (the same
// products), from 4-byte aligned loads: the 8 quant bytes start at an even
// offset o, so they are the 8 bytes of three words shifted by 0 or 16 bits.
__device__ __forceinline__ void q8_decode_shared(const uint8_t* t, int b, int k, float* wf) {
  const auto* tw = reinterpret_cast<const uint32_t*>(t);
  const int o = quant::Q8_0::kBytes * b + 2 + 8 * k, od = quant::Q8_0::kBytes * b;
  const int i = o >> 2;
  const uint32_t sh = (o & 2) * 8, a0 = tw[i], a1 = tw[i + 1], a2 = tw[i + 2];
  const uint32_t q0 = __funnelshift_r(a0, a1, sh) ^ 0x80808080u, q1 = __funnelshift_r(a1, a2, sh) ^ 0x80808080u;
  const float d =
      __half2float(__ushort_as_half(static_cast<unsigned short>((tw[od >> 2] >> ((od & 2) * 8)) & 0xffffu)));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wf[j] = quant::mul(quant::byte_f(q0, j, -128), d);
    wf[4 + j] = quant::mul(quant::byte_f(q1, j, -128), d);
  }
}

// quant_gemv_kernel for Q8_0 (its ranges, its order, its bits), the weights
// through shared memory. Needs (q8_tiles_fit): w and x 16-byte aligned,
// n_cols a multiple of 256 (rows of whole 16-byte words) and, for split
// rows, parts of a multiple of 32 items (each part starts at a word).
template <typename T, int kMaxN>
__global__ void __launch_bounds__(kWarps * 32)
    q8_gemv_tiles_kernel(const uint8_t* __restrict__ w, const T* __restrict__ x, int n_tok, int64_t n_rows,
                         int64_t n_cols, int n_split, float* __restrict__ y, int64_t y_stride, bool accumulate) {
  using Q = quant::Q8_0;
  __shared__ uint4 stage[kWarps][kQ8Stages][kQ8ChunkWords + 1];
  __shared__ float red[kWarps][kMaxN];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarps / n_split) + warp / n_split;
  const int part = warp % n_split;
  const int n_blocks = static_cast<int>(n_cols / Q::kElems);
  const int n_items = n_blocks * Q::kItems;
  const int per = (n_items + n_split - 1) / n_split;
  const int first = min(n_items, part * per), end = min(n_items, (part + 1) * per);
  const int blk0 = first / Q::kItems, n_blk = (end - first) / Q::kItems;
  const int n_chunks = (n_blk + kQ8ChunkBlocks - 1) / kQ8ChunkBlocks;
  const uint8_t* src = w + ((row < n_rows ? row : n_rows - 1) * static_cast<int64_t>(n_blocks) + blk0) * Q::kBytes;
  auto issue = [&](int c) {
    if (c < n_chunks) {
      const int words = min(kQ8ChunkBlocks, n_blk - c * kQ8ChunkBlocks) * Q::kBytes / 16;
      const auto* s = reinterpret_cast<const uint4*>(src) + c * kQ8ChunkWords;
      for (int i = lane; i < words; i += 32) cp_async16(&stage[warp][c % kQ8Stages][i], s + i);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int c = 0; c < kQ8Stages; ++c) issue(c);
  detail::pdl_wait();
  detail::pdl_trigger();
  float acc[kMaxN];
#pragma unroll
  for (int t = 0; t < kMaxN; ++t) acc[t] = 0.0f;
  for (int c = 0; c < n_chunks; ++c) {
    cp_async_wait<kQ8Stages - 1>();  // chunk c (this lane's copies)
    __syncwarp();                    // and the other lanes'
    const auto* t8 = reinterpret_cast<const uint8_t*>(stage[warp][c % kQ8Stages]);
    const int items = min(kQ8ChunkBlocks, n_blk - c * kQ8ChunkBlocks) * Q::kItems;
#pragma unroll
    for (int u = 0; u < kQ8ChunkBlocks * Q::kItems / 32; ++u) {
      const int it = lane + 32 * u;  // item first + 128 c + it: lane's order as quant_gemv_kernel's
      if (it < items) {
        const int b = it / Q::kItems, k = it % Q::kItems;
        float wf[8];
        q8_decode_shared(t8, b, k, wf);
        const int64_t c0 = static_cast<int64_t>(blk0 + c * kQ8ChunkBlocks + b) * Q::kElems + 8 * k;
#pragma unroll
        for (int t = 0; t < kMaxN; ++t) {
          if (t < n_tok) {
            float xv[8];
            load8(x + t * n_cols + c0, xv);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[t] = fmaf(wf[i], xv[i], acc[t]);
          }
        }
      }
    }
    __syncwarp();  // every lane is done with the buffer before it is refilled
    issue(c + kQ8Stages);
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

// Whether q8_gemv_tiles_kernel takes this Q8_0 call (see there); the
// environment's RILL_CUDA_Q8_GEMV_TILES=0 says never (quant_gemv_kernel
// for every call: the comparison baseline).
bool q8_tiles_fit(const void* w, const void* x, int64_t n_cols, int n_split) {
  static const bool on = [] {
    const char* e = std::getenv("RILL_CUDA_Q8_GEMV_TILES");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  const int64_t n_items = n_cols / quant::Q8_0::kElems * quant::Q8_0::kItems;
  const int64_t per = (n_items + n_split - 1) / n_split;
  return on && reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         n_cols % 256 == 0 && (n_split == 1 || per % 32 == 0);
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
    if constexpr (std::is_same_v<Q, quant::Q8_0>) {
      if (q8_tiles_fit(wq, xt + t0 * n_cols, n_cols, n_split)) {
        if (n == 1) {
          launch_pdl(q8_gemv_tiles_kernel<T, 1>, blocks, kWarps * 32, 0, stream, wq, xt + t0 * n_cols, n, n_rows,
                     n_cols, n_split, y + t0 * y_stride, y_stride, accumulate);
        } else {
          launch_pdl(q8_gemv_tiles_kernel<T, kGemvMaxTokens>, blocks, kWarps * 32, 0, stream, wq, xt + t0 * n_cols, n,
                     n_rows, n_cols, n_split, y + t0 * y_stride, y_stride, accumulate);
        }
        continue;
      }
    }
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
