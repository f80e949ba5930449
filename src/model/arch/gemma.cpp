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
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "model/arch/families.h"
#include "model/arch/gemma_config.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"

namespace rill {
namespace {

struct GemmaLayer : GemmaLayerWeights {
  bool sliding = false;
};

// Activations for up to max_tokens tokens, allocated once.
struct Activations {
  std::vector<float> x, h, q, k, v, attn, gate, up, final_rows;
};

class GemmaModel final : public CpuPagedModel {
 public:
  GemmaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);

  Status forward(const Batch& batch, float* logits) override;

  // Every layer keeps KV; a layer's rows live in the blocks its group's
  // tables name (sliding or full), all in the one PagedKvCache.
  std::vector<KvLayer> kv_layers() const override {
    std::vector<KvLayer> out;
    for (const GemmaLayer& L : layers_) {
      out.push_back({L.sliding ? sliding_group_ : full_group_, kv_.dtype(), kv_.row_bytes()});
    }
    return out;
  }

 private:
  Status bind_weights();
  void attention_block(const GemmaLayer& L, int64_t il, const Batch& batch);
  void mlp_block(const GemmaLayer& L, int64_t n);
  void norm(const float* x, const std::vector<float>& w, int64_t n_rows, int64_t dim, float* out) {
    backend_->rms_norm(x, w.data(), n_rows, dim, cfg_.rms_norm_eps, out, params_.norm_offset);
  }

  GemmaParams params_;
  int64_t hd_ = 0, q_width_ = 0, kv_width_ = 0;
  float embed_scale_ = 1.0f;
  int32_t sliding_group_ = -1, full_group_ = -1;  // index into kv_spec_, -1: no such layers
  WeightView embed_;                              // [n_vocab, n_embd]
  WeightView lm_head_;                            // [n_vocab, n_embd]; the embedding when tied
  std::vector<float> final_norm_;
  std::vector<GemmaLayer> layers_;
  RopeTable rope_local_, rope_global_;  // sliding layers, full layers
  AttentionParams attn_local_, attn_global_;
  Activations a_;
  std::vector<cpu::AttentionSeq> attn_seqs_;  // per step; capacity reserved at init
};

Status GemmaModel::bind_weights() {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab, F = cfg_.n_ff;
  const GemmaNames names = gemma_tensor_names(f);
  const std::string& base = names.base;
  const std::string& head = names.head;
  RILL_ASSIGN_OR_RETURN(embed_, bind_matrix(f, base + "embed_tokens.weight", V, E));
  if (f.find(head)) {
    RILL_ASSIGN_OR_RETURN(lm_head_, bind_matrix(f, head, V, E));
  } else {
    lm_head_ = embed_;
  }
  RILL_ASSIGN_OR_RETURN(final_norm_, load_vector(f, base + "norm.weight", E));
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  const GemmaLayerDims dims{E, q_width_, kv_width_, F, hd_};
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    GemmaLayer& L = layers_[static_cast<size_t>(il)];
    L.sliding = params_.sliding[static_cast<size_t>(il)] && cfg_.sliding_window > 0;
    RILL_TRY(bind_gemma_layer(f, names, il, dims, L));
  }
  return {};
}

Status GemmaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd, F = cfg_.n_ff;
  if (E <= 0 || cfg_.n_vocab <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 || F <= 0 ||
      cfg_.n_head % cfg_.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E / cfg_.n_head;
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  if (hd_ <= 0 || hd_ > kMaxHeadDim || hd_ % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(hd_) + " is not supported (even, at most " +
                 std::to_string(kMaxHeadDim) + ")"};
  }
  if (cfg_.rope_dim > 0 && cfg_.rope_dim != hd_) {
    return Error{f.path + ": partial rotary (" + std::to_string(cfg_.rope_dim) + " of " + std::to_string(hd_) +
                 " dims) is not part of the Gemma family"};
  }
  q_width_ = cfg_.n_head * hd_;
  kv_width_ = cfg_.n_head_kv * hd_;
  RILL_ASSIGN_OR_RETURN(params_, read_gemma_params(f));
  RILL_TRY(bind_weights());

  bool all_f32 = embed_.dtype == DType::kF32;
  for (const GemmaLayer& L : layers_) all_f32 = all_f32 && L.q.w.dtype == DType::kF32 && L.gate.w.dtype == DType::kF32;
  // HF multiplies by sqrt(hidden_size) in the activation dtype (f32 here).
  embed_scale_ = std::sqrt(static_cast<float>(E));

  GemmaRope rope = gemma_rope_tables(f, params_, hd_);
  rope_local_ = std::move(rope.local);
  rope_global_ = std::move(rope.global);

  attn_global_.n_head = cfg_.n_head;
  attn_global_.n_head_kv = cfg_.n_head_kv;
  attn_global_.head_dim = hd_;
  attn_global_.scale = 1.0f / std::sqrt(params_.query_pre_attn_scalar);
  attn_global_.softcap = params_.attn_softcap;
  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  attn_global_.kv_dtype = all_f32 ? DType::kF32 : DType::kF16;
  attn_local_ = attn_global_;
  attn_local_.window = cfg_.sliding_window;

  // KV groups: sliding layers share one block table per sequence, full
  // layers another (only the kinds present).
  const bool any_sliding = std::any_of(layers_.begin(), layers_.end(), [](const GemmaLayer& L) { return L.sliding; });
  const bool any_full = std::any_of(layers_.begin(), layers_.end(), [](const GemmaLayer& L) { return !L.sliding; });
  if (any_sliding) {
    sliding_group_ = static_cast<int32_t>(kv_spec_.size());
    kv_spec_.push_back(sliding(static_cast<int32_t>(cfg_.sliding_window)));
  }
  if (any_full) {
    full_group_ = static_cast<int32_t>(kv_spec_.size());
    kv_spec_.push_back(full());
  }

  set_limits(options);
  // Every layer has a plane of blocks; a block id belongs to one group, so
  // only that group's layers ever touch (make resident) its pages.
  RILL_TRY(create_kv(options, cfg_.n_layer, kv_width_, attn_global_.kv_dtype));
  attn_seqs_.reserve(static_cast<size_t>(max_tokens_));
  const auto T = static_cast<size_t>(max_tokens_);
  a_.x.resize(T * E);
  a_.h.resize(T * E);
  a_.q.resize(T * q_width_);
  a_.k.resize(T * kv_width_);
  a_.v.resize(T * kv_width_);
  a_.attn.resize(T * q_width_);
  a_.gate.resize(T * F);
  a_.up.resize(T * F);
  a_.final_rows.resize(T * E);
  std::vector<const WeightView*> weights = {&lm_head_};
  for (const GemmaLayer& L : layers_) {
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) weights.push_back(&l->w);
  }
  backend_->reserve(weights.data(), static_cast<int>(weights.size()), max_tokens_);
  return {};
}

void GemmaModel::attention_block(const GemmaLayer& L, int64_t il, const Batch& batch) {
  const int64_t n = batch.n_tokens();
  const Linear* qkv[] = {&L.q, &L.k, &L.v};
  float* qkv_out[] = {a_.q.data(), a_.k.data(), a_.v.data()};
  forward_group(qkv, qkv_out, 3, a_.h.data(), n, *backend_);
  if (!L.q_norm.empty()) {
    norm(a_.q.data(), L.q_norm, n * cfg_.n_head, hd_, a_.q.data());
    norm(a_.k.data(), L.k_norm, n * cfg_.n_head_kv, hd_, a_.k.data());
  }
  const RopeTable& rope = L.sliding ? rope_local_ : rope_global_;
  backend_->rope(a_.q.data(), batch.positions.data(), n, cfg_.n_head, hd_, rope);
  backend_->rope(a_.k.data(), batch.positions.data(), n, cfg_.n_head_kv, hd_, rope);
  // Store every sequence's new K/V through its table of this layer's
  // group, then attend for all of them in one call. A sliding group's
  // table may have holes before the window; attention reads none of them.
  const int32_t group = L.sliding ? sliding_group_ : full_group_;
  attn_seqs_.clear();
  for (const BatchSeq& s : batch.seqs) {
    const int64_t t0 = s.q_start;
    const std::span<const int32_t> table = batch.table(group, s);
    kv_.store(il, table, a_.k.data() + t0 * kv_width_, a_.v.data() + t0 * kv_width_, batch.positions.data() + t0,
              s.q_len, kv_width_);
    attn_seqs_.push_back({a_.q.data() + t0 * q_width_, batch.positions.data() + t0, s.q_len, kv_.view(il, table),
                          s.kv_len, a_.attn.data() + t0 * q_width_, s.decode_from});
  }
  backend_->attention_batch(attn_seqs_.data(), static_cast<int>(attn_seqs_.size()),
                            L.sliding ? attn_local_ : attn_global_);
  L.o.forward(a_.attn.data(), n, a_.h.data(), *backend_);
  norm(a_.h.data(), L.post_attn_norm, n, cfg_.n_embd, a_.h.data());
  backend_->add_inplace(a_.x.data(), a_.h.data(), n * cfg_.n_embd);
}

void GemmaModel::mlp_block(const GemmaLayer& L, int64_t n) {
  const Linear* gate_up[] = {&L.gate, &L.up};
  float* gate_up_out[] = {a_.gate.data(), a_.up.data()};
  forward_group(gate_up, gate_up_out, 2, a_.h.data(), n, *backend_);
  backend_->gelu_tanh_mul(a_.gate.data(), a_.up.data(), a_.gate.data(), n * cfg_.n_ff);
  L.down.forward(a_.gate.data(), n, a_.h.data(), *backend_);
  norm(a_.h.data(), L.post_ffn_norm, n, cfg_.n_embd, a_.h.data());
  backend_->add_inplace(a_.x.data(), a_.h.data(), n * cfg_.n_embd);
}

Status GemmaModel::forward(const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t E = cfg_.n_embd;
  if (n <= 0) return {};
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim, kv_spec_));

  backend_->get_rows(embed_, batch.token_ids.data(), n, a_.x.data());
  for (int64_t i = 0; i < n * E; ++i) a_.x[static_cast<size_t>(i)] *= embed_scale_;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const GemmaLayer& L = layers_[static_cast<size_t>(il)];
    norm(a_.x.data(), L.attn_norm, n, E, a_.h.data());
    attention_block(L, il, batch);
    norm(a_.x.data(), L.ffn_norm, n, E, a_.h.data());
    mlp_block(L, n);
  }
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  for (int64_t i = 0; i < n_sample; ++i) {
    const float* row = a_.x.data() + static_cast<int64_t>(batch.sample_rows[static_cast<size_t>(i)]) * E;
    norm(row, final_norm_, 1, E, a_.final_rows.data() + i * E);
  }
  backend_->matmul(lm_head_, a_.final_rows.data(), n_sample, logits);
  if (params_.final_softcap > 0) {
    const float cap = params_.final_softcap;
    for (int64_t i = 0; i < n_sample * cfg_.n_vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Model>> create_gemma_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  return init_model(std::make_unique<GemmaModel>(std::move(files), options), options);
}

}  // namespace rill
