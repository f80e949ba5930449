#pragma once
// MoeFfn: the mixture-of-experts feed-forward layer shared by the MoE
// families (Mixtral, Qwen3-MoE, Qwen3-Next).
//
//   probs  = softmax(router x)                       [n_expert], f32
//   top-k  = the n_expert_used largest probs (ties: lower expert id first),
//            renormalised to sum to 1 when norm_topk_prob, then scaled by
//            expert_scale (when given)
//   (DeepSeek-V3 / GLM-4.5: probs = sigmoid(router x); the choice adds the
//   score bias and, with n_group > 1, keeps only the experts of the
//   topk_group groups whose two best choice scores sum highest, the others
//   scored 0 as transformers masks them; the weights are the chosen probs,
//   renormalised (+1e-20) and times routed_scaling_factor)
//   out    = sum over the token's experts e, in increasing e, of
//            w_e * down_e(silu(gate_e x) * up_e x)
//          + sigmoid(shared_gate . x) * shared(x)   (when there is a shared expert;
//                                                    DeepSeek's has no gate: + shared(x))
// Options (MoeParams): softmax_after_topk (gpt-oss: top-k of the logits,
// softmax over those k), the clamped SwiGLU (swiglu_limit), GeGLU experts
// (gelu_tanh, Gemma 4); every Linear may carry a bias (the router's, each
// expert's gate/up/down: gpt-oss).
//
// Experts run per token group: the tokens routed to an expert are gathered
// and go through one matmul per weight; an expert no token chose costs
// nothing. Batch invariance: a token's sum runs over its own experts in
// increasing id whatever the other tokens are, and every matmul row is
// computed independently of the other rows (cpu::HostOps contract), so a token's
// output never depends on the batch it is in.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "core/result.h"
#include "loader/model_config.h"
#include "loader/model_files.h"
#include "model/layers.h"

namespace rill {

struct MoeParams {
  int64_t n_embd = 0;
  int64_t n_expert = 0;        // routed experts
  int64_t n_expert_used = 0;   // top-k per token, in [1, n_expert]
  int64_t n_ff = 0;            // each routed expert's intermediate size
  bool norm_topk_prob = true;  // renormalise the top-k probabilities
  int64_t n_ff_shared = 0;     // the shared expert's intermediate size; 0: none
  // gpt-oss: the top-k of the router's logits (the router's bias included),
  // then a softmax over those k only (norm_topk_prob does not apply).
  bool softmax_after_topk = false;
  // gpt-oss's clamped SwiGLU when swiglu_limit > 0: with g = min(gate,
  // limit) and u = clamp(up, -limit, limit), act = g * sigmoid(alpha g) *
  // (u + 1). 0: silu(gate) * up.
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  bool gelu_tanh = false;  // experts are GeGLU: gelu_tanh(gate x) * up x (Gemma 4); else SwiGLU
  // DeepSeek-V3 / GLM-4.5 routing; the defaults keep the softmax router.
  bool sigmoid_scores = false;         // scores = sigmoid(router x), each token's weights its chosen scores
  int64_t n_group = 1;                 // experts in n_group equal groups; only the topk_group groups with
  int64_t topk_group = 1;              // the largest sums of their top-2 choice scores are eligible
  float routed_scaling_factor = 1.0f;  // multiplies the routed experts' weights (after norm_topk_prob)
  bool shared_gate = true;             // the shared expert's sigmoid gate (Qwen3-Next); false: weight 1
};

// The MoE parameters a config declares (n_expert == 0 when it has none);
// with n_routed_experts (DeepSeek-V3, GLM-4.5) the sigmoid router's options
// from the raw config.
MoeParams moe_params(const ModelConfig& c);
// Whether layer il of the config has the MoE FFN (see ModelConfig::n_expert).
bool is_moe_layer(const ModelConfig& c, int64_t il);

// A SwiGLU FFN: down(silu(gate x) * up x).
struct GluFfnWeights {
  Linear gate, up;  // [n_ff, n_embd]
  Linear down;      // [n_embd, n_ff]
};

struct MoeWeights {
  Linear router;                        // [n_expert, n_embd]
  std::vector<GluFfnWeights> experts;   // n_expert of them
  std::optional<GluFfnWeights> shared;  // with n_ff_shared
  // Multiplies each chosen expert's weight after the top-k (and its
  // renormalisation): Gemma 4's per_expert_scale. Empty: 1.
  std::vector<float> expert_scale;  // [n_expert]
  Linear shared_gate;               // [1, n_embd]; with `shared` and MoeParams::shared_gate
  // [n_expert] added to the scores for the choice of experts only (DeepSeek's
  // e_score_correction_bias), never to the weights; empty: none.
  std::vector<float> score_bias;
};

// Names under a layer prefix. Defaults: the Qwen layout ("mlp." prefix);
// Mixtral's block_sparse_moe uses w1 (gate), w3 (up), w2 (down).
struct MoeNames {
  std::string router = "gate";
  std::string experts = "experts";
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  std::string shared_expert = "shared_expert";
  std::string shared_expert_gate = "shared_expert_gate";
  std::string score_bias = "gate.e_score_correction_bias";  // loaded when present
};

// Working memory of MoeFfn::forward, shared by all MoE layers of a model
// (they run one at a time). Grow-only: reserve() allocates, forward() never.
class MoeScratch {
 public:
  // Makes room for n_tokens tokens through a layer with parameters p.
  void reserve(const MoeParams& p, int64_t max_tokens);
  bool fits(const MoeParams& p, int64_t n_tokens) const;

 private:
  friend class MoeFfn;
  std::vector<float> logits;        // [n_tokens, n_expert]: router logits, then probabilities
  std::vector<int32_t> top_ids;     // [n_tokens, n_expert_used]
  std::vector<float> top_w;         // [n_tokens, n_expert_used]
  std::vector<int32_t> offsets;     // [n_expert + 1]: start of each expert's rows in the lists below
  std::vector<int32_t> row_token;   // [n_tokens * n_expert_used]: rows grouped by expert, tokens ascending
  std::vector<float> row_weight;    // [n_tokens * n_expert_used]
  std::vector<float> xg, yg;        // [n_tokens, n_embd]: gathered inputs, expert outputs
  std::vector<float> gate, up;      // [n_tokens, max(n_ff, n_ff_shared)]
  std::vector<float> shared_logit;  // [n_tokens]
  std::vector<float> choice;        // [n_expert]: one token's choice scores (biased, group-masked)
  std::vector<float> group_score;   // [n_group]
};

// One layer's weights; immutable after creation.
class MoeFfn {
 public:
  MoeFfn() = default;
  // Checks the weights' shapes against p.
  static Result<MoeFfn> create(const MoeParams& p, MoeWeights weights);

  // Binds the weights under `prefix` (e.g. "model.layers.3.mlp.") and creates.
  // Routed experts are either one tensor per expert,
  //   <experts>.<e>.<gate|up|down>.weight   [n_ff, n_embd] / [n_embd, n_ff],
  // or one 3-D tensor per projection (GGUF's ffn_*_exps),
  //   <experts>.<gate|up|down>.weight       [n_expert, n_ff, n_embd] / [n_expert, n_embd, n_ff].
  // The shared expert gate may be [1, n_embd] or [n_embd] (GGUF).
  static Result<MoeFfn> bind(const ModelFiles& files, const std::string& prefix, const MoeParams& p,
                             const MoeNames& names = {});
  // The Llama family's MoE block of the layer under layer_prefix
  // ("model.layers.3."): Mixtral's block_sparse_moe.{gate, experts.<e>.w1|w3|w2},
  // otherwise (Qwen3-MoE, every GGUF file) mlp.{gate, experts...} with
  // gate/up/down_proj. Gated shared experts are refused (not part of that
  // graph); GLM-4.5's ungated mlp.shared_experts are bound.
  static Result<MoeFfn> bind_llama(const ModelFiles& files, const std::string& layer_prefix);

  const MoeParams& params() const { return p_; }
  const MoeWeights& weights() const { return w_; }
  // Every weight forward() multiplies by, for cpu::HostOps::reserve.
  void collect_weights(std::vector<const WeightView*>* out) const;

  // x: [n_tokens, n_embd], out: [n_tokens, n_embd] (overwritten; must not
  // alias x). Requires scratch.fits(params(), n_tokens).
  void forward(const float* x, int64_t n_tokens, float* out, MoeScratch& scratch, cpu::HostOps& backend) const;
  // The same with the router reading router_x [n_tokens, n_embd] instead
  // of x (Gemma 4 routes its own norm of the residual).
  void forward(const float* router_x, const float* x, int64_t n_tokens, float* out, MoeScratch& scratch,
               cpu::HostOps& backend) const;

 private:
  void route(int64_t n_tokens, MoeScratch& s) const;
  const float* choice_scores(const float* probs, MoeScratch& s) const;
  void run_ffn(const GluFfnWeights& w, const float* x, int64_t n_rows, float* y, MoeScratch& s,
               cpu::HostOps& backend) const;

  MoeParams p_;
  MoeWeights w_;
};

}  // namespace rill
