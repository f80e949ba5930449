#pragma once
// Multi-head latent attention on CUDA (backend.h's MLA ops: matmul_heads,
// rope_store_latent, latent_attention; the CPU Backend is the reference).
// A latent row [latent c | rope key r (| indexer key)] lives split over a
// layer's K and V planes (model/kv_spec.h's LatentKvRow): element i of the
// row is element i % plane of the K plane (i < plane) or of the V plane, at
// the token's cache row. Every kernel computes a token's outputs in a fixed
// order that depends on nothing but that token (its position and its own
// keys), and which kernel runs depends on the shapes and dtypes only, never
// on the step's token count, so results are batch invariant in every mode.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

// A RoPE table on the device as the CUDA Backend places it (CudaRope).
struct RopeAngles {
  const float* inv_freq = nullptr;      // [rot_dim / 2]
  const float* freq_divisor = nullptr;  // [rot_dim / 2] or null (ggml mode only)
  int32_t rot_dim = 0;
  bool interleaved = false;
  float attn_factor = 1.0f;
  float ggml_theta_scale = 0.0f;
};

// One layer's paged latent rows.
struct LatentCache {
  void* k = nullptr;          // the K plane: row elements [0, plane)
  void* v = nullptr;          // the V plane: row elements [plane, 2 plane)
  DType dtype = DType::kF32;  // F32 or F16
  int32_t plane = 0;          // elements per plane row
  int32_t block_shift = 0;
  size_t row_bytes = 0, block_stride = 0;
};

// y[t, h y_step + r] = sum_c W[h R + r, c] x[t, h x_step + c] for r < R,
// c < C, h < n_heads; W [n_heads R, C] in w_dtype (F32, F16 or BF16), x and
// y F32 with row strides (floats). F32 W: f32 sums over c in ascending
// order on the CUDA cores. F16 / BF16 W with C % 64 == 0 (W and x rows
// 16-byte aligned): the tensor cores, x split into hi + lo values of W's
// type (f32 precision within ~2^-16 relative; with F16 W, x must lie in
// f16's range (|x| < 65504: beyond it the sum is not finite) and values
// under 2^-14 keep an absolute error of ~2^-25), C split over 4 warps
// summed in warp order.
struct HeadsMatmulArgs {
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  int32_t n_heads = 0;
  int64_t R = 0, C = 0;
  const float* x = nullptr;
  int64_t x_stride = 0, x_step = 0;
  float* y = nullptr;
  int64_t y_stride = 0, y_step = 0;
  int64_t n_tokens = 0;
};
void matmul_heads(const HeadsMatmulArgs& a, cudaStream_t stream);

// RILL_MLA_MMA=0 in the environment (read once): matmul_heads and
// latent_attention keep to their f32 CUDA-core kernels, whose numbers
// differ from the tensor-core kernels' (so the KV numerics name it).
bool mla_tensor_cores_off();

// backend.h's rope_store_latent(): per token, the rope dims of every q head
// rotated in place, the latent RMS-normed (kv_norm), the rope key rotated,
// and the row [latent | rope key | zeros] stored at slots[t].
struct LatentStoreArgs {
  float* q = nullptr;
  int64_t q_stride = 0;
  int32_t n_head = 0, q_head_dim = 0, q_rope_col = 0;
  float* kv = nullptr;  // [n_tokens, L + R] (scratch afterwards)
  int64_t kv_stride = 0;
  int32_t kv_lora_rank = 0, rope_dim = 0;
  const float* kv_norm = nullptr;
  float norm_eps = 1e-6f;
  RopeAngles rope;
  const int32_t* pos = nullptr;    // [n_tokens]
  const int32_t* slots = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  LatentCache cache;
};
void rope_store_latent(const LatentStoreArgs& a, cudaStream_t stream);

// backend.h's latent_attention(): one block per (token, group of heads), a
// key's row read once per block for its heads; keys in chunks with an
// online f32 softmax. selected / n_selected (device; null: every key
// [0, pos[t]]) as LatentAttentionOp says. F16 rows with kv_lora_rank 32,
// 64, 128, 256 or 512: on the tensor cores (q and the probabilities
// rounded to f16, as the f16 prefill attention does; scores, softmax and
// sums f32); F32 rows and other widths: f32 on the CUDA cores.
// RILL_MLA_MMA=0 in the environment keeps both ops on their f32 kernels.
struct LatentAttentionArgs {
  const float* q_latent = nullptr;
  int64_t q_latent_stride = 0;
  const float* q_rope = nullptr;
  int64_t q_rope_stride = 0, q_rope_step = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  int32_t n_head = 0, kv_lora_rank = 0, rope_dim = 0;
  float scale = 1.0f;
  LatentCache cache;
  const int32_t* pos = nullptr;
  const int32_t* seq_of = nullptr;
  const int32_t* table_start = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* selected = nullptr;
  const int32_t* n_selected = nullptr;
  int32_t selected_stride = 0;
  int64_t n_tokens = 0;
};
// The widest row (kv_lora_rank + rope_dim) latent_attention takes.
inline constexpr int32_t kLatentMaxRow = 1024;
void latent_attention(const LatentAttentionArgs& a, cudaStream_t stream);

}  // namespace rill::cuda
