#include "model/arch/bert.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "model/arch/families.h"
#include "model/pooling.h"

namespace rill {
namespace {

// The checkpoint's tensor `name`, under the "bert." prefix or without it.
Result<const TensorRef*> tensor(const ModelFiles& files, const std::string& name, const std::vector<int64_t>& shape) {
  if (files.find("bert." + name)) return files.require("bert." + name, shape);
  return files.require(name, shape);
}

Result<std::vector<float>> to_f32(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
    } else if (t.dtype == DType::kF16 || t.dtype == DType::kBF16) {
      uint16_t h = 0;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = t.dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    } else {
      return Error{t.file + ": tensor '" + t.name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                   "; BERT vectors must be F32, F16 or BF16"};
    }
  }
  return v;
}

HostMatrix host_matrix(const TensorRef& t) {
  return {t.data, t.dtype, t.shape[0], t.shape[1], row_bytes(t.dtype, t.shape[1])};
}

struct Placer {
  Backend& b;
  const ModelFiles& files;
  Result<Weight> matrix(const std::string& name, int64_t rows, int64_t cols) {
    RILL_ASSIGN_OR_RETURN(const TensorRef* t, tensor(files, name, {rows, cols}));
    const HostMatrix m = host_matrix(*t);
    return b.place(&m, 1, name);
  }
  Result<Vec> vector(const std::string& name, int64_t n) {
    RILL_ASSIGN_OR_RETURN(const TensorRef* t, tensor(files, name, {n}));
    RILL_ASSIGN_OR_RETURN(std::vector<float> v, to_f32(*t));
    return b.place_vector(v.data(), n, name);
  }
};

Status place_pass(Backend& b, const ModelFiles& files, BertGraph& g) {
  const ModelConfig& c = files.config;
  Placer p{b, files};
  const int64_t E = g.E;
  RILL_ASSIGN_OR_RETURN(g.word, p.matrix("embeddings.word_embeddings.weight", c.n_vocab, E));
  RILL_ASSIGN_OR_RETURN(g.position, p.matrix("embeddings.position_embeddings.weight", c.max_position, E));
  {
    const int64_t n_types = c.raw.value("type_vocab_size", int64_t{2});
    RILL_ASSIGN_OR_RETURN(const TensorRef* t, tensor(files, "embeddings.token_type_embeddings.weight", {n_types, E}));
    RILL_ASSIGN_OR_RETURN(std::vector<float> v, to_f32(*t));
    RILL_ASSIGN_OR_RETURN(g.token_type0, b.place_vector(v.data(), E, t->name + " (row 0)"));
  }
  RILL_ASSIGN_OR_RETURN(g.ln_w, p.vector("embeddings.LayerNorm.weight", E));
  RILL_ASSIGN_OR_RETURN(g.ln_b, p.vector("embeddings.LayerNorm.bias", E));
  g.layers.assign(static_cast<size_t>(g.n_layer), BertLayer{});
  for (int64_t il = 0; il < g.n_layer; ++il) {
    const std::string pre = "encoder.layer." + std::to_string(il) + ".";
    BertLayer& L = g.layers[static_cast<size_t>(il)];
    HostMatrix qkv[3];
    std::vector<float> bias;
    int part = 0;
    for (const char* name : {"query", "key", "value"}) {
      const std::string w = pre + "attention.self." + name;
      RILL_ASSIGN_OR_RETURN(const TensorRef* t, tensor(files, w + ".weight", {E, E}));
      qkv[part++] = host_matrix(*t);
      RILL_ASSIGN_OR_RETURN(const TensorRef* bt, tensor(files, w + ".bias", {E}));
      RILL_ASSIGN_OR_RETURN(std::vector<float> bv, to_f32(*bt));
      bias.insert(bias.end(), bv.begin(), bv.end());
    }
    RILL_ASSIGN_OR_RETURN(L.wqkv, b.place(qkv, 3, pre + "attention.self.{query,key,value}"));
    RILL_ASSIGN_OR_RETURN(L.bqkv, b.place_vector(bias.data(), 3 * E, pre + "attention.self bias"));
    RILL_ASSIGN_OR_RETURN(L.wo, p.matrix(pre + "attention.output.dense.weight", E, E));
    RILL_ASSIGN_OR_RETURN(L.bo, p.vector(pre + "attention.output.dense.bias", E));
    RILL_ASSIGN_OR_RETURN(L.ln1_w, p.vector(pre + "attention.output.LayerNorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.ln1_b, p.vector(pre + "attention.output.LayerNorm.bias", E));
    RILL_ASSIGN_OR_RETURN(L.w_in, p.matrix(pre + "intermediate.dense.weight", g.F, E));
    RILL_ASSIGN_OR_RETURN(L.b_in, p.vector(pre + "intermediate.dense.bias", g.F));
    RILL_ASSIGN_OR_RETURN(L.w_out, p.matrix(pre + "output.dense.weight", E, g.F));
    RILL_ASSIGN_OR_RETURN(L.b_out, p.vector(pre + "output.dense.bias", E));
    RILL_ASSIGN_OR_RETURN(L.ln2_w, p.vector(pre + "output.LayerNorm.weight", E));
    RILL_ASSIGN_OR_RETURN(L.ln2_b, p.vector(pre + "output.LayerNorm.bias", E));
  }
  return Status::Ok();
}

}  // namespace

Result<BertGraph> place_bert(Backend& b, const ModelFiles& files) {
  const ModelConfig& c = files.config;
  const std::string where = files.path + "/config.json";
  if (c.hidden_act != "gelu") return Error{where + ": hidden_act '" + c.hidden_act + "' (BERT needs gelu)"};
  if (c.raw.value("position_embedding_type", std::string("absolute")) != "absolute")
    return Error{where + ": position_embedding_type must be absolute"};
  if (c.n_head_kv != c.n_head || c.head_dim * c.n_head != c.n_embd)
    return Error{where + ": BERT needs num_attention_heads x head size == hidden_size"};
  BertGraph g;
  g.E = c.n_embd;
  g.F = c.n_ff;
  g.n_layer = c.n_layer;
  g.n_head = static_cast<int32_t>(c.n_head);
  g.head_dim = static_cast<int32_t>(c.head_dim);
  g.eps = static_cast<float>(c.raw.value("layer_norm_eps", 1e-12));
  RILL_TRY(b.place_model([&] { return place_pass(b, files, g); }));
  return g;
}

Status bert_forward(Backend& b, const BertGraph& g, const StepMetadata& md, const BertActivations& a) {
  const int64_t n = md.n_tokens;
  const Tensor x = a.x.rows_from(0, n), tmp = a.tmp.rows_from(0, n);
  const Tensor qkv = a.qkv.rows_from(0, n), attn = a.attn.rows_from(0, n), ff = a.ff.rows_from(0, n);
  b.embed(g.word, md.ids, n, x);
  b.embed(g.position, md.pos, n, tmp);
  b.add(x, tmp);
  b.add_bias(x, g.token_type0);
  b.layer_norm(x, g.ln_w, g.ln_b, g.eps, x);
  BidirectionalAttentionOp op;
  op.qkv = qkv;
  op.out = attn;
  op.n_head = g.n_head;
  op.head_dim = g.head_dim;
  op.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
  for (const BertLayer& L : g.layers) {
    RILL_TRY(b.matmul(L.wqkv, x, qkv, false, L.bqkv));
    b.attention_bidirectional(op, md);
    RILL_TRY(b.matmul(L.wo, attn, x, true, L.bo));
    b.layer_norm(x, L.ln1_w, L.ln1_b, g.eps, x);
    RILL_TRY(b.matmul(L.w_in, x, ff, false, L.b_in));
    b.gelu_erf(ff);
    RILL_TRY(b.matmul(L.w_out, ff, x, true, L.b_out));
    b.layer_norm(x, L.ln2_w, L.ln2_b, g.eps, x);
  }
  return Status::Ok();
}

namespace {

// The CPU runtime: a Model over a CPU Backend. It keeps no KV: its KV
// "blocks" are only the engine's accounting of running sequences.
class BertModel final : public Model {
 public:
  explicit BertModel(std::shared_ptr<const ModelFiles> files) : files_(std::move(files)) {}

  Status init(const ModelOptions& options, std::unique_ptr<Backend> backend) {
    backend_ = std::move(backend);
    const ModelConfig& c = files_->config;
    if (!backend_->has_encoder_ops())
      return Error{files_->path + ": the " + std::string(backend_->name()) +
                   " Backend has no encoder ops (layer_norm, gelu_erf, bidirectional attention)"};
    RILL_ASSIGN_OR_RETURN(SentenceTransformersConfig st, read_sentence_transformers(files_->path, c.n_embd));
    if (st.spec.pooling == EmbeddingSpec::Pooling::kNone)
      return Error{files_->path + ": no sentence-transformers pooling (modules.json with a Pooling module); an " +
                   "encoder is served only as an embedding model"};
    spec_ = st.spec;
    spec_.bidirectional = true;
    n_ctx_ = c.max_position;
    if (st.max_seq_length > 0) n_ctx_ = std::min(n_ctx_, st.max_seq_length);
    if (options.n_ctx > 0) n_ctx_ = std::min(n_ctx_, options.n_ctx);
    max_tokens_ = std::max(1, options.max_batch_tokens);
    max_seqs_ = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens_) : max_tokens_;
    block_size_ = options.kv_block_size;
    // Accounting only: room for every sequence of a few full steps.
    const auto per_ctx = static_cast<int32_t>((n_ctx_ + block_size_ - 1) / block_size_);
    n_blocks_ = 4 * (max_tokens_ / block_size_ + max_seqs_) + per_ctx;
    RILL_ASSIGN_OR_RETURN(graph_, place_bert(*backend_, *files_));
    RILL_TRY(backend_->reserve({max_tokens_, graph_.n_head, graph_.head_dim}));
    const int64_t T = max_tokens_, E = graph_.E;
    RILL_ASSIGN_OR_RETURN(act_buf_, backend_->allocate(static_cast<size_t>(T * (6 * E + graph_.F)) * 4, "bert acts"));
    float* p = static_cast<float*>(act_buf_.data());
    auto take = [&](int64_t cols) {
      Tensor t = Tensor::dense(p, DType::kF32, T, cols);
      p += T * cols;
      return t;
    };
    acts_ = {take(E), take(E), take(3 * E), take(E), take(graph_.F)};
    kv_spec_ = {full()};
    return Status::Ok();
  }

  const ModelConfig& config() const override { return files_->config; }
  int64_t n_vocab() const override { return files_->config.n_vocab; }
  int64_t n_ctx() const override { return n_ctx_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_batch_seqs() const override { return max_seqs_; }
  const KvSpec& kv_spec() const override { return kv_spec_; }
  int32_t kv_block_size() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  size_t kv_bytes_per_token() const override { return 0; }
  std::string kv_numerics() const override { return "cpu encoder"; }
  EmbeddingSpec embedding() const override { return spec_; }

  Status forward(const Batch& batch, float* logits) override { return forward_pooled(batch, logits, nullptr); }

  Status forward_pooled(const Batch& batch, float* logits, float* pooled) override {
    (void)logits;
    if (!batch.sample_rows.empty()) return Error{"an encoder model computes no logits (embeddings only)"};
    if (batch.n_tokens() > max_tokens_) return Error{"batch of " + std::to_string(batch.n_tokens()) + " tokens"};
    for (const BatchSeq& s : batch.seqs)
      if (s.q_len != s.kv_len) return Error{"an encoder computes each sequence whole in one step"};
    fill_metadata(batch);
    RILL_TRY(bert_forward(*backend_, graph_, md_, acts_));
    if (batch.pool_seqs.empty() || pooled == nullptr) return Status::Ok();
    hidden_.resize(static_cast<size_t>(batch.n_tokens() * graph_.E));
    RILL_TRY(backend_->copy_out(hidden_.data(), acts_.x.data, hidden_.size() * sizeof(float)));
    for (size_t i = 0; i < batch.pool_seqs.size(); ++i) {
      const BatchSeq& s = batch.seqs[static_cast<size_t>(batch.pool_seqs[i])];
      pool_rows(spec_, hidden_.data() + static_cast<size_t>(s.q_start) * graph_.E, s.q_len, graph_.E,
                pooled + i * static_cast<size_t>(graph_.E));
    }
    return Status::Ok();
  }

 private:
  void fill_metadata(const Batch& batch) {
    q_start_.clear();
    q_len_.clear();
    kv_len_.clear();
    for (const BatchSeq& s : batch.seqs) {
      q_start_.push_back(s.q_start);
      q_len_.push_back(s.q_len);
      kv_len_.push_back(s.kv_len);
    }
    md_ = StepMetadata{};
    md_.n_tokens = batch.n_tokens();
    md_.n_seqs = static_cast<int32_t>(batch.seqs.size());
    md_.ids = batch.token_ids.data();
    md_.pos = batch.positions.data();
    md_.seq_of = batch.seq_index.data();
    md_.q_start = q_start_.data();
    md_.q_len = q_len_.data();
    md_.kv_len = kv_len_.data();
  }

  std::shared_ptr<const ModelFiles> files_;
  std::unique_ptr<Backend> backend_;
  BertGraph graph_;
  EmbeddingSpec spec_;
  Buffer act_buf_;
  BertActivations acts_;
  KvSpec kv_spec_;
  int64_t n_ctx_ = 0;
  int max_tokens_ = 0, max_seqs_ = 0;
  int32_t block_size_ = 16, n_blocks_ = 0;
  StepMetadata md_;
  std::vector<int32_t> q_start_, q_len_, kv_len_;
  std::vector<float> hidden_;  // [n_tokens, E] pooling input
};

}  // namespace

Result<std::unique_ptr<Model>> create_bert_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                     const ModelOptions& options) {
  auto model = std::make_unique<BertModel>(std::move(files));
  RILL_TRY(model->init(options, make_cpu_backend(options.n_threads)));
  return std::unique_ptr<Model>(std::move(model));
}

Result<std::unique_ptr<Model>> create_bert_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options) {
  (void)options;
  return Error{files->path + ": bert.cuda is not built: the CUDA Backend has no encoder ops (layer_norm, " +
               "gelu_erf, bidirectional attention) yet; run BERT models with --device cpu"};
}

}  // namespace rill
