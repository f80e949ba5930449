#pragma once
// The fast split-KV decode kernel (attention_decode.cu); attention() routes
// decode tokens to it when decode_fast_supported(), else to its general
// kernel. Both follow AttentionArgs' contract and the same split rule.
#include <cuda_runtime.h>

#include "backend/cuda/ops.h"

namespace rill::cuda {

// f16, fp8 (e4m3), q8_0, q4_0, iq4_nl, q8_0h64's Q8_0_64 and iq4_nlh64's
// IQ4_NL64 KV with head_dim
// 64/128 (1, 2, 4 or 8 q heads per KV head) or 256 (1, 2 or 4); f32 KV with
// head_dim 64/128 (1, 2, 4 or 8).
bool decode_fast_supported(DType kv_dtype, int32_t head_dim, int32_t group);
// Grid (n_head_kv, n_splits_grid, n_decode): tokens with one split write
// out; the others write partials (merged by the caller's combine kernel, or
// in the kernel with a.split_counts).
// warps: the block's warps for f16 and fp8 KV, 8, 4 or 2; 0 chooses by the
// grid's working blocks (n_head_kv x `work` where work > 0, else the whole
// grid): 8 while they fit on the GPU at once in 8-warp blocks, else 4 or 2
// (RILL_DECODE_WARPS=8/4/2 in the environment overrides the choice, for
// comparisons). The block size changes the order of a token's sums, so a
// token's bits depend on its own length alone only with warps fixed.
// work: the decode blocks per KV head that read keys, as
// decode_work_bucket gives it; 0: not known.
void decode_attention_fast(const AttentionArgs& a, int32_t n_splits_grid, cudaStream_t stream, int32_t warps = 0,
                           int32_t work = 0);
// Whether decode_attention_fast sends this cache's decode tokens to the
// tensor-core kernel (attention_decode_mma.cu): q8_0, q4_0, q4_1, q5_0,
// q5_1, iq4_nl and fp8 KV at head_dim 64 or 128, groups 1, 2, 4 or 8,
// unless RILL_DECODE_MMA=0 (the default takes it: attention_decode_mma.cu's
// kDefaultOn). Its outputs carry the
// tensor-core prefill's f16 rounding (q, the probabilities, the values);
// its block shape is fixed, so `warps` does not apply to it.
bool decode_mma_takes(DType kv_dtype, int32_t head_dim, int32_t group);
// For tests: 1 / 0 puts that kernel on / off for this process whatever
// RILL_DECODE_MMA says (so its test runs in every GPU suite, and the fast
// kernel's tests keep testing the fast kernel); -1 gives the choice back to
// the environment and the default. Not for use while kernels are queued.
void force_decode_mma(int on);
// For tests: that kernel's shape, 6 or 8 blocks an SM (attention_decode_mma.cu's
// Occ6 / Occ8; the same bits), whatever RILL_DECODE_MMA_OCC says; 0 gives
// the choice back. Not for use while kernels are queued.
void force_decode_mma_blocks(int blocks_per_sm);
// That kernel on decode_attention_fast's grid; prefetch: read the split's
// rows into L2 before waiting for the preceding kernel (small grids).
void decode_attention_mma(const AttentionArgs& a, int32_t n_splits_grid, bool prefetch, cudaStream_t stream);
// The block size that launch takes (8, 4 or 2).
int32_t decode_fast_warps(const AttentionArgs& a, int32_t n_splits_grid, int32_t warps = 0, int32_t work = 0);
// The working decode blocks per KV head of a step whose decode tokens'
// splits (decode_splits(pos + 1), the grid's other splits leave at once)
// sum to `splits`, rounded up to a power of two (0 for none): the runtime
// keys its decode graphs by it, so every replay of a graph made the choice
// its count makes.
inline int32_t decode_work_bucket(int64_t splits) {
  if (splits <= 0) return 0;
  int64_t b = 1;
  while (b < splits && b < (int64_t{1} << 30)) b *= 2;
  return static_cast<int32_t>(b);
}
// RILL_DECODE_WARPS's value: 8, 4 or 2 (the whole string a base-10 number);
// 0 for none (null or empty) or for anything else, which it reports on
// stderr.
int32_t parse_decode_warps(const char* value);

// attention() (ops.h) with decode_attention_fast's `warps` and `work`:
// batch-invariant mode passes warps 8 (every grid in 8-warp blocks),
// attention() 0 and 0.
void attention(const AttentionArgs& a, cudaStream_t stream, int32_t decode_warps, int32_t decode_work = 0);

}  // namespace rill::cuda
