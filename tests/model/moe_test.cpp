// MoeFfn against a naive reference (every expert computed densely for every
// token in double, weighted by the routing), on random weights: with and
// without norm_topk_prob, with a shared expert, per-expert and stacked (GGUF)
// weight layouts; plus batch invariance and the absence of a dense fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "model/moe.h"

namespace rill {
namespace {

// An f32 [n_rows, n_cols] matrix owned by the test.
struct Mat {
  int64_t n_rows = 0, n_cols = 0;
  std::vector<float> v;
  Linear linear() const {
    Linear l;
    l.w.dtype = DType::kF32;
    l.w.n_rows = n_rows;
    l.w.n_cols = n_cols;
    l.w.data = v.data();
    l.w.row_stride = static_cast<size_t>(n_cols) * sizeof(float);
    return l;
  }
};

Mat random_mat(int64_t r, int64_t c, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  Mat m{r, c, std::vector<float>(static_cast<size_t>(r * c))};
  for (float& x : m.v) x = d(rng);
  return m;
}

struct Ffn {
  Mat gate, up, down;
  GluFfnWeights weights() const { return {gate.linear(), up.linear(), down.linear()}; }
};

struct RandomMoe {
  MoeParams p;
  Mat router, shared_gate;
  std::vector<Ffn> experts;
  Ffn shared;
  std::vector<float> expert_scale;  // empty: none
  std::vector<float> score_bias;    // sigmoid routing: random, so it changes the choice

  RandomMoe(const MoeParams& params, uint32_t seed) : p(params) {
    std::mt19937 rng(seed);
    router = random_mat(p.n_expert, p.n_embd, rng, 0.5f);
    for (int64_t e = 0; e < p.n_expert; ++e) {
      experts.push_back({random_mat(p.n_ff, p.n_embd, rng, 0.2f), random_mat(p.n_ff, p.n_embd, rng, 0.2f),
                         random_mat(p.n_embd, p.n_ff, rng, 0.2f)});
    }
    if (p.n_ff_shared > 0) {
      shared = {random_mat(p.n_ff_shared, p.n_embd, rng, 0.2f), random_mat(p.n_ff_shared, p.n_embd, rng, 0.2f),
                random_mat(p.n_embd, p.n_ff_shared, rng, 0.2f)};
      shared_gate = random_mat(1, p.n_embd, rng, 0.3f);
    }
    if (p.sigmoid_scores) score_bias = random_mat(1, p.n_expert, rng, 0.3f).v;
  }

  MoeWeights weights() const {
    MoeWeights w;
    w.router = router.linear();
    for (const Ffn& f : experts) w.experts.push_back(f.weights());
    if (p.n_ff_shared > 0) {
      w.shared = shared.weights();
      if (p.shared_gate) w.shared_gate = shared_gate.linear();
    }
    w.expert_scale = expert_scale;
    w.score_bias = score_bias;
    return w;
  }
};

std::vector<double> matvec(const Mat& m, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(m.n_rows));
  for (int64_t r = 0; r < m.n_rows; ++r) {
    for (int64_t c = 0; c < m.n_cols; ++c) y[r] += double(m.v[r * m.n_cols + c]) * x[c];
  }
  return y;
}

std::vector<double> ffn_ref(const Ffn& f, const std::vector<double>& x, bool gelu = false) {
  std::vector<double> g = matvec(f.gate, x), u = matvec(f.up, x);
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = gelu ? 0.5 * g[i] * (1.0 + std::tanh(0.7978845608028654 * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                          : g[i] / (1.0 + std::exp(-g[i]));
    g[i] = a * u[i];
  }
  return matvec(f.down, g);
}

// transformers' DeepseekV3TopkRouter for one token: the chosen experts and
// their weights (sigmoid scores; choice by scores + bias within the
// topk_group groups of the best top-2 sums; renormalised + 1e-20; scaled).
std::vector<double> sigmoid_route(const RandomMoe& m, const std::vector<double>& logits) {
  const MoeParams& p = m.p;
  const auto X = static_cast<size_t>(p.n_expert), per = X / static_cast<size_t>(p.n_group);
  std::vector<double> sc(X), choice(X);
  for (size_t e = 0; e < X; ++e) {
    sc[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    choice[e] = sc[e] + (m.score_bias.empty() ? 0.0 : m.score_bias[e]);
  }
  std::vector<std::pair<double, size_t>> groups;
  for (size_t g = 0; g < static_cast<size_t>(p.n_group); ++g) {
    std::vector<double> in(choice.begin() + static_cast<ptrdiff_t>(g * per),
                           choice.begin() + static_cast<ptrdiff_t>((g + 1) * per));
    std::sort(in.rbegin(), in.rend());
    groups.push_back({-(in[0] + in[1]), g});
  }
  std::sort(groups.begin(), groups.end());
  for (size_t e = 0; e < X; ++e) {
    bool kept = false;
    for (int64_t k = 0; k < p.topk_group; ++k) kept = kept || groups[static_cast<size_t>(k)].second == e / per;
    if (!kept) choice[e] = 0.0;
  }
  std::vector<size_t> order(X);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return choice[a] > choice[b]; });
  std::vector<double> w(X, 0.0);
  double sum = 0;
  for (int64_t k = 0; k < p.n_expert_used; ++k) sum += sc[order[static_cast<size_t>(k)]];
  for (int64_t k = 0; k < p.n_expert_used; ++k) {
    const size_t e = order[static_cast<size_t>(k)];
    w[e] = (p.norm_topk_prob ? sc[e] / (sum + 1e-20) : sc[e]) * p.routed_scaling_factor;
  }
  return w;
}

// Every expert for every token, weighted by softmax -> top-k (->
// renormalised) (-> times the expert's scale), routed by router_x (x when
// null).
std::vector<float> reference(const RandomMoe& m, const std::vector<float>& x, int64_t n,
                             const std::vector<float>* router_x = nullptr) {
  const MoeParams& p = m.p;
  const std::vector<float>& rx = router_x ? *router_x : x;
  std::vector<float> out(static_cast<size_t>(n * p.n_embd));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> xt(x.begin() + t * p.n_embd, x.begin() + (t + 1) * p.n_embd);
    if (p.sigmoid_scores) {
      const std::vector<double> w = sigmoid_route(m, matvec(m.router, xt));
      std::vector<double> acc(static_cast<size_t>(p.n_embd));
      for (int64_t e = 0; e < p.n_expert; ++e) {
        const std::vector<double> y = ffn_ref(m.experts[e], xt);
        for (int64_t j = 0; j < p.n_embd; ++j) acc[j] += w[e] * y[j];
      }
      if (p.n_ff_shared > 0) {  // DeepSeek's shared experts: no gate
        const std::vector<double> y = ffn_ref(m.shared, xt);
        for (int64_t j = 0; j < p.n_embd; ++j) acc[j] += y[j];
      }
      for (int64_t j = 0; j < p.n_embd; ++j) out[t * p.n_embd + j] = static_cast<float>(acc[j]);
      continue;
    }
    std::vector<double> rt(rx.begin() + t * p.n_embd, rx.begin() + (t + 1) * p.n_embd);
    std::vector<double> pr = matvec(m.router, rt);
    const double mx = *std::max_element(pr.begin(), pr.end());
    double sum = 0;
    for (double& v : pr) sum += (v = std::exp(v - mx));
    for (double& v : pr) v /= sum;
    std::vector<int> order(static_cast<size_t>(p.n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
    double top_sum = 0;
    for (int64_t k = 0; k < p.n_expert_used; ++k) top_sum += pr[order[k]];
    std::vector<double> acc(static_cast<size_t>(p.n_embd));
    for (int64_t e = 0; e < p.n_expert; ++e) {  // dense: every expert, weight 0 unless chosen
      const auto top_end = order.begin() + p.n_expert_used;
      const bool chosen = std::find(order.begin(), top_end, e) != top_end;
      double w = chosen ? (p.norm_topk_prob ? pr[e] / top_sum : pr[e]) : 0.0;
      if (!m.expert_scale.empty()) w *= m.expert_scale[static_cast<size_t>(e)];
      const std::vector<double> y = ffn_ref(m.experts[e], xt, p.gelu_tanh);
      for (int64_t j = 0; j < p.n_embd; ++j) acc[j] += w * y[j];
    }
    if (p.n_ff_shared > 0) {
      const double g = 1.0 / (1.0 + std::exp(-matvec(m.shared_gate, xt)[0]));
      const std::vector<double> y = ffn_ref(m.shared, xt);
      for (int64_t j = 0; j < p.n_embd; ++j) acc[j] += g * y[j];
    }
    for (int64_t j = 0; j < p.n_embd; ++j) out[t * p.n_embd + j] = static_cast<float>(acc[j]);
  }
  return out;
}

std::vector<float> random_input(int64_t n, int64_t e, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * e));
  for (float& v : x) v = d(rng);
  return x;
}

// Counts the rows every matmul multiplies (expert matmuls see only their tokens).
class CountingBackend final : public cpu::HostOps {
 public:
  explicit CountingBackend(cpu::HostOps& b) : b_(b) {}
  const char* name() const override { return "counting"; }
  void reserve(const WeightView* const* ws, int n, int64_t t) override { b_.reserve(ws, n, t); }
  void matmul(const WeightView& w, const float* x, int64_t n, float* y) override {
    rows_ += n * w.n_rows;
    b_.matmul(w, x, n, y);
  }
  void matmul_group(const WeightView* const* ws, float* const* ys, int n_w, const float* x, int64_t n) override {
    for (int i = 0; i < n_w; ++i) rows_ += n * ws[i]->n_rows;
    b_.matmul_group(ws, ys, n_w, x, n);
  }
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    b_.get_rows(w, ids, n, out);
  }
  void rms_norm(const float* x, const float* w, int64_t r, int64_t d, float eps, float* out, float off) override {
    b_.rms_norm(x, w, r, d, eps, out, off);
  }
  void rope(float* x, const int32_t* pos, int64_t n, int64_t h, int64_t hd, const RopeTable& t) override {
    b_.rope(x, pos, n, h, hd, t);
  }
  void attention(const float* q, const int32_t* qp, int64_t nq, const PagedKv& kv, int64_t nkv,
                 const AttentionParams& p, float* out) override {
    b_.attention(q, qp, nq, kv, nkv, p, out);
  }
  void attention_batch(const cpu::AttentionSeq* s, int n, const AttentionParams& p) override {
    b_.attention_batch(s, n, p);
  }
  void silu_mul(const float* g, const float* u, float* out, int64_t n) override { b_.silu_mul(g, u, out, n); }
  void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n) override { b_.gelu_tanh_mul(g, u, out, n); }
  void add_inplace(float* y, const float* x, int64_t n) override { b_.add_inplace(y, x, n); }
  int64_t rows_ = 0;

 private:
  cpu::HostOps& b_;
};

MoeParams params(bool norm, int64_t n_ff_shared = 0) {
  MoeParams p;
  p.n_embd = 48;
  p.n_expert = 6;
  p.n_expert_used = 2;
  p.n_ff = 40;  // not a multiple of the SIMD width: tails everywhere
  p.norm_topk_prob = norm;
  p.n_ff_shared = n_ff_shared;
  return p;
}

void expect_near_reference(const MoeParams& p, uint32_t seed) {
  const RandomMoe m(p, seed);
  const int64_t n = 13;
  auto moe = MoeFfn::create(p, m.weights());
  MoeScratch scratch;
  scratch.reserve(p, n);
  ASSERT_TRUE(moe.ok()) << moe.error().message;
  auto backend = cpu::make_host_ops(2);
  const std::vector<float> x = random_input(n, p.n_embd, seed + 1);
  std::vector<float> out(x.size());
  moe->forward(x.data(), n, out.data(), scratch, *backend);
  const std::vector<float> ref = reference(m, x, n);
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(out[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  EXPECT_GT(max_ref, 0.05);  // the outputs are not trivially small
  EXPECT_LT(max_err, 1e-5) << "max |moe - reference| over outputs up to " << max_ref;
}

TEST(MoeFfn, MatchesDenseReferenceWithRenormalisedTopK) {
  expect_near_reference(params(true), 1);
}
TEST(MoeFfn, MatchesDenseReferenceWithRawTopKProbabilities) {
  expect_near_reference(params(false), 2);
}
TEST(MoeFfn, MatchesDenseReferenceWithSharedExpert) {
  expect_near_reference(params(true, 24), 3);
}
TEST(MoeFfn, MatchesDenseReferenceWhenEveryExpertIsUsed) {
  MoeParams p = params(true);
  p.n_expert_used = p.n_expert;
  expect_near_reference(p, 4);
}

// DeepSeek-V3 / GLM-4.5 routing: sigmoid scores, a random score bias (choice
// only), 4 groups of 2 with the best 2 eligible, weights renormalised and
// scaled by 2.5, an ungated shared expert.
MoeParams sigmoid_params() {
  MoeParams p = params(true, 24);
  p.n_expert = 8;
  p.n_expert_used = 3;
  p.sigmoid_scores = true;
  p.n_group = 4;
  p.topk_group = 2;
  p.routed_scaling_factor = 2.5f;
  p.shared_gate = false;
  return p;
}
TEST(MoeFfn, MatchesReferenceWithSigmoidGroupLimitedRouting) {
  expect_near_reference(sigmoid_params(), 7);
  MoeParams raw = sigmoid_params();
  raw.norm_topk_prob = false;
  raw.n_group = 1;
  raw.topk_group = 1;
  expect_near_reference(raw, 8);
}

// The bias and the groups change which experts run (so the reference test
// above exercises them): without them some token's output differs.
TEST(MoeFfn, ScoreBiasAndGroupsChangeTheChoice) {
  const MoeParams p = sigmoid_params();
  const RandomMoe m(p, 7);
  const int64_t n = 13;
  const std::vector<float> x = random_input(n, p.n_embd, 8);
  auto backend = cpu::make_host_ops(1);
  auto run = [&](const MoeParams& q, bool with_bias) {
    MoeWeights w = m.weights();
    if (!with_bias) w.score_bias.clear();
    auto moe = MoeFfn::create(q, std::move(w));
    EXPECT_TRUE(moe.ok()) << moe.error().message;
    MoeScratch s;
    s.reserve(q, n);
    std::vector<float> out(x.size());
    moe->forward(x.data(), n, out.data(), s, *backend);
    return out;
  };
  MoeParams ungrouped = p;
  ungrouped.n_group = 1;
  ungrouped.topk_group = 1;
  const std::vector<float> full = run(p, true);
  EXPECT_NE(full, run(p, false));
  EXPECT_NE(full, run(ungrouped, true));
}

// Gemma 4's MoE block: GeGLU experts, a per-expert scale on the chosen
// weights, and a router that reads its own input.
TEST(MoeFfn, MatchesDenseReferenceWithGeluExpertsScalesAndRouterInput) {
  MoeParams p = params(true);
  p.gelu_tanh = true;
  RandomMoe m(p, 7);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> d(0.5f, 1.5f);
  for (int64_t e = 0; e < p.n_expert; ++e) m.expert_scale.push_back(d(rng));
  const int64_t n = 13;
  auto moe = MoeFfn::create(p, m.weights());
  ASSERT_TRUE(moe.ok()) << moe.error().message;
  MoeScratch scratch;
  scratch.reserve(p, n);
  auto backend = cpu::make_host_ops(2);
  const std::vector<float> x = random_input(n, p.n_embd, 9), rx = random_input(n, p.n_embd, 10);
  std::vector<float> out(x.size()), same_input(x.size());
  moe->forward(rx.data(), x.data(), n, out.data(), scratch, *backend);
  const std::vector<float> ref = reference(m, x, n, &rx);
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(out[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  EXPECT_GT(max_ref, 0.05);
  EXPECT_LT(max_err, 1e-5) << "max |moe - reference| over outputs up to " << max_ref;
  moe->forward(x.data(), n, same_input.data(), scratch, *backend);
  EXPECT_NE(same_input, out) << "the router input must matter";
  m.expert_scale.assign(static_cast<size_t>(p.n_expert - 1), 1.0f);
  EXPECT_FALSE(MoeFfn::create(p, m.weights()).ok()) << "one scale per expert";
}

// Each token's output is bit-identical alone and inside any batch.
TEST(MoeFfn, TokenOutputsDoNotDependOnTheBatch) {
  const MoeParams p = params(true, 24);
  const RandomMoe m(p, 5);
  const int64_t n = 21, E = p.n_embd;
  auto moe = MoeFfn::create(p, m.weights());
  MoeScratch scratch;
  scratch.reserve(p, n);
  ASSERT_TRUE(moe.ok()) << moe.error().message;
  auto backend = cpu::make_host_ops(2);
  const std::vector<float> x = random_input(n, E, 6);
  std::vector<float> batched(x.size()), alone(static_cast<size_t>(E));
  moe->forward(x.data(), n, batched.data(), scratch, *backend);
  for (int64_t t = 0; t < n; ++t) {
    moe->forward(x.data() + t * E, 1, alone.data(), scratch, *backend);
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data() + t * E, static_cast<size_t>(E) * sizeof(float)))
        << "token " << t;
  }
  // A sub-batch of the tokens in another order.
  const int64_t sub[] = {17, 3, 9, 3, 20};
  std::vector<float> xs, ys(std::size(sub) * static_cast<size_t>(E));
  for (int64_t t : sub) xs.insert(xs.end(), x.begin() + t * E, x.begin() + (t + 1) * E);
  moe->forward(xs.data(), std::ssize(sub), ys.data(), scratch, *backend);
  for (size_t i = 0; i < std::size(sub); ++i) {
    EXPECT_EQ(0, std::memcmp(ys.data() + i * E, batched.data() + sub[i] * E, static_cast<size_t>(E) * sizeof(float)))
        << "sub-batch row " << i;
  }
}

// The CPU Backend's moe_ffn is MoeFfn::forward bit for bit (the same
// arithmetic behind the op): overwriting, and adding into a residual as
// the families do, for the softmax router with a gated shared expert,
// DeepSeek's sigmoid group-limited router and Gemma 4's GeGLU experts with
// scales and their own router input.
TEST(MoeFfn, CpuBackendOpIsMoeFfnBitForBit) {
  MoeParams gemma4 = params(true);
  gemma4.gelu_tanh = true;
  for (const MoeParams& p : {params(true, 24), sigmoid_params(), gemma4}) {
    RandomMoe m(p, 31);
    if (p.gelu_tanh) m.expert_scale.assign(static_cast<size_t>(p.n_expert), 1.25f);
    auto moe = MoeFfn::create(p, m.weights());
    ASSERT_TRUE(moe.ok()) << moe.error().message;
    const int64_t n = 11;
    const std::vector<float> x = random_input(n, p.n_embd, 32), residual = random_input(n, p.n_embd, 34);
    const std::vector<float> rx = p.gelu_tanh ? random_input(n, p.n_embd, 33) : x;
    MoeScratch scratch;
    scratch.reserve(p, n);
    auto host = cpu::make_host_ops(1);
    std::vector<float> want(x.size());
    moe->forward(rx.data(), x.data(), n, want.data(), scratch, *host);

    auto backend = make_cpu_backend(2);
    auto w = backend->place_moe(moe->host(), "layer");
    ASSERT_TRUE(w.ok()) << w.error().message;
    ASSERT_TRUE(backend->reserve({n, 1, 16}).ok());
    std::vector<float> in = x, router_in = rx, out(x.size(), NAN), acc = residual;
    const Tensor in_t = Tensor::dense(in.data(), DType::kF32, n, p.n_embd);
    const Tensor router_t = Tensor::dense(router_in.data(), DType::kF32, n, p.n_embd);
    StepMetadata step;
    step.n_tokens = static_cast<int32_t>(n);
    ASSERT_TRUE(
        backend->moe_ffn(*w, router_t, in_t, Tensor::dense(out.data(), DType::kF32, n, p.n_embd), false, step).ok());
    ASSERT_TRUE(
        backend->moe_ffn(*w, router_t, in_t, Tensor::dense(acc.data(), DType::kF32, n, p.n_embd), true, step).ok());
    EXPECT_EQ(out, want);
    for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], residual[i] + want[i]) << "at " << i;
  }
}

// Only the routed rows are multiplied: router + n * k rows per expert weight.
TEST(MoeFfn, ComputesOnlyTheRoutedExperts) {
  MoeParams p = params(true);
  p.n_expert = 16;
  const RandomMoe m(p, 7);
  const int64_t n = 3;
  auto moe = MoeFfn::create(p, m.weights());
  MoeScratch scratch;
  scratch.reserve(p, n);
  ASSERT_TRUE(moe.ok()) << moe.error().message;
  auto host = cpu::make_host_ops(1);
  CountingBackend counting(*host);
  const std::vector<float> x = random_input(n, p.n_embd, 8);
  std::vector<float> out(x.size());
  moe->forward(x.data(), n, out.data(), scratch, counting);
  const int64_t per_row = 2 * p.n_ff + p.n_embd;  // gate + up + down rows per routed token
  EXPECT_EQ(counting.rows_, n * p.n_expert + n * p.n_expert_used * per_row);
}

// The GGUF layout (one [n_expert, rows, cols] tensor per projection) binds
// to the same experts as one tensor per expert.
TEST(MoeFfn, StackedAndPerExpertTensorsGiveTheSameResult) {
  const MoeParams p = params(true, 24);
  const RandomMoe m(p, 9);
  auto ref = [](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    TensorRef t;
    t.name = name;
    t.file = "test";
    t.dtype = DType::kF32;
    t.shape = shape;
    t.data = reinterpret_cast<const uint8_t*>(data);
    t.n_bytes = static_cast<size_t>(t.n_elements()) * sizeof(float);
    return t;
  };
  ModelFiles per_expert, stacked;
  std::vector<float> gates, ups, downs;
  for (ModelFiles* f : {&per_expert, &stacked}) {
    f->path = "test";
    f->tensors["mlp.gate.weight"] = ref("mlp.gate.weight", {p.n_expert, p.n_embd}, m.router.v.data());
    f->tensors["mlp.shared_expert.gate_proj.weight"] =
        ref("mlp.shared_expert.gate_proj.weight", {p.n_ff_shared, p.n_embd}, m.shared.gate.v.data());
    f->tensors["mlp.shared_expert.up_proj.weight"] =
        ref("mlp.shared_expert.up_proj.weight", {p.n_ff_shared, p.n_embd}, m.shared.up.v.data());
    f->tensors["mlp.shared_expert.down_proj.weight"] =
        ref("mlp.shared_expert.down_proj.weight", {p.n_embd, p.n_ff_shared}, m.shared.down.v.data());
  }
  per_expert.tensors["mlp.shared_expert_gate.weight"] =
      ref("mlp.shared_expert_gate.weight", {1, p.n_embd}, m.shared_gate.v.data());
  stacked.tensors["mlp.shared_expert_gate.weight"] =
      ref("mlp.shared_expert_gate.weight", {p.n_embd}, m.shared_gate.v.data());
  for (int64_t e = 0; e < p.n_expert; ++e) {
    const Ffn& f = m.experts[e];
    const std::string pre = "mlp.experts." + std::to_string(e) + ".";
    per_expert.tensors[pre + "gate_proj.weight"] = ref(pre + "gate_proj.weight", {p.n_ff, p.n_embd}, f.gate.v.data());
    per_expert.tensors[pre + "up_proj.weight"] = ref(pre + "up_proj.weight", {p.n_ff, p.n_embd}, f.up.v.data());
    per_expert.tensors[pre + "down_proj.weight"] = ref(pre + "down_proj.weight", {p.n_embd, p.n_ff}, f.down.v.data());
    gates.insert(gates.end(), f.gate.v.begin(), f.gate.v.end());
    ups.insert(ups.end(), f.up.v.begin(), f.up.v.end());
    downs.insert(downs.end(), f.down.v.begin(), f.down.v.end());
  }
  stacked.tensors["mlp.experts.gate_proj.weight"] =
      ref("mlp.experts.gate_proj.weight", {p.n_expert, p.n_ff, p.n_embd}, gates.data());
  stacked.tensors["mlp.experts.up_proj.weight"] =
      ref("mlp.experts.up_proj.weight", {p.n_expert, p.n_ff, p.n_embd}, ups.data());
  stacked.tensors["mlp.experts.down_proj.weight"] =
      ref("mlp.experts.down_proj.weight", {p.n_expert, p.n_embd, p.n_ff}, downs.data());

  const int64_t n = 9;
  auto a = MoeFfn::bind(per_expert, "mlp.", p);
  auto b = MoeFfn::bind(stacked, "mlp.", p);
  MoeScratch scratch;
  scratch.reserve(p, n);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  auto backend = cpu::make_host_ops(2);
  const std::vector<float> x = random_input(n, p.n_embd, 10);
  std::vector<float> ya(x.size()), yb(x.size());
  a->forward(x.data(), n, ya.data(), scratch, *backend);
  b->forward(x.data(), n, yb.data(), scratch, *backend);
  EXPECT_EQ(ya, yb);
  const std::vector<float> r = reference(m, x, n);
  for (size_t i = 0; i < r.size(); ++i) ASSERT_NEAR(ya[i], r[i], 1e-5) << i;

  // A wrong shape is an error naming the tensor.
  stacked.tensors["mlp.experts.up_proj.weight"].shape = {p.n_expert, p.n_ff + 1, p.n_embd};
  auto bad = MoeFfn::bind(stacked, "mlp.", p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("mlp.experts.up_proj.weight"), std::string::npos) << bad.error().message;
}

TEST(MoeFfn, RejectsInconsistentParameters) {
  MoeParams p = params(true);
  const RandomMoe m(p, 11);
  p.n_expert_used = p.n_expert + 1;
  EXPECT_FALSE(MoeFfn::create(p, m.weights()).ok());
  p = params(true);
  MoeWeights w = m.weights();
  w.experts.pop_back();
  auto r = MoeFfn::create(p, std::move(w));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("experts"), std::string::npos) << r.error().message;
  // Groups: equal, of at least two experts, enough eligible experts; a bias per expert.
  const MoeParams sp = sigmoid_params();
  const RandomMoe sm(sp, 12);
  for (auto [n_group, topk_group] : {std::pair{3, 1}, std::pair{4, 5}, std::pair{8, 4}, std::pair{4, 1}}) {
    MoeParams q = sp;
    q.n_group = n_group;
    q.topk_group = topk_group;
    EXPECT_FALSE(MoeFfn::create(q, sm.weights()).ok()) << n_group << " groups, " << topk_group << " eligible";
  }
  MoeWeights short_bias = sm.weights();
  short_bias.score_bias.pop_back();
  EXPECT_FALSE(MoeFfn::create(sp, std::move(short_bias)).ok());
  EXPECT_TRUE(MoeFfn::create(sp, sm.weights()).ok());
}

// transformers' Qwen3-MoE rule: sparse when (il + 1) % decoder_sparse_step
// == 0 and il is not in mlp_only_layers.
TEST(MoeFfn, LayerRuleAndParamsFromConfig) {
  ModelConfig c;
  c.n_embd = 64;
  c.n_ff = 128;
  c.n_layer = 6;
  EXPECT_FALSE(is_moe_layer(c, 0));
  c.n_expert = 8;
  c.n_expert_used = 2;
  for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_TRUE(is_moe_layer(c, il)) << il;
  c.moe_layer_step = 2;
  c.dense_layers = {3};
  const bool expected[] = {false, true, false, false, false, true};
  for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_EQ(is_moe_layer(c, il), expected[il]) << il;

  MoeParams p = moe_params(c);
  EXPECT_EQ(p.n_ff, 128);  // Mixtral: experts as wide as intermediate_size
  c.n_ff_expert = 32;
  c.n_ff_shared_expert = 16;
  c.norm_topk_prob = false;
  p = moe_params(c);
  EXPECT_EQ(p.n_embd, 64);
  EXPECT_EQ(p.n_expert, 8);
  EXPECT_EQ(p.n_expert_used, 2);
  EXPECT_EQ(p.n_ff, 32);
  EXPECT_EQ(p.n_ff_shared, 16);
  EXPECT_FALSE(p.norm_topk_prob);
  EXPECT_FALSE(p.sigmoid_scores);
  EXPECT_TRUE(p.shared_gate);
  // n_routed_experts (DeepSeek-V3, GLM-4.5): the sigmoid router's options.
  c.raw = {{"n_routed_experts", 8}, {"n_group", 4}, {"topk_group", 2}, {"routed_scaling_factor", 2.5}};
  p = moe_params(c);
  EXPECT_TRUE(p.sigmoid_scores);
  EXPECT_FALSE(p.shared_gate);
  EXPECT_EQ(p.n_group, 4);
  EXPECT_EQ(p.topk_group, 2);
  EXPECT_FLOAT_EQ(p.routed_scaling_factor, 2.5f);
}

}  // namespace
}  // namespace rill
