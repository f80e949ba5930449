#pragma once
// The fast split-KV decode kernel (attention_decode.cu); attention() routes
// decode tokens to it when decode_fast_supported(), else to its general
// kernel. Both follow AttentionArgs' contract and the same split rule.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// f16, fp8 (e4m3), q8_0, q4_0, iq4_nl and q8_0h64's Q8_0_64 KV with head_dim
// 64/128 (1, 2, 4 or 8 q heads per KV head) or 256 (1, 2 or 4); f32 KV with
// head_dim 64/128 (1, 2, 4 or 8).
bool decode_fast_supported(DType kv_dtype, int32_t head_dim, int32_t group);
// Grid (n_head_kv, n_splits_grid, n_decode): tokens with one split write
// out; the others write partials (merged by the caller's combine kernel, or
// in the kernel with a.split_counts).
void decode_attention_fast(const AttentionArgs& a, int32_t n_splits_grid, cudaStream_t stream);

}  // namespace rill::cuda
