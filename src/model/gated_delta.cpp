#include "model/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace rill {

Result<RecurrentStates> RecurrentStates::create(int64_t n_layers, const GatedDeltaDims& dims, int32_t n_slots,
                                                int32_t n_checkpoints) {
  RecurrentStates s;
  s.n_slots_ = n_slots;
  s.n_checkpoints_ = n_checkpoints;
  s.conv_floats_ = dims.conv_state_floats();
  s.delta_floats_ = dims.delta_state_floats();
  s.floats_per_state_ = n_layers * (s.conv_floats_ + s.delta_floats_);
  size_t total = 0;
  if (n_layers <= 0 || n_slots <= 0 || n_checkpoints < 0 ||
      __builtin_mul_overflow(static_cast<size_t>(n_slots) + static_cast<size_t>(n_checkpoints), s.bytes_per_state(),
                             &total)) {
    return Error{"recurrent state of " + std::to_string(n_slots) + " slots + " + std::to_string(n_checkpoints) +
                 " checkpoints is too large"};
  }
  RILL_ASSIGN_OR_RETURN(s.buffer_, LazyBuffer::allocate(total));
  return s;
}

void RecurrentStates::reset(int32_t slot) const {
  std::memset(layer_base(0, slot), 0, bytes_per_state());
}

void RecurrentStates::restore(int32_t slot, int32_t checkpoint) const {
  std::memcpy(layer_base(0, slot), layer_base(0, checkpoint_id(checkpoint)), bytes_per_state());
}

Status check_batch_states(const Batch& batch, int32_t n_slots, int32_t n_checkpoints) {
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const BatchSeq& s = batch.seqs[i];
    if (s.state_slot < 0 || s.state_slot >= n_slots) {
      return Error{"batch sequence " + std::to_string(i) + " has no recurrent state slot (" +
                   std::to_string(s.state_slot) + "; the model has " + std::to_string(n_slots) + ")"};
    }
    if (s.state_restore >= n_checkpoints || s.state_restore < -1) {
      return Error{"batch sequence " + std::to_string(i) + " restores checkpoint " + std::to_string(s.state_restore) +
                   " (the model has " + std::to_string(n_checkpoints) + ")"};
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch.seqs[j].state_slot == s.state_slot) {
        return Error{"batch sequences " + std::to_string(j) + " and " + std::to_string(i) + " share state slot " +
                     std::to_string(s.state_slot)};
      }
    }
  }
  for (size_t k = 0; k < batch.state_saves.size(); ++k) {
    const StateSave& v = batch.state_saves[k];
    if (v.seq < 0 || static_cast<size_t>(v.seq) >= batch.seqs.size() || v.checkpoint < 0 ||
        v.checkpoint >= n_checkpoints) {
      return Error{"state save " + std::to_string(k) + " names sequence " + std::to_string(v.seq) + " / checkpoint " +
                   std::to_string(v.checkpoint) + ", which do not exist"};
    }
    const BatchSeq& s = batch.seqs[static_cast<size_t>(v.seq)];
    if (v.pos < s.kv_len - s.q_len || v.pos >= s.kv_len) {
      return Error{"state save " + std::to_string(k) + " at position " + std::to_string(v.pos) +
                   " is outside its sequence's step"};
    }
    if (k > 0) {
      const StateSave& u = batch.state_saves[k - 1];
      if (u.seq > v.seq || (u.seq == v.seq && u.pos >= v.pos)) {
        return Error{"state saves are not sorted by sequence and position"};
      }
    }
  }
  return Status::Ok();
}

void prepare_states(const Batch& batch, const RecurrentStates& states) {
  for (const BatchSeq& s : batch.seqs) {
    if (s.kv_len - s.q_len == 0) {
      states.reset(s.state_slot);
    } else if (s.state_restore >= 0) {
      states.restore(s.state_slot, s.state_restore);
    }
  }
}

namespace {

// One row's value heads between the tiled order (head j*n_k + g) and
// Hugging Face's grouped order (head g*r + j, r = n_v/n_k); each head is
// `width` floats. tmp: [n_v_heads * width].
void reorder_value_heads(float* row, const GatedDeltaDims& d, int64_t width, bool to_grouped, float* tmp) {
  const int64_t nk = d.n_k_heads, r = d.n_v_heads / d.n_k_heads;
  for (int64_t g = 0; g < nk; ++g) {
    for (int64_t j = 0; j < r; ++j) {
      const int64_t tiled = (j * nk + g) * width, grouped = (g * r + j) * width;
      const float* src = row + (to_grouped ? tiled : grouped);
      std::copy(src, src + width, tmp + (to_grouped ? grouped : tiled));
    }
  }
  std::copy(tmp, tmp + d.n_v_heads * width, row);
}

}  // namespace

Result<GatedDeltaNet> bind_gated_delta_net(const ModelFiles& f, const std::string& p, const GatedDeltaDims& d,
                                           int64_t n_embd, float eps, bool v_tiled) {
  GatedDeltaNet L;
  L.dims = d;
  L.eps = eps;
  L.v_tiled = v_tiled && d.n_v_heads != d.n_k_heads;  // with r == 1 both orders agree
  const int64_t E = n_embd, nv = d.n_v_heads;
  if (f.find(p + "in_proj_qkvz.weight")) {
    L.fused = true;
    RILL_ASSIGN_OR_RETURN(L.qkvz, bind_linear(f, p + "in_proj_qkvz", 2 * d.key_dim() + 2 * d.value_dim(), E));
  } else {
    RILL_ASSIGN_OR_RETURN(L.qkv, bind_linear(f, p + "in_proj_qkv", d.conv_dim(), E));
    RILL_ASSIGN_OR_RETURN(L.z, bind_linear(f, p + "in_proj_z", d.value_dim(), E));
  }
  if (L.fused || f.find(p + "in_proj_ba.weight")) {
    L.fused_ba = true;
    RILL_ASSIGN_OR_RETURN(L.ba, bind_linear(f, p + "in_proj_ba", 2 * nv, E));
  } else {
    RILL_ASSIGN_OR_RETURN(L.b, bind_linear(f, p + "in_proj_b", nv, E));
    RILL_ASSIGN_OR_RETURN(L.a, bind_linear(f, p + "in_proj_a", nv, E));
  }
  // Hugging Face keeps conv1d's channel axis [conv_dim, 1, K]; GGUF squeezes it.
  const TensorRef* found = f.find(p + "conv1d.weight");
  std::vector<int64_t> conv_shape = {d.conv_dim(), 1, d.conv_kernel};
  if (found && found->shape.size() == 2) conv_shape = {d.conv_dim(), d.conv_kernel};
  RILL_ASSIGN_OR_RETURN(const TensorRef* conv, f.require(p + "conv1d.weight", conv_shape));
  if (conv->dtype != DType::kF32 && conv->dtype != DType::kF16 && conv->dtype != DType::kBF16) {
    return Error{conv->file + ": tensor '" + conv->name + "' must be F32, F16 or BF16"};
  }
  L.conv_w.resize(static_cast<size_t>(d.conv_dim() * d.conv_kernel));
  cpu::dequantize_row(conv->dtype, conv->data, L.conv_w.data(), static_cast<int64_t>(L.conv_w.size()));
  if (f.find(p + "A")) {  // GGUF: A = -exp(A_log) already
    RILL_ASSIGN_OR_RETURN(L.neg_a, load_vector(f, p + "A", nv));
  } else if (f.find(p + "A_log")) {
    RILL_ASSIGN_OR_RETURN(std::vector<float> a_log, load_vector(f, p + "A_log", nv));
    L.neg_a.resize(static_cast<size_t>(nv));
    for (int64_t h = 0; h < nv; ++h) L.neg_a[h] = -std::exp(a_log[h]);
  } else {
    return Error{f.path + ": missing tensor '" + p + "A_log' (GGUF: '" + p + "A', blk.N.ssm_a)"};
  }
  RILL_ASSIGN_OR_RETURN(L.dt_bias, load_vector(f, p + "dt_bias", nv));
  RILL_ASSIGN_OR_RETURN(L.norm_w, load_vector(f, p + "norm.weight", d.head_v_dim));
  RILL_ASSIGN_OR_RETURN(L.out, bind_linear(f, p + "out_proj", E, d.value_dim()));
  if (L.v_tiled) {  // the small per-head tensors are kept in Hugging Face's order
    std::vector<float> tmp(static_cast<size_t>(d.value_dim() * d.conv_kernel));
    reorder_value_heads(L.conv_w.data() + 2 * d.key_dim() * d.conv_kernel, d, d.head_v_dim * d.conv_kernel, true,
                        tmp.data());
    reorder_value_heads(L.neg_a.data(), d, 1, true, tmp.data());
    reorder_value_heads(L.dt_bias.data(), d, 1, true, tmp.data());
  }
  return L;
}

void GatedDeltaScratch::reserve(const GatedDeltaDims& d, bool with_fused, int64_t max_tokens, int64_t max_seqs) {
  const auto T = static_cast<size_t>(max_tokens);
  qkv.resize(T * d.conv_dim());
  z.resize(T * d.value_dim());
  b.resize(T * d.n_v_heads);
  a.resize(T * d.n_v_heads);
  g.resize(T * d.n_v_heads);
  beta.resize(T * d.n_v_heads);
  core.resize(T * d.value_dim());
  if (with_fused) fused.resize(T * (2 * d.key_dim() + 2 * d.value_dim()));
  fused_ba.resize(T * 2 * d.n_v_heads);
  head_row.resize(static_cast<size_t>(d.value_dim()));
  conv_seqs.reserve(static_cast<size_t>(max_seqs));
  delta_seqs.reserve(static_cast<size_t>(max_seqs));
  // At most one save per token of a step.
  conv_snaps.reserve(T);
  delta_snaps.reserve(T);
}

namespace {

// Qwen3-Next's per-key-head groups of in_proj_qkvz -> the Qwen3.5 order (qkv, z).
void ungroup_qkvz(const GatedDeltaDims& d, int64_t n, GatedDeltaScratch& s) {
  const int64_t dk = d.head_k_dim, r = d.n_v_heads / d.n_k_heads, rdv = r * d.head_v_dim;
  const int64_t width = 2 * d.key_dim() + 2 * d.value_dim(), group = 2 * dk + 2 * rdv;
  const int64_t cd = d.conv_dim(), vd = d.value_dim();
  for (int64_t t = 0; t < n; ++t) {
    const float* src = s.fused.data() + t * width;
    float* qkv = s.qkv.data() + t * cd;
    float* z = s.z.data() + t * vd;
    for (int64_t g = 0; g < d.n_k_heads; ++g) {
      const float* grp = src + g * group;
      std::copy(grp, grp + dk, qkv + g * dk);
      std::copy(grp + dk, grp + 2 * dk, qkv + d.key_dim() + g * dk);
      std::copy(grp + 2 * dk, grp + 2 * dk + rdv, qkv + 2 * d.key_dim() + g * rdv);
      std::copy(grp + 2 * dk + rdv, grp + group, z + g * rdv);
    }
  }
}

// The per-key-head groups (b, a) of in_proj_ba -> b, a.
void ungroup_ba(const GatedDeltaDims& d, int64_t n, GatedDeltaScratch& s) {
  const int64_t r = d.n_v_heads / d.n_k_heads, nv = d.n_v_heads;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < d.n_k_heads; ++g) {
      const float* ba = s.fused_ba.data() + t * 2 * nv + g * 2 * r;
      std::copy(ba, ba + r, s.b.data() + t * nv + g * r);
      std::copy(ba + r, ba + 2 * r, s.a.data() + t * nv + g * r);
    }
  }
}

// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace

void gated_delta_forward(const GatedDeltaNet& L, int64_t layer, const Batch& batch, const float* h, float* out,
                         GatedDeltaScratch& s, const RecurrentStates& states, cpu::HostOps& backend) {
  const GatedDeltaDims& d = L.dims;
  const int64_t n = batch.n_tokens();
  const int64_t cd = d.conv_dim(), vd = d.value_dim(), nv = d.n_v_heads;
  {
    const Linear* ls[4];
    float* ys[4];
    int n_proj = 0;
    auto add = [&](const Linear& l, std::vector<float>& y) {
      ls[n_proj] = &l;
      ys[n_proj++] = y.data();
    };
    if (L.fused) {
      add(L.qkvz, s.fused);
    } else {
      add(L.qkv, s.qkv);
      add(L.z, s.z);
    }
    if (L.fused_ba) {
      add(L.ba, s.fused_ba);
    } else {
      add(L.b, s.b);
      add(L.a, s.a);
    }
    forward_group(ls, ys, n_proj, h, n, backend);
  }
  if (L.fused) ungroup_qkvz(d, n, s);
  if (L.fused_ba) ungroup_ba(d, n, s);
  if (L.v_tiled) {
    float* tmp = s.head_row.data();
    for (int64_t t = 0; t < n; ++t) {
      reorder_value_heads(s.qkv.data() + t * cd + 2 * d.key_dim(), d, d.head_v_dim, true, tmp);
      reorder_value_heads(s.z.data() + t * vd, d, d.head_v_dim, true, tmp);
      reorder_value_heads(s.b.data() + t * nv, d, 1, true, tmp);
      reorder_value_heads(s.a.data() + t * nv, d, 1, true, tmp);
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < nv; ++i) {
      const int64_t at = t * nv + i;
      s.beta[at] = 1.0f / (1.0f + std::exp(-s.b[at]));
      s.g[at] = L.neg_a[i] * softplus(s.a[at] + L.dt_bias[i]);
    }
  }

  // Snapshots for this layer, grouped by sequence (saves are sorted by seq).
  s.conv_snaps.clear();
  s.delta_snaps.clear();
  for (const StateSave& v : batch.state_saves) {
    const BatchSeq& q = batch.seqs[static_cast<size_t>(v.seq)];
    const int64_t after = v.pos - (q.kv_len - q.q_len);
    const int32_t id = states.checkpoint_id(v.checkpoint);
    s.conv_snaps.push_back({after, states.conv(layer, id)});
    s.delta_snaps.push_back({after, states.delta(layer, id)});
  }
  s.conv_seqs.clear();
  s.delta_seqs.clear();
  size_t next_save = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const BatchSeq& q = batch.seqs[i];
    const size_t first_save = next_save;
    while (next_save < batch.state_saves.size() && batch.state_saves[next_save].seq == static_cast<int32_t>(i)) {
      ++next_save;
    }
    const int n_saves = static_cast<int>(next_save - first_save);
    float* x = s.qkv.data() + static_cast<int64_t>(q.q_start) * cd;
    s.conv_seqs.push_back({x, q.q_len, states.conv(layer, q.state_slot), s.conv_snaps.data() + first_save, n_saves});
    cpu::GatedDeltaSeq ds;
    ds.q = x;
    ds.k = x + d.key_dim();
    ds.v = x + 2 * d.key_dim();
    ds.g = s.g.data() + static_cast<int64_t>(q.q_start) * nv;
    ds.beta = s.beta.data() + static_cast<int64_t>(q.q_start) * nv;
    ds.out = s.core.data() + static_cast<int64_t>(q.q_start) * vd;
    ds.n_tokens = q.q_len;
    ds.state = states.delta(layer, q.state_slot);
    ds.snapshots = s.delta_snaps.data() + first_save;
    ds.n_snapshots = n_saves;
    s.delta_seqs.push_back(ds);
  }
  backend.causal_conv1d_silu_batch(s.conv_seqs.data(), static_cast<int>(s.conv_seqs.size()), L.conv_w.data(), cd,
                                   d.conv_kernel, cd);
  const cpu::GatedDeltaParams p{d.n_k_heads, nv, d.head_k_dim, d.head_v_dim, cd, nv, vd};
  backend.gated_delta_batch(s.delta_seqs.data(), static_cast<int>(s.delta_seqs.size()), p);

  // Per head: RMSNorm(core) * w, gated by silu(z).
  backend.rms_norm(s.core.data(), L.norm_w.data(), n * nv, d.head_v_dim, L.eps, s.core.data());
  backend.silu_mul(s.z.data(), s.core.data(), s.z.data(), n * vd);
  if (L.v_tiled) {  // out_proj's columns are in the tiled order
    for (int64_t t = 0; t < n; ++t) reorder_value_heads(s.z.data() + t * vd, d, d.head_v_dim, false, s.head_row.data());
  }
  L.out.forward(s.z.data(), n, out, backend);
}

}  // namespace rill
