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
//    from the blocks, dequantize-then-GEMM for prefill); activations bf16;
//  - mixtral / qwen3_moe layers run model/cuda_moe.h's MoE FFN, which adds
//    into the residual stream like down_proj.
// The device plumbing (weight upload, arena, KV pool, step metadata, decode
// graphs) is model/cuda_model_base.h's, shared with the CUDA Gemma.
//
// As a tensor-parallel shard (create_llama_cuda_shard, model/cuda_shard.h)
// it holds its heads' q/k/v rows and o columns, its slice of gate/up rows
// and down columns and its LM head rows (tensor_split.h), and adds the
// all-reduce after o and down and the logits gather (cuda_model_base.h).
// The embedding stays whole on every rank: a step reads only its n rows,
// so a vocabulary-parallel gather would save memory (1 GB for the 8B) at
// the cost of one more all-reduce of [n, E] per step.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "model/arch/families.h"
#include "model/cuda_shard.h"

#if RILL_HAVE_CUDA
#include "model/arch/llama_weights.h"
#include "model/cuda_model_base.h"
#include "model/cuda_moe.h"
#include "model/layers.h"
#endif

namespace rill {

#if RILL_HAVE_CUDA
namespace {

struct DevLayer {
  const float* attn_norm = nullptr;  // [E]
  cuda::DeviceWeight wqkv;           // [Q + 2 KV, E] act dtype or quantized
  const float* bqkv = nullptr;       // [Q + 2 KV] or null (qwen2)
  const float* q_norm = nullptr;     // [hd] or null (qwen3)
  const float* k_norm = nullptr;
  cuda::DeviceWeight wo;              // [E, Q]
  const float* bo = nullptr;          // [E] or null
  const float* ffn_norm = nullptr;    // [E]
  cuda::DeviceWeight w_gate_up;       // [2F, E]
  cuda::DeviceWeight w_down;          // [E, F]
  std::optional<CudaMoeWeights> moe;  // MoE layers, instead of w_gate_up / w_down
};

class LlamaCudaModel final : public CudaModelBase {
 public:
  explicit LlamaCudaModel(std::shared_ptr<const ModelFiles> files, CudaShard shard = {})
      : CudaModelBase(std::move(files), shard) {}
  Status init(const ModelOptions& options);

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;
  Status upload_weights();
  Status build_rope();

  int64_t QKV_ = 0;
  cuda::DeviceBuffer weights_;
  cuda::DeviceWeight embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  DeviceRope rope_;
  bool has_dense_ffn_ = true;  // some layer has the dense FFN (gu_, mlp_)
  CudaMoe moe_;                // the MoE layers' scratch

  float* x_ = nullptr;     // [T, E] residual stream
  void* h_ = nullptr;      // [T, E] act: normed
  float* qkv_ = nullptr;   // [T, QKV]
  void* attn_ = nullptr;   // [T, Q] act
  float* gu_ = nullptr;    // [T, 2F]
  void* mlp_ = nullptr;    // [T, F] act
  void* final_ = nullptr;  // [S, E] act
};

Status LlamaCudaModel::init(const ModelOptions& options) {
  RILL_TRY(read_dims());
  QKV_ = Q_ + 2 * KV_;
  RILL_TRY(create_context());
  RILL_TRY(upload_weights());
  RILL_TRY(build_rope());
  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  return init_runtime(options);
}

void LlamaCudaModel::carve_activations(cuda::Arena& a) {
  const auto T = static_cast<size_t>(max_batch_tokens()), S = static_cast<size_t>(max_batch_seqs());
  const size_t as = cuda_dtype_size(act_);
  x_ = a.take<float>(T * E_);
  h_ = a.take<uint8_t>(T * E_ * as);
  qkv_ = a.take<float>(T * QKV_);
  attn_ = a.take<uint8_t>(T * Q_ * as);
  const size_t F = has_dense_ffn_ ? static_cast<size_t>(F_) : 0;
  gu_ = a.take<float>(T * 2 * F);
  mlp_ = a.take<uint8_t>(T * F * as);
  final_ = a.take<uint8_t>(S * E_ * as);
  if (cfg_.n_expert > 0) moe_.carve(a, max_batch_tokens());
}

// Weights in one device buffer. Matrices go in the activation dtype (the
// dtype of q_proj; others are converted on the host if they differ), norms
// and biases in f32.
Status LlamaCudaModel::upload_weights() {
  const ModelFiles& f = *files_;
  const int64_t L = cfg_.n_layer;
  RILL_ASSIGN_OR_RETURN(LlamaWeights hw, bind_llama_weights(f, LlamaDims{E_, V_, F_, hd_, Q_, KV_}));
  std::vector<LlamaLayerWeights>& hl = hw.layers;
  const WeightView embed = hw.embed;
  WeightView lm_head = hw.lm_head;
  const bool tied = hw.tied;
  std::vector<float> final_norm = std::move(hw.final_norm);
  std::vector<const WeightView*> mats;
  if (sharded()) {  // this rank's slices (views of the mapped tensors); o's bias is added after the all-reduce
    RILL_TRY(shard_llama_layers(hw, split_, ff_split_, hd_, f.path));
    lm_head = slice_rows(lm_head, split_.vocab);
    narrow_dims();
    QKV_ = Q_ + 2 * KV_;
  }
  has_dense_ffn_ = false;
  for (const LlamaLayerWeights& h : hl) {
    for (const Linear* l : {&h.q, &h.k, &h.v, &h.o}) mats.push_back(&l->w);
    if (h.moe) {
      h.moe->collect_weights(&mats);
    } else {
      for (const Linear* l : {&h.gate, &h.up, &h.down}) mats.push_back(&l->w);
      has_dense_ffn_ = true;
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, mats, embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Llama: f32 checkpoints keep f32 KV

  // Layout pass, then the copies.
  const bool has_qkv_bias = !hl[0].q.bias.empty() || !hl[0].k.bias.empty() || !hl[0].v.bias.empty();
  const bool has_o_bias = !hl[0].o.bias.empty();
  const bool has_qk_norm = !hl[0].q_norm.empty();
  WeightUpload up(act_);
  const size_t embed_off = up.mat(embed);
  const size_t lm_off = tied && !sharded() ? embed_off : up.mat(lm_head);
  const size_t final_off = up.vec(std::move(final_norm));
  struct Offs {
    size_t attn_norm, wqkv, bqkv, q_norm, k_norm, wo, bo, ffn_norm, wgu, wdown;
    std::optional<CudaMoePlacement> moe;
  };
  std::vector<Offs> offs(static_cast<size_t>(L));
  for (size_t il = 0; il < hl.size(); ++il) {
    LlamaLayerWeights& h = hl[il];
    Offs& o = offs[il];
    o.attn_norm = up.vec(std::move(h.attn_norm));
    o.wqkv = up.cat({&h.q.w, &h.k.w, &h.v.w});
    if (has_qkv_bias) {  // fused qkv biases (zeros where a part has none)
      std::vector<float> b(static_cast<size_t>(QKV_), 0.0f);
      std::copy(h.q.bias.begin(), h.q.bias.end(), b.begin());
      std::copy(h.k.bias.begin(), h.k.bias.end(), b.begin() + Q_);
      std::copy(h.v.bias.begin(), h.v.bias.end(), b.begin() + Q_ + KV_);
      o.bqkv = up.vec(std::move(b));
    }
    if (has_qk_norm) {
      o.q_norm = up.vec(std::move(h.q_norm));
      o.k_norm = up.vec(std::move(h.k_norm));
    }
    o.wo = up.mat(h.o.w);
    if (has_o_bias) o.bo = up.vec(std::move(h.o.bias));
    o.ffn_norm = up.vec(std::move(h.ffn_norm));
    if (h.moe) {
      RILL_ASSIGN_OR_RETURN(o.moe, CudaMoePlacement::place(*h.moe, up, f.path + ": layer " + std::to_string(il)));
      continue;
    }
    o.wgu = up.cat({&h.gate.w, &h.up.w});
    o.wdown = up.mat(h.down.w);
  }
  RILL_TRY(up.upload("the model weights (" + f.path + ")"));

  embed_ = up.weight(embed_off);
  lm_head_ = up.weight(lm_off);
  quant_head_ = cuda::quant_supported(lm_head_.dtype);
  final_norm_ = up.f32(final_off);
  layers_.resize(static_cast<size_t>(L));
  for (size_t il = 0; il < hl.size(); ++il) {
    const Offs& o = offs[il];
    DevLayer& d = layers_[il];
    d.attn_norm = up.f32(o.attn_norm);
    d.wqkv = up.layer_weight(o.wqkv, QKV_ * E_);
    d.bqkv = has_qkv_bias ? up.f32(o.bqkv) : nullptr;
    d.q_norm = has_qk_norm ? up.f32(o.q_norm) : nullptr;
    d.k_norm = has_qk_norm ? up.f32(o.k_norm) : nullptr;
    d.wo = up.layer_weight(o.wo, E_ * Q_);
    d.bo = has_o_bias ? up.f32(o.bo) : nullptr;
    d.ffn_norm = up.f32(o.ffn_norm);
    if (o.moe) {
      d.moe = o.moe->resolve(up);
      continue;
    }
    d.w_gate_up = up.layer_weight(o.wgu, 2 * F_ * E_);
    d.w_down = up.layer_weight(o.wdown, E_ * F_);
  }
  if (cfg_.n_expert > 0) RILL_TRY(moe_.init(moe_params(cfg_), act_, f.path));
  quant_max_elems_ = up.quant_max_elems();
  weights_ = up.take_buffer();
  return Status::Ok();
}

// The Llama RoPE table (model/arch/llama_weights.h), uploaded.
Status LlamaCudaModel::build_rope() {
  RILL_ASSIGN_OR_RETURN(cpu::RopeTable table, build_llama_rope(*files_, hd_));
  RILL_ASSIGN_OR_RETURN(rope_, DeviceRope::upload(std::move(table)));
  return Status::Ok();
}

// Every kernel of the step over device metadata already uploaded.
Status LlamaCudaModel::run_layers(const Step& s) {
  cudaStream_t st = stream();
  const StepMeta& md = meta();
  cuda::embed_rows_any(embed_.dtype, embed_.data, E_, md.ids, s.n, x_, st);
  cuda::RopeKvArgs rk = rope_args(s);
  rk.qkv = qkv_;
  rk.qkv_stride = QKV_;
  rope_.apply(rk);
  cuda::AttentionArgs at = attention_args(s);
  at.q = qkv_;
  at.q_stride = QKV_;
  at.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  at.window = static_cast<int32_t>(cfg_.sliding_window);
  at.out = attn_;

  const float eps = cfg_.rms_norm_eps;
  const int64_t n = s.n;
  for (size_t il = 0; il < layers_.size(); ++il) {
    const DevLayer& L = layers_[il];
    cuda::rms_norm(x_, E_, nullptr, L.attn_norm, n, E_, eps, 0.0f, act_, h_, st);
    RILL_TRY(matmul(L.wqkv, h_, n, QKV_, E_, qkv_, false));
    if (L.bqkv) cuda::add_bias(qkv_, L.bqkv, n, QKV_, st);
    rk.q_norm = L.q_norm;
    rk.k_norm = L.k_norm;
    rk.k_cache = k_cache(il);
    rk.v_cache = v_cache(il);
    cuda::rope_store_kv(rk, st);
    at.k_cache = rk.k_cache;
    at.v_cache = rk.v_cache;
    cuda::attention(at, st);
    RILL_TRY(matmul(L.wo, attn_, n, E_, Q_, x_, owns_residual()));
    RILL_TRY(reduce_residual(x_, n));
    if (L.bo) cuda::add_bias(x_, L.bo, n, E_, st);
    cuda::rms_norm(x_, E_, nullptr, L.ffn_norm, n, E_, eps, 0.0f, act_, h_, st);
    if (L.moe) {
      RILL_TRY(moe_.forward(*L.moe, h_, n, s.n_tiles == 0, x_, *gemm_, st));
      continue;
    }
    RILL_TRY(matmul(L.w_gate_up, h_, n, 2 * F_, E_, gu_, false));
    cuda::silu_mul(gu_, n, F_, act_, mlp_, st);
    RILL_TRY(matmul(L.w_down, mlp_, n, E_, F_, x_, owns_residual()));
    RILL_TRY(reduce_residual(x_, n));
  }
  if (s.n_sample > 0) {
    cuda::rms_norm(x_, E_, md.sample_rows, final_norm_, s.n_sample, E_, eps, 0.0f, act_, final_, st);
    RILL_TRY(lm_head(lm_head_, final_, s.n_sample));
  }
  return Status::Ok();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

Result<std::unique_ptr<Model>> create_llama_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
  if (options.tensor_parallel != 1) return create_llama_cuda_tp_model(std::move(files), options);
  return create_llama_cuda_shard(std::move(files), options, CudaShard{});
}

Result<std::unique_ptr<Model>> create_llama_cuda_shard(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options, const CudaShard& shard) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<LlamaCudaModel>(std::move(files), shard), options);
#else
  (void)files;
  (void)options;
  (void)shard;
  return cuda_not_built();
#endif
}

}  // namespace rill
