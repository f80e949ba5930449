#include "model/placement.h"

#include <algorithm>
#include <vector>

namespace rill {

HostMatrix host_matrix(const WeightView& w) {
  HostMatrix m{w.data, w.dtype, w.n_rows, w.n_cols, w.row_stride > 0 ? w.row_stride : row_bytes(w.dtype, w.n_cols)};
  m.fp8 = w.fp8;
  m.e4m3 = w.e4m3;
  m.e4m3_scales = w.e4m3_scales;
  return m;
}

Status place_fused_qkv(Backend& b, const Linear& q, const Linear& k, const Linear& v, const std::string& prefix,
                       Weight& weight, Vec& bias) {
  const HostMatrix parts[] = {host_matrix(q.w), host_matrix(k.w), host_matrix(v.w)};
  RILL_ASSIGN_OR_RETURN(weight, b.place(parts, 3, prefix + "self_attn.{q,k,v}_proj"));
  if (q.bias.empty() && k.bias.empty() && v.bias.empty()) return Status::Ok();
  const int64_t n_q = q.n_out(), n_kv = k.n_out();
  std::vector<float> all(static_cast<size_t>(n_q + 2 * n_kv), 0.0f);  // zeros where a part has none
  std::copy(q.bias.begin(), q.bias.end(), all.begin());
  std::copy(k.bias.begin(), k.bias.end(), all.begin() + n_q);
  std::copy(v.bias.begin(), v.bias.end(), all.begin() + n_q + n_kv);
  RILL_ASSIGN_OR_RETURN(bias,
                        b.place_vector(all.data(), static_cast<int64_t>(all.size()), prefix + "self_attn qkv bias"));
  return Status::Ok();
}

Status place_embedding_and_head(Backend& b, const WeightView& embed, const WeightView& lm_head, bool tied,
                                const std::vector<float>& final_norm, Weight& embed_out, Weight& head_out,
                                Vec& final_norm_out) {
  HostMatrix e = host_matrix(embed);
  e.gathered = true;
  RILL_ASSIGN_OR_RETURN(embed_out, b.place(&e, 1, "embed_tokens.weight"));
  head_out = embed_out;
  if (!tied) {
    const HostMatrix h = host_matrix(lm_head);
    RILL_ASSIGN_OR_RETURN(head_out, b.place(&h, 1, "lm_head.weight"));
  }
  RILL_ASSIGN_OR_RETURN(final_norm_out,
                        b.place_vector(final_norm.data(), static_cast<int64_t>(final_norm.size()), "norm.weight"));
  return Status::Ok();
}

}  // namespace rill
