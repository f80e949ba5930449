// The Llama family (llama.cpp's graph, incl. the mixtral / qwen3_moe MoE
// FFN) split over the ranks of a tensor-parallel group: LlamaShard is one
// rank's share (model/tensor_split.h says how the weights are cut), and
// create_llama_tp_model ties N of them into one TensorParallelModel.
//
// Per layer a rank computes, for all tokens of the step:
//   h = rms_norm(x)                                  replicated   [n, E]
//   q/k/v = h W_qkv[rank rows]                       its heads    [n, Hr*hd], [n, KVr*hd]
//   attn = attention over its KV blocks              its heads    [n, Hr*hd]
//   x += all_reduce_sum(attn W_o[:, rank cols]) (+ b_o)           [n, E]
//   h = rms_norm(x); x += all_reduce_sum(FFN_rank(h))             [n, E]
// so x, the residual stream, is the same bits on every rank after each
// all-reduce (the group sums in rank order). It differs from the one-device
// x only by the summation order of o and down (and the embedding's zeros):
// the reference test holds logits to 1e-4 of the one-device model.
//
// Every rank validates the batch before its first collective, with rules
// that do not depend on the rank, so either all ranks run the step or all
// return the same error (a rank leaving alone would stall the others).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "model/arch/families.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/tensor_parallel.h"
#include "model/tensor_split.h"
#include "parallel/simulated_group.h"

namespace rill {
namespace {

struct ShardLayer {
  std::vector<float> attn_norm, ffn_norm;  // [E], replicated
  Linear q, k, v;                          // rows of this rank's heads: [Hr*hd, E], [KVr*hd, E]
  Linear o;                                // columns of this rank's heads: [E, Hr*hd], no bias
  std::vector<float> o_bias;               // [E] or empty; added once, after the all-reduce
  std::vector<float> q_norm, k_norm;       // [hd], qwen3 only
  Linear gate, up, down;                   // dense: [F/N, E], [F/N, E], [E, F/N]
  std::optional<MoeFfn> moe;               // MoE layers: every expert's n_ff split (slice_moe)
};

struct ShardActivations {
  std::vector<float> x, h;           // [T, E]; x replicated across ranks
  std::vector<float> q, k, v, attn;  // [T, Hr*hd], [T, KVr*hd]
  std::vector<float> gate, up;       // [T, F/N]
  std::vector<float> moe_out;        // [T, E]
  std::vector<int32_t> local_ids;    // [T]: token ids within this rank's vocabulary slice
  std::vector<float> final_rows;     // [S, E]
  std::vector<float> local_logits;   // [S, Vr]
  std::vector<float> logits_send;    // [S, Vp]: this rank's logits, padded to the common stride
  std::vector<float> logits_all;     // [N, S, Vp]: everyone's, after the gather
  MoeScratch moe;
};

Result<RopeTable> build_rope(const ModelFiles& f, const ModelConfig& cfg, int64_t hd) {
  const int64_t rot_dim = cfg.rope_dim > 0 ? cfg.rope_dim : hd;
  if (rot_dim > hd || rot_dim % 2 != 0) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) + " must be even and at most head_dim " +
                 std::to_string(hd)};
  }
  const cpu::RopeScalingParams rs = rope_scaling_params(cfg.rope_scaling);
  RopeTable rope = cpu::make_rope_table(cfg.rope_theta, rot_dim, cfg.rope_style == RopeStyle::kInterleaved, rs);
  if (const TensorRef* freqs = f.find("rope_freqs.weight")) {
    if (freqs->dtype != DType::kF32 || freqs->n_elements() != rot_dim / 2) {
      return Error{freqs->file + ": tensor 'rope_freqs.weight' must be F32 [" + std::to_string(rot_dim / 2) + "]"};
    }
    const float* d = reinterpret_cast<const float*>(freqs->data);
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope.inv_freq[i] /= d[i];
    rope.ggml_freq_divisor.assign(d, d + rot_dim / 2);
  }
  if (f.format == ModelFormat::kGguf && cfg.rope_scaling.type == RopeScaling::Type::kNone) {
    // llama.cpp's angle recurrence, as the one-device model (arch/llama.cpp says why).
    rope.ggml_theta_scale = std::pow(cfg.rope_theta, -2.0f / static_cast<float>(rot_dim));
  }
  return rope;
}

class LlamaShard final : public CpuPagedModel {
 public:
  LlamaShard(std::shared_ptr<const ModelFiles> files, Communicator& comm, int n_threads)
      : CpuPagedModel(std::move(files), n_threads), comm_(comm) {}

  Status init(const ModelOptions& options);

  // logits: [sample_rows, n_vocab], or null (this rank's copy is not wanted).
  Status forward(const Batch& batch, float* logits) override;

 private:
  Status bind_layer(ShardLayer& L, int64_t il);
  Status embed(const Batch& batch);
  Status attention_block(const ShardLayer& L, int64_t il, const Batch& batch);
  Status mlp_block(const ShardLayer& L, int64_t n);
  Status lm_head(const Batch& batch, float* logits);

  Communicator& comm_;
  TensorSplit split_;
  SplitRange ff_;                                // dense layers' intermediate rows of this rank
  int64_t hd_ = 0, q_width_ = 0, kv_width_ = 0;  // this rank's widths
  BatchLimits limits_;
  WeightView embed_;    // [Vr, E]: this rank's vocabulary rows
  WeightView lm_head_;  // [Vr, E]
  std::vector<float> final_norm_;
  std::vector<ShardLayer> layers_;
  RopeTable rope_;
  AttentionParams attn_params_;  // this rank's heads
  ShardActivations a_;
  std::vector<cpu::AttentionSeq> attn_seqs_;
};

Status LlamaShard::bind_layer(ShardLayer& L, int64_t il) {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd, Q = cfg_.n_head * hd_, KV = cfg_.n_head_kv * hd_;
  const std::string p = "model.layers." + std::to_string(il) + ".";
  const SplitRange q_rows{split_.heads.begin * hd_, q_width_};
  const SplitRange kv_rows{split_.kv_heads.begin * hd_, kv_width_};
  RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", E));
  RILL_ASSIGN_OR_RETURN(const Linear q, bind_linear(f, p + "self_attn.q_proj", Q, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(const Linear k, bind_linear(f, p + "self_attn.k_proj", KV, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(const Linear v, bind_linear(f, p + "self_attn.v_proj", KV, E, Bias::kOptional));
  RILL_ASSIGN_OR_RETURN(const Linear o, bind_linear(f, p + "self_attn.o_proj", E, Q, Bias::kOptional));
  L.q = slice_rows(q, q_rows);
  L.k = slice_rows(k, kv_rows);
  L.v = slice_rows(v, kv_rows);
  RILL_ASSIGN_OR_RETURN(L.o, slice_cols(o, q_rows, f.path + ": " + p + "self_attn.o_proj"));
  L.o_bias = o.bias;
  if (f.find(p + "self_attn.q_norm.weight")) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", hd_));
    RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", hd_));
  }
  RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
  if (is_moe_layer(cfg_, il)) {
    MoeNames names;
    std::string prefix = p + "mlp.";
    if (f.find(p + "block_sparse_moe.gate.weight")) {  // Mixtral
      prefix = p + "block_sparse_moe.";
      names.gate = "w1";
      names.up = "w3";
      names.down = "w2";
    }
    const MoeParams mp = moe_params(cfg_);
    if (mp.n_ff_shared > 0) {
      return Error{f.path + ": shared experts are not part of the " + cfg_.architecture + " graph"};
    }
    RILL_ASSIGN_OR_RETURN(const MoeFfn full, MoeFfn::bind(f, prefix, mp, names));
    RILL_ASSIGN_OR_RETURN(L.moe, slice_moe(full, split_.rank, split_.size, f.path + ": " + prefix));
    return Status::Ok();
  }
  const int64_t F = cfg_.n_ff;
  RILL_ASSIGN_OR_RETURN(const Linear gate, bind_linear(f, p + "mlp.gate_proj", F, E));
  RILL_ASSIGN_OR_RETURN(const Linear up, bind_linear(f, p + "mlp.up_proj", F, E));
  RILL_ASSIGN_OR_RETURN(const Linear down, bind_linear(f, p + "mlp.down_proj", E, F));
  L.gate = slice_rows(gate, ff_);
  L.up = slice_rows(up, ff_);
  RILL_ASSIGN_OR_RETURN(L.down, slice_cols(down, ff_, f.path + ": " + p + "mlp.down_proj"));
  return Status::Ok();
}

Status LlamaShard::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab;
  if (E <= 0 || V <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 ||
      (cfg_.n_ff <= 0 && cfg_.n_expert == 0)) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  RILL_ASSIGN_OR_RETURN(split_, plan_tensor_split(cfg_, comm_.rank(), comm_.size(), f.path));
  bool any_dense = false;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) any_dense = any_dense || !is_moe_layer(cfg_, il);
  if (any_dense) {
    RILL_ASSIGN_OR_RETURN(ff_, split_evenly(cfg_.n_ff, split_.rank, split_.size, "intermediate_size", f.path));
  }
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E / cfg_.n_head;
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  if (hd_ <= 0 || hd_ > kMaxHeadDim || hd_ % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(hd_) + " is not supported (even, at most " +
                 std::to_string(kMaxHeadDim) + ")"};
  }
  q_width_ = split_.heads.n * hd_;
  kv_width_ = split_.kv_heads.n * hd_;

  RILL_ASSIGN_OR_RETURN(const WeightView embed, bind_matrix(f, "model.embed_tokens.weight", V, E));
  WeightView lm_head = embed;
  if (f.find("lm_head.weight")) {
    RILL_ASSIGN_OR_RETURN(lm_head, bind_matrix(f, "lm_head.weight", V, E));
  }
  embed_ = slice_rows(embed, split_.vocab);
  lm_head_ = slice_rows(lm_head, split_.vocab);
  RILL_ASSIGN_OR_RETURN(final_norm_, load_vector(f, "model.norm.weight", E));
  set_limits(options);

  bool all_f32 = embed.dtype == DType::kF32;
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    ShardLayer& L = layers_[static_cast<size_t>(il)];
    RILL_TRY(bind_layer(L, il));
    all_f32 = all_f32 && L.q.w.dtype == DType::kF32 && (L.moe || L.gate.w.dtype == DType::kF32);
  }
  RILL_ASSIGN_OR_RETURN(rope_, build_rope(f, cfg_, hd_));

  attn_params_.n_head = split_.heads.n;
  attn_params_.n_head_kv = split_.kv_heads.n;
  attn_params_.head_dim = hd_;
  attn_params_.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  attn_params_.window = cfg_.sliding_window;
  attn_params_.kv_dtype = all_f32 ? DType::kF32 : DType::kF16;  // as the one-device model

  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  // kv_cache_bytes is the budget of all ranks together; every rank has the
  // same per-token bytes, so every rank gets the same number of blocks.
  RILL_TRY(create_kv(options, cfg_.n_layer, kv_width_, attn_params_.kv_dtype, split_.size));
  limits_ = {max_tokens_, max_seqs_, n_ctx_, V, kv_.block_size(), kv_.n_blocks(), cfg_.sliding_window};

  attn_seqs_.reserve(static_cast<size_t>(max_tokens_));
  const auto T = static_cast<size_t>(max_tokens_), S = static_cast<size_t>(max_seqs_);
  const auto F = static_cast<size_t>(ff_.n);
  a_.x.resize(T * E);
  a_.h.resize(T * E);
  a_.q.resize(T * q_width_);
  a_.k.resize(T * kv_width_);
  a_.v.resize(T * kv_width_);
  a_.attn.resize(T * q_width_);
  a_.gate.resize(T * F);
  a_.up.resize(T * F);
  a_.local_ids.resize(T);
  a_.final_rows.resize(S * E);
  a_.local_logits.resize(S * static_cast<size_t>(split_.vocab.n));
  a_.logits_send.assign(S * static_cast<size_t>(split_.vocab_stride), 0.0f);
  a_.logits_all.resize(static_cast<size_t>(split_.size) * a_.logits_send.size());
  std::vector<const WeightView*> weights = {&lm_head_};
  for (const ShardLayer& L : layers_) {
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o}) weights.push_back(&l->w);
    if (L.moe) {
      L.moe->collect_weights(&weights);
      a_.moe.reserve(L.moe->params(), max_tokens_);
      a_.moe_out.resize(T * E);
    } else {
      for (const Linear* l : {&L.gate, &L.up, &L.down}) weights.push_back(&l->w);
    }
  }
  backend_->reserve(weights.data(), static_cast<int>(weights.size()), max_tokens_);
  return Status::Ok();
}

// x = embedding rows of the batch's tokens: each rank fills the rows of
// tokens in its vocabulary slice, zeros elsewhere, and the all-reduce
// completes every row (exactly: each element is one value plus zeros).
Status LlamaShard::embed(const Batch& batch) {
  const int64_t n = batch.n_tokens(), E = cfg_.n_embd;
  const SplitRange vr = split_.vocab;
  if (vr.n > 0) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = batch.token_ids[i];
      a_.local_ids[i] = id >= vr.begin && id < vr.begin + vr.n ? static_cast<int32_t>(id - vr.begin) : 0;
    }
    backend_->get_rows(embed_, a_.local_ids.data(), n, a_.x.data());
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = batch.token_ids[i];
    if (id < vr.begin || id >= vr.begin + vr.n) std::fill_n(a_.x.data() + i * E, E, 0.0f);
  }
  return comm_.all_reduce_sum(a_.x.data(), n * E);
}

Status LlamaShard::attention_block(const ShardLayer& L, int64_t il, const Batch& batch) {
  const int64_t n = batch.n_tokens(), E = cfg_.n_embd;
  const int64_t n_head = split_.heads.n, n_head_kv = split_.kv_heads.n;
  const Linear* qkv[] = {&L.q, &L.k, &L.v};
  float* qkv_out[] = {a_.q.data(), a_.k.data(), a_.v.data()};
  forward_group(qkv, qkv_out, 3, a_.h.data(), n, *backend_);
  if (!L.q_norm.empty()) {
    backend_->rms_norm(a_.q.data(), L.q_norm.data(), n * n_head, hd_, cfg_.rms_norm_eps, a_.q.data());
    backend_->rms_norm(a_.k.data(), L.k_norm.data(), n * n_head_kv, hd_, cfg_.rms_norm_eps, a_.k.data());
  }
  backend_->rope(a_.q.data(), batch.positions.data(), n, n_head, hd_, rope_);
  backend_->rope(a_.k.data(), batch.positions.data(), n, n_head_kv, hd_, rope_);
  attn_seqs_.clear();
  for (const BatchSeq& s : batch.seqs) {
    const int64_t t0 = s.q_start;
    const std::span<const int32_t> table = batch.table(0, s);
    kv_.store(il, table, a_.k.data() + t0 * kv_width_, a_.v.data() + t0 * kv_width_, batch.positions.data() + t0,
              s.q_len, kv_width_);
    attn_seqs_.push_back({a_.q.data() + t0 * q_width_, batch.positions.data() + t0, s.q_len, kv_.view(il, table),
                          s.kv_len, a_.attn.data() + t0 * q_width_, s.decode_from});
  }
  backend_->attention_batch(attn_seqs_.data(), static_cast<int>(attn_seqs_.size()), attn_params_);
  L.o.forward(a_.attn.data(), n, a_.h.data(), *backend_);  // this rank's heads' share of o
  RILL_TRY(comm_.all_reduce_sum(a_.h.data(), n * E));
  if (!L.o_bias.empty()) {
    for (int64_t t = 0; t < n; ++t) backend_->add_inplace(a_.h.data() + t * E, L.o_bias.data(), E);
  }
  backend_->add_inplace(a_.x.data(), a_.h.data(), n * E);
  return Status::Ok();
}

Status LlamaShard::mlp_block(const ShardLayer& L, int64_t n) {
  const int64_t E = cfg_.n_embd;
  float* out = a_.h.data();
  if (L.moe) {
    out = a_.moe_out.data();
    L.moe->forward(a_.h.data(), n, out, a_.moe, *backend_);
  } else {
    const Linear* gate_up[] = {&L.gate, &L.up};
    float* gate_up_out[] = {a_.gate.data(), a_.up.data()};
    forward_group(gate_up, gate_up_out, 2, a_.h.data(), n, *backend_);
    backend_->silu_mul(a_.gate.data(), a_.up.data(), a_.gate.data(), n * ff_.n);
    L.down.forward(a_.gate.data(), n, out, *backend_);
  }
  RILL_TRY(comm_.all_reduce_sum(out, n * E));
  backend_->add_inplace(a_.x.data(), out, n * E);
  return Status::Ok();
}

// logits = the gathered vocabulary slices: rank r's logits [S, Vr] travel
// padded to [S, Vp], the gather lays them [N, S, Vp], and each sample row is
// reassembled from the N slices.
Status LlamaShard::lm_head(const Batch& batch, float* logits) {
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab;
  const auto S = static_cast<int64_t>(batch.sample_rows.size());
  const int64_t Vp = split_.vocab_stride, Vr = split_.vocab.n;
  for (int64_t i = 0; i < S; ++i) {
    const float* row = a_.x.data() + static_cast<int64_t>(batch.sample_rows[i]) * E;
    backend_->rms_norm(row, final_norm_.data(), 1, E, cfg_.rms_norm_eps, a_.final_rows.data() + i * E);
  }
  if (Vr == Vp) {
    backend_->matmul(lm_head_, a_.final_rows.data(), S, a_.logits_send.data());
  } else {
    if (Vr > 0) backend_->matmul(lm_head_, a_.final_rows.data(), S, a_.local_logits.data());
    for (int64_t i = 0; i < S; ++i) {
      std::copy_n(a_.local_logits.data() + i * Vr, Vr, a_.logits_send.data() + i * Vp);  // the padding stays 0
    }
  }
  RILL_TRY(comm_.all_gather(a_.logits_send.data(), S * Vp, a_.logits_all.data()));
  if (logits == nullptr) return Status::Ok();
  for (int r = 0; r < split_.size; ++r) {
    const int64_t v0 = r * Vp, n_v = std::max<int64_t>(0, std::min(V, v0 + Vp) - v0);
    const float* src = a_.logits_all.data() + r * S * Vp;
    for (int64_t i = 0; i < S; ++i) std::copy_n(src + i * Vp, n_v, logits + i * V + v0);
  }
  return Status::Ok();
}

Status LlamaShard::forward(const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens(), E = cfg_.n_embd;
  if (n <= 0) return {};
  RILL_TRY(check_batch(batch, limits_));  // the same verdict on every rank (see the top)
  RILL_TRY(embed(batch));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const ShardLayer& L = layers_[static_cast<size_t>(il)];
    backend_->rms_norm(a_.x.data(), L.attn_norm.data(), n, E, cfg_.rms_norm_eps, a_.h.data());
    RILL_TRY(attention_block(L, il, batch));
    backend_->rms_norm(a_.x.data(), L.ffn_norm.data(), n, E, cfg_.rms_norm_eps, a_.h.data());
    RILL_TRY(mlp_block(L, n));
  }
  return lm_head(batch, logits);
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_tp_model(std::shared_ptr<const ModelFiles> files,
                                                     const ModelOptions& options) {
  const int n_ranks = options.tensor_parallel;
  if (options.device == Device::kCuda) return create_llama_cuda_tp_model(std::move(files), options);
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedGroup> group, SimulatedGroup::create(n_ranks));
  // The ranks share the cores.
  const int n_cores = options.n_threads > 0 ? options.n_threads : static_cast<int>(std::thread::hardware_concurrency());
  const int n_threads = std::max(1, n_cores / n_ranks);
  std::vector<std::unique_ptr<Model>> shards;
  for (int r = 0; r < n_ranks; ++r) {
    auto shard = std::make_unique<LlamaShard>(files, group->rank(r), n_threads);
    RILL_TRY(shard->init(options));
    shards.push_back(std::move(shard));
  }
  return std::unique_ptr<Model>(std::make_unique<TensorParallelModel>(std::move(group), std::move(shards)));
}

}  // namespace rill
