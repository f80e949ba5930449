#pragma once
// Tensor-core prefill attention (attention_mma.cu); attention() routes to it.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// f16, fp8, q8_0 or q4_0 KV and head_dim 64, 128, 256 or 512; tiles of up to kPrefillTileQMma
// queries (at 512 two blocks of 32 share a tile).
// f16 KV at head_dim 64 and 128 runs attention_flash.cu's kernel, unless
// RILL_CUDA_FLASH_PREFILL=0 is in the environment (for comparisons); every
// other case the WMMA kernel of attention_mma.cu.
bool prefill_mma_supported(DType kv_dtype, int32_t head_dim);
void prefill_attention_mma(const AttentionArgs& a, cudaStream_t stream);

// attention_flash.cu: fragments in registers (mma.sync, ldmatrix, cp.async
// ring); f16 KV and head_dim 64 or 128, tiles of up to kPrefillTileQMma
// queries, the same arithmetic as the WMMA kernel.
bool prefill_flash_supported(DType kv_dtype, int32_t head_dim);
void prefill_attention_flash(const AttentionArgs& a, cudaStream_t stream);

}  // namespace rill::cuda
