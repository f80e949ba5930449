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
  Status bind_moe(LlamaLayer& L, const std::string& p);
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
  qkv_width_ = q_width_ + 2 * kv_width_;
  device_ = make_cpu_backend_on(*backend_->pool());
  Backend& dev = *device_;

  RILL_ASSIGN_OR_RETURN(const WeightView embed, bind_matrix(f, "model.embed_tokens.weight", V, E));
  const HostMatrix embed_m = host_matrix(embed);
  RILL_ASSIGN_OR_RETURN(embed_, dev.place(&embed_m, 1, "model.embed_tokens.weight"));
  lm_head_ = embed_;
  if (f.find("lm_head.weight")) {
    RILL_ASSIGN_OR_RETURN(const WeightView head, bind_matrix(f, "lm_head.weight", V, E));
    const HostMatrix m = host_matrix(head);
    RILL_ASSIGN_OR_RETURN(lm_head_, dev.place(&m, 1, "lm_head.weight"));
  }
  auto vec = [&](const std::string& name, int64_t n) -> Result<Vec> {
    RILL_ASSIGN_OR_RETURN(const std::vector<float> v, load_vector(f, name, n));
    return dev.place_vector(v.data(), n, name);
  };
  RILL_ASSIGN_OR_RETURN(final_norm_, vec("model.norm.weight", E));
  set_limits(options);

  bool all_f32 = embed.dtype == DType::kF32;
  std::vector<const WeightView*> moe_weights;
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    LlamaLayer& L = layers_[static_cast<size_t>(il)];
    RILL_ASSIGN_OR_RETURN(L.attn_norm, vec(p + "input_layernorm.weight", E));
    RILL_ASSIGN_OR_RETURN(const Linear q, bind_linear(f, p + "self_attn.q_proj", q_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(const Linear k, bind_linear(f, p + "self_attn.k_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(const Linear v, bind_linear(f, p + "self_attn.v_proj", kv_width_, E, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(const Linear o, bind_linear(f, p + "self_attn.o_proj", E, q_width_, Bias::kOptional));
    const HostMatrix qkv[] = {host_matrix(q.w), host_matrix(k.w), host_matrix(v.w)};
    RILL_ASSIGN_OR_RETURN(L.wqkv, dev.place(qkv, 3, p + "self_attn.{q,k,v}_proj"));
    if (!q.bias.empty() || !k.bias.empty() || !v.bias.empty()) {
      std::vector<float> b(static_cast<size_t>(qkv_width_), 0.0f);
      std::copy(q.bias.begin(), q.bias.end(), b.begin());
      std::copy(k.bias.begin(), k.bias.end(), b.begin() + q_width_);
      std::copy(v.bias.begin(), v.bias.end(), b.begin() + q_width_ + kv_width_);
      RILL_ASSIGN_OR_RETURN(L.bqkv, dev.place_vector(b.data(), qkv_width_, p + "self_attn qkv bias"));
    }
    const HostMatrix om = host_matrix(o.w);
    RILL_ASSIGN_OR_RETURN(L.wo, dev.place(&om, 1, p + "self_attn.o_proj"));
    if (!o.bias.empty()) {
      RILL_ASSIGN_OR_RETURN(L.bo, dev.place_vector(o.bias.data(), E, p + "self_attn.o_proj.bias"));
    }
    if (f.find(p + "self_attn.q_norm.weight")) {
      RILL_ASSIGN_OR_RETURN(L.q_norm, vec(p + "self_attn.q_norm.weight", hd_));
      RILL_ASSIGN_OR_RETURN(L.k_norm, vec(p + "self_attn.k_norm.weight", hd_));
    }
    RILL_ASSIGN_OR_RETURN(L.ffn_norm, vec(p + "post_attention_layernorm.weight", E));
    bool f32_ffn = true;
    if (is_moe_layer(cfg_, il)) {
      RILL_TRY(bind_moe(L, p));
      L.moe->collect_weights(&moe_weights);
    } else {
      RILL_ASSIGN_OR_RETURN(const Linear gate, bind_linear(f, p + "mlp.gate_proj", F, E));
      RILL_ASSIGN_OR_RETURN(const Linear up, bind_linear(f, p + "mlp.up_proj", F, E));
      RILL_ASSIGN_OR_RETURN(const Linear down, bind_linear(f, p + "mlp.down_proj", E, F));
      const HostMatrix gu[] = {host_matrix(gate.w), host_matrix(up.w)};
      RILL_ASSIGN_OR_RETURN(L.w_gate_up, dev.place(gu, 2, p + "mlp.{gate,up}_proj"));
      const HostMatrix dm = host_matrix(down.w);
      RILL_ASSIGN_OR_RETURN(L.w_down, dev.place(&dm, 1, p + "mlp.down_proj"));
      f32_ffn = gate.w.dtype == DType::kF32;
    }
    // As before: a MoE layer's (absent) gate counts as f32.
    all_f32 = all_f32 && q.w.dtype == DType::kF32 && f32_ffn;
  }

  const int64_t rot_dim = cfg_.rope_dim > 0 ? cfg_.rope_dim : hd_;
  if (rot_dim > hd_ || rot_dim % 2 != 0) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) + " must be even and at most head_dim " +
                 std::to_string(hd_)};
  }
  const cpu::RopeScalingParams rs = rope_scaling_params(cfg_.rope_scaling);
  RopeTable rope = cpu::make_rope_table(cfg_.rope_theta, rot_dim, cfg_.rope_style == RopeStyle::kInterleaved, rs);
  if (const TensorRef* freqs = f.find("rope_freqs.weight")) {
    // GGUF llama3 models bake the scaling into per-frequency divisors.
    if (freqs->dtype != DType::kF32 || freqs->n_elements() != rot_dim / 2) {
      return Error{freqs->file + ": tensor 'rope_freqs.weight' must be F32 [" + std::to_string(rot_dim / 2) + "]"};
    }
    const float* d = reinterpret_cast<const float*>(freqs->data);
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope.inv_freq[i] /= d[i];
    rope.ggml_freq_divisor.assign(d, d + rot_dim / 2);
  }
  if (f.format == ModelFormat::kGguf && cfg_.rope_scaling.type == RopeScaling::Type::kNone) {
    // GGUF models are held to llama.cpp, which builds angles by repeated f32
    // multiplication; pos * inv_freq differs in the last bits, and quantized
    // activations turn such bits into visible logit differences.
    rope.ggml_theta_scale = std::pow(cfg_.rope_theta, -2.0f / static_cast<float>(rot_dim));
  }
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

// MoeFfn::bind_llama: Mixtral's block_sparse_moe or mlp.{gate, experts...}.
Status LlamaModel::bind_moe(LlamaLayer& L, const std::string& p) {
  RILL_ASSIGN_OR_RETURN(L.moe, MoeFfn::bind_llama(*files_, p));
  return Status::Ok();
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
    const int64_t lo = window_ > 0 ? std::max<int64_t>(0, first_pos - window_ + 1) : 0;
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

Result<std::unique_ptr<Model>> create_llama_model(std::shared_ptr<const ModelFiles> files,
                                                  const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_tp_model(std::move(files), options);
  if (options.device == Device::kCuda) return create_llama_cuda_model(std::move(files), options);
  return init_model(std::make_unique<LlamaModel>(std::move(files), options), options);
}

}  // namespace rill
