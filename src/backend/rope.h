#pragma once
// The RoPE table every backend rotates by (backend/cpu/rope_table.h builds
// it from a model's config; Backend::place_rope() puts it where a backend's
// kernels read it). Plain data, no device types.
#include <cstdint>
#include <vector>

namespace rill {

// Precomputed inverse frequencies (rot_dim / 2 of them) and the yarn
// magnitude scale; built once per model by make_rope_table (rope_table.h).
// Pair i rotates by angle pos * inv_freq[i] (f32), cos/sin scaled by attn_factor.
struct RopeTable {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  float attn_factor = 1.0f;     // multiplies cos and sin (yarn mscale)
  int64_t rot_dim = 0;
  bool interleaved = false;  // RopeStyle::kInterleaved
  // When > 0, angles are computed as llama.cpp does for GGUF models: theta_0 =
  // pos, theta_{i+1} = theta_i * ggml_theta_scale in f32 (then divided by
  // ggml_freq_divisor[i] when present), instead of pos * inv_freq[i].
  float ggml_theta_scale = 0.0f;
  std::vector<float> ggml_freq_divisor;  // rope_freqs (llama3 GGUF), or empty
};

}  // namespace rill
