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

#include "backend/cpu/host_ops.h"
#include "backend/cpu/rope_table.h"
#include "core/thread_pool.h"
#include "model/arch/families.h"
#include "model/cpu_paged_model.h"
#include "model/layers.h"
#include "model/moe.h"

namespace rill {
namespace {

struct LlamaLayer {
  std::vector<float> attn_norm;       // [n_embd]
  Linear q, k, v, o;                  // q: [n_head*hd, n_embd], k/v: [n_head_kv*hd, n_embd], o: [n_embd, n_head*hd]
  std::vector<float> q_norm, k_norm;  // [head_dim], qwen3 only
  std::vector<float> ffn_norm;        // [n_embd]
  Linear gate, up, down;              // gate/up: [n_ff, n_embd], down: [n_embd, n_ff]; dense layers
  std::optional<MoeFfn> moe;          // MoE layers, instead of gate/up/down
};

// Activations for up to max_tokens tokens, allocated once.
struct Activations {
  std::vector<float> x, h, q, k, v, attn, gate, up, final_rows;
  std::vector<float> moe_out;  // [max_tokens, n_embd] when some layer is MoE
  MoeScratch moe;
};

// What one forward pass runs on: a backend and its activations. The model
// has one for whole batches and, on several threads, one per decode lane.
struct Exec {
  cpu::HostOps* backend;
  Activations* a;
  std::vector<cpu::AttentionSeq>* attn_seqs;
};

// A decode lane: a backend on its share of the threads, with its own
// activations, that runs a share of a decode step's sequences (see
// forward()).
struct DecodeLane {
  std::unique_ptr<cpu::HostOps> backend;
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
  Status bind_moe(LlamaLayer& L, const std::string& p);
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
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab, F = cfg_.n_ff;
  if (E <= 0 || V <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 ||
      (F <= 0 && cfg_.n_expert == 0) || cfg_.n_head % cfg_.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E / cfg_.n_head;
  // The CPU kernels keep one head (and its RoPE angles) on the stack.
  constexpr int64_t kMaxHeadDim = 512;
  if (hd_ <= 0 || hd_ > kMaxHeadDim || hd_ % 2 != 0) {
    return Error{f.path + ": head_dim " + std::to_string(hd_) + " is not supported (even, at most " +
                 std::to_string(kMaxHeadDim) + ")"};
  }
  q_width_ = cfg_.n_head * hd_;
  kv_width_ = cfg_.n_head_kv * hd_;

  RILL_ASSIGN_OR_RETURN(embed_, bind_matrix(f, "model.embed_tokens.weight", V, E));
  if (f.find("lm_head.weight")) {
    RILL_ASSIGN_OR_RETURN(lm_head_, bind_matrix(f, "lm_head.weight", V, E));
  } else {
    lm_head_ = embed_;
  }
  RILL_ASSIGN_OR_RETURN(final_norm_, load_vector(f, "model.norm.weight", E));
  set_limits(options);

  bool all_f32 = embed_.dtype == DType::kF32;
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    LlamaLayer& L = layers_[static_cast<size_t>(il)];
    RILL_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "input_layernorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.q, bind_linear(f, p + "self_attn.q_proj", q_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.k, bind_linear(f, p + "self_attn.k_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.v, bind_linear(f, p + "self_attn.v_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(L.o, bind_linear(f, p + "self_attn.o_proj", E, q_width_, Bias::kOptional));
    if (f.find(p + "self_attn.q_norm.weight")) {
      RILL_ASSIGN_OR_RETURN(L.q_norm, load_vector(f, p + "self_attn.q_norm.weight", hd_));
      RILL_ASSIGN_OR_RETURN(L.k_norm, load_vector(f, p + "self_attn.k_norm.weight", hd_));
    }
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "post_attention_layernorm.weight", E));
    if (is_moe_layer(cfg_, il)) {
      RILL_TRY(bind_moe(L, p));
    } else {
      RILL_ASSIGN_OR_RETURN(L.gate, bind_linear(f, p + "mlp.gate_proj", F, E));
      RILL_ASSIGN_OR_RETURN(L.up, bind_linear(f, p + "mlp.up_proj", F, E));
      RILL_ASSIGN_OR_RETURN(L.down, bind_linear(f, p + "mlp.down_proj", E, F));
    }
    all_f32 = all_f32 && L.q.w.dtype == DType::kF32 && L.gate.w.dtype == DType::kF32;
  }

  const int64_t rot_dim = cfg_.rope_dim > 0 ? cfg_.rope_dim : hd_;
  if (rot_dim > hd_ || rot_dim % 2 != 0) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) + " must be even and at most head_dim " +
                 std::to_string(hd_)};
  }
  const cpu::RopeScalingParams rs = rope_scaling_params(cfg_.rope_scaling);
  rope_ = cpu::make_rope_table(cfg_.rope_theta, rot_dim, cfg_.rope_style == RopeStyle::kInterleaved, rs);
  if (const TensorRef* freqs = f.find("rope_freqs.weight")) {
    // GGUF llama3 models bake the scaling into per-frequency divisors.
    if (freqs->dtype != DType::kF32 || freqs->n_elements() != rot_dim / 2) {
      return Error{freqs->file + ": tensor 'rope_freqs.weight' must be F32 [" + std::to_string(rot_dim / 2) + "]"};
    }
    const float* d = reinterpret_cast<const float*>(freqs->data);
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope_.inv_freq[i] /= d[i];
    rope_.ggml_freq_divisor.assign(d, d + rot_dim / 2);
  }
  if (f.format == ModelFormat::kGguf && cfg_.rope_scaling.type == RopeScaling::Type::kNone) {
    // GGUF models are held to llama.cpp, which builds angles by repeated f32
    // multiplication; pos * inv_freq differs in the last bits, and quantized
    // activations turn such bits into visible logit differences.
    rope_.ggml_theta_scale = std::pow(cfg_.rope_theta, -2.0f / static_cast<float>(rot_dim));
  }

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
      lane.backend = cpu::make_host_ops(n_threads * (l + 1) / kLanes - lane.thread_share);
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
  cpu::HostOps& backend = *e.backend;
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

// MoeFfn::bind_llama: Mixtral's block_sparse_moe or mlp.{gate, experts...}.
Status LlamaModel::bind_moe(LlamaLayer& L, const std::string& p) {
  RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind_llama(*files_, p));
  return Status::Ok();
}

void LlamaModel::mlp_block(const Exec& e, const LlamaLayer& L, int64_t n) {
  Activations& a = *e.a;
  cpu::HostOps& backend = *e.backend;
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
  const int64_t n = batch.n_tokens();
  if (n > max_tokens_) {
    return Error{"batch of " + std::to_string(n) + " tokens exceeds max_batch_tokens " + std::to_string(max_tokens_)};
  }
  if (static_cast<int64_t>(batch.sample_rows.size()) > max_seqs_) {
    return Error{"batch samples " + std::to_string(batch.sample_rows.size()) + " rows, more than " +
                 std::to_string(max_seqs_)};
  }
  for (int32_t row : batch.sample_rows) {
    if (row < 0 || row >= n) return Error{"sample row " + std::to_string(row) + " is outside the batch"};
  }
  const int32_t bs = kv_.block_size();
  for (const BatchSeq& s : batch.seqs) {
    if (s.kv_len < 0 || s.kv_len > n_ctx_) {
      return Error{"sequence length " + std::to_string(s.kv_len) + " is outside the context (" +
                   std::to_string(n_ctx_) + ")"};
    }
    if (s.q_start < 0 || s.q_len < 0 || s.q_start + s.q_len > n || s.q_len > s.kv_len || s.table_start < 0 ||
        s.table_len < (s.kv_len + bs - 1) / bs ||
        static_cast<size_t>(s.table_start + s.table_len) > batch.block_table.size()) {
      return Error{"batch sequence (tokens [" + std::to_string(s.q_start) + ", +" + std::to_string(s.q_len) +
                   "), length " + std::to_string(s.kv_len) + ") is inconsistent with its block table"};
    }
    // Blocks the step's queries can attend to must exist (holes only outside the window).
    const int64_t first_pos = s.kv_len - s.q_len;
    const int64_t lo = attn_params_.window > 0 ? std::max<int64_t>(0, first_pos - attn_params_.window + 1) : 0;
    const std::span<const int32_t> table = batch.table(0, s);
    for (int64_t b = lo / bs; b < (s.kv_len + bs - 1) / bs; ++b) {
      if (table[static_cast<size_t>(b)] < 0 || table[static_cast<size_t>(b)] >= kv_.n_blocks()) {
        return Error{"block table entry " + std::to_string(b) + " (" + std::to_string(table[static_cast<size_t>(b)]) +
                     ") is not a KV block (the cache has " + std::to_string(kv_.n_blocks()) + ")"};
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = batch.token_ids[i];
    if (id < 0 || id >= cfg_.n_vocab) {
      return Error{"token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(cfg_.n_vocab) +
                   ")"};
    }
    if (batch.seq_index[i] < 0 || static_cast<size_t>(batch.seq_index[i]) >= batch.seqs.size()) {
      return Error{"token " + std::to_string(i) + " names sequence " + std::to_string(batch.seq_index[i]) +
                   ", which is not in the batch"};
    }
    const BatchSeq& s = batch.seqs[static_cast<size_t>(batch.seq_index[i])];
    if (batch.positions[i] < s.kv_len - s.q_len || batch.positions[i] >= s.kv_len) {
      return Error{"position " + std::to_string(batch.positions[i]) + " of token " + std::to_string(i) +
                   " is outside its sequence's step [" + std::to_string(s.kv_len - s.q_len) + ", " +
                   std::to_string(s.kv_len) + ")"};
    }
  }
  return Status::Ok();
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
  cpu::HostOps& backend = *e.backend;
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

Result<std::unique_ptr<Model>> create_llama_model(std::shared_ptr<const ModelFiles> files,
                                                  const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_tp_model(std::move(files), options);
  if (options.device == Device::kCuda) return create_llama_cuda_model(std::move(files), options);
  return init_model(std::make_unique<LlamaModel>(std::move(files), options), options);
}

}  // namespace rill
