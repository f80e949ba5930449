// The Gated DeltaNet ops (causal conv1d + SiLU, gated delta rule) against a
// direct double-precision transcription of transformers' torch reference,
// and their invariances: a sequence split into several calls, batched with
// other sequences, or snapshotted mid-call gives bit-identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/gated_delta.h"

namespace rill::cpu {
namespace {

std::vector<float> rnd(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// --- conv1d ---------------------------------------------------------------

// F.conv1d over [state ; x] (the K-1 state inputs first), then SiLU, in double.
std::vector<double> conv_reference(const std::vector<float>& x, const std::vector<float>& state,
                                   const std::vector<float>& w, int64_t n, int64_t C, int64_t K) {
  std::vector<double> out(static_cast<size_t>(n * C));
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> in;
    for (int64_t j = 0; j < K - 1; ++j) in.push_back(state[c * (K - 1) + j]);
    for (int64_t t = 0; t < n; ++t) in.push_back(x[t * C + c]);
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += static_cast<double>(w[c * K + j]) * in[t + j];
      out[t * C + c] = acc / (1.0 + std::exp(-acc));
    }
  }
  return out;
}

TEST(CausalConv1d, MatchesReferenceAndKeepsTheLastInputs) {
  ThreadPool pool(2);
  const int64_t C = 150, K = 4, n = 9;  // C: not a multiple of the channel block
  const auto w = rnd(C * K, 1);
  const auto x0 = rnd(n * C, 2, -2, 2);
  const auto st0 = rnd(C * (K - 1), 3);
  auto x = x0;
  auto st = st0;
  ConvSeq s{x.data(), n, st.data()};
  causal_conv1d_silu_batch(&s, 1, w.data(), C, K, C, pool);
  const auto want = conv_reference(x0, st0, w, n, C, K);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 1e-5) << i;
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K - 1; ++j) ASSERT_EQ(st[c * (K - 1) + j], x0[(n - (K - 1) + j) * C + c]);
  }
}

TEST(CausalConv1d, SplitBatchedAndSnapshottedRunsAreBitIdentical) {
  ThreadPool pool(2);
  const int64_t C = 70, K = 4, n = 11;
  const auto w = rnd(C * K, 4);
  const auto x0 = rnd(n * C, 5, -2, 2);
  // Whole sequence in one call, with snapshots after tokens 2 and 7.
  auto x_all = x0;
  std::vector<float> st_all(C * (K - 1), 0.0f), snap2(st_all.size()), snap7(st_all.size());
  const StateSnapshot snaps[2] = {{2, snap2.data()}, {7, snap7.data()}};
  ConvSeq all{x_all.data(), n, st_all.data(), snaps, 2};
  causal_conv1d_silu_batch(&all, 1, w.data(), C, K, C, pool);
  // Token by token, batched with an unrelated sequence each call.
  auto x_one = x0;
  std::vector<float> st_one(st_all.size(), 0.0f);
  auto other = rnd(C, 6);
  std::vector<float> st_other(st_all.size(), 0.5f);
  for (int64_t t = 0; t < n; ++t) {
    const ConvSeq two[2] = {{other.data(), 1, st_other.data()}, {x_one.data() + t * C, 1, st_one.data()}};
    causal_conv1d_silu_batch(two, 2, w.data(), C, K, C, pool);
    if (t == 2) {
      EXPECT_EQ(st_one, snap2);
    }
    if (t == 7) {
      EXPECT_EQ(st_one, snap7);
    }
  }
  EXPECT_EQ(x_one, x_all);
  EXPECT_EQ(st_one, st_all);
}

// --- gated delta rule -----------------------------------------------------

struct DeltaCase {
  int64_t nk = 2, nv = 4, dk = 16, dv = 8, n = 13;
  std::vector<float> q, k, v, g, beta;
  DeltaCase() {
    q = rnd(n * nk * dk, 10);
    k = rnd(n * nk * dk, 11);
    v = rnd(n * nv * dv, 12);
    g = rnd(n * nv, 13, -2.0f, -0.01f);
    beta = rnd(n * nv, 14, 0.0f, 1.0f);
  }
  GatedDeltaParams params() const { return {nk, nv, dk, dv, nk * dk, nv, nv * dv}; }
  // Tokens [t0, t0 + len) of this case as one sequence of a call.
  GatedDeltaSeq seq(int64_t t0, int64_t len, float* out, float* state) const {
    GatedDeltaSeq s;
    s.q = q.data() + t0 * nk * dk;
    s.k = k.data() + t0 * nk * dk;
    s.v = v.data() + t0 * nv * dv;
    s.g = g.data() + t0 * nv;
    s.beta = beta.data() + t0 * nv;
    s.out = out + t0 * nv * dv;
    s.n_tokens = len;
    s.state = state;
    return s;
  }
};

// torch_recurrent_gated_delta_rule (use_qk_l2norm_in_kernel=True), in double.
void delta_reference(const DeltaCase& c, std::vector<double>& out, std::vector<double>& S) {
  out.assign(static_cast<size_t>(c.n * c.nv * c.dv), 0.0);
  S.assign(static_cast<size_t>(c.nv * c.dk * c.dv), 0.0);
  auto l2 = [](const float* x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
    std::vector<double> o(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] / std::sqrt(s + 1e-6);
    return o;
  };
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t h = 0; h < c.nv; ++h) {
      const int64_t kh = h / (c.nv / c.nk);
      auto qn = l2(&c.q[(t * c.nk + kh) * c.dk], c.dk);
      auto kn = l2(&c.k[(t * c.nk + kh) * c.dk], c.dk);
      for (double& x : qn) x /= std::sqrt(double(c.dk));
      double* Sh = &S[h * c.dk * c.dv];
      const double decay = std::exp(double(c.g[t * c.nv + h])), beta = c.beta[t * c.nv + h];
      for (int64_t i = 0; i < c.dk * c.dv; ++i) Sh[i] *= decay;
      for (int64_t j = 0; j < c.dv; ++j) {
        double mem = 0;
        for (int64_t i = 0; i < c.dk; ++i) mem += Sh[i * c.dv + j] * kn[i];
        const double delta = (c.v[(t * c.nv + h) * c.dv + j] - mem) * beta;
        for (int64_t i = 0; i < c.dk; ++i) Sh[i * c.dv + j] += kn[i] * delta;
      }
      for (int64_t j = 0; j < c.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < c.dk; ++i) o += Sh[i * c.dv + j] * qn[i];
        out[(t * c.nv + h) * c.dv + j] = o;
      }
    }
  }
}

TEST(GatedDelta, MatchesTheTorchRecurrence) {
  ThreadPool pool(2);
  const DeltaCase c;
  std::vector<float> out(static_cast<size_t>(c.n * c.nv * c.dv)), S(static_cast<size_t>(c.nv * c.dk * c.dv), 0.0f);
  const GatedDeltaSeq s = c.seq(0, c.n, out.data(), S.data());
  gated_delta_batch(&s, 1, c.params(), pool);
  std::vector<double> want_out, want_S;
  delta_reference(c, want_out, want_S);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want_out[i], 1e-5) << i;
  for (size_t i = 0; i < S.size(); ++i) ASSERT_NEAR(S[i], want_S[i], 1e-5) << i;
}

TEST(GatedDelta, SplitBatchedAndSnapshottedRunsAreBitIdentical) {
  ThreadPool pool(3);
  const DeltaCase c;
  const size_t n_out = static_cast<size_t>(c.n * c.nv * c.dv), n_state = static_cast<size_t>(c.nv * c.dk * c.dv);
  std::vector<float> out_all(n_out), S_all(n_state, 0.0f), snap4(n_state), snap9(n_state);
  const StateSnapshot snaps[2] = {{4, snap4.data()}, {9, snap9.data()}};
  GatedDeltaSeq all = c.seq(0, c.n, out_all.data(), S_all.data());
  all.snapshots = snaps;
  all.n_snapshots = 2;
  gated_delta_batch(&all, 1, c.params(), pool);

  // Chunks of 5, 1, 1, 6 tokens, each call batched with a second sequence
  // (the same case from another state) placed first.
  std::vector<float> out_split(n_out), S_split(n_state, 0.0f), out_other(n_out), S_other(n_state, 0.25f);
  int64_t t0 = 0;
  for (int64_t len : {5, 1, 1, 6}) {
    const GatedDeltaSeq two[2] = {c.seq(t0, len, out_other.data(), S_other.data()),
                                  c.seq(t0, len, out_split.data(), S_split.data())};
    gated_delta_batch(two, 2, c.params(), pool);
    t0 += len;
    if (t0 == 5) {
      // Resume from the snapshot after token 4: the same as carrying on.
      EXPECT_EQ(S_split, snap4);
    }
  }
  EXPECT_EQ(out_split, out_all);
  EXPECT_EQ(S_split, S_all);

  // Restarting from the snapshot after token 9 reproduces the tail.
  std::vector<float> out_tail(n_out), S_tail = snap9;
  const GatedDeltaSeq tail = c.seq(10, c.n - 10, out_tail.data(), S_tail.data());
  gated_delta_batch(&tail, 1, c.params(), pool);
  EXPECT_EQ(std::vector<float>(out_tail.begin() + 10 * c.nv * c.dv, out_tail.end()),
            std::vector<float>(out_all.begin() + 10 * c.nv * c.dv, out_all.end()));
  EXPECT_EQ(S_tail, S_all);
}

}  // namespace
}  // namespace rill::cpu
