#pragma once
// The Llama graph, written once for every device (issue 16): the weights as
// a Backend placed them, their placement from the bound LlamaWeights, and
// one step's forward pass over Backend ops. model/arch/llama.cpp holds it
// with the CPU runtime (`llama.cpu`: decode lanes, a rank
// of simulated tensor parallelism); model/arch/llama.cpp also holds the CUDA
// runtime's glue (`llama.cuda`, over model/cuda_model_base.h; a rank per
// GPU). What a runtime adds goes through LlamaHooks: the KV cache's layout
// and tensor parallelism (residual ownership and the all-reduce after o,
// down and the MoE FFN).
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "model/arch/llama_weights.h"
#include "model/mtp_head.h"

namespace rill {

// One layer as the Backend placed it: q/k/v as one weight (rows q, k, v) and
// gate/up as one (rows gate, up).
struct LlamaLayer {
  Vec attn_norm;        // [E]
  Weight wqkv;          // [Q + 2 KV, E]
  Vec bqkv;             // [Q + 2 KV] (zeros for a part without one) or absent (qwen2 has them)
  Vec q_norm, k_norm;   // [hd], qwen3 only
  Weight wo;            // [E, Q]
  Vec bo;               // [E] or absent
  Vec ffn_norm;         // [E]
  Weight w_gate_up;     // [2 F, E]; dense layers
  Weight w_down;        // [E, F]
  bool is_moe = false;  // Backend::moe_ffn over `moe` instead of gate/up/down
  MoeWeight moe;        // mixtral / qwen3_moe / glm4_moe layers (a shard: its slice of every expert)
};

// The placed model. Widths are one rank's (its heads, KV heads, FFN slice)
// when the runtime placed a tensor-parallel shard; E and the embedding are
// whole, the head holds head_rows rows (a shard's vocabulary slice, 0 for a
// rank with none).
struct LlamaGraph {
  int64_t E = 0, F = 0, hd = 0, Q = 0, KV = 0, head_rows = 0;
  int32_t n_head = 0, n_head_kv = 0;
  int64_t n_layer = 0;
  float eps = 1e-5f, attn_scale = 1.0f;
  int32_t window = 0;  // sliding window (mistral), 0: none
  MupScales mup;       // minicpm's embedding, residual and logit scales (LlamaWeights::mup)
  Weight embed;        // [V, E]
  Weight lm_head;      // [head_rows, E]; the embedding when tied (and whole)
  Vec final_norm;      // [E]
  std::vector<LlamaLayer> layers;
  Rope rope;
  // The MTP layer (LlamaWeights::mtp_layer): its decoder layer, whose KV
  // is pool layer n_layer (LlamaHooks::kv_cache), and its head.
  bool has_mtp = false;
  LlamaLayer mtp_layer;
  MtpHead mtp;

  int64_t qkv_width() const { return Q + 2 * KV; }
  bool has_dense_ffn() const;
  // What Backend::reserve() (or carve_cuda_scratch) sizes for steps of up
  // to max_tokens tokens and max_sample sampled rows.
  StepLimits step_limits(int64_t max_tokens, int64_t max_sample) const;
};

// Places w through `b` inside one Backend::place_model() (so CUDA holds the
// model in one device buffer): fused q/k/v and gate/up, the qkv biases
// zero-filled where a part has none, the head unless tied (w.lm_head when
// tied but sliced: a shard's rows). dims: the widths of w's layers (a
// shard's, after shard_llama_layers), hd and E whole. MoE layers are placed
// through Backend::place_moe. Errors name the tensor.
Result<LlamaGraph> place_llama(Backend& b, const ModelConfig& cfg, const LlamaWeights& w, const LlamaDims& dims,
                               const RopeTable& rope);

// Activation views for up to the limit's tokens (rows), each dense:
//   x [T, E] F32 residual; h [T, E] act; qkv [T, Q + 2 KV] F32; attn [T, Q]
//   act; gu [T, 2 F] F32 and mlp [T, F] act (dense layers only);
//   final_rows [S, E] act.
// "act" is the Backend's act_dtype(). forward uses the first rows of each.
// With muP scales and an act dtype other than F32, the scaled tensors pass
// through F32 first (model/mup_scales.h: scale_into): attn32 [T, Q],
// mlp32 [T, F] and final32 [S, E]; otherwise they are empty.
struct LlamaActivations {
  Tensor x, h, qkv, attn, gu, mlp, final_rows;
  Tensor mtp_h;  // [T, E] act: the MTP head's hnorm(h) (with an MTP layer)
  Tensor attn32, mlp32, final32;
};

// The runtime's part of the graph. Called once per layer (never per
// token): no allocation, no host synchronization on CUDA (decode graphs
// capture them).
class LlamaHooks {
 public:
  virtual ~LlamaHooks() = default;
  // Layer il's paged K and V.
  virtual KvCacheView kv_cache(int64_t il) const = 0;
  // Tensor parallelism: whether this rank's row-parallel products (o, down)
  // accumulate into the residual (rank 0; the others overwrite it), and the
  // sum over ranks after each, before o's bias. Unsharded: true, and no
  // reduction (the bias goes with the matmul).
  virtual bool sharded() const { return false; }
  virtual bool owns_residual() const { return true; }
  virtual Status reduce_residual(Tensor x) {
    (void)x;
    return Status::Ok();
  }
};

// One step: embedding, every layer, the final norm of the sample rows and
// logits [n_sample, head_rows] F32 (dense) from the head; with `hidden`
// ([n_tokens, E] F32), every token's final-normed hidden state too.
// Graph-capturable on CUDA (only Backend ops and the hooks).
Status llama_forward(Backend& b, const LlamaGraph& g, const StepMetadata& step, const LlamaActivations& a,
                     Tensor logits, LlamaHooks& hooks, const Tensor* hidden = nullptr);

// The MTP layer over a step (Model::forward_mtp; requires g.has_mtp, an
// unsharded graph): token j is t_{p+1} at position p, hidden [n_tokens, E]
// the model's final-normed h_p; logits [n_sample, V]; `out` (optional,
// [n_tokens, E] F32) the layer's output before the head's norm.
Status llama_mtp_forward(Backend& b, const LlamaGraph& g, const StepMetadata& step, const LlamaActivations& a,
                         Tensor hidden, Tensor logits, LlamaHooks& hooks, const Tensor* out);

}  // namespace rill
