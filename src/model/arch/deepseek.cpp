// The multi-head latent attention (MLA) family: DeepSeek-V3 (`deepseek_v3`),
// MiniCPM3 (`minicpm3`) and GLM-5 (`glm_moe_dsa`), from Hugging Face files
// (the config: deepseek_config.h). Against the Llama family:
//   q                 q_b(rms_norm(q_a x)) (q_lora_rank), or q_proj x when
//                     q_lora_rank is null; per head [nope | rope] dims
//   kv                kv_a_proj_with_mqa x = [latent c (kv_lora_rank) |
//                     rope key (qk_rope_head_dim), one for every head];
//                     kv_b_proj expands rms_norm(c) into every head's
//                     [k_nope | v]
//   RoPE              on the rope dims only; DeepSeek pairs dims (2i, 2i+1)
//                     (rope_interleave, transformers' default), MiniCPM3
//                     rotates halves
//   attention scale   qk_head_dim^-1/2, times mscale(factor,
//                     mscale_all_dim)^2 under yarn rope scaling
//   KV cache          per token and layer the row [rms_norm(c) | rotated
//                     rope key] (model/kv_spec.h's LatentKvRow), not
//                     per-head K and V
//   DeepSeek-V3 MoE   the first first_k_dense_replace layers dense, then
//                     the sigmoid, group-limited router with the score
//                     correction bias, routed_scaling_factor and an
//                     ungated shared expert (model/moe.h's options)
//   MiniCPM3 (muP)    embeddings times scale_emb, each residual branch
//                     times scale_depth / sqrt(n_layers), final hidden
//                     states divided by hidden_size / dim_model_base
//   GLM-5 (DSA)       DeepSeek-V3's MLA and MoE plus DeepSeek sparse
//                     attention: a lightning indexer per "full" layer
//                     (indexer_types) with queries wq_b(q_resid), keys
//                     layer_norm(wk h) (RoPE on their first rope dims, as
//                     the main attention rotates) and head weights
//                     weights_proj h; each token attends only to the
//                     index_topk keys its indexer scores best
//                     (Backend::lightning_index); a "shared" layer reuses
//                     the selection of the full layer before it. The
//                     indexer keys are a third part of the latent row.
//
// Attention runs in the absorbed form on every step: the nope query goes
// through kv_b's K part of its head (q_latent = W_uk^T q_nope, kv_lora_rank
// wide), scores are q_latent . c_j + q_rope . r_j over the stored rows, the
// softmax-weighted sum of latents goes through kv_b's V part (W_uv) per
// head, then o_proj. So a token reads one row of kv_lora_rank +
// qk_rope_head_dim elements per layer and key, whatever the head count.
// W_uk^T and W_uv are copied out of kv_b_proj at load (F32/F16/BF16 kept
// in their dtype), per head, as matmul_heads() reads them.
//
// One graph (MlaGraph, place_mla, mla_forward) over Backend ops (the MLA
// ops: matmul_heads, rope_store_latent, latent_attention, lightning_index)
// and the MoE FFN (Backend::moe_ffn); the CPU runtime (`deepseek_v3.cpu`, `minicpm3.cpu`,
// `glm_moe_dsa.cpu`, a CpuPagedModel) and the CUDA runtime's glue
// (`.cuda`, over model/cuda_model_base.h: one plane pair per layer, each
// plane half a latent row wide). On CUDA the MoE layers (DeepSeek-V3,
// GLM-5) load only as far as the CUDA Backend's place_moe takes their
// router. The MTP layer (--spec mtp, mla_mtp_forward) is the same graph on
// both runtimes: one more MlaLayer and latent KV layer, with
// model/mtp_head.h's head around it (CUDA: the base's step kinds).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rope_table.h"
#include "loader/mtp_layers.h"
#include "model/arch/deepseek_config.h"
#include "model/arch/families.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/mtp_head.h"
#include "model/mup_scales.h"
#include "model/placement.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/latent_attention.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {
namespace {

// --- The checkpoint -------------------------------------------------------------

// One layer as the files hold it; kv_b_proj's K part transposed and its V
// part gathered per head into owned copies (the CPU Backend views them).
struct MlaLayerWeights {
  std::vector<float> attn_norm, ffn_norm, q_a_norm, kv_norm;
  Linear q_a, q_b, q;         // q_a/q_b with q_lora_rank, else q
  Linear kv_a;                // [kv_lora + rope, E]
  std::vector<uint8_t> wk_t;  // [H * kv_lora, nope] in kv_b's dtype: head h's W_uk^T
  std::vector<uint8_t> wv;    // [H * v, kv_lora]: head h's W_uv
  Linear o;                   // [E, H * v]
  Linear gate, up, down;      // dense FFN
  std::optional<MoeFfn> moe;
  // The lightning indexer (DSA layers that are not shared).
  Linear index_q;                                 // wq_b [n_head D, q_lora]
  Linear index_k, index_w;                        // wk [D, E], weights_proj [n_head, E]
  std::vector<float> index_k_norm, index_k_bias;  // k_norm's LayerNorm [D]
};

struct MlaWeights {
  MlaParams params;
  WeightView embed, lm_head;
  bool tied = false;
  std::vector<float> final_norm;
  DType kv_b_dtype = DType::kF32;
  std::vector<MlaLayerWeights> layers;  // the decoder layers, then the MTP layer when bound
  RopeTable rope;
  bool all_f32 = true;
  // The MTP layer (ModelOptions::mtp): layers.back() is its decoder layer,
  // mtp_head what is around it (model/mtp_head.h).
  std::optional<MtpHeadWeights> mtp_head;
};

// Splits kv_b [H * (nope + v), kv_lora] into head-major W_uk^T [H * kv_lora,
// nope] and W_uv [H * v, kv_lora], elements copied in their dtype.
Status split_kv_b(const WeightView& kv_b, const MlaParams& p, int64_t n_head, MlaLayerWeights& L) {
  if (kv_b.dtype != DType::kF32 && kv_b.dtype != DType::kF16 && kv_b.dtype != DType::kBF16) {
    return Error{"kv_b_proj in " + std::string(dtype_name(kv_b.dtype)) + " (F32, F16 or BF16 only for now)"};
  }
  const size_t es = kv_b.dtype == DType::kF32 ? 4 : 2;
  const int64_t C = p.kv_lora_rank, stride_rows = p.nope + p.v_dim;
  const size_t rs = kv_b.row_stride > 0 ? kv_b.row_stride : static_cast<size_t>(C) * es;
  const auto* base = static_cast<const uint8_t*>(kv_b.data);
  L.wk_t.resize(static_cast<size_t>(n_head * C * p.nope) * es);
  L.wv.resize(static_cast<size_t>(n_head * p.v_dim * C) * es);
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t d = 0; d < p.nope; ++d) {
      const uint8_t* src = base + static_cast<size_t>(h * stride_rows + d) * rs;
      for (int64_t c = 0; c < C; ++c) {
        std::memcpy(L.wk_t.data() + static_cast<size_t>((h * C + c) * p.nope + d) * es, src + c * es, es);
      }
    }
    for (int64_t d = 0; d < p.v_dim; ++d) {
      const uint8_t* src = base + static_cast<size_t>(h * stride_rows + p.nope + d) * rs;
      std::memcpy(L.wv.data() + static_cast<size_t>((h * p.v_dim + d) * C) * es, src, static_cast<size_t>(C) * es);
    }
  }
  return Status::Ok();
}

// llama.cpp's deepseek2 files hold kv_b already split per head: k_b_proj
// [H, kv_lora, nope] is W_uk^T and v_b_proj [H, v, kv_lora] is W_uv, in the
// layouts of wk_t and wv, so they are copied as they are. Both in one dtype.
Result<DType> copy_split_kv_b(const ModelFiles& f, const std::string& at, const MlaParams& p, int64_t n_head,
                              MlaLayerWeights& L) {
  RILL_ASSIGN_OR_RETURN(const TensorRef* k_b, f.require(at + "k_b_proj.weight", {n_head, p.kv_lora_rank, p.nope}));
  RILL_ASSIGN_OR_RETURN(const TensorRef* v_b, f.require(at + "v_b_proj.weight", {n_head, p.v_dim, p.kv_lora_rank}));
  for (const TensorRef* t : {k_b, v_b}) {
    if ((t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) || t->dtype != k_b->dtype) {
      return Error{t->file + ": '" + at + "k_b_proj.weight' and 'v_b_proj.weight' in " +
                   std::string(dtype_name(k_b->dtype)) + " and " + std::string(dtype_name(v_b->dtype)) +
                   " (one of F32, F16 or BF16 for both, for now)"};
    }
  }
  const size_t es = k_b->dtype == DType::kF32 ? 4 : 2;
  L.wk_t.assign(k_b->data, k_b->data + static_cast<size_t>(n_head * p.kv_lora_rank * p.nope) * es);
  L.wv.assign(v_b->data, v_b->data + static_cast<size_t>(n_head * p.v_dim * p.kv_lora_rank) * es);
  return k_b->dtype;
}

// Whether layer il runs a lightning indexer: a DSA layer that is not
// "shared", and the MTP layer (past indexer_types: it has its own).
bool has_indexer(const MlaParams& p, int64_t il) {
  if (!p.dsa.enabled()) return false;
  const auto i = static_cast<size_t>(il);
  return i >= p.dsa.shared.size() || !p.dsa.shared[i];
}

Result<MlaWeights> bind_mla(const ModelFiles& f, bool mtp) {
  const ModelConfig& cfg = f.config;
  const int64_t E = cfg.n_embd, V = cfg.n_vocab, H = cfg.n_head;
  if (E <= 0 || V <= 0 || cfg.n_layer <= 0 || H <= 0) return Error{f.path + ": inconsistent model config"};
  MlaWeights w;
  RILL_ASSIGN_OR_RETURN(w.params, read_mla_params(f));
  const MlaParams& p = w.params;
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, "model.embed_tokens.weight", V, E));
  w.tied = !f.find("lm_head.weight");
  w.lm_head = w.embed;
  if (!w.tied) {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, "lm_head.weight", V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, "model.norm.weight", E));
  w.all_f32 = w.embed.dtype == DType::kF32;
  // The MTP layer is bound as decoder layer n_layer (its tensors are
  // DeepSeek's model.layers.{n_layer}.*, loader/mtp_layers.h).
  std::optional<MtpLayers> mtp_found;
  if (mtp) {
    RILL_ASSIGN_OR_RETURN(const MtpLayers found, find_mtp_layers(f));
    if (found.n_layers() == 0) return Error{f.path + ": --spec mtp: the files carry no multi-token-prediction layers"};
    if (found.naming != MtpLayers::Naming::kNextn ||
        found.prefixes[0] != "model.layers." + std::to_string(cfg.n_layer) + ".")
      return Error{f.path + ": --spec mtp: MTP layers named '" + found.prefixes[0] + "*' are not run by this family"};
    // A DSA model's MTP layer (GLM-5) selects its keys with its own
    // lightning indexer: no layer before it in its step to share one with.
    if (p.dsa.enabled() && !f.find(found.prefixes[0] + "self_attn.indexer.wq_b.weight"))
      return Error{f.path + ": --spec mtp: the MTP layer of a DSA model needs its own indexer ('" + found.prefixes[0] +
                   "self_attn.indexer.wq_b.weight' is missing)"};
    mtp_found = found;
  }
  const int64_t n_bound = cfg.n_layer + (mtp ? 1 : 0);
  w.layers.resize(static_cast<size_t>(n_bound));
  for (int64_t il = 0; il < n_bound; ++il) {
    MlaLayerWeights& L = w.layers[static_cast<size_t>(il)];
    const std::string pre = "model.layers." + std::to_string(il) + ".";
    const std::string at = pre + "self_attn.";
    RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, pre + "input_layernorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, pre + "post_attention_layernorm.weight", E));
    if (p.q_lora_rank > 0) {
      RILL_ASSIGN_OR_RETURN(L.q_a, bind_linear(f, at + "q_a_proj", p.q_lora_rank, E));
      RILL_ASSIGN_OR_RETURN(L.q_a_norm, load_vector(f, at + "q_a_layernorm.weight", p.q_lora_rank));
      RILL_ASSIGN_OR_RETURN(L.q_b, bind_linear(f, at + "q_b_proj", H * p.qk_dim(), p.q_lora_rank));
    } else {
      RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, at + "q_proj", H * p.qk_dim(), E));
    }
    RILL_ASSIGN_OR_RETURN(L.kv_a, bind_linear(f, at + "kv_a_proj_with_mqa", p.kv_lora_rank + p.rope, E));
    RILL_ASSIGN_OR_RETURN(L.kv_norm, load_vector(f, at + "kv_a_layernorm.weight", p.kv_lora_rank));
    DType kv_b_dtype = DType::kF32;
    if (f.find(at + "kv_b_proj.weight") || !f.find(at + "k_b_proj.weight")) {
      RILL_ASSIGN_OR_RETURN(const WeightView kv_b,
                            bind_matrix(f, at + "kv_b_proj.weight", H * (p.nope + p.v_dim), p.kv_lora_rank));
      const Status split = split_kv_b(kv_b, p, H, L);
      if (!split.ok()) return Error{f.path + ": '" + at + "kv_b_proj.weight': " + split.error().message};
      kv_b_dtype = kv_b.dtype;
    } else {
      RILL_ASSIGN_OR_RETURN(kv_b_dtype, copy_split_kv_b(f, at, p, H, L));
    }
    // place_pass reads every layer's split kv_b in one dtype (its element
    // size sizes the rows): a file that mixes them is refused, not misread.
    if (il > 0 && kv_b_dtype != w.kv_b_dtype) {
      return Error{f.path + ": '" + at + "kv_b_proj' is " + std::string(dtype_name(kv_b_dtype)) + ", layer 0's is " +
                   std::string(dtype_name(w.kv_b_dtype)) + "; mixed kv_b dtypes are not supported"};
    }
    w.kv_b_dtype = kv_b_dtype;
    RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, at + "o_proj", E, H * p.v_dim));
    if (has_indexer(p, il)) {
      const std::string ix = at + "indexer.";
      const int64_t D = p.dsa.head_dim;
      RILL_ASSIGN_OR_RETURN(L.index_q, bind_linear(f, ix + "wq_b", p.dsa.n_head * D, p.q_lora_rank));
      RILL_ASSIGN_OR_RETURN(L.index_k, bind_linear(f, ix + "wk", D, E));
      RILL_ASSIGN_OR_RETURN(L.index_w, bind_linear(f, ix + "weights_proj", p.dsa.n_head, E));
      RILL_ASSIGN_OR_RETURN(L.index_k_norm, load_vector(f, ix + "k_norm.weight", D));
      RILL_ASSIGN_OR_RETURN(L.index_k_bias, load_vector(f, ix + "k_norm.bias", D));
    }
    if (is_moe_layer(cfg, il)) {
      MoeNames names;
      names.shared_expert = "shared_experts";
      RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind(f, pre + "mlp.", p.moe, names));
    } else {
      if (cfg.n_ff <= 0)
        return Error{f.path + ": intermediate_size is missing (dense layer " + std::to_string(il) + ")"};
      RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, pre + "mlp.gate_proj", cfg.n_ff, E));
      RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, pre + "mlp.up_proj", cfg.n_ff, E));
      RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, pre + "mlp.down_proj", E, cfg.n_ff));
      if (il < cfg.n_layer) w.all_f32 = w.all_f32 && L.gate.w.dtype == DType::kF32;
    }
    // The KV dtype follows the decoder layers only, so binding the MTP layer
    // (--spec mtp) never changes the target's numbers.
    if (il < cfg.n_layer) w.all_f32 = w.all_f32 && L.kv_a.w.dtype == DType::kF32 && kv_b_dtype == DType::kF32;
  }
  if (mtp_found) {
    RILL_ASSIGN_OR_RETURN(w.mtp_head, bind_mtp_head(f, *mtp_found, w.embed, w.lm_head));
  }
  cpu::RopeScalingParams rs = rope_scaling_params(cfg.rope_scaling);
  if (p.rope_attention_factor) rs.attention_factor = p.rope_attention_factor;
  w.rope = cpu::make_rope_table(cfg.rope_theta, p.rope, p.interleaved, rs);
  return w;
}

// --- The graph, for every device ----------------------------------------------

struct MlaLayer {
  Vec attn_norm, ffn_norm, q_a_norm, kv_norm;  // q_a_norm with q_lora_rank
  Weight w_a;                                  // [q_lora | kv_a] or [q | kv_a] rows, one matmul of h
  Weight q_b;                                  // [H qk, q_lora], with q_lora_rank
  Weight wk_t;                                 // [H kv_lora, nope]
  Weight wv;                                   // [H v, kv_lora]
  Weight wo;                                   // [E, H v]
  Weight w_gate_up, w_down;                    // dense FFN
  bool is_moe = false;                         // Backend::moe_ffn over `moe` instead
  MoeWeight moe;
  // The lightning indexer; absent (no DSA, or a shared layer): the layer
  // attends to every key, or to the selection of the layer before it.
  bool has_indexer = false;
  Weight index_q;                  // [n_head D, q_lora]
  Weight index_kw;                 // [wk | weights_proj] rows: [D + n_head, E]
  Vec index_k_norm, index_k_bias;  // [D]
};

struct MlaGraph {
  int64_t E = 0, F = 0, V = 0, H = 0;
  MlaParams p;
  float eps = 1e-6f;
  Weight embed, lm_head;
  Vec final_norm;
  int64_t n_main = 0;            // decoder layers
  std::vector<MlaLayer> layers;  // [n_main] and, with an MTP layer, the MTP layer's decoder layer
  Rope rope;
  // The MTP layer (has_mtp): the head's input (mtp_head_input), the
  // decoder layer layers[n_main], then the head (mtp_head_logits). Its
  // embedding and head are the model's placements unless the files carry
  // copies of their own.
  bool has_mtp = false;
  MtpHead mtp;

  int64_t q_width() const { return H * p.qk_dim(); }
  int64_t kv_a_width() const { return p.kv_lora_rank + p.rope; }
  // w_a's output: the q_a rows (or q's), then kv_a's.
  int64_t a_width() const { return (p.q_lora_rank > 0 ? p.q_lora_rank : q_width()) + kv_a_width(); }
  LatentKvRow kv_row() const {
    return {static_cast<int32_t>(p.kv_lora_rank), static_cast<int32_t>(p.rope), static_cast<int32_t>(p.dsa.head_dim)};
  }
  // n_ctx: the longest context (the indexer scores up to that many keys).
  StepLimits step_limits(int64_t max_tokens, int64_t max_sample, int64_t n_ctx) const {
    StepLimits l;
    l.max_tokens = max_tokens;
    l.n_head = static_cast<int32_t>(H);
    l.head_dim = static_cast<int32_t>(p.qk_dim());
    l.embedding = &embed;
    l.lm_head = &lm_head;
    l.max_head_tokens = max_sample;
    l.max_head_cols = std::max(p.nope, p.kv_lora_rank);
    l.max_index_keys = p.dsa.enabled() ? n_ctx : 0;
    return l;
  }
};

Status place_pass(Backend& b, const MlaWeights& w, MlaGraph& g) {
  RILL_TRY(place_embedding_and_head(b, w.embed, w.lm_head, w.tied, w.final_norm, g.embed, g.lm_head, g.final_norm));
  const MlaParams& p = w.params;
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const std::string pre = "layers." + std::to_string(il) + ".";
    const MlaLayerWeights& h = w.layers[il];
    MlaLayer& L = g.layers[il];
    auto vec = [&](const std::vector<float>& v, const std::string& name) {
      return b.place_vector(v.data(), static_cast<int64_t>(v.size()), pre + name);
    };
    RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(h.attn_norm, "input_layernorm.weight"));
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(h.ffn_norm, "post_attention_layernorm.weight"));
    RILL_ASSIGN_OR_RETURN(L.kv_norm, vec(h.kv_norm, "self_attn.kv_a_layernorm.weight"));
    const HostMatrix a[] = {host_matrix(p.q_lora_rank > 0 ? h.q_a.w : h.q.w), host_matrix(h.kv_a.w)};
    RILL_ASSIGN_OR_RETURN(L.w_a, b.place(a, 2, pre + "self_attn.{q_a|q}_proj+kv_a_proj_with_mqa"));
    if (p.q_lora_rank > 0) {
      RILL_ASSIGN_OR_RETURN(L.q_a_norm, vec(h.q_a_norm, "self_attn.q_a_layernorm.weight"));
      const HostMatrix qb = host_matrix(h.q_b.w);
      RILL_ASSIGN_OR_RETURN(L.q_b, b.place(&qb, 1, pre + "self_attn.q_b_proj"));
    }
    // matmul_heads reads W_uk^T and W_uv in a float dtype: `gathered` keeps
    // a backend from requantizing them (CUDA's FP8 weights).
    const size_t es = w.kv_b_dtype == DType::kF32 ? 4 : 2;
    HostMatrix wk{h.wk_t.data(), w.kv_b_dtype, g.H * p.kv_lora_rank, p.nope, static_cast<size_t>(p.nope) * es};
    wk.gathered = true;
    RILL_ASSIGN_OR_RETURN(L.wk_t, b.place(&wk, 1, pre + "self_attn.kv_b_proj (K part, transposed)"));
    HostMatrix wv{h.wv.data(), w.kv_b_dtype, g.H * p.v_dim, p.kv_lora_rank, static_cast<size_t>(p.kv_lora_rank) * es};
    wv.gathered = true;
    RILL_ASSIGN_OR_RETURN(L.wv, b.place(&wv, 1, pre + "self_attn.kv_b_proj (V part)"));
    const HostMatrix om = host_matrix(h.o.w);
    RILL_ASSIGN_OR_RETURN(L.wo, b.place(&om, 1, pre + "self_attn.o_proj"));
    if (L.has_indexer) {
      const HostMatrix iq = host_matrix(h.index_q.w);
      RILL_ASSIGN_OR_RETURN(L.index_q, b.place(&iq, 1, pre + "self_attn.indexer.wq_b"));
      const HostMatrix ikw[] = {host_matrix(h.index_k.w), host_matrix(h.index_w.w)};
      RILL_ASSIGN_OR_RETURN(L.index_kw, b.place(ikw, 2, pre + "self_attn.indexer.{wk,weights_proj}"));
      RILL_ASSIGN_OR_RETURN(L.index_k_norm, vec(h.index_k_norm, "self_attn.indexer.k_norm.weight"));
      RILL_ASSIGN_OR_RETURN(L.index_k_bias, vec(h.index_k_bias, "self_attn.indexer.k_norm.bias"));
    }
    if (h.moe) {
      RILL_ASSIGN_OR_RETURN(L.moe, b.place_moe(h.moe->host(), pre + "mlp (experts)"));
      continue;
    }
    const HostMatrix gu[] = {host_matrix(h.gate.w), host_matrix(h.up.w)};
    RILL_ASSIGN_OR_RETURN(L.w_gate_up, b.place(gu, 2, pre + "mlp.{gate,up}_proj"));
    const HostMatrix dm = host_matrix(h.down.w);
    RILL_ASSIGN_OR_RETURN(L.w_down, b.place(&dm, 1, pre + "mlp.down_proj"));
  }
  if (w.mtp_head) RILL_TRY(place_mtp_head(b, *w.mtp_head, w.embed, g.embed, w.lm_head, g.lm_head, g.mtp));
  RILL_ASSIGN_OR_RETURN(g.rope, b.place_rope(w.rope));
  return Status::Ok();
}

// Places w through `b` inside one Backend::place_model(). Errors name the tensor.
Result<MlaGraph> place_mla(Backend& b, const ModelConfig& cfg, const MlaWeights& w) {
  if (!b.has_mla_ops()) {
    return Error{std::string("the ") + b.name() + " Backend has no multi-head latent attention ops yet (" +
                 cfg.architecture + " runs on the CPU)"};
  }
  MlaGraph g;
  g.E = cfg.n_embd;
  g.V = cfg.n_vocab;
  g.H = cfg.n_head;
  g.p = w.params;
  g.eps = cfg.rms_norm_eps;
  g.n_main = cfg.n_layer;
  g.has_mtp = w.mtp_head.has_value();
  g.mtp.eps = g.eps;  // DeepSeek's head feeds back the layer's output before its norm (feed_back_normed false)
  g.layers.assign(w.layers.size(), MlaLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) {
    g.layers[il].is_moe = w.layers[il].moe.has_value();
    g.layers[il].has_indexer = has_indexer(w.params, static_cast<int64_t>(il));
    if (!g.layers[il].is_moe) g.F = std::max(g.F, w.layers[il].gate.n_out());
  }
  RILL_TRY(b.place_model([&] { return place_pass(b, w, g); }));
  return g;
}

// Activation views for up to the limit's tokens (rows), each dense, F32
// but the matmul inputs h, qn, mlp and final_rows (in the Backend's
// act_dtype()):
//   x [T, E] residual; h [T, E] normed; a [T, a_width]; qn [T, q_lora];
//   q [T, H qk]; q_lat, lat [T, H kv_lora]; attn [T, H v]; gu [T, 2 F];
//   mlp [T, F]; final_rows [S, E]; with DSA the indexer's iq [T, n_head D]
//   and ikw [T, D + n_head] (key, then head weights), and the selection
//   (selected [T, topk], n_selected [T]) that shared layers reuse.
// Where act_dtype() is not F32: attn_act [T, H v] (o_proj's input), and
// F32 copies for the muP scales before their conversion, mlp32 [T, F] and
// final32 [S, E] (empty when unscaled).
struct MlaActivations {
  Tensor x, h, a, qn, q, q_lat, lat, attn, gu, mlp, final_rows, iq, ikw;
  Tensor mtp_h;  // [T, E] hnorm(h), with an MTP layer
  Tensor attn_act, mlp32, final32;
  int32_t* selected = nullptr;
  int32_t* n_selected = nullptr;
};

// The ops of a step of n tokens, their fixed fields filled (the layer loop
// sets the per-layer ones).
struct MlaStepOps {
  LatentKvOp st;
  LatentAttentionOp at;
  LightningIndexOp ix;
};

MlaStepOps mla_step_ops(const MlaGraph& g, const MlaActivations& a, int64_t n) {
  const MlaParams& p = g.p;
  const Tensor act_a = a.a.rows_from(0, n);
  const Tensor q = p.q_lora_rank > 0 ? a.q.rows_from(0, n) : act_a.cols_from(0, g.q_width());
  MlaStepOps o;
  LatentKvOp& st = o.st;
  st.q = q;
  st.kv = act_a.cols_from(g.a_width() - g.kv_a_width(), g.kv_a_width());
  st.n_head = static_cast<int32_t>(g.H);
  st.q_head_dim = static_cast<int32_t>(p.qk_dim());
  st.q_rope_col = static_cast<int32_t>(p.nope);
  st.kv_lora_rank = static_cast<int32_t>(p.kv_lora_rank);
  st.rope_dim = static_cast<int32_t>(p.rope);
  st.norm_eps = g.eps;
  st.rope = g.rope;
  LatentAttentionOp& at = o.at;
  at.q_latent = a.q_lat.rows_from(0, n);
  at.q_rope = q.cols_from(p.nope, g.q_width() - p.nope);
  at.q_rope_step = p.qk_dim();
  at.out = a.lat.rows_from(0, n);
  at.n_head = st.n_head;
  at.kv_lora_rank = st.kv_lora_rank;
  at.rope_dim = st.rope_dim;
  at.scale = p.attn_scale;
  if (p.dsa.enabled()) {
    LightningIndexOp& ix = o.ix;
    const int64_t D = p.dsa.head_dim;
    ix.q = a.iq.rows_from(0, n);
    ix.k = a.ikw.rows_from(0, n).cols_from(0, D);
    ix.w = a.ikw.rows_from(0, n).cols_from(D, p.dsa.n_head);
    ix.n_head = static_cast<int32_t>(p.dsa.n_head);
    ix.head_dim = static_cast<int32_t>(D);
    ix.rope_dim = st.rope_dim;
    ix.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    ix.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.dsa.n_head)));
    ix.rope = g.rope;
    ix.key_col = g.kv_row().index_col();
    ix.topk = static_cast<int32_t>(p.dsa.topk);
    ix.selected = a.selected;
    ix.n_selected = a.n_selected;
    at.selected = a.selected;
    at.n_selected = a.n_selected;
    at.selected_stride = ix.topk;
  }
  return o;
}

// Layer L of a step of md.n_tokens tokens: h holds rms_norm(x) under L's
// attn_norm; adds the attention and FFN branches to the residual x (h is
// scratch afterwards). kv: L's cache.
Status mla_layer(Backend& b, const MlaGraph& g, const MlaLayer& L, MlaStepOps& o, const StepMetadata& md,
                 const MlaActivations& a, const KvCacheView& kv) {
  const int64_t n = md.n_tokens;
  const MlaParams& p = g.p;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n), act_a = a.a.rows_from(0, n);
  const Tensor lat = a.lat.rows_from(0, n), attn = a.attn.rows_from(0, n);
  const float eps = g.eps;
  RILL_TRY(b.matmul(L.w_a, h, act_a, false));
  if (p.q_lora_rank > 0) {
    const Tensor qn = a.qn.rows_from(0, n);
    b.rms_norm(act_a.cols_from(0, p.q_lora_rank), nullptr, L.q_a_norm, eps, 0.0f, qn);
    RILL_TRY(b.matmul(L.q_b, qn, o.st.q, false));
  }
  o.st.kv_norm = L.kv_norm;
  o.st.kv_cache = kv;
  b.rope_store_latent(o.st, md);
  if (L.has_indexer) {  // after the latent row's store, which zeroes the key's columns
    RILL_TRY(b.matmul(L.index_q, a.qn.rows_from(0, n), o.ix.q, false));
    RILL_TRY(b.matmul(L.index_kw, h, a.ikw.rows_from(0, n), false));
    b.layer_norm(o.ix.k, L.index_k_norm, L.index_k_bias, 1e-6f, o.ix.k);
    o.ix.kv = kv;
    b.lightning_index(o.ix, md);
  }
  b.matmul_heads(L.wk_t, o.st.n_head, o.st.q, p.qk_dim(), o.at.q_latent, p.kv_lora_rank);
  o.at.kv = kv;
  b.latent_attention(o.at, md);
  b.matmul_heads(L.wv, o.st.n_head, lat, p.kv_lora_rank, attn, p.v_dim);
  // MiniCPM3's residual scale on o_proj's input: o is linear, so x +=
  // o(s attn) is x += s o(attn) within rounding.
  // Non-F32 activations: o_proj reads attn converted (and the muP scales
  // apply in F32 before their conversions).
  const bool f32_act = b.act_dtype() == DType::kF32;
  const Tensor attn_in = f32_act ? attn : a.attn_act.rows_from(0, n);
  scale_into(b, attn, p.mup.residual, attn_in);
  RILL_TRY(b.matmul(L.wo, attn_in, x, true));
  b.rms_norm(x, nullptr, L.ffn_norm, eps, 0.0f, h);
  if (L.is_moe) return b.moe_ffn(L.moe, h, h, x, true, md);
  const Tensor gu = a.gu.rows_from(0, n), mlp = a.mlp.rows_from(0, n);
  const Tensor glu_out = f32_act || p.mup.residual == 1.0f ? mlp : a.mlp32.rows_from(0, n);
  RILL_TRY(b.matmul_glu(L.w_gate_up, h, Glu::kSilu, gu, glu_out));
  scale_into(b, glu_out, p.mup.residual, mlp);
  return b.matmul(L.w_down, mlp, x, true);
}

// One step: embedding, every decoder layer, the final norm of the sample
// rows and logits [n_sample, V] F32; with `hidden` (a [n_tokens, E] F32
// view), every token's final-normed hidden state too. kv: every layer's
// cache (rows of MlaGraph::kv_row(), group 0). Backend ops only.
Status mla_forward(Backend& b, const MlaGraph& g, const StepMetadata& md, const MlaActivations& a,
                   const std::vector<KvCacheView>& kv, Tensor logits, const Tensor* hidden = nullptr) {
  const int64_t n = md.n_tokens;
  const MlaParams& p = g.p;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n);
  const float eps = g.eps;
  const bool f32_act = b.act_dtype() == DType::kF32;
  b.embed(g.embed, md.ids, n, x);
  if (p.mup.embed != 1.0f) b.scale(x, p.mup.embed);
  b.rms_norm(x, nullptr, g.layers[0].attn_norm, eps, 0.0f, h);
  MlaStepOps ops = mla_step_ops(g, a, n);
  for (int64_t il = 0; il < g.n_main; ++il) {
    const auto l = static_cast<size_t>(il);
    RILL_TRY(mla_layer(b, g, g.layers[l], ops, md, a, kv[l]));
    if (il + 1 < g.n_main) b.rms_norm(x, nullptr, g.layers[l + 1].attn_norm, eps, 0.0f, h);
  }
  if (hidden) b.rms_norm(x, nullptr, g.final_norm, eps, 0.0f, *hidden);
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  const Tensor normed = f32_act || p.mup.logit == 1.0f ? final_rows : a.final32.rows_from(0, md.n_sample);
  b.rms_norm(x, md.sample_rows, g.final_norm, eps, 0.0f, normed);
  scale_into(b, normed, p.mup.logit, final_rows);
  return b.matmul(g.lm_head, final_rows, logits, false);
}

// The MTP layer over a step (Model::forward_mtp): token j is t_{p+1} at
// position p, hidden [n_tokens, E] the model's final-normed h_p. The
// head's input (eh_proj over enorm(emb(t_{p+1})) and hnorm(h_p)), the MTP
// decoder layer (its KV: kv[n_main]), then the shared head's norm and head
// for the sample rows: logits [n_sample, V]; with `out`, every token's
// layer output before that norm ([n_tokens, E] F32). Backend ops only:
// graph-capturable on CUDA.
Status mla_mtp_forward(Backend& b, const MlaGraph& g, const StepMetadata& md, const MlaActivations& a,
                       const std::vector<KvCacheView>& kv, Tensor hidden, Tensor logits, const Tensor* out) {
  assert(g.has_mtp);
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n);
  const MlaLayer& L = g.layers[static_cast<size_t>(g.n_main)];
  RILL_TRY(mtp_head_input(b, g.mtp, md.ids, n, hidden, x, h, a.mtp_h.rows_from(0, n)));
  b.rms_norm(x, nullptr, L.attn_norm, g.eps, 0.0f, h);
  MlaStepOps ops = mla_step_ops(g, a, n);
  RILL_TRY(mla_layer(b, g, L, ops, md, a, kv[static_cast<size_t>(g.n_main)]));
  return mtp_head_logits(b, g.mtp, x, md.sample_rows, a.final_rows.rows_from(0, md.n_sample), logits, out);
}

// --- The CPU runtime ------------------------------------------------------------

class MlaModel final : public CpuPagedModel {
 public:
  MlaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);
  Status forward(const Batch& batch, float* logits) override;
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }
  Status forward_hidden(const Batch& batch, float* logits, float* hidden) override;
  Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) override;
  // Every layer keeps its latent rows in group 0 (one row split over the K
  // and V planes: row_bytes is one plane's).
  std::vector<KvLayer> kv_layers() const override {
    return cache_kv_layers([](int64_t) { return 0; });
  }

 private:
  std::unique_ptr<Backend> device_;  // on backend_'s threads
  MlaWeights w_;                     // the CPU Backend views kv_b's copies
  MlaGraph graph_;
  // Checks the batch against the limits and fills step_; its metadata.
  Result<StepMetadata> begin_step(const Batch& batch);

  std::vector<float> x_, h_, a_, qn_, q_, q_lat_, lat_, attn_, gu_, mlp_, final_rows_, iq_, ikw_, mtp_h_;  // f32
  std::vector<int32_t> selected_, n_selected_;                                                             // DSA
  MlaActivations act_;
  CpuStepArrays step_;
  std::vector<KvCacheView> kv_views_;  // per layer
};

Status MlaModel::init(const ModelOptions& options) {
  RILL_ASSIGN_OR_RETURN(w_, bind_mla(*files_, options.mtp));
  device_ = make_cpu_backend_on(*backend_->pool());
  RILL_ASSIGN_OR_RETURN(graph_, place_mla(*device_, cfg_, w_));
  set_limits(options);
  kv_spec_ = {full()};
  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise f16.
  const DType kv_dtype = w_.all_f32 ? DType::kF32 : DType::kF16;
  // The latent rows are read by latent_attention in their float dtype only:
  // refuse quantized KV types (model/kv_types.h) rather than misread them.
  if (!options.kv_types.empty()) {
    RILL_ASSIGN_OR_RETURN(const std::vector<KvLayerTypes> types, options.kv_types.resolve(cfg_.n_layer, kv_dtype));
    for (const KvLayerTypes& t : types) {
      if (t.k != KvType{kv_dtype, false} || t.v != KvType{kv_dtype, false}) {
        return Error{files_->path + ": multi-head latent attention keeps its latent KV rows in " +
                     std::string(dtype_name(kv_dtype)) + ", not " + kv_type_name(t.k) + "/" + kv_type_name(t.v) +
                     "; drop --kv-type / --kv-config"};
      }
    }
  }
  const int64_t plane = graph_.kv_row().plane_width();
  // The MTP layer's rows are one more layer of the pool.
  const int64_t n_kv_layers = static_cast<int64_t>(graph_.layers.size());
  RILL_TRY(create_kv(options, n_kv_layers, plane, plane, kv_dtype));
  for (int64_t il = 0; il < n_kv_layers; ++il) kv_views_.push_back(kv_.layer_view(il));

  const int64_t T = max_tokens_, H = graph_.H;
  const MlaParams& p = graph_.p;
  auto view = [](std::vector<float>& v, int64_t rows, int64_t cols) {
    v.resize(static_cast<size_t>(rows * cols));
    return Tensor::dense(v.data(), DType::kF32, rows, cols);
  };
  act_ = {view(x_, T, graph_.E),
          view(h_, T, graph_.E),
          view(a_, T, graph_.a_width()),
          view(qn_, T, p.q_lora_rank),
          view(q_, T, p.q_lora_rank > 0 ? graph_.q_width() : 0),
          view(q_lat_, T, H * p.kv_lora_rank),
          view(lat_, T, H * p.kv_lora_rank),
          view(attn_, T, H * p.v_dim),
          view(gu_, T, 2 * graph_.F),
          view(mlp_, T, graph_.F),
          view(final_rows_, max_seqs_, graph_.E),
          view(iq_, T, p.dsa.n_head * p.dsa.head_dim),
          view(ikw_, T, p.dsa.head_dim + p.dsa.n_head),
          view(mtp_h_, graph_.has_mtp ? T : 0, graph_.E),
          Tensor{},  // F32 activations: no converted copies
          Tensor{},
          Tensor{}};
  selected_.resize(static_cast<size_t>(T * p.dsa.topk));
  n_selected_.resize(static_cast<size_t>(T));
  act_.selected = selected_.data();
  act_.n_selected = n_selected_.data();
  step_.reserve(T);
  return device_->reserve(graph_.step_limits(T, max_seqs_, n_ctx_));
}

Result<StepMetadata> MlaModel::begin_step(const Batch& batch) {
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim, kv_spec_));
  return step_metadata(batch, step_);
}

Status MlaModel::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  return mla_forward(*device_, graph_, md, act_, kv_views_,
                     Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab));
}

Status MlaModel::forward_hidden(const Batch& batch, float* logits, float* hidden) {
  if (batch.n_tokens() <= 0) return {};
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  const Tensor rows = Tensor::dense(hidden, DType::kF32, md.n_tokens, cfg_.n_embd);
  return mla_forward(*device_, graph_, md, act_, kv_views_,
                     Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), &rows);
}

Status MlaModel::forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
  if (!graph_.has_mtp) return Error{files_->path + ": no MTP layer bound (ModelOptions::mtp)"};
  if (batch.n_tokens() <= 0) return {};
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  // The hidden rows are only read (rms_norm's input).
  const Tensor rows = Tensor::dense(const_cast<float*>(hidden), DType::kF32, md.n_tokens, cfg_.n_embd);
  const Tensor out = Tensor::dense(mtp_hidden, DType::kF32, md.n_tokens, cfg_.n_embd);
  return mla_mtp_forward(*device_, graph_, md, act_, kv_views_, rows,
                         Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), mtp_hidden ? &out : nullptr);
}

// --- The CUDA runtime's glue ------------------------------------------------------

#if RILL_HAVE_CUDA
class MlaCudaModel final : public CudaModelBase {
 public:
  explicit MlaCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;

  MlaGraph graph_;
  MlaActivations act_views_;           // over the arena
  std::vector<KvCacheView> kv_views_;  // per layer (the MTP layer's last)
};

Status MlaCudaModel::init(const ModelOptions& options) {
  // The dims the base runtime reads; the attention heads' limits of
  // read_dims() do not apply (no per-head K/V).
  E_ = cfg_.n_embd;
  V_ = cfg_.n_vocab;
  F_ = cfg_.n_ff;
  n_head_ = cfg_.n_head;
  RILL_ASSIGN_OR_RETURN(const MlaWeights w, bind_mla(*files_, options.mtp));
  const MlaParams& p = w.params;
  hd_ = p.qk_dim();
  if (p.kv_lora_rank + p.rope > cuda::kLatentMaxRow) {
    return Error{files_->path + ": kv_lora_rank + qk_rope_head_dim " + std::to_string(p.kv_lora_rank + p.rope) +
                 " is above the CUDA latent attention's " + std::to_string(cuda::kLatentMaxRow)};
  }
  if (!options.kv_types.empty()) {
    return Error{files_->path +
                 ": multi-head latent attention keeps its latent KV rows in the model's float dtype; "
                 "drop --kv-type / --kv-config"};
  }
  RILL_TRY(create_context());
  std::vector<const WeightView*> mats;
  for (const MlaLayerWeights& L : w.layers) {
    for (const Linear* l : {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.o, &L.gate, &L.up, &L.down}) {
      if (l->w.data) mats.push_back(&l->w);
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(files_->path, mats, w.embed));
  act_ = dt.act;
  kv_dtype_ = w.all_f32 ? DType::kF32 : DType::kF16;  // as the CPU model
  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(graph_, place_mla(*backend_, cfg_, w));
  kv_spec_ = {full()};
  // The MTP layer (--spec mtp): its latent rows are one more layer of the
  // pool, and the base runs its step kinds (forward_hidden, forward_mtp).
  const auto n_kv_layers = static_cast<int64_t>(graph_.layers.size());
  n_kv_layers_ = n_kv_layers;
  mtp_rows_ = graph_.has_mtp;
  kv_widths_.assign(static_cast<size_t>(n_kv_layers), graph_.kv_row().plane_width());
  RILL_TRY(init_runtime(options));
  for (int64_t l = 0; l < n_kv_layers; ++l) kv_views_.push_back(kv_view(static_cast<size_t>(l)));
  return Status::Ok();
}

void MlaCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs(), H = graph_.H;
  const MlaParams& p = graph_.p;
  const bool f32 = act_ == DType::kF32;
  MlaActivations& v = act_views_;
  v.x = carve_tensor(a, DType::kF32, T, E_);
  v.h = carve_tensor(a, act_, T, E_);
  v.a = carve_tensor(a, DType::kF32, T, graph_.a_width());
  v.qn = carve_tensor(a, act_, T, p.q_lora_rank);
  v.q = carve_tensor(a, DType::kF32, T, p.q_lora_rank > 0 ? graph_.q_width() : 0);
  v.q_lat = carve_tensor(a, DType::kF32, T, H * p.kv_lora_rank);
  v.lat = carve_tensor(a, DType::kF32, T, H * p.kv_lora_rank);
  v.attn = carve_tensor(a, DType::kF32, T, H * p.v_dim);
  v.attn_act = carve_tensor(a, act_, T, f32 ? 0 : H * p.v_dim);
  v.gu = carve_tensor(a, DType::kF32, T, 2 * graph_.F);
  v.mlp = carve_tensor(a, act_, T, graph_.F);
  v.mlp32 = carve_tensor(a, DType::kF32, T, f32 || p.mup.residual == 1.0f ? 0 : graph_.F);
  v.final_rows = carve_tensor(a, act_, S, E_);
  v.mtp_h = carve_tensor(a, act_, T, graph_.has_mtp ? E_ : 0);
  v.final32 = carve_tensor(a, DType::kF32, S, f32 || p.mup.logit == 1.0f ? 0 : E_);
  v.iq = carve_tensor(a, DType::kF32, T, p.dsa.n_head * p.dsa.head_dim);
  v.ikw = carve_tensor(a, DType::kF32, T, p.dsa.head_dim + p.dsa.n_head);
  v.selected = a.take<int32_t>(static_cast<size_t>(T * p.dsa.topk));
  v.n_selected = a.take<int32_t>(static_cast<size_t>(p.dsa.enabled() ? T : 0));
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S, n_ctx()));
}

// The shared graph over the uploaded step metadata, as step_kind() asks:
// the logits, also every token's final-normed hidden state (rows_out()),
// or the MTP layer over the hidden rows in rows_in().
Status MlaCudaModel::run_layers(const Step& s) {
  const StepMetadata md = step_metadata(s);
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.V);
  const Tensor rows = Tensor::dense(rows_out(), DType::kF32, s.n, E_);
  switch (step_kind()) {
    case StepKind::kHidden:
      return mla_forward(*backend_, graph_, md, act_views_, kv_views_, logits, &rows);
    case StepKind::kMtp:
      return mla_mtp_forward(*backend_, graph_, md, act_views_, kv_views_,
                             Tensor::dense(rows_in(), DType::kF32, s.n, E_), logits, &rows);
    case StepKind::kForward:
      break;
  }
  return mla_forward(*backend_, graph_, md, act_views_, kv_views_, logits);
}
#endif  // RILL_HAVE_CUDA

}  // namespace

Result<std::unique_ptr<Model>> create_mla_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                    const ModelOptions& options) {
  return init_model(std::make_unique<MlaModel>(std::move(files), options), options);
}

Result<std::unique_ptr<Model>> create_mla_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                     const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<MlaCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
