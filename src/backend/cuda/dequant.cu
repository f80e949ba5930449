// Dequantization of GGUF blocks on the device: whole rows into a scratch
// matrix for the GEMM path, and the embedding gather.
//  - dequant_tiles_kernel (rows whose bytes start 16-byte aligned, output
//    too: every matrix the GEMM path dequantizes): the rows are one run of
//    blocks and the output one run of elements, cut into tiles of
//    kRunsPerThread * 256 runs of 8 elements; a block of 256 threads copies its
//    tile's block bytes into shared memory with 16-byte loads (before
//    waiting on its predecessor: weights are never written), then each
//    thread decodes runs tid, tid + 256, .. (Q::decode_run) and writes each
//    as one 16-byte store (f32: two), so a warp writes 512 contiguous bytes;
//  - dequant_kernel (the embedding gather, unaligned row ranges): one
//    thread per item (Q::decode), grid-stride; two runs of 4 outputs.
// Both compute each value as Q::decode does: the same bits.
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_blocks.cuh"

namespace rill::cuda {
namespace {

template <typename Out>
__device__ __forceinline__ void store4(Out* p, const float* v) {
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = detail::from_f32<Out>(v[i]);
}
template <>
__device__ __forceinline__ void store4<float>(float* p, const float* v) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
// 16-bit outputs as one 8-byte store (each value rounded on its own, as
// from_f32; p is 8-byte aligned: runs start at multiples of 4 elements).
template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* p, const float* v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) =
      make_uint2(*reinterpret_cast<const unsigned int*>(&a), *reinterpret_cast<const unsigned int*>(&b));
}
template <>
__device__ __forceinline__ void store4<__half>(__half* p, const float* v) {
  const __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) =
      make_uint2(*reinterpret_cast<const unsigned int*>(&a), *reinterpret_cast<const unsigned int*>(&b));
}

// 8 values at p (16-byte aligned), each rounded on its own to Out.
template <typename Out>
__device__ __forceinline__ void store8(Out* p, const float* v);
template <>
__device__ __forceinline__ void store8<float>(float* p, const float* v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename H2>
__device__ __forceinline__ unsigned int bits(H2 h) {
  return *reinterpret_cast<const unsigned int*>(&h);
}
template <>
__device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* p, const float* v) {
  *reinterpret_cast<uint4*>(p) =
      make_uint4(bits(__floats2bfloat162_rn(v[0], v[1])), bits(__floats2bfloat162_rn(v[2], v[3])),
                 bits(__floats2bfloat162_rn(v[4], v[5])), bits(__floats2bfloat162_rn(v[6], v[7])));
}
template <>
__device__ __forceinline__ void store8<__half>(__half* p, const float* v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(bits(__floats2half2_rn(v[0], v[1])), bits(__floats2half2_rn(v[2], v[3])),
                                            bits(__floats2half2_rn(v[4], v[5])), bits(__floats2half2_rn(v[6], v[7])));
}

constexpr int kTileThreads = 256;

// out[e] for the elements of blocks [0, n_blocks) at w (16-byte aligned,
// out too); tile blockIdx.x: kRunsPerThread * 256 runs of 8 elements.
template <class Q, typename Out, int kRunsPerThread>
__global__ void __launch_bounds__(kTileThreads)
    dequant_tiles_kernel(const uint8_t* __restrict__ w, int64_t n_blocks, Out* __restrict__ out) {
  constexpr int kRuns = Q::kElems / 8;  // per block
  constexpr int kTileBlocks = kTileThreads * kRunsPerThread / kRuns;
  constexpr int kTileBytes = kTileBlocks * Q::kBytes;
  static_assert(kTileBytes % 16 == 0, "tiles of whole 16-byte words");
  constexpr int kWords = kTileBytes / 16, kLoads = (kWords + kTileThreads - 1) / kTileThreads;
  __shared__ uint4 tile[kWords];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kTileBlocks;
  const int nb = static_cast<int>(n_blocks - b0 < kTileBlocks ? n_blocks - b0 : kTileBlocks);
  const int bytes = nb * Q::kBytes, words = bytes / 16;
  const uint8_t* src = w + b0 * Q::kBytes;
  uint4 r[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    if (tid + k * kTileThreads < words) r[k] = __ldg(reinterpret_cast<const uint4*>(src) + tid + k * kTileThreads);
  }
  if (tid < bytes - 16 * words) reinterpret_cast<uint8_t*>(tile)[16 * words + tid] = __ldg(src + 16 * words + tid);
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    if (tid + k * kTileThreads < words) tile[tid + k * kTileThreads] = r[k];
  }
  detail::pdl_wait();  // the scratch may still be read by the previous GEMM
  detail::pdl_trigger();
  __syncthreads();
  const auto* t8 = reinterpret_cast<const uint8_t*>(tile);
  Out* o = out + b0 * Q::kElems;
#pragma unroll
  for (int u = 0; u < kRunsPerThread; ++u) {
    const int run = tid + u * kTileThreads;
    if (run >= nb * kRuns) break;
    float v[8];
    Q::decode_run(t8 + (run / kRuns) * Q::kBytes, run % kRuns, v);
    store8(o + 8 * run, v);
  }
}

// out[r, :] = W[src row, :], src row = ids ? ids[r] : row0 + r.
template <class Q, typename Out>
__global__ void dequant_kernel(const uint8_t* __restrict__ w, const int32_t* __restrict__ ids, int64_t row0,
                               int64_t n_rows, int64_t n_cols, Out* __restrict__ out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t n_blocks = n_cols / Q::kElems;
  const int64_t items_per_row = n_blocks * Q::kItems;
  const int64_t total = n_rows * items_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / items_per_row, it = i % items_per_row;
    const int64_t b = it / Q::kItems;
    const int k = static_cast<int>(it % Q::kItems);
    const int64_t src = ids ? ids[r] : row0 + r;
    float v[8];
    Q::decode(w + (src * n_blocks + b) * Q::kBytes, k, v);
    Out* o = out + r * n_cols + b * Q::kElems;
    store4(o + Q::col0(k), v);
    store4(o + Q::col1(k), v + 4);
  }
}

unsigned grid_for(int64_t n_threads) {
  constexpr int64_t kMaxBlocks = 132 * 16;
  const int64_t b = (n_threads + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

// Runs of 8 elements per thread in dequant_tiles_kernel (1, 2 and 4
// measured: 4 the fastest, docs/perf.md).
constexpr int kTileRuns = 4;

// Whether dequant takes the tile kernel where it can; the environment's
// RILL_CUDA_DEQUANT_TILES=0 says no (the item kernel for every call: the
// comparison baseline of bench_cuda --quant-kernels).
bool tiles_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_CUDA_DEQUANT_TILES");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

template <typename Out>
void dequant(DType w_dtype, const void* w, const int32_t* ids, int64_t row0, int64_t n_rows, int64_t n_cols, Out* out,
             cudaStream_t stream) {
  const auto* wq = static_cast<const uint8_t*>(w);
  if (ids == nullptr && tiles_on()) {
    const uint8_t* base = wq + row0 * static_cast<int64_t>(row_bytes(w_dtype, n_cols));
    if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
      const int64_t n_blocks = n_rows * (n_cols / dtype_info(w_dtype).block_size);
      if (n_blocks == 0) return;  // (launch_pdl refuses an empty grid)
      RILL_CUDA_DISPATCH_QUANT(w_dtype, {
        constexpr int64_t kTileBlocks = kTileThreads * kTileRuns / (Q::kElems / 8);
        launch_pdl(dequant_tiles_kernel<Q, Out, kTileRuns>,
                   static_cast<unsigned>((n_blocks + kTileBlocks - 1) / kTileBlocks), kTileThreads, 0, stream, base,
                   n_blocks, out);
      });
      return;
    }
  }
  RILL_CUDA_DISPATCH_QUANT(w_dtype, launch_pdl(dequant_kernel<Q, Out>, grid_for(n_rows * (n_cols / 8)), 256, 0, stream,
                                               wq, ids, row0, n_rows, n_cols, out));
}

__global__ void add_columns_kernel(const float* __restrict__ part, int64_t n_tokens, int64_t n_part, float* y,
                                   int64_t y_stride, int64_t col0, bool accumulate) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_tokens * n_part;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / n_part, j = i % n_part;
    float* o = y + t * y_stride + col0 + j;
    *o = accumulate ? *o + part[i] : part[i];
  }
}

}  // namespace

void dequantize_rows(DType w_dtype, const void* w, int64_t n_cols, int64_t row0, int64_t n_rows, DType out_dtype,
                     void* out, cudaStream_t stream) {
  assert(quant_supported(w_dtype));
  if (n_rows <= 0) return;
  if (w_dtype == kFp8Rows) {
    dequantize_fp8_rows(static_cast<const uint8_t*>(w), n_cols, row0, n_rows, out_dtype, out, stream);
    return;
  }
  RILL_CUDA_DISPATCH_FLOAT(out_dtype,
                           dequant<T>(w_dtype, w, nullptr, row0, n_rows, n_cols, static_cast<T*>(out), stream));
  RILL_CUDA_CHECK_LAUNCH();
}

void embed_rows_any(DType table_dtype, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out,
                    cudaStream_t stream) {
  assert(table_dtype != kFp8Rows);  // FP8 placement keeps gathered tables in float
  if (!quant_supported(table_dtype)) {
    embed_rows(table_dtype, table, n_cols, ids, n_ids, out, stream);
    return;
  }
  if (n_ids <= 0) return;
  dequant<float>(table_dtype, table, ids, 0, n_ids, n_cols, out, stream);
  RILL_CUDA_CHECK_LAUNCH();
}

void add_columns(const float* part, int64_t n_tokens, int64_t n_part, float* y, int64_t y_stride, int64_t col0,
                 bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_part <= 0) return;
  launch_pdl(add_columns_kernel, grid_for(n_tokens * n_part), 256, 0, stream, part, n_tokens, n_part, y, y_stride, col0,
             accumulate);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
