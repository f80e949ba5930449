#include "model/moe.h"

#include <algorithm>

#include "model/placement.h"

namespace rill {
namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

Status check_linear(const Linear& l, int64_t n_out, int64_t n_in, const std::string& what) {
  if (l.w.data == nullptr || l.w.n_rows != n_out || l.w.n_cols != n_in) {
    return Error{"MoE layer: " + what + " is [" + str(l.w.n_rows) + ", " + str(l.w.n_cols) + "], expected [" +
                 str(n_out) + ", " + str(n_in) + "]"};
  }
  if (!l.bias.empty() && static_cast<int64_t>(l.bias.size()) != n_out) {
    return Error{"MoE layer: " + what + " has a bias of " + str(static_cast<int64_t>(l.bias.size())) + ", expected " +
                 str(n_out)};
  }
  return Status::Ok();
}

Status check_ffn(const GluFfnWeights& f, int64_t n_ff, int64_t n_embd, const std::string& what) {
  RILL_TRY(check_linear(f.gate, n_ff, n_embd, what + " gate"));
  RILL_TRY(check_linear(f.up, n_ff, n_embd, what + " up"));
  RILL_TRY(check_linear(f.down, n_embd, n_ff, what + " down"));
  return Status::Ok();
}

// Expert e's [n_rows, n_cols] slice of a 3-D tensor [n_expert, n_rows, n_cols].
Linear expert_slice(const TensorRef& t, int64_t e, int64_t n_rows, int64_t n_cols) {
  Linear l;
  l.w.dtype = t.dtype;
  l.w.n_rows = n_rows;
  l.w.n_cols = n_cols;
  l.w.row_stride = row_bytes(t.dtype, n_cols);
  l.w.data = t.data + static_cast<size_t>(e * n_rows) * l.w.row_stride;
  return l;
}

Result<Linear> bind_stacked(const ModelFiles& files, const std::string& name, int64_t e, int64_t n_expert,
                            int64_t n_rows, int64_t n_cols) {
  RILL_ASSIGN_OR_RETURN(const TensorRef* t, files.require(name, {n_expert, n_rows, n_cols}));
  if (n_cols % dtype_info(t->dtype).block_size != 0) {
    return Error{t->file + ": tensor '" + name + "' rows of " + str(n_cols) + " elements are not a whole number of " +
                 std::string(dtype_name(t->dtype)) + " blocks"};
  }
  return expert_slice(*t, e, n_rows, n_cols);
}

Result<GluFfnWeights> bind_ffn(const ModelFiles& files, const std::string& p, const MoeNames& n, int64_t n_ff,
                               int64_t n_embd) {
  GluFfnWeights f;
  RILL_ASSIGN_OR_RETURN(f.gate, bind_linear(files, p + n.gate, n_ff, n_embd));
  RILL_ASSIGN_OR_RETURN(f.up, bind_linear(files, p + n.up, n_ff, n_embd));
  RILL_ASSIGN_OR_RETURN(f.down, bind_linear(files, p + n.down, n_embd, n_ff));
  return f;
}

}  // namespace

MoeParams moe_params(const ModelConfig& c) {
  MoeParams p;
  p.n_embd = c.n_embd;
  p.n_expert = c.n_expert;
  p.n_expert_used = c.n_expert_used;
  p.n_ff = c.n_ff_expert > 0 ? c.n_ff_expert : c.n_ff;
  p.norm_topk_prob = c.norm_topk_prob;
  p.n_ff_shared = c.n_ff_shared_expert;
  // DeepSeek-V3 / GLM-4.5 (n_routed_experts; parse_hf_config checked the fields).
  if (c.raw.is_object() && c.raw.contains("n_routed_experts")) {
    auto number = [&](const char* key, double fallback) {
      auto it = c.raw.find(key);
      return it != c.raw.end() && it->is_number() ? it->get<double>() : fallback;
    };
    p.sigmoid_scores = true;
    p.shared_gate = false;
    p.n_group = static_cast<int64_t>(number("n_group", 1));
    p.topk_group = static_cast<int64_t>(number("topk_group", 1));
    p.routed_scaling_factor = static_cast<float>(number("routed_scaling_factor", 1.0));
  }
  return p;
}

bool is_moe_layer(const ModelConfig& c, int64_t il) {
  if (c.n_expert <= 0) return false;
  if (std::find(c.dense_layers.begin(), c.dense_layers.end(), il) != c.dense_layers.end()) return false;
  return c.moe_layer_step <= 1 || (il + 1) % c.moe_layer_step == 0;
}

Result<MoeFfn> MoeFfn::create(const MoeParams& p, MoeWeights weights) {
  if (p.n_embd <= 0 || p.n_expert <= 0 || p.n_ff <= 0 || p.n_expert_used < 1 || p.n_expert_used > p.n_expert ||
      p.n_ff_shared < 0) {
    return Error{"MoE layer: inconsistent parameters (embd " + str(p.n_embd) + ", " + str(p.n_expert_used) + " of " +
                 str(p.n_expert) + " experts of width " + str(p.n_ff) + ", shared " + str(p.n_ff_shared) + ")"};
  }
  RILL_TRY(check_linear(weights.router, p.n_expert, p.n_embd, "router"));
  if (static_cast<int64_t>(weights.experts.size()) != p.n_expert) {
    return Error{"MoE layer: " + str(static_cast<int64_t>(weights.experts.size())) + " experts, expected " +
                 str(p.n_expert)};
  }
  for (int64_t e = 0; e < p.n_expert; ++e) {
    RILL_TRY(check_ffn(weights.experts[static_cast<size_t>(e)], p.n_ff, p.n_embd, "expert " + str(e)));
  }
  if (p.n_group < 1 || p.n_expert % p.n_group != 0 || p.topk_group < 1 || p.topk_group > p.n_group ||
      (p.n_group > 1 && p.n_expert / p.n_group < 2) || p.n_expert_used > p.topk_group * (p.n_expert / p.n_group)) {
    return Error{"MoE layer: " + str(p.n_expert) + " experts in " + str(p.n_group) + " groups, " + str(p.topk_group) +
                 " groups eligible, cannot route " + str(p.n_expert_used) +
                 " experts per token (groups must be equal, of at least 2 experts)"};
  }
  if (!weights.score_bias.empty() && static_cast<int64_t>(weights.score_bias.size()) != p.n_expert) {
    return Error{"MoE layer: score bias of " + str(static_cast<int64_t>(weights.score_bias.size())) +
                 " values, expected " + str(p.n_expert)};
  }
  if (p.n_ff_shared > 0) {
    if (!weights.shared) return Error{"MoE layer: the shared expert's weights are missing"};
    RILL_TRY(check_ffn(*weights.shared, p.n_ff_shared, p.n_embd, "shared expert"));
    if (p.shared_gate) RILL_TRY(check_linear(weights.shared_gate, 1, p.n_embd, "shared expert gate"));
  } else if (weights.shared) {
    return Error{"MoE layer: shared expert weights given but n_ff_shared is 0"};
  }
  if (!weights.expert_scale.empty() && static_cast<int64_t>(weights.expert_scale.size()) != p.n_expert) {
    return Error{"MoE layer: " + str(static_cast<int64_t>(weights.expert_scale.size())) + " expert scales, expected " +
                 str(p.n_expert)};
  }
  MoeFfn m;
  m.p_ = p;
  m.w_ = std::move(weights);
  return m;
}

Result<MoeFfn> MoeFfn::bind(const ModelFiles& files, const std::string& prefix, const MoeParams& p,
                            const MoeNames& names) {
  if (p.n_expert <= 0 || p.n_expert > (int64_t{1} << 20)) {
    return Error{files.path + ": MoE layer '" + prefix + "' with " + str(p.n_expert) + " experts"};
  }
  MoeWeights w;
  RILL_ASSIGN_OR_RETURN(w.router, bind_linear(files, prefix + names.router, p.n_expert, p.n_embd));
  const std::string ex = prefix + names.experts + ".";
  w.experts.resize(static_cast<size_t>(p.n_expert));
  const bool stacked = files.find(ex + names.gate + ".weight") != nullptr;
  for (int64_t e = 0; e < p.n_expert; ++e) {
    GluFfnWeights& f = w.experts[static_cast<size_t>(e)];
    if (stacked) {
      RILL_ASSIGN_OR_RETURN(f.gate, bind_stacked(files, ex + names.gate + ".weight", e, p.n_expert, p.n_ff, p.n_embd));
      RILL_ASSIGN_OR_RETURN(f.up, bind_stacked(files, ex + names.up + ".weight", e, p.n_expert, p.n_ff, p.n_embd));
      RILL_ASSIGN_OR_RETURN(f.down, bind_stacked(files, ex + names.down + ".weight", e, p.n_expert, p.n_embd, p.n_ff));
    } else {
      RILL_ASSIGN_OR_RETURN(f, bind_ffn(files, ex + str(e) + ".", names, p.n_ff, p.n_embd));
    }
  }
  if (p.n_ff_shared > 0) {
    RILL_ASSIGN_OR_RETURN(w.shared,
                          bind_ffn(files, prefix + names.shared_expert + ".", names, p.n_ff_shared, p.n_embd));
    const std::string gate_name = prefix + names.shared_expert_gate + ".weight";
    const TensorRef* g = files.find(gate_name);
    if (!p.shared_gate) {
      // DeepSeek's shared experts have no gate.
    } else if (g && g->shape.size() == 1 && g->shape[0] == p.n_embd) {
      w.shared_gate.w = weight_view(*g);  // GGUF stores it as a vector
    } else {
      RILL_ASSIGN_OR_RETURN(w.shared_gate.w, bind_matrix(files, gate_name, 1, p.n_embd));
    }
  }
  if (files.find(prefix + names.score_bias)) {
    RILL_ASSIGN_OR_RETURN(w.score_bias, load_vector(files, prefix + names.score_bias, p.n_expert));
  }
  auto m = create(p, std::move(w));
  if (!m.ok()) return Error{files.path + ": '" + prefix + "': " + m.error().message};
  return m;
}

Result<MoeFfn> MoeFfn::bind_llama(const ModelFiles& files, const std::string& layer_prefix) {
  MoeNames names;
  std::string prefix = layer_prefix + "mlp.";
  if (files.find(layer_prefix + "block_sparse_moe.gate.weight")) {
    prefix = layer_prefix + "block_sparse_moe.";
    names.gate = "w1";
    names.up = "w3";
    names.down = "w2";
  }
  const MoeParams mp = moe_params(files.config);
  if (mp.n_ff_shared > 0 && mp.shared_gate) {
    return Error{files.path + ": shared experts are not part of the " + files.config.architecture + " graph"};
  }
  if (mp.n_ff_shared > 0) names.shared_expert = "shared_experts";  // GLM-4.5's, ungated
  return bind(files, prefix, mp, names);
}

void MoeFfn::collect_weights(std::vector<const WeightView*>* out) const {
  cpu::collect_moe_weights(p_, w_, out);
}

HostMoe MoeFfn::host() const {
  auto bias = [](const Linear& l) { return l.bias.empty() ? nullptr : l.bias.data(); };
  auto expert = [&](const GluFfnWeights& f) {
    HostExpert e;
    e.gate = host_matrix(f.gate.w);
    e.up = host_matrix(f.up.w);
    e.down = host_matrix(f.down.w);
    e.gate_bias = bias(f.gate);
    e.up_bias = bias(f.up);
    e.down_bias = bias(f.down);
    return e;
  };
  HostMoe h;
  h.p = p_;
  h.router = host_matrix(w_.router.w);
  h.router_bias = bias(w_.router);
  h.experts.reserve(w_.experts.size());
  for (const GluFfnWeights& f : w_.experts) h.experts.push_back(expert(f));
  if (w_.shared) {
    h.shared = expert(*w_.shared);
    if (p_.shared_gate) h.shared_gate = host_matrix(w_.shared_gate.w);
  }
  h.expert_scale = w_.expert_scale.empty() ? nullptr : w_.expert_scale.data();
  h.score_bias = w_.score_bias.empty() ? nullptr : w_.score_bias.data();
  return h;
}

void MoeFfn::forward(const float* x, int64_t n_tokens, float* out, MoeScratch& s, cpu::HostOps& backend) const {
  cpu::moe_forward(p_, w_, x, x, n_tokens, out, s, backend);
}

void MoeFfn::forward(const float* router_x, const float* x, int64_t n_tokens, float* out, MoeScratch& s,
                     cpu::HostOps& backend) const {
  cpu::moe_forward(p_, w_, router_x, x, n_tokens, out, s, backend);
}

}  // namespace rill
