// The Llama family, one implementation for llama, mistral, qwen2, qwen3,
// smollm and their mixtures of experts (mixtral, qwen3_moe). Differences are
// data, read from the config and the tensors present:
//   qkv bias (qwen2)            q_proj.bias present
//   q/k RMSNorm (qwen3)         self_attn.q_norm.weight present (over head_dim)
//   sliding window (mistral)    config.sliding_window > 0
//   tied embeddings             lm_head.weight absent
//   rope variants               config.rope_scaling (see backend/cpu/rope_table.h)
//   MoE FFN (mixtral, qwen3_moe) config.n_expert > 0, per layer is_moe_layer()
//                               (model/moe.h); Mixtral names it block_sparse_moe
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/rope_table.h"
#include "core/thread_pool.h"
#include "model/arch/families.h"
#include "model/arch/llama_weights.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"

namespace rill {
namespace {

using LlamaLayer = LlamaLayerWeights;

// Activations for up to max_tokens tokens, allocated once.
struct Activations {
  std::vector<float> x, h, q, k, v, attn, gate, up, final_rows;
  std::vector<float> moe_out;  // [max_tokens, n_embd] when some layer is MoE
  MoeScratch moe;
};

// What one forward pass runs on: a backend and its activations. The model
// has one for whole batches and, on several threads, one per decode lane.
struct Exec {
  Backend* backend;
  Activations* a;
  std::vector<cpu::AttentionSeq>* attn_seqs;
};

// A decode lane: a backend on its share of the threads, with its own
// activations, that runs a share of a decode step's sequences (see
// forward()).
struct DecodeLane {
  std::unique_ptr<Backend> backend;
  Activations a;
  std::vector<cpu::AttentionSeq> attn_seqs;
  Batch sub;             // this lane's sequences of the step
  int32_t first = 0;     // its first sequence (= token and logits row) in the step
  int thread_share = 0;  // threads before this lane's; its sequences are in that proportion
  Status status;
};

class LlamaModel final : public CpuPagedModel {
 public:
  LlamaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options)
      : CpuPagedModel(std::move(files), options.n_threads) {}

  Status init(const ModelOptions& options);

  Status forward(const Batch& batch, float* logits) override;
  std::vector<KvLayer> kv_layers() const override {
    return std::vector<KvLayer>(static_cast<size_t>(cfg_.n_layer), KvLayer{0, kv_.dtype(), kv_.row_bytes()});
  }

 private:
  Status run(const Exec& e, const Batch& batch, float* logits);
  void attention_block(const Exec& e, const LlamaLayer& L, int64_t il, const Batch& batch);
  void mlp_block(const Exec& e, const LlamaLayer& L, int64_t n);
  void size_activations(Activations& a, int64_t max_tokens) const;
  // Whether forward() runs `batch` as one sub-batch per lane.
  bool split_into_lanes(const Batch& batch) const;
  // Lane l's sequences [first, last) of a split step of n: in proportion to its threads.
  std::pair<int32_t, int32_t> lane_range(int32_t l, int32_t n) const;
  Status check_batch(const Batch& batch) const;

  int64_t hd_ = 0, q_width_ = 0, kv_width_ = 0;
  WeightView embed_;    // [n_vocab, n_embd]
  WeightView lm_head_;  // [n_vocab, n_embd]; the embedding when tied
  std::vector<float> final_norm_;
  std::vector<LlamaLayer> layers_;
  RopeTable rope_;
  AttentionParams attn_params_;
  Activations a_;
  std::vector<cpu::AttentionSeq> attn_seqs_;  // per step; capacity reserved at init
  int n_threads_ = 1;                         // the backend's threads, shared out among the lanes
  int64_t lane_tokens_ = 0;                   // the most sequences a lane takes
  std::unique_ptr<ThreadPool> lane_pool_;     // one thread per lane; null without lanes
  std::vector<DecodeLane> lanes_;             // empty: no lanes (one thread, or MoE)
};

// Decode steps of at least kLaneMinSeqs sequences per lane, at most
// kLaneMaxSeqs, run as two lanes, each on half of the threads with half of
// the sequences. A lane's GEMM costs the same per (row, token) as the
// shared one from 4 tokens up (the weights are read twice, which a
// compute-bound step can afford), while the lanes drift apart in time, so
// one lane's memory-bound attention overlaps the other's compute-bound
// matmuls; in lockstep every core waits on memory together. Measured with
// SmolLM2-135M Q4_1 on 2 cores (docs/perf.md).
constexpr int kLanes = 2;
constexpr int32_t kLaneMinSeqs = 4, kLaneMaxSeqs = 64;

Status LlamaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head (and its RoPE angles) on the stack
  RILL_ASSIGN_OR_RETURN(const LlamaDims d, llama_dims(f, kMaxHeadDim));
  const int64_t E = d.E;
  hd_ = d.hd;
  q_width_ = d.Q;
  kv_width_ = d.KV;
  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, d));
  const bool all_f32 = w.all_f32();
  embed_ = w.embed;
  lm_head_ = w.lm_head;
  final_norm_ = std::move(w.final_norm);
  layers_ = std::move(w.layers);
  RILL_ASSIGN_OR_RETURN(rope_, build_llama_rope(f, hd_));
  set_limits(options);

  attn_params_.n_head = cfg_.n_head;
  attn_params_.n_head_kv = cfg_.n_head_kv;
  attn_params_.head_dim = hd_;
  attn_params_.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  attn_params_.window = cfg_.sliding_window;
  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  attn_params_.kv_dtype = all_f32 ? DType::kF32 : DType::kF16;

  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  RILL_TRY(create_kv(options, cfg_.n_layer, kv_width_, attn_params_.kv_dtype));

  attn_seqs_.reserve(static_cast<size_t>(max_tokens_));  // a batch has at most one sequence per token
  size_activations(a_, max_tokens_);
  std::vector<const WeightView*> weights = {&lm_head_};
  bool any_moe = false;
  for (const LlamaLayer& L : layers_) {
    for (const Linear* l : {&L.q, &L.k, &L.v, &L.o}) weights.push_back(&l->w);
    if (L.moe) {
      any_moe = true;
      L.moe->collect_weights(&weights);
      a_.moe.reserve(L.moe->params(), max_tokens_);
      a_.moe_out.resize(static_cast<size_t>(max_tokens_ * E));
    } else {
      for (const Linear* l : {&L.gate, &L.up, &L.down}) weights.push_back(&l->w);
    }
  }
  backend_->reserve(weights.data(), static_cast<int>(weights.size()), max_tokens_);
  n_threads_ =
      options.n_threads > 0 ? options.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = n_threads_;
  if (n_threads >= kLanes && !any_moe) {
    const int64_t lane_tokens = lane_tokens_ = std::min<int64_t>(max_tokens_, kLaneMaxSeqs);
    lane_pool_ = std::make_unique<ThreadPool>(kLanes);
    lanes_.resize(kLanes);
    for (int l = 0; l < kLanes; ++l) {
      DecodeLane& lane = lanes_[static_cast<size_t>(l)];
      lane.thread_share = n_threads * l / kLanes;
      lane.backend = make_cpu_backend(n_threads * (l + 1) / kLanes - lane.thread_share);
      lane.backend->reserve(weights.data(), static_cast<int>(weights.size()), lane_tokens);
      size_activations(lane.a, lane_tokens);
      lane.attn_seqs.reserve(static_cast<size_t>(lane_tokens));
    }
  }
  return {};
}

void LlamaModel::size_activations(Activations& a, int64_t max_tokens) const {
  const auto T = static_cast<size_t>(max_tokens);
  const auto E = static_cast<size_t>(cfg_.n_embd), F = static_cast<size_t>(std::max<int64_t>(cfg_.n_ff, 0));
  a.x.resize(T * E);
  a.h.resize(T * E);
  a.q.resize(T * static_cast<size_t>(q_width_));
  a.k.resize(T * static_cast<size_t>(kv_width_));
  a.v.resize(T * static_cast<size_t>(kv_width_));
  a.attn.resize(T * static_cast<size_t>(q_width_));
  a.gate.resize(T * F);
  a.up.resize(T * F);
  a.final_rows.resize(T * E);
}

void LlamaModel::attention_block(const Exec& e, const LlamaLayer& L, int64_t il, const Batch& batch) {
  const int64_t n = batch.n_tokens();
  Activations& a = *e.a;
  Backend& backend = *e.backend;
  std::vector<cpu::AttentionSeq>& seqs = *e.attn_seqs;
  const Linear* qkv[] = {&L.q, &L.k, &L.v};
  float* qkv_out[] = {a.q.data(), a.k.data(), a.v.data()};
  forward_group(qkv, qkv_out, 3, a.h.data(), n, backend);
  if (!L.q_norm.empty()) {
    backend.rms_norm(a.q.data(), L.q_norm.data(), n * cfg_.n_head, hd_, cfg_.rms_norm_eps, a.q.data());
    backend.rms_norm(a.k.data(), L.k_norm.data(), n * cfg_.n_head_kv, hd_, cfg_.rms_norm_eps, a.k.data());
  }
  backend.rope(a.q.data(), batch.positions.data(), n, cfg_.n_head, hd_, rope_);
  backend.rope(a.k.data(), batch.positions.data(), n, cfg_.n_head_kv, hd_, rope_);
  // Store every sequence's new K/V, then attend for all of them in one call.
  seqs.clear();
  for (const BatchSeq& s : batch.seqs) {
    const int64_t t0 = s.q_start;
    const std::span<const int32_t> table = batch.table(0, s);
    kv_.store(il, table, a.k.data() + t0 * kv_width_, a.v.data() + t0 * kv_width_, batch.positions.data() + t0, s.q_len,
              kv_width_);
    seqs.push_back({a.q.data() + t0 * q_width_, batch.positions.data() + t0, s.q_len, kv_.view(il, table), s.kv_len,
                    a.attn.data() + t0 * q_width_, s.decode_from});
  }
  backend.attention_batch(seqs.data(), static_cast<int>(seqs.size()), attn_params_);
  L.o.forward(a.attn.data(), n, a.h.data(), backend);
  backend.add_inplace(a.x.data(), a.h.data(), n * cfg_.n_embd);
}

void LlamaModel::mlp_block(const Exec& e, const LlamaLayer& L, int64_t n) {
  Activations& a = *e.a;
  Backend& backend = *e.backend;
  if (L.moe) {
    L.moe->forward(a.h.data(), n, a.moe_out.data(), a.moe, backend);
    backend.add_inplace(a.x.data(), a.moe_out.data(), n * cfg_.n_embd);
    return;
  }
  const Linear* gate_up[] = {&L.gate, &L.up};
  float* gate_up_out[] = {a.gate.data(), a.up.data()};
  forward_group(gate_up, gate_up_out, 2, a.h.data(), n, backend);
  backend.silu_mul(a.gate.data(), a.up.data(), a.gate.data(), n * cfg_.n_ff);
  L.down.forward(a.gate.data(), n, a.h.data(), backend);
  backend.add_inplace(a.x.data(), a.h.data(), n * cfg_.n_embd);
}

Status LlamaModel::check_batch(const Batch& batch) const {
  return rill::check_batch(
      batch, {max_tokens_, max_seqs_, n_ctx_, cfg_.n_vocab, kv_.block_size(), kv_.n_blocks(), attn_params_.window});
}

std::pair<int32_t, int32_t> LlamaModel::lane_range(int32_t l, int32_t n) const {
  const auto n_lanes = static_cast<int32_t>(lanes_.size());
  const int64_t share = lanes_[static_cast<size_t>(l)].thread_share;
  const int64_t next = l + 1 < n_lanes ? lanes_[static_cast<size_t>(l) + 1].thread_share : n_threads_;
  return {static_cast<int32_t>(n * share / n_threads_), static_cast<int32_t>(n * next / n_threads_)};
}

bool LlamaModel::split_into_lanes(const Batch& batch) const {
  const auto n_lanes = static_cast<int32_t>(lanes_.size());
  const int32_t n = batch.n_tokens();
  if (n_lanes < 2 || n < n_lanes * kLaneMinSeqs || n > n_lanes * kLaneMaxSeqs) return false;
  for (int32_t l = 0; l < n_lanes; ++l) {
    const auto [first, last] = lane_range(l, n);
    if (last - first < kLaneMinSeqs || last - first > lane_tokens_) return false;
  }
  if (static_cast<int32_t>(batch.seqs.size()) != n || static_cast<int32_t>(batch.sample_rows.size()) != n) return false;
  // Decode only: sequence i is token i, and every token samples in order.
  for (int32_t i = 0; i < n; ++i) {
    const BatchSeq& s = batch.seqs[static_cast<size_t>(i)];
    if (s.q_start != i || s.q_len != 1 || batch.sample_rows[static_cast<size_t>(i)] != i) return false;
  }
  return true;
}

// Every (row, token) product, norm and attention head computes the same
// bits alone, in a lane or in the whole batch, so how a step is split does
// not change any token's logits.
Status LlamaModel::forward(const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens();
  if (n <= 0) return {};
  RILL_TRY(check_batch(batch));
  if (!split_into_lanes(batch)) return run(Exec{backend_.get(), &a_, &attn_seqs_}, batch, logits);

  const auto n_lanes = static_cast<int32_t>(lanes_.size());
  for (int32_t l = 0; l < n_lanes; ++l) {
    DecodeLane& lane = lanes_[static_cast<size_t>(l)];
    const auto [first, last] = lane_range(l, static_cast<int32_t>(n));
    lane.first = first;
    lane.sub.clear();
    for (int32_t i = first; i < last; ++i) {
      const BatchSeq& s = batch.seqs[static_cast<size_t>(i)];
      lane.sub.add_sequence(&batch.token_ids[static_cast<size_t>(i)], 1, s.kv_len - 1, /*sample_last=*/true,
                            batch.table(0, s));
      lane.sub.seqs.back().decode_from = s.decode_from;
    }
  }
  lane_pool_->for_each_thread([&](int l) {
    DecodeLane& lane = lanes_[static_cast<size_t>(l)];
    lane.status = run(Exec{lane.backend.get(), &lane.a, &lane.attn_seqs}, lane.sub,
                      logits + static_cast<int64_t>(lane.first) * cfg_.n_vocab);
  });
  for (const DecodeLane& lane : lanes_) RILL_TRY(lane.status);
  return {};
}

Status LlamaModel::run(const Exec& e, const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t E = cfg_.n_embd;
  Activations& a = *e.a;
  Backend& backend = *e.backend;
  backend.get_rows(embed_, batch.token_ids.data(), n, a.x.data());
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const LlamaLayer& L = layers_[static_cast<size_t>(il)];
    backend.rms_norm(a.x.data(), L.attn_norm.data(), n, E, cfg_.rms_norm_eps, a.h.data());
    attention_block(e, L, il, batch);
    backend.rms_norm(a.x.data(), L.ffn_norm.data(), n, E, cfg_.rms_norm_eps, a.h.data());
    mlp_block(e, L, n);
  }
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  for (int64_t i = 0; i < n_sample; ++i) {
    const float* row = a.x.data() + static_cast<int64_t>(batch.sample_rows[i]) * E;
    backend.rms_norm(row, final_norm_.data(), 1, E, cfg_.rms_norm_eps, a.final_rows.data() + i * E);
  }
  backend.matmul(lm_head_, a.final_rows.data(), n_sample, logits);
  return {};
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_tp_model(std::move(files), options);
  return init_model(std::make_unique<LlamaModel>(std::move(files), options), options);
}

}  // namespace rill
