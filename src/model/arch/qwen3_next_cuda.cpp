// The hybrid gated-DeltaNet family (Qwen3.5, qwen3_5_text; Qwen3-Next,
// qwen3_next, whose FFN is a mixture of experts with a shared expert) on a
// CUDA device: the graph of qwen3_next.cpp over the CUDA plumbing of
// cuda_model_base.h and the kernels of backend/cuda/gated_delta.h. Against
// the CPU model:
//  - linear-attention layers: one matmul for every in-projection, the
//    weight rows in the order [q | k | v | z | b | a] (Qwen3.5 uploads its
//    four tensors end to end; Qwen3-Next's per-key-head groups are
//    reordered at upload), so the layer reads one [T, P] f32 row per token;
//  - gated attention: q_proj's per-head [query | gate] rows are split at
//    upload into [q heads | k | v | gate heads], so RoPE + the (1 + w) q/k
//    norms + the K/V store run as for qwen3 on the first Q + 2 KV columns,
//    attention writes f32 and one kernel applies sigmoid(gate);
//  - o_proj, out_proj and down_proj accumulate into the f32 residual, and so
//    does Qwen3-Next's MoE FFN (model/cuda_moe.h, shared expert included);
//  - KV spec {full(), recurrent()} as the CPU: group 0's blocks hold only
//    the attention layers' K/V planes (n_kv_layers_), the recurrent states
//    live in a device pool sized at load (live slots, checkpoints, one
//    scratch state for the padding rows of decode graphs);
//  - each step uploads its sequences' state ids (prepare_step): a sequence
//    starts from zeros at position 0, from a checkpoint when the Batch asks
//    for a restore, else from its slot, and the kernels read that source and
//    write the slot, so a reset or restore costs no extra copy; checkpoints
//    are written by the kernels at the saved positions. Decode steps,
//    restores and saves included, replay CUDA graphs like the other families.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "model/arch/families.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/gated_delta.h"
#include "model/arch/qwen3_next_config.h"
#include "model/cuda_model_base.h"
#include "model/cuda_moe.h"
#include "model/layers.h"
#include "model/moe.h"
#endif

namespace rill {

#if RILL_HAVE_CUDA
namespace {

struct DevLayer {
  bool linear = false;
  int64_t index = 0;                 // among the linear layers (state) or the attention layers (KV plane)
  const float* in_norm = nullptr;    // [E], (1 + w)
  const float* post_norm = nullptr;  // [E], (1 + w)
  // linear attention
  cuda::DeviceWeight w_in;          // [P, E]: q|k|v (conv_dim), z (vd), b, a (nv each)
  const float* conv_w = nullptr;    // [conv_dim, K]
  const float* neg_a = nullptr;     // [nv] -exp(A_log)
  const float* dt_bias = nullptr;   // [nv]
  const float* gdn_norm = nullptr;  // [dv], plain weight
  cuda::DeviceWeight w_out;         // [E, vd]
  float gdn_eps = 1e-6f;
  // gated attention
  cuda::DeviceWeight w_qkvg;      // [Q + 2 KV + Q, E]: q heads | k | v | gate heads
  const float* q_norm = nullptr;  // [hd], (1 + w)
  const float* k_norm = nullptr;
  cuda::DeviceWeight w_o;  // [E, Q]
  // dense FFN
  cuda::DeviceWeight w_gate_up;       // [2F, E]
  cuda::DeviceWeight w_down;          // [E, F]
  std::optional<CudaMoeWeights> moe;  // Qwen3-Next's MoE layers, instead of w_gate_up / w_down
};

// Rows [r0, r0 + n) of w (packed rows) appended to out.
void append_rows(const WeightView& w, int64_t r0, int64_t n, std::vector<uint8_t>& out) {
  const size_t rb = row_bytes(w.dtype, w.n_cols);
  const size_t stride = w.row_stride > 0 ? w.row_stride : rb;
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r0 + n; ++r) out.insert(out.end(), src + r * stride, src + r * stride + rb);
}

class Qwen3NextCudaModel final : public CudaModelBase {
 public:
  explicit Qwen3NextCudaModel(std::shared_ptr<const ModelFiles> files) : CudaModelBase(std::move(files)) {}
  Status init(const ModelOptions& options);

  int32_t n_state_slots() const override { return n_slots_; }
  int32_t n_state_checkpoints() const override { return n_ckpt_; }
  size_t state_bytes() const override { return static_cast<size_t>(state_floats_) * sizeof(float); }
  // State export (as the CPU model): per linear layer its conv window
  // [conv_dim, K-1], then its delta state [n_v_heads, dk, dv], f32.
  std::vector<std::vector<StateTensor>> state_layers() const override {
    const GatedDeltaDims& d = hybrid_.gdn;
    const std::vector<StateTensor> one = {{"conv", {d.conv_dim(), d.conv_kernel - 1}},
                                          {"delta", {d.n_v_heads, d.head_k_dim, d.head_v_dim}}};
    return std::vector<std::vector<StateTensor>>(static_cast<size_t>(n_linear_), one);
  }
  Status copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const override;
  Status copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) override;
  // The recurrence's sums' order depends on its value columns per warp.
  std::string kv_numerics() const override {
    return CudaModelBase::kv_numerics() + " gdn-columns=" + std::to_string(gdn_columns_);
  }

 private:
  void carve_activations(cuda::Arena& a) override;
  Status prepare_step(const Batch& batch, int64_t n_run) override;
  Status run_layers(const Step& s) override;
  Status upload_weights();
  Status create_states(const ModelOptions& options);
  float* layer_states(int64_t layer) const { return states_.as<float>() + layer * layer_floats_; }
  Status check_state(int32_t checkpoint, int64_t layer) const {
    if (checkpoint < 0 || checkpoint >= n_ckpt_ || layer < 0 || layer >= n_linear_) {
      return Error{"recurrent state of checkpoint " + std::to_string(checkpoint) + " layer " + std::to_string(layer) +
                   " does not exist"};
    }
    return Status::Ok();
  }

  HybridConfig hybrid_;
  int64_t n_linear_ = 0, n_attn_ = 0;
  int32_t gdn_columns_ = 8;  // value columns per warp of the recurrence, fixed at load
  int64_t P_ = 0;            // linear layers' projection row: conv_dim + vd + 2 nv
  int64_t QKVG_ = 0;         // attention layers': Q + 2 KV + Q
  cuda::DeviceBuffer weights_;
  cuda::DeviceWeight embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  DeviceRope rope_;
  bool has_dense_ffn_ = true;  // some layer has the dense FFN (gu_, mlp_)
  CudaMoe moe_;                // the MoE layers' scratch

  // Recurrent states: ids [0, n_slots_) live, then n_ckpt_ checkpoints, then the scratch.
  cuda::DeviceBuffer states_;
  int32_t n_slots_ = 0, n_ckpt_ = 0;
  int64_t layer_floats_ = 0, state_floats_ = 0;  // one layer's conv + delta; all layers'
  // The step's sequences as the kernels see them (pinned host and device copies).
  cuda::PinnedBuffer step_host_;
  cuda::DeviceBuffer step_dev_;
  cuda::GdnSeq* seqs_host_ = nullptr;
  cuda::GdnSave* saves_host_ = nullptr;
  int32_t* tok_seq_host_ = nullptr;
  cuda::GdnSeq* seqs_dev_ = nullptr;
  cuda::GdnSave* saves_dev_ = nullptr;
  int32_t* tok_seq_dev_ = nullptr;
  int32_t n_step_seqs_ = 0;

  float* x_ = nullptr;       // [T, E] residual stream
  void* h_ = nullptr;        // [T, E] act: normed
  float* proj_ = nullptr;    // [T, max(P, QKVG)] in-projections
  float* mixed_ = nullptr;   // [T, conv_dim] q'|k'|v
  float* g_ = nullptr;       // [T, nv]
  float* beta_ = nullptr;    // [T, nv]
  float* core_ = nullptr;    // [T, vd]
  float* attn_ = nullptr;    // [T, Q] attention output, f32
  void* mix_act_ = nullptr;  // [T, max(vd, Q)] act: input of out_proj / o_proj
  float* gu_ = nullptr;      // [T, 2F]
  void* mlp_ = nullptr;      // [T, F] act
  void* final_ = nullptr;    // [S, E] act
};

Status Qwen3NextCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(read_dims());
  RILL_ASSIGN_OR_RETURN(hybrid_, read_hybrid_config(cfg_, f.path + "/config.json"));
  const GatedDeltaDims& d = hybrid_.gdn;
  if (!cuda::gdn_supported(static_cast<int32_t>(d.n_k_heads), static_cast<int32_t>(d.n_v_heads),
                           static_cast<int32_t>(d.head_k_dim), static_cast<int32_t>(d.head_v_dim),
                           static_cast<int32_t>(d.conv_kernel))) {
    return Error{f.path +
                 ": the CUDA gated DeltaNet takes key/value head dims up to 512 (value dims a multiple "
                 "of 8, an even key width, conv channels a multiple of 4) and conv kernels of 2 to 8"};
  }
  gdn_columns_ = cuda::gdn_columns();
  P_ = d.conv_dim() + d.value_dim() + 2 * d.n_v_heads;
  QKVG_ = 2 * Q_ + 2 * KV_;
  RILL_TRY(create_context());
  RILL_TRY(upload_weights());
  if (n_attn_ == 0 || n_linear_ == 0) {
    return Error{f.path + ": a hybrid model needs both linear_attention and full_attention layers"};
  }
  const int64_t rot_dim = cfg_.rope_dim > 0 ? cfg_.rope_dim : hd_;
  if (rot_dim > hd_ || rot_dim % 2 != 0 || cfg_.rope_scaling.type != RopeScaling::Type::kNone) {
    return Error{f.path + ": rotary dimension " + std::to_string(rot_dim) +
                 " must be even and at most head_dim, without rope scaling"};
  }
  RILL_ASSIGN_OR_RETURN(rope_, DeviceRope::upload(cpu::make_rope_table(cfg_.rope_theta, rot_dim, false)));
  kv_spec_ = {full(), recurrent()};
  n_kv_layers_ = n_attn_;
  RILL_TRY(create_states(options));  // before the KV pool, which takes what memory is left
  return init_runtime(options);
}

// Live slots as the CPU model: at least max_batch_seqs and n_kv_slots;
// checkpoints as many as live slots unless the options say.
Status Qwen3NextCudaModel::create_states(const ModelOptions& options) {
  const GatedDeltaDims& d = hybrid_.gdn;
  const int max_tokens = std::max(1, options.max_batch_tokens);
  const int max_seqs = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens) : max_tokens;
  n_slots_ = std::max(max_seqs, std::max(1, options.n_kv_slots));
  n_ckpt_ = options.n_state_checkpoints < 0 ? n_slots_ : options.n_state_checkpoints;
  layer_floats_ = d.conv_state_floats() + d.delta_state_floats();
  state_floats_ = n_linear_ * layer_floats_;
  const size_t n_states = static_cast<size_t>(n_slots_) + static_cast<size_t>(n_ckpt_) + 1;  // + the scratch
  RILL_ASSIGN_OR_RETURN(states_,
                        cuda::DeviceBuffer::allocate(n_states * state_bytes(),
                                                     "the recurrent states (" + std::to_string(n_slots_) + " slots + " +
                                                         std::to_string(n_ckpt_) + " checkpoints of " +
                                                         std::to_string(state_bytes() >> 10) + " KiB)"));

  // Step indices: seqs and saves are at most one per token, tok_seq one per token.
  const auto T = static_cast<size_t>(max_tokens);
  auto carve = [&](cuda::Arena& a, bool host) {
    auto* s = a.take<cuda::GdnSeq>(T);
    auto* v = a.take<cuda::GdnSave>(T);
    auto* t = a.take<int32_t>(T);
    if (host) {
      seqs_host_ = s, saves_host_ = v, tok_seq_host_ = t;
    } else {
      seqs_dev_ = s, saves_dev_ = v, tok_seq_dev_ = t;
    }
  };
  cuda::Arena sizing;
  carve(sizing, true);
  RILL_ASSIGN_OR_RETURN(step_host_, cuda::PinnedBuffer::allocate(sizing.used(), "recurrent step indices"));
  RILL_ASSIGN_OR_RETURN(step_dev_, cuda::DeviceBuffer::allocate(sizing.used(), "recurrent step indices"));
  cuda::Arena host(step_host_.data()), dev(step_dev_.data());
  carve(host, true);
  carve(dev, false);
  return Status::Ok();
}

void Qwen3NextCudaModel::carve_activations(cuda::Arena& a) {
  const GatedDeltaDims& d = hybrid_.gdn;
  const auto T = static_cast<size_t>(max_batch_tokens()), S = static_cast<size_t>(max_batch_seqs());
  const size_t as = cuda_dtype_size(act_);
  x_ = a.take<float>(T * E_);
  h_ = a.take<uint8_t>(T * E_ * as);
  proj_ = a.take<float>(T * static_cast<size_t>(std::max(P_, QKVG_)));
  mixed_ = a.take<float>(T * d.conv_dim());
  g_ = a.take<float>(T * d.n_v_heads);
  beta_ = a.take<float>(T * d.n_v_heads);
  core_ = a.take<float>(T * d.value_dim());
  attn_ = a.take<float>(T * Q_);
  mix_act_ = a.take<uint8_t>(T * static_cast<size_t>(std::max(d.value_dim(), Q_)) * as);
  const size_t F = has_dense_ffn_ ? static_cast<size_t>(F_) : 0;
  gu_ = a.take<float>(T * 2 * F);
  mlp_ = a.take<uint8_t>(T * F * as);
  final_ = a.take<uint8_t>(S * E_ * as);
  if (cfg_.n_expert > 0) moe_.carve(a, max_batch_tokens());
}

// Weights in one device buffer (WeightUpload): the reordered in-projection
// and q/gate rows are assembled on the host first (kept until the upload).
Status Qwen3NextCudaModel::upload_weights() {
  const ModelFiles& f = *files_;
  const GatedDeltaDims& d = hybrid_.gdn;
  const std::string root = hybrid_tensor_root(f);
  struct HostLayer {
    std::vector<float> in_norm, post_norm, q_norm, k_norm;
    GatedDeltaNet gdn;
    WeightView w_in, w_qkvg;  // the fused in-projection (Qwen3.5: null, cat of gdn's four)
    Linear q, k, v, o, gate, up, down;
    std::optional<MoeFfn> moe;  // host views of an MoE layer's weights
  };
  std::vector<std::vector<uint8_t>> assembled;  // host rows of reordered matrices
  std::vector<HostLayer> hl(static_cast<size_t>(cfg_.n_layer));
  RILL_ASSIGN_OR_RETURN(WeightView embed, bind_matrix(f, root + "embed_tokens.weight", V_, E_));
  const bool tied = !f.find("lm_head.weight");
  WeightView lm_head = embed;
  if (!tied) {
    RILL_ASSIGN_OR_RETURN(lm_head, bind_matrix(f, "lm_head.weight", V_, E_));
  }
  RILL_ASSIGN_OR_RETURN(std::vector<float> final_norm, load_vector(f, root + "norm.weight", E_));
  layers_.resize(hl.size());
  std::vector<const WeightView*> mats;
  for (size_t il = 0; il < hl.size(); ++il) {
    const std::string p = root + "layers." + std::to_string(il) + ".";
    HostLayer& h = hl[il];
    DevLayer& L = layers_[il];
    L.linear = hybrid_.is_linear[il] != 0;
    L.index = L.linear ? n_linear_++ : n_attn_++;
    RILL_ASSIGN_OR_RETURN(h.in_norm, load_vector(f, p + "input_layernorm.weight", E_));
    RILL_ASSIGN_OR_RETURN(h.post_norm, load_vector(f, p + "post_attention_layernorm.weight", E_));
    if (L.linear) {
      RILL_ASSIGN_OR_RETURN(h.gdn, bind_gated_delta_net(f, p + "linear_attn.", d, E_, cfg_.rms_norm_eps));
      if (h.gdn.fused) {  // per key head g: [q | k | v (r dv) | z (r dv)] and [b (r) | a (r)]
        const WeightView &qkvz = h.gdn.qkvz.w, &ba = h.gdn.ba.w;
        if (qkvz.dtype != ba.dtype)
          return Error{f.path + ": " + p + "linear_attn in_proj_qkvz and in_proj_ba differ in dtype"};
        const int64_t dk = d.head_k_dim, r = d.n_v_heads / d.n_k_heads, rdv = r * d.head_v_dim;
        const int64_t group = 2 * dk + 2 * rdv;
        std::vector<uint8_t>& buf = assembled.emplace_back();
        for (int64_t part : {int64_t{0}, dk, 2 * dk, 2 * dk + rdv}) {  // q, k, v, z of every group
          const int64_t n = part < 2 * dk ? dk : rdv;
          for (int64_t g = 0; g < d.n_k_heads; ++g) append_rows(qkvz, g * group + part, n, buf);
        }
        for (int64_t part : {int64_t{0}, r}) {  // b, a
          for (int64_t g = 0; g < d.n_k_heads; ++g) append_rows(ba, g * 2 * r + part, r, buf);
        }
        h.w_in = {qkvz.dtype, P_, E_, buf.data(), row_bytes(qkvz.dtype, E_)};
      }
    } else {
      RILL_ASSIGN_OR_RETURN(h.q, bind_linear(f, p + "self_attn.q_proj", 2 * Q_, E_));
      RILL_ASSIGN_OR_RETURN(h.k, bind_linear(f, p + "self_attn.k_proj", KV_, E_));
      RILL_ASSIGN_OR_RETURN(h.v, bind_linear(f, p + "self_attn.v_proj", KV_, E_));
      RILL_ASSIGN_OR_RETURN(h.o, bind_linear(f, p + "self_attn.o_proj", E_, Q_));
      RILL_ASSIGN_OR_RETURN(h.q_norm, load_vector(f, p + "self_attn.q_norm.weight", hd_));
      RILL_ASSIGN_OR_RETURN(h.k_norm, load_vector(f, p + "self_attn.k_norm.weight", hd_));
      if (h.q.w.dtype != h.k.w.dtype || h.q.w.dtype != h.v.w.dtype) {
        return Error{f.path + ": " + p + "self_attn q/k/v projections differ in dtype"};
      }
      std::vector<uint8_t>& buf = assembled.emplace_back();
      for (int64_t hh = 0; hh < cfg_.n_head; ++hh) append_rows(h.q.w, hh * 2 * hd_, hd_, buf);
      append_rows(h.k.w, 0, KV_, buf);
      append_rows(h.v.w, 0, KV_, buf);
      for (int64_t hh = 0; hh < cfg_.n_head; ++hh) append_rows(h.q.w, hh * 2 * hd_ + hd_, hd_, buf);
      h.w_qkvg = {h.q.w.dtype, QKVG_, E_, buf.data(), row_bytes(h.q.w.dtype, E_)};
    }
    if (is_moe_layer(cfg_, static_cast<int64_t>(il))) {
      RILL_ASSIGN_OR_RETURN(h.moe, MoeFfn::bind(f, p + "mlp.", moe_params(cfg_)));
    } else {
      RILL_ASSIGN_OR_RETURN(h.gate, bind_linear(f, p + "mlp.gate_proj", F_, E_));
      RILL_ASSIGN_OR_RETURN(h.up, bind_linear(f, p + "mlp.up_proj", F_, E_));
      RILL_ASSIGN_OR_RETURN(h.down, bind_linear(f, p + "mlp.down_proj", E_, F_));
    }
    if (L.linear) {
      mats.push_back(h.gdn.fused ? &h.w_in : &h.gdn.qkv.w);
      mats.push_back(&h.gdn.out.w);
    } else {
      mats.push_back(&h.w_qkvg);
      mats.push_back(&h.o.w);
    }
    if (h.moe) {
      h.moe->collect_weights(&mats);
    } else {
      for (const Linear* l : {&h.gate, &h.up, &h.down}) mats.push_back(&l->w);
    }
  }
  has_dense_ffn_ = std::any_of(hl.begin(), hl.end(), [](const HostLayer& h) { return !h.moe; });
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, mats, embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU model: f32 checkpoints keep f32 KV

  WeightUpload up(act_);
  const size_t embed_off = up.mat(embed);
  const size_t lm_off = tied ? embed_off : up.mat(lm_head);
  const size_t final_off = up.vec(std::move(final_norm));
  struct Offs {
    size_t in_norm, post_norm, w_in, conv_w, neg_a, dt_bias, gdn_norm, w_out, w_qkvg, q_norm, k_norm, w_o, wgu, wdown;
    std::optional<CudaMoePlacement> moe;
  };
  std::vector<Offs> offs(hl.size());
  for (size_t il = 0; il < hl.size(); ++il) {
    HostLayer& h = hl[il];
    Offs& o = offs[il];
    o.in_norm = up.vec(std::move(h.in_norm));
    o.post_norm = up.vec(std::move(h.post_norm));
    if (layers_[il].linear) {
      GatedDeltaNet& g = h.gdn;
      o.w_in = g.fused ? up.mat(h.w_in) : up.cat({&g.qkv.w, &g.z.w, &g.b.w, &g.a.w});
      o.conv_w = up.vec(std::move(g.conv_w));
      o.neg_a = up.vec(std::move(g.neg_a));
      o.dt_bias = up.vec(std::move(g.dt_bias));
      o.gdn_norm = up.vec(std::move(g.norm_w));
      o.w_out = up.mat(g.out.w);
    } else {
      o.w_qkvg = up.mat(h.w_qkvg);
      o.q_norm = up.vec(std::move(h.q_norm));
      o.k_norm = up.vec(std::move(h.k_norm));
      o.w_o = up.mat(h.o.w);
    }
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
  for (size_t il = 0; il < hl.size(); ++il) {
    const Offs& o = offs[il];
    DevLayer& L = layers_[il];
    L.in_norm = up.f32(o.in_norm);
    L.post_norm = up.f32(o.post_norm);
    if (L.linear) {
      L.w_in = up.layer_weight(o.w_in, P_ * E_);
      L.conv_w = up.f32(o.conv_w);
      L.neg_a = up.f32(o.neg_a);
      L.dt_bias = up.f32(o.dt_bias);
      L.gdn_norm = up.f32(o.gdn_norm);
      L.w_out = up.layer_weight(o.w_out, E_ * d.value_dim());
      L.gdn_eps = hl[il].gdn.eps;
    } else {
      L.w_qkvg = up.layer_weight(o.w_qkvg, QKVG_ * E_);
      L.q_norm = up.f32(o.q_norm);
      L.k_norm = up.f32(o.k_norm);
      L.w_o = up.layer_weight(o.w_o, E_ * Q_);
    }
    if (o.moe) {
      L.moe = o.moe->resolve(up);
      continue;
    }
    L.w_gate_up = up.layer_weight(o.wgu, 2 * F_ * E_);
    L.w_down = up.layer_weight(o.wdown, E_ * F_);
  }
  if (cfg_.n_expert > 0) RILL_TRY(moe_.init(moe_params(cfg_), act_, f.path));
  quant_max_elems_ = up.quant_max_elems();
  weights_ = up.take_buffer();
  return Status::Ok();
}

// The step's sequences for the recurrent kernels. A decode graph's padding
// rows are sequences of their own that start from zeros and end in the
// scratch state (never read).
Status Qwen3NextCudaModel::prepare_step(const Batch& batch, int64_t n_run) {
  RILL_TRY(check_batch_states(batch, n_slots_, n_ckpt_));
  const int64_t n = batch.n_tokens();
  const auto n_seqs = static_cast<int32_t>(batch.seqs.size());
  int32_t n_saves = 0;
  for (int32_t i = 0; i < n_seqs; ++i) {
    const BatchSeq& q = batch.seqs[static_cast<size_t>(i)];
    const int32_t first_pos = q.kv_len - q.q_len;
    cuda::GdnSeq& s = seqs_host_[i];
    s.q_start = q.q_start;
    s.q_len = q.q_len;
    s.src = first_pos == 0 ? -1 : q.state_restore >= 0 ? n_slots_ + q.state_restore : q.state_slot;
    s.dst = q.state_slot;
    s.save_begin = n_saves;
    while (n_saves < static_cast<int32_t>(batch.state_saves.size()) &&
           batch.state_saves[static_cast<size_t>(n_saves)].seq == i) {
      const StateSave& v = batch.state_saves[static_cast<size_t>(n_saves)];
      saves_host_[n_saves++] = {v.pos - first_pos, n_slots_ + v.checkpoint};
    }
    s.n_saves = n_saves - s.save_begin;
  }
  std::memcpy(tok_seq_host_, batch.seq_index.data(), static_cast<size_t>(n) * sizeof(int32_t));
  n_step_seqs_ = n_seqs;
  const int32_t scratch = n_slots_ + n_ckpt_;
  for (int64_t t = n; t < n_run; ++t) {
    seqs_host_[n_step_seqs_] = {static_cast<int32_t>(t), 1, -1, scratch, 0, 0};
    tok_seq_host_[t] = n_step_seqs_++;
  }
  cudaStream_t st = stream();
  RILL_CUDA_CHECK(cudaMemcpyAsync(seqs_dev_, seqs_host_, static_cast<size_t>(n_step_seqs_) * sizeof(cuda::GdnSeq),
                                  cudaMemcpyHostToDevice, st));
  RILL_CUDA_CHECK(cudaMemcpyAsync(tok_seq_dev_, tok_seq_host_, static_cast<size_t>(n_run) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st));
  if (n_saves > 0) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(saves_dev_, saves_host_, static_cast<size_t>(n_saves) * sizeof(cuda::GdnSave),
                                    cudaMemcpyHostToDevice, st));
  }
  return Status::Ok();
}

// Every kernel of the step over device metadata already uploaded.
Status Qwen3NextCudaModel::run_layers(const Step& s) {
  cudaStream_t st = stream();
  const StepMeta& md = meta();
  const GatedDeltaDims& d = hybrid_.gdn;
  const int64_t n = s.n;
  const float eps = cfg_.rms_norm_eps;
  cuda::embed_rows_any(embed_.dtype, embed_.data, E_, md.ids, n, x_, st);
  cuda::RopeKvArgs rk = rope_args(s);
  rk.qkv = proj_;
  rk.qkv_stride = QKVG_;
  rk.norm_offset = 1.0f;
  rope_.apply(rk);
  cuda::AttentionArgs at = attention_args(s);
  at.q = proj_;
  at.q_stride = QKVG_;
  at.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  at.out_dtype = DType::kF32;
  at.out = attn_;
  cuda::GdnArgs ga;
  ga.n_k_heads = static_cast<int32_t>(d.n_k_heads);
  ga.n_v_heads = static_cast<int32_t>(d.n_v_heads);
  ga.head_k_dim = static_cast<int32_t>(d.head_k_dim);
  ga.head_v_dim = static_cast<int32_t>(d.head_v_dim);
  ga.conv_kernel = static_cast<int32_t>(d.conv_kernel);
  ga.seqs = seqs_dev_;
  ga.n_seqs = n_step_seqs_;
  ga.saves = saves_dev_;
  ga.tok_seq = tok_seq_dev_;
  ga.n_tokens = n;
  ga.state_stride = state_floats_;
  ga.proj = proj_;
  ga.proj_stride = P_;
  ga.b_off = d.conv_dim() + d.value_dim();
  ga.a_off = ga.b_off + d.n_v_heads;
  ga.mixed = mixed_;
  ga.g = g_;
  ga.beta = beta_;
  ga.core = core_;
  ga.columns = gdn_columns_;

  for (const DevLayer& L : layers_) {
    cuda::rms_norm(x_, E_, nullptr, L.in_norm, n, E_, eps, 1.0f, act_, h_, st);
    if (L.linear) {
      RILL_TRY(matmul(L.w_in, h_, n, P_, E_, proj_, false));
      ga.states = layer_states(L.index);
      ga.conv_w = L.conv_w;
      ga.neg_a = L.neg_a;
      ga.dt_bias = L.dt_bias;
      cuda::gdn_conv(ga, st);
      cuda::gdn_recurrence(ga, st);
      cuda::gdn_gated_norm(core_, proj_ + d.conv_dim(), P_, L.gdn_norm, n, ga.n_v_heads, ga.head_v_dim, L.gdn_eps, act_,
                           mix_act_, st);
      RILL_TRY(matmul(L.w_out, mix_act_, n, E_, d.value_dim(), x_, true));
    } else {
      RILL_TRY(matmul(L.w_qkvg, h_, n, QKVG_, E_, proj_, false));
      rk.q_norm = L.q_norm;
      rk.k_norm = L.k_norm;
      rk.k_cache = k_cache(static_cast<size_t>(L.index));
      rk.v_cache = v_cache(static_cast<size_t>(L.index));
      cuda::rope_store_kv(rk, st);
      at.k_cache = rk.k_cache;
      at.v_cache = rk.v_cache;
      cuda::attention(at, st);
      cuda::sigmoid_gate_mul(attn_, proj_ + Q_ + 2 * KV_, QKVG_, n, Q_, act_, mix_act_, st);
      RILL_TRY(matmul(L.w_o, mix_act_, n, E_, Q_, x_, true));
    }
    cuda::rms_norm(x_, E_, nullptr, L.post_norm, n, E_, eps, 1.0f, act_, h_, st);
    if (L.moe) {
      RILL_TRY(moe_.forward(*L.moe, h_, n, s.n_tiles == 0, x_, *gemm_, st));
      continue;
    }
    RILL_TRY(matmul(L.w_gate_up, h_, n, 2 * F_, E_, gu_, false));
    cuda::silu_mul(gu_, n, F_, act_, mlp_, st);
    RILL_TRY(matmul(L.w_down, mlp_, n, E_, F_, x_, true));
  }
  if (s.n_sample > 0) {
    cuda::rms_norm(x_, E_, md.sample_rows, final_norm_, s.n_sample, E_, eps, 1.0f, act_, final_, st);
    RILL_TRY(matmul(lm_head_, final_, s.n_sample, V_, E_, logits_, false));
  }
  return Status::Ok();
}

Status Qwen3NextCudaModel::copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const {
  RILL_TRY(check_state(checkpoint, layer));
  const float* src = layer_states(layer) + static_cast<int64_t>(n_slots_ + checkpoint) * state_floats_;
  RILL_CUDA_CHECK(
      cudaMemcpyAsync(out, src, static_cast<size_t>(layer_floats_) * sizeof(float), cudaMemcpyDeviceToHost, stream()));
  return ctx_->synchronize();
}

Status Qwen3NextCudaModel::copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) {
  RILL_TRY(check_state(checkpoint, layer));
  float* dst = layer_states(layer) + static_cast<int64_t>(n_slots_ + checkpoint) * state_floats_;
  RILL_CUDA_CHECK(
      cudaMemcpyAsync(dst, in, static_cast<size_t>(layer_floats_) * sizeof(float), cudaMemcpyHostToDevice, stream()));
  return ctx_->synchronize();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

Result<std::unique_ptr<Model>> create_qwen3_next_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                            const ModelOptions& options) {
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<Qwen3NextCudaModel>(std::move(files)), options);
#else
  (void)files;
  (void)options;
  return cuda_not_built();
#endif
}

}  // namespace rill
