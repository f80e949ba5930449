// The hybrid gated-DeltaNet family: Qwen3.5 (qwen3_5_text, dense FFN) and
// Qwen3-Next (qwen3_next, MoE FFN with a shared expert). Layers alternate
// between two token mixers, per config.layer_types (or, in older Qwen3-Next
// configs, every full_attention_interval-th layer is full attention):
//   linear_attention  the Gated DeltaNet layer (model/gated_delta.h), with a
//                     recurrent state per sequence in a state slot
//   full_attention    gated attention: q_proj yields per head [query | gate],
//                     q/k RMSNorm over head_dim, partial rotary
//                     (partial_rotary_factor), out = o_proj(attn * sigmoid(gate))
// Every RMSNorm but the gated one scales by (1 + w). KV layout:
// {full(), recurrent()}: group 0 pages the attention layers' K/V, group 1 is
// the state slots of the linear-attention layers (the runtime's state pool,
// model/state_pool.h).
// GGUF files (llama.cpp's qwen35 / qwen3next; names and config keys mapped in
// loader/gguf_names.cpp) differ in what a name mapping cannot undo: the
// (1 + w) norms are stored with the 1 added (norm offset 0 here), and qwen35
// tiles the linear layers' value heads (model/gated_delta.h): the
// in-projection rows are put back in Hugging Face's order at placement and
// the gated norm writes out_proj's input in the tiled order.
//
// One graph (HybridGraph, place_hybrid, hybrid_forward) over Backend ops runs
// on every device; below it the CPU runtime (`qwen3_next.cpu`, a
// CpuPagedModel) and the CUDA runtime's glue (`qwen3_next.cuda`, over
// model/cuda_model_base.h, whose decode graphs capture the forward). Both
// keep the recurrent states in their runtime's StatePool. Placement:
//  - a linear layer's in-projections are one weight whose rows are [q | k |
//    v | z | b | a] (Qwen3-Next's per-key-head groups of in_proj_qkvz /
//    in_proj_ba, and qwen35's tiled value heads, reassembled on the host),
//    so the layer reads one [T, P] f32 row per token;
//  - an attention layer's q_proj per-head [query | gate] rows are split into
//    [q heads | k | v | gate heads], so rope_store_kv runs on the first
//    Q + 2 KV columns and sigmoid_mul reads the gate columns;
//  - o_proj, out_proj and down_proj accumulate into the f32 residual, and so
//    does Qwen3-Next's MoE FFN (Backend::moe_ffn, shared expert included).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "loader/mtp_layers.h"
#include "model/arch/families.h"
#include "model/arch/qwen3_next_config.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/gated_delta.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/mtp_head.h"
#include "model/placement.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gated_delta.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {
namespace {

// --- The graph, for every device ---------------------------------------------

struct HybridLayerWeights {
  bool linear = false;
  int64_t index = 0;                      // among the linear layers (state) or the attention layers (KV)
  std::vector<float> in_norm, post_norm;  // [E]
  GatedDeltaNet gdn;                      // linear attention
  Linear q, k, v, o;                      // gated attention; q: per head [query | gate]
  std::vector<float> q_norm, k_norm;      // [hd]
  Linear gate, up, down;                  // dense FFN
  std::optional<MoeFfn> moe;              // Qwen3-Next's MoE layers, instead of gate/up/down
};

// The checkpoint as the files hold it (matrices view the mapping), and the
// host rows of the reassembled in-projections, which placement views on
// the CPU (keep the weights while the CPU Backend lives).
struct HybridWeights {
  HybridConfig hybrid;
  float norm_offset = 1.0f;  // RMSNorm scales by (norm_offset + w): 1 for HF, 0 for GGUF
  int64_t hd = 0, Q = 0, KV = 0, n_attn = 0, n_linear = 0;
  WeightView embed, lm_head;  // lm_head: the embedding when tied
  bool tied = true;
  std::vector<float> final_norm;
  std::vector<HybridLayerWeights> layers;
  // The MTP layer (ModelOptions::mtp): a full-attention decoder layer whose
  // K and V are attention layer n_attn of the pool, and its head.
  std::optional<HybridLayerWeights> mtp_layer;
  std::optional<MtpHeadWeights> mtp_head;
  RopeTable rope;
  bool all_f32 = false;  // embedding and layer matrices: f32 KV
  std::deque<std::vector<uint8_t>> assembled;

  std::vector<const WeightView*> layer_matrices() const {
    std::vector<const WeightView*> out;
    for (const HybridLayerWeights& L : layers) {
      if (L.linear) {
        const GatedDeltaNet& g = L.gdn;
        out.push_back(g.fused ? &g.qkvz.w : &g.qkv.w);
        out.push_back(&g.out.w);
      } else {
        out.push_back(&L.q.w);
        out.push_back(&L.o.w);
      }
      if (L.moe) {
        L.moe->collect_weights(&out);
      } else {
        for (const Linear* l : {&L.gate, &L.up, &L.down}) out.push_back(&l->w);
      }
    }
    return out;
  }
};

Status bind_layer(const ModelFiles& f, const std::string& p, int64_t il, HybridWeights& w, HybridLayerWeights& L) {
  const ModelConfig& cfg = f.config;
  const int64_t E = cfg.n_embd;
  const bool v_tiled = f.format == ModelFormat::kGguf && cfg.architecture == "qwen3_5_text";
  RILL_ASSIGN_OR_RETURN(L.in_norm, load_vector(f, p + "input_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.post_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
  if (L.linear) {
    RILL_ASSIGN_OR_RETURN(L.gdn,
                          bind_gated_delta_net(f, p + "linear_attn.", w.hybrid.gdn, E, cfg.rms_norm_eps, v_tiled));
  } else {
    RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", 2 * w.Q, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", w.KV, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", w.KV, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", E, w.Q, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", w.hd));
    RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", w.hd));
  }
  if (is_moe_layer(cfg, il)) {
    RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind(f, p + "mlp.", moe_params(cfg)));
    return Status::Ok();
  }
  RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, p + "mlp.gate_proj", cfg.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, p + "mlp.up_proj", cfg.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, p + "mlp.down_proj", E, cfg.n_ff));
  return Status::Ok();
}

// Binds the files' weights after checking the config; max_head_dim is the
// runtime's (errors name the file and the field or tensor).
Result<HybridWeights> bind_hybrid(const ModelFiles& f, int64_t max_head_dim, bool mtp) {
  const ModelConfig& cfg = f.config;
  const int64_t E = cfg.n_embd, V = cfg.n_vocab;
  if (E <= 0 || V <= 0 || cfg.n_layer <= 0 || cfg.n_head <= 0 || cfg.n_head_kv <= 0 ||
      cfg.n_head % cfg.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg.n_head) + "/" + std::to_string(cfg.n_head_kv) + ")"};
  }
  const bool gguf = f.format == ModelFormat::kGguf;
  HybridWeights w;
  RILL_ASSIGN_OR_RETURN(w.hybrid, read_hybrid_config(cfg, gguf ? f.path : f.path + "/config.json"));
  w.norm_offset = gguf ? 0.0f : 1.0f;
  w.hd = cfg.head_dim > 0 ? cfg.head_dim : E / cfg.n_head;
  if (w.hd <= 0 || w.hd > max_head_dim || w.hd % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(w.hd) + " is not supported (even, at most " +
                 std::to_string(max_head_dim) + ")"};
  }
  w.Q = cfg.n_head * w.hd;
  w.KV = cfg.n_head_kv * w.hd;
  const std::string root = hybrid_tensor_root(f);
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, root + "embed_tokens.weight", V, E));
  w.lm_head = w.embed;
  w.tied = !f.find("lm_head.weight");
  if (!w.tied) {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, "lm_head.weight", V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, root + "norm.weight", E));
  w.all_f32 = w.embed.dtype == DType::kF32;
  w.layers.resize(static_cast<size_t>(cfg.n_layer));
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    HybridLayerWeights& L = w.layers[static_cast<size_t>(il)];
    L.linear = w.hybrid.is_linear[static_cast<size_t>(il)] != 0;
    L.index = L.linear ? w.n_linear++ : w.n_attn++;
    RILL_TRY(bind_layer(f, root + "layers." + std::to_string(il) + ".", il, w, L));
    const WeightView& first = L.linear ? (L.gdn.fused ? L.gdn.qkvz : L.gdn.qkv).w : L.q.w;
    w.all_f32 = w.all_f32 && first.dtype == DType::kF32;
  }
  if (w.n_attn == 0 || w.n_linear == 0) {
    return Error{f.path + ": a hybrid model needs both linear_attention and full_attention layers"};
  }
  if (mtp) {  // Qwen3-Next / Qwen3.5 mtp.* (or GGUF blk.N.nextn.*): one full-attention layer
    RILL_ASSIGN_OR_RETURN(const MtpLayers found, find_mtp_layers(f));
    if (found.n_layers() == 0) return Error{f.path + ": --spec mtp: the files carry no multi-token-prediction layers"};
    HybridLayerWeights& L = w.mtp_layer.emplace();
    L.index = w.n_attn;
    RILL_TRY(bind_layer(f, found.prefixes[0], cfg.n_layer, w, L));
    RILL_ASSIGN_OR_RETURN(w.mtp_head, bind_mtp_head(f, found, w.embed, w.lm_head));
  }
  const int64_t rot_dim = cfg.rope_dim > 0 ? cfg.rope_dim : w.hd;
  if (rot_dim > w.hd || rot_dim % 2 != 0 || cfg.rope_scaling.type != RopeScaling::Type::kNone) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) +
                 " must be even and at most head_dim, without rope scaling"};
  }
  w.rope = cpu::make_rope_table(cfg.rope_theta, rot_dim, false);
  return w;
}

// One layer as the Backend placed it.
struct HybridLayer {
  bool linear = false;
  int64_t index = 0;  // among the linear layers (state) or the attention layers (KV)
  Vec in_norm, post_norm;
  // linear attention
  Weight w_in;  // [P, E]: q|k|v (conv_dim), z (vd), b, a (nv each)
  Vec conv_w, neg_a, dt_bias, gdn_norm;
  float gdn_eps = 1e-6f;
  int32_t tiled_k_heads = 0;  // qwen35 GGUF: out_proj's columns in the tiled order
  Weight w_out;               // [E, vd]
  // gated attention
  Weight w_qkvg;  // [Q + 2 KV + Q, E]: q heads | k | v | gate heads
  Vec b_qkvg;     // [Q + 2 KV + Q] or absent
  Vec q_norm, k_norm;
  Weight w_o;  // [E, Q]
  Vec b_o;
  // FFN
  Weight w_gate_up, w_down;
  bool is_moe = false;  // Backend::moe_ffn over `moe` instead
  MoeWeight moe;
};

struct HybridGraph {
  int64_t E = 0, F = 0, hd = 0, Q = 0, KV = 0, V = 0;
  int32_t n_head = 0, n_head_kv = 0;
  GatedDeltaDims gdn;
  int64_t n_attn = 0, n_linear = 0;
  float eps = 1e-6f, norm_offset = 1.0f, attn_scale = 1.0f;
  Weight embed, lm_head;
  Vec final_norm;
  std::vector<HybridLayer> layers;
  Rope rope;
  // The MTP layer (HybridWeights::mtp_layer) and its head; the head's
  // output, after mtp.norm, is what a chained draft feeds back.
  bool has_mtp = false;
  HybridLayer mtp_layer;
  MtpHead mtp;

  int64_t in_width() const { return gdn.conv_dim() + gdn.value_dim() + 2 * gdn.n_v_heads; }  // P
  int64_t qkvg_width() const { return 2 * Q + 2 * KV; }
  int64_t proj_width() const { return std::max(in_width(), qkvg_width()); }
  bool has_dense_ffn() const {
    return std::any_of(layers.begin(), layers.end(), [](const HybridLayer& L) { return !L.is_moe; });
  }
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
  // The recurrent state of one linear layer: its conv window, then its delta state.
  std::vector<Model::StateTensor> state_tensors() const {
    return {{"conv", {gdn.conv_dim(), gdn.conv_kernel - 1}},
            {"delta", {gdn.n_v_heads, gdn.head_k_dim, gdn.head_v_dim}}};
  }
};

// Rows [r0, r0 + n) of w appended to out.
void append_rows(const WeightView& w, int64_t r0, int64_t n, std::vector<uint8_t>& out) {
  const size_t rb = row_bytes(w.dtype, w.n_cols);
  const size_t stride = w.row_stride > 0 ? w.row_stride : rb;
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r0 + n; ++r) out.insert(out.end(), src + r * stride, src + r * stride + rb);
}

// A matrix of rows gathered from w by `runs` ({first row, rows}), kept in
// `store`.
HostMatrix gathered(const WeightView& w, const std::vector<std::pair<int64_t, int64_t>>& runs,
                    std::deque<std::vector<uint8_t>>& store) {
  std::vector<uint8_t>& buf = store.emplace_back();
  int64_t rows = 0;
  for (const auto& [r0, n] : runs) {
    append_rows(w, r0, n, buf);
    rows += n;
  }
  return {buf.data(), w.dtype, rows, w.n_cols, row_bytes(w.dtype, w.n_cols)};
}

// A linear layer's in-projection parts, rows [q | k | v | z | b | a] in
// Hugging Face's head order: views where the file has that order
// (Qwen3.5), rows gathered otherwise (Qwen3-Next's per-key-head groups,
// qwen35's tiled value heads).
std::vector<HostMatrix> in_projection(const GatedDeltaNet& g, std::deque<std::vector<uint8_t>>& store) {
  const GatedDeltaDims& d = g.dims;
  const int64_t nk = d.n_k_heads, nv = d.n_v_heads, r = nv / nk, dk = d.head_k_dim, dv = d.head_v_dim;
  const int64_t kd = d.key_dim(), group = 2 * dk + 2 * r * dv;
  // The file's value head of Hugging Face's head h.
  auto file_head = [&](int64_t h) { return g.v_tiled ? (h % r) * nk + h / r : h; };
  std::vector<HostMatrix> parts;
  if (g.fused) {  // per key head: [q | k | v (r dv) | z (r dv)]
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t kh = 0; kh < nk; ++kh) runs.push_back({kh * group, dk});
    for (int64_t kh = 0; kh < nk; ++kh) runs.push_back({kh * group + dk, dk});
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t fh = file_head(h);
      runs.push_back({(fh / r) * group + 2 * dk + (fh % r) * dv, dv});
    }
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t fh = file_head(h);
      runs.push_back({(fh / r) * group + 2 * dk + r * dv + (fh % r) * dv, dv});
    }
    parts.push_back(gathered(g.qkvz.w, runs, store));
  } else if (g.v_tiled) {
    std::vector<std::pair<int64_t, int64_t>> qkv = {{0, 2 * kd}}, z;
    for (int64_t h = 0; h < nv; ++h) qkv.push_back({2 * kd + file_head(h) * dv, dv});
    for (int64_t h = 0; h < nv; ++h) z.push_back({file_head(h) * dv, dv});
    parts.push_back(gathered(g.qkv.w, qkv, store));
    parts.push_back(gathered(g.z.w, z, store));
  } else {
    parts.push_back(host_matrix(g.qkv.w));
    parts.push_back(host_matrix(g.z.w));
  }
  if (g.fused_ba) {  // per key head: [b (r) | a (r)]
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t part : {int64_t{0}, r}) {
      for (int64_t h = 0; h < nv; ++h) {
        const int64_t fh = file_head(h);
        runs.push_back({(fh / r) * 2 * r + part + fh % r, 1});
      }
    }
    parts.push_back(gathered(g.ba.w, runs, store));
  } else if (g.v_tiled) {
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t h = 0; h < nv; ++h) runs.push_back({file_head(h), 1});
    parts.push_back(gathered(g.b.w, runs, store));
    parts.push_back(gathered(g.a.w, runs, store));
  } else {
    parts.push_back(host_matrix(g.b.w));
    parts.push_back(host_matrix(g.a.w));
  }
  return parts;
}

// One pass of place_hybrid's placement (Backend::place_model may run it twice).
// One decoder layer, its tensors named "<p>..." (for messages).
Status place_layer(Backend& b, HybridWeights& w, const HybridGraph& g, const HybridLayerWeights& h,
                   const std::string& p, HybridLayer& L) {
  auto vec = [&](const std::vector<float>& v, const std::string& name) {
    return b.place_vector(v.data(), static_cast<int64_t>(v.size()), p + name);
  };
  RILL_ASSIGN_OR_RETURN(L.in_norm, vec(h.in_norm, "input_layernorm.weight"));
  RILL_ASSIGN_OR_RETURN(L.post_norm, vec(h.post_norm, "post_attention_layernorm.weight"));
  if (h.linear) {
    const GatedDeltaNet& d = h.gdn;
    const std::vector<HostMatrix> parts = in_projection(d, w.assembled);
    RILL_ASSIGN_OR_RETURN(L.w_in, b.place(parts.data(), static_cast<int>(parts.size()), p + "linear_attn.in_proj"));
    RILL_ASSIGN_OR_RETURN(L.conv_w, vec(d.conv_w, "linear_attn.conv1d.weight"));
    RILL_ASSIGN_OR_RETURN(L.neg_a, vec(d.neg_a, "linear_attn.A_log"));
    RILL_ASSIGN_OR_RETURN(L.dt_bias, vec(d.dt_bias, "linear_attn.dt_bias"));
    RILL_ASSIGN_OR_RETURN(L.gdn_norm, vec(d.norm_w, "linear_attn.norm.weight"));
    const HostMatrix om = host_matrix(d.out.w);
    RILL_ASSIGN_OR_RETURN(L.w_out, b.place(&om, 1, p + "linear_attn.out_proj"));
    L.gdn_eps = d.eps;
    L.tiled_k_heads = d.v_tiled ? static_cast<int32_t>(d.dims.n_k_heads) : 0;
  } else {
    std::vector<std::pair<int64_t, int64_t>> qr, gr;
    for (int64_t hh = 0; hh < g.n_head; ++hh) {
      qr.push_back({hh * 2 * g.hd, g.hd});
      gr.push_back({hh * 2 * g.hd + g.hd, g.hd});
    }
    const HostMatrix parts[] = {gathered(h.q.w, qr, w.assembled), host_matrix(h.k.w), host_matrix(h.v.w),
                                gathered(h.q.w, gr, w.assembled)};
    RILL_ASSIGN_OR_RETURN(L.w_qkvg, b.place(parts, 4, p + "self_attn.{q,k,v}_proj"));
    if (!h.q.bias.empty() || !h.k.bias.empty() || !h.v.bias.empty()) {
      std::vector<float> bias(static_cast<size_t>(g.qkvg_width()), 0.0f);  // zeros where a part has none
      if (!h.q.bias.empty()) {
        for (int64_t hh = 0; hh < g.n_head; ++hh) {
          const auto src = h.q.bias.begin() + hh * 2 * g.hd;
          std::copy(src, src + g.hd, bias.begin() + hh * g.hd);
          std::copy(src + g.hd, src + 2 * g.hd, bias.begin() + g.Q + 2 * g.KV + hh * g.hd);
        }
      }
      std::copy(h.k.bias.begin(), h.k.bias.end(), bias.begin() + g.Q);
      std::copy(h.v.bias.begin(), h.v.bias.end(), bias.begin() + g.Q + g.KV);
      RILL_ASSIGN_OR_RETURN(L.b_qkvg, vec(bias, "self_attn qkv bias"));
    }
    RILL_ASSIGN_OR_RETURN(L.q_norm, vec(h.q_norm, "self_attn.q_norm.weight"));
    RILL_ASSIGN_OR_RETURN(L.k_norm, vec(h.k_norm, "self_attn.k_norm.weight"));
    const HostMatrix om = host_matrix(h.o.w);
    RILL_ASSIGN_OR_RETURN(L.w_o, b.place(&om, 1, p + "self_attn.o_proj"));
    if (!h.o.bias.empty()) {
      RILL_ASSIGN_OR_RETURN(L.b_o, vec(h.o.bias, "self_attn.o_proj.bias"));
    }
  }
  if (h.moe) {
    RILL_ASSIGN_OR_RETURN(L.moe, b.place_moe(h.moe->host(), p + "mlp (experts)"));
    return Status::Ok();
  }
  const HostMatrix gu[] = {host_matrix(h.gate.w), host_matrix(h.up.w)};
  RILL_ASSIGN_OR_RETURN(L.w_gate_up, b.place(gu, 2, p + "mlp.{gate,up}_proj"));
  const HostMatrix dm = host_matrix(h.down.w);
  RILL_ASSIGN_OR_RETURN(L.w_down, b.place(&dm, 1, p + "mlp.down_proj"));
  return Status::Ok();
}

Status place_pass(Backend& b, HybridWeights& w, HybridGraph& g) {
  w.assembled.clear();
  RILL_TRY(place_embedding_and_head(b, w.embed, w.lm_head, w.tied, w.final_norm, g.embed, g.lm_head, g.final_norm));
  for (size_t il = 0; il < w.layers.size(); ++il) {
    RILL_TRY(place_layer(b, w, g, w.layers[il], "layers." + std::to_string(il) + ".", g.layers[il]));
  }
  if (w.mtp_layer) {
    RILL_TRY(place_layer(b, w, g, *w.mtp_layer, "MTP layer ", g.mtp_layer));
    RILL_TRY(place_mtp_head(b, *w.mtp_head, w.embed, g.embed, w.lm_head, g.lm_head, g.mtp));
  }
  RILL_ASSIGN_OR_RETURN(g.rope, b.place_rope(w.rope));
  return Status::Ok();
}

// Places w through `b` inside one Backend::place_model() (CUDA: one device
// buffer). w keeps the reassembled rows (the CPU Backend views them).
Result<HybridGraph> place_hybrid(Backend& b, const ModelConfig& cfg, HybridWeights& w) {
  HybridGraph g;
  g.E = cfg.n_embd;
  g.F = cfg.n_ff;
  g.hd = w.hd;
  g.Q = w.Q;
  g.KV = w.KV;
  g.V = cfg.n_vocab;
  g.n_head = static_cast<int32_t>(cfg.n_head);
  g.n_head_kv = static_cast<int32_t>(cfg.n_head_kv);
  g.gdn = w.hybrid.gdn;
  g.n_attn = w.n_attn;
  g.n_linear = w.n_linear;
  g.eps = cfg.rms_norm_eps;
  g.norm_offset = w.norm_offset;
  g.attn_scale = 1.0f / std::sqrt(static_cast<float>(w.hd));
  g.layers.assign(w.layers.size(), HybridLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) {
    g.layers[il].linear = w.layers[il].linear;
    g.layers[il].index = w.layers[il].index;
    g.layers[il].is_moe = w.layers[il].moe.has_value();
  }
  g.has_mtp = w.mtp_layer.has_value();
  if (g.has_mtp) {
    g.mtp_layer.index = w.mtp_layer->index;
    g.mtp_layer.is_moe = w.mtp_layer->moe.has_value();
    g.mtp.eps = g.eps;
    g.mtp.w_offset = g.norm_offset;
    g.mtp.feed_back_normed = true;  // vLLM's qwen3_next_mtp returns mtp.norm's output
  }
  RILL_TRY(b.place_model([&] { return place_pass(b, w, g); }));
  return g;
}

// Activation views for up to the limit's tokens (rows), each dense:
//   x [T, E] F32 residual; h [T, E] act (normed); proj [T, max(P, QKVG)]
//   F32 in-projections; mixed [T, conv_dim], g and beta [T, nv], core [T,
//   vd] F32 (the DeltaNet's); attn [T, Q] F32; mix [T, max(vd, Q)] act
//   (out_proj's / o_proj's input); gu [T, 2 F] F32 and mlp [T, F] act (dense
//   FFN layers only); final_rows [S, E] act.
struct HybridActivations {
  Tensor x, h, proj, mixed, g, beta, core, attn, mix, gu, mlp, final_rows;
  Tensor mtp_h;  // [T, E] act: the MTP head's hnorm(h) (with an MTP layer)
};

// What a step's layers share: the ops' fixed fields and the step's views.
struct HybridStepOps {
  GatedDeltaOp gd;
  RopeKvOp rk;
  AttentionOp at;
  Tensor p_in, p_qkvg, core, attn, z, gdn_out, gate, attn_out;
};

HybridStepOps hybrid_step_ops(const HybridGraph& g, const HybridActivations& a, const StatePool& states, int64_t n) {
  const GatedDeltaDims& d = g.gdn;
  HybridStepOps o;
  const Tensor proj = Tensor{a.proj.data, DType::kF32, n, g.proj_width(), g.proj_width()};
  o.p_in = Tensor{proj.data, DType::kF32, n, g.in_width(), g.in_width()};
  o.p_qkvg = Tensor{proj.data, DType::kF32, n, g.qkvg_width(), g.qkvg_width()};
  o.core = a.core.rows_from(0, n);
  o.attn = a.attn.rows_from(0, n);
  GatedDeltaOp& gd = o.gd;
  gd.proj = o.p_in;
  gd.b_col = d.conv_dim() + d.value_dim();
  gd.a_col = gd.b_col + d.n_v_heads;
  gd.n_k_heads = static_cast<int32_t>(d.n_k_heads);
  gd.n_v_heads = static_cast<int32_t>(d.n_v_heads);
  gd.head_k_dim = static_cast<int32_t>(d.head_k_dim);
  gd.head_v_dim = static_cast<int32_t>(d.head_v_dim);
  gd.conv_kernel = static_cast<int32_t>(d.conv_kernel);
  gd.state_stride = states.state_stride();
  gd.mixed = a.mixed.rows_from(0, n);
  gd.g = a.g.rows_from(0, n);
  gd.beta = a.beta.rows_from(0, n);
  gd.core = o.core;
  o.z = o.p_in.cols_from(d.conv_dim(), d.value_dim());
  o.gdn_out = Tensor::dense(a.mix.data, a.mix.dtype, n, d.value_dim());

  RopeKvOp& rk = o.rk;
  rk.qkv = o.p_qkvg.cols_from(0, g.Q + 2 * g.KV);
  rk.n_head = g.n_head;
  rk.n_head_kv = g.n_head_kv;
  rk.head_dim = static_cast<int32_t>(g.hd);
  rk.norm_eps = g.eps;
  rk.norm_offset = g.norm_offset;
  rk.rope = g.rope;
  AttentionOp& at = o.at;
  at.q = o.p_qkvg.cols_from(0, g.Q);
  at.out = o.attn;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = g.attn_scale;
  o.gate = o.p_qkvg.cols_from(g.Q + 2 * g.KV, g.Q);
  o.attn_out = Tensor::dense(a.mix.data, a.mix.dtype, n, g.Q);
  return o;
}

// One decoder layer over the step's x (its residual stream).
Status hybrid_layer(Backend& b, const HybridGraph& g, const HybridLayer& L, HybridStepOps& o, const StepMetadata& md,
                    const HybridActivations& a, const std::vector<KvCacheView>& kv, const StatePool& states) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n);
  const float eps = g.eps, off = g.norm_offset;
  b.rms_norm(x, nullptr, L.in_norm, eps, off, h);
  if (L.linear) {
    RILL_TRY(b.matmul(L.w_in, h, o.p_in, false));
    o.gd.conv_w = L.conv_w;
    o.gd.neg_a = L.neg_a;
    o.gd.dt_bias = L.dt_bias;
    o.gd.states = states.layer(L.index);
    b.gated_delta(o.gd, md);
    b.gated_rms_norm(o.core, o.z, L.gdn_norm, o.gd.head_v_dim, L.gdn_eps, o.gdn_out, L.tiled_k_heads);
    RILL_TRY(b.matmul(L.w_out, o.gdn_out, x, true));
  } else {
    RILL_TRY(b.matmul(L.w_qkvg, h, o.p_qkvg, false, L.b_qkvg));
    o.rk.q_norm = L.q_norm;
    o.rk.k_norm = L.k_norm;
    o.rk.kv = kv[static_cast<size_t>(L.index)];
    b.rope_store_kv(o.rk, md);
    o.at.kv = o.rk.kv;
    b.attention(o.at, md);
    b.sigmoid_mul(o.attn, o.gate, o.attn_out);
    RILL_TRY(b.matmul(L.w_o, o.attn_out, x, true, L.b_o));
  }
  b.rms_norm(x, nullptr, L.post_norm, eps, off, h);
  if (L.is_moe) return b.moe_ffn(L.moe, h, h, x, true, md);
  const Tensor gu = a.gu.rows_from(0, n), mlp = a.mlp.rows_from(0, n);
  RILL_TRY(b.matmul_glu(L.w_gate_up, h, Glu::kSilu, gu, mlp));
  return b.matmul(L.w_down, mlp, x, true);
}

// One step: embedding, every layer, the final norm of the sample rows and
// logits [n_sample, V] F32; with `hidden` ([n_tokens, E] F32), every
// token's final-normed hidden state too. kv: the attention layers' K and V
// (by index among them); states: the pool whose ids step.recurrent names.
// Only Backend ops: graph-capturable on CUDA.
Status hybrid_forward(Backend& b, const HybridGraph& g, const StepMetadata& md, const HybridActivations& a,
                      const std::vector<KvCacheView>& kv, const StatePool& states, Tensor logits,
                      const Tensor* hidden = nullptr) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n);
  b.embed(g.embed, md.ids, n, x);
  HybridStepOps o = hybrid_step_ops(g, a, states, n);
  for (const HybridLayer& L : g.layers) RILL_TRY(hybrid_layer(b, g, L, o, md, a, kv, states));
  if (hidden) b.rms_norm(x, nullptr, g.final_norm, g.eps, g.norm_offset, *hidden);
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  b.rms_norm(x, md.sample_rows, g.final_norm, g.eps, g.norm_offset, final_rows);
  return b.matmul(g.lm_head, final_rows, logits, false);
}

// The MTP layer over a step (Model::forward_mtp): token j is t_{p+1} at
// position p, hidden [n_tokens, E] the model's final-normed h_p; logits
// [n_sample, V]; `out` (optional, [n_tokens, E] F32) mtp.norm's output.
// Touches no recurrent state (the layer is full attention).
Status hybrid_mtp_forward(Backend& b, const HybridGraph& g, const StepMetadata& md, const HybridActivations& a,
                          const std::vector<KvCacheView>& kv, const StatePool& states, Tensor hidden, Tensor logits,
                          const Tensor* out) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n);
  RILL_TRY(mtp_head_input(b, g.mtp, md.ids, n, hidden, x, a.h.rows_from(0, n), a.mtp_h.rows_from(0, n)));
  HybridStepOps o = hybrid_step_ops(g, a, states, n);
  RILL_TRY(hybrid_layer(b, g, g.mtp_layer, o, md, a, kv, states));
  return mtp_head_logits(b, g.mtp, x, md.sample_rows, a.final_rows.rows_from(0, md.n_sample), logits, out);
}

// --- The CPU runtime ------------------------------------------------------------

class HybridModel final : public CpuPagedModel {
 public:
  HybridModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);
  Status forward(const Batch& batch, float* logits) override;
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }
  Status forward_hidden(const Batch& batch, float* logits, float* hidden) override;
  Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) override;

  // KV export: the attention layers (group 0), by their index among them.
  std::vector<KvLayer> kv_layers() const override {
    return cache_kv_layers([](int64_t) { return 0; });
  }

 private:
  std::unique_ptr<Backend> device_;  // on backend_'s threads
  HybridWeights w_;                  // the CPU Backend views its reassembled rows
  HybridGraph graph_;
  std::vector<float> x_, h_, proj_, mixed_, g_, beta_, core_, attn_, mix_, gu_, mlp_, final_rows_;  // f32
  HybridActivations act_;  // views of the vectors above
  CpuStepArrays step_;
  std::vector<KvCacheView> kv_views_;  // per attention layer (the MTP layer's last)
  std::vector<float> mtp_h_;           // [T, E] with an MTP layer
  // Checks the batch against the limits (group 0's tables; the recurrent
  // group has none) and fills step_.
  Result<StepMetadata> begin_step(const Batch& batch);
};

Status HybridModel::init(const ModelOptions& options) {
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  RILL_ASSIGN_OR_RETURN(w_, bind_hybrid(*files_, kMaxHeadDim, options.mtp));
  device_ = make_cpu_backend_on(*backend_->pool());
  RILL_ASSIGN_OR_RETURN(graph_, place_hybrid(*device_, cfg_, w_));
  set_limits(options);
  kv_spec_ = {full(), recurrent()};
  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise f16.
  // The MTP layer's K and V are one more attention layer of the pool.
  const int64_t n_kv_layers = graph_.n_attn + (graph_.has_mtp ? 1 : 0);
  RILL_TRY(create_kv(options, n_kv_layers, graph_.KV, graph_.hd, w_.all_f32 ? DType::kF32 : DType::kF16));
  for (int64_t i = 0; i < n_kv_layers; ++i) kv_views_.push_back(kv_.layer_view(i));
  RILL_TRY(create_states(*device_, graph_.n_linear, graph_.state_tensors(), options));

  const int64_t T = max_tokens_;
  const GatedDeltaDims& d = graph_.gdn;
  auto view = [](std::vector<float>& v, int64_t rows, int64_t cols) {
    v.resize(static_cast<size_t>(rows * cols));
    return Tensor::dense(v.data(), DType::kF32, rows, cols);
  };
  const int64_t F = graph_.has_dense_ffn() ? graph_.F : 0;
  act_ = {view(x_, T, graph_.E),
          view(h_, T, graph_.E),
          view(proj_, T, graph_.proj_width()),
          view(mixed_, T, d.conv_dim()),
          view(g_, T, d.n_v_heads),
          view(beta_, T, d.n_v_heads),
          view(core_, T, d.value_dim()),
          view(attn_, T, graph_.Q),
          view(mix_, T, std::max(d.value_dim(), graph_.Q)),
          view(gu_, T, 2 * F),
          view(mlp_, T, F),
          view(final_rows_, max_seqs_, graph_.E),
          view(mtp_h_, graph_.has_mtp ? T : 0, graph_.E)};
  step_.reserve(T);
  return device_->reserve(graph_.step_limits(T, max_seqs_));
}

Result<StepMetadata> HybridModel::begin_step(const Batch& batch) {
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim));
  return step_metadata(batch, step_);
}

Status HybridModel::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(states_->check(batch));
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  return hybrid_forward(*device_, graph_, md, act_, kv_views_, *states_,
                        Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab));
}

Status HybridModel::forward_hidden(const Batch& batch, float* logits, float* hidden) {
  if (!graph_.has_mtp) return Model::forward_hidden(batch, logits, hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(states_->check(batch));
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  const Tensor rows = Tensor::dense(hidden, DType::kF32, md.n_tokens, graph_.E);
  return hybrid_forward(*device_, graph_, md, act_, kv_views_, *states_,
                        Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), &rows);
}

// The MTP batch names no state slots: its one layer is full attention.
Status HybridModel::forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
  if (!graph_.has_mtp) return Model::forward_mtp(batch, hidden, logits, mtp_hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_ASSIGN_OR_RETURN(const StepMetadata md, begin_step(batch));
  // The hidden rows are only read (rms_norm's input).
  const Tensor rows = Tensor::dense(const_cast<float*>(hidden), DType::kF32, md.n_tokens, graph_.E);
  const Tensor out = Tensor::dense(mtp_hidden, DType::kF32, md.n_tokens, graph_.E);
  return hybrid_mtp_forward(*device_, graph_, md, act_, kv_views_, *states_, rows,
                            Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), mtp_hidden ? &out : nullptr);
}

// --- The CUDA runtime's glue ------------------------------------------------------

#if RILL_HAVE_CUDA
class HybridCudaModel final : public CudaModelBase {
 public:
  explicit HybridCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;

  HybridGraph graph_;
  HybridActivations act_views_;        // over the arena
  std::vector<KvCacheView> kv_views_;  // per attention layer (the MTP layer's last)
};

Status HybridCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(read_dims());  // the CUDA kernels' limits
  RILL_TRY(create_context());
  RILL_ASSIGN_OR_RETURN(HybridWeights w, bind_hybrid(f, hd_, options.mtp));
  const GatedDeltaDims& d = w.hybrid.gdn;
  if (!cuda::gdn_supported(static_cast<int32_t>(d.n_k_heads), static_cast<int32_t>(d.n_v_heads),
                           static_cast<int32_t>(d.head_k_dim), static_cast<int32_t>(d.head_v_dim),
                           static_cast<int32_t>(d.conv_kernel))) {
    return Error{f.path +
                 ": the CUDA gated DeltaNet takes key/value head dims up to 512 (value dims a multiple "
                 "of 8, an even key width, conv channels a multiple of 4) and conv kernels of 2 to 8"};
  }
  for (const HybridLayerWeights& L : w.layers) {
    if (L.linear && L.gdn.v_tiled) {
      return Error{f.path + ": the CUDA gated DeltaNet does not take qwen35 GGUF files (tiled value heads)"};
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, w.layer_matrices(), w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU model: f32 checkpoints keep f32 KV
  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(graph_, place_hybrid(*backend_, cfg_, w));
  kv_spec_ = {full(), recurrent()};
  // The MTP layer (--spec mtp, full attention): its K and V are one more
  // attention layer of the pool; it has no recurrent state, so the base
  // uploads none for its steps. The base runs its step kinds
  // (forward_hidden, forward_mtp).
  const int64_t n_kv_layers = graph_.n_attn + (graph_.has_mtp ? 1 : 0);
  n_kv_layers_ = n_kv_layers;
  mtp_rows_ = graph_.has_mtp;
  RILL_TRY(create_states(graph_.n_linear, graph_.state_tensors(), options));  // before the KV pool
  RILL_TRY(init_runtime(options));
  for (int64_t i = 0; i < n_kv_layers; ++i) kv_views_.push_back(kv_view(static_cast<size_t>(i)));
  return Status::Ok();
}

void HybridCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs();
  const GatedDeltaDims& d = graph_.gdn;
  const int64_t F = graph_.has_dense_ffn() ? graph_.F : 0;
  act_views_.x = carve_tensor(a, DType::kF32, T, E_);
  act_views_.h = carve_tensor(a, act_, T, E_);
  act_views_.proj = carve_tensor(a, DType::kF32, T, graph_.proj_width());
  act_views_.mixed = carve_tensor(a, DType::kF32, T, d.conv_dim());
  act_views_.g = carve_tensor(a, DType::kF32, T, d.n_v_heads);
  act_views_.beta = carve_tensor(a, DType::kF32, T, d.n_v_heads);
  act_views_.core = carve_tensor(a, DType::kF32, T, d.value_dim());
  act_views_.attn = carve_tensor(a, DType::kF32, T, graph_.Q);
  act_views_.mix = carve_tensor(a, act_, T, std::max(d.value_dim(), graph_.Q));
  act_views_.gu = carve_tensor(a, DType::kF32, T, 2 * F);
  act_views_.mlp = carve_tensor(a, act_, T, F);
  act_views_.final_rows = carve_tensor(a, act_, S, E_);
  act_views_.mtp_h = carve_tensor(a, act_, T, graph_.has_mtp ? E_ : 0);
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S));
}

// The shared graph over the uploaded step metadata, as step_kind() asks:
// the logits, also every token's final-normed hidden state (rows_out()),
// or the MTP layer over the hidden rows in rows_in().
Status HybridCudaModel::run_layers(const Step& s) {
  const StepMetadata md = step_metadata(s);
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.V);
  const Tensor rows = Tensor::dense(rows_out(), DType::kF32, s.n, E_);
  switch (step_kind()) {
    case StepKind::kHidden:
      return hybrid_forward(*backend_, graph_, md, act_views_, kv_views_, states(), logits, &rows);
    case StepKind::kMtp:
      return hybrid_mtp_forward(*backend_, graph_, md, act_views_, kv_views_, states(),
                                Tensor::dense(rows_in(), DType::kF32, s.n, E_), logits, &rows);
    case StepKind::kForward:
      break;
  }
  return hybrid_forward(*backend_, graph_, md, act_views_, kv_views_, states(), logits);
}
#endif  // RILL_HAVE_CUDA

}  // namespace

Result<std::unique_ptr<Model>> create_qwen3_next_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                           const ModelOptions& options) {
  return init_model(std::make_unique<HybridModel>(std::move(files), options), options);
}

Result<std::unique_ptr<Model>> create_qwen3_next_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                            const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<HybridCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
