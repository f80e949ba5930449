// The Gemma family (gemma2, gemma3_text, gemma3's text model) on a CUDA
// device: the graph of gemma.cpp over the CUDA Llama's plumbing
// (model/cuda_model_base.h) and kernels. Against llama_cuda.cpp:
//  - the embedding rows are scaled by sqrt(n_embd) after the gather;
//  - RMSNorm weights are (norm_offset + w) (HF 1, GGUF 0), the q/k norms too;
//  - sandwich norms: o_proj and down_proj write a scratch row (no residual
//    accumulation in the GEMM); one kernel norms it, adds it to the residual
//    and applies the next pre-norm (post_norm_add);
//  - GeGLU (gelu_tanh(gate) * up) over the fused gate/up output;
//  - attention scale query_pre_attn_scalar^-1/2 and gemma2's logit softcap;
//    the final logits softcapped on the device (before any greedy argmax);
//  - two KV groups, as the CPU model: sliding layers read and write through
//    the sliding group's block tables (whose blocks before the window the
//    engine frees), full layers through the full group's. One pool with a
//    window per layer would keep every sliding layer's whole history
//    resident; with groups the KvManager keeps only the window's blocks.
//    Each kind has its RoPE table (gemma3: a local and a global base).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/arch/families.h"

#if RILL_HAVE_CUDA
#include "model/arch/gemma_config.h"
#include "model/cuda_model_base.h"
#include "model/layers.h"
#endif

namespace rill {

#if RILL_HAVE_CUDA
namespace {

struct DevLayer {
  bool sliding = false;
  const float* attn_norm = nullptr;  // [E]
  cuda::DeviceWeight wqkv;           // [Q + 2 KV, E] act dtype or quantized
  const float* bqkv = nullptr;       // [Q + 2 KV] or null
  const float* q_norm = nullptr;     // [hd] or null (gemma3)
  const float* k_norm = nullptr;
  cuda::DeviceWeight wo;                  // [E, Q]
  const float* bo = nullptr;              // [E] or null
  const float* post_attn_norm = nullptr;  // [E]
  const float* ffn_norm = nullptr;        // [E]
  cuda::DeviceWeight w_gate_up;           // [2F, E]
  cuda::DeviceWeight w_down;              // [E, F]
  const float* post_ffn_norm = nullptr;   // [E]
};

class GemmaCudaModel final : public CudaModelBase {
 public:
  explicit GemmaCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);

  // As the CPU Gemma: every layer keeps KV, in its group's blocks (sliding or full).
  std::vector<KvLayer> kv_layers() const override {
    std::vector<KvLayer> out = CudaModelBase::kv_layers();
    for (size_t i = 0; i < out.size(); ++i) out[i].group = layers_[i].sliding ? sliding_group_ : full_group_;
    return out;
  }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;
  Status upload_weights();

  GemmaParams params_;
  int64_t QKV_ = 0;
  float embed_scale_ = 1.0f;
  int32_t sliding_group_ = -1, full_group_ = -1;  // index into kv_spec_, -1: no such layers
  cuda::DeviceBuffer weights_;
  cuda::DeviceWeight embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  DeviceRope rope_local_, rope_global_;

  float* x_ = nullptr;     // [T, E] residual stream
  void* h_ = nullptr;      // [T, E] act: normed
  float* qkv_ = nullptr;   // [T, QKV]
  void* attn_ = nullptr;   // [T, Q] act
  float* y_ = nullptr;     // [T, E] o_proj / down_proj output before its post-norm
  float* gu_ = nullptr;    // [T, 2F]
  void* mlp_ = nullptr;    // [T, F] act
  void* final_ = nullptr;  // [S, E] act
};

Status GemmaCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(read_dims());
  if (cfg_.rope_dim > 0 && cfg_.rope_dim != hd_) {
    return Error{f.path + ": partial rotary (" + std::to_string(cfg_.rope_dim) + " of " + std::to_string(hd_) +
                 " dims) is not part of the Gemma family"};
  }
  QKV_ = Q_ + 2 * KV_;
  RILL_ASSIGN_OR_RETURN(params_, read_gemma_params(f));
  // HF multiplies by sqrt(hidden_size) in the activation dtype (f32 here).
  embed_scale_ = std::sqrt(static_cast<float>(E_));
  RILL_TRY(create_context());
  RILL_TRY(upload_weights());
  GemmaRope rope = gemma_rope_tables(f, params_, hd_);
  RILL_ASSIGN_OR_RETURN(rope_local_, DeviceRope::upload(std::move(rope.local)));
  RILL_ASSIGN_OR_RETURN(rope_global_, DeviceRope::upload(std::move(rope.global)));

  // KV groups as the CPU model: sliding first, then full (the kinds present).
  const bool any_sliding = std::any_of(layers_.begin(), layers_.end(), [](const DevLayer& L) { return L.sliding; });
  const bool any_full = std::any_of(layers_.begin(), layers_.end(), [](const DevLayer& L) { return !L.sliding; });
  if (any_sliding) {
    sliding_group_ = static_cast<int32_t>(kv_spec_.size());
    kv_spec_.push_back(sliding(static_cast<int32_t>(cfg_.sliding_window)));
  }
  if (any_full) {
    full_group_ = static_cast<int32_t>(kv_spec_.size());
    kv_spec_.push_back(full());
  }
  return init_runtime(options);
}

void GemmaCudaModel::carve_activations(cuda::Arena& a) {
  const auto T = static_cast<size_t>(max_batch_tokens()), S = static_cast<size_t>(max_batch_seqs());
  const size_t as = cuda_dtype_size(act_);
  x_ = a.take<float>(T * E_);
  h_ = a.take<uint8_t>(T * E_ * as);
  qkv_ = a.take<float>(T * QKV_);
  attn_ = a.take<uint8_t>(T * Q_ * as);
  y_ = a.take<float>(T * E_);
  gu_ = a.take<float>(T * 2 * F_);
  mlp_ = a.take<uint8_t>(T * F_ * as);
  final_ = a.take<uint8_t>(S * E_ * as);
}

// Weights in one device buffer (WeightUpload): matrices in the activation
// dtype or their quantized blocks, q/k/v and gate/up fused; norms and
// biases in f32.
Status GemmaCudaModel::upload_weights() {
  const ModelFiles& f = *files_;
  const GemmaNames names = gemma_tensor_names(f);
  std::vector<GemmaLayerWeights> hl(static_cast<size_t>(cfg_.n_layer));
  RILL_ASSIGN_OR_RETURN(WeightView embed, bind_matrix(f, names.base + "embed_tokens.weight", V_, E_));
  WeightView lm_head = embed;
  const bool tied = !f.find(names.head);
  if (!tied) {
    RILL_ASSIGN_OR_RETURN(lm_head, bind_matrix(f, names.head, V_, E_));
  }
  RILL_ASSIGN_OR_RETURN(std::vector<float> final_norm, load_vector(f, names.base + "norm.weight", E_));
  const GemmaLayerDims dims{E_, Q_, KV_, F_, hd_};
  for (size_t il = 0; il < hl.size(); ++il)
    RILL_TRY(bind_gemma_layer(f, names, static_cast<int64_t>(il), dims, hl[il]));
  std::vector<const WeightView*> mats;
  for (const GemmaLayerWeights& h : hl) {
    for (const Linear* l : {&h.q, &h.k, &h.v, &h.o, &h.gate, &h.up, &h.down}) mats.push_back(&l->w);
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, mats, embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Gemma: f32 checkpoints keep f32 KV

  WeightUpload up(act_);
  const size_t embed_off = up.mat(embed);
  const size_t lm_off = tied ? embed_off : up.mat(lm_head);
  const size_t final_off = up.vec(std::move(final_norm));
  struct Offs {
    size_t attn_norm, wqkv, bqkv, q_norm, k_norm, wo, bo, post_attn_norm, ffn_norm, wgu, wdown, post_ffn_norm;
  };
  std::vector<Offs> offs(hl.size());
  for (size_t il = 0; il < hl.size(); ++il) {
    GemmaLayerWeights& h = hl[il];
    Offs& o = offs[il];
    o.attn_norm = up.vec(std::move(h.attn_norm));
    o.wqkv = up.cat({&h.q.w, &h.k.w, &h.v.w});
    o.bqkv = SIZE_MAX;
    if (!h.q.bias.empty() || !h.k.bias.empty() || !h.v.bias.empty()) {  // zeros where a part has none
      std::vector<float> b(static_cast<size_t>(QKV_), 0.0f);
      std::copy(h.q.bias.begin(), h.q.bias.end(), b.begin());
      std::copy(h.k.bias.begin(), h.k.bias.end(), b.begin() + Q_);
      std::copy(h.v.bias.begin(), h.v.bias.end(), b.begin() + Q_ + KV_);
      o.bqkv = up.vec(std::move(b));
    }
    o.q_norm = h.q_norm.empty() ? SIZE_MAX : up.vec(std::move(h.q_norm));
    o.k_norm = h.k_norm.empty() ? SIZE_MAX : up.vec(std::move(h.k_norm));
    o.wo = up.mat(h.o.w);
    o.bo = h.o.bias.empty() ? SIZE_MAX : up.vec(std::move(h.o.bias));
    o.post_attn_norm = up.vec(std::move(h.post_attn_norm));
    o.ffn_norm = up.vec(std::move(h.ffn_norm));
    o.wgu = up.cat({&h.gate.w, &h.up.w});
    o.wdown = up.mat(h.down.w);
    o.post_ffn_norm = up.vec(std::move(h.post_ffn_norm));
  }
  RILL_TRY(up.upload("the model weights (" + f.path + ")"));

  auto optional = [&](size_t at) { return at == SIZE_MAX ? nullptr : up.f32(at); };
  embed_ = up.weight(embed_off);
  lm_head_ = up.weight(lm_off);
  quant_head_ = cuda::quant_supported(lm_head_.dtype);
  final_norm_ = up.f32(final_off);
  layers_.resize(hl.size());
  for (size_t il = 0; il < hl.size(); ++il) {
    const Offs& o = offs[il];
    DevLayer& d = layers_[il];
    d.sliding = params_.sliding[il] && cfg_.sliding_window > 0;
    d.attn_norm = up.f32(o.attn_norm);
    d.wqkv = up.layer_weight(o.wqkv, QKV_ * E_);
    d.bqkv = optional(o.bqkv);
    d.q_norm = optional(o.q_norm);
    d.k_norm = optional(o.k_norm);
    d.wo = up.layer_weight(o.wo, E_ * Q_);
    d.bo = optional(o.bo);
    d.post_attn_norm = up.f32(o.post_attn_norm);
    d.ffn_norm = up.f32(o.ffn_norm);
    d.w_gate_up = up.layer_weight(o.wgu, 2 * F_ * E_);
    d.w_down = up.layer_weight(o.wdown, E_ * F_);
    d.post_ffn_norm = up.f32(o.post_ffn_norm);
  }
  quant_max_elems_ = up.quant_max_elems();
  weights_ = up.take_buffer();
  return Status::Ok();
}

// Every kernel of the step over device metadata already uploaded. The
// residual stream x_ is f32; each layer's pre-norms come out of the
// previous post_norm_add (the first from rms_norm).
Status GemmaCudaModel::run_layers(const Step& s) {
  cudaStream_t st = stream();
  const StepMeta& md = meta();
  const int64_t n = s.n;
  const float eps = cfg_.rms_norm_eps, off = params_.norm_offset;
  cuda::embed_rows_any(embed_.dtype, embed_.data, E_, md.ids, n, x_, st);
  cuda::scale(x_, n * E_, embed_scale_, st);
  cuda::RopeKvArgs rk = rope_args(s);
  rk.qkv = qkv_;
  rk.qkv_stride = QKV_;
  rk.norm_offset = off;
  cuda::AttentionArgs at = attention_args(s);
  at.q = qkv_;
  at.q_stride = QKV_;
  at.scale = 1.0f / std::sqrt(params_.query_pre_attn_scalar);
  at.softcap = params_.attn_softcap;
  at.out = attn_;

  cuda::rms_norm(x_, E_, nullptr, layers_[0].attn_norm, n, E_, eps, off, act_, h_, st);
  for (size_t il = 0; il < layers_.size(); ++il) {
    const DevLayer& L = layers_[il];
    const int32_t group = L.sliding ? sliding_group_ : full_group_;
    RILL_TRY(matmul(L.wqkv, h_, n, QKV_, E_, qkv_, false));
    if (L.bqkv) cuda::add_bias(qkv_, L.bqkv, n, QKV_, st);
    (L.sliding ? rope_local_ : rope_global_).apply(rk);
    rk.slots = md.slots[group];
    rk.q_norm = L.q_norm;
    rk.k_norm = L.k_norm;
    rk.k_cache = k_cache(il);
    rk.v_cache = v_cache(il);
    cuda::rope_store_kv(rk, st);
    at.block_tables = md.tables[group];
    at.window = L.sliding ? static_cast<int32_t>(cfg_.sliding_window) : 0;
    at.k_cache = rk.k_cache;
    at.v_cache = rk.v_cache;
    cuda::attention(at, st);
    RILL_TRY(matmul(L.wo, attn_, n, E_, Q_, y_, false));
    if (L.bo) cuda::add_bias(y_, L.bo, n, E_, st);
    cuda::post_norm_add(y_, L.post_attn_norm, x_, L.ffn_norm, n, E_, eps, off, act_, h_, st);
    RILL_TRY(matmul(L.w_gate_up, h_, n, 2 * F_, E_, gu_, false));
    cuda::gelu_tanh_mul(gu_, n, F_, act_, mlp_, st);
    RILL_TRY(matmul(L.w_down, mlp_, n, E_, F_, y_, false));
    const float* next_norm = il + 1 < layers_.size() ? layers_[il + 1].attn_norm : nullptr;
    cuda::post_norm_add(y_, L.post_ffn_norm, x_, next_norm, n, E_, eps, off, act_, h_, st);
  }
  if (s.n_sample > 0) {
    cuda::rms_norm(x_, E_, md.sample_rows, final_norm_, s.n_sample, E_, eps, off, act_, final_, st);
    RILL_TRY(matmul(lm_head_, final_, s.n_sample, V_, E_, logits_, false));
    if (params_.final_softcap > 0) cuda::softcap(logits_, s.n_sample * V_, params_.final_softcap, st);
  }
  return Status::Ok();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

Result<std::unique_ptr<Model>> create_gemma_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<GemmaCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
