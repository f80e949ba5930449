#pragma once
// The Gemma family's configuration (model/arch/gemma.cpp binds through it):
// the parameters ModelConfig does not carry,
// the tensor names of text-only and multimodal checkpoints, one layer's
// weights as the files hold them, and the two RoPE tables (sliding and full
// layers).
#include <string>
#include <vector>

#include "backend/cpu/rope_table.h"
#include "core/result.h"
#include "loader/model_files.h"
#include "model/layers.h"

namespace rill {

// Read from the raw config (HF config.json, or GGUF metadata keys `<arch>.*`).
struct GemmaParams {
  std::vector<bool> sliding;  // [n_layer]: the layer attends to the last window tokens
  float query_pre_attn_scalar = 0;
  float attn_softcap = 0;   // 0: none
  float final_softcap = 0;  // 0: none
  float local_rope_theta = 10000.0f;
  float norm_offset = 1.0f;  // RMSNorm scales by (norm_offset + w): HF 1, GGUF 0 (stores 1 + w)
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
  std::vector<float> q_norm, k_norm;  // [head_dim], gemma3 only (empty otherwise)
  std::vector<float> ffn_norm, post_ffn_norm;  // [n_embd]
  Linear gate, up, down;                       // gate/up: [n_ff, n_embd], down: [n_embd, n_ff]
};
struct GemmaLayerDims {
  int64_t n_embd, q_width, kv_width, n_ff, head_dim;
};
// Errors name the file and the tensor that is missing or misshapen.
Status bind_gemma_layer(const ModelFiles& files, const GemmaNames& names, int64_t il, const GemmaLayerDims& d,
                        GemmaLayerWeights& out);

// RoPE over the whole head (rot_dim = head_dim): full layers at rope_theta
// (scaled as the config says), sliding layers at the local base, never
// scaled (gemma2: one base for both); GGUF files take llama.cpp's angle
// recurrence.
struct GemmaRope {
  cpu::RopeTable local, global;
};
GemmaRope gemma_rope_tables(const ModelFiles& files, const GemmaParams& p, int64_t head_dim);

}  // namespace rill
