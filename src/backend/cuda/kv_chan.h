#pragma once
// k4c's K on CUDA (model/kv_types.h "k4c", kKvQ4Chan): the per-channel
// encoder of one KV block of 32 tokens, cpu::quantize_chan_block's bytes
// (backend/cpu/kv_quant.h: z [width] f16, d [width] e4m3, q [width][16]
// nibbles), the sequence's first block with its sink-key grids. The CUDA
// backend runs it for every block a step completes (kv_chan_step.h plans
// the units; branch k4cwire22, behind RILL_CUDA_UNTESTED_KV=1); nothing
// here has yet run on a GPU (docs/perf.md, branches k4ccuda22, k4cwire22).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

// n_units blocks of cpu::kKvChanTokens (32) rows each: unit u's row r (its
// r-th token) is rows[u * 32 + r], width elements of row_dtype (kQ8_0:
// cpu::kKvChanTailType, the tail's and a step's rows, read as the CPU's
// dequantize_row reads them; kF32: the floats themselves, for tests), all
// device pointers; unit u's block goes to dst[u] (19 * width bytes).
// sequence_start[u] != 0: the block holds the sequence's position 0 (the
// sink-key rule). width a multiple of 32 (a q8_0 row's blocks), at most
// 65,535 * 128 channels. One thread per channel: each channel's search is
// the CPU's, in its order, with explicitly rounded f32 / f64 operations.
struct ChanEncodeArgs {
  const uint8_t* const* rows = nullptr;     // [n_units * 32]
  uint8_t* const* dst = nullptr;            // [n_units]
  const uint8_t* sequence_start = nullptr;  // [n_units]
  DType row_dtype = DType::kQ8_0;
  int32_t n_units = 0;
  int32_t width = 0;
  // Set (device): the units that exist, at most n_units (the grid's):
  // units u >= *n_units_dev are skipped (kv_chan_step.h plans them on the
  // device, so the host launches for the most a step can complete).
  const int32_t* n_units_dev = nullptr;
};
void quantize_chan_blocks(const ChanEncodeArgs& a, cudaStream_t stream);

namespace detail {
// The kernel's per-channel encoder (the same source) built for the host,
// with cpu::quantize_chan_block's signature: what the tests hold to the
// CPU's bytes where no GPU is present (the device's _rn intrinsics are
// plain operators there, the same single roundings).
void quantize_chan_block_host(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst, bool sequence_start);
}  // namespace detail

}  // namespace rill::cuda
