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
// the state slots of the linear-attention layers.
// GGUF files (llama.cpp's qwen35 / qwen3next; names and config keys mapped in
// loader/gguf_names.cpp) differ in what a name mapping cannot undo: the
// (1 + w) norms are stored with the 1 added (norm offset 0 here), and qwen35
// tiles the linear layers' value heads (model/gated_delta.h undoes it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "model/arch/families.h"
#include "model/arch/qwen3_next_config.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/gated_delta.h"
#include "model/layers.h"
#include "model/moe.h"

namespace rill {
namespace {

struct GatedAttention {
  Linear q;                           // [n_head * 2 * hd, E]: per head [query (hd) | gate (hd)]
  Linear k, v;                        // [n_head_kv * hd, E]
  Linear o;                           // [E, n_head * hd]
  std::vector<float> q_norm, k_norm;  // [hd], (1 + w)
};

struct Layer {
  bool linear = false;
  int64_t index = 0;                      // among the linear layers (state) or the attention layers (KV)
  std::vector<float> in_norm, post_norm;  // [E], (1 + w)
  GatedDeltaNet gdn;
  GatedAttention attn;
  Linear gate, up, down;      // dense FFN
  std::optional<MoeFfn> moe;  // Qwen3-Next MoE layers, instead of gate/up/down
};

struct Activations {
  std::vector<float> x, h, qg, q, gate, k, v, attn, ff_gate, ff_up, final_rows;
  std::vector<float> moe_out;  // [max_tokens, n_embd] when some layer is MoE
  MoeScratch moe;
};

class HybridModel final : public CpuPagedModel {
 public:
  HybridModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);

  int32_t n_state_slots() const override { return states_.n_slots(); }
  int32_t n_state_checkpoints() const override { return states_.n_checkpoints(); }
  size_t state_bytes() const override { return states_.bytes_per_state(); }
  Status forward(const Batch& batch, float* logits) override;

  // KV export: the attention layers (group 0), by their index among them.
  std::vector<KvLayer> kv_layers() const override {
    return std::vector<KvLayer>(static_cast<size_t>(n_attn_), KvLayer{0, kv_.dtype(), kv_.row_bytes()});
  }
  // State export: per linear layer (by its index among them) its conv
  // window [conv_dim, K-1] then its delta state [n_v_heads, dk, dv].
  std::vector<std::vector<StateTensor>> state_layers() const override {
    const GatedDeltaDims& d = hybrid_.gdn;
    const std::vector<StateTensor> one = {{"conv", {d.conv_dim(), d.conv_kernel - 1}},
                                          {"delta", {d.n_v_heads, d.head_k_dim, d.head_v_dim}}};
    return std::vector<std::vector<StateTensor>>(static_cast<size_t>(n_linear_), one);
  }
  Status copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const override {
    RILL_TRY(check_state(checkpoint, layer));
    std::memcpy(out, states_.conv(layer, states_.checkpoint_id(checkpoint)), layer_state_bytes());
    return {};
  }
  Status copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) override {
    RILL_TRY(check_state(checkpoint, layer));
    std::memcpy(states_.conv(layer, states_.checkpoint_id(checkpoint)), in, layer_state_bytes());
    return {};
  }

 private:
  Status bind_layer(const std::string& p, int64_t il, Layer& L);
  void attention_block(const Layer& L, const Batch& batch);
  // The FFN of h; returns where its output [n, E] is.
  const float* ffn_block(const Layer& L, int64_t n);

  // Bytes of one linear layer's state (its conv window and delta state are adjacent).
  size_t layer_state_bytes() const {
    return static_cast<size_t>(hybrid_.gdn.conv_state_floats() + hybrid_.gdn.delta_state_floats()) * sizeof(float);
  }
  Status check_state(int32_t checkpoint, int64_t layer) const {
    if (checkpoint < 0 || checkpoint >= states_.n_checkpoints() || layer < 0 || layer >= n_linear_) {
      return Error{"recurrent state of checkpoint " + std::to_string(checkpoint) + " layer " + std::to_string(layer) +
                   " does not exist"};
    }
    return {};
  }

  HybridConfig hybrid_;
  float norm_offset_ = 1.0f;  // RMSNorm scale is (norm_offset_ + w): 1 for HF, 0 for GGUF
  bool v_tiled_ = false;      // qwen35 GGUF: value heads tiled
  int64_t hd_ = 0, q_width_ = 0, kv_width_ = 0;
  int64_t n_attn_ = 0, n_linear_ = 0;  // attention and linear-attention layers
  WeightView embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  RopeTable rope_;
  AttentionParams attn_params_;
  RecurrentStates states_;
  Activations a_;
  GatedDeltaScratch gdn_scratch_;
  std::vector<cpu::AttentionSeq> attn_seqs_;
};

Status HybridModel::bind_layer(const std::string& p, int64_t il, Layer& L) {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd;
  RILL_ASSIGN_OR_RETURN(L.in_norm, load_vector(f, p + "input_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(L.post_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
  if (L.linear) {
    RILL_ASSIGN_OR_RETURN(L.gdn,
                          bind_gated_delta_net(f, p + "linear_attn.", hybrid_.gdn, E, cfg_.rms_norm_eps, v_tiled_));
  } else {
    GatedAttention& A = L.attn;
    RILL_ASSIGN_OR_RETURN(A.q, bind_linear(f, p + "self_attn.q_proj", 2 * q_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(A.k, bind_linear(f, p + "self_attn.k_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(A.v, bind_linear(f, p + "self_attn.v_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(A.o, bind_linear(f, p + "self_attn.o_proj", E, q_width_, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(A.q_norm, load_vector(f, p + "self_attn.q_norm.weight", hd_));
    RILL_ASSIGN_OR_RETURN(A.k_norm, load_vector(f, p + "self_attn.k_norm.weight", hd_));
  }
  if (is_moe_layer(cfg_, il)) {
    RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind(f, p + "mlp.", moe_params(cfg_)));
    return {};
  }
  RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, p + "mlp.gate_proj", cfg_.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, p + "mlp.up_proj", cfg_.n_ff, E));
  RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, p + "mlp.down_proj", E, cfg_.n_ff));
  return {};
}

Status HybridModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab;
  if (E <= 0 || V <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 ||
      cfg_.n_head % cfg_.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  const bool gguf = f.format == ModelFormat::kGguf;
  RILL_ASSIGN_OR_RETURN(hybrid_, read_hybrid_config(cfg_, gguf ? f.path : f.path + "/config.json"));
  norm_offset_ = gguf ? 0.0f : 1.0f;
  v_tiled_ = gguf && cfg_.architecture == "qwen3_5_text";
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E / cfg_.n_head;
  constexpr int64_t kMaxHeadDim = 512;
  if (hd_ <= 0 || hd_ > kMaxHeadDim || hd_ % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(hd_) + " is not supported (even, at most 512)"};
  }
  q_width_ = cfg_.n_head * hd_;
  kv_width_ = cfg_.n_head_kv * hd_;

  const std::string root = hybrid_tensor_root(f);
  RILL_ASSIGN_OR_RETURN(embed_, bind_matrix(f, root + "embed_tokens.weight", V, E));
  if (f.find("lm_head.weight")) {
    RILL_ASSIGN_OR_RETURN(lm_head_, bind_matrix(f, "lm_head.weight", V, E));
  } else {
    lm_head_ = embed_;
  }
  RILL_ASSIGN_OR_RETURN(final_norm_, load_vector(f, root + "norm.weight", E));

  bool all_f32 = embed_.dtype == DType::kF32;
  int64_t n_linear = 0, n_attn = 0;
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    Layer& L = layers_[static_cast<size_t>(il)];
    L.linear = hybrid_.is_linear[static_cast<size_t>(il)] != 0;
    L.index = L.linear ? n_linear++ : n_attn++;
    RILL_TRY(bind_layer(root + "layers." + std::to_string(il) + ".", il, L));
    all_f32 = all_f32 && (L.linear ? (L.gdn.fused ? L.gdn.qkvz : L.gdn.qkv).w : L.attn.q.w).dtype == DType::kF32;
  }
  n_attn_ = n_attn;
  n_linear_ = n_linear;
  if (n_attn == 0 || n_linear == 0) {
    return Error{f.path + ": a hybrid model needs both linear_attention and full_attention layers"};
  }

  const int64_t rot_dim = cfg_.rope_dim > 0 ? cfg_.rope_dim : hd_;
  if (rot_dim > hd_ || rot_dim % 2 != 0 || cfg_.rope_scaling.type != RopeScaling::Type::kNone) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) +
                 " must be even and at most head_dim, without rope scaling"};
  }
  rope_ = cpu::make_rope_table(cfg_.rope_theta, rot_dim, false);
  attn_params_.n_head = cfg_.n_head;
  attn_params_.n_head_kv = cfg_.n_head_kv;
  attn_params_.head_dim = hd_;
  attn_params_.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  attn_params_.kv_dtype = all_f32 ? DType::kF32 : DType::kF16;

  set_limits(options);
  kv_spec_ = {full(), recurrent()};
  RILL_TRY(create_kv(options, n_attn, kv_width_, attn_params_.kv_dtype));
  const int32_t n_slots = std::max(max_seqs_, std::max(1, options.n_kv_slots));
  const int32_t n_ckpt = options.n_state_checkpoints < 0 ? n_slots : options.n_state_checkpoints;
  RILL_ASSIGN_OR_RETURN(states_, RecurrentStates::create(n_linear, hybrid_.gdn, n_slots, n_ckpt));

  attn_seqs_.reserve(static_cast<size_t>(max_tokens_));
  const auto T = static_cast<size_t>(max_tokens_);
  a_.x.resize(T * E);
  a_.h.resize(T * E);
  a_.qg.resize(T * 2 * q_width_);
  a_.q.resize(T * q_width_);
  a_.gate.resize(T * q_width_);
  a_.k.resize(T * kv_width_);
  a_.v.resize(T * kv_width_);
  a_.attn.resize(T * q_width_);
  a_.ff_gate.resize(T * cfg_.n_ff);
  a_.ff_up.resize(T * cfg_.n_ff);
  a_.final_rows.resize(T * E);
  for (const Layer& L : layers_) {
    if (!L.moe) continue;
    a_.moe.reserve(L.moe->params(), max_tokens_);
    a_.moe_out.resize(T * E);
  }
  const bool fused =
      std::any_of(layers_.begin(), layers_.end(), [](const Layer& L) { return L.linear && L.gdn.fused; });
  gdn_scratch_.reserve(hybrid_.gdn, fused, max_tokens_, max_tokens_);

  std::vector<const WeightView*> weights = {&lm_head_};
  for (const Layer& L : layers_) {
    for (const Linear* l : {&L.gdn.qkv, &L.gdn.z, &L.gdn.b, &L.gdn.a, &L.gdn.qkvz, &L.gdn.ba, &L.gdn.out, &L.attn.q,
                            &L.attn.k, &L.attn.v, &L.attn.o, &L.gate, &L.up, &L.down}) {
      if (l->w.data) weights.push_back(&l->w);
    }
    if (L.moe) L.moe->collect_weights(&weights);
  }
  backend_->reserve(weights.data(), static_cast<int>(weights.size()), max_tokens_);
  return {};
}

void HybridModel::attention_block(const Layer& L, const Batch& batch) {
  const GatedAttention& A = L.attn;
  const int64_t n = batch.n_tokens(), H = cfg_.n_head;
  const Linear* qkv[] = {&A.q, &A.k, &A.v};
  float* qkv_out[] = {a_.qg.data(), a_.k.data(), a_.v.data()};
  forward_group(qkv, qkv_out, 3, a_.h.data(), n, *backend_);
  for (int64_t t = 0; t < n; ++t) {  // per head [query | gate] -> q, gate
    for (int64_t hh = 0; hh < H; ++hh) {
      const float* src = a_.qg.data() + (t * H + hh) * 2 * hd_;
      std::copy(src, src + hd_, a_.q.data() + (t * H + hh) * hd_);
      std::copy(src + hd_, src + 2 * hd_, a_.gate.data() + (t * H + hh) * hd_);
    }
  }
  backend_->rms_norm(a_.q.data(), A.q_norm.data(), n * H, hd_, cfg_.rms_norm_eps, a_.q.data(), norm_offset_);
  backend_->rms_norm(a_.k.data(), A.k_norm.data(), n * cfg_.n_head_kv, hd_, cfg_.rms_norm_eps, a_.k.data(),
                     norm_offset_);
  backend_->rope(a_.q.data(), batch.positions.data(), n, H, hd_, rope_);
  backend_->rope(a_.k.data(), batch.positions.data(), n, cfg_.n_head_kv, hd_, rope_);
  attn_seqs_.clear();
  for (const BatchSeq& s : batch.seqs) {
    const int64_t t0 = s.q_start;
    const std::span<const int32_t> table = batch.table(0, s);
    kv_.store(L.index, table, a_.k.data() + t0 * kv_width_, a_.v.data() + t0 * kv_width_, batch.positions.data() + t0,
              s.q_len, kv_width_);
    attn_seqs_.push_back({a_.q.data() + t0 * q_width_, batch.positions.data() + t0, s.q_len, kv_.view(L.index, table),
                          s.kv_len, a_.attn.data() + t0 * q_width_, s.decode_from});
  }
  backend_->attention_batch(attn_seqs_.data(), static_cast<int>(attn_seqs_.size()), attn_params_);
  float* attn = a_.attn.data();
  const float* gate = a_.gate.data();
  for (int64_t i = 0; i < n * q_width_; ++i) attn[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  A.o.forward(attn, n, a_.h.data(), *backend_);
}

const float* HybridModel::ffn_block(const Layer& L, int64_t n) {
  if (L.moe) {
    L.moe->forward(a_.h.data(), n, a_.moe_out.data(), a_.moe, *backend_);
    return a_.moe_out.data();
  }
  const Linear* gate_up[] = {&L.gate, &L.up};
  float* gate_up_out[] = {a_.ff_gate.data(), a_.ff_up.data()};
  forward_group(gate_up, gate_up_out, 2, a_.h.data(), n, *backend_);
  backend_->silu_mul(a_.ff_gate.data(), a_.ff_up.data(), a_.ff_gate.data(), n * cfg_.n_ff);
  L.down.forward(a_.ff_gate.data(), n, a_.h.data(), *backend_);
  return a_.h.data();
}

Status HybridModel::forward(const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens(), E = cfg_.n_embd;
  if (n <= 0) return {};
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = cfg_.n_vocab;
  lim.block_size = kv_.block_size();
  lim.n_blocks = kv_.n_blocks();
  RILL_TRY(check_batch(batch, lim));
  RILL_TRY(check_batch_states(batch, states_.n_slots(), states_.n_checkpoints()));
  prepare_states(batch, states_);

  backend_->get_rows(embed_, batch.token_ids.data(), n, a_.x.data());
  for (const Layer& L : layers_) {
    backend_->rms_norm(a_.x.data(), L.in_norm.data(), n, E, cfg_.rms_norm_eps, a_.h.data(), norm_offset_);
    if (L.linear) {
      // The layer reads h and writes its output to h: its projections are
      // done before the output is written.
      gated_delta_forward(L.gdn, L.index, batch, a_.h.data(), a_.h.data(), gdn_scratch_, states_, *backend_);
    } else {
      attention_block(L, batch);
    }
    backend_->add_inplace(a_.x.data(), a_.h.data(), n * E);
    backend_->rms_norm(a_.x.data(), L.post_norm.data(), n, E, cfg_.rms_norm_eps, a_.h.data(), norm_offset_);
    backend_->add_inplace(a_.x.data(), ffn_block(L, n), n * E);
  }
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  for (int64_t i = 0; i < n_sample; ++i) {
    const float* row = a_.x.data() + static_cast<int64_t>(batch.sample_rows[i]) * E;
    backend_->rms_norm(row, final_norm_.data(), 1, E, cfg_.rms_norm_eps, a_.final_rows.data() + i * E, norm_offset_);
  }
  backend_->matmul(lm_head_, a_.final_rows.data(), n_sample, logits);
  return {};
}

}  // namespace

Result<std::unique_ptr<Model>> create_qwen3_next_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                           const ModelOptions& options) {
  return init_model(std::make_unique<HybridModel>(std::move(files), options), options);
}

}  // namespace rill
