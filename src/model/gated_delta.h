#pragma once
// The Gated DeltaNet linear-attention layer of Qwen3.5 / Qwen3-Next, and the
// store of recurrent state its layers share.
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
//               gathered into the Qwen3.5 order after the matmul.
// and, from GGUF files (llama.cpp's converter; names in loader/gguf_names.cpp):
//   qwen3next   in_proj_qkv + in_proj_z (the Qwen3.5 order) with the grouped
//               in_proj_ba; older files keep in_proj_qkvz
//   qwen35      the Qwen3.5 tensors with the value heads tiled (head j*n_k + g
//               is Hugging Face's head g*r + j, r = n_v/n_k) in every tensor
//               indexed by value head; the projections' outputs are put back
//               in Hugging Face's order after the matmul and the gated output
//               in the tiled order before out_proj, so the state and every
//               kernel see one layout
//   both        A = -exp(A_log) instead of A_log, conv1d [conv_dim, K]
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "core/lazy_buffer.h"
#include "core/result.h"
#include "loader/model_files.h"
#include "model/batch.h"
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

// The recurrent state of every linear-attention layer, f32, for n_slots live
// sequences and n_checkpoints snapshots. State ids: slot s is s, checkpoint
// c is n_slots + c. One state (all layers) is contiguous, so a reset or a
// restore is one memset / memcpy. Pages are reserved lazily: checkpoints
// cost memory once used.
class RecurrentStates {
 public:
  static Result<RecurrentStates> create(int64_t n_layers, const GatedDeltaDims& dims, int32_t n_slots,
                                        int32_t n_checkpoints);

  int32_t n_slots() const { return n_slots_; }
  int32_t n_checkpoints() const { return n_checkpoints_; }
  size_t bytes_per_state() const { return static_cast<size_t>(floats_per_state_) * sizeof(float); }
  int32_t checkpoint_id(int32_t checkpoint) const { return n_slots_ + checkpoint; }

  float* conv(int64_t layer, int32_t state) const { return layer_base(layer, state); }  // [conv_dim, K-1]
  float* delta(int64_t layer, int32_t state) const { return layer_base(layer, state) + conv_floats_; }

  void reset(int32_t slot) const;
  void restore(int32_t slot, int32_t checkpoint) const;

 private:
  float* layer_base(int64_t layer, int32_t state) const {
    return reinterpret_cast<float*>(buffer_.data()) + static_cast<int64_t>(state) * floats_per_state_ +
           layer * (conv_floats_ + delta_floats_);
  }
  LazyBuffer buffer_;
  int32_t n_slots_ = 0, n_checkpoints_ = 0;
  int64_t conv_floats_ = 0, delta_floats_ = 0, floats_per_state_ = 0;
};

// Checks a batch's recurrent fields: every sequence has a live state slot,
// restores and saves name existing checkpoints, saves are sorted and inside
// their sequence's step.
Status check_batch_states(const Batch& batch, int32_t n_slots, int32_t n_checkpoints);
// Before a step: zero the states of sequences starting at position 0, load
// checkpoints for the others that ask for it.
void prepare_states(const Batch& batch, const RecurrentStates& states);

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

// Activations of the layer for up to max_tokens tokens, allocated once.
struct GatedDeltaScratch {
  std::vector<float> qkv, z, b, a, g, beta, core, fused, fused_ba;
  std::vector<float> head_row;  // [value_dim], for reordering value heads
  std::vector<cpu::ConvSeq> conv_seqs;
  std::vector<cpu::GatedDeltaSeq> delta_seqs;
  std::vector<cpu::StateSnapshot> conv_snaps, delta_snaps;
  void reserve(const GatedDeltaDims& d, bool fused, int64_t max_tokens, int64_t max_seqs);
};

// One linear-attention layer over the batch. h: [n_tokens, E] (the normed
// input), out: [n_tokens, E]. `layer` indexes the recurrent layers in
// `states`. Requires check_batch_states() and prepare_states() for the step.
void gated_delta_forward(const GatedDeltaNet& L, int64_t layer, const Batch& batch, const float* h, float* out,
                         GatedDeltaScratch& s, const RecurrentStates& states, cpu::HostOps& backend);

}  // namespace rill
