#pragma once
// Tensor-core prefill attention (attention_mma.cu); attention() routes to it.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// f16, fp8, q8_0 or q4_0 KV and head_dim 64, 128 or 256; tiles of up to kPrefillTileQMma queries.
bool prefill_mma_supported(DType kv_dtype, int32_t head_dim);
void prefill_attention_mma(const AttentionArgs& a, cudaStream_t stream);

}  // namespace rill::cuda
