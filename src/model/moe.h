#pragma once
// MoeFfn: one mixture-of-experts layer of the MoE families (Mixtral,
// Qwen3-MoE, Qwen3-Next, DeepSeek-V3 / GLM-4.5, Gemma 4, gpt-oss) as bound
// from the model files: its MoeParams (backend/backend.h says what the
// layer computes) and weights, checked. A family places it through
// Backend::place_moe (host()) and runs it with Backend::moe_ffn; the CPU
// arithmetic is backend/cpu/moe.h's, which forward() runs directly (tests).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/moe.h"
#include "core/result.h"
#include "loader/model_config.h"
#include "loader/model_files.h"
#include "model/layers.h"

namespace rill {

// The MoE parameters a config declares (n_expert == 0 when it has none);
// with n_routed_experts (DeepSeek-V3, GLM-4.5) the sigmoid router's options
// from the raw config.
MoeParams moe_params(const ModelConfig& c);
// Whether layer il of the config has the MoE FFN (see ModelConfig::n_expert).
bool is_moe_layer(const ModelConfig& c, int64_t il);

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
  // The layer as Backend::place_moe takes it (views of these weights, valid
  // while this MoeFfn lives).
  HostMoe host() const;

  // cpu::moe_forward over these weights (the CPU reference):
  // x: [n_tokens, n_embd], out: [n_tokens, n_embd] (overwritten; must not
  // alias x). Requires scratch.fits(params(), n_tokens).
  void forward(const float* x, int64_t n_tokens, float* out, MoeScratch& scratch, cpu::HostOps& backend) const;
  // The same with the router reading router_x [n_tokens, n_embd] instead
  // of x (Gemma 4 routes its own norm of the residual).
  void forward(const float* router_x, const float* x, int64_t n_tokens, float* out, MoeScratch& scratch,
               cpu::HostOps& backend) const;

 private:
  MoeParams p_;
  MoeWeights w_;
};

}  // namespace rill
