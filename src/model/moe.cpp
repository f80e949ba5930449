#include "model/moe.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

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

float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}

// gpt-oss routing of one token: the K largest of the X logits (ties: lower
// id first), then a softmax over those K.
void route_topk_softmax(const float* logits, int64_t X, int64_t K, int32_t* ids, float* ws) {
  for (int64_t k = 0; k < K; ++k) {
    int32_t best = -1;
    for (int64_t e = 0; e < X; ++e) {
      if (std::find(ids, ids + k, static_cast<int32_t>(e)) != ids + k) continue;
      if (best < 0 || logits[e] > logits[best]) best = static_cast<int32_t>(e);
    }
    ids[k] = best;
  }
  const float mx = logits[ids[0]];  // the largest: picked first
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    ws[k] = std::exp(logits[ids[k]] - mx);
    sum += ws[k];
  }
  for (int64_t k = 0; k < K; ++k) ws[k] /= sum;
}

// gpt-oss's clamped SwiGLU in place over gate: see MoeParams.
void clamped_swiglu(float* gate, const float* up, int64_t n, float limit, float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    gate[i] = g * sigmoid(alpha * g) * (u + 1.0f);
  }
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

void MoeScratch::reserve(const MoeParams& p, int64_t max_tokens) {
  const auto T = static_cast<size_t>(std::max<int64_t>(1, max_tokens));
  const auto K = static_cast<size_t>(p.n_expert_used);
  const auto E = static_cast<size_t>(p.n_embd);
  const auto F = static_cast<size_t>(std::max(p.n_ff, p.n_ff_shared));
  auto grow = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(logits, T * static_cast<size_t>(p.n_expert));
  grow(top_ids, T * K);
  grow(top_w, T * K);
  grow(offsets, static_cast<size_t>(p.n_expert) + 1);
  grow(row_token, T * K);
  grow(row_weight, T * K);
  grow(xg, T * E);
  grow(yg, T * E);
  grow(gate, T * F);
  grow(up, T * F);
  grow(shared_logit, T);
  grow(choice, static_cast<size_t>(p.n_expert));
  grow(group_score, static_cast<size_t>(p.n_group));
}

bool MoeScratch::fits(const MoeParams& p, int64_t n_tokens) const {
  const auto T = static_cast<size_t>(n_tokens);
  const auto K = static_cast<size_t>(p.n_expert_used);
  const auto F = static_cast<size_t>(std::max(p.n_ff, p.n_ff_shared));
  return logits.size() >= T * static_cast<size_t>(p.n_expert) && top_ids.size() >= T * K && row_token.size() >= T * K &&
         offsets.size() >= static_cast<size_t>(p.n_expert) + 1 && xg.size() >= T * static_cast<size_t>(p.n_embd) &&
         gate.size() >= T * F && shared_logit.size() >= T && choice.size() >= static_cast<size_t>(p.n_expert) &&
         group_score.size() >= static_cast<size_t>(p.n_group);
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
  out->push_back(&w_.router.w);
  auto add = [&](const GluFfnWeights& f) {
    for (const Linear* l : {&f.gate, &f.up, &f.down}) out->push_back(&l->w);
  };
  for (const GluFfnWeights& f : w_.experts) add(f);
  if (w_.shared) {
    add(*w_.shared);
    if (p_.shared_gate) out->push_back(&w_.shared_gate.w);
  }
}

// Fills s.top_ids/s.top_w from the router logits in s.logits, then the
// per-expert row lists (s.offsets, s.row_token, s.row_weight).
void MoeFfn::route(int64_t n_tokens, MoeScratch& s) const {
  const int64_t X = p_.n_expert, K = p_.n_expert_used;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* pr = s.logits.data() + t * X;
    if (p_.softmax_after_topk) {
      route_topk_softmax(pr, X, K, s.top_ids.data() + t * K, s.top_w.data() + t * K);
      continue;
    }
    if (p_.sigmoid_scores) {
      for (int64_t e = 0; e < X; ++e) pr[e] = sigmoid(pr[e]);
    } else {
      float mx = pr[0];
      for (int64_t e = 1; e < X; ++e) mx = std::max(mx, pr[e]);
      float sum = 0;
      for (int64_t e = 0; e < X; ++e) {
        pr[e] = std::exp(pr[e] - mx);
        sum += pr[e];
      }
      for (int64_t e = 0; e < X; ++e) pr[e] /= sum;
    }
    const float* cs = choice_scores(pr, s);
    // Selection by repeated arg-max: K passes over X experts (K and X are small).
    int32_t* ids = s.top_ids.data() + t * K;
    float* ws = s.top_w.data() + t * K;
    float picked_sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      int32_t best = -1;
      for (int64_t e = 0; e < X; ++e) {
        if (std::find(ids, ids + k, static_cast<int32_t>(e)) != ids + k) continue;
        if (best < 0 || cs[e] > cs[best]) best = static_cast<int32_t>(e);
      }
      ids[k] = best;
      ws[k] = pr[best];
      picked_sum += pr[best];
    }
    if (p_.norm_topk_prob) {
      if (p_.sigmoid_scores) picked_sum += 1e-20f;  // transformers' DeepSeek router
      for (int64_t k = 0; k < K; ++k) ws[k] /= picked_sum;
    }
    if (p_.routed_scaling_factor != 1.0f) {
      for (int64_t k = 0; k < K; ++k) ws[k] *= p_.routed_scaling_factor;
    }
    if (!w_.expert_scale.empty()) {
      for (int64_t k = 0; k < K; ++k) ws[k] *= w_.expert_scale[static_cast<size_t>(ids[k])];
    }
  }
  // Counting sort by expert; within an expert, tokens stay in ascending order.
  std::fill(s.offsets.begin(), s.offsets.end(), 0);
  for (int64_t i = 0; i < n_tokens * K; ++i) ++s.offsets[static_cast<size_t>(s.top_ids[i]) + 1];
  for (int64_t e = 0; e < X; ++e) s.offsets[e + 1] += s.offsets[e];
  // s.offsets[e] is used as the fill cursor of expert e, then restored.
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = s.top_ids[t * K + k];
      const int32_t row = s.offsets[e]++;
      s.row_token[row] = static_cast<int32_t>(t);
      s.row_weight[row] = s.top_w[t * K + k];
    }
  }
  for (int64_t e = X; e > 0; --e) s.offsets[e] = s.offsets[e - 1];
  s.offsets[0] = 0;
}

// The scores experts are chosen by: the probabilities themselves, or (score
// bias, groups) s.choice = probs + bias with the experts outside the
// topk_group best groups (a group's score: the sum of its two best choice
// scores; ties: lower group id) set to 0, as transformers masks them.
const float* MoeFfn::choice_scores(const float* probs, MoeScratch& s) const {
  if (w_.score_bias.empty() && p_.n_group <= 1) return probs;
  const int64_t X = p_.n_expert;
  float* cs = s.choice.data();
  for (int64_t e = 0; e < X; ++e) cs[e] = probs[e] + (w_.score_bias.empty() ? 0.0f : w_.score_bias[e]);
  if (p_.n_group <= 1) return cs;
  const int64_t G = p_.n_group, per = X / G;
  for (int64_t g = 0; g < G; ++g) {
    float a = -INFINITY, b = -INFINITY;  // the group's best two
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (cs[e] > a) {
        b = a;
        a = cs[e];
      } else if (cs[e] > b) {
        b = cs[e];
      }
    }
    s.group_score[g] = a + b;
  }
  for (int64_t k = 0; k < p_.topk_group; ++k) {  // the kept groups' scores become +inf
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g) {
      if (s.group_score[g] == INFINITY) continue;
      if (best < 0 || s.group_score[g] > s.group_score[best]) best = g;
    }
    s.group_score[best] = INFINITY;
  }
  for (int64_t e = 0; e < X; ++e) {
    if (s.group_score[e / per] != INFINITY) cs[e] = 0.0f;
  }
  return cs;
}

// y = down(silu(gate x) * up x) for n_rows rows. x: [n_rows, n_embd], y: [n_rows, n_embd].
void MoeFfn::run_ffn(const GluFfnWeights& w, const float* x, int64_t n_rows, float* y, MoeScratch& s,
                     cpu::HostOps& backend) const {
  if (w.gate.w.dtype == w.up.w.dtype) {
    const Linear* gate_up[] = {&w.gate, &w.up};
    float* outs[] = {s.gate.data(), s.up.data()};
    forward_group(gate_up, outs, 2, x, n_rows, backend);
  } else {
    w.gate.forward(x, n_rows, s.gate.data(), backend);
    w.up.forward(x, n_rows, s.up.data(), backend);
  }
  // Row by row: the SIMD silu and its scalar tail round differently, so one
  // call over all rows would make a row's result depend on where it lands.
  const int64_t F = w.gate.n_out();
  for (int64_t r = 0; r < n_rows; ++r) {
    if (p_.swiglu_limit > 0) {
      clamped_swiglu(s.gate.data() + r * F, s.up.data() + r * F, F, p_.swiglu_limit, p_.swiglu_alpha);
    } else if (p_.gelu_tanh) {
      backend.gelu_tanh_mul(s.gate.data() + r * F, s.up.data() + r * F, s.gate.data() + r * F, F);
    } else {
      backend.silu_mul(s.gate.data() + r * F, s.up.data() + r * F, s.gate.data() + r * F, F);
    }
  }
  w.down.forward(s.gate.data(), n_rows, y, backend);
}

void MoeFfn::forward(const float* x, int64_t n_tokens, float* out, MoeScratch& s, cpu::HostOps& backend) const {
  forward(x, x, n_tokens, out, s, backend);
}

void MoeFfn::forward(const float* router_x, const float* x, int64_t n_tokens, float* out, MoeScratch& s,
                     cpu::HostOps& backend) const {
  assert(s.fits(p_, n_tokens) && out != x && out != router_x);
  if (n_tokens <= 0) return;
  const int64_t E = p_.n_embd;
  w_.router.forward(router_x, n_tokens, s.logits.data(), backend);
  route(n_tokens, s);
  std::memset(out, 0, static_cast<size_t>(n_tokens * E) * sizeof(float));
  // Experts in increasing id, so every token adds its experts in that order.
  for (int64_t e = 0; e < p_.n_expert; ++e) {
    const int32_t r0 = s.offsets[e], n_rows = s.offsets[e + 1] - r0;
    if (n_rows == 0) continue;
    for (int32_t i = 0; i < n_rows; ++i) {
      std::memcpy(s.xg.data() + i * E, x + static_cast<int64_t>(s.row_token[r0 + i]) * E,
                  static_cast<size_t>(E) * sizeof(float));
    }
    run_ffn(w_.experts[static_cast<size_t>(e)], s.xg.data(), n_rows, s.yg.data(), s, backend);
    for (int32_t i = 0; i < n_rows; ++i) {
      float* o = out + static_cast<int64_t>(s.row_token[r0 + i]) * E;
      const float* y = s.yg.data() + i * E;
      const float wgt = s.row_weight[r0 + i];
      for (int64_t j = 0; j < E; ++j) o[j] += wgt * y[j];
    }
  }
  if (w_.shared) {
    run_ffn(*w_.shared, x, n_tokens, s.yg.data(), s, backend);
    if (p_.shared_gate) w_.shared_gate.forward(x, n_tokens, s.shared_logit.data(), backend);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float g = p_.shared_gate ? sigmoid(s.shared_logit[t]) : 1.0f;
      float* o = out + t * E;
      const float* y = s.yg.data() + t * E;
      for (int64_t j = 0; j < E; ++j) o[j] += g * y[j];
    }
  }
}

}  // namespace rill
