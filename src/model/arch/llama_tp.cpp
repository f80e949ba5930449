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
#include "model/arch/llama_weights.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/tensor_parallel.h"
#include "model/tensor_split.h"
#include "parallel/simulated_group.h"

namespace rill {
namespace {

// One rank's layer: shard_llama_layers' cut (o.bias whole, added after the all-reduce).
using ShardLayer = LlamaLayerWeights;

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

class LlamaShard final : public CpuPagedModel {
 public:
  LlamaShard(std::shared_ptr<const ModelFiles> files, Communicator& comm, int n_threads)
      : CpuPagedModel(std::move(files), n_threads), comm_(comm) {}

  Status init(const ModelOptions& options);

  // logits: [sample_rows, n_vocab], or null (this rank's copy is not wanted).
  Status forward(const Batch& batch, float* logits) override;

 private:
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

Status LlamaShard::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head on the stack
  RILL_ASSIGN_OR_RETURN(const LlamaDims d, llama_dims(f, kMaxHeadDim));
  const int64_t E = d.E;
  RILL_ASSIGN_OR_RETURN(split_, plan_tensor_split(cfg_, comm_.rank(), comm_.size(), f.path));
  bool any_dense = false;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) any_dense = any_dense || !is_moe_layer(cfg_, il);
  if (any_dense) {
    RILL_ASSIGN_OR_RETURN(ff_, split_evenly(cfg_.n_ff, split_.rank, split_.size, "intermediate_size", f.path));
  }
  hd_ = d.hd;
  q_width_ = split_.heads.n * hd_;
  kv_width_ = split_.kv_heads.n * hd_;

  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, d));
  const bool all_f32 = w.all_f32();
  RILL_TRY(shard_llama_layers(w, split_, ff_, hd_, f.path));
  embed_ = slice_rows(w.embed, split_.vocab);
  lm_head_ = slice_rows(w.lm_head, split_.vocab);
  final_norm_ = std::move(w.final_norm);
  layers_ = std::move(w.layers);
  RILL_ASSIGN_OR_RETURN(rope_, build_llama_rope(f, hd_));
  set_limits(options);

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
  limits_ = {max_tokens_, max_seqs_, n_ctx_, d.V, kv_.block_size(), kv_.n_blocks(), cfg_.sliding_window};

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
  backend_->matmul(L.o.w, a_.attn.data(), n, a_.h.data());  // this rank's heads' share of o (no bias)
  RILL_TRY(comm_.all_reduce_sum(a_.h.data(), n * E));
  if (!L.o.bias.empty()) {
    for (int64_t t = 0; t < n; ++t) backend_->add_inplace(a_.h.data() + t * E, L.o.bias.data(), E);
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
