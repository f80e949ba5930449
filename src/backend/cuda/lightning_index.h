#pragma once
// DeepSeek sparse attention's lightning indexer on CUDA (backend.h's
// lightning_index(); backend/cpu/lightning_index.cpp is the reference) and
// the LayerNorm of its keys.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/latent_attention.h"

namespace rill::cuda {

struct LightningIndexArgs {
  float* q = nullptr;  // [n_tokens, n_head head_dim], rotated in place
  int64_t q_stride = 0;
  const float* k = nullptr;  // [n_tokens, head_dim]
  int64_t k_stride = 0;
  const float* w = nullptr;  // [n_tokens, n_head]
  int64_t w_stride = 0;
  int32_t n_head = 0, head_dim = 0;
  float score_scale = 1.0f, weight_scale = 1.0f;
  RopeAngles rope;
  int32_t key_col = 0;
  int32_t topk = 0;
  int32_t* selected = nullptr;    // [n_tokens, topk]
  int32_t* n_selected = nullptr;  // [n_tokens]
  LatentCache cache;
  const int32_t* pos = nullptr;
  const int32_t* seq_of = nullptr;
  const int32_t* table_start = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* slots = nullptr;
  int64_t n_tokens = 0;
  // Per-block score rows: [kIndexBlocks, max_keys] floats.
  float* scores = nullptr;
  int64_t max_keys = 0;
};

// Blocks of the scoring kernel (each takes tokens in turn), and so the rows
// of LightningIndexArgs::scores.
inline constexpr int64_t kIndexBlocks = 264;

// The keys rotated and stored for every token, then (a second kernel) each
// token's scores over its keys [0, pos[t]] in the CPU's order (per key: heads
// in order, each dot product over head_dim in order) and the top-k by the
// total order (higher score, then later key) by a radix select over (score,
// position), written in ascending positions. A token's selection depends on
// nothing but its own keys.
void lightning_index(const LightningIndexArgs& a, cudaStream_t stream);

// out[r] = (x[r] - mean) / sqrt(var + eps) * w + b per row (biased
// variance), mean and variance summed in double as the CPU does; x and out
// F32 with row strides (floats), out may alias x.
void layer_norm(const float* x, int64_t x_stride, const float* w, const float* b, int64_t n_rows, int64_t n_cols,
                float eps, float* out, int64_t out_stride, cudaStream_t stream);

}  // namespace rill::cuda
