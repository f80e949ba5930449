#include "backend/cpu/moe.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace rill {

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

namespace cpu {
namespace {

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

// The scores experts are chosen by: the probabilities themselves, or (score
// bias, groups) s.choice = probs + bias with the experts outside the
// topk_group best groups (a group's score: the sum of its two best choice
// scores; ties: lower group id) set to 0, as transformers masks them.
const float* choice_scores(const MoeParams& p, const MoeWeights& moe, const float* probs, MoeScratch& s) {
  if (moe.score_bias.empty() && p.n_group <= 1) return probs;
  const int64_t X = p.n_expert;
  float* cs = s.choice.data();
  for (int64_t e = 0; e < X; ++e) cs[e] = probs[e] + (moe.score_bias.empty() ? 0.0f : moe.score_bias[e]);
  if (p.n_group <= 1) return cs;
  const int64_t G = p.n_group, per = X / G;
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
  for (int64_t k = 0; k < p.topk_group; ++k) {  // the kept groups' scores become +inf
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

// Fills s.top_ids/s.top_w from the router logits in s.logits, then the
// per-expert row lists (s.offsets, s.row_token, s.row_weight).
void route(const MoeParams& p, const MoeWeights& moe, int64_t n_tokens, MoeScratch& s) {
  const int64_t X = p.n_expert, K = p.n_expert_used;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* pr = s.logits.data() + t * X;
    if (p.softmax_after_topk) {
      route_topk_softmax(pr, X, K, s.top_ids.data() + t * K, s.top_w.data() + t * K);
      continue;
    }
    if (p.sigmoid_scores) {
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
    const float* cs = choice_scores(p, moe, pr, s);
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
    if (p.norm_topk_prob) {
      if (p.sigmoid_scores) picked_sum += 1e-20f;  // transformers' DeepSeek router
      for (int64_t k = 0; k < K; ++k) ws[k] /= picked_sum;
    }
    if (p.routed_scaling_factor != 1.0f) {
      for (int64_t k = 0; k < K; ++k) ws[k] *= p.routed_scaling_factor;
    }
    if (!moe.expert_scale.empty()) {
      for (int64_t k = 0; k < K; ++k) ws[k] *= moe.expert_scale[static_cast<size_t>(ids[k])];
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

// y = down(silu(gate x) * up x) for n_rows rows. x: [n_rows, n_embd], y: [n_rows, n_embd].
void run_ffn(const MoeParams& p, const GluFfnWeights& w, const float* x, int64_t n_rows, float* y, MoeScratch& s,
             HostOps& backend) {
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
    if (p.swiglu_limit > 0) {
      clamped_swiglu(s.gate.data() + r * F, s.up.data() + r * F, F, p.swiglu_limit, p.swiglu_alpha);
    } else if (p.gelu_tanh) {
      backend.gelu_tanh_mul(s.gate.data() + r * F, s.up.data() + r * F, s.gate.data() + r * F, F);
    } else {
      backend.silu_mul(s.gate.data() + r * F, s.up.data() + r * F, s.gate.data() + r * F, F);
    }
  }
  w.down.forward(s.gate.data(), n_rows, y, backend);
}

}  // namespace

void moe_forward(const MoeParams& p, const MoeWeights& moe, const float* router_x, const float* x, int64_t n_tokens,
                 float* out, MoeScratch& s, HostOps& backend) {
  assert(s.fits(p, n_tokens) && out != x && out != router_x);
  if (n_tokens <= 0) return;
  const int64_t E = p.n_embd;
  moe.router.forward(router_x, n_tokens, s.logits.data(), backend);
  route(p, moe, n_tokens, s);
  std::memset(out, 0, static_cast<size_t>(n_tokens * E) * sizeof(float));
  // Experts in increasing id, so every token adds its experts in that order.
  for (int64_t e = 0; e < p.n_expert; ++e) {
    const int32_t r0 = s.offsets[e], n_rows = s.offsets[e + 1] - r0;
    if (n_rows == 0) continue;
    for (int32_t i = 0; i < n_rows; ++i) {
      std::memcpy(s.xg.data() + i * E, x + static_cast<int64_t>(s.row_token[r0 + i]) * E,
                  static_cast<size_t>(E) * sizeof(float));
    }
    run_ffn(p, moe.experts[static_cast<size_t>(e)], s.xg.data(), n_rows, s.yg.data(), s, backend);
    for (int32_t i = 0; i < n_rows; ++i) {
      float* o = out + static_cast<int64_t>(s.row_token[r0 + i]) * E;
      const float* y = s.yg.data() + i * E;
      const float wgt = s.row_weight[r0 + i];
      for (int64_t j = 0; j < E; ++j) o[j] += wgt * y[j];
    }
  }
  if (moe.shared) {
    run_ffn(p, *moe.shared, x, n_tokens, s.yg.data(), s, backend);
    if (p.shared_gate) moe.shared_gate.forward(x, n_tokens, s.shared_logit.data(), backend);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float g = p.shared_gate ? sigmoid(s.shared_logit[t]) : 1.0f;
      float* o = out + t * E;
      const float* y = s.yg.data() + t * E;
      for (int64_t j = 0; j < E; ++j) o[j] += g * y[j];
    }
  }
}

MoeWeights moe_weights(const HostMoe& layer) {
  const MoeParams& p = layer.p;
  auto linear = [](const HostMatrix& m, const float* bias) {
    Linear l;
    l.w = {m.dtype, m.rows, m.cols, m.data, m.row_stride};
    if (bias) l.bias.assign(bias, bias + m.rows);
    return l;
  };
  auto ffn = [&](const HostExpert& e) {
    return GluFfnWeights{linear(e.gate, e.gate_bias), linear(e.up, e.up_bias), linear(e.down, e.down_bias)};
  };
  MoeWeights w;
  w.router = linear(layer.router, layer.router_bias);
  w.experts.reserve(layer.experts.size());
  for (const HostExpert& e : layer.experts) w.experts.push_back(ffn(e));
  if (layer.shared) {
    w.shared = ffn(*layer.shared);
    if (p.shared_gate) w.shared_gate = linear(layer.shared_gate, nullptr);
  }
  if (layer.expert_scale) w.expert_scale.assign(layer.expert_scale, layer.expert_scale + p.n_expert);
  if (layer.score_bias) w.score_bias.assign(layer.score_bias, layer.score_bias + p.n_expert);
  return w;
}

void collect_moe_weights(const MoeParams& p, const MoeWeights& w, std::vector<const WeightView*>* out) {
  out->push_back(&w.router.w);
  auto add = [&](const GluFfnWeights& f) {
    for (const Linear* l : {&f.gate, &f.up, &f.down}) out->push_back(&l->w);
  };
  for (const GluFfnWeights& f : w.experts) add(f);
  if (w.shared) {
    add(*w.shared);
    if (p.shared_gate) out->push_back(&w.shared_gate.w);
  }
}

}  // namespace cpu
}  // namespace rill
