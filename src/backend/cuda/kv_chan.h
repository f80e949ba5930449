#pragma once
// k4c's K on CUDA (model/kv_types.h "k4c", kKvQ4Chan): the per-channel
// encoder of one KV block of 32 tokens, cpu::quantize_chan_block's bytes
// (backend/cpu/kv_quant.h: z [width] f16, d [width] e4m3, q [width][16]
// nibbles), the sequence's first block with its sink-key grids; and k4a's
// (kKvQ4Alloc): each channel at its own width, cpu::quantize_alloc_block's
// bytes (backend/cpu/kv_alloc.h's bit planes; branch q4acuda22). The CUDA
// backend runs it for every block a step completes (kv_chan_step.h plans
// the units; branch k4cwire22); its tests passed on an H100 and an H200
// (docs/perf.md, branches k4ccuda22, k4cwire22, q4acuda22).
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
  // Set (device): q4a's blocks (cpu::quantize_alloc_block), the layer's
  // widths table below; null: q4c's (cpu::quantize_chan_block).
  const uint8_t* widths = nullptr;
};
void quantize_chan_blocks(const ChanEncodeArgs& a, cudaStream_t stream);

// q4a's widths table of one layer (uploaded once a load, read by the
// encoder and the attention): widths [width] bytes (0..8 a channel), then,
// at byte `width` (a multiple of 32, so 4-aligned), the plane offsets
// [width] int32: channel c's first plane's byte offset within a block
// (cpu::alloc_plane_offset; a KV head's planes start at its first
// channel's). KvCacheView::k_widths points at its start on CUDA.
inline size_t alloc_table_bytes(int64_t width) {
  return static_cast<size_t>(width) * 5;
}
// Fills a table of alloc_table_bytes(width) bytes (host memory).
void fill_alloc_table(const uint8_t* widths, int64_t width, uint8_t* table);
__host__ __device__ inline const int32_t* alloc_plane_offsets(const uint8_t* table, int64_t width) {
  return reinterpret_cast<const int32_t*>(table + width);
}

namespace detail {
// The kernel's per-channel encoder (the same source) built for the host,
// with cpu::quantize_chan_block's signature: what the tests hold to the
// CPU's bytes where no GPU is present (the device's _rn intrinsics are
// plain operators there, the same single roundings).
void quantize_chan_block_host(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst, bool sequence_start);
// q4a's likewise, cpu::quantize_alloc_block's signature.
void quantize_alloc_block_host(const float* rows, int64_t src_stride, int64_t width, const uint8_t* widths,
                               uint8_t* dst, bool sequence_start);
}  // namespace detail

}  // namespace rill::cuda
