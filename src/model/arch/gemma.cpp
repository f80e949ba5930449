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
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rope_table.h"
#include "model/arch/families.h"
#include "model/arch/gemma_config.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/placement.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {
namespace {

// --- The graph, for every device ---------------------------------------------

// The checkpoint as the files hold it (matrices view the mapping).
struct GemmaWeights {
  GemmaParams params;
  GemmaLayerDims dims{};
  WeightView embed;    // [V, E]
  WeightView lm_head;  // [V, E]; the embedding when tied
  bool tied = true;
  std::vector<float> final_norm;  // [E]
  std::vector<GemmaLayerWeights> layers;
  GemmaRope rope;  // sliding layers (local), full layers (global)

  // The layers' matrices, layer 0's q first.
  std::vector<const WeightView*> layer_matrices() const {
    std::vector<const WeightView*> out;
    for (const GemmaLayerWeights& L : layers) {
      for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) out.push_back(&l->w);
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
  if (cfg.rope_dim > 0 && cfg.rope_dim != hd) {
    return Error{f.path + ": partial rotary (" + std::to_string(cfg.rope_dim) + " of " + std::to_string(hd) +
                 " dims) is not part of the Gemma family"};
  }
  GemmaWeights w;
  RILL_ASSIGN_OR_RETURN(w.params, read_gemma_params(f));
  w.dims = {E, cfg.n_head * hd, cfg.n_head_kv * hd, F, hd};
  const GemmaNames names = gemma_tensor_names(f);
  RILL_ASSIGN_OR_RETURN(w.embed, bind_matrix(f, names.base + "embed_tokens.weight", V, E));
  w.lm_head = w.embed;
  w.tied = !f.find(names.head);
  if (!w.tied) {
    RILL_ASSIGN_OR_RETURN(w.lm_head, bind_matrix(f, names.head, V, E));
  }
  RILL_ASSIGN_OR_RETURN(w.final_norm, load_vector(f, names.base + "norm.weight", E));
  w.layers.resize(static_cast<size_t>(cfg.n_layer));
  for (int64_t il = 0; il < cfg.n_layer; ++il) {
    RILL_TRY(bind_gemma_layer(f, names, il, w.dims, w.layers[static_cast<size_t>(il)]));
  }
  w.rope = gemma_rope_tables(f, w.params, hd);
  return w;
}

// One layer as the Backend placed it: q/k/v as one weight, gate/up as one.
struct GemmaLayer {
  bool sliding = false;  // attends to the last `window` tokens, through the sliding KV group
  Vec attn_norm;         // [E]
  Weight wqkv;           // [Q + 2 KV, E]
  Vec bqkv;              // [Q + 2 KV] (zeros for a part without one) or absent
  Vec q_norm, k_norm;    // [hd], gemma3 only
  Weight wo;             // [E, Q]
  Vec bo;                // [E] or absent
  Vec post_attn_norm;    // [E]
  Vec ffn_norm;          // [E]
  Weight w_gate_up;      // [2 F, E]
  Weight w_down;         // [E, F]
  Vec post_ffn_norm;     // [E]
};

struct GemmaGraph {
  int64_t E = 0, F = 0, hd = 0, Q = 0, KV = 0, V = 0;
  int32_t n_head = 0, n_head_kv = 0;
  float eps = 1e-6f;
  float norm_offset = 1.0f;  // RMSNorm scales by (norm_offset + w)
  float embed_scale = 1.0f;  // sqrt(E), in f32 as HF multiplies in the activation dtype
  float attn_scale = 1.0f, attn_softcap = 0.0f, final_softcap = 0.0f;
  int32_t window = 0;                           // sliding layers' window
  int32_t sliding_group = -1, full_group = -1;  // KV groups (kv_spec()), -1: no such layers
  Weight embed;                                 // [V, E]
  Weight lm_head;                               // [V, E]; the embedding when tied
  Vec final_norm;                               // [E]
  std::vector<GemmaLayer> layers;
  Rope rope_local, rope_global;  // sliding layers, full layers

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
  // The KV groups: sliding first, then full (the kinds present); sets
  // sliding_group and full_group.
  KvSpec make_kv_spec() {
    KvSpec spec;
    const bool any_sliding = std::any_of(layers.begin(), layers.end(), [](const GemmaLayer& L) { return L.sliding; });
    const bool any_full = std::any_of(layers.begin(), layers.end(), [](const GemmaLayer& L) { return !L.sliding; });
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
  // Every layer keeps KV, in its kind's group.
  std::vector<Model::KvLayer> kv_layers(DType dtype, size_t row_bytes) const {
    std::vector<Model::KvLayer> out;
    for (const GemmaLayer& L : layers) out.push_back({L.sliding ? sliding_group : full_group, dtype, row_bytes});
    return out;
  }
};

// One pass of place_gemma's placement (Backend::place_model may run it twice).
Status place_pass(Backend& b, const GemmaWeights& w, GemmaGraph& g) {
  RILL_TRY(place_embedding_and_head(b, w.embed, w.lm_head, w.tied, w.final_norm, g.embed, g.lm_head, g.final_norm));
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const std::string p = "layers." + std::to_string(il) + ".";
    const GemmaLayerWeights& h = w.layers[il];
    GemmaLayer& L = g.layers[il];
    auto vec = [&](const std::vector<float>& v, const std::string& name) {
      return b.place_vector(v.data(), static_cast<int64_t>(v.size()), p + name);
    };
    RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(h.attn_norm, "input_layernorm.weight"));
    RILL_TRY(place_fused_qkv(b, h.q, h.k, h.v, p, L.wqkv, L.bqkv));
    if (!h.q_norm.empty()) {
      RILL_ASSIGN_OR_RETURN(L.q_norm, vec(h.q_norm, "self_attn.q_norm.weight"));
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
  }
  RILL_ASSIGN_OR_RETURN(g.rope_local, b.place_rope(w.rope.local));
  RILL_ASSIGN_OR_RETURN(g.rope_global, b.place_rope(w.rope.global));
  return Status::Ok();
}

// Places w through `b` inside one Backend::place_model() (CUDA: one device
// buffer). Errors name the tensor.
Result<GemmaGraph> place_gemma(Backend& b, const ModelConfig& cfg, const GemmaWeights& w) {
  GemmaGraph g;
  g.E = w.dims.n_embd;
  g.F = w.dims.n_ff;
  g.hd = w.dims.head_dim;
  g.Q = w.dims.q_width;
  g.KV = w.dims.kv_width;
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
  g.layers.assign(w.layers.size(), GemmaLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) g.layers[il].sliding = w.params.sliding[il] && cfg.sliding_window > 0;
  RILL_TRY(b.place_model([&] { return place_pass(b, w, g); }));
  return g;
}

// Activation views for up to the limit's tokens (rows), each dense:
//   x [T, E] F32 residual; h [T, E] act (normed); qkv [T, Q + 2 KV] F32;
//   attn [T, Q] act; y [T, E] F32 (o / down output before its post-norm);
//   gu [T, 2 F] F32; mlp [T, F] act; final_rows [S, E] act.
struct GemmaActivations {
  Tensor x, h, qkv, attn, y, gu, mlp, final_rows;
};

// One step: embedding, every layer, the final norm of the sample rows and
// logits [n_sample, V] F32 (softcapped for gemma2). kv: every layer's K and
// V. Only Backend ops: graph-capturable on CUDA. Each layer's pre-norms come
// out of the previous post_norm_add (the first from rms_norm).
Status gemma_forward(Backend& b, const GemmaGraph& g, const StepMetadata& md, const GemmaActivations& a,
                     const std::vector<KvCacheView>& kv, Tensor logits) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n), qkv = a.qkv.rows_from(0, n);
  const Tensor attn = a.attn.rows_from(0, n), y = a.y.rows_from(0, n);
  const Tensor gu = a.gu.rows_from(0, n), mlp = a.mlp.rows_from(0, n);
  const float eps = g.eps, off = g.norm_offset;
  b.embed(g.embed, md.ids, n, x);
  b.scale(x, g.embed_scale);
  b.rms_norm(x, nullptr, g.layers[0].attn_norm, eps, off, h);
  RopeKvOp rk;
  rk.qkv = qkv;
  rk.n_head = g.n_head;
  rk.n_head_kv = g.n_head_kv;
  rk.head_dim = static_cast<int32_t>(g.hd);
  rk.norm_eps = eps;
  rk.norm_offset = off;
  AttentionOp at;
  at.q = qkv.cols_from(0, g.Q);
  at.out = attn;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = g.attn_scale;
  at.softcap = g.attn_softcap;
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const GemmaLayer& L = g.layers[il];
    RILL_TRY(b.matmul(L.wqkv, h, qkv, false, L.bqkv));
    rk.q_norm = L.q_norm;
    rk.k_norm = L.k_norm;
    rk.rope = L.sliding ? g.rope_local : g.rope_global;
    rk.kv = kv[il];
    rk.kv_group = L.sliding ? g.sliding_group : g.full_group;
    b.rope_store_kv(rk, md);
    at.window = L.sliding ? g.window : 0;
    at.kv = rk.kv;
    at.kv_group = rk.kv_group;
    b.attention(at, md);
    RILL_TRY(b.matmul(L.wo, attn, y, false, L.bo));
    b.post_norm_add(y, L.post_attn_norm, x, L.ffn_norm, eps, off, h);
    RILL_TRY(b.matmul(L.w_gate_up, h, gu, false));
    b.glu(Glu::kGeluTanh, gu, mlp);
    RILL_TRY(b.matmul(L.w_down, mlp, y, false));
    const Vec next_norm = il + 1 < g.layers.size() ? g.layers[il + 1].attn_norm : Vec{};
    b.post_norm_add(y, L.post_ffn_norm, x, next_norm, eps, off, h);
  }
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  b.rms_norm(x, md.sample_rows, g.final_norm, eps, off, final_rows);
  RILL_TRY(b.matmul(g.lm_head, final_rows, logits, false));
  if (g.final_softcap > 0) b.softcap(logits, g.final_softcap);
  return Status::Ok();
}

// --- The CPU runtime ------------------------------------------------------------

class GemmaModel final : public CpuPagedModel {
 public:
  GemmaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);
  Status forward(const Batch& batch, float* logits) override;
  std::vector<KvLayer> kv_layers() const override {
    const std::vector<KvLayer> groups = graph_.kv_layers(DType::kF16, 0);
    return cache_kv_layers([&](int64_t l) { return groups[static_cast<size_t>(l)].group; });
  }

 private:
  std::unique_ptr<Backend> device_;  // on backend_'s threads
  GemmaGraph graph_;
  std::vector<float> x_, h_, qkv_, attn_, y_, gu_, mlp_, final_rows_;  // [max_tokens_, ...] f32
  GemmaActivations act_;                                               // views of the vectors above
  CpuStepArrays step_;
  std::vector<KvCacheView> kv_views_;  // per layer
};

Status GemmaModel::init(const ModelOptions& options) {
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  RILL_ASSIGN_OR_RETURN(const GemmaWeights w, bind_gemma(*files_, kMaxHeadDim));
  device_ = make_cpu_backend_on(*backend_->pool());
  RILL_ASSIGN_OR_RETURN(graph_, place_gemma(*device_, cfg_, w));
  kv_spec_ = graph_.make_kv_spec();
  set_limits(options);

  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  bool all_f32 = w.embed.dtype == DType::kF32;
  for (const GemmaLayerWeights& L : w.layers) {
    all_f32 = all_f32 && L.q.w.dtype == DType::kF32 && L.gate.w.dtype == DType::kF32;
  }
  RILL_TRY(create_kv(options, cfg_.n_layer, graph_.KV, graph_.hd, all_f32 ? DType::kF32 : DType::kF16));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) kv_views_.push_back(kv_.layer_view(il));

  const int64_t T = max_tokens_;
  auto view = [T](std::vector<float>& v, int64_t cols) {
    v.resize(static_cast<size_t>(T * cols));
    return Tensor::dense(v.data(), DType::kF32, T, cols);
  };
  act_ = {view(x_, graph_.E), view(h_, graph_.E),      view(qkv_, graph_.qkv_width()), view(attn_, graph_.Q),
          view(y_, graph_.E), view(gu_, 2 * graph_.F), view(mlp_, graph_.F),           view(final_rows_, graph_.E)};
  step_.reserve(T);
  return device_->reserve(graph_.step_limits(T, max_seqs_));
}

Status GemmaModel::forward(const Batch& batch, float* logits) {
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
  return gemma_forward(*device_, graph_, md, act_, kv_views_,
                       Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab));
}

// --- The CUDA runtime's glue ------------------------------------------------------

#if RILL_HAVE_CUDA
class GemmaCudaModel final : public CudaModelBase {
 public:
  explicit GemmaCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);
  std::vector<KvLayer> kv_layers() const override {
    return graph_.kv_layers(kv_dtype_, static_cast<size_t>(KV_) * cuda_dtype_size(kv_dtype_));
  }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;

  GemmaGraph graph_;
  GemmaActivations act_views_;         // over the arena
  std::vector<KvCacheView> kv_views_;  // per layer
};

Status GemmaCudaModel::init(const ModelOptions& options) {
  RILL_TRY(read_dims());  // the CUDA kernels' limits
  RILL_TRY(create_context());
  RILL_ASSIGN_OR_RETURN(const GemmaWeights w, bind_gemma(*files_, hd_));  // read_dims held hd_ to the kernels' limit
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(files_->path, w.layer_matrices(), w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Gemma: f32 checkpoints keep f32 KV
  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(graph_, place_gemma(*backend_, cfg_, w));
  kv_spec_ = graph_.make_kv_spec();
  RILL_TRY(init_runtime(options));
  for (size_t il = 0; il < graph_.layers.size(); ++il) kv_views_.push_back(kv_view(il));
  return Status::Ok();
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
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S));
}

Status GemmaCudaModel::run_layers(const Step& s) {
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.V);
  return gemma_forward(*backend_, graph_, step_metadata(s), act_views_, kv_views_, logits);
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
