// The Gemma 2 / Gemma 3 family: gemma2, gemma3_text and the text model of a
// gemma3 (multimodal) checkpoint, from Hugging Face files or GGUF. Against
// the Llama family:
//   embeddings        scaled by sqrt(n_embd)
//   RMSNorm           scales by (1 + w) for HF weights; GGUF converters store
//                     1 + w already (norm_offset 0)
//   sandwich norms    attention and MLP outputs are normed before each
//                     residual add (post_attention / post_feedforward)
//   GeGLU MLP         gelu_tanh(gate) * up
//   attention         scale query_pre_attn_scalar^-1/2; gemma2: logit softcap
//   layer kinds       sliding and full layers (layer_types, else every
//                     `sliding_window_pattern`-th layer is full), each kind
//                     with its own KV group and RoPE base (gemma3:
//                     rope_parameters per layer type / rope_local_base_freq)
//   q/k RMSNorm       over head_dim (gemma3)
//   final logits      gemma2: softcap * tanh(logits / softcap)
//   lm_head           tied to the embedding unless lm_head.weight exists
//
// Gemma 4 (gemma4_text and gemma4's text model) on top, as transformers'
// modeling_gemma4 computes it:
//   norms             scale by w (norm_offset 0); V heads RMS-normed without
//                     a weight; attention scale 1
//   full layers       their own head_dim and KV heads (global_head_dim /
//                     per_layer_config), proportional partial RoPE (the
//                     first pairs of the head rotate, at frequencies over the
//                     whole head); attention_k_eq_v: K (before its norm) is V
//   KV sharing        the last num_kv_shared_layers layers compute only q and
//                     read the KV of the last earlier layer of their kind:
//                     no KV of their own (kv_layers() omits them)
//   per-layer input   ple = (norm(proj(x0) / sqrt(E)) + embed_pl(id) *
//                     sqrt(P)) / sqrt(2), [n_layer, P] per token; after each
//                     layer's MLP: x += norm(proj_l(gelu(gate_l x) * ple_l))
//   layer_scalar      x *= layer_scalar at the end of each layer
//   final logits      softcap
//
// One graph (GemmaGraph, place_gemma, gemma_forward) over Backend ops runs
// on every device; below it the CPU runtime (`gemma.cpu`, a CpuPagedModel)
// and the CUDA runtime's glue (`gemma.cuda`, over model/cuda_model_base.h,
// whose decode graphs capture the forward). The configuration, tensor
// names and RoPE tables are gemma_config.h's.
//
// Two KV groups: sliding layers read and write through the sliding group's
// block tables (whose blocks before the window the engine frees), full
// layers through the full group's; every layer has its plane of blocks,
// and a block id belongs to one group, so only that group's layers touch
// it. One pool with a window per layer would keep every sliding layer's
// whole history resident; with groups the KvManager keeps only the
// window's blocks.
//
// k4c / k4a KV (model/kv_tails.h) on the CPU runtime: every plane keeps
// its tails; a KV-shared layer reads its donor's before the step's last
// reader of that plane moves them (GemmaLayer::kv_read_later). The CUDA
// runtime keeps them for models whose every layer has its own KV and head
// width (gemma_cuda_tails_refusal says why not for the others).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rope_table.h"
#include "model/arch/families.h"
#include "model/arch/gemma4_assistant.h"
#include "model/arch/gemma_config.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/placement.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_gemma4.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {
namespace {

// --- The graph, for every device ---------------------------------------------

// The checkpoint as the files hold it (matrices view the mapping).
struct GemmaWeights {
  GemmaParams params;
  GemmaLayerDims dims{};                   // the sliding (gemma2/3: every) layer's
  std::vector<GemmaLayerDims> layer_dims;  // [n_layer]
  WeightView embed;                        // [V, E]
  WeightView lm_head;                      // [V, E]; the embedding when tied
  bool tied = true;
  std::vector<float> final_norm;  // [E]
  std::vector<GemmaLayerWeights> layers;
  GemmaRope rope;  // sliding layers (local), full layers (global)
  // Gemma 4's per-layer embeddings (params.ple_dim > 0).
  WeightView ple_embed;         // [ple_vocab, n_layer * P]
  WeightView ple_model_proj;    // [n_layer * P, E]
  std::vector<float> ple_norm;  // [P]

  // The layers' matrices, layer 0's q first.
  std::vector<const WeightView*> layer_matrices() const {
    std::vector<const WeightView*> out;
    for (const GemmaLayerWeights& L : layers) {
      for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down, &L.ple_gate, &L.ple_proj}) {
        if (l->w.data) out.push_back(&l->w);
      }
    }
    return out;
  }
};

// Binds the files' weights after checking the config; max_head_dim is the
// runtime's (errors name the file and the field or tensor).
Result<GemmaWeights> bind_gemma(const ModelFiles& f, int64_t max_head_dim) {
  const ModelConfig& cfg = f.config;
  const int64_t E = cfg.n_embd, V = cfg.n_vocab, F = cfg.n_ff;
  if (E <= 0 || V <= 0 || cfg.n_layer <= 0 || cfg.n_head <= 0 || cfg.n_head_kv <= 0 || F <= 0 ||
      cfg.n_head % cfg.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg.n_head) + "/" + std::to_string(cfg.n_head_kv) + ")"};
  }
  const int64_t hd = cfg.head_dim > 0 ? cfg.head_dim : E / cfg.n_head;
  if (hd <= 0 || hd > max_head_dim || hd % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(hd) + " is not supported (even, at most " +
                 std::to_string(max_head_dim) + ")"};
  }
  GemmaWeights w;
  RILL_ASSIGN_OR_RETURN(w.params, read_gemma_params(f));
  const GemmaParams& p = w.params;
  if (!p.gemma4 &&
      ((cfg.rope_dim > 0 && cfg.rope_dim != hd) || cfg.rope_scaling.type == RopeScaling::Type::kProportional)) {
    return Error{f.path + ": partial rotary (" + std::to_string(cfg.rope_dim) + " of " + std::to_string(hd) +
                 " dims) is not part of Gemma 2 / Gemma 3"};
  }
  if (p.moe && (cfg.n_expert <= 0 || cfg.n_expert_used <= 0 || cfg.n_ff_expert <= 0)) {
    return Error{f.path + "/config.json: enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size"};
  }
  w.dims.n_embd = E;
  w.dims.q_width = cfg.n_head * hd;
  w.dims.kv_width = cfg.n_head_kv * hd;
  w.dims.n_ff = F;
  w.dims.head_dim = hd;
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    GemmaLayerDims d = w.dims;
    if (p.gemma4) {
      const auto l = static_cast<size_t>(il);
      d.head_dim = p.head_dim[l];
      d.q_width = cfg.n_head * d.head_dim;
      d.kv_width = p.n_head_kv[l] * d.head_dim;
      d.n_ff = p.n_ff[l];
      d.has_kv = p.kv_donor[l] == il;
      d.has_v = !(p.k_eq_v && !p.sliding[l]);
      d.ple_dim = p.ple_dim;
      d.gemma4 = true;
      if (p.moe) {
        d.moe.n_embd = E;
        d.moe.n_expert = cfg.n_expert;
        d.moe.n_expert_used = cfg.n_expert_used;
        d.moe.n_ff = cfg.n_ff_expert;
        d.moe.norm_topk_prob = true;  // transformers' Gemma4TextRouter always renormalises
        d.moe.gelu_tanh = true;       // the experts use hidden_activation
      }
      if (d.head_dim > max_head_dim || d.n_ff <= 0) {
        return Error{f.path + ": layer " + std::to_string(il) + "'s head_dim " + std::to_string(d.head_dim) +
                     " is not supported (at most " + std::to_string(max_head_dim) + ")"};
      }
    }
    w.layer_dims.push_back(d);
  }
  const GemmaNames names = gemma_tensor_names(f);
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, names.base + "embed_tokens.weight", V, E));
  w.lm_head = w.embed;
  w.tied = !f.find(names.head);
  if (!w.tied) {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, names.head, V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, names.base + "norm.weight", E));
  if (p.ple_dim > 0) {
    const int64_t LP = cfg.n_layer * p.ple_dim;
    RILL_ASSIGN_OR_RETURN(w.ple_embed, bind_matrix(f, names.base + "embed_tokens_per_layer.weight", p.ple_vocab, LP));
    RILL_ASSIGN_OR_RETURN(w.ple_model_proj, bind_matrix(f, names.base + "per_layer_model_projection.weight", LP, E));
    RILL_ASSIGN_OR_RETURN(w.ple_norm, load_vector(f, names.base + "per_layer_projection_norm.weight", p.ple_dim));
  }
  w.layers.resize(static_cast<size_t>(cfg.n_layer));
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    const auto l = static_cast<size_t>(il);
    GemmaLayerWeights& L = w.layers[l];
    RILL_TRY(bind_gemma_layer(f, names, il, w.layer_dims[l], L));
    if (w.layer_dims[l].has_kv && !w.layer_dims[l].has_v) L.v = L.k;  // K as V: v is K before its norm
  }
  w.rope = gemma_rope_tables(f, w.params, hd);
  return w;
}

// One layer as the Backend placed it: q/k/v as one weight, gate/up as one.
struct GemmaLayer {
  bool sliding = false;  // attends to the last `window` tokens, through the sliding KV group
  int32_t hd = 0, n_head_kv = 0;
  int64_t Q = 0, KV = 0, F = 0;  // q width, one K (V) row, MLP width
  bool stores_kv = true;         // false: reads kv_layer's KV (Gemma 4's KV sharing); wqkv is q only
  int32_t kv_layer = 0;          // the KV plane it reads (and writes when stores_kv)
  bool kv_read_later = false;    // a later layer reads kv_layer's KV too (AttentionOp::tail_read_later)
  float layer_scalar = 1.0f;
  Vec attn_norm;       // [E]
  Weight wqkv;         // [Q + 2 KV, E]; [Q, E] when !stores_kv
  Vec bqkv;            // [Q + 2 KV] (zeros for a part without one) or absent
  Vec q_norm, k_norm;  // [hd], gemma3 only
  Weight wo;           // [E, Q]
  Vec bo;              // [E] or absent
  Vec post_attn_norm;  // [E]
  Vec ffn_norm;        // [E]
  Weight w_gate_up;    // [2 F, E]
  Weight w_down;       // [E, F]
  Vec post_ffn_norm;   // [E]
  bool moe = false;    // Gemma 4's MoE block beside the MLP (Backend::moe_ffn over `experts`)
  MoeWeight experts;
  Vec router_norm, pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2;  // [E]
  Weight w_ple_gate;                                                  // [P, E]; Gemma 4's per-layer input
  Weight w_ple_proj;                                                  // [E, P]
  Vec post_ple_norm;                                                  // [E]

  int64_t qkv_width() const { return stores_kv ? Q + 2 * KV : Q; }
};

struct GemmaGraph {
  int64_t E = 0, F = 0, hd = 0, Q = 0, KV = 0, V = 0;  // the widest layer's F, hd, Q, q/k/v row
  int64_t QKV = 0;
  int32_t n_head = 0, n_head_kv = 0;
  bool v_norm = false;  // Gemma 4
  bool any_moe = false;
  int64_t P = 0;  // Gemma 4's per-layer input width; 0: none
  float ple_embed_scale = 1.0f, ple_proj_scale = 1.0f;
  Weight ple_embed;                  // [ple_vocab, n_layer * P]
  Weight ple_model_proj;             // [n_layer * P, E]
  Vec ple_norm;                      // [P]
  std::vector<int32_t> kv_layer_of;  // [n_kv_layers]: the model layer each KV plane belongs to
  float eps = 1e-6f;
  float norm_offset = 1.0f;  // RMSNorm scales by (norm_offset + w)
  float embed_scale = 1.0f;  // sqrt(E), in f32 as HF multiplies in the activation dtype
  float attn_scale = 1.0f, attn_softcap = 0.0f, final_softcap = 0.0f;
  int32_t window = 0;                           // sliding layers' window
  int32_t kv_window = 0;                        // the sliding group's: window, or more for Gemma 4's assistant
  int32_t sliding_group = -1, full_group = -1;  // KV groups (kv_spec()), -1: no such layers
  Weight embed;                                 // [V, E]
  Weight lm_head;                               // [V, E]; the embedding when tied
  Vec final_norm;                               // [E]
  std::vector<GemmaLayer> layers;
  Rope rope_local, rope_global;  // sliding layers, full layers

  int64_t qkv_width() const { return QKV; }
  StepLimits step_limits(int64_t max_tokens, int64_t max_sample) const {
    StepLimits l;
    l.max_tokens = max_tokens;
    l.n_head = n_head;
    l.head_dim = static_cast<int32_t>(hd);
    l.embedding = &embed;
    l.lm_head = &lm_head;
    l.max_head_tokens = max_sample;
    return l;
  }
  // The KV groups: sliding first, then full (the kinds present), each with
  // its layers' row width (Gemma 4's differ); sets sliding_group and
  // full_group.
  KvSpec make_kv_spec() {
    KvSpec spec;
    int64_t sliding_width = -1, full_width = -1;
    for (const GemmaLayer& L : layers) (L.sliding ? sliding_width : full_width) = L.KV;
    if (sliding_width >= 0) {
      sliding_group = static_cast<int32_t>(spec.size());
      spec.push_back(sliding(std::max(window, kv_window), sliding_width));
    }
    if (full_width >= 0) {
      full_group = static_cast<int32_t>(spec.size());
      spec.push_back(full(full_width));
    }
    return spec;
  }
  int32_t group_of(const GemmaLayer& L) const { return L.sliding ? sliding_group : full_group; }
  // The width of each KV plane (one per layer that stores KV).
  std::vector<int64_t> kv_widths() const {
    std::vector<int64_t> out;
    for (const int32_t il : kv_layer_of) out.push_back(layers[static_cast<size_t>(il)].KV);
    return out;
  }
  // The shape of each KV plane (its types left for CpuPagedModel::create_kv).
  std::vector<PagedKvCache::LayerSpec> kv_planes() const {
    std::vector<PagedKvCache::LayerSpec> out;
    for (const int32_t il : kv_layer_of) {
      const GemmaLayer& L = layers[static_cast<size_t>(il)];
      out.push_back({L.n_head_kv, L.hd, {}});
    }
    return out;
  }
  // The layers that store KV, in their kind's group (KV-shared layers own none).
  std::vector<Model::KvLayer> kv_layers(DType dtype) const {
    std::vector<Model::KvLayer> out;
    for (const int32_t il : kv_layer_of) {
      const GemmaLayer& L = layers[static_cast<size_t>(il)];
      out.push_back({group_of(L), dtype, row_bytes(dtype, L.KV)});
    }
    return out;
  }
};

// One layer's weights through `b` (names prefixed by p); L's shape is set.
Status place_layer(Backend& b, const GemmaLayerWeights& h, const std::string& p, bool ple, GemmaLayer& L) {
  auto vec = [&](const std::vector<float>& v, const std::string& name) {
    return b.place_vector(v.data(), static_cast<int64_t>(v.size()), p + name);
  };
  RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(h.attn_norm, "input_layernorm.weight"));
  if (L.stores_kv) {
    RILL_TRY(place_fused_qkv(b, h.q, h.k, h.v, p, L.wqkv, L.bqkv));
  } else {
    const HostMatrix qm = host_matrix(h.q.w);
    RILL_ASSIGN_OR_RETURN(L.wqkv, b.place(&qm, 1, p + "self_attn.q_proj"));
    if (!h.q.bias.empty()) {
      RILL_ASSIGN_OR_RETURN(L.bqkv, vec(h.q.bias, "self_attn.q_proj.bias"));
    }
  }
  if (!h.q_norm.empty()) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, vec(h.q_norm, "self_attn.q_norm.weight"));
  }
  if (!h.k_norm.empty()) {
    RILL_ASSIGN_OR_RETURN(L.k_norm, vec(h.k_norm, "self_attn.k_norm.weight"));
  }
  const HostMatrix om = host_matrix(h.o.w);
  RILL_ASSIGN_OR_RETURN(L.wo, b.place(&om, 1, p + "self_attn.o_proj"));
  if (!h.o.bias.empty()) {
    RILL_ASSIGN_OR_RETURN(L.bo, vec(h.o.bias, "self_attn.o_proj.bias"));
  }
  RILL_ASSIGN_OR_RETURN(L.post_attn_norm, vec(h.post_attn_norm, "post_attention_layernorm.weight"));
  RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(h.ffn_norm, "pre_feedforward_layernorm.weight"));
  const HostMatrix gu[] = {host_matrix(h.gate.w), host_matrix(h.up.w)};
  RILL_ASSIGN_OR_RETURN(L.w_gate_up, b.place(gu, 2, p + "mlp.{gate,up}_proj"));
  const HostMatrix dm = host_matrix(h.down.w);
  RILL_ASSIGN_OR_RETURN(L.w_down, b.place(&dm, 1, p + "mlp.down_proj"));
  RILL_ASSIGN_OR_RETURN(L.post_ffn_norm, vec(h.post_ffn_norm, "post_feedforward_layernorm.weight"));
  if (L.moe) {
    RILL_ASSIGN_OR_RETURN(L.experts, b.place_moe(h.moe->host(), p + "experts"));
    RILL_ASSIGN_OR_RETURN(L.router_norm, vec(h.router_norm, "router.scale"));
    RILL_ASSIGN_OR_RETURN(L.pre_ffn_norm_2, vec(h.pre_ffn_norm_2, "pre_feedforward_layernorm_2.weight"));
    RILL_ASSIGN_OR_RETURN(L.post_ffn_norm_1, vec(h.post_ffn_norm_1, "post_feedforward_layernorm_1.weight"));
    RILL_ASSIGN_OR_RETURN(L.post_ffn_norm_2, vec(h.post_ffn_norm_2, "post_feedforward_layernorm_2.weight"));
  }
  if (ple) {
    const HostMatrix pg = host_matrix(h.ple_gate.w), pp = host_matrix(h.ple_proj.w);
    RILL_ASSIGN_OR_RETURN(L.w_ple_gate, b.place(&pg, 1, p + "per_layer_input_gate"));
    RILL_ASSIGN_OR_RETURN(L.w_ple_proj, b.place(&pp, 1, p + "per_layer_projection"));
    RILL_ASSIGN_OR_RETURN(L.post_ple_norm, vec(h.post_ple_norm, "post_per_layer_input_norm.weight"));
  }
  return Status::Ok();
}

// One pass of place_gemma's placement (Backend::place_model may run it twice).
Status place_pass(Backend& b, const GemmaWeights& w, GemmaGraph& g) {
  RILL_TRY(place_embedding_and_head(b, w.embed, w.lm_head, w.tied, w.final_norm, g.embed, g.lm_head, g.final_norm));
  for (size_t il = 0; il < w.layers.size(); ++il) {
    RILL_TRY(place_layer(b, w.layers[il], "layers." + std::to_string(il) + ".", g.P > 0, g.layers[il]));
  }
  if (g.P > 0) {
    const HostMatrix pe = host_matrix(w.ple_embed), pm = host_matrix(w.ple_model_proj);
    RILL_ASSIGN_OR_RETURN(g.ple_embed, b.place(&pe, 1, "embed_tokens_per_layer.weight"));
    RILL_ASSIGN_OR_RETURN(g.ple_model_proj, b.place(&pm, 1, "per_layer_model_projection.weight"));
    RILL_ASSIGN_OR_RETURN(g.ple_norm, b.place_vector(w.ple_norm.data(), g.P, "per_layer_projection_norm.weight"));
  }
  RILL_ASSIGN_OR_RETURN(g.rope_local, b.place_rope(w.rope.local));
  RILL_ASSIGN_OR_RETURN(g.rope_global, b.place_rope(w.rope.global));
  return Status::Ok();
}

// Gemma 4's assistant (ModelOptions::gemma4_assistant, model/arch/
// gemma4_assistant.h) as placed beside its target: layers without KV of
// their own (GemmaLayer::kv_layer: the target's plane they read), the
// projections from and to the target's width, its tied lm_head.
struct AssistantGraph {
  int64_t E = 0, Et = 0, V = 0, Q = 0, F = 0;  // Q, F: the widest layer's
  int32_t n_head = 0, hd = 0;                  // hd: the widest layer's
  int32_t window = 0;                          // its sliding layers' keys (sliding_window + 1)
  float eps = 1e-6f;
  std::vector<GemmaLayer> layers;
  Weight pre_projection;   // [E, 2 Et]
  Weight post_projection;  // [Et, E]
  Weight lm_head;          // [V, E], gathered too (ordered embeddings)
  Vec final_norm;          // [E]
  Rope rope_local, rope_global;
  // Ordered embeddings (Backend::ordered_logits): n_centroids groups of V / C
  // tokens, the top_k groups' tokens scored.
  bool ordered = false;
  int32_t n_centroids = 0, top_k = 0;
  Weight centroids;       // [C, E]
  Buffer token_ordering;  // [V] int32 in the Backend's memory

  int64_t n_picked() const { return ordered ? int64_t{top_k} * (V / n_centroids) : 0; }
};

// The assistant's shapes; its layers read the planes of the target's
// layers Gemma4AssistantWeights::target_layer names.
AssistantGraph shape_assistant(const Gemma4AssistantWeights& w, const GemmaGraph& g) {
  AssistantGraph a;
  a.E = w.n_embd;
  a.Et = w.backbone_embd;
  a.V = w.n_vocab;
  a.n_head = w.n_head;
  a.window = w.window;
  a.eps = w.eps;
  a.ordered = w.ordered;
  a.n_centroids = static_cast<int32_t>(w.n_centroids);
  a.top_k = static_cast<int32_t>(w.centroid_top_k);
  a.layers.assign(w.layers.size(), GemmaLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) {
    GemmaLayer& L = a.layers[il];
    const GemmaLayerDims& d = w.layer_dims[il];
    L.sliding = w.params.sliding[il];
    L.hd = static_cast<int32_t>(d.head_dim);
    L.n_head_kv = static_cast<int32_t>(d.kv_width / d.head_dim);
    L.Q = d.q_width;
    L.KV = d.kv_width;
    L.F = d.n_ff;
    L.stores_kv = false;
    L.kv_layer = g.layers[static_cast<size_t>(w.target_layer[il])].kv_layer;
    L.layer_scalar = w.layers[il].layer_scalar;
    a.Q = std::max(a.Q, L.Q);
    a.F = std::max(a.F, L.F);
    a.hd = std::max(a.hd, L.hd);
  }
  return a;
}

// One pass of the assistant's placement, inside the target's place_model.
Status place_assistant_pass(Backend& b, const Gemma4AssistantWeights& w, AssistantGraph& a) {
  for (size_t il = 0; il < w.layers.size(); ++il) {
    RILL_TRY(place_layer(b, w.layers[il], "assistant.layers." + std::to_string(il) + ".", false, a.layers[il]));
  }
  const HostMatrix pre = host_matrix(w.pre_projection), post = host_matrix(w.post_projection);
  RILL_ASSIGN_OR_RETURN(a.pre_projection, b.place(&pre, 1, "assistant.pre_projection"));
  RILL_ASSIGN_OR_RETURN(a.post_projection, b.place(&post, 1, "assistant.post_projection"));
  HostMatrix head = host_matrix(w.lm_head);
  head.gathered = true;  // kept in its precision: the ordered head reads f32 / f16 / bf16 rows
  if (w.ordered && head.dtype != DType::kF32 && head.dtype != DType::kF16 && head.dtype != DType::kBF16) {
    return Error{w.files->path + ": lm_head dtype " + std::string(dtype_name(head.dtype)) +
                 " (the centroid-ordered head takes f32, f16 or bf16 weights)"};
  }
  RILL_ASSIGN_OR_RETURN(a.lm_head, b.place(&head, 1, "assistant.lm_head"));
  if (w.ordered) {
    const HostMatrix c = host_matrix(w.centroids);
    RILL_ASSIGN_OR_RETURN(a.centroids, b.place(&c, 1, "assistant.masked_embedding.centroids"));
  }
  RILL_ASSIGN_OR_RETURN(a.final_norm, b.place_vector(w.final_norm.data(), a.E, "assistant.norm.weight"));
  RILL_ASSIGN_OR_RETURN(a.rope_local, b.place_rope(w.rope.local));
  RILL_ASSIGN_OR_RETURN(a.rope_global, b.place_rope(w.rope.global));
  return Status::Ok();
}

// Places w (and the assistant, when given: its graph into *ag) through `b`
// inside one Backend::place_model() (CUDA: one device buffer). Errors name
// the tensor.
Result<GemmaGraph> place_gemma(Backend& b, const ModelConfig& cfg, const GemmaWeights& w,
                               const Gemma4AssistantWeights* assistant = nullptr, AssistantGraph* ag = nullptr) {
  if (w.params.gemma4 && !b.has_gemma4_ops()) {
    return Error{std::string("the ") + b.name() + " Backend has no Gemma 4 ops"};
  }
  GemmaGraph g;
  g.E = w.dims.n_embd;
  g.V = cfg.n_vocab;
  g.n_head = static_cast<int32_t>(cfg.n_head);
  g.n_head_kv = static_cast<int32_t>(cfg.n_head_kv);
  g.eps = cfg.rms_norm_eps;
  g.norm_offset = w.params.norm_offset;
  g.embed_scale = std::sqrt(static_cast<float>(g.E));
  g.attn_scale = 1.0f / std::sqrt(w.params.query_pre_attn_scalar);
  g.attn_softcap = w.params.attn_softcap;
  g.final_softcap = w.params.final_softcap;
  g.window = static_cast<int32_t>(cfg.sliding_window);
  g.v_norm = w.params.gemma4;
  g.P = w.params.ple_dim;
  g.ple_embed_scale = std::sqrt(static_cast<float>(g.P));
  g.ple_proj_scale = 1.0f / std::sqrt(static_cast<float>(g.E));
  g.layers.assign(w.layers.size(), GemmaLayer{});
  std::vector<int32_t> plane_of(w.layers.size(), -1);  // a storing layer's KV plane
  g.QKV = g.Q = g.KV = g.F = g.hd = 0;
  for (size_t il = 0; il < w.layers.size(); ++il) {
    GemmaLayer& L = g.layers[il];
    const GemmaLayerDims& d = w.layer_dims[il];
    L.sliding = w.params.sliding[il] && cfg.sliding_window > 0;
    L.hd = static_cast<int32_t>(d.head_dim);
    L.n_head_kv = static_cast<int32_t>(d.kv_width / d.head_dim);
    L.Q = d.q_width;
    L.KV = d.kv_width;
    L.F = d.n_ff;
    L.stores_kv = d.has_kv;
    L.layer_scalar = w.layers[il].layer_scalar;
    L.moe = w.layers[il].moe.has_value();
    g.any_moe = g.any_moe || L.moe;
    if (L.stores_kv) {
      plane_of[il] = static_cast<int32_t>(g.kv_layer_of.size());
      g.kv_layer_of.push_back(static_cast<int32_t>(il));
    }
    const size_t donor = w.params.gemma4 ? static_cast<size_t>(w.params.kv_donor[il]) : il;
    L.kv_layer = plane_of[donor];
    g.QKV = std::max(g.QKV, L.qkv_width());
    g.Q = std::max(g.Q, L.Q);
    g.KV = std::max(g.KV, L.KV);
    g.F = std::max(g.F, L.F);
    g.hd = std::max<int64_t>(g.hd, L.hd);
  }
  // k4c's tails move with the step's last reader of each plane (the
  // assistant reads the target's KV in steps of its own).
  std::vector<bool> read_later(g.kv_layer_of.size(), false);
  for (size_t il = g.layers.size(); il-- > 0;) {
    GemmaLayer& L = g.layers[il];
    L.kv_read_later = read_later[static_cast<size_t>(L.kv_layer)];
    read_later[static_cast<size_t>(L.kv_layer)] = true;
  }
  if (assistant) {
    *ag = shape_assistant(*assistant, g);
    // Its sliding layers read keys [p - window, p] for a query after p;
    // a sequence of p + 1 tokens keeps [p + 2 - kv_window, p] (kv/kv_spec.h).
    g.kv_window = ag->window + 1;
  }
  RILL_TRY(b.place_model([&]() -> Status {
    RILL_TRY(place_pass(b, w, g));
    return assistant ? place_assistant_pass(b, *assistant, *ag) : Status::Ok();
  }));
  if (assistant && assistant->ordered) {
    const size_t bytes = assistant->token_ordering.size() * sizeof(int32_t);
    RILL_ASSIGN_OR_RETURN(ag->token_ordering, b.allocate(bytes, "the assistant's token_ordering"));
    RILL_TRY(b.copy_in(ag->token_ordering.data(), assistant->token_ordering.data(), bytes));
  }
  return g;
}

// The step limits of a Gemma graph (and its assistant's: its heads may be
// more or wider than the target's).
StepLimits gemma_step_limits(const GemmaGraph& g, const AssistantGraph* ag, int64_t max_tokens, int64_t max_sample) {
  StepLimits l = g.step_limits(max_tokens, max_sample);
  if (ag) {
    l.n_head = std::max(l.n_head, ag->n_head);
    l.head_dim = std::max(l.head_dim, ag->hd);
  }
  return l;
}

// Activation views for up to the limit's tokens (rows), each dense:
//   x [T, E] F32 residual; h [T, E] act (normed); qkv [T, Q + 2 KV] F32;
//   attn [T, Q] act; y [T, E] F32 (o / down output before its post-norm);
//   gu [T, 2 F] F32; mlp [T, F] act; final_rows [S, E] act (the widest
//   layer's widths: a layer takes dense views of its own).
// Gemma 4's per-layer input (P > 0): ple [T, n_layer * P] F32 (every
// layer's input), ple_tmp [T, n_layer * P] F32, pl_gate [T, P] F32, pl_act
// [T, P] act, xa [T, E] act (x as a matmul input).
// Gemma 4's MoE block: router_in, moe_in [T, E] act (moe_ffn's inputs),
// moe_out [T, E] F32.
struct GemmaActivations {
  Tensor x, h, qkv, attn, y, gu, mlp, final_rows;
  Tensor ple, ple_tmp, pl_gate, pl_act, xa;
  Tensor router_in, moe_in, moe_out;
};

// The first rows x cols of t's memory as a dense view (a layer narrower than
// the widest).
Tensor dense_view(const Tensor& t, int64_t rows, int64_t cols) {
  return Tensor::dense(t.data, t.dtype, rows, cols);
}

// One step: embedding, (Gemma 4) the per-layer inputs, every layer, the
// final norm of the sample rows and logits [n_sample, V] F32 (softcapped
// when the config says). kv: every KV plane (GemmaGraph::kv_layer_of). Only
// Backend ops: graph-capturable on CUDA. Each layer's pre-norms come out of
// the previous post_norm_add (the first from rms_norm) unless a layer
// scalar sits between. hidden (may be null): every token's final-normed
// hidden state [n_tokens, E] F32 (Model::forward_hidden).
Status gemma_forward(Backend& b, const GemmaGraph& g, const StepMetadata& md, const GemmaActivations& a,
                     const std::vector<KvCacheView>& kv, Tensor logits, const Tensor* hidden = nullptr) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n), y = a.y.rows_from(0, n);
  const float eps = g.eps, off = g.norm_offset;
  b.embed(g.embed, md.ids, n, x);
  b.scale(x, g.embed_scale);
  if (g.P > 0) {
    // ple = (norm(proj(x) / sqrt(E)) + embed_pl(ids) * sqrt(P)) / sqrt(2),
    // normed per layer's P columns: [n, L*P] is [n*L, P] row by row.
    const int64_t LP = static_cast<int64_t>(g.layers.size()) * g.P;
    const Tensor ple = a.ple.rows_from(0, n), tmp = a.ple_tmp.rows_from(0, n), xa = a.xa.rows_from(0, n);
    b.embed(g.ple_embed, md.ids, n, ple);
    b.scale(ple, g.ple_embed_scale);
    b.convert(x, xa);
    RILL_TRY(b.matmul(g.ple_model_proj, xa, tmp, false));
    b.scale(tmp, g.ple_proj_scale);
    const int64_t rows = n * LP / g.P;
    b.post_norm_add(Tensor::dense(tmp.data, DType::kF32, rows, g.P), g.ple_norm,
                    Tensor::dense(ple.data, DType::kF32, rows, g.P), {}, eps, off, {});
    b.scale(ple, static_cast<float>(1.0 / std::sqrt(2.0)));
  }
  b.rms_norm(x, nullptr, g.layers[0].attn_norm, eps, off, h);
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const GemmaLayer& L = g.layers[il];
    const Tensor qkv = dense_view(a.qkv, n, L.qkv_width()), attn = dense_view(a.attn, n, L.Q);
    const Tensor gu = dense_view(a.gu, n, 2 * L.F), mlp = dense_view(a.mlp, n, L.F);
    RILL_TRY(b.matmul(L.wqkv, h, qkv, false, L.bqkv));
    RopeKvOp rk;
    rk.qkv = qkv;
    rk.n_head = g.n_head;
    rk.n_head_kv = L.stores_kv ? L.n_head_kv : 0;
    rk.head_dim = L.hd;
    rk.norm_eps = eps;
    rk.norm_offset = off;
    rk.q_norm = L.q_norm;
    rk.k_norm = L.k_norm;
    rk.v_norm = g.v_norm;
    rk.rope = L.sliding ? g.rope_local : g.rope_global;
    rk.kv = kv[static_cast<size_t>(L.kv_layer)];
    rk.kv_group = g.group_of(L);
    b.rope_store_kv(rk, md);
    AttentionOp at;
    at.q = qkv.cols_from(0, L.Q);
    at.out = attn;
    at.n_head = g.n_head;
    at.n_head_kv = L.n_head_kv;
    at.head_dim = L.hd;
    at.scale = g.attn_scale;
    at.softcap = g.attn_softcap;
    at.window = L.sliding ? g.window : 0;
    at.kv = rk.kv;
    at.kv_group = rk.kv_group;
    at.tail_read_later = L.kv_read_later;
    b.attention(at, md);
    RILL_TRY(b.matmul(L.wo, attn, y, false, L.bo));
    b.post_norm_add(y, L.post_attn_norm, x, L.ffn_norm, eps, off, h);
    RILL_TRY(b.matmul_glu(L.w_gate_up, h, Glu::kGeluTanh, gu, mlp));
    RILL_TRY(b.matmul(L.w_down, mlp, y, false));
    if (L.moe) {
      // y = norm_1(mlp) + norm_2(experts(norm_pre_2(x)), routed by norm(x) * scale / sqrt(E))
      const Tensor r_in = a.router_in.rows_from(0, n), m_in = a.moe_in.rows_from(0, n);
      const Tensor m_out = a.moe_out.rows_from(0, n);
      b.rms_norm(y, nullptr, L.post_ffn_norm_1, eps, off, y);
      b.rms_norm(x, nullptr, L.router_norm, eps, 0.0f, r_in);
      b.rms_norm(x, nullptr, L.pre_ffn_norm_2, eps, off, m_in);
      RILL_TRY(b.moe_ffn(L.experts, r_in, m_in, m_out, false, md));
      b.post_norm_add(m_out, L.post_ffn_norm_2, y, {}, eps, off, {});
    }
    const Vec next_norm = il + 1 < g.layers.size() ? g.layers[il + 1].attn_norm : Vec{};
    const bool scaled = L.layer_scalar != 1.0f;
    if (g.P == 0 && !scaled) {
      b.post_norm_add(y, L.post_ffn_norm, x, next_norm, eps, off, h);
      continue;
    }
    b.post_norm_add(y, L.post_ffn_norm, x, {}, eps, off, h);
    if (g.P > 0) {
      // x += norm(proj(gelu(gate x) * ple_l))
      const Tensor xa = a.xa.rows_from(0, n), pg = a.pl_gate.rows_from(0, n), pa = a.pl_act.rows_from(0, n);
      b.convert(x, xa);
      RILL_TRY(b.matmul(L.w_ple_gate, xa, pg, false));
      b.glu_split(Glu::kGeluTanh, pg, a.ple.rows_from(0, n).cols_from(static_cast<int64_t>(il) * g.P, g.P), pa);
      RILL_TRY(b.matmul(L.w_ple_proj, pa, y, false));
      b.post_norm_add(y, L.post_ple_norm, x, scaled ? Vec{} : next_norm, eps, off, h);
    }
    if (scaled) {
      b.scale(x, L.layer_scalar);
      if (next_norm) b.rms_norm(x, nullptr, next_norm, eps, off, h);
    }
  }
  if (hidden) b.rms_norm(x, nullptr, g.final_norm, eps, off, hidden->rows_from(0, n));
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  b.rms_norm(x, md.sample_rows, g.final_norm, eps, off, final_rows);
  RILL_TRY(b.matmul(g.lm_head, final_rows, logits, false));
  if (g.final_softcap > 0) b.softcap(logits, g.final_softcap);
  return Status::Ok();
}

// The assistant's activations for up to the limit's tokens (rows): in [T,
// 2 Et] act (target embedding | target hidden), emb [T, Et] F32, x, y [T,
// E] F32, h [T, E] act, q [T, Q] F32, attn [T, Q] act, gu [T, 2 F] F32,
// mlp [T, F] act, out [T, Et] F32 (post_projection), rows [S, E] act (the
// sample rows' final-normed states, the heads' input); ordered embeddings:
// rows_f32 [S, E] F32 (the same rows for ordered_logits; rows itself where
// act is F32), scores [S, C] F32 (centroid logits), picked [S, n_picked]
// int32 and dots [S, n_picked] F32 (ordered_logits' scratch).
struct AssistantActivations {
  Tensor in, emb, x, h, y, q, attn, gu, mlp, out, rows, rows_f32, scores;
  int32_t* picked = nullptr;
  float* dots = nullptr;
};

// The assistant's layers over a.in (Model::forward_mtp's contract, see
// assistant_forward). Queries rotate one past their batch position (p + 1)
// and attend through md to the target's keys [0, p] (full layers) or [p -
// window, p] (sliding). Writes no KV. Leaves the sample rows' final-normed
// states in a.rows (and a.rows_f32) and, when `out` is set, every token's
// post_projection in a.out. Only Backend ops.
Status assistant_layers(Backend& b, const GemmaGraph& g, const AssistantGraph& ag, const StepMetadata& md,
                        const AssistantActivations& a, const std::vector<KvCacheView>& kv, bool out) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n), y = a.y.rows_from(0, n);
  const float eps = ag.eps;
  RILL_TRY(b.matmul(ag.pre_projection, a.in.rows_from(0, n), x, false));
  b.rms_norm(x, nullptr, ag.layers[0].attn_norm, eps, 0.0f, h);
  for (size_t il = 0; il < ag.layers.size(); ++il) {
    const GemmaLayer& L = ag.layers[il];
    const Tensor q = dense_view(a.q, n, L.Q), attn = dense_view(a.attn, n, L.Q);
    const Tensor gu = dense_view(a.gu, n, 2 * L.F), mlp = dense_view(a.mlp, n, L.F);
    RILL_TRY(b.matmul(L.wqkv, h, q, false, L.bqkv));
    RopeKvOp rk;  // q only: the target's KV is read, never written
    rk.qkv = q;
    rk.n_head = ag.n_head;
    rk.head_dim = L.hd;
    rk.norm_eps = eps;
    rk.q_norm = L.q_norm;
    rk.rope = L.sliding ? ag.rope_local : ag.rope_global;
    rk.pos_offset = 1;
    b.rope_store_kv(rk, md);
    AttentionOp at;
    at.q = q;
    at.out = attn;
    at.n_head = ag.n_head;
    at.n_head_kv = L.n_head_kv;
    at.head_dim = L.hd;
    at.window = L.sliding ? ag.window : 0;
    at.kv = kv[static_cast<size_t>(L.kv_layer)];
    at.kv_group = L.sliding ? g.sliding_group : g.full_group;
    b.attention(at, md);
    RILL_TRY(b.matmul(L.wo, attn, y, false, L.bo));
    b.post_norm_add(y, L.post_attn_norm, x, L.ffn_norm, eps, 0.0f, h);
    RILL_TRY(b.matmul_glu(L.w_gate_up, h, Glu::kGeluTanh, gu, mlp));
    RILL_TRY(b.matmul(L.w_down, mlp, y, false));
    const Vec next_norm = il + 1 < ag.layers.size() ? ag.layers[il + 1].attn_norm : Vec{};
    if (L.layer_scalar == 1.0f) {
      b.post_norm_add(y, L.post_ffn_norm, x, next_norm, eps, 0.0f, h);
      continue;
    }
    b.post_norm_add(y, L.post_ffn_norm, x, {}, eps, 0.0f, h);
    b.scale(x, L.layer_scalar);
    if (next_norm) b.rms_norm(x, nullptr, next_norm, eps, 0.0f, h);
  }
  if (out) {
    b.rms_norm(x, nullptr, ag.final_norm, eps, 0.0f, h);  // every row: post_projection reads them all
    RILL_TRY(b.matmul(ag.post_projection, h, a.out.rows_from(0, n), false));
  }
  const int32_t ns = md.n_sample;
  if (ns > 0) b.rms_norm(x, md.sample_rows, ag.final_norm, eps, 0.0f, a.rows.rows_from(0, ns));
  if (ns > 0 && ag.ordered && a.rows_f32.data != a.rows.data) {
    b.rms_norm(x, md.sample_rows, ag.final_norm, eps, 0.0f, a.rows_f32.rows_from(0, ns));
  }
  return Status::Ok();
}

// The assistant over a step (Model::forward_mtp): token t is t_{p+1} at
// batch position p and hidden's row t the target's final-normed hidden
// state at p ([n, Et] F32); its input is [embed_target(t) * sqrt(Et) | h].
// logits [n_sample, V] F32: the tied lm_head over the sample rows, or with
// ordered embeddings the top centroids' tokens (Backend::ordered_logits).
// out: every token's post_projection into a.out (the next draft's hidden
// row). Only Backend ops: graph-capturable on CUDA.
Status assistant_forward(Backend& b, const GemmaGraph& g, const AssistantGraph& ag, const StepMetadata& md,
                         const AssistantActivations& a, const std::vector<KvCacheView>& kv, Tensor hidden, bool out,
                         Tensor logits) {
  const int64_t n = md.n_tokens, Et = ag.Et;
  const Tensor emb = a.emb.rows_from(0, n), in = a.in.rows_from(0, n);
  b.embed(g.embed, md.ids, n, emb);
  b.scale(emb, g.embed_scale);
  b.convert(emb, in.cols_from(0, Et));
  b.convert(hidden.rows_from(0, n), in.cols_from(Et, Et));
  RILL_TRY(assistant_layers(b, g, ag, md, a, kv, out));
  const int32_t ns = md.n_sample;
  if (ns <= 0) return Status::Ok();
  const Tensor rows = a.rows.rows_from(0, ns);
  if (!ag.ordered) return b.matmul(ag.lm_head, rows, logits, false);
  OrderedLogitsOp op;
  op.hidden = a.rows_f32.rows_from(0, ns);
  op.scores = a.scores.rows_from(0, ns);
  op.logits = logits;
  op.lm_head = ag.lm_head;
  op.token_ordering = static_cast<const int32_t*>(ag.token_ordering.data());
  op.n_centroids = ag.n_centroids;
  op.top_k = ag.top_k;
  op.picked = a.picked;
  op.dots = a.dots;
  RILL_TRY(b.matmul(ag.centroids, rows, op.scores, false));
  b.ordered_logits(op);
  return Status::Ok();
}

// --- The CPU runtime ------------------------------------------------------------

// How each KV plane's RoPE pairs its K channels, for q4a's widths (both
// runtimes): NeoX or interleaved per the table; Gemma 4's full layers
// rotate the first pairs (i, i + hd / 2) of the whole head, the rest at
// angle 0 (inv_freq 0: channels that never mix).
std::vector<KvRopePairs> gemma_kv_rope_pairs(const GemmaGraph& g, const GemmaRope& rope) {
  std::vector<KvRopePairs> out;
  for (const int32_t il : g.kv_layer_of) {
    const cpu::RopeTable& r = g.layers[static_cast<size_t>(il)].sliding ? rope.local : rope.global;
    const auto zero = std::find(r.inv_freq.begin(), r.inv_freq.end(), 0.0f);
    out.push_back({r.interleaved, r.rot_dim, zero == r.inv_freq.end() ? -1 : zero - r.inv_freq.begin()});
  }
  return out;
}

class GemmaModel final : public CpuPagedModel {
 public:
  GemmaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);
  Status forward(const Batch& batch, float* logits) override;
  std::vector<KvLayer> kv_layers() const override {
    const std::vector<KvLayer> groups = graph_.kv_layers(DType::kF16);
    return cache_kv_layers([&](int64_t l) { return groups[static_cast<size_t>(l)].group; });
  }
  // Gemma 4's assistant as the MTP head (ModelOptions::gemma4_assistant).
  int32_t n_mtp_layers() const override { return assistant_ ? static_cast<int32_t>(ag_.layers.size()) : 0; }
  std::string mtp_head_source() const override { return assistant_path_; }
  Status forward_hidden(const Batch& batch, float* logits, float* hidden) override;
  Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) override;

 private:
  Status check(const Batch& batch) const;
  Status init_assistant();
  // kv_views_ as kv_ has them now: a q4a layer's widths are set, and a
  // calibration pass's statistics attached, after init made them.
  const std::vector<KvCacheView>& kv_views();

  std::unique_ptr<Backend> device_;  // on backend_'s threads
  GemmaGraph graph_;
  // Gemma 4's assistant: its weights (the files stay mapped), graph,
  // activations and the ordered head's scratch.
  std::unique_ptr<Gemma4AssistantWeights> assistant_;
  std::string assistant_path_;  // ModelOptions::gemma4_assistant, for mtp_head_source()
  AssistantGraph ag_;
  AssistantActivations aact_;
  std::vector<float> a_in_, a_emb_, a_x_, a_h_, a_y_, a_q_, a_attn_, a_gu_, a_mlp_, a_out_, a_rows_, a_scores_;
  std::vector<int32_t> a_picked_;                                      // [S, n_picked]
  std::vector<float> a_dots_;                                          // [S, n_picked]
  std::vector<float> x_, h_, qkv_, attn_, y_, gu_, mlp_, final_rows_;  // [max_tokens_, ...] f32
  std::vector<float> ple_, ple_tmp_, pl_gate_, pl_act_, xa_;           // Gemma 4's per-layer input
  std::vector<float> router_in_, moe_in_, moe_out_;                    // Gemma 4's MoE block
  GemmaActivations act_;                                               // views of the vectors above
  CpuStepArrays step_;
  std::vector<KvCacheView> kv_views_;  // per layer
};

const std::vector<KvCacheView>& GemmaModel::kv_views() {
  for (size_t l = 0; l < kv_views_.size(); ++l) kv_views_[l] = kv_.layer_view(static_cast<int64_t>(l));
  return kv_views_;
}

Status GemmaModel::init(const ModelOptions& options) {
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  RILL_ASSIGN_OR_RETURN(GemmaWeights w, bind_gemma(*files_, kMaxHeadDim));
  if (!options.gemma4_assistant.empty()) {
    RILL_ASSIGN_OR_RETURN(auto aw, load_gemma4_assistant(options.gemma4_assistant, *files_, w.params, kMaxHeadDim));
    assistant_ = std::make_unique<Gemma4AssistantWeights>(std::move(aw));
    assistant_path_ = options.gemma4_assistant;
  }
  device_ = make_cpu_backend_on(*backend_->pool());
  RILL_ASSIGN_OR_RETURN(graph_, place_gemma(*device_, cfg_, w, assistant_.get(), &ag_));
  kv_spec_ = graph_.make_kv_spec();
  set_limits(options);

  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  bool all_f32 = w.embed.dtype == DType::kF32;
  for (const GemmaLayerWeights& L : w.layers) {
    all_f32 = all_f32 && L.q.w.dtype == DType::kF32 && L.gate.w.dtype == DType::kF32;
  }
  // k4c / k4a: forward() checks and passes the batch's KV tails, and a
  // KV-shared layer's attention leaves its donor's tails to the step's
  // last reader (GemmaLayer::kv_read_later).
  kv_tails_supported_ = true;
  RILL_TRY(create_kv(options, graph_.kv_planes(), all_f32 ? DType::kF32 : DType::kF16));
  if (assistant_ && !kv_.tails().empty()) {
    return Error{files_->path + ": KV types q4c / q4a (k4c, k4a) do not run with a Gemma 4 assistant (" +
                 assistant_path_ + "): its layers read the target's KV in steps of their own, after the step that " +
                 "wrote it moved the KV tails on; use another KV type"};
  }
  kv_views_.resize(static_cast<size_t>(kv_.n_layers()));
  // q4a's widths pair each plane's K channels as its layers' RoPE does.
  const std::vector<KvRopePairs> kv_rope = gemma_kv_rope_pairs(graph_, w.rope);

  const int64_t T = max_tokens_;
  auto view = [T](std::vector<float>& v, int64_t cols) {
    v.resize(static_cast<size_t>(T * cols));
    return Tensor::dense(v.data(), DType::kF32, T, cols);
  };
  act_.x = view(x_, graph_.E);
  act_.h = view(h_, graph_.E);
  act_.qkv = view(qkv_, graph_.qkv_width());
  act_.attn = view(attn_, graph_.Q);
  act_.y = view(y_, graph_.E);
  act_.gu = view(gu_, 2 * graph_.F);
  act_.mlp = view(mlp_, graph_.F);
  act_.final_rows = view(final_rows_, graph_.E);
  if (graph_.P > 0) {
    const int64_t LP = static_cast<int64_t>(graph_.layers.size()) * graph_.P;
    act_.ple = view(ple_, LP);
    act_.ple_tmp = view(ple_tmp_, LP);
    act_.pl_gate = view(pl_gate_, graph_.P);
    act_.pl_act = view(pl_act_, graph_.P);
    act_.xa = view(xa_, graph_.E);
  }
  if (graph_.any_moe) {
    act_.router_in = view(router_in_, graph_.E);
    act_.moe_in = view(moe_in_, graph_.E);
    act_.moe_out = view(moe_out_, graph_.E);
  }
  step_.reserve(T);
  if (assistant_) RILL_TRY(init_assistant());
  RILL_TRY(device_->reserve(gemma_step_limits(graph_, assistant_ ? &ag_ : nullptr, T, max_seqs_)));
  return calibrate_kv(options.kv_types.calibration_tokens, kv_rope);
}

Status GemmaModel::init_assistant() {
  const int64_t T = max_tokens_, S = max_seqs_;
  auto view = [](std::vector<float>& v, int64_t rows, int64_t cols) {
    v.resize(static_cast<size_t>(rows * cols));
    return Tensor::dense(v.data(), DType::kF32, rows, cols);
  };
  aact_.in = view(a_in_, T, 2 * ag_.Et);
  aact_.emb = view(a_emb_, T, ag_.Et);
  aact_.x = view(a_x_, T, ag_.E);
  aact_.h = view(a_h_, T, ag_.E);
  aact_.y = view(a_y_, T, ag_.E);
  aact_.q = view(a_q_, T, ag_.Q);
  aact_.attn = view(a_attn_, T, ag_.Q);
  aact_.gu = view(a_gu_, T, 2 * ag_.F);
  aact_.mlp = view(a_mlp_, T, ag_.F);
  aact_.out = view(a_out_, T, ag_.Et);
  aact_.rows = view(a_rows_, S, ag_.E);
  aact_.rows_f32 = aact_.rows;  // act is F32 on the CPU
  if (ag_.ordered) {
    aact_.scores = view(a_scores_, S, ag_.n_centroids);
    a_picked_.resize(static_cast<size_t>(S * ag_.n_picked()));
    a_dots_.resize(static_cast<size_t>(S * ag_.n_picked()));
    aact_.picked = a_picked_.data();
    aact_.dots = a_dots_.data();
  }
  return Status::Ok();
}

Status GemmaModel::check(const Batch& batch) const {
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim, kv_spec_));
  return check_kv_tails(batch);
}

Status GemmaModel::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check(batch));
  const StepMetadata md = step_metadata(batch, step_);
  return gemma_forward(*device_, graph_, md, act_, kv_views(),
                       Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab));
}

Status GemmaModel::forward_hidden(const Batch& batch, float* logits, float* hidden) {
  if (!assistant_) return Model::forward_hidden(batch, logits, hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check(batch));
  const StepMetadata md = step_metadata(batch, step_);
  const Tensor rows = Tensor::dense(hidden, DType::kF32, md.n_tokens, graph_.E);
  return gemma_forward(*device_, graph_, md, act_, kv_views(),
                       Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), &rows);
}

Status GemmaModel::forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
  if (!assistant_) return Model::forward_mtp(batch, hidden, logits, mtp_hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check(batch));
  const StepMetadata md = step_metadata(batch, step_);
  const int64_t n = md.n_tokens, Et = ag_.Et;
  AssistantActivations a = aact_;
  if (mtp_hidden) a.out = Tensor::dense(mtp_hidden, DType::kF32, n, Et);
  // The Backend reads the hidden rows only.
  const Tensor rows = Tensor::dense(const_cast<float*>(hidden), DType::kF32, n, Et);
  return assistant_forward(*device_, graph_, ag_, md, a, kv_views(), rows, mtp_hidden != nullptr,
                           Tensor::dense(logits, DType::kF32, md.n_sample, ag_.V));
}

// --- The CUDA runtime's glue ------------------------------------------------------

#if RILL_HAVE_CUDA
// Gemma 4's assistant (ModelOptions::gemma4_assistant) runs as the MTP
// head through the base's step kinds: forward_hidden's steps (kHidden)
// write the target's final-normed rows to rows_out(), forward_mtp's (kMtp)
// run assistant_forward over the uploaded rows_in() and leave its
// post_projection in rows_out(); one-token steps of each kind replay their
// own decode graphs.
class GemmaCudaModel final : public CudaModelBase {
 public:
  explicit GemmaCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);
  std::vector<KvLayer> kv_layers() const override {
    std::vector<KvLayer> out = graph_.kv_layers(kv_dtype_);
    for (size_t l = 0; kv_chan_ && l < out.size(); ++l) {  // k4c: V in its own type, as CudaModelBase's
      out[l].v_row_bytes = kv_v_row_bytes(l);
      out[l].v_dtype = kv_v_dtype();
    }
    return out;
  }
  int32_t n_mtp_layers() const override { return assistant_ ? static_cast<int32_t>(ag_.layers.size()) : 0; }
  std::string mtp_head_source() const override { return assistant_path_; }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;
  // The assistant's layers against the CUDA kernels' limits (errors name
  // the assistant's files).
  Status check_assistant() const;

  GemmaGraph graph_;
  GemmaActivations act_views_;         // over the arena
  std::vector<KvCacheView> kv_views_;  // per layer
  std::unique_ptr<Gemma4AssistantWeights> assistant_;
  std::string assistant_path_;
  AssistantGraph ag_;
  AssistantActivations aviews_;  // over the arena (out: rows_out(), set per step)
};

// Why this model keeps no k4c / k4a tails on CUDA (GemmaCudaModel::init);
// empty when it may.
std::string gemma_cuda_tails_refusal(const GemmaGraph& g, const GemmaWeights& w, bool assistant, int64_t hd) {
  if (g.kv_layer_of.size() != g.layers.size()) {
    return "its layers share KV (Gemma 3n / 4 KV sharing), which the CUDA k4c path does not run";
  }
  if (assistant) return "a Gemma 4 assistant reads the target's KV in steps of its own";
  for (size_t il = 0; il < w.layer_dims.size(); ++il) {
    if (w.layer_dims[il].head_dim != hd) {
      return "layer " + std::to_string(il) + "'s head_dim " + std::to_string(w.layer_dims[il].head_dim) +
             " is not the model's " + std::to_string(hd);
    }
  }
  return {};
}

Status GemmaCudaModel::check_assistant() const {
  const std::string& path = assistant_->files->path;
  for (size_t il = 0; il < ag_.layers.size(); ++il) {
    const GemmaLayer& L = ag_.layers[il];
    if (L.hd % 4 != 0 ||
        cuda::prefill_tile_q(DType::kF16, L.hd) != cuda::prefill_tile_q(DType::kF16, static_cast<int32_t>(hd_)) ||
        ag_.n_head % L.n_head_kv != 0 || ag_.n_head / L.n_head_kv > 8) {
      return Error{path + ": assistant layer " + std::to_string(il) + " (head_dim " + std::to_string(L.hd) + ", " +
                   std::to_string(ag_.n_head) + " heads over " + std::to_string(L.n_head_kv) +
                   " KV heads) is not supported by the CUDA attention kernels beside the target's head_dim " +
                   std::to_string(hd_) + " (at most 8 query heads per KV head)"};
    }
  }
  if (ag_.ordered && ag_.n_centroids > cuda::kMaxOrderedGroups) {
    return Error{path + "/config.json: 'num_centroids' (" + std::to_string(ag_.n_centroids) + ") is above the " +
                 std::to_string(cuda::kMaxOrderedGroups) + " the CUDA head takes"};
  }
  return Status::Ok();
}

Status GemmaCudaModel::init(const ModelOptions& options) {
  RILL_TRY(read_dims());  // the CUDA kernels' limits
  RILL_TRY(create_context());
  // read_dims held hd_ (the sliding / every layer's) to its limit; Gemma
  // 4's full layers (512 in the public checkpoints) are held to the
  // attention kernels' own here. A step's prefill tiles are cut once for
  // every layer (tile_q of hd_), so each layer's head_dim must take them.
  RILL_ASSIGN_OR_RETURN(const GemmaWeights w, bind_gemma(*files_, cuda::kMaxHeadDim));
  // (f16, fp8, q8_0 and q4_0 share the tensor-core kernel's head dims; f32
  // KV always takes the SIMT kernel's tiles.)
  for (size_t il = 0; il < w.layer_dims.size(); ++il) {
    const int64_t hd = w.layer_dims[il].head_dim;
    if (hd % 4 != 0 || cuda::prefill_tile_q(DType::kF16, static_cast<int32_t>(hd)) !=
                           cuda::prefill_tile_q(DType::kF16, static_cast<int32_t>(hd_))) {
      return Error{files_->path + ": layer " + std::to_string(il) + "'s head_dim " + std::to_string(hd) + " beside " +
                   std::to_string(hd_) + " is not supported by the CUDA attention kernels"};
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(files_->path, w.layer_matrices(), w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Gemma: f32 checkpoints keep f32 KV
  if (!options.gemma4_assistant.empty()) {
    RILL_ASSIGN_OR_RETURN(auto aw,
                          load_gemma4_assistant(options.gemma4_assistant, *files_, w.params, cuda::kMaxHeadDim));
    assistant_ = std::make_unique<Gemma4AssistantWeights>(std::move(aw));
    assistant_path_ = options.gemma4_assistant;
    mtp_rows_ = true;  // rows_in() / rows_out(): the hidden rows, [T, E_]
  }
  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(graph_, place_gemma(*backend_, cfg_, w, assistant_.get(), &ag_));
  if (assistant_) RILL_TRY(check_assistant());
  kv_spec_ = graph_.make_kv_spec();
  n_kv_layers_ = static_cast<int64_t>(graph_.kv_layer_of.size());  // KV-shared layers keep none
  kv_widths_ = graph_.kv_widths();
  // k4c / k4a: the base's forward() checks and passes the batch's KV
  // tails; the CUDA backend keeps one layer's step rows at a time
  // (rope_store_kv to attention), so a layer reading another layer's KV
  // (Gemma 3n / 4 KV sharing) would read the wrong rows, and the base's
  // calibration allocates widths over heads of hd_.
  kv_tails_refusal_ = gemma_cuda_tails_refusal(graph_, w, assistant_ != nullptr, hd_);
  kv_tails_supported_ = kv_tails_refusal_.empty();
  RILL_TRY(init_runtime(options));
  // init_runtime held a rotated KV type to hd_; Gemma 4's full layers have
  // their own head_dim, whose heads the rotation kernels must fit too.
  for (size_t il = 0; il < w.layer_dims.size(); ++il) {
    const int64_t hd = w.layer_dims[il].head_dim;
    if (!cuda::kv_rotation_supported(kv_dtype_, static_cast<int32_t>(hd), kv_rotated_)) {
      return Error{
          files_->path +
          ": a rotated KV type (q8_0h / q4_0h / iq4_nlh; q8_0h64 / iq4_nlh64: at least 64) needs a power-of-two "
          "head_dim of at most " +
          std::to_string(cuda::kMaxHeadDim) + " on CUDA in every layer; layer " + std::to_string(il) +
          " has head_dim " + std::to_string(hd)};
    }
  }
  for (int64_t l = 0; l < n_kv_layers_; ++l) kv_views_.push_back(kv_view(static_cast<size_t>(l)));
  return calibrate_kv(options.kv_types.calibration_tokens, gemma_kv_rope_pairs(graph_, w.rope));
}

void GemmaCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs();
  act_views_.x = carve_tensor(a, DType::kF32, T, E_);
  act_views_.h = carve_tensor(a, act_, T, E_);
  act_views_.qkv = carve_tensor(a, DType::kF32, T, graph_.qkv_width());
  act_views_.attn = carve_tensor(a, act_, T, graph_.Q);
  act_views_.y = carve_tensor(a, DType::kF32, T, E_);
  act_views_.gu = carve_tensor(a, DType::kF32, T, 2 * graph_.F);
  act_views_.mlp = carve_tensor(a, act_, T, graph_.F);
  act_views_.final_rows = carve_tensor(a, act_, S, E_);
  if (graph_.P > 0) {
    const int64_t LP = static_cast<int64_t>(graph_.layers.size()) * graph_.P;
    act_views_.ple = carve_tensor(a, DType::kF32, T, LP);
    act_views_.ple_tmp = carve_tensor(a, DType::kF32, T, LP);
    act_views_.pl_gate = carve_tensor(a, DType::kF32, T, graph_.P);
    act_views_.pl_act = carve_tensor(a, act_, T, graph_.P);
    act_views_.xa = carve_tensor(a, act_, T, E_);
  }
  if (graph_.any_moe) {
    act_views_.router_in = carve_tensor(a, act_, T, E_);
    act_views_.moe_in = carve_tensor(a, act_, T, E_);
    act_views_.moe_out = carve_tensor(a, DType::kF32, T, E_);
  }
  if (assistant_) {
    AssistantActivations& v = aviews_;
    v.in = carve_tensor(a, act_, T, 2 * ag_.Et);
    v.emb = carve_tensor(a, DType::kF32, T, ag_.Et);
    v.x = carve_tensor(a, DType::kF32, T, ag_.E);
    v.h = carve_tensor(a, act_, T, ag_.E);
    v.y = carve_tensor(a, DType::kF32, T, ag_.E);
    v.q = carve_tensor(a, DType::kF32, T, ag_.Q);
    v.attn = carve_tensor(a, act_, T, ag_.Q);
    v.gu = carve_tensor(a, DType::kF32, T, 2 * ag_.F);
    v.mlp = carve_tensor(a, act_, T, ag_.F);
    v.rows = carve_tensor(a, act_, S, ag_.E);
    v.rows_f32 = act_ == DType::kF32 ? v.rows : carve_tensor(a, DType::kF32, S, ag_.E);
    if (ag_.ordered) {
      v.scores = carve_tensor(a, DType::kF32, S, ag_.n_centroids);
      v.picked = a.take<int32_t>(static_cast<size_t>(S * ag_.n_picked()));
      v.dots = a.take<float>(static_cast<size_t>(S * ag_.n_picked()));
    }
  }
  carve_cuda_scratch(*backend_, a, gemma_step_limits(graph_, assistant_ ? &ag_ : nullptr, T, S), chan_limits());
}

Status GemmaCudaModel::run_layers(const Step& s) {
  // k4c / k4a: a view points at the calibration pass's statistics while
  // calibrate_kv() runs (KvCacheView::calibration), so such models take
  // their views afresh each step (no allocation; the tails and widths
  // tables they point at never move).
  if (kv_chan_) {
    for (size_t l = 0; l < kv_views_.size(); ++l) kv_views_[l] = kv_view(l);
  }
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.V);
  const StepMetadata md = step_metadata(s);
  switch (step_kind()) {
    case StepKind::kHidden: {
      const Tensor hidden = Tensor::dense(rows_out(), DType::kF32, s.n, E_);
      return gemma_forward(*backend_, graph_, md, act_views_, kv_views_, logits, &hidden);
    }
    case StepKind::kMtp: {
      // Always the post_projection: a replayed graph cannot tell whether
      // the caller copies it down.
      AssistantActivations a = aviews_;
      a.out = Tensor::dense(rows_out(), DType::kF32, s.n, E_);
      return assistant_forward(*backend_, graph_, ag_, md, a, kv_views_, Tensor::dense(rows_in(), DType::kF32, s.n, E_),
                               true, logits);
    }
    case StepKind::kForward:
      break;
  }
  return gemma_forward(*backend_, graph_, md, act_views_, kv_views_, logits);
}
#endif  // RILL_HAVE_CUDA

}  // namespace

Result<std::unique_ptr<Model>> create_gemma_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  return init_model(std::make_unique<GemmaModel>(std::move(files), options), options);
}

Result<std::unique_ptr<Model>> create_gemma_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<GemmaCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
