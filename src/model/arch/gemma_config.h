#pragma once
// The Gemma family's configuration (model/arch/gemma.cpp binds through it):
// the parameters ModelConfig does not carry,
// the tensor names of text-only and multimodal checkpoints, one layer's
// weights as the files hold them, and the two RoPE tables (sliding and full
// layers).
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/rope_table.h"
#include "core/result.h"
#include "loader/model_files.h"
#include "model/layers.h"
#include "model/moe.h"

namespace rill {

// Read from the raw config (HF config.json, or GGUF metadata keys `<arch>.*`).
struct GemmaParams {
  std::vector<bool> sliding;  // [n_layer]: the layer attends to the last window tokens
  float query_pre_attn_scalar = 0;
  float attn_softcap = 0;   // 0: none
  float final_softcap = 0;  // 0: none
  float local_rope_theta = 10000.0f;
  float norm_offset = 1.0f;  // RMSNorm scales by (norm_offset + w): HF 1, GGUF 0 (stores 1 + w)

  // Gemma 4 (gemma4_text, gemma4's text model). Its norms scale by w
  // (norm_offset 0), its attention by 1 (q/k are RMS-normed, V too).
  bool gemma4 = false;
  std::vector<int64_t> head_dim, n_head_kv;  // [n_layer]: full layers have their own
  std::vector<int64_t> kv_donor;             // [n_layer]: the layer whose KV it reads (itself, unless KV-shared)
  bool k_eq_v = false;                       // full layers use K as V (attention_k_eq_v; no v_proj)
  int64_t ple_dim = 0;                       // hidden_size_per_layer_input; 0: no per-layer embeddings
  int64_t ple_vocab = 0;                     // vocab_size_per_layer_input
  std::vector<int64_t> n_ff;                 // [n_layer]: double-wide MLPs on KV-shared layers
  // Full layers' RoPE: rotated angle pairs of the full head (proportional:
  // the first global_rope_pairs of head_dim / 2, at frequencies over the
  // whole head; the rest stay put) and the base.
  int64_t global_rope_pairs = 0;
  float global_rope_factor = 1.0f;
  bool moe = false;  // enable_moe_block: an MoE block beside the dense MLP
};

// Errors name config.json (or the GGUF file) and the field; the scalar is
// positive and the softcaps non-negative.
Result<GemmaParams> read_gemma_params(const ModelFiles& files);

// Tensor name prefixes: text-only checkpoints name tensors model.*; gemma3
// multimodal ones model.language_model.* (transformers v5) or
// language_model.model.* (v4), with the LM head (when not tied) beside.
struct GemmaNames {
  std::string base = "model.";  // + "embed_tokens.weight", "layers.N...", "norm.weight"
  std::string head = "lm_head.weight";
};
GemmaNames gemma_tensor_names(const ModelFiles& files);

// One layer's weights bound from the files (matrices view the mapping,
// norms and biases are f32 copies); q/k/v/o take an optional bias.
struct GemmaLayerWeights {
  std::vector<float> attn_norm, post_attn_norm;  // [n_embd]
  Linear q, k, v, o;                  // q: [n_head*hd, n_embd], k/v: [n_head_kv*hd, n_embd], o: [n_embd, n_head*hd]
  std::vector<float> q_norm, k_norm;  // [head_dim], gemma3/4 only (empty otherwise)
  std::vector<float> ffn_norm, post_ffn_norm;  // [n_embd]
  Linear gate, up, down;                       // gate/up: [n_ff, n_embd], down: [n_embd, n_ff]
  // Gemma 4: k / v absent on KV-shared layers, v on K-as-V layers.
  Linear ple_gate, ple_proj;         // [ple_dim, n_embd], [n_embd, ple_dim]; with per-layer embeddings
  std::vector<float> post_ple_norm;  // [n_embd]
  float layer_scalar = 1.0f;         // the layer's output scale
  // Gemma 4's MoE block (enable_moe_block), beside the dense MLP: the
  // router reads norm(x) * router_norm (its scale times n_embd^-1/2), the
  // experts pre_ffn_norm_2(x); the MLP's and the experts' outputs are normed
  // (post_ffn_norm_1 / _2) and summed before post_ffn_norm.
  std::optional<MoeFfn> moe;
  std::vector<float> router_norm, pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2;  // [n_embd]
};
struct GemmaLayerDims {
  int64_t n_embd, q_width, kv_width, n_ff, head_dim;
  bool has_kv = true;   // k_proj (Gemma 4: false on KV-shared layers)
  bool has_v = true;    // v_proj (Gemma 4: false on K-as-V layers)
  int64_t ple_dim = 0;  // Gemma 4's per-layer input width
  bool gemma4 = false;  // layer_scalar
  MoeParams moe;        // n_expert > 0: Gemma 4's MoE block
};
// Errors name the file and the tensor that is missing or misshapen.
Status bind_gemma_layer(const ModelFiles& files, const GemmaNames& names, int64_t il, const GemmaLayerDims& d,
                        GemmaLayerWeights& out);

// RoPE over the whole head (rot_dim = head_dim): full layers at rope_theta
// (scaled as the config says), sliding layers at the local base, never
// scaled (gemma2: one base for both); GGUF files take llama.cpp's angle
// recurrence.
// Gemma 4: the sliding layers' table over their head_dim, the full layers'
// over theirs (proportional: see GemmaParams).
struct GemmaRope {
  cpu::RopeTable local, global;
};
GemmaRope gemma_rope_tables(const ModelFiles& files, const GemmaParams& p, int64_t head_dim);

}  // namespace rill
