// The Llama family on a CUDA device: the same graph as llama.cpp (llama,
// mistral, qwen2, qwen3, smollm), behind the same Model interface, with
// weights uploaded once and every activation in one preallocated arena.
//
// Layout choices (each for fewer launches or bytes per step):
//  - q/k/v weights are stored as one [q + 2 kv, n_embd] matrix and gate/up
//    as one [2 n_ff, n_embd] matrix: one matmul each;
//  - o_proj and down_proj accumulate into the f32 residual stream (GEMM
//    beta = 1 / GEMV +=), so the residual add costs nothing;
//  - RoPE, the qwen3 q/k norms and the K/V store are one kernel;
//  - matmul inputs are in the weights' dtype (bf16 for bf16 checkpoints, f32
//    for f32 ones, which then match the CPU within f32 rounding), outputs f32;
//  - GGUF block types stay quantized in device memory (cuda/quant.h: GEMV
//    from the blocks, dequantize-then-GEMM for prefill); activations bf16.
// Per step the host writes the batch's index arrays into pinned memory and
// uploads them with one copy; nothing is allocated.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/arch/families.h"

#if RILL_HAVE_CUDA
#include "backend/cpu/rope_table.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "core/half.h"
#include "model/batch_check.h"
#include "model/layers.h"
#endif

namespace rill {

#if RILL_HAVE_CUDA
namespace {

using cuda::Arena;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

struct DevLayer {
  const float* attn_norm = nullptr;  // [E]
  cuda::DeviceWeight wqkv;           // [Q + 2 KV, E] act dtype or quantized
  const float* bqkv = nullptr;       // [Q + 2 KV] or null (qwen2)
  const float* q_norm = nullptr;     // [hd] or null (qwen3)
  const float* k_norm = nullptr;
  cuda::DeviceWeight wo;             // [E, Q]
  const float* bo = nullptr;         // [E] or null
  const float* ffn_norm = nullptr;   // [E]
  cuda::DeviceWeight w_gate_up;      // [2F, E]
  cuda::DeviceWeight w_down;         // [E, F]
  void* k_cache = nullptr;           // [n_blocks * bs, KV] kv dtype
  void* v_cache = nullptr;
};

// Step metadata: the same layout in pinned host memory and on the device,
// so one copy uploads it. Block tables come last: only the used prefix moves.
struct StepMeta {
  int32_t* ids = nullptr;            // [T]
  int32_t* pos = nullptr;            // [T]
  int32_t* slots = nullptr;          // [T]
  int32_t* seq_of = nullptr;         // [T]
  int32_t* decode_tokens = nullptr;  // [T]
  int32_t* sample_rows = nullptr;    // [S]
  int32_t* table_start = nullptr;    // [T] (a batch has at most one sequence per token)
  cuda::PrefillTile* tiles = nullptr;  // [T]
  int32_t* tables = nullptr;         // [table_cap]

  void carve(Arena& a, size_t T, size_t S, size_t table_cap) {
    ids = a.take<int32_t>(T);
    pos = a.take<int32_t>(T);
    slots = a.take<int32_t>(T);
    seq_of = a.take<int32_t>(T);
    decode_tokens = a.take<int32_t>(T);
    sample_rows = a.take<int32_t>(S);
    table_start = a.take<int32_t>(T);
    tiles = a.take<cuda::PrefillTile>(T);
    tables = a.take<int32_t>(table_cap);
  }
};

// push_back over a raw array (capacity checked by the caller's sizing).
template <typename T>
struct Appender {
  T* data;
  int32_t n = 0;
  void push_back(const T& v) { data[n++] = v; }
};

class LlamaCudaModel final : public Model {
 public:
  LlamaCudaModel(std::shared_ptr<const ModelFiles> files) : files_(std::move(files)), cfg_(files_->config) {}
  Status init(const ModelOptions& options);

  const ModelConfig& config() const override { return cfg_; }
  int64_t n_vocab() const override { return cfg_.n_vocab; }
  int64_t n_ctx() const override { return n_ctx_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_batch_seqs() const override { return max_seqs_; }
  const KvSpec& kv_spec() const override { return kv_spec_; }
  int32_t kv_block_size() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  size_t kv_bytes_per_token() const override { return kv_token_bytes_; }
  Status forward(const Batch& batch, float* logits) override;
  bool has_forward_greedy() const override { return true; }
  Status forward_greedy(const Batch& batch, int32_t* ids) override;

 private:
  // Uploads the step's indices and computes logits_ for the sample rows;
  // decode-only steps replay a CUDA graph per (padded batch, split count).
  Status compute(const Batch& batch);
  Status run_layers(int64_t n, int64_t n_sample, int32_t n_decode, int32_t max_decode_len, int32_t n_tiles);
  Status upload_weights();
  Status build_rope();
  Status matmul(const cuda::DeviceWeight& w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                bool accumulate) {
    if (cuda::quant_supported(w.dtype)) {
      return cuda::quant_matmul(*gemm_, qscratch_, w.dtype, w.data, act_, x, n, rows, cols, y, accumulate,
                                ctx_->stream());
    }
    return gemm_->matmul(act_, w.data, x, n, rows, cols, y, accumulate);
  }

  std::shared_ptr<const ModelFiles> files_;
  const ModelConfig& cfg_;
  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<cuda::Gemm> gemm_;
  DType act_ = DType::kBF16, kv_dtype_ = DType::kF16;
  int64_t E_ = 0, V_ = 0, F_ = 0, hd_ = 0, Q_ = 0, KV_ = 0, QKV_ = 0;
  int max_tokens_ = 0, max_seqs_ = 0;
  int64_t n_ctx_ = 0;
  KvSpec kv_spec_;
  int32_t block_size_ = 16, block_shift_ = 4, n_blocks_ = 0;
  size_t kv_token_bytes_ = 0;
  size_t table_cap_ = 0;

  DeviceBuffer weights_;
  cuda::DeviceWeight embed_, lm_head_;
  // Quantized matrices: the largest kept in blocks (elements), and whether
  // the LM head is one (its GEMM goes in row chunks of the scratch).
  int64_t quant_max_elems_ = 0;
  bool quant_head_ = false;
  cuda::QuantScratch qscratch_;
  const float* final_norm_ = nullptr;
  std::vector<DevLayer> layers_;

  cpu::RopeTable rope_;
  DeviceBuffer rope_buf_;  // inv_freq [rot/2], then the ggml divisors [rot/2]

  DeviceBuffer kv_;
  DeviceBuffer act_buf_;
  float* x_ = nullptr;      // [T, E] residual stream
  void* h_ = nullptr;       // [T, E] act: normed
  float* qkv_ = nullptr;    // [T, QKV]
  void* attn_ = nullptr;    // [T, Q] act
  float* gu_ = nullptr;     // [T, 2F]
  void* mlp_ = nullptr;     // [T, F] act
  void* final_ = nullptr;   // [S, E] act
  float* logits_ = nullptr; // [S, V]
  float* partial_ = nullptr;
  int32_t* split_counts_ = nullptr;  // [T, n_head_kv] decode split merge counters, kept zero between launches

  PinnedBuffer meta_host_buf_;
  DeviceBuffer meta_dev_buf_;
  StepMeta meta_host_, meta_dev_;
  int32_t* ids_dev_ = nullptr;   // [S] greedy ids
  PinnedBuffer ids_host_;

  // Decode graphs, keyed by padded batch size << 8 | split count. A key is
  // run eagerly the first time (plans GEMMs, sets kernel attributes) and
  // captured the second.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    bool seen = false;
  };
  std::unordered_map<uint32_t, Graph> graphs_;
  bool use_graphs_ = true;
  // RILL_CUDA_SPLIT_MERGE=1: decode attention's last split block merges the
  // splits (no combine kernel). Off by default: on the H200 it was slower
  // (8B bf16, 2026-11-29: 5.17 vs 5.10 ms at batch 1, 7.62 vs 7.50 ms at 64).
  bool use_split_merge_ = false;
  // RILL_CUDA_FAST_DECODE=0: decode attention through the general kernel
  // (benchmarks compare the two).
  bool general_decode_ = false;
};

Status LlamaCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  E_ = cfg_.n_embd;
  V_ = cfg_.n_vocab;
  F_ = cfg_.n_ff;
  if (E_ <= 0 || V_ <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 || F_ <= 0 ||
      cfg_.n_head % cfg_.n_head_kv != 0) {
    return Error{f.path + ": inconsistent model config (embd " + std::to_string(E_) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E_ / cfg_.n_head;
  if (hd_ <= 0 || hd_ > 256 || hd_ % 4 != 0 || cfg_.n_head / cfg_.n_head_kv > 8) {
    return Error{f.path + ": the CUDA backend supports head_dim a multiple of 4 up to 256 and at most 8 query heads "
                 "per KV head (model: head_dim " + std::to_string(hd_) + ", " +
                 std::to_string(cfg_.n_head / cfg_.n_head_kv) + " per KV head)"};
  }
  Q_ = cfg_.n_head * hd_;
  KV_ = cfg_.n_head_kv * hd_;
  QKV_ = Q_ + 2 * KV_;
  RILL_ASSIGN_OR_RETURN(ctx_, cuda::Context::create(0));
  gemm_ = std::make_unique<cuda::Gemm>(*ctx_);
  RILL_TRY(upload_weights());
  RILL_TRY(build_rope());

  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : cfg_.max_position;
  if (n_ctx_ <= 0) n_ctx_ = 4096;
  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  block_size_ = options.kv_block_size;
  if (block_size_ <= 0 || (block_size_ & (block_size_ - 1)) != 0) {
    return Error{"KV block size " + std::to_string(block_size_) + " is not a power of two"};
  }
  block_shift_ = __builtin_ctz(static_cast<unsigned>(block_size_));
  max_tokens_ = std::max(1, options.max_batch_tokens);
  max_seqs_ = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens_) : max_tokens_;

  // Activations for max_tokens_ rows (and max_seqs_ sampled rows).
  const auto T = static_cast<size_t>(max_tokens_), S = static_cast<size_t>(max_seqs_);
  const size_t as = dtype_size(act_);
  auto carve = [&](Arena& a) {
    x_ = a.take<float>(T * E_);
    h_ = a.take<uint8_t>(T * E_ * as);
    qkv_ = a.take<float>(T * QKV_);
    attn_ = a.take<uint8_t>(T * Q_ * as);
    gu_ = a.take<float>(T * 2 * F_);
    mlp_ = a.take<uint8_t>(T * F_ * as);
    final_ = a.take<uint8_t>(S * E_ * as);
    logits_ = a.take<float>(S * V_);
    partial_ = a.take<float>(cuda::attention_partial_floats(max_tokens_, static_cast<int32_t>(cfg_.n_head),
                                                             static_cast<int32_t>(hd_)));
    ids_dev_ = a.take<int32_t>(S);
    split_counts_ = a.take<int32_t>(T * static_cast<size_t>(cfg_.n_head_kv));
    qscratch_.carve(a, act_, max_tokens_, quant_max_elems_, quant_head_ ? V_ : 0, E_, max_seqs_);
  };
  Arena sizing;
  carve(sizing);
  RILL_ASSIGN_OR_RETURN(act_buf_, DeviceBuffer::allocate(sizing.used(), "activations"));
  Arena real(act_buf_.data());
  carve(real);
  if (cudaError_t e = cudaMemset(split_counts_, 0, T * static_cast<size_t>(cfg_.n_head_kv) * sizeof(int32_t));
      e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "zeroing the attention split counters")};
  }

  // Step metadata: block tables for every sequence of a full batch at full context.
  const size_t blocks_per_seq = static_cast<size_t>((n_ctx_ + block_size_ - 1) / block_size_);
  table_cap_ = std::min(T, S + 16) * blocks_per_seq + 1;  // + the padding rows' scratch block
  Arena meta_sizing;
  meta_host_.carve(meta_sizing, T, S, table_cap_);
  RILL_ASSIGN_OR_RETURN(meta_host_buf_, PinnedBuffer::allocate(meta_sizing.used(), "step metadata"));
  RILL_ASSIGN_OR_RETURN(meta_dev_buf_, DeviceBuffer::allocate(meta_sizing.used(), "step metadata"));
  Arena mh(meta_host_buf_.data()), md(meta_dev_buf_.data());
  meta_host_.carve(mh, T, S, table_cap_);
  meta_dev_.carve(md, T, S, table_cap_);
  RILL_ASSIGN_OR_RETURN(ids_host_, PinnedBuffer::allocate(S * sizeof(int32_t), "greedy ids"));

  // KV pool: explicit bytes, else a share of device memory, else whole contexts.
  kv_token_bytes_ = 2 * static_cast<size_t>(cfg_.n_layer) * static_cast<size_t>(KV_) * dtype_size(kv_dtype_);
  const size_t block_bytes = kv_token_bytes_ * static_cast<size_t>(block_size_);
  int64_t n_blocks = 0;
  if (options.kv_cache_bytes > 0) {
    n_blocks = options.kv_cache_bytes / static_cast<int64_t>(block_bytes);
  } else if (options.gpu_memory_fraction > 0) {
    size_t free_b = 0, total_b = 0;
    ctx_->mem_info(&free_b, &total_b);
    const double budget = options.gpu_memory_fraction * static_cast<double>(total_b) -
                          static_cast<double>(total_b - free_b);
    n_blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    if (n_blocks < 1) {
      return Error{f.path + ": --gpu-memory-fraction " + std::to_string(options.gpu_memory_fraction) +
                   " leaves no room for the KV cache after weights and activations (" +
                   std::to_string((total_b - free_b) >> 20) + " MiB in use of " + std::to_string(total_b >> 20) +
                   " MiB)"};
    }
  } else {
    n_blocks = std::max(1, options.n_kv_slots) * static_cast<int64_t>(blocks_per_seq);
  }
  n_blocks = std::min<int64_t>(n_blocks, (int64_t{1} << 31) / block_size_ - 1);  // slots are int32
  if (n_blocks < 1) {
    return Error{f.path + ": a KV cache of " + std::to_string(options.kv_cache_bytes) + " bytes holds no whole block of " +
                 std::to_string(block_size_) + " tokens (" + std::to_string(kv_token_bytes_) + " bytes per token)"};
  }
  n_blocks_ = static_cast<int32_t>(n_blocks);
  // One block more than reported: the scratch block that padding rows of a
  // decode graph write to and read from.
  RILL_ASSIGN_OR_RETURN(kv_, DeviceBuffer::allocate(static_cast<size_t>(n_blocks + 1) * block_bytes, "the KV cache"));
  const size_t plane = static_cast<size_t>(n_blocks + 1) * static_cast<size_t>(block_size_) *
                       static_cast<size_t>(KV_) * dtype_size(kv_dtype_);
  for (size_t il = 0; il < layers_.size(); ++il) {
    layers_[il].k_cache = kv_.as<uint8_t>() + (2 * il) * plane;
    layers_[il].v_cache = kv_.as<uint8_t>() + (2 * il + 1) * plane;
  }
  if (const char* g = std::getenv("RILL_CUDA_GRAPHS")) use_graphs_ = std::string(g) != "0";
  if (const char* g = std::getenv("RILL_CUDA_SPLIT_MERGE")) use_split_merge_ = std::string(g) == "1";
  if (const char* g = std::getenv("RILL_CUDA_FAST_DECODE")) general_decode_ = std::string(g) == "0";
  return ctx_->synchronize();
}

// Weights in one device buffer. Matrices go in the activation dtype (the
// dtype of q_proj; others are converted on the host if they differ), norms
// and biases in f32.
Status LlamaCudaModel::upload_weights() {
  const ModelFiles& f = *files_;
  const int64_t L = cfg_.n_layer;
  struct HostLayer {
    std::vector<float> attn_norm, ffn_norm, q_norm, k_norm;
    Linear q, k, v, o, gate, up, down;
  };
  std::vector<HostLayer> hl(static_cast<size_t>(L));
  RILL_ASSIGN_OR_RETURN(WeightView embed, bind_matrix(f, "model.embed_tokens.weight", V_, E_));
  WeightView lm_head = embed;
  const bool tied = !f.find("lm_head.weight");
  if (!tied) {
    RILL_ASSIGN_OR_RETURN(lm_head, bind_matrix(f, "lm_head.weight", V_, E_));
  }
  RILL_ASSIGN_OR_RETURN(std::vector<float> final_norm, load_vector(f, "model.norm.weight", E_));
  for (int64_t il = 0; il < L; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    HostLayer& h = hl[static_cast<size_t>(il)];
    RILL_ASSIGN_OR_RETURN(h.attn_norm, load_vector(f, p + "input_layernorm.weight", E_));
    RILL_ASSIGN_OR_RETURN(h.q, bind_linear(f, p + "self_attn.q_proj", Q_, E_, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(h.k, bind_linear(f, p + "self_attn.k_proj", KV_, E_, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(h.v, bind_linear(f, p + "self_attn.v_proj", KV_, E_, Bias::kOptional));
    RILL_ASSIGN_OR_RETURN(h.o, bind_linear(f, p + "self_attn.o_proj", E_, Q_, Bias::kOptional));
    if (f.find(p + "self_attn.q_norm.weight")) {
      RILL_ASSIGN_OR_RETURN(h.q_norm, load_vector(f, p + "self_attn.q_norm.weight", hd_));
      RILL_ASSIGN_OR_RETURN(h.k_norm, load_vector(f, p + "self_attn.k_norm.weight", hd_));
    }
    RILL_ASSIGN_OR_RETURN(h.ffn_norm, load_vector(f, p + "post_attention_layernorm.weight", E_));
    RILL_ASSIGN_OR_RETURN(h.gate, bind_linear(f, p + "mlp.gate_proj", F_, E_));
    RILL_ASSIGN_OR_RETURN(h.up, bind_linear(f, p + "mlp.up_proj", F_, E_));
    RILL_ASSIGN_OR_RETURN(h.down, bind_linear(f, p + "mlp.down_proj", E_, F_));
  }
  act_ = hl[0].q.w.dtype;
  bool all_f32 = true, any_quant = false;
  for (const HostLayer& h : hl) {
    for (const Linear* l : {&h.q, &h.k, &h.v, &h.o, &h.gate, &h.up, &h.down}) {
      const DType t = l->w.dtype;
      if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && !cuda::quant_supported(t)) {
        return Error{f.path + ": the CUDA backend runs F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K "
                     "and Q6_K weights; this model has " + std::string(dtype_name(t))};
      }
      all_f32 = all_f32 && t == DType::kF32;
      any_quant = any_quant || cuda::quant_supported(t);
    }
  }
  // Quantized layers: bf16 activations (what their GEMV reads and their
  // dequantize-then-GEMM path multiplies in).
  if (any_quant || (act_ != DType::kF32 && act_ != DType::kF16 && act_ != DType::kBF16)) act_ = DType::kBF16;
  all_f32 = all_f32 && embed.dtype == DType::kF32;
  kv_dtype_ = all_f32 ? DType::kF32 : DType::kF16;  // as the CPU Llama: f32 checkpoints keep f32 KV

  // Layout pass, then the copies.
  const bool has_qkv_bias = !hl[0].q.bias.empty() || !hl[0].k.bias.empty() || !hl[0].v.bias.empty();
  const bool has_o_bias = !hl[0].o.bias.empty();
  const bool has_qk_norm = !hl[0].q_norm.empty();
  struct Copy {
    size_t off;
    const void* src;  // host
    DType src_dtype;
    int64_t n;        // elements
    DType dst_dtype;  // act_ or F32, or src_dtype for a matrix kept quantized
  };
  std::vector<Copy> copies;
  size_t off = 0;
  std::unordered_map<size_t, DType> mat_dtype;  // offset of a matrix -> its dtype on the device
  auto place = [&](const void* src, DType src_dtype, int64_t n, DType dst_dtype) {
    off = (off + 255) / 256 * 256;
    copies.push_back({off, src, src_dtype, n, dst_dtype});
    const size_t at = off;
    off += row_bytes(dst_dtype, n);
    mat_dtype[at] = dst_dtype;
    return at;
  };
  auto place_vec = [&](const std::vector<float>& v) { return place(v.data(), DType::kF32, static_cast<int64_t>(v.size()), DType::kF32); };
  // Matrices of a quant_supported type stay in their blocks; others go in act_.
  auto place_mat = [&](const WeightView& w) {
    const DType t = cuda::quant_supported(w.dtype) ? w.dtype : act_;
    const size_t at = place(w.data, w.dtype, w.n_rows * w.n_cols, t);
    return at;
  };
  // Concatenated matrices: rows of each part in sequence (no padding
  // between); quantized when every part has the same quantized type.
  auto place_cat = [&](std::initializer_list<const WeightView*> parts) {
    DType t = (*parts.begin())->dtype;
    for (const WeightView* w : parts) t = w->dtype == t ? t : act_;
    t = cuda::quant_supported(t) ? t : act_;
    off = (off + 255) / 256 * 256;
    const size_t at = off;
    mat_dtype[at] = t;
    for (const WeightView* w : parts) {
      copies.push_back({off, w->data, w->dtype, w->n_rows * w->n_cols, t});
      off += row_bytes(t, w->n_rows * w->n_cols);
    }
    return at;
  };
  std::vector<std::vector<float>> bias_store;  // fused qkv biases (zeros where a part has none)
  const size_t embed_off = place_mat(embed);
  const size_t lm_off = tied ? embed_off : place_mat(lm_head);
  const size_t final_off = place_vec(final_norm);
  struct Offs { size_t attn_norm, wqkv, bqkv, q_norm, k_norm, wo, bo, ffn_norm, wgu, wdown; };
  std::vector<Offs> offs(static_cast<size_t>(L));
  for (size_t il = 0; il < hl.size(); ++il) {
    HostLayer& h = hl[il];
    Offs& o = offs[il];
    o.attn_norm = place_vec(h.attn_norm);
    o.wqkv = place_cat({&h.q.w, &h.k.w, &h.v.w});
    if (has_qkv_bias) {
      std::vector<float> b(static_cast<size_t>(QKV_), 0.0f);
      std::copy(h.q.bias.begin(), h.q.bias.end(), b.begin());
      std::copy(h.k.bias.begin(), h.k.bias.end(), b.begin() + Q_);
      std::copy(h.v.bias.begin(), h.v.bias.end(), b.begin() + Q_ + KV_);
      bias_store.push_back(std::move(b));
      o.bqkv = place_vec(bias_store.back());
    }
    if (has_qk_norm) {
      o.q_norm = place_vec(h.q_norm);
      o.k_norm = place_vec(h.k_norm);
    }
    o.wo = place_mat(h.o.w);
    if (has_o_bias) o.bo = place_vec(h.o.bias);
    o.ffn_norm = place_vec(h.ffn_norm);
    o.wgu = place_cat({&h.gate.w, &h.up.w});
    o.wdown = place_mat(h.down.w);
  }
  RILL_ASSIGN_OR_RETURN(weights_, DeviceBuffer::allocate(off, "the model weights (" + f.path + ")"));

  // Copies: same dtype straight from the mapped file; others converted in
  // chunks through a host buffer.
  std::vector<uint8_t> conv;
  for (const Copy& c : copies) {
    uint8_t* dst = weights_.as<uint8_t>() + c.off;
    if (c.src_dtype == c.dst_dtype) {
      const size_t bytes = row_bytes(c.dst_dtype, c.n);
      if (cudaError_t e = cudaMemcpy(dst, c.src, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) {
        return Error{cuda::cuda_error_text(e, "uploading weights")};
      }
      continue;
    }
    constexpr int64_t kChunk = int64_t{1} << 22;
    std::vector<float> tmp;
    for (int64_t i = 0; i < c.n; i += kChunk) {
      const int64_t m = std::min(kChunk, c.n - i);
      tmp.resize(static_cast<size_t>(m));
      cpu::dequantize_row(c.src_dtype, static_cast<const uint8_t*>(c.src) + row_bytes(c.src_dtype, i), tmp.data(), m);
      conv.resize(static_cast<size_t>(m) * dtype_size(c.dst_dtype));
      for (int64_t j = 0; j < m; ++j) {
        const float v = tmp[static_cast<size_t>(j)];
        if (c.dst_dtype == DType::kF32) {
          std::memcpy(conv.data() + 4 * j, &v, 4);
        } else {
          const uint16_t hv = c.dst_dtype == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
          std::memcpy(conv.data() + 2 * j, &hv, 2);
        }
      }
      if (cudaError_t e = cudaMemcpy(dst + static_cast<size_t>(i) * dtype_size(c.dst_dtype), conv.data(), conv.size(),
                                     cudaMemcpyHostToDevice);
          e != cudaSuccess) {
        return Error{cuda::cuda_error_text(e, "uploading weights")};
      }
    }
  }
  const uint8_t* base = weights_.as<uint8_t>();
  // A matrix's device dtype; quantized layer matrices size the dequantize scratch.
  auto weight = [&](size_t at, int64_t n_elems) {
    const DType t = mat_dtype.at(at);
    if (cuda::quant_supported(t)) quant_max_elems_ = std::max(quant_max_elems_, n_elems);
    return cuda::DeviceWeight{base + at, t};
  };
  embed_ = {base + embed_off, mat_dtype.at(embed_off)};
  lm_head_ = {base + lm_off, mat_dtype.at(lm_off)};
  quant_head_ = cuda::quant_supported(lm_head_.dtype);
  final_norm_ = reinterpret_cast<const float*>(base + final_off);
  layers_.resize(static_cast<size_t>(L));
  for (size_t il = 0; il < hl.size(); ++il) {
    const Offs& o = offs[il];
    DevLayer& d = layers_[il];
    d.attn_norm = reinterpret_cast<const float*>(base + o.attn_norm);
    d.wqkv = weight(o.wqkv, QKV_ * E_);
    d.bqkv = has_qkv_bias ? reinterpret_cast<const float*>(base + o.bqkv) : nullptr;
    d.q_norm = has_qk_norm ? reinterpret_cast<const float*>(base + o.q_norm) : nullptr;
    d.k_norm = has_qk_norm ? reinterpret_cast<const float*>(base + o.k_norm) : nullptr;
    d.wo = weight(o.wo, E_ * Q_);
    d.bo = has_o_bias ? reinterpret_cast<const float*>(base + o.bo) : nullptr;
    d.ffn_norm = reinterpret_cast<const float*>(base + o.ffn_norm);
    d.w_gate_up = weight(o.wgu, 2 * F_ * E_);
    d.w_down = weight(o.wdown, E_ * F_);
  }
  return Status::Ok();
}

// The CPU Llama's RoPE table (HF inv_freq for default/linear/llama3/yarn;
// GGUF rope_freqs divisors and llama.cpp's angle recurrence), uploaded.
Status LlamaCudaModel::build_rope() {
  const ModelFiles& f = *files_;
  const int64_t rot_dim = cfg_.rope_dim > 0 ? cfg_.rope_dim : hd_;
  if (rot_dim > hd_ || rot_dim % 2 != 0) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) + " must be even and at most head_dim " +
                 std::to_string(hd_)};
  }
  const cpu::RopeScalingParams rs = rope_scaling_params(cfg_.rope_scaling);
  rope_ = cpu::make_rope_table(cfg_.rope_theta, rot_dim, cfg_.rope_style == RopeStyle::kInterleaved, rs);
  if (const TensorRef* freqs = f.find("rope_freqs.weight")) {
    if (freqs->dtype != DType::kF32 || freqs->n_elements() != rot_dim / 2) {
      return Error{freqs->file + ": tensor 'rope_freqs.weight' must be F32 [" + std::to_string(rot_dim / 2) + "]"};
    }
    const float* d = reinterpret_cast<const float*>(freqs->data);
    for (int64_t i = 0; i < rot_dim / 2; ++i) rope_.inv_freq[static_cast<size_t>(i)] /= d[i];
    rope_.ggml_freq_divisor.assign(d, d + rot_dim / 2);
  }
  if (f.format == ModelFormat::kGguf && cfg_.rope_scaling.type == RopeScaling::Type::kNone) {
    rope_.ggml_theta_scale = std::pow(cfg_.rope_theta, -2.0f / static_cast<float>(rot_dim));
  }
  std::vector<float> host(static_cast<size_t>(rot_dim), 0.0f);
  std::copy(rope_.inv_freq.begin(), rope_.inv_freq.end(), host.begin());
  std::copy(rope_.ggml_freq_divisor.begin(), rope_.ggml_freq_divisor.end(), host.begin() + rot_dim / 2);
  RILL_ASSIGN_OR_RETURN(rope_buf_, DeviceBuffer::allocate(host.size() * sizeof(float), "the RoPE table"));
  if (cudaError_t e = cudaMemcpy(rope_buf_.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
      e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "uploading the RoPE table")};
  }
  return Status::Ok();
}

Status LlamaCudaModel::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(compute(batch));
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  if (n_sample > 0) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(logits, logits_, static_cast<size_t>(n_sample * V_) * sizeof(float),
                                    cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  return ctx_->synchronize();
}

Status LlamaCudaModel::forward_greedy(const Batch& batch, int32_t* ids) {
  if (batch.n_tokens() <= 0) return {};
  RILL_TRY(compute(batch));
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  if (n_sample > 0) {
    cuda::argmax_rows(logits_, n_sample, V_, ids_dev_, ctx_->stream());
    RILL_CUDA_CHECK(cudaMemcpyAsync(ids_host_.data(), ids_dev_, static_cast<size_t>(n_sample) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  RILL_TRY(ctx_->synchronize());
  std::memcpy(ids, ids_host_.data(), static_cast<size_t>(n_sample) * sizeof(int32_t));
  return Status::Ok();
}

Status LlamaCudaModel::compute(const Batch& batch) {
  const int64_t n = batch.n_tokens();
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = V_;
  lim.block_size = block_size_;
  lim.n_blocks = n_blocks_;
  lim.window = cfg_.sliding_window;
  RILL_TRY(check_batch(batch, lim));
  if (batch.block_table.size() + 1 > table_cap_) {
    return Error{"batch block tables hold " + std::to_string(batch.block_table.size()) + " entries, more than the " +
                 std::to_string(table_cap_ - 1) + " the CUDA model planned for"};
  }
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  const auto n_seqs = static_cast<int32_t>(batch.seqs.size());

  // Host: the step's index arrays.
  StepMeta& mh = meta_host_;
  std::memcpy(mh.ids, batch.token_ids.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.pos, batch.positions.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.seq_of, batch.seq_index.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.sample_rows, batch.sample_rows.data(), static_cast<size_t>(n_sample) * 4);
  std::memcpy(mh.tables, batch.block_table.data(), batch.block_table.size() * 4);
  Appender<int32_t> decode{mh.decode_tokens};
  Appender<cuda::PrefillTile> tiles{mh.tiles};
  int32_t max_decode_len = 0;
  bool decode_only = n_sample == n;
  const int32_t tile_q = cuda::prefill_tile_q(kv_dtype_, static_cast<int32_t>(hd_));
  for (int32_t s = 0; s < n_seqs; ++s) {
    const BatchSeq& q = batch.seqs[static_cast<size_t>(s)];
    mh.table_start[s] = q.table_start;
    const int32_t* table = batch.block_table.data() + q.table_start;
    for (int32_t i = q.q_start; i < q.q_start + q.q_len; ++i) {
      const int32_t p = batch.positions[static_cast<size_t>(i)];
      mh.slots[i] = table[p >> block_shift_] * block_size_ + (p & (block_size_ - 1));
    }
    cuda::route_attention(s, q.q_start, q.q_len, tile_q, decode, tiles);
    if (q.q_len <= cuda::kDecodeMaxQ) max_decode_len = std::max(max_decode_len, q.kv_len);
    decode_only = decode_only && q.q_len == 1;
  }

  // Decode-only steps: pad to a bucket and replay that bucket's graph. The
  // padding rows are one dummy sequence at position 0 in the scratch block.
  int64_t n_run = n;
  int32_t split_bucket = 0;
  if (decode_only && use_graphs_) {
    n_run = n <= 8 ? n : n <= 128 ? (n + 15) / 16 * 16 : (n + 31) / 32 * 32;
    n_run = std::min<int64_t>(n_run, max_seqs_);
    split_bucket = 1;
    while (split_bucket < cuda::decode_splits(max_decode_len)) split_bucket *= 2;
    max_decode_len = split_bucket * cuda::kSplitKeys;  // the kernel's grid: split_bucket splits
    if (n_run > n) {
      const auto pad_table = static_cast<int32_t>(batch.block_table.size());
      mh.tables[pad_table] = n_blocks_;
      mh.table_start[n_seqs] = pad_table;
      for (int64_t i = n; i < n_run; ++i) {
        mh.ids[i] = 0;
        mh.pos[i] = 0;
        mh.slots[i] = n_blocks_ * block_size_;
        mh.seq_of[i] = n_seqs;
        mh.sample_rows[i] = static_cast<int32_t>(i);
        decode.push_back(static_cast<int32_t>(i));
      }
    }
  }
  const size_t n_table = batch.block_table.size() + (n_run > n ? 1 : 0);
  const size_t meta_bytes = reinterpret_cast<const uint8_t*>(mh.tables + n_table) -
                            static_cast<const uint8_t*>(meta_host_buf_.data());
  cudaStream_t st = ctx_->stream();
  RILL_CUDA_CHECK(cudaMemcpyAsync(meta_dev_buf_.data(), meta_host_buf_.data(), meta_bytes, cudaMemcpyHostToDevice, st));

  if (split_bucket == 0) return run_layers(n, n_sample, decode.n, max_decode_len, tiles.n);
  Graph& g = graphs_[static_cast<uint32_t>(n_run) << 8 | static_cast<uint32_t>(split_bucket)];
  if (g.exec) {
    if (cudaError_t e = cudaGraphLaunch(g.exec, st); e != cudaSuccess) return Error{cuda::cuda_error_text(e, "cudaGraphLaunch")};
    return Status::Ok();
  }
  if (!g.seen) {
    g.seen = true;
    return run_layers(n_run, n_run, decode.n, max_decode_len, 0);
  }
  cudaGraph_t graph = nullptr;
  if (cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "cudaStreamBeginCapture")};
  }
  const Status run = run_layers(n_run, n_run, decode.n, max_decode_len, 0);
  const cudaError_t end = cudaStreamEndCapture(st, &graph);
  if (!run.ok()) return run;
  if (end != cudaSuccess) return Error{cuda::cuda_error_text(end, "cudaStreamEndCapture")};
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) return Error{cuda::cuda_error_text(inst, "cudaGraphInstantiate")};
  if (cudaError_t e = cudaGraphLaunch(g.exec, st); e != cudaSuccess) return Error{cuda::cuda_error_text(e, "cudaGraphLaunch")};
  return Status::Ok();
}

// Every kernel of the step over device metadata already uploaded: n tokens,
// logits_ for the first n_sample entries of sample_rows.
Status LlamaCudaModel::run_layers(int64_t n, int64_t n_sample, int32_t n_decode, int32_t max_decode_len,
                                  int32_t n_tiles) {
  cudaStream_t st = ctx_->stream();
  const StepMeta& md = meta_dev_;
  cuda::embed_rows_any(embed_.dtype, embed_.data, E_, md.ids, n, x_, st);
  cuda::RopeKvArgs rk;
  rk.qkv = qkv_;
  rk.n_tokens = n;
  rk.qkv_stride = QKV_;
  rk.n_head = static_cast<int32_t>(cfg_.n_head);
  rk.n_head_kv = static_cast<int32_t>(cfg_.n_head_kv);
  rk.head_dim = static_cast<int32_t>(hd_);
  rk.positions = md.pos;
  rk.slots = md.slots;
  rk.norm_eps = cfg_.rms_norm_eps;
  rk.inv_freq = rope_buf_.as<float>();
  rk.freq_divisor = rope_.ggml_freq_divisor.empty() ? nullptr : rope_buf_.as<float>() + rope_.rot_dim / 2;
  rk.rot_dim = static_cast<int32_t>(rope_.rot_dim);
  rk.interleaved = rope_.interleaved;
  rk.attn_factor = rope_.attn_factor;
  rk.ggml_theta_scale = rope_.ggml_theta_scale;
  rk.kv_dtype = kv_dtype_;
  cuda::AttentionArgs at;
  at.q = qkv_;
  at.q_stride = QKV_;
  at.n_head = rk.n_head;
  at.n_head_kv = rk.n_head_kv;
  at.head_dim = rk.head_dim;
  at.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  at.window = static_cast<int32_t>(cfg_.sliding_window);
  at.kv_dtype = kv_dtype_;
  at.block_shift = block_shift_;
  at.block_tables = md.tables;
  at.table_start = md.table_start;
  at.seq_of = md.seq_of;
  at.pos = md.pos;
  at.decode_tokens = md.decode_tokens;
  at.n_decode = n_decode;
  at.max_decode_len = max_decode_len;
  at.partial = partial_;
  at.split_counts = use_split_merge_ ? split_counts_ : nullptr;
  at.tiles = md.tiles;
  at.n_tiles = n_tiles;
  at.out_dtype = act_;
  at.out = attn_;
  at.general_decode = general_decode_;

  const float eps = cfg_.rms_norm_eps;
  for (const DevLayer& L : layers_) {
    cuda::rms_norm(x_, E_, nullptr, L.attn_norm, n, E_, eps, 0.0f, act_, h_, st);
    RILL_TRY(matmul(L.wqkv, h_, n, QKV_, E_, qkv_, false));
    if (L.bqkv) cuda::add_bias(qkv_, L.bqkv, n, QKV_, st);
    rk.q_norm = L.q_norm;
    rk.k_norm = L.k_norm;
    rk.k_cache = L.k_cache;
    rk.v_cache = L.v_cache;
    cuda::rope_store_kv(rk, st);
    at.k_cache = L.k_cache;
    at.v_cache = L.v_cache;
    cuda::attention(at, st);
    RILL_TRY(matmul(L.wo, attn_, n, E_, Q_, x_, true));
    if (L.bo) cuda::add_bias(x_, L.bo, n, E_, st);
    cuda::rms_norm(x_, E_, nullptr, L.ffn_norm, n, E_, eps, 0.0f, act_, h_, st);
    RILL_TRY(matmul(L.w_gate_up, h_, n, 2 * F_, E_, gu_, false));
    cuda::silu_mul(gu_, n, F_, act_, mlp_, st);
    RILL_TRY(matmul(L.w_down, mlp_, n, E_, F_, x_, true));
  }
  if (n_sample > 0) {
    cuda::rms_norm(x_, E_, md.sample_rows, final_norm_, n_sample, E_, eps, 0.0f, act_, final_, st);
    RILL_TRY(matmul(lm_head_, final_, n_sample, V_, E_, logits_, false));
  }
  return Status::Ok();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

Result<std::unique_ptr<Model>> create_llama_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
#if RILL_HAVE_CUDA
  auto model = std::make_unique<LlamaCudaModel>(std::move(files));
  RILL_TRY(model->init(options));
  return std::unique_ptr<Model>(std::move(model));
#else
  (void)files;
  (void)options;
  return Error{"this rill was built without CUDA (configure with -DRILL_CUDA=ON where nvcc is installed)"};
#endif
}

}  // namespace rill
