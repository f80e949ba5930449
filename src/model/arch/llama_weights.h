#pragma once
// The Llama family's weights, bound once for both runtimes of the graph
// (llama.cpp: the CPU and the CUDA runtime): tensor names,
// shapes, the optional parts (qkv bias, q/k norm, tied LM head, MoE FFN), a
// rank's slices, the RoPE table and the KV dtype rule. Host views only: the weights stay in the
// mapped files until an implementation places them (the CUDA one uploads).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/rope_table.h"
#include "core/result.h"
#include "loader/model_files.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/mtp_head.h"
#include "model/mup_scales.h"
#include "model/tensor_split.h"

namespace rill {

// The whole model's widths, from the config. llama_dims refuses
// inconsistent configs and head sizes above max_head_dim (the backend's
// limit); errors name the model file.
struct LlamaDims {
  int64_t E = 0, V = 0, F = 0;  // embedding, vocabulary, dense FFN width (0: every layer MoE)
  int64_t hd = 0;               // head_dim
  int64_t Q = 0, KV = 0;        // q rows (n_head * hd), k or v rows (n_head_kv * hd)
};
Result<LlamaDims> llama_dims(const ModelFiles& files, int64_t max_head_dim);

struct LlamaLayerWeights {
  std::vector<float> attn_norm;       // [E]
  Linear q, k, v, o;                  // [Q, E], [KV, E], [KV, E], [E, Q]; biases optional (qwen2)
  std::vector<float> q_norm, k_norm;  // [hd], qwen3 only (empty otherwise)
  std::vector<float> ffn_norm;        // [E]
  Linear gate, up, down;              // dense layers: [F, E], [F, E], [E, F]
  std::optional<MoeFfn> moe;          // MoE layers (mixtral, qwen3_moe), instead of gate/up/down
};

struct LlamaWeights {
  WeightView embed;    // [V, E]
  WeightView lm_head;  // [V, E]; the embedding when tied
  bool tied = false;   // lm_head.weight absent
  std::vector<float> final_norm;
  std::vector<LlamaLayerWeights> layers;
  // The multi-token-prediction layer (ModelOptions::mtp, bind_llama_mtp):
  // its decoder layer (GLM-4.5's nextn layer n_layer: a glm4_moe layer) and
  // its head (model/mtp_head.h).
  std::optional<LlamaLayerWeights> mtp_layer;
  std::optional<MtpHeadWeights> mtp_head;
  // MiniCPM's muP scales (`minicpm`); 1 for every other model type.
  MupScales mup;

  // Whether every matrix (and the embedding) is f32: such checkpoints keep
  // f32 KV so logits match the f32 reference; everything else stores f16
  // KV, as llama.cpp does.
  bool all_f32() const;
};
// minicpm: the muP scales, and what the graph does not run refused naming
// the field or tensor (MiniCPM4's sparse attention, MiniCPM-MoE's experts,
// LongRoPE factor tensors without the longrope type, an activation other
// than silu, MLP biases).
Result<LlamaWeights> bind_llama_weights(const ModelFiles& files, const LlamaDims& d);
// Binds the files' first MTP layer into w (loader/mtp_layers.h: DeepSeek's
// naming, layer n_layer); files without one are refused naming them.
Status bind_llama_mtp(const ModelFiles& files, const LlamaDims& d, LlamaWeights& w);

// Cuts every layer to one rank's share (model/tensor_split.h): q/k/v rows
// of its heads and KV heads, o columns of its heads, gate/up rows and down
// columns of its `ff` slice, every expert's slice of a MoE layer. o's bias
// stays whole in o.bias: a row-parallel product is partial on each rank, so
// callers add it once, after the all-reduce. The embedding and LM head are
// the caller's (both runtimes slice the head and keep the embedding whole).
Status shard_llama_layers(LlamaWeights& w, const TensorSplit& split, const SplitRange& ff, int64_t hd,
                          const std::string& path);

// The RoPE table: Hugging Face inv_freq for default / linear / llama3 /
// yarn scaling, GGUF rope_freqs divisors, MiniCPM 4's LongRoPE short
// factors, and llama.cpp's angle recurrence for unscaled (or LongRoPE) GGUF
// models (their logits are held to llama.cpp's bits). n_ctx: the context
// the runtime serves (0: max_position); LongRoPE refuses one past
// original_max_position.
Result<cpu::RopeTable> build_llama_rope(const ModelFiles& files, int64_t hd, int64_t n_ctx);

}  // namespace rill
