#pragma once
// Tensor-core prefill attention (attention_mma.cu); attention() routes to it.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// f16, bf16, fp8, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl or the blocks of 64
// KV and head_dim 64, 128, 256 or 512; tiles of up to kPrefillTileQMma
// queries. Head_dim 64 and 128 run attention_flash.cu's kernel, every KV
// type at 256 and 512 attention_wide.cu's. The WMMA kernel of
// attention_mma.cu runs at 64 / 128 where a cache plane is not aligned to
// the flash kernel's copies (its check of a head of a multiple of 4 bytes
// is a guard: every type above has such heads), and with
// RILL_CUDA_FLASH_PREFILL=0 in the environment (for comparisons) for every
// case (at 512 two blocks of 32
// queries share a tile); RILL_CUDA_WIDE_PREFILL=512 keeps it at 256 only,
// RILL_CUDA_WIDE_PREFILL=0 at 256 and 512.
bool prefill_mma_supported(DType kv_dtype, int32_t head_dim);
// The KV types the WMMA and wide kernels read: every type
// RILL_CUDA_DISPATCH_KV names but F32.
bool prefill_tile_kv(DType kv_dtype);
// Aborts naming `kernel` and the type unless prefill_tile_kv(kv_dtype)
// (callers check the kernels' supported() first; in every build type).
void require_prefill_tile_kv(DType kv_dtype, const char* kernel);
void prefill_attention_mma(const AttentionArgs& a, cudaStream_t stream);

// attention_flash.cu: fragments in registers (mma.sync, ldmatrix, cp.async
// ring); head_dim 64 or 128 and the KV types the WMMA kernel reads (f16
// copied as it is, the others as raw bytes converted in shared memory),
// tiles of up to kPrefillTileQMma queries, the same arithmetic as the WMMA
// kernel. Supported: a's head_dim, KV type (a head a multiple of 4 bytes)
// and cache planes aligned to the kernel's copies (16 bytes for f16, the
// piece size for the others).
bool prefill_flash_supported(const AttentionArgs& a);
void prefill_attention_flash(const AttentionArgs& a, cudaStream_t stream);

// attention_wide.cu: fragments in registers for wide heads; the KV types
// of prefill_mma_supported and head_dim 256 or 512, tiles of up to kPrefillTileQMma
// queries (8 warps at 256, 16 at 512: the rows split 2 or 4 ways, S's keys
// and P V's output dims 4 ways), the same arithmetic as the WMMA kernel.
bool prefill_wide_supported(DType kv_dtype, int32_t head_dim);
void prefill_attention_wide(const AttentionArgs& a, cudaStream_t stream);

}  // namespace rill::cuda
