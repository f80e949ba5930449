#pragma once
// The two kernels behind rope_store_kv (ops.h). F32, F16, BF16 and F8_E4M3
// KV take a warp-per-head kernel; the block types (and every type, through
// rope_store_kv_general) a block-per-head kernel whose threads share each
// block of the type. Both give the same bits for the element types:
// tests/cuda/cuda_ops_test.cpp holds them to each other.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// rope_store_kv by the block-per-head kernel, whatever the KV type.
void rope_store_kv_general(const RopeKvArgs& a, cudaStream_t stream);

}  // namespace rill::cuda
