#pragma once
// Device helpers of the latent-row kernels (latent_attention.cu,
// lightning_index.cu): addressing a row split over the K and V planes, and
// the RoPE angles of a placed table (as ops.cu's rope_store_kv computes
// them, so the MLA families rotate with the same bits as the others).
#include <cuda_fp16.h>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/latent_attention.h"

namespace rill::cuda::detail {

// Byte offset of cache row `slot` (block << block_shift | offset) in a plane.
__device__ __forceinline__ size_t latent_slot_offset(const LatentCache& c, int64_t slot) {
  const int64_t mask = (int64_t{1} << c.block_shift) - 1;
  return static_cast<size_t>(slot >> c.block_shift) * c.block_stride + static_cast<size_t>(slot & mask) * c.row_bytes;
}

// Byte offset of key position j of a sequence whose block table is `table`.
__device__ __forceinline__ size_t latent_key_offset(const LatentCache& c, const int32_t* table, int32_t j) {
  const int32_t mask = (1 << c.block_shift) - 1;
  return static_cast<size_t>(table[j >> c.block_shift]) * c.block_stride + static_cast<size_t>(j & mask) * c.row_bytes;
}

// Element i of the row at byte offset `at`.
__device__ __forceinline__ float latent_read(const LatentCache& c, size_t at, int32_t i) {
  const bool in_k = i < c.plane;
  const int32_t e = in_k ? i : i - c.plane;
  const uint8_t* base = static_cast<const uint8_t*>(in_k ? c.k : c.v) + at;
  if (c.dtype == DType::kF16) return __half2float(reinterpret_cast<const __half*>(base)[e]);
  return reinterpret_cast<const float*>(base)[e];
}

__device__ __forceinline__ void latent_write(const LatentCache& c, size_t at, int32_t i, float v) {
  const bool in_k = i < c.plane;
  const int32_t e = in_k ? i : i - c.plane;
  uint8_t* base = static_cast<uint8_t*>(in_k ? c.k : c.v) + at;
  if (c.dtype == DType::kF16) {
    reinterpret_cast<__half*>(base)[e] = __float2half_rn(v);
  } else {
    reinterpret_cast<float*>(base)[e] = v;
  }
}

// Rotates pair i of x (rope dims from x[0]) by position p: pairs (2i, 2i+1)
// when interleaved, else (i, i + rot_dim / 2); cos and sin times
// attn_factor, ggml's f32 recurrence when ggml_theta_scale > 0.
__device__ __forceinline__ void rope_pair(const RopeAngles& r, int32_t p, int i, float* x) {
  const float pos = static_cast<float>(p);
  float theta;
  if (r.ggml_theta_scale > 0.0f) {
    theta = pos;
    for (int k = 0; k < i; ++k) theta *= r.ggml_theta_scale;
    if (r.freq_divisor) theta = theta / r.freq_divisor[i];
  } else {
    theta = pos * r.inv_freq[i];
  }
  const float cs = cosf(theta) * r.attn_factor, sn = sinf(theta) * r.attn_factor;
  const int n_pairs = r.rot_dim / 2;
  const int i0 = r.interleaved ? 2 * i : i, i1 = r.interleaved ? 2 * i + 1 : i + n_pairs;
  const float x0 = x[i0], x1 = x[i1];
  x[i0] = x0 * cs - x1 * sn;
  x[i1] = x0 * sn + x1 * cs;
}

}  // namespace rill::cuda::detail
