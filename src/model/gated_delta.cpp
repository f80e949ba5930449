#include "model/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace rill {

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

}  // namespace rill
