#pragma once
// gemm_stream: y (+)= x W^T for decode batches (1..128 tokens) of 16-bit
// weights, built for the weights' one pass through HBM. The bulk tensor
// copy engine (TMA) streams 128-row x 64-column tiles of W, and the tokens'
// matching x tile, through a ring of shared-memory stages; two consumer
// warpgroups multiply them with wgmma (f32 accumulation), one producer warp
// keeps the ring full. A shape's column range may be split over a cluster
// of 1, 2, 4 or 8 blocks; the cluster adds the parts through distributed
// shared memory in split order, so a configuration gives the same bits run
// after run (but not across configurations or token counts: not batch
// invariant). Gemm times it beside cuBLASLt's candidates (gemm.h).
//
// Compiled for sm_90a only (wgmma, setmaxnreg-free): gemm_stream_available()
// says whether this device runs it (compute capability 9.0).
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
};
inline constexpr int kGemmStreamVariants = 3;

// Whether this process's current device can run the kernel (sm_90 with
// the sm_90a build in this binary).
bool gemm_stream_available();

// Whether args describe a shape the kernel takes: F16/BF16, 1..128 tokens,
// cols a multiple of 8 (16-byte rows for the copy engine) and at least 64,
// w, x and y 16-byte aligned, splits one of kGemmStreamSplits and no more
// than the chunks of a row (64 columns, 128 in variant 2), a variant.
bool gemm_stream_supported(const GemmStreamArgs& args);

// Launches it on `stream` (programmatic dependent launch: the weights'
// first tiles are fetched before the previous kernel finishes). False when
// !gemm_stream_supported(args) or the device cannot run it; nothing is
// launched then.
bool gemm_stream(const GemmStreamArgs& args, cudaStream_t stream);

}  // namespace rill::cuda
