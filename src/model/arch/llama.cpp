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
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_ops.h"
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

// One layer as the Backend placed it: q/k/v as one weight (rows q, k, v) and
// gate/up as one (rows gate, up), as the CUDA graph holds them.
struct LlamaLayer {
  Vec attn_norm;              // [n_embd]
  Weight wqkv;                // [q + 2 kv, n_embd]
  Vec bqkv;                   // [q + 2 kv] (zeros for a part without one) or absent (qwen2 has them)
  Vec q_norm, k_norm;         // [head_dim], qwen3 only
  Weight wo;                  // [n_embd, q]
  Vec bo;                     // [n_embd] or absent
  Vec ffn_norm;               // [n_embd]
  Weight w_gate_up;           // [2 n_ff, n_embd]; dense layers
  Weight w_down;              // [n_embd, n_ff]
  std::optional<MoeFfn> moe;  // MoE layers, instead of gate/up/down (cpu::HostOps until MoE is a Backend op)
};

// Activations for up to max_tokens tokens, allocated once. CPU activations
// are f32 (the Backend's act dtype), so h feeds every matmul.
struct Activations {
  std::vector<float> x, h, qkv, attn, gu, mlp, final_rows;
  std::vector<float> moe_out;  // [max_tokens, n_embd] when some layer is MoE
  MoeScratch moe;
  // The step's metadata (StepMetadata points here and into the Batch).
  std::vector<int32_t> q_start, q_len, kv_len, decode_from, table_start, slots;
};

// What one forward pass runs on: a backend and its activations. The model
// has one for whole batches and, on several threads, one per decode lane.
struct Exec {
  Backend* backend;
  Activations* a;
};

// A decode lane: a backend on its share of the threads, with its own
// activations, that runs a share of a decode step's sequences (see
// forward()).
struct DecodeLane {
  std::unique_ptr<Backend> backend;
  Activations a;
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
  StepMetadata step_metadata(const Batch& batch, Activations& a) const;
  Status attention_block(const Exec& e, const LlamaLayer& L, int64_t il, const StepMetadata& md);
  Status mlp_block(const Exec& e, const LlamaLayer& L, int64_t n);
  void size_activations(Activations& a, int64_t max_tokens) const;
  // Whether forward() runs `batch` as one sub-batch per lane.
  bool split_into_lanes(const Batch& batch) const;
  // Lane l's sequences [first, last) of a split step of n: in proportion to its threads.
  std::pair<int32_t, int32_t> lane_range(int32_t l, int32_t n) const;
  Status check_batch(const Batch& batch) const;

  int64_t hd_ = 0, q_width_ = 0, kv_width_ = 0, qkv_width_ = 0;
  std::unique_ptr<Backend> device_;  // on backend_'s threads (the MoE layers' cpu::HostOps)
  Weight embed_;                     // [n_vocab, n_embd]
  Weight lm_head_;                   // [n_vocab, n_embd]; the embedding when tied
  Vec final_norm_;
  std::vector<LlamaLayer> layers_;
  Rope rope_;
  float attn_scale_ = 1.0f;
  int32_t window_ = 0;
  Activations a_;
  int n_threads_ = 1;                      // the backend's threads, shared out among the lanes
  int64_t lane_tokens_ = 0;                // the most sequences a lane takes
  std::unique_ptr<ThreadPool> lane_pool_;  // one thread per lane; null without lanes
  std::vector<DecodeLane> lanes_;          // empty: no lanes (one thread, or MoE)
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

HostMatrix host_matrix(const WeightView& w) {
  return {w.data, w.dtype, w.n_rows, w.n_cols, w.row_stride};
}

Status LlamaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  constexpr int64_t kMaxHeadDim = 512;  // the CPU kernels keep one head (and its RoPE angles) on the stack
  RILL_ASSIGN_OR_RETURN(const LlamaDims d, llama_dims(f, kMaxHeadDim));
  const int64_t E = d.E;
  hd_ = d.hd;
  q_width_ = d.Q;
  kv_width_ = d.KV;
  qkv_width_ = q_width_ + 2 * kv_width_;
  device_ = make_cpu_backend_on(*backend_->pool());
  Backend& dev = *device_;

  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, d));
  const bool all_f32 = w.all_f32();
  const HostMatrix embed_m = host_matrix(w.embed);
  RILL_ASSIGN_OR_RETURN(embed_, dev.place(&embed_m, 1, "model.embed_tokens.weight"));
  lm_head_ = embed_;
  if (!w.tied) {
    const HostMatrix m = host_matrix(w.lm_head);
    RILL_ASSIGN_OR_RETURN(lm_head_, dev.place(&m, 1, "lm_head.weight"));
  }
  RILL_ASSIGN_OR_RETURN(final_norm_, dev.place_vector(w.final_norm.data(), E, "model.norm.weight"));
  set_limits(options);

  std::vector<const WeightView*> moe_weights;
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    LlamaLayerWeights& h = w.layers[static_cast<size_t>(il)];
    LlamaLayer& L = layers_[static_cast<size_t>(il)];
    auto vec = [&](const std::vector<float>& v, const std::string& name) {
      return dev.place_vector(v.data(), static_cast<int64_t>(v.size()), p + name);
    };
    RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(h.attn_norm, "input_layernorm.weight"));
    const HostMatrix qkv[] = {host_matrix(h.q.w), host_matrix(h.k.w), host_matrix(h.v.w)};
    RILL_ASSIGN_OR_RETURN(L.wqkv, dev.place(qkv, 3, p + "self_attn.{q,k,v}_proj"));
    if (!h.q.bias.empty() || !h.k.bias.empty() || !h.v.bias.empty()) {
      std::vector<float> b(static_cast<size_t>(qkv_width_), 0.0f);  // zeros where a part has none
      std::copy(h.q.bias.begin(), h.q.bias.end(), b.begin());
      std::copy(h.k.bias.begin(), h.k.bias.end(), b.begin() + q_width_);
      std::copy(h.v.bias.begin(), h.v.bias.end(), b.begin() + q_width_ + kv_width_);
      RILL_ASSIGN_OR_RETURN(L.bqkv, vec(b, "self_attn qkv bias"));
    }
    const HostMatrix om = host_matrix(h.o.w);
    RILL_ASSIGN_OR_RETURN(L.wo, dev.place(&om, 1, p + "self_attn.o_proj"));
    if (!h.o.bias.empty()) {
      RILL_ASSIGN_OR_RETURN(L.bo, vec(h.o.bias, "self_attn.o_proj.bias"));
    }
    if (!h.q_norm.empty()) {
      RILL_ASSIGN_OR_RETURN(L.q_norm, vec(h.q_norm, "self_attn.q_norm.weight"));
      RILL_ASSIGN_OR_RETURN(L.k_norm, vec(h.k_norm, "self_attn.k_norm.weight"));
    }
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(h.ffn_norm, "post_attention_layernorm.weight"));
    if (h.moe) {
      L.moe = std::move(h.moe);
      L.moe->collect_weights(&moe_weights);
      continue;
    }
    const HostMatrix gu[] = {host_matrix(h.gate.w), host_matrix(h.up.w)};
    RILL_ASSIGN_OR_RETURN(L.w_gate_up, dev.place(gu, 2, p + "mlp.{gate,up}_proj"));
    const HostMatrix dm = host_matrix(h.down.w);
    RILL_ASSIGN_OR_RETURN(L.w_down, dev.place(&dm, 1, p + "mlp.down_proj"));
  }
  RILL_ASSIGN_OR_RETURN(const RopeTable rope, build_llama_rope(f, hd_));
  RILL_ASSIGN_OR_RETURN(rope_, dev.place_rope(rope));

  attn_scale_ = 1.0f / std::sqrt(static_cast<float>(hd_));
  window_ = static_cast<int32_t>(cfg_.sliding_window);
  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  const DType kv_dtype = all_f32 ? DType::kF32 : DType::kF16;

  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  RILL_TRY(create_kv(options, cfg_.n_layer, kv_width_, kv_dtype));

  size_activations(a_, max_tokens_);
  const StepLimits limits{max_tokens_, static_cast<int32_t>(cfg_.n_head), static_cast<int32_t>(hd_)};
  RILL_TRY(dev.reserve(limits));
  bool any_moe = false;
  for (const LlamaLayer& L : layers_) {
    if (!L.moe) continue;
    any_moe = true;
    a_.moe.reserve(L.moe->params(), max_tokens_);
    a_.moe_out.resize(static_cast<size_t>(max_tokens_ * E));
  }
  if (any_moe) backend_->reserve(moe_weights.data(), static_cast<int>(moe_weights.size()), max_tokens_);
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
      lane.backend = make_cpu_lane(dev, n_threads * (l + 1) / kLanes - lane.thread_share);
      RILL_TRY(lane.backend->reserve({lane_tokens, limits.n_head, limits.head_dim}));
      size_activations(lane.a, lane_tokens);
    }
  }
  return {};
}

void LlamaModel::size_activations(Activations& a, int64_t max_tokens) const {
  const auto T = static_cast<size_t>(max_tokens);
  const auto E = static_cast<size_t>(cfg_.n_embd), F = static_cast<size_t>(std::max<int64_t>(cfg_.n_ff, 0));
  a.x.resize(T * E);
  a.h.resize(T * E);
  a.qkv.resize(T * static_cast<size_t>(qkv_width_));
  a.attn.resize(T * static_cast<size_t>(q_width_));
  a.gu.resize(T * 2 * F);
  a.mlp.resize(T * F);
  a.final_rows.resize(T * E);
  // A batch has at most one sequence per token.
  for (std::vector<int32_t>* v : {&a.q_start, &a.q_len, &a.kv_len, &a.decode_from, &a.table_start, &a.slots}) {
    v->reserve(T);
  }
}

// The step's indices as the Backend reads them: the Batch's own arrays, the
// per-sequence ones gathered into a's (capacity reserved: no allocation).
StepMetadata LlamaModel::step_metadata(const Batch& batch, Activations& a) const {
  for (std::vector<int32_t>* v : {&a.q_start, &a.q_len, &a.kv_len, &a.decode_from, &a.table_start, &a.slots}) {
    v->clear();
  }
  const int32_t shift = kv_.layer_view(0).block_shift, mask = kv_.block_size() - 1;
  a.slots.resize(static_cast<size_t>(batch.n_tokens()));
  for (const BatchSeq& s : batch.seqs) {
    a.q_start.push_back(s.q_start);
    a.q_len.push_back(s.q_len);
    a.kv_len.push_back(s.kv_len);
    a.decode_from.push_back(s.decode_from);
    a.table_start.push_back(s.table_start);
    const int32_t* table = batch.block_table.data() + s.table_start;
    for (int32_t t = s.q_start; t < s.q_start + s.q_len; ++t) {
      const int32_t p = batch.positions[static_cast<size_t>(t)];
      a.slots[static_cast<size_t>(t)] = (table[p >> shift] << shift) + (p & mask);
    }
  }
  StepMetadata md;
  md.n_tokens = batch.n_tokens();
  md.n_seqs = static_cast<int32_t>(batch.seqs.size());
  md.n_sample = static_cast<int32_t>(batch.sample_rows.size());
  md.ids = batch.token_ids.data();
  md.pos = batch.positions.data();
  md.seq_of = batch.seq_index.data();
  md.sample_rows = batch.sample_rows.data();
  md.q_start = a.q_start.data();
  md.q_len = a.q_len.data();
  md.kv_len = a.kv_len.data();
  md.decode_from = a.decode_from.data();
  md.table_start = a.table_start.data();
  md.slots[0] = a.slots.data();
  md.block_tables[0] = batch.block_table.data();
  return md;
}

Status LlamaModel::attention_block(const Exec& e, const LlamaLayer& L, int64_t il, const StepMetadata& md) {
  const int64_t n = md.n_tokens;
  Activations& a = *e.a;
  Backend& b = *e.backend;
  const Tensor h = Tensor::dense(a.h.data(), DType::kF32, n, cfg_.n_embd);
  const Tensor qkv = Tensor::dense(a.qkv.data(), DType::kF32, n, qkv_width_);
  const Tensor attn = Tensor::dense(a.attn.data(), DType::kF32, n, q_width_);
  RILL_TRY(b.matmul(L.wqkv, h, qkv, false, L.bqkv));
  RopeKvOp rk;
  rk.qkv = qkv;
  rk.n_head = static_cast<int32_t>(cfg_.n_head);
  rk.n_head_kv = static_cast<int32_t>(cfg_.n_head_kv);
  rk.head_dim = static_cast<int32_t>(hd_);
  rk.q_norm = L.q_norm;
  rk.k_norm = L.k_norm;
  rk.norm_eps = cfg_.rms_norm_eps;
  rk.rope = rope_;
  rk.kv = kv_.layer_view(il);
  b.rope_store_kv(rk, md);
  AttentionOp at;
  at.q = qkv.cols_from(0, q_width_);
  at.out = attn;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = attn_scale_;
  at.window = window_;
  at.kv = rk.kv;
  b.attention(at, md);
  return b.matmul(L.wo, attn, Tensor::dense(a.x.data(), DType::kF32, n, cfg_.n_embd), true, L.bo);
}

Status LlamaModel::mlp_block(const Exec& e, const LlamaLayer& L, int64_t n) {
  Activations& a = *e.a;
  Backend& b = *e.backend;
  const Tensor x = Tensor::dense(a.x.data(), DType::kF32, n, cfg_.n_embd);
  if (L.moe) {  // on cpu::HostOps (host memory) until MoE is a Backend op
    L.moe->forward(a.h.data(), n, a.moe_out.data(), a.moe, *backend_);
    backend_->add_inplace(a.x.data(), a.moe_out.data(), n * cfg_.n_embd);
    return Status::Ok();
  }
  const Tensor gu = Tensor::dense(a.gu.data(), DType::kF32, n, 2 * cfg_.n_ff);
  const Tensor mlp = Tensor::dense(a.mlp.data(), DType::kF32, n, cfg_.n_ff);
  RILL_TRY(b.matmul(L.w_gate_up, Tensor::dense(a.h.data(), DType::kF32, n, cfg_.n_embd), gu, false));
  b.glu(Glu::kSilu, gu, mlp);
  return b.matmul(L.w_down, mlp, x, true);
}

Status LlamaModel::check_batch(const Batch& batch) const {
  return rill::check_batch(batch,
                           {max_tokens_, max_seqs_, n_ctx_, cfg_.n_vocab, kv_.block_size(), kv_.n_blocks(), window_});
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
  if (!split_into_lanes(batch)) return run(Exec{device_.get(), &a_}, batch, logits);

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
    lane.status =
        run(Exec{lane.backend.get(), &lane.a}, lane.sub, logits + static_cast<int64_t>(lane.first) * cfg_.n_vocab);
  });
  for (const DecodeLane& lane : lanes_) RILL_TRY(lane.status);
  return {};
}

Status LlamaModel::run(const Exec& e, const Batch& batch, float* logits) {
  const int64_t n = batch.n_tokens();
  const int64_t E = cfg_.n_embd;
  Activations& a = *e.a;
  Backend& b = *e.backend;
  const StepMetadata md = step_metadata(batch, a);
  const Tensor x = Tensor::dense(a.x.data(), DType::kF32, n, E);
  const Tensor h = Tensor::dense(a.h.data(), DType::kF32, n, E);
  b.embed(embed_, md.ids, n, x);
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const LlamaLayer& L = layers_[static_cast<size_t>(il)];
    b.rms_norm(x, nullptr, L.attn_norm, cfg_.rms_norm_eps, 0.0f, h);
    RILL_TRY(attention_block(e, L, il, md));
    b.rms_norm(x, nullptr, L.ffn_norm, cfg_.rms_norm_eps, 0.0f, h);
    RILL_TRY(mlp_block(e, L, n));
  }
  const int64_t n_sample = md.n_sample;
  const Tensor final_rows = Tensor::dense(a.final_rows.data(), DType::kF32, n_sample, E);
  b.rms_norm(x, md.sample_rows, final_norm_, cfg_.rms_norm_eps, 0.0f, final_rows);
  return b.matmul(lm_head_, final_rows, Tensor::dense(logits, DType::kF32, n_sample, cfg_.n_vocab), false);
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_tp_model(std::move(files), options);
  return init_model(std::make_unique<LlamaModel>(std::move(files), options), options);
}

}  // namespace rill
