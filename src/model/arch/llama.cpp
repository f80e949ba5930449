// The Llama family, one implementation for llama, mistral, qwen2, qwen3,
// smollm, MiniCPM 1/2/4 (minicpm) and the mixtures of experts (mixtral,
// qwen3_moe, glm4_moe). Differences are
// data, read from the config and the tensors present:
//   qkv bias (qwen2)            q_proj.bias present
//   q/k RMSNorm (qwen3)         self_attn.q_norm.weight present (over head_dim)
//   sliding window (mistral)    config.sliding_window > 0
//   tied embeddings             lm_head.weight absent
//   rope variants               config.rope_scaling (see backend/cpu/rope_table.h;
//                               minicpm's LongRoPE: build_llama_rope)
//   MoE FFN (mixtral, qwen3_moe) config.n_expert > 0, per layer is_moe_layer()
//                               (model/moe.h); Mixtral names it block_sparse_moe
//   muP scales (minicpm)        model_type minicpm: scale_emb, scale_depth,
//                               dim_model_base (model/mup_scales.h)
//
// The graph (model/arch/llama.h: LlamaGraph, place_llama, llama_forward) is
// written once over Backend ops and runs on every device; this file also
// holds the CPU runtime (`llama.cpu`: activations in host memory, decode
// lanes, and tensor parallelism over simulated ranks) and, under
// RILL_HAVE_CUDA, the CUDA runtime's glue (`llama.cuda`, at the end of the
// file).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <memory>
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
#include "model/arch/llama.h"
#include "model/arch/llama_weights.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"
#include "model/cuda_shard.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/mup_scales.h"
#include "model/placement.h"
#include "model/pooling.h"
#include "model/tensor_parallel.h"
#include "model/tensor_split.h"
#include "parallel/nccl_group.h"
#include "parallel/simulated_group.h"

#if RILL_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "model/cuda_model_base.h"
#endif

namespace rill {

// --- The graph, for every device ---------------------------------------------

bool LlamaGraph::has_dense_ffn() const {
  for (const LlamaLayer& L : layers) {
    if (!L.is_moe) return true;
  }
  return false;
}

StepLimits LlamaGraph::step_limits(int64_t max_tokens, int64_t max_sample) const {
  StepLimits l;
  l.max_tokens = max_tokens;
  l.n_head = n_head;
  l.head_dim = static_cast<int32_t>(hd);
  l.embedding = &embed;
  l.lm_head = head_rows > 0 ? &lm_head : nullptr;
  l.max_head_tokens = max_sample;
  return l;
}

namespace {

// One decoder layer, its tensors named "<p>...".
Status place_layer(Backend& b, const LlamaLayerWeights& h, const std::string& p, LlamaLayer& L) {
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
  if (!h.q_norm.empty()) {
    RILL_ASSIGN_OR_RETURN(L.q_norm, vec(h.q_norm, "self_attn.q_norm.weight"));
    RILL_ASSIGN_OR_RETURN(L.k_norm, vec(h.k_norm, "self_attn.k_norm.weight"));
  }
  RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(h.ffn_norm, "post_attention_layernorm.weight"));
  if (h.moe) {
    L.is_moe = true;
    RILL_ASSIGN_OR_RETURN(L.moe, b.place_moe(h.moe->host(), p + "mlp (experts)"));
    return Status::Ok();
  }
  const HostMatrix gu[] = {host_matrix(h.gate.w), host_matrix(h.up.w)};
  RILL_ASSIGN_OR_RETURN(L.w_gate_up, b.place(gu, 2, p + "mlp.{gate,up}_proj"));
  const HostMatrix dm = host_matrix(h.down.w);
  RILL_ASSIGN_OR_RETURN(L.w_down, b.place(&dm, 1, p + "mlp.down_proj"));
  return Status::Ok();
}

// One pass of place_llama's placement (Backend::place_model may run it twice).
Status place_pass(Backend& b, const LlamaWeights& w, const RopeTable& rope, LlamaGraph& g) {
  HostMatrix embed_m = host_matrix(w.embed);
  embed_m.gathered = true;
  RILL_ASSIGN_OR_RETURN(g.embed, b.place(&embed_m, 1, "model.embed_tokens.weight"));
  const bool head_is_embed = w.tied && w.lm_head.data == w.embed.data && w.lm_head.n_rows == w.embed.n_rows;
  g.lm_head = g.embed;
  if (!head_is_embed && g.head_rows > 0) {
    const HostMatrix m = host_matrix(w.lm_head);
    RILL_ASSIGN_OR_RETURN(g.lm_head, b.place(&m, 1, "lm_head.weight"));
  }
  RILL_ASSIGN_OR_RETURN(g.final_norm, b.place_vector(w.final_norm.data(), g.E, "model.norm.weight"));
  g.layers.assign(w.layers.size(), LlamaLayer{});
  for (size_t il = 0; il < w.layers.size(); ++il) {
    RILL_TRY(place_layer(b, w.layers[il], "model.layers." + std::to_string(il) + ".", g.layers[il]));
  }
  g.has_mtp = w.mtp_layer.has_value();
  if (g.has_mtp) {
    RILL_TRY(place_layer(b, *w.mtp_layer, "model.layers." + std::to_string(w.layers.size()) + ".", g.mtp_layer));
    RILL_TRY(place_mtp_head(b, *w.mtp_head, w.embed, g.embed, w.lm_head, g.lm_head, g.mtp));
    g.mtp.eps = g.eps;
  }
  RILL_ASSIGN_OR_RETURN(g.rope, b.place_rope(rope));
  return Status::Ok();
}

Status attention_block(Backend& b, const LlamaGraph& g, const LlamaLayer& L, int64_t il, const StepMetadata& md,
                       const LlamaActivations& a, LlamaHooks& hooks) {
  const int64_t n = md.n_tokens;
  const Tensor qkv = a.qkv.rows_from(0, n);
  const Tensor attn = a.attn.rows_from(0, n);
  const Tensor x = a.x.rows_from(0, n);
  RILL_TRY(b.norm_matmul(x, L.attn_norm, g.eps, 0.0f, a.h.rows_from(0, n), L.wqkv, qkv, false, L.bqkv));
  RopeKvOp rk;
  rk.qkv = qkv;
  rk.n_head = g.n_head;
  rk.n_head_kv = g.n_head_kv;
  rk.head_dim = static_cast<int32_t>(g.hd);
  rk.q_norm = L.q_norm;
  rk.k_norm = L.k_norm;
  rk.norm_eps = g.eps;
  rk.rope = g.rope;
  rk.kv = hooks.kv_cache(il);
  b.rope_store_kv(rk, md);
  // minicpm: attn times the residual scale before o (o is linear), through
  // F32 when the act dtype is not (LlamaActivations::attn32).
  const bool scaled = g.mup.residual != 1.0f;
  const Tensor attn_out = scaled && a.attn32.cols > 0 ? a.attn32.rows_from(0, n) : attn;
  AttentionOp at;
  at.q = qkv.cols_from(0, g.Q);
  at.out = attn_out;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = g.attn_scale;
  at.window = g.window;
  at.kv = rk.kv;
  b.attention(at, md);
  if (scaled) scale_into(b, attn_out, g.mup.residual, attn);
  if (!hooks.sharded()) return b.matmul(L.wo, attn, x, true, L.bo);
  // Row-parallel: the partial products summed over the ranks, o's bias once after.
  RILL_TRY(b.matmul(L.wo, attn, x, hooks.owns_residual()));
  RILL_TRY(hooks.reduce_residual(x));
  if (L.bo) b.add_bias(x, L.bo);
  return Status::Ok();
}

Status mlp_block(Backend& b, const LlamaGraph& g, const LlamaLayer& L, const StepMetadata& md,
                 const LlamaActivations& a, LlamaHooks& hooks) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n);
  const float residual_scale = g.mup.residual;
  if (L.is_moe) {  // a shard adds (owns_residual) or writes its partial sum, its slice of every expert
    b.rms_norm(x, nullptr, L.ffn_norm, g.eps, 0.0f, h);
    RILL_TRY(b.moe_ffn(L.moe, h, h, x, hooks.owns_residual(), md));
    return hooks.reduce_residual(x);
  }
  const Tensor gu = a.gu.rows_from(0, n);
  const Tensor mlp = a.mlp.rows_from(0, n);
  // minicpm: the GLU's output times the residual scale before down (linear).
  const bool scaled = residual_scale != 1.0f;
  const Tensor glu_out = scaled && a.mlp32.cols > 0 ? a.mlp32.rows_from(0, n) : mlp;
  RILL_TRY(b.norm_matmul_glu(x, L.ffn_norm, g.eps, 0.0f, h, L.w_gate_up, Glu::kSilu, gu, glu_out));
  if (scaled) scale_into(b, glu_out, residual_scale, mlp);
  RILL_TRY(b.matmul(L.w_down, mlp, x, hooks.owns_residual()));
  return hooks.reduce_residual(x);
}

}  // namespace

Result<LlamaGraph> place_llama(Backend& b, const ModelConfig& cfg, const LlamaWeights& w, const LlamaDims& dims,
                               const RopeTable& rope) {
  LlamaGraph g;
  g.E = dims.E;
  g.F = dims.F;
  g.hd = dims.hd;
  g.Q = dims.Q;
  g.KV = dims.KV;
  g.head_rows = w.lm_head.n_rows;
  g.n_head = static_cast<int32_t>(dims.Q / dims.hd);
  g.n_head_kv = static_cast<int32_t>(dims.KV / dims.hd);
  g.n_layer = static_cast<int64_t>(w.layers.size());
  g.eps = cfg.rms_norm_eps;
  g.attn_scale = 1.0f / std::sqrt(static_cast<float>(dims.hd));
  g.window = static_cast<int32_t>(cfg.sliding_window);
  g.mup = w.mup;
  RILL_TRY(b.place_model([&] { return place_pass(b, w, rope, g); }));
  return g;
}

Status llama_forward(Backend& b, const LlamaGraph& g, const StepMetadata& md, const LlamaActivations& a, Tensor logits,
                     LlamaHooks& hooks, const Tensor* hidden) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n);
  b.embed(g.embed, md.ids, n, x);
  if (g.mup.embed != 1.0f) b.scale(x, g.mup.embed);
  for (size_t il = 0; il < g.layers.size(); ++il) {
    const LlamaLayer& L = g.layers[il];
    RILL_TRY(attention_block(b, g, L, static_cast<int64_t>(il), md, a, hooks));
    RILL_TRY(mlp_block(b, g, L, md, a, hooks));
  }
  if (hidden) b.rms_norm(x, nullptr, g.final_norm, g.eps, 0.0f, *hidden);
  if (md.n_sample <= 0) return Status::Ok();
  const Tensor final_rows = a.final_rows.rows_from(0, md.n_sample);
  // minicpm: the normed rows times dim_model_base / hidden_size before the
  // head (linear), through F32 when the act dtype is not.
  const bool scaled = g.mup.logit != 1.0f;
  const Tensor normed = scaled && a.final32.cols > 0 ? a.final32.rows_from(0, md.n_sample) : final_rows;
  b.rms_norm(x, md.sample_rows, g.final_norm, g.eps, 0.0f, normed);
  if (scaled) scale_into(b, normed, g.mup.logit, final_rows);
  if (g.head_rows <= 0) return Status::Ok();
  return b.matmul(g.lm_head, final_rows, logits, false);
}

Status llama_mtp_forward(Backend& b, const LlamaGraph& g, const StepMetadata& md, const LlamaActivations& a,
                         Tensor hidden, Tensor logits, LlamaHooks& hooks, const Tensor* out) {
  assert(g.has_mtp && !hooks.sharded());
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), h = a.h.rows_from(0, n);
  RILL_TRY(mtp_head_input(b, g.mtp, md.ids, n, hidden, x, h, a.mtp_h.rows_from(0, n)));
  const LlamaLayer& L = g.mtp_layer;
  RILL_TRY(attention_block(b, g, L, static_cast<int64_t>(g.layers.size()), md, a, hooks));
  RILL_TRY(mlp_block(b, g, L, md, a, hooks));
  return mtp_head_logits(b, g.mtp, x, md.sample_rows, a.final_rows.rows_from(0, md.n_sample), logits, out);
}

// --- The CPU runtime ------------------------------------------------------------

namespace {

// Activations for up to max_tokens tokens, allocated once. CPU activations
// are f32 (the Backend's act dtype), so h feeds every matmul.
struct Activations {
  std::vector<float> x, h, qkv, attn, gu, mlp, final_rows, mtp_h;
  CpuStepArrays step;      // the step's metadata (CpuPagedModel::step_metadata)
  LlamaActivations views;  // over the vectors above
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

// The CPU runtime. As a tensor-parallel rank (comm set; create_llama_cpu_model
// builds one per rank of a SimulatedGroup) it holds model/tensor_split.h's
// share: its heads' q/k/v rows and o columns, its KV heads, its slice of
// gate/up rows and down columns (of every expert in MoE layers) and its LM
// head rows. The hooks make o, down and the MoE FFN accumulate into the
// residual on rank 0 only and all-reduce it after each (rank order, so x is
// the same bits on every rank); the head's slices are all-gathered into
// full logit rows. The embedding stays whole on every rank, as on CUDA: the
// ranks' weights are views of one mapping, so a whole table costs no
// memory, and a vocabulary-parallel one would cost an all-reduce of [n, E]
// per step. A rank runs no decode lanes (the lanes would each need the
// step's collectives).
//
// A rank validates the batch before its first collective with rules that do
// not depend on the rank (its limits and block count are every rank's), so
// either all ranks run the step or all return the same error: a rank
// leaving alone would stall the others.
class LlamaModel final : public CpuPagedModel, private LlamaHooks {
 public:
  LlamaModel(std::shared_ptr<const ModelFiles> files, const ModelOptions& options, Communicator* comm = nullptr)
      : CpuPagedModel(std::move(files), options.n_threads), comm_(comm) {}

  Status init(const ModelOptions& options);

  Status forward(const Batch& batch, float* logits) override;
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }
  Status forward_hidden(const Batch& batch, float* logits, float* hidden) override;
  Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) override;
  EmbeddingSpec embedding() const override { return embedding_; }
  Status forward_pooled(const Batch& batch, float* logits, float* pooled) override;
  std::vector<KvLayer> kv_layers() const override {
    return cache_kv_layers([](int64_t) { return 0; });
  }

 private:
  // LlamaHooks: the paged pool's layer views; a rank's residual ownership
  // and all-reduce (see above).
  KvCacheView kv_cache(int64_t il) const override { return kv_.layer_view(il); }
  bool sharded() const override { return comm_ != nullptr; }
  bool owns_residual() const override { return comm_ == nullptr || comm_->rank() == 0; }
  Status reduce_residual(Tensor x) override;

  // A rank's share of w (views of the mapped tensors) and d narrowed to its widths.
  Status shard(LlamaWeights& w, LlamaDims& d);
  Status run(const Exec& e, const Batch& batch, float* logits);
  // A rank's logits [n_sample, V] (when logits is not null) from every
  // rank's head rows in vocab_local_.
  Status gather_logits(int64_t n_sample, float* logits);
  void size_activations(Activations& a, int64_t max_tokens) const;
  // Whether forward() runs `batch` as one sub-batch per lane.
  bool split_into_lanes(const Batch& batch) const;
  // Lane l's sequences [first, last) of a split step of n: in proportion to its threads.
  std::pair<int32_t, int32_t> lane_range(int32_t l, int32_t n) const;
  // The batch against the model's limits; check_batch adds its KV tails
  // (forward_mtp's steps read none: the MTP plane keeps no tail).
  Status check_batch_shape(const Batch& batch) const;
  Status check_batch(const Batch& batch) const;

  std::unique_ptr<Backend> device_;  // on backend_'s threads
  LlamaGraph graph_;
  Activations a_;
  int n_threads_ = 1;                      // the backend's threads, shared out among the lanes
  int64_t lane_tokens_ = 0;                // the most sequences a lane takes
  std::unique_ptr<ThreadPool> lane_pool_;  // one thread per lane; null without lanes
  std::vector<DecodeLane> lanes_;          // empty: no lanes (one thread, MoE, or a rank)

  // Tensor parallelism (null comm_: the whole model).
  Communicator* comm_ = nullptr;    // this rank's collectives; the group outlives the model
  TensorSplit split_;               // its heads, KV heads and vocabulary rows
  std::vector<float> vocab_local_;  // [S, Vp]: its logits [S, split_.vocab.n] dense at the front
  std::vector<float> vocab_all_;    // [N, S, Vp]: every rank's, gathered
  EmbeddingSpec embedding_;         // as the files declare (model/pooling.h); kNone: no embeddings
  std::vector<float> pool_rows_;    // [max_tokens, E] final-normed rows of a pooled sequence
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
  RILL_ASSIGN_OR_RETURN(LlamaDims d, llama_dims(f, kMaxHeadDim));
  device_ = make_cpu_backend_on(*backend_->pool());
  Backend& dev = *device_;

  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, d));
  if (options.mtp) {
    if (comm_) return Error{f.path + ": --spec mtp is not run with --tensor-parallel yet"};
    RILL_TRY(bind_llama_mtp(f, d, w));
  }
  if (comm_) RILL_TRY(shard(w, d));
  RILL_ASSIGN_OR_RETURN(const RopeTable rope, build_llama_rope(f, d.hd, options.n_ctx));
  RILL_ASSIGN_OR_RETURN(graph_, place_llama(dev, cfg_, w, d, rope));
  set_limits(options);
  RILL_ASSIGN_OR_RETURN(embedding_, declared_pooling(f));
  if (embedding_.pooling != EmbeddingSpec::Pooling::kNone) pool_rows_.resize(static_cast<size_t>(max_tokens_ * d.E));

  // f32 checkpoints keep f32 KV so logits match the f32 reference; otherwise
  // f16 KV, as llama.cpp stores it.
  const DType kv_dtype = w.all_f32() ? DType::kF32 : DType::kF16;
  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  // The MTP layer's K and V are one more layer of the pool (in the
  // model's own KV type beside q4c / q4a: kv_draft_planes_). Every layer
  // reads its own KV, and forward() checks the batch's KV tails.
  kv_tails_supported_ = true;
  kv_draft_planes_ = graph_.has_mtp ? 1 : 0;
  RILL_TRY(create_kv(options, cfg_.n_layer + (graph_.has_mtp ? 1 : 0), d.KV, d.hd, kv_dtype));

  size_activations(a_, max_tokens_);
  const StepLimits limits = graph_.step_limits(max_tokens_, max_tokens_);
  RILL_TRY(dev.reserve(limits));
  const bool any_moe =
      std::any_of(graph_.layers.begin(), graph_.layers.end(), [](const LlamaLayer& L) { return L.is_moe; });
  n_threads_ =
      options.n_threads > 0 ? options.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = n_threads_;
  if (comm_) {
    const auto S = static_cast<size_t>(max_seqs_), Vp = static_cast<size_t>(split_.vocab_stride);
    vocab_local_.resize(S * Vp);
    vocab_all_.resize(static_cast<size_t>(split_.size) * S * Vp);
  }
  if (n_threads >= kLanes && !any_moe && !comm_) {
    const int64_t lane_tokens = lane_tokens_ = std::min<int64_t>(max_tokens_, kLaneMaxSeqs);
    lane_pool_ = std::make_unique<ThreadPool>(kLanes);
    lanes_.resize(kLanes);
    for (int l = 0; l < kLanes; ++l) {
      DecodeLane& lane = lanes_[static_cast<size_t>(l)];
      lane.thread_share = n_threads * l / kLanes;
      lane.backend = make_cpu_lane(dev, n_threads * (l + 1) / kLanes - lane.thread_share);
      RILL_TRY(lane.backend->reserve(graph_.step_limits(lane_tokens, lane_tokens)));
      size_activations(lane.a, lane_tokens);
    }
  }
  return calibrate_kv(options.kv_types.calibration_tokens, rope.interleaved, rope.rot_dim);
}

Status LlamaModel::shard(LlamaWeights& w, LlamaDims& d) {
  const std::string& path = files_->path;
  RILL_ASSIGN_OR_RETURN(split_, plan_tensor_split(cfg_, comm_->rank(), comm_->size(), path));
  SplitRange ff;  // dense layers' intermediate rows (none when every layer is MoE)
  bool any_dense = false;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) any_dense = any_dense || !is_moe_layer(cfg_, il);
  if (any_dense) {
    RILL_ASSIGN_OR_RETURN(ff, split_evenly(cfg_.n_ff, split_.rank, split_.size, "intermediate_size", path));
  }
  RILL_TRY(shard_llama_layers(w, split_, ff, d.hd, path));
  w.lm_head = slice_rows(w.lm_head, split_.vocab);
  d.Q = split_.heads.n * d.hd;
  d.KV = split_.kv_heads.n * d.hd;
  d.F = ff.n;
  return Status::Ok();
}

void LlamaModel::size_activations(Activations& a, int64_t max_tokens) const {
  const auto T = static_cast<size_t>(max_tokens);
  const auto E = static_cast<size_t>(graph_.E), F = static_cast<size_t>(std::max<int64_t>(graph_.F, 0));
  a.x.resize(T * E);
  a.h.resize(T * E);
  a.qkv.resize(T * static_cast<size_t>(graph_.qkv_width()));
  a.attn.resize(T * static_cast<size_t>(graph_.Q));
  a.gu.resize(T * 2 * F);
  a.mlp.resize(T * F);
  a.final_rows.resize(T * E);
  a.mtp_h.resize(graph_.has_mtp ? T * E : 0);
  const int64_t n = max_tokens;
  auto view = [n](std::vector<float>& v, int64_t cols) { return Tensor::dense(v.data(), DType::kF32, n, cols); };
  a.views = {view(a.x, graph_.E),
             view(a.h, graph_.E),
             view(a.qkv, graph_.qkv_width()),
             view(a.attn, graph_.Q),
             view(a.gu, 2 * graph_.F),
             view(a.mlp, graph_.F),
             view(a.final_rows, graph_.E),
             view(a.mtp_h, graph_.has_mtp ? graph_.E : 0),
             {},  // attn32, mlp32, final32: CPU activations are F32 already (scale_into scales in place)
             {},
             {}};
  a.step.reserve(max_tokens);
}

Status LlamaModel::reduce_residual(Tensor x) {
  assert(x.is_dense());
  return comm_ ? comm_->all_reduce_sum(x.f32(), x.rows * x.cols) : Status::Ok();
}

Status LlamaModel::check_batch_shape(const Batch& batch) const {
  return rill::check_batch(
      batch, {max_tokens_, max_seqs_, n_ctx_, cfg_.n_vocab, kv_.block_size(), kv_.n_blocks(), graph_.window});
}

Status LlamaModel::check_batch(const Batch& batch) const {
  RILL_TRY(check_batch_shape(batch));
  return check_kv_tails(batch);
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
      lane.sub.seqs.back().kv_tail = s.kv_tail;
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

// The step on the whole-batch activations (never lanes), then each pooled
// sequence's rows of the last residual stream through the final RMSNorm
// (the hidden states transformers returns) and pooled on the host: the CPU
// activations are host memory.
Status LlamaModel::forward_pooled(const Batch& batch, float* logits, float* pooled) {
  if (embedding_.pooling == EmbeddingSpec::Pooling::kNone) return Model::forward_pooled(batch, logits, pooled);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check_batch(batch));
  RILL_TRY(run(Exec{device_.get(), &a_}, batch, logits));
  const int64_t E = graph_.E;
  for (size_t i = 0; i < batch.pool_seqs.size(); ++i) {
    const BatchSeq& s = batch.seqs[static_cast<size_t>(batch.pool_seqs[i])];
    if (s.q_len != s.kv_len) return Error{"a pooled sequence must be computed whole in one step"};
    cpu::rms_norm(a_.x.data() + static_cast<size_t>(s.q_start) * E, graph_.final_norm.data, s.q_len, E, graph_.eps,
                  pool_rows_.data(), 0.0f);
    pool_rows(embedding_, pool_rows_.data(), s.q_len, E, pooled + i * static_cast<size_t>(E));
  }
  return {};
}

// The whole batch on the whole-batch activations (never lanes).
Status LlamaModel::forward_hidden(const Batch& batch, float* logits, float* hidden) {
  if (!graph_.has_mtp) return Model::forward_hidden(batch, logits, hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check_batch(batch));
  const StepMetadata md = step_metadata(batch, a_.step);
  const Tensor rows = Tensor::dense(hidden, DType::kF32, md.n_tokens, graph_.E);
  return llama_forward(*device_, graph_, md, a_.views, Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab),
                       *this, &rows);
}

Status LlamaModel::forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
  if (!graph_.has_mtp) return Model::forward_mtp(batch, hidden, logits, mtp_hidden);
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(check_batch_shape(batch));
  const StepMetadata md = step_metadata(batch, a_.step);
  // The hidden rows are only read (rms_norm's input).
  const Tensor rows = Tensor::dense(const_cast<float*>(hidden), DType::kF32, md.n_tokens, graph_.E);
  const Tensor out = Tensor::dense(mtp_hidden, DType::kF32, md.n_tokens, graph_.E);
  return llama_mtp_forward(*device_, graph_, md, a_.views, rows,
                           Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), *this,
                           mtp_hidden ? &out : nullptr);
}

Status LlamaModel::run(const Exec& e, const Batch& batch, float* logits) {
  const StepMetadata md = step_metadata(batch, e.a->step);
  if (!comm_) {
    return llama_forward(*e.backend, graph_, md, e.a->views,
                         Tensor::dense(logits, DType::kF32, md.n_sample, cfg_.n_vocab), *this);
  }
  RILL_TRY(llama_forward(*e.backend, graph_, md, e.a->views,
                         Tensor::dense(vocab_local_.data(), DType::kF32, md.n_sample, graph_.head_rows), *this));
  return gather_logits(md.n_sample, logits);
}

// Rank r's rows are [r Vp, r Vp + n_r) (the last ranks' may be short or
// empty); its [n_sample, n_r] logits go out in an [n_sample, Vp] send, and
// the gather lays the sends out as [N, n_sample, Vp]. n_sample is every
// rank's (the same batch), so all ranks gather or none does.
Status LlamaModel::gather_logits(int64_t n_sample, float* logits) {
  if (n_sample <= 0) return Status::Ok();
  const int64_t V = cfg_.n_vocab, Vp = split_.vocab_stride;
  RILL_TRY(comm_->all_gather(vocab_local_.data(), n_sample * Vp, vocab_all_.data()));
  if (logits == nullptr) return Status::Ok();  // not this rank's to return (TensorParallelModel reads rank 0's)
  for (int r = 0; r < split_.size; ++r) {
    const int64_t v0 = std::min(V, r * Vp), n_r = std::min(V, v0 + Vp) - v0;
    const float* src = vocab_all_.data() + r * n_sample * Vp;
    for (int64_t i = 0; i < n_sample; ++i) std::copy_n(src + i * n_r, n_r, logits + i * V + v0);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  if (options.tensor_parallel == 1) return init_model(std::make_unique<LlamaModel>(std::move(files), options), options);
  // Simulated ranks in this process, one thread each (TensorParallelModel's),
  // sharing the cores.
  const int n_ranks = options.tensor_parallel;
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<SimulatedGroup> group, SimulatedGroup::create(n_ranks));
  const int n_cores =
      options.n_threads > 0 ? options.n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ModelOptions o = options;
  o.n_threads = std::max(1, n_cores / n_ranks);
  SimulatedGroup& g = *group;
  const std::string path = files->path;
  return create_tensor_parallel_model(std::move(group), o, path, [&](int rank, const ModelOptions& rank_options) {
    return init_model(std::make_unique<LlamaModel>(files, rank_options, &g.rank(rank)), rank_options);
  });
}

// --- The CUDA runtime (`llama.cuda`) -------------------------------------------
//
// The graph itself (placement, forward) is model/arch/llama.h's, shared with the CPU;
// this file has model/cuda_model_base.h build a CUDA Backend over its
// context, stream and GEMM, places the weights through it (one device buffer:
// fused q/k/v and gate/up, GGUF blocks kept quantized, bf16 activations
// for quantized models), carves the activations and the Backend's scratch
// from the base's arena, and runs llama_forward() in run_layers() over the
// uploaded step metadata (captured in decode graphs by the base).
//
// Runtime hooks (LlamaHooks): the KV planes; as a tensor-parallel rank (a
// CudaShard, model/cuda_shard.h) the model holds its heads' q/k/v rows and
// o columns, its slice of gate/up rows and down columns and its LM head
// rows (tensor_split.h), and the hooks add the all-reduce after o and down;
// the logits gather follows the graph (cuda_model_base.h). The embedding
// stays whole on every rank: a step reads only its n rows, so a
// vocabulary-parallel gather would save memory (1 GB for the 8B) at the cost
// of one more all-reduce of [n, E] per step. mixtral / qwen3_moe layers run
// the CUDA Backend's moe_ffn (experts placed in the model's buffer), which
// adds into the residual stream like down_proj (unsharded only: tensor
// parallelism on CUDA refuses MoE models).
//
// Tensor parallelism (options.tensor_parallel > 1): one rank per GPU of
// this host over an NcclGroup, built by model/tensor_parallel.h's factory
// (shared with the CPU's simulated ranks). Each rank is driven by its own
// host thread (TensorParallelModel's workers) rather than one thread
// issuing every rank's work inside ncclGroupStart/End: each rank then runs
// the single-GPU step unchanged (same kernels, same decode-graph capture and
// replay; CUDA stream capture is per thread), with its all-reduces enqueued
// on its own stream; NCCL requires group calls only when one thread drives
// several ranks. A decode step is one graph launch per rank, so the
// per-step host cost is one wake-up per worker.
#if RILL_HAVE_CUDA
namespace {

class LlamaCudaModel final : public CudaModelBase {
 public:
  explicit LlamaCudaModel(std::shared_ptr<const ModelFiles> files, CudaShard shard = {})
      : CudaModelBase(std::move(files), shard), hooks_(*this) {}
  Status init(const ModelOptions& options);
  int32_t n_mtp_layers() const override { return graph_.has_mtp ? 1 : 0; }

 private:
  // The graph's runtime hooks: the KV planes, the shard's all-reduce.
  class Hooks final : public LlamaHooks {
   public:
    explicit Hooks(LlamaCudaModel& m) : m_(m) {}
    KvCacheView kv_cache(int64_t il) const override { return m_.kv_view(static_cast<size_t>(il)); }
    bool sharded() const override { return m_.sharded(); }
    bool owns_residual() const override { return m_.owns_residual(); }
    Status reduce_residual(Tensor x) override { return m_.reduce_residual(x.f32(), x.rows); }

   private:
    LlamaCudaModel& m_;
  };

  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;

  LlamaGraph graph_;
  Hooks hooks_;
  LlamaActivations act_views_;  // over the arena
};

Status LlamaCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(read_dims());
  RILL_TRY(create_context());
  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, LlamaDims{E_, V_, F_, hd_, Q_, KV_}));
  if (options.mtp) {
    if (sharded()) return Error{f.path + ": --spec mtp is not run with --tensor-parallel yet"};
    RILL_TRY(bind_llama_mtp(f, LlamaDims{E_, V_, F_, hd_, Q_, KV_}, w));
    mtp_rows_ = true;
    n_kv_layers_ = cfg_.n_layer + 1;  // the MTP layer's K and V: one more layer of the pool
  }
  if (sharded()) {  // this rank's slices (views of the mapped tensors); o's bias is added after the all-reduce
    RILL_TRY(shard_llama_layers(w, split_, ff_split_, hd_, f.path));
    w.lm_head = slice_rows(w.lm_head, split_.vocab);
    narrow_dims();
  }
  std::vector<const WeightView*> mats;
  for (const LlamaLayerWeights& h : w.layers) {
    for (const Linear* l : {&h.q, &h.k, &h.v, &h.o}) mats.push_back(&l->w);
    if (h.moe) {
      h.moe->collect_weights(&mats);
    } else {
      for (const Linear* l : {&h.gate, &h.up, &h.down}) mats.push_back(&l->w);
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, mats, w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Llama: f32 checkpoints keep f32 KV

  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(const RopeTable rope, build_llama_rope(f, hd_, options.n_ctx));
  RILL_ASSIGN_OR_RETURN(graph_, place_llama(*backend_, cfg_, w, LlamaDims{E_, V_, F_, hd_, Q_, KV_}, rope));
  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  // Every layer reads its own KV and forward() is the base's, which checks
  // the batch's KV tails: k4c and k4a may run here (CudaModelBase::choose_kv_type).
  kv_tails_supported_ = !sharded();
  RILL_TRY(init_runtime(options));
  return calibrate_kv(options.kv_types.calibration_tokens, rope.interleaved, rope.rot_dim);
}

void LlamaCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs();
  const int64_t F = graph_.has_dense_ffn() ? graph_.F : 0;
  act_views_.x = carve_tensor(a, DType::kF32, T, E_);
  act_views_.h = carve_tensor(a, act_, T, E_);
  act_views_.qkv = carve_tensor(a, DType::kF32, T, graph_.qkv_width());
  act_views_.attn = carve_tensor(a, act_, T, graph_.Q);
  act_views_.gu = carve_tensor(a, DType::kF32, T, 2 * F);
  act_views_.mlp = carve_tensor(a, act_, T, F);
  act_views_.final_rows = carve_tensor(a, act_, S, E_);
  if (graph_.has_mtp) act_views_.mtp_h = carve_tensor(a, act_, T, E_);
  // minicpm's scaled tensors pass through F32 when act_ is not (scale_into).
  const bool f32 = act_ == DType::kF32;
  act_views_.attn32 = carve_tensor(a, DType::kF32, T, f32 || graph_.mup.residual == 1.0f ? 0 : graph_.Q);
  act_views_.mlp32 = carve_tensor(a, DType::kF32, T, f32 || graph_.mup.residual == 1.0f ? 0 : F);
  act_views_.final32 = carve_tensor(a, DType::kF32, S, f32 || graph_.mup.logit == 1.0f ? 0 : E_);
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S), chan_limits());
}

// The shared graph over the uploaded step metadata, then (shards) the
// logits gather. The MTP kinds (step_kind()) run unsharded only.
Status LlamaCudaModel::run_layers(const Step& s) {
  const StepMetadata md = step_metadata(s);
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.head_rows);
  const Tensor rows = Tensor::dense(rows_out(), DType::kF32, s.n, E_);
  switch (step_kind()) {
    case StepKind::kHidden:
      return llama_forward(*backend_, graph_, md, act_views_, logits, hooks_, &rows);
    case StepKind::kMtp:
      return llama_mtp_forward(*backend_, graph_, md, act_views_, Tensor::dense(rows_in(), DType::kF32, s.n, E_),
                               logits, hooks_, &rows);
    case StepKind::kForward:
      break;
  }
  RILL_TRY(llama_forward(*backend_, graph_, md, act_views_, logits, hooks_));
  return s.n_sample > 0 ? gather_logits(s.n_sample) : Status::Ok();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

namespace {

// One rank per GPU (devices 0..N-1). The refusals that hold whatever the
// host has come first: MoE, then the split's (heads, KV heads, intermediate
// size), then the GPU count.
Result<std::unique_ptr<Model>> create_llama_cuda_tp_model(std::shared_ptr<const ModelFiles> files,
                                                          const ModelOptions& options) {
  const int n_ranks = options.tensor_parallel;
  const ModelConfig& cfg = files->config;
  const std::string path = files->path;
  if (n_ranks < 1) return Error{"--tensor-parallel " + std::to_string(n_ranks) + ": expected 1 or more GPUs"};
  if (cfg.n_expert > 0) {
    return Error{path + ": " + cfg.architecture +
                 " is a mixture of experts; tensor parallelism on CUDA is built for "
                 "the dense Llama family only (run it with --tensor-parallel 1, or split on the CPU)"};
  }
  RILL_TRY(plan_tensor_split(cfg, 0, n_ranks, path));
  RILL_TRY(split_evenly(cfg.n_ff, 0, n_ranks, "intermediate_size", path));
#if RILL_HAVE_CUDA
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
    cudaGetLastError();
    n_devices = 0;
  }
  if (n_ranks > n_devices) {
    return Error{"--tensor-parallel " + std::to_string(n_ranks) + " needs " + std::to_string(n_ranks) +
                 " GPUs; this host has " + std::to_string(n_devices) + " visible (see CUDA_VISIBLE_DEVICES)"};
  }
  std::vector<int> devices(static_cast<size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) devices[static_cast<size_t>(r)] = r;
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> group, NcclGroup::create(devices));
  NcclGroup* g = group.get();
  return create_tensor_parallel_model(
      std::move(group), options, path,
      [&](int rank, const ModelOptions& rank_options) -> Result<std::unique_ptr<Model>> {
        auto m = init_model(std::make_unique<LlamaCudaModel>(files, CudaShard{g, rank}), rank_options);
        if (!m.ok()) return Error{"GPU " + std::to_string(rank) + ": " + m.error().message};
        return m;
      });
#else
  return Error{"tensor parallelism on GPUs needs a build with CUDA and NCCL (RILL_CUDA=ON where nvcc is installed)"};
#endif
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_cuda_tp_model(std::move(files), options);
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<LlamaCudaModel>(std::move(files)), options);
#else
  return cuda_not_built();
#endif
}

}  // namespace rill
