// The gpt-oss family (`gpt_oss`: gpt-oss-20b / 120b), from Hugging Face
// files. Against the Llama family:
//   layer kinds   sliding and full layers alternate (`layer_types`; the
//                 window from `sliding_window`), each kind in its KV group
//                 (as Gemma's)
//   attention     q/k/v/o biases; a learned sink logit per head that joins
//                 the softmax denominator and adds no value (AttentionOp::sinks)
//   RoPE          YaRN over the whole head, one table for both kinds
//                 (`truncate: false` keeps the correction range unrounded)
//   MoE FFN       on every layer: the router (with a bias) picks the top-k
//                 logits and softmaxes over those k; the experts have biases
//                 and the clamped SwiGLU (swiglu_limit 7, alpha 1.702):
//                 (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)
//                 (model/moe.h's MoeParams options)
//
// Hugging Face stores the experts for x @ W: gate_up_proj [n_expert, E,
// 2 F] with gate and up interleaved in its columns (gate 2i, up 2i + 1),
// down_proj [n_expert, F, E], the biases [n_expert, 2 F] / [n_expert, E].
// Binding transposes them once into Linear rows (gate [F, E], up [F, E],
// down [E, F]) held by GptOssExperts, so the MoE code sees the layout of
// every other family. MXFP4 checkpoints (OpenAI's: quantization_config
// mxfp4, loader/mxfp4_checkpoint.h) store the experts rows first,
// gate_up [n_expert, 2 F, E] and down [n_expert, E, F], in blocks the
// loader re-lays for GGML: the Linears view them in place (gate the even
// rows, up the odd ones, by a doubled row stride), 4.25 bits a weight as
// stored, on the CPU (MXFP4 x Q8_0 dot products) and the CUDA MoE alike.
//
// One graph (GptOssGraph, place_gpt_oss, gpt_oss_forward) over Backend ops
// (the MoE FFN: Backend::moe_ffn) runs on every device: the CPU runtime
// (`gpt_oss.cpu`, a CpuPagedModel; f32 KV, the CPU's sink attention is the
// f32 kernel's) and, under RILL_HAVE_CUDA, the CUDA runtime's glue
// (`gpt_oss.cuda`, over model/cuda_model_base.h: f32 or f16 KV, every CUDA
// attention kernel takes the sinks; the MoE layers are the CUDA Backend's
// place_moe to accept or refuse). GGUF files (llama.cpp's `gpt-oss`) bind
// through the stacked expert tensors, MXFP4 included.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/rope_table.h"
#include "core/thread_pool.h"
#include "model/arch/families.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/placement.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {
namespace {

// --- The configuration ----------------------------------------------------------

struct GptOssParams {
  std::vector<bool> sliding;  // [n_layer]
  float swiglu_limit = 7.0f, swiglu_alpha = 1.702f;
};

Result<GptOssParams> read_gpt_oss_params(const ModelFiles& f) {
  const ModelConfig& c = f.config;
  const std::string file = f.format == ModelFormat::kGguf ? f.path : f.path + "/config.json";
  GptOssParams p;
  const nlohmann::json& raw = c.raw;
  if (f.format == ModelFormat::kGguf) {
    // llama.cpp: every other layer sliding, the first one included.
    for (int64_t i = 0; i < c.n_layer; ++i) p.sliding.push_back(i % 2 == 0);
    return p;
  }
  if (auto lt = raw.find("layer_types"); lt != raw.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.n_layer) {
      return Error{file + ": 'layer_types' must list " + std::to_string(c.n_layer) + " layer types"};
    }
    for (const nlohmann::json& e : *lt) {
      if (e == "sliding_attention") {
        p.sliding.push_back(true);
      } else if (e == "full_attention") {
        p.sliding.push_back(false);
      } else {
        return Error{file + ": layer type " + e.dump() + " is not supported (sliding_attention, full_attention)"};
      }
    }
  } else {  // transformers' default: sliding first, then alternating
    for (int64_t i = 0; i < c.n_layer; ++i) p.sliding.push_back(i % 2 == 0);
  }
  for (const char* key : {"swiglu_limit", "swiglu_alpha"}) {
    auto it = raw.find(key);
    if (it == raw.end() || it->is_null()) continue;
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
      return Error{file + ": '" + key + "' must be a positive number"};
    }
    (std::string(key) == "swiglu_limit" ? p.swiglu_limit : p.swiglu_alpha) = it->get<float>();
  }
  if (c.hidden_act != "silu") {
    return Error{file + ": hidden_act '" + c.hidden_act + "' is not supported (silu: the clamped SwiGLU)"};
  }
  return p;
}

// --- The checkpoint ----------------------------------------------------------------

// Expert matrices transposed out of Hugging Face's x @ W layout: owned
// memory the Linear views point into (the model keeps it while it lives).
struct GptOssExperts {
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
};

// out[o, r] = t[e, r, first + o * step] for o < n_out, r < t.shape[1]: a
// column selection of expert e's [R, C] matrix, transposed into `out`
// ([n_out, R], t's dtype: F32/F16/BF16).
void transpose_columns(const TensorRef& t, int64_t e, int64_t first, int64_t step, int64_t n_out, uint8_t* out) {
  const int64_t R = t.shape[1], C = t.shape[2];
  const size_t es = t.dtype == DType::kF32 ? 4 : 2;
  const uint8_t* src = t.data + static_cast<size_t>(e * R * C) * es;
  for (int64_t o = 0; o < n_out; ++o) {
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(out + static_cast<size_t>(o * R + r) * es, src + static_cast<size_t>(r * C + first + o * step) * es,
                  es);
    }
  }
}

// A Linear of n_out rows of t.shape[1] columns in t's dtype over `data`.
Linear rows_over(const TensorRef& t, int64_t n_out, const uint8_t* data) {
  Linear l;
  l.w.dtype = t.dtype;
  l.w.n_rows = n_out;
  l.w.n_cols = t.shape[1];
  l.w.row_stride = static_cast<size_t>(t.shape[1]) * (t.dtype == DType::kF32 ? 4 : 2);
  l.w.data = data;
  return l;
}

// Every expert's gate, up (HF's interleaved gate_up columns) and down
// matrices transposed into rows, one expert per task on a pool of the
// machine's cores. gpt-oss-20b's bf16 experts are 38 GB of fresh host
// memory; loading them took 155 s on an H200 host (2026-12-03, one
// thread), and on the CPU path perf puts that time in this transposition
// and the page faults of its buffers. The buffers stay uninitialized until
// the transposition writes them (no zero-fill pass); the store takes them
// in expert order, so the result does not depend on the scheduling.
Status transpose_experts(const TensorRef& gu, const TensorRef& dn, int64_t X, int64_t F, int64_t E,
                         std::vector<GluFfnWeights>& experts, GptOssExperts& store) {
  const size_t es = gu.dtype == DType::kF32 ? 4 : 2;
  const size_t es_down = dn.dtype == DType::kF32 ? 4 : 2;  // gate_up and down may differ in dtype
  const size_t n_gate = static_cast<size_t>(F * E) * es, n_down = static_cast<size_t>(E * F) * es_down;
  std::vector<std::unique_ptr<uint8_t[]>> bufs(static_cast<size_t>(3 * X));
  std::atomic<bool> out_of_memory{false};
  ThreadPool pool;
  pool.parallel_for(X, 1, [&](int64_t b, int64_t end) {  // must not throw: nothrow allocations
    for (int64_t e = b; e < end; ++e) {
      const auto i = static_cast<size_t>(3 * e);
      bufs[i].reset(new (std::nothrow) uint8_t[n_gate]);
      bufs[i + 1].reset(new (std::nothrow) uint8_t[n_gate]);
      bufs[i + 2].reset(new (std::nothrow) uint8_t[n_down]);
      if (!bufs[i] || !bufs[i + 1] || !bufs[i + 2]) {
        out_of_memory = true;
        continue;
      }
      transpose_columns(gu, e, 0, 2, F, bufs[i].get());
      transpose_columns(gu, e, 1, 2, F, bufs[i + 1].get());
      transpose_columns(dn, e, 0, 1, E, bufs[i + 2].get());
    }
  });
  if (out_of_memory) return Error{gu.file + ": out of host memory transposing the gpt-oss experts"};
  for (int64_t e = 0; e < X; ++e) {
    const auto i = static_cast<size_t>(3 * e);
    GluFfnWeights& x = experts[static_cast<size_t>(e)];
    x.gate = rows_over(gu, F, bufs[i].get());
    x.up = rows_over(gu, F, bufs[i + 1].get());
    x.down = rows_over(dn, E, bufs[i + 2].get());
    for (size_t k = 0; k < 3; ++k) store.buffers.push_back(std::move(bufs[i + k]));
  }
  return Status::Ok();
}

// Elements [first, first + step * n) by step of row e of a 2-D tensor [X, C] as f32.
std::vector<float> strided_row(const TensorRef& t, int64_t e, int64_t first, int64_t step, int64_t n) {
  const int64_t C = t.shape[1];
  std::vector<float> row(static_cast<size_t>(C)), out(static_cast<size_t>(n));
  cpu::dequantize_row(t.dtype, t.data + static_cast<size_t>(e) * row_bytes(t.dtype, C), row.data(), C);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = row[static_cast<size_t>(first + i * step)];
  return out;
}

// An MXFP4 checkpoint's expert tensor (loader/mxfp4_checkpoint.h: rows
// first, [X, rows, cols]) against the config; errors name the stored
// tensors and config.json.
Result<const TensorRef*> require_mxfp4(const ModelFiles& f, const std::string& name, int64_t X, int64_t rows,
                                       int64_t cols) {
  const TensorRef* t = f.find(name);
  if (!t || t->dtype != DType::kMXFP4) {
    return Error{f.path + ": missing tensor '" + name + "_blocks' (the other expert matrix of the layer is MXFP4)"};
  }
  if (t->shape != std::vector<int64_t>{X, rows, cols}) {
    auto dims = [](int64_t x, int64_t r, int64_t c) {
      return "[" + std::to_string(x) + ", " + std::to_string(r) + ", " + std::to_string(c / 32) + ", 16]";
    };
    const std::string want = cols % 32 == 0 ? dims(X, rows, cols) : "a whole number of 32-weight groups per row";
    return Error{t->file + ": tensor '" + name + "_blocks' has shape " + dims(t->shape[0], t->shape[1], t->shape[2]) +
                 ", " + f.path + "/config.json (num_local_experts " + std::to_string(X) + ", hidden_size / " +
                 "intermediate_size) expects " + want};
  }
  return t;
}

// Expert e's rows first, first + step, ... (n_rows of them) of an MXFP4
// checkpoint's [X, R, C] tensor: a strided view of its blocks, no copy.
Linear mxfp4_rows(const TensorRef& t, int64_t e, int64_t first, int64_t step, int64_t n_rows) {
  const size_t rb = row_bytes(DType::kMXFP4, t.shape[2]);
  Linear l;
  l.w.dtype = DType::kMXFP4;
  l.w.n_rows = n_rows;
  l.w.n_cols = t.shape[2];
  l.w.row_stride = rb * static_cast<size_t>(step);
  l.w.data = t.data + (static_cast<size_t>(e * t.shape[1]) + static_cast<size_t>(first)) * rb;
  return l;
}

// Layer `prefix`'s MoE FFN ("model.layers.N.mlp."): Hugging Face's
// interleaved gate_up_proj (dense, or MXFP4 blocks re-laid at load), or
// stacked gate/up/down projections with biases (GGUF).
Result<MoeFfn> bind_gpt_oss_moe(const ModelFiles& f, const std::string& prefix, const MoeParams& mp,
                                GptOssExperts& store) {
  const int64_t X = mp.n_expert, E = mp.n_embd, F = mp.n_ff;
  MoeWeights w;
  RILL_ASSIGN_OR_RETURN(w.router, bind_linear(f, prefix + "router", X, E, Bias::kRequired));
  w.experts.resize(static_cast<size_t>(X));
  const TensorRef* gate_up = f.find(prefix + "experts.gate_up_proj");
  const TensorRef* down = f.find(prefix + "experts.down_proj");
  if (f.format == ModelFormat::kHuggingFace &&
      ((gate_up && gate_up->dtype == DType::kMXFP4) || (down && down->dtype == DType::kMXFP4))) {
    // MXFP4 experts: [X, 2F, E] gate (even rows) and up (odd rows), [X, E, F] down.
    RILL_ASSIGN_OR_RETURN(const TensorRef* gu, require_mxfp4(f, prefix + "experts.gate_up_proj", X, 2 * F, E));
    RILL_ASSIGN_OR_RETURN(const TensorRef* dn, require_mxfp4(f, prefix + "experts.down_proj", X, E, F));
    RILL_ASSIGN_OR_RETURN(const TensorRef* gub, f.require(prefix + "experts.gate_up_proj_bias", {X, 2 * F}));
    RILL_ASSIGN_OR_RETURN(const TensorRef* dnb, f.require(prefix + "experts.down_proj_bias", {X, E}));
    for (const TensorRef* t : {gub, dnb}) {
      if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
        return Error{t->file + ": tensor '" + t->name + "' must be F32, F16 or BF16 (got " +
                     std::string(dtype_name(t->dtype)) + ")"};
      }
    }
    for (int64_t e = 0; e < X; ++e) {
      GluFfnWeights& x = w.experts[static_cast<size_t>(e)];
      x.gate = mxfp4_rows(*gu, e, 0, 2, F);
      x.up = mxfp4_rows(*gu, e, 1, 2, F);
      x.down = mxfp4_rows(*dn, e, 0, 1, E);
      x.gate.bias = strided_row(*gub, e, 0, 2, F);
      x.up.bias = strided_row(*gub, e, 1, 2, F);
      x.down.bias = strided_row(*dnb, e, 0, 1, E);
    }
  } else if (gate_up) {
    RILL_ASSIGN_OR_RETURN(const TensorRef* gu, f.require(prefix + "experts.gate_up_proj", {X, E, 2 * F}));
    RILL_ASSIGN_OR_RETURN(const TensorRef* gub, f.require(prefix + "experts.gate_up_proj_bias", {X, 2 * F}));
    RILL_ASSIGN_OR_RETURN(const TensorRef* dn, f.require(prefix + "experts.down_proj", {X, F, E}));
    RILL_ASSIGN_OR_RETURN(const TensorRef* dnb, f.require(prefix + "experts.down_proj_bias", {X, E}));
    for (const TensorRef* t : {gu, gub, dn, dnb}) {
      if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
        return Error{t->file + ": gpt-oss expert tensors must be F32, F16 or BF16 (got " +
                     std::string(dtype_name(t->dtype)) + ")"};
      }
    }
    RILL_TRY(transpose_experts(*gu, *dn, X, F, E, w.experts, store));
    for (int64_t e = 0; e < X; ++e) {
      GluFfnWeights& x = w.experts[static_cast<size_t>(e)];
      x.gate.bias = strided_row(*gub, e, 0, 2, F);
      x.up.bias = strided_row(*gub, e, 1, 2, F);
      x.down.bias = strided_row(*dnb, e, 0, 1, E);
    }
  } else {
    RILL_ASSIGN_OR_RETURN(MoeFfn m, MoeFfn::bind(f, prefix, mp, MoeNames{"router"}));
    w.experts = m.weights().experts;
    const char* names[] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 3; ++i) {
      const int64_t n = i == 2 ? E : F;
      RILL_ASSIGN_OR_RETURN(const TensorRef* b, f.require(prefix + "experts." + names[i] + ".bias", {X, n}));
      for (int64_t e = 0; e < X; ++e) {
        GluFfnWeights& x = w.experts[static_cast<size_t>(e)];
        (i == 0 ? x.gate : i == 1 ? x.up : x.down).bias = strided_row(*b, e, 0, 1, n);
      }
    }
  }
  auto m = MoeFfn::create(mp, std::move(w));
  if (!m.ok()) return Error{f.path + ": '" + prefix + "': " + m.error().message};
  return m;
}

struct GptOssLayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [E]
  Linear q, k, v, o;                       // with biases
  std::vector<float> sinks;                // [n_head]
  MoeFfn moe;
};

struct GptOssWeights {
  GptOssParams params;
  int64_t E = 0, Q = 0, KV = 0, hd = 0;
  WeightView embed, lm_head;  // [V, E]
  bool tied = false;
  std::vector<float> final_norm;  // [E]
  std::vector<GptOssLayerWeights> layers;
  std::shared_ptr<GptOssExperts> experts;  // what the experts' Linears view (HF files)
  cpu::RopeTable rope;
};

MoeParams gpt_oss_moe_params(const ModelConfig& c, const GptOssParams& p) {
  MoeParams mp = moe_params(c);
  mp.softmax_after_topk = true;
  mp.swiglu_limit = p.swiglu_limit;
  mp.swiglu_alpha = p.swiglu_alpha;
  return mp;
}

Result<GptOssWeights> bind_gpt_oss(const ModelFiles& f, int64_t max_head_dim) {
  const ModelConfig& cfg = f.config;
  const int64_t E = cfg.n_embd, V = cfg.n_vocab;
  if (E <= 0 || V <= 0 || cfg.n_layer <= 0 || cfg.n_head <= 0 || cfg.n_head_kv <= 0 ||
      cfg.n_head % cfg.n_head_kv != 0 || cfg.n_expert <= 0) {
    return Error{f.path + ": inconsistent gpt-oss config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg.n_head) + "/" + std::to_string(cfg.n_head_kv) + ", experts " +
                 std::to_string(cfg.n_expert) + ")"};
  }
  const int64_t hd = cfg.head_dim > 0 ? cfg.head_dim : E / cfg.n_head;
  if (hd <= 0 || hd > max_head_dim || hd % 2 != 0 || (cfg.rope_dim > 0 && cfg.rope_dim != hd)) {
    return Error{f.path + ": head_dim " + std::to_string(hd) + " is not supported (even, at most " +
                 std::to_string(max_head_dim) + ", rotated whole)"};
  }
  GptOssWeights w;
  RILL_ASSIGN_OR_RETURN(w.params, read_gpt_oss_params(f));
  w.E = E;
  w.hd = hd;
  w.Q = cfg.n_head * hd;
  w.KV = cfg.n_head_kv * hd;
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, "model.embed_tokens.weight", V, E));
  w.tied = !f.find("lm_head.weight");
  w.lm_head = w.embed;
  if (!w.tied) {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, "lm_head.weight", V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, "model.norm.weight", E));
  w.experts = std::make_shared<GptOssExperts>();
  const MoeParams mp = gpt_oss_moe_params(cfg, w.params);
  w.layers.resize(static_cast<size_t>(cfg.n_layer));
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    GptOssLayerWeights& L = w.layers[static_cast<size_t>(il)];
    RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", w.Q, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", w.KV, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", w.KV, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", E, w.Q, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.sinks, load_vector(f, p + "self_attn.sinks", cfg.n_head));
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.moe, bind_gpt_oss_moe(f, p + "mlp.", mp, *w.experts));
  }
  w.rope = cpu::make_rope_table(cfg.rope_theta, hd, cfg.rope_style == RopeStyle::kInterleaved,
                                rope_scaling_params(cfg.rope_scaling));
  return w;
}

// --- The graph, for every device ---------------------------------------------

struct GptOssLayer {
  bool sliding = false;
  Vec attn_norm;  // [E]
  Weight wqkv;    // [Q + 2 KV, E]
  Vec bqkv;       // [Q + 2 KV] or absent
  Weight wo;      // [E, Q]
  Vec bo;         // [E] or absent
  Vec sinks;      // [n_head]
  Vec ffn_norm;   // [E]
  MoeWeight moe;  // every layer's FFN
};

struct GptOssGraph {
  int64_t E = 0, hd = 0, Q = 0, KV = 0, V = 0;
  int32_t n_head = 0, n_head_kv = 0;
  float eps = 1e-5f, attn_scale = 1.0f;
  int32_t window = 0;
  int32_t sliding_group = -1, full_group = -1;
  Weight embed, lm_head;  // [V, E]
  Vec final_norm;         // [E]
  std::vector<GptOssLayer> layers;
  Rope rope;

  int64_t qkv_width() const { return Q + 2 * KV; }
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
  // The KV groups: sliding first, then full (the kinds present).
  KvSpec make_kv_spec() {
    KvSpec spec;
    const bool any_sliding = std::any_of(layers.begin(), layers.end(), [](const GptOssLayer& L) { return L.sliding; });
    const bool any_full = std::any_of(layers.begin(), layers.end(), [](const GptOssLayer& L) { return !L.sliding; });
    if (any_sliding) {
      sliding_group = static_cast<int32_t>(spec.size());
      spec.push_back(sliding(window));
    }
    if (any_full) {
      full_group = static_cast<int32_t>(spec.size());
      spec.push_back(full());
    }
    return spec;
  }
  std::vector<Model::KvLayer> kv_layers(DType dtype, size_t row_bytes) const {
    std::vector<Model::KvLayer> out;
    for (const GptOssLayer& L : layers) out.push_back({L.sliding ? sliding_group : full_group, dtype, row_bytes});
    return out;
  }
};

Status place_pass(Backend& b, const GptOssWeights& w, GptOssGraph& g) {
  RILL_TRY(place_embedding_and_head(b, w.embed, w.lm_head, w.tied, w.final_norm, g.embed, g.lm_head, g.final_norm));
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    const GptOssLayerWeights& h = w.layers[il];
    GptOssLayer& L = g.layers[il];
    auto vec = [&](const std::vector<float>& v, const std::string& name) {
      return b.place_vector(v.data(), static_cast<int64_t>(v.size()), p + name);
    };
    RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(h.attn_norm, "input_layernorm.weight"));
    RILL_TRY(place_fused_qkv(b, h.q, h.k, h.v, p, L.wqkv, L.bqkv));
    const HostMatrix om = host_matrix(h.o.w);
    RILL_ASSIGN_OR_RETURN(L.wo, b.place(&om, 1, p + "self_attn.o_proj"));
    if (!h.o.bias.empty()) {
      RILL_ASSIGN_OR_RETURN(L.bo, vec(h.o.bias, "self_attn.o_proj.bias"));
    }
    RILL_ASSIGN_OR_RETURN(L.sinks, vec(h.sinks, "self_attn.sinks"));
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(h.ffn_norm, "post_attention_layernorm.weight"));
    RILL_ASSIGN_OR_RETURN(L.moe, b.place_moe(h.moe.host(), p + "mlp (experts)"));
  }
  RILL_ASSIGN_OR_RETURN(g.rope, b.place_rope(w.rope));
  return Status::Ok();
}

Result<GptOssGraph> place_gpt_oss(Backend& b, const ModelConfig& cfg, const GptOssWeights& w) {
  GptOssGraph g;
  g.E = w.E;
  g.hd = w.hd;
  g.Q = w.Q;
  g.KV = w.KV;
  g.V = cfg.n_vocab;
  g.n_head = static_cast<int32_t>(cfg.n_head);
  g.n_head_kv = static_cast<int32_t>(cfg.n_head_kv);
  g.eps = cfg.rms_norm_eps;
  g.attn_scale = 1.0f / std::sqrt(static_cast<float>(w.hd));
  g.window = static_cast<int32_t>(cfg.sliding_window);
  g.layers.assign(w.layers.size(), GptOssLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) g.layers[il].sliding = w.params.sliding[il] && g.window > 0;
  RILL_TRY(b.place_model([&] { return place_pass(b, w, g); }));
  return g;
}

// Activation views for up to the limit's tokens, each dense: x [T, E] F32
// residual; h [T, E] act (normed); qkv [T, Q + 2 KV] F32; attn [T, Q] act;
// final_rows [S, E] act.
struct GptOssActivations {
  Tensor x, h, qkv, attn, final_rows;
};

// One step: embedding, every layer, the final norm of the sample rows and
// logits [n_sample, V] F32. Backend ops only.
Status gpt_oss_forward(Backend& b, const GptOssGraph& g, const StepMetadata& md, const GptOssActivations& a,
                       const std::vector<KvCacheView>& kv, Tensor logits) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n), qkv = a.qkv.rows_from(0, n);
  const Tensor attn = a.attn.rows_from(0, n);
  b.embed(g.embed, md.ids, n, x);
  RopeKvOp rk;
  rk.qkv = qkv;
  rk.n_head = g.n_head;
  rk.n_head_kv = g.n_head_kv;
  rk.head_dim = static_cast<int32_t>(g.hd);
  rk.norm_eps = g.eps;
  rk.rope = g.rope;
  AttentionOp at;
  at.q = qkv.cols_from(0, g.Q);
  at.out = attn;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = g.attn_scale;
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const GptOssLayer& L = g.layers[il];
    b.rms_norm(x, nullptr, L.attn_norm, g.eps, 0.0f, h);
    RILL_TRY(b.matmul(L.wqkv, h, qkv, false, L.bqkv));
    rk.kv = kv[il];
    rk.kv_group = L.sliding ? g.sliding_group : g.full_group;
    b.rope_store_kv(rk, md);
    at.window = L.sliding ? g.window : 0;
    at.kv = rk.kv;
    at.kv_group = rk.kv_group;
    at.sinks = L.sinks;
    b.attention(at, md);
    RILL_TRY(b.matmul(L.wo, attn, x, true, L.bo));
    b.rms_norm(x, nullptr, L.ffn_norm, g.eps, 0.0f, h);
    RILL_TRY(b.moe_ffn(L.moe, h, h, x, true, md));
  }
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  b.rms_norm(x, md.sample_rows, g.final_norm, g.eps, 0.0f, final_rows);
  return b.matmul(g.lm_head, final_rows, logits, false);
}

// --- The CPU runtime ------------------------------------------------------------

class GptOssModel final : public CpuPagedModel {
 public:
  GptOssModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);
  Status forward(const Batch& batch, float* logits) override;
  std::vector<KvLayer> kv_layers() const override {
    const std::vector<KvLayer> groups = graph_.kv_layers(DType::kF32, 0);
    return cache_kv_layers([&](int64_t l) { return groups[static_cast<size_t>(l)].group; });
  }

 private:
  GptOssWeights weights_;            // the experts' transposed copies (HF files), which the Backend views
  std::unique_ptr<Backend> device_;  // on backend_'s threads
  GptOssGraph graph_;
  std::vector<float> x_, h_, qkv_, attn_, final_rows_;  // [max_tokens_, ...] f32
  GptOssActivations act_;
  CpuStepArrays step_;
  std::vector<KvCacheView> kv_views_;
};

Status GptOssModel::init(const ModelOptions& options) {
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  RILL_ASSIGN_OR_RETURN(weights_, bind_gpt_oss(*files_, kMaxHeadDim));
  device_ = make_cpu_backend_on(*backend_->pool());
  RILL_ASSIGN_OR_RETURN(graph_, place_gpt_oss(*device_, cfg_, weights_));
  kv_spec_ = graph_.make_kv_spec();
  set_limits(options);
  // The attention sinks run in the f32 kernels only: refuse other KV types
  // (model/kv_types.h) rather than drop the sinks.
  if (!options.kv_types.empty()) {
    RILL_ASSIGN_OR_RETURN(const std::vector<KvLayerTypes> types, options.kv_types.resolve(cfg_.n_layer, DType::kF32));
    for (const KvLayerTypes& t : types) {
      if (t.k != KvType{DType::kF32, false} || t.v != KvType{DType::kF32, false}) {
        return Error{files_->path + ": gpt-oss keeps f32 KV (its attention sinks run in the f32 kernels only), not " +
                     kv_type_name(t.k) + "/" + kv_type_name(t.v) + "; drop --kv-type / --kv-config"};
      }
    }
  }
  RILL_TRY(create_kv(options, cfg_.n_layer, graph_.KV, graph_.hd, DType::kF32));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) kv_views_.push_back(kv_.layer_view(il));

  const int64_t T = max_tokens_;
  auto view = [T](std::vector<float>& v, int64_t cols) {
    v.resize(static_cast<size_t>(T * cols));
    return Tensor::dense(v.data(), DType::kF32, T, cols);
  };
  act_ = {view(x_, graph_.E), view(h_, graph_.E), view(qkv_, graph_.qkv_width()), view(attn_, graph_.Q),
          view(final_rows_, graph_.E)};
  step_.reserve(T);
  return device_->reserve(graph_.step_limits(T, max_seqs_));
}

Status GptOssModel::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim, kv_spec_));
  const StepMetadata md = step_metadata(batch, step_);
  return gpt_oss_forward(*device_, graph_, md, act_, kv_views_,
                         Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab));
}

// --- The CUDA runtime's glue ------------------------------------------------------

#if RILL_HAVE_CUDA
// gpt_oss_forward on the CUDA Backend over the base's arena, step metadata
// and KV planes (one per layer, in its sliding or full group), captured in
// the base's decode graphs. The host weights (HF files: the experts'
// transposed copies) live only through init: placement copies them to the
// device.
class GptOssCudaModel final : public CudaModelBase {
 public:
  explicit GptOssCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);
  std::vector<KvLayer> kv_layers() const override {
    return graph_.kv_layers(kv_dtype_, static_cast<size_t>(KV_) * cuda_dtype_size(kv_dtype_));
  }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;

  GptOssGraph graph_;
  GptOssActivations act_views_;        // over the arena
  std::vector<KvCacheView> kv_views_;  // per layer
};

Status GptOssCudaModel::init(const ModelOptions& options) {
  RILL_TRY(read_dims());  // the CUDA kernels' limits (head_dim, heads per KV head)
  // The sinks are in the f32 / f16 KV kernels: a quantized KV type is
  // refused rather than run without them.
  if (!options.kv_types.empty()) {
    RILL_ASSIGN_OR_RETURN(const std::vector<KvLayerTypes> types, options.kv_types.resolve(cfg_.n_layer, DType::kF16));
    for (const KvLayerTypes& t : types) {
      if (t.k.quantized() || t.v.quantized() || t.k.rotated || t.v.rotated) {
        return Error{files_->path + ": gpt-oss on CUDA keeps float KV (its attention sinks run in the f32 / f16 " +
                     "kernels), not " + kv_type_name(t.k) + "/" + kv_type_name(t.v) + "; drop --kv-type / --kv-config"};
      }
    }
  }
  RILL_TRY(create_context());
  constexpr int64_t kMaxHeadDim = 256;  // read_dims' limit
  RILL_ASSIGN_OR_RETURN(const GptOssWeights w, bind_gpt_oss(*files_, kMaxHeadDim));
  // The activation and KV dtypes follow the attention matrices and the
  // float experts; MXFP4 experts are place_moe's to take or refuse.
  std::vector<const WeightView*> mats, experts;
  for (const GptOssLayerWeights& L : w.layers) {
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o}) mats.push_back(&l->w);
    L.moe.collect_weights(&experts);
  }
  for (const WeightView* e : experts) {
    if (e->dtype != DType::kMXFP4) mats.push_back(e);
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(files_->path, mats, w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // f32 checkpoints keep f32 KV (as the CPU)
  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(graph_, place_gpt_oss(*backend_, cfg_, w));
  kv_spec_ = graph_.make_kv_spec();
  RILL_TRY(init_runtime(options));  // refuses KV types other than kv_dtype_ (f32 / f16: the kernels with sinks)
  for (int64_t l = 0; l < cfg_.n_layer; ++l) kv_views_.push_back(kv_view(static_cast<size_t>(l)));
  return Status::Ok();
}

void GptOssCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs();
  act_views_.x = carve_tensor(a, DType::kF32, T, graph_.E);
  act_views_.h = carve_tensor(a, act_, T, graph_.E);
  act_views_.qkv = carve_tensor(a, DType::kF32, T, graph_.qkv_width());
  act_views_.attn = carve_tensor(a, act_, T, graph_.Q);
  act_views_.final_rows = carve_tensor(a, act_, S, graph_.E);
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S));
}

Status GptOssCudaModel::run_layers(const Step& s) {
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.V);
  return gpt_oss_forward(*backend_, graph_, step_metadata(s), act_views_, kv_views_, logits);
}
#endif  // RILL_HAVE_CUDA

}  // namespace

Result<std::unique_ptr<Model>> create_gpt_oss_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                        const ModelOptions& options) {
  return init_model(std::make_unique<GptOssModel>(std::move(files), options), options);
}

Result<std::unique_ptr<Model>> create_gpt_oss_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                         const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<GptOssCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
