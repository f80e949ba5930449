#pragma once
// The Gated DeltaNet linear-attention layer of Qwen3.5 / Qwen3-Next: its
// dims and its weights as the files hold them. The layer's arithmetic is
// Backend::gated_delta() and gated_rms_norm() (backend/backend.h), its graph
// model/arch/qwen3_next.cpp's, its states the runtime's (model/state_pool.h).
//
// Per token the layer projects the normed input to q, k, v (one conv
// channel each: [q | k | v], conv_dim = 2 * key_dim + value_dim), an output
// gate z [value_dim] and per value head b (-> beta = sigmoid(b)) and a
// (-> log decay g = -exp(A_log) * softplus(a + dt_bias)); runs the short
// causal conv1d + SiLU over the qkv channels, the gated delta rule per value
// head, then a per-head RMSNorm gated by silu(z) and the out projection.
// Checkpoints come in two layouts:
//   Qwen3.5     in_proj_qkv [conv_dim, E], in_proj_z [value_dim, E],
//               in_proj_b / in_proj_a [n_v_heads, E]
//   Qwen3-Next  in_proj_qkvz [2*key_dim + 2*value_dim, E] grouped per key
//               head (q, k, v, z of the head's value heads), in_proj_ba
//               [2*n_v_heads, E] grouped the same way (b, a); the rows are
//               gathered into the Qwen3.5 order at placement.
// and, from GGUF files (llama.cpp's converter; names in loader/gguf_names.cpp):
//   qwen3next   in_proj_qkv + in_proj_z (the Qwen3.5 order) with the grouped
//               in_proj_ba; older files keep in_proj_qkvz
//   qwen35      the Qwen3.5 tensors with the value heads tiled (head j*n_k + g
//               is Hugging Face's head g*r + j, r = n_v/n_k) in every tensor
//               indexed by value head; the projections' rows are put back
//               in Hugging Face's order at placement and the gated output
//               in the tiled order before out_proj, so the state and every
//               kernel see one layout
//   both        A = -exp(A_log) instead of A_log, conv1d [conv_dim, K]
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/layers.h"

namespace rill {

struct GatedDeltaDims {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t head_k_dim = 0;
  int64_t head_v_dim = 0;
  int64_t conv_kernel = 4;

  int64_t key_dim() const { return n_k_heads * head_k_dim; }
  int64_t value_dim() const { return n_v_heads * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t conv_state_floats() const { return conv_dim() * (conv_kernel - 1); }        // [conv_dim, K-1]
  int64_t delta_state_floats() const { return n_v_heads * head_k_dim * head_v_dim; }  // [n_v_heads, dk, dv]
};

struct GatedDeltaNet {
  GatedDeltaDims dims;
  bool fused = false;          // in_proj_qkvz (Qwen3-Next checkpoints)
  bool fused_ba = false;       // in_proj_ba (Qwen3-Next checkpoints and qwen3next GGUF)
  bool v_tiled = false;        // value heads tiled (qwen35 GGUF with n_v_heads != n_k_heads)
  Linear qkv, z, b, a;         // Qwen3.5: [conv_dim|value_dim|n_v_heads|n_v_heads, E]
  Linear qkvz, ba;             // Qwen3-Next: [2*key_dim + 2*value_dim, E], [2*n_v_heads, E]
  std::vector<float> conv_w;   // [conv_dim, K]
  std::vector<float> neg_a;    // -exp(A_log) [n_v_heads]
  std::vector<float> dt_bias;  // [n_v_heads]
  std::vector<float> norm_w;   // [head_v_dim], plain weight (not 1 + w)
  Linear out;                  // [E, value_dim]
  float eps = 1e-6f;
};

// Binds "<prefix>in_proj_*", conv1d, A_log (or A), dt_bias, norm, out_proj.
// v_tiled: the file's value heads are in the tiled order (qwen35 GGUF).
Result<GatedDeltaNet> bind_gated_delta_net(const ModelFiles& files, const std::string& prefix,
                                           const GatedDeltaDims& dims, int64_t n_embd, float eps, bool v_tiled = false);

}  // namespace rill
