// MoeFfn's gpt-oss options against a direct double-precision reference:
// softmax_after_topk (the top-k of the router's logits, its bias included,
// then a softmax over those k) and the clamped SwiGLU (gate clamped above
// at the limit, up to [-limit, limit], act = g * sigmoid(alpha g) * (u + 1)),
// with biases on every expert Linear. The inputs are scaled so that gate
// and up values cross +-limit (the transformers golden's tiny model never
// reaches the clamp), and the test checks that they do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/host_ops.h"
#include "model/moe.h"

namespace rill {
namespace {

struct Mat {
  int64_t n_rows = 0, n_cols = 0;
  std::vector<float> v, bias;
  Linear linear() const {
    Linear l;
    l.w.dtype = DType::kF32;
    l.w.n_rows = n_rows;
    l.w.n_cols = n_cols;
    l.w.data = v.data();
    l.w.row_stride = static_cast<size_t>(n_cols) * sizeof(float);
    l.bias = bias;
    return l;
  }
  // W x + b in double.
  std::vector<double> apply(const float* x) const {
    std::vector<double> y(static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) {
      double s = bias.empty() ? 0.0 : bias[static_cast<size_t>(r)];
      for (int64_t c = 0; c < n_cols; ++c) s += double(v[static_cast<size_t>(r * n_cols + c)]) * x[c];
      y[static_cast<size_t>(r)] = s;
    }
    return y;
  }
};

Mat random_mat(int64_t r, int64_t c, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  Mat m{r, c, std::vector<float>(static_cast<size_t>(r * c)), std::vector<float>(static_cast<size_t>(r))};
  for (float& x : m.v) x = d(rng);
  for (float& x : m.bias) x = d(rng);
  return m;
}

TEST(MoeGptOss, TopKSoftmaxRoutingAndClampedSwigluMatchTheReference) {
  MoeParams p;
  p.n_embd = 24;
  p.n_expert = 5;
  p.n_expert_used = 2;
  p.n_ff = 12;
  p.norm_topk_prob = false;  // does not apply with softmax_after_topk
  p.softmax_after_topk = true;
  p.swiglu_limit = 7.0f;
  p.swiglu_alpha = 1.702f;
  std::mt19937 rng(20);
  const Mat router = random_mat(p.n_expert, p.n_embd, rng, 0.4f);
  std::vector<Mat> gate, up, down;
  for (int64_t e = 0; e < p.n_expert; ++e) {
    gate.push_back(random_mat(p.n_ff, p.n_embd, rng, 1.0f));
    up.push_back(random_mat(p.n_ff, p.n_embd, rng, 1.0f));
    down.push_back(random_mat(p.n_embd, p.n_ff, rng, 0.2f));
  }
  MoeWeights w;
  w.router = router.linear();
  for (int64_t e = 0; e < p.n_expert; ++e) w.experts.push_back({gate[e].linear(), up[e].linear(), down[e].linear()});
  auto moe = MoeFfn::create(p, std::move(w));
  ASSERT_TRUE(moe.ok()) << moe.error().message;

  const int64_t n = 9;
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n * p.n_embd));
  for (float& v : x) v = d(rng);
  MoeScratch scratch;
  scratch.reserve(p, n);
  auto host = cpu::make_host_ops(2);
  std::vector<float> out(x.size());
  moe->forward(x.data(), n, out.data(), scratch, *host);

  int n_gate_clamped = 0, n_up_clamped = 0;
  double max_err = 0, max_ref = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * p.n_embd;
    const std::vector<double> logits = router.apply(xt);
    std::vector<int> order(static_cast<size_t>(p.n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const double l0 = logits[order[0]], l1 = logits[order[1]];
    const double w0 = 1.0 / (1.0 + std::exp(l1 - l0)), w1 = 1.0 - w0;
    std::vector<double> ref(static_cast<size_t>(p.n_embd));
    for (int k = 0; k < 2; ++k) {
      const int e = order[static_cast<size_t>(k)];
      const std::vector<double> g = gate[e].apply(xt), u = up[e].apply(xt);
      std::vector<float> act(static_cast<size_t>(p.n_ff));
      for (int64_t i = 0; i < p.n_ff; ++i) {
        n_gate_clamped += g[i] > 7.0;
        n_up_clamped += std::fabs(u[i]) > 7.0;
        const double gc = std::min(g[i], 7.0), uc = std::clamp(u[i], -7.0, 7.0);
        act[static_cast<size_t>(i)] = static_cast<float>(gc / (1.0 + std::exp(-1.702 * gc)) * (uc + 1.0));
      }
      const std::vector<double> y = down[e].apply(act.data());
      for (int64_t j = 0; j < p.n_embd; ++j) ref[j] += (k == 0 ? w0 : w1) * y[j];
    }
    for (int64_t j = 0; j < p.n_embd; ++j) {
      max_err = std::max(max_err, std::fabs(out[t * p.n_embd + j] - ref[j]));
      max_ref = std::max(max_ref, std::fabs(ref[j]));
    }
  }
  EXPECT_GT(n_gate_clamped, 0) << "no gate value crossed the limit";
  EXPECT_GT(n_up_clamped, 0) << "no up value crossed the limit";
  EXPECT_GT(max_ref, 0.5);
  EXPECT_LT(max_err, 1e-4 * max_ref) << "max |out - reference| = " << max_err;
}

}  // namespace
}  // namespace rill
