#pragma once
// gemm_stream: y (+)= x W^T for decode batches (1..128 tokens) of 16-bit
// or FP8 weights, built for the weights' one pass through HBM. The bulk
// tensor copy engine (TMA) streams 128-row x 128-byte tiles of W, and the
// tokens' matching x tile, through a ring of shared-memory stages; two
// consumer warpgroups multiply them with wgmma (f32 accumulators), one
// producer warp keeps the ring full. A shape's columns may be split over a
// cluster of 1, 2, 4 or 8 blocks; the cluster adds the parts through
// distributed shared memory in split order, so a configuration gives the
// same bits run after run (but not across configurations or token counts:
// not batch invariant). Gemm times the 16-bit form beside cuBLASLt's
// candidates (gemm.h); fp8_route takes the FP8 form (fp8.h).
//
// Compiled for sm_90a only (wgmma): gemm_stream_available() says whether
// this device runs it (compute capability 9.0).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

// Most tokens a call takes; the token tile is the smallest of 16, 32, 64
// and 128 that holds them.
inline constexpr int64_t kGemmStreamMaxTokens = 128;
// The split counts a configuration may ask for (cluster sizes).
inline constexpr int kGemmStreamSplits[] = {1, 2, 4, 8};

struct GemmStreamArgs {
  DType dtype = DType::kBF16;  // W's and x's: F16 or BF16
  const void* w = nullptr;     // [rows, cols], rows contiguous
  const void* x = nullptr;     // [n, cols]
  int64_t n = 0, rows = 0, cols = 0;
  // Output [n, rows]: f32 (accumulate: y += x W^T) or, with narrow, the
  // weights' dtype (each f32 sum rounded once; accumulate must be false).
  void* y = nullptr;
  bool accumulate = false;
  bool narrow = false;
  int splits = 1;  // one of kGemmStreamSplits
  // 0: two blocks an SM, a 3-5 stage ring of 64-column stages; 1: one
  // block an SM, a ring twice as deep; 2: one block an SM, 128-column
  // stages. Variants 0 and 1 give the same bits; 2 too with one split (its
  // splits break the columns at 128-column chunks).
  int variant = 0;
  // e4m3: W in FP8 (w at row 0's first e4m3 value, rows w_ld bytes apart:
  // fp8.h's kFp8Rows past the row header), x e4m3 [n, cols] dense, and
  // y (+)= xs[t] ws[r] sum_c W[r, c] x[t, c] with ws [rows], xs [n] f32;
  // ws and xs both null: the unscaled sums. dtype is not read then. The
  // tensor cores add e4m3 products with their own (coarser than f32)
  // accumulation along K, as cuBLASLt's FP8 GEMM with fast accumulation.
  bool e4m3 = false;
  int64_t w_ld = 0;  // bytes between W's rows; 0: dense
  const float* ws = nullptr;
  const float* xs = nullptr;
  // W is not written by the kernels queued before this one (placed weights,
  // not a dequantization scratch): its first tiles may be fetched before
  // the programmatic-launch wait. False: after it, like everything else.
  bool w_stable = false;
};
inline constexpr int kGemmStreamVariants = 3;

// Whether this process's current device can run the kernel (sm_90 with
// the sm_90a build in this binary).
bool gemm_stream_available();

// Whether args describe a shape the kernel takes: F16/BF16 (or e4m3),
// 1..128 tokens, rows of whole 16 bytes (w_ld too) and at least one 128-byte
// chunk, w and x 16-byte aligned (y any: its stores are 16-byte ones where y
// allows), splits one of kGemmStreamSplits and no more than the 128-byte
// chunks of a row (256 bytes in variant 2), a variant; e4m3: not narrow, ws
// and xs both set or both null.
bool gemm_stream_supported(const GemmStreamArgs& args);

// Launches it on `stream` (programmatic dependent launch; with w_stable
// the weights' first tiles are fetched before the previous kernel
// finishes; a cluster only for more than one split; W copied evict-first
// and x evict-last in L2, or both evict-normal with RILL_GEMM_STREAM_L2=0,
// read once, for comparisons). False when !gemm_stream_supported(args), the device cannot
// run it, or the launch fails (its error cleared; inside a graph capture
// the capture is then invalid, and the caller's next call says so).
bool gemm_stream(const GemmStreamArgs& args, cudaStream_t stream);

}  // namespace rill::cuda
