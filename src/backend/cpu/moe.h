#pragma once
// The mixture-of-experts FFN on the CPU: the reference arithmetic of
// Backend::moe_ffn (backend/backend.h's MoeParams says what it computes),
// which the CPU Backend runs and model/moe.h's MoeFfn binds weights for.
//
// Experts run per token group: the tokens routed to an expert are gathered
// and go through one matmul per weight; an expert no token chose costs
// nothing. Batch invariance: a token's sum runs over its own experts in
// increasing id whatever the other tokens are, and every matmul row is
// computed independently of the other rows (cpu::HostOps contract), so a
// token's output never depends on the batch it is in.
// Options (MoeParams): softmax_after_topk (gpt-oss: top-k of the logits,
// softmax over those k), the clamped SwiGLU (swiglu_limit), GeGLU experts
// (gelu_tanh, Gemma 4); every Linear may carry a bias (the router's, each
// expert's gate/up/down: gpt-oss).
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/linear.h"

namespace rill {

// A SwiGLU (or GeGLU) FFN: down(act(gate x) * up x).
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

// Working memory of cpu::moe_forward, shared by all MoE layers of a model
// (they run one at a time). Grow-only: reserve() allocates, moe_forward never.
struct MoeScratch {
  // Makes room for n_tokens tokens through a layer with parameters p.
  void reserve(const MoeParams& p, int64_t max_tokens);
  bool fits(const MoeParams& p, int64_t n_tokens) const;

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

namespace cpu {

// out [n_tokens, n_embd] = MoE(x [n_tokens, n_embd]) with the router reading
// router_x [n_tokens, n_embd] (x itself but for Gemma 4), as MoeParams says.
// out is overwritten and aliases neither input. Requires
// scratch.fits(p, n_tokens) and ops reserved for w's matrices.
void moe_forward(const MoeParams& p, const MoeWeights& w, const float* router_x, const float* x, int64_t n_tokens,
                 float* out, MoeScratch& scratch, HostOps& ops);

// The CPU's placement of a layer: views of its matrices, copies of its vectors.
MoeWeights moe_weights(const HostMoe& layer);

// Every matrix moe_forward multiplies by, for HostOps::reserve.
void collect_moe_weights(const MoeParams& p, const MoeWeights& w, std::vector<const WeightView*>* out);

}  // namespace cpu
}  // namespace rill
