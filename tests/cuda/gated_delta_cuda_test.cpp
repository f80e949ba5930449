// The gated DeltaNet kernels (backend/cuda/gated_delta.h) against the CPU
// reference (backend/cpu/gated_delta.h) on random inputs:
//  - gdn_conv: the causal conv1d + silu over three sequences (one from zeros
//    at position 0, one from its slot, one from a checkpoint) with snapshots
//    mid-step, the q/k l2 norms, g and beta; the conv windows left in the
//    slots and snapshots;
//  - gdn_recurrence: outputs, final states and snapshots vs
//    cpu::gated_delta_batch (which normalizes q/k itself);
//  - the same sequences split into steps of 1 and of 3 tokens (decode,
//    chunked prefill) give bit-identical outputs, states and snapshots;
//  - the gated RMSNorm and the sigmoid output gate (f32 and bf16 outputs).
// Dims: the goldens' (dk = dv = 16) and dk 40 / dv 24 (rows masked in the
// warp, several column groups) and dk 128 / dv 64, each with 8 and 4 value
// columns per warp of the recurrence.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cpu/gated_delta.h"
#include "backend/cuda/gated_delta.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::random_floats;
using testing::upload;

struct Dims {
  int32_t nk, nv, dk, dv, K;
  int32_t columns;  // value columns per warp of the recurrence
  int64_t kd() const { return int64_t{nk} * dk; }
  int64_t vd() const { return int64_t{nv} * dv; }
  int64_t cd() const { return 2 * kd() + vd(); }
  int64_t P() const { return cd() + vd() + 2 * nv; }  // q|k|v, z, b, a
  int64_t conv_floats() const { return cd() * (K - 1); }
  int64_t state_floats() const { return conv_floats() + int64_t{nv} * dk * dv; }
};

// One sequence of a step: its tokens' global indices, state ids and saves.
struct StepSeq {
  std::vector<int32_t> tokens;
  int32_t src = -1, dst = 0;
  std::vector<GdnSave> saves;  // after_token relative to this step
};

// Holds the state pool on the device and runs steps over global token rows.
class Harness {
 public:
  Harness(const Dims& d, int32_t n_states, const std::vector<float>& proj, int64_t n_tokens, uint32_t seed)
      : d_(d), n_states_(n_states), proj_(proj), T_(n_tokens) {
    conv_w_ = random_floats(static_cast<size_t>(d.cd() * d.K), seed, -0.6f, 0.6f);
    neg_a_ = random_floats(static_cast<size_t>(d.nv), seed + 1, -1.5f, 0.5f);
    for (float& x : neg_a_) x = -std::exp(x);
    dt_bias_ = random_floats(static_cast<size_t>(d.nv), seed + 2, -0.5f, 0.5f);
    init_states_ = random_floats(static_cast<size_t>(n_states * d.state_floats()), seed + 3, -0.5f, 0.5f);
    states_ = upload(init_states_);
    conv_w_dev_ = upload(conv_w_);
    neg_a_dev_ = upload(neg_a_);
    dt_bias_dev_ = upload(dt_bias_);
    mixed_.assign(static_cast<size_t>(T_ * d.cd()), 0.0f);
    g_.assign(static_cast<size_t>(T_ * d.nv), 0.0f);
    beta_ = g_;
    core_.assign(static_cast<size_t>(T_ * d.vd()), 0.0f);
  }

  void run(const std::vector<StepSeq>& seqs) {
    std::vector<GdnSeq> gs;
    std::vector<GdnSave> saves;
    std::vector<int32_t> tok_seq, rows;
    for (const StepSeq& s : seqs) {
      GdnSeq g;
      g.q_start = static_cast<int32_t>(rows.size());
      g.q_len = static_cast<int32_t>(s.tokens.size());
      g.src = s.src;
      g.dst = s.dst;
      g.save_begin = static_cast<int32_t>(saves.size());
      g.n_saves = static_cast<int32_t>(s.saves.size());
      saves.insert(saves.end(), s.saves.begin(), s.saves.end());
      for (int32_t t : s.tokens) {
        rows.push_back(t);
        tok_seq.push_back(static_cast<int32_t>(gs.size()));
      }
      gs.push_back(g);
    }
    const auto n = static_cast<int64_t>(rows.size());
    std::vector<float> proj(static_cast<size_t>(n * d_.P()));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(proj_.begin() + rows[i] * d_.P(), d_.P(), proj.begin() + i * d_.P());
    }
    saves.push_back({});  // never empty
    auto proj_dev = upload(proj);
    auto seqs_dev = upload(gs);
    auto saves_dev = upload(saves);
    auto tok_dev = upload(tok_seq);
    auto mixed = testing::poisoned(static_cast<size_t>(n * d_.cd()) * 4);
    auto g = testing::poisoned(static_cast<size_t>(n * d_.nv) * 4);
    auto beta = testing::poisoned(static_cast<size_t>(n * d_.nv) * 4);
    auto core = testing::poisoned(static_cast<size_t>(n * d_.vd()) * 4);
    GdnArgs a;
    a.n_k_heads = d_.nk, a.n_v_heads = d_.nv, a.head_k_dim = d_.dk, a.head_v_dim = d_.dv, a.conv_kernel = d_.K;
    a.seqs = seqs_dev.as<GdnSeq>();
    a.n_seqs = static_cast<int32_t>(gs.size());
    a.saves = saves_dev.as<GdnSave>();
    a.tok_seq = tok_dev.as<int32_t>();
    a.n_tokens = n;
    a.states = states_.as<float>();
    a.state_stride = d_.state_floats();
    a.conv_w = conv_w_dev_.as<float>();
    a.neg_a = neg_a_dev_.as<float>();
    a.dt_bias = dt_bias_dev_.as<float>();
    a.proj = proj_dev.as<float>();
    a.proj_stride = d_.P();
    a.b_off = d_.cd() + d_.vd();
    a.a_off = a.b_off + d_.nv;
    a.mixed = mixed.as<float>();
    a.g = g.as<float>();
    a.beta = beta.as<float>();
    a.core = core.as<float>();
    a.columns = d_.columns;
    gdn_conv(a, nullptr);
    gdn_recurrence(a, nullptr);
    RILL_CUDA_CHECK(cudaGetLastError());
    auto scatter = [&](const DeviceBuffer& b, int64_t width, std::vector<float>& dst) {
      const auto h = download<float>(b, static_cast<size_t>(n * width));
      for (int64_t i = 0; i < n; ++i) std::copy_n(h.begin() + i * width, width, dst.begin() + rows[i] * width);
    };
    scatter(mixed, d_.cd(), mixed_);
    scatter(g, d_.nv, g_);
    scatter(beta, d_.nv, beta_);
    scatter(core, d_.vd(), core_);
  }
  std::vector<float> states() const {
    return download<float>(states_, static_cast<size_t>(n_states_ * d_.state_floats()));
  }

  Dims d_;
  int32_t n_states_;
  std::vector<float> proj_;
  int64_t T_;
  std::vector<float> conv_w_, neg_a_, dt_bias_, init_states_;
  DeviceBuffer states_, conv_w_dev_, neg_a_dev_, dt_bias_dev_;
  std::vector<float> mixed_, g_, beta_, core_;  // [T, ...] by global token
};

// The test's sequences over 15 tokens: A (tokens 0-4) from zeros into slot
// 0, saved after token 4 into state 5; B (token 5) from slot 1 into slot 1;
// C (tokens 6-14) from checkpoint state 4 into slot 2, saved after tokens 2
// and 6 into states 6 and 7. States 0-3: slots, 4-7: checkpoints.
constexpr int32_t kStates = 8;
std::vector<StepSeq> whole_step() {
  return {
      {{0, 1, 2, 3, 4}, -1, 0, {{4, 5}}}, {{5}, 1, 1, {}}, {{6, 7, 8, 9, 10, 11, 12, 13, 14}, 4, 2, {{2, 6}, {6, 7}}}};
}
constexpr int64_t kTokens = 15;

// The same sequences in steps of `chunk` tokens, each step holding every
// sequence that still has tokens (the first step starts as whole_step()).
std::vector<std::vector<StepSeq>> chunked_steps(int32_t chunk) {
  std::vector<std::vector<StepSeq>> steps;
  const std::vector<StepSeq> whole = whole_step();
  for (int32_t begin = 0;; begin += chunk) {
    std::vector<StepSeq> step;
    for (const StepSeq& s : whole) {
      const auto len = static_cast<int32_t>(s.tokens.size());
      if (begin >= len) continue;
      StepSeq c;
      const int32_t end = std::min(len, begin + chunk);
      c.tokens.assign(s.tokens.begin() + begin, s.tokens.begin() + end);
      c.src = begin == 0 ? s.src : s.dst;
      c.dst = s.dst;
      for (const GdnSave& v : s.saves) {
        if (v.after_token >= begin && v.after_token < end) c.saves.push_back({v.after_token - begin, v.state});
      }
      step.push_back(std::move(c));
    }
    if (step.empty()) break;
    steps.push_back(std::move(step));
  }
  return steps;
}

void l2norm_scaled(const float* x, int64_t n, float scale, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class GatedDeltaCuda : public ::testing::TestWithParam<Dims> {
 protected:
  void SetUp() override { RILL_REQUIRE_GPU(); }
};

TEST_P(GatedDeltaCuda, ConvAndRecurrenceMatchTheCpu) {
  const Dims d = GetParam();
  const auto proj = random_floats(static_cast<size_t>(kTokens * d.P()), 11, -1.0f, 1.0f);
  Harness h(d, kStates, proj, kTokens, 21);
  h.run(whole_step());
  const std::vector<float> gpu_states = h.states();

  // The CPU reference, over host copies of the same states.
  std::vector<float> st = h.init_states_;
  const int64_t cd = d.cd(), nv = d.nv, vd = d.vd(), SF = d.state_floats();
  auto conv_of = [&](int32_t id) { return st.data() + id * SF; };
  auto delta_of = [&](int32_t id) { return st.data() + id * SF + d.conv_floats(); };
  std::vector<float> x(static_cast<size_t>(kTokens * cd)), g(static_cast<size_t>(kTokens * nv)), beta(g.size());
  std::vector<float> core(static_cast<size_t>(kTokens * vd));
  for (int64_t t = 0; t < kTokens; ++t) {
    std::copy_n(proj.begin() + t * d.P(), cd, x.begin() + t * cd);
    for (int64_t i = 0; i < nv; ++i) {
      const float b = proj[t * d.P() + cd + vd + i], a = proj[t * d.P() + cd + vd + nv + i];
      beta[t * nv + i] = 1.0f / (1.0f + std::exp(-b));
      const float z = a + h.dt_bias_[i];
      g[t * nv + i] = h.neg_a_[i] * (z > 20.0f ? z : std::log1p(std::exp(z)));
    }
  }
  ThreadPool pool(1);
  std::vector<cpu::ConvSeq> conv_seqs;
  std::vector<cpu::GatedDeltaSeq> delta_seqs;
  std::vector<std::vector<cpu::StateSnapshot>> conv_snaps, delta_snaps;
  for (const StepSeq& s : whole_step()) {
    // The source state moves to the destination first (the kernels read src, write dst).
    if (s.src < 0) {
      std::fill(conv_of(s.dst), conv_of(s.dst) + SF, 0.0f);
    } else if (s.src != s.dst) {
      std::copy_n(conv_of(s.src), SF, conv_of(s.dst));
    }
    conv_snaps.emplace_back();
    delta_snaps.emplace_back();
    for (const GdnSave& v : s.saves) {
      conv_snaps.back().push_back({v.after_token, conv_of(v.state)});
      delta_snaps.back().push_back({v.after_token, delta_of(v.state)});
    }
    float* xs = x.data() + s.tokens[0] * cd;
    conv_seqs.push_back({xs, static_cast<int64_t>(s.tokens.size()), conv_of(s.dst), conv_snaps.back().data(),
                         static_cast<int>(s.saves.size())});
    cpu::GatedDeltaSeq ds;
    ds.q = xs;
    ds.k = xs + d.kd();
    ds.v = xs + 2 * d.kd();
    ds.g = g.data() + s.tokens[0] * nv;
    ds.beta = beta.data() + s.tokens[0] * nv;
    ds.out = core.data() + s.tokens[0] * vd;
    ds.n_tokens = static_cast<int64_t>(s.tokens.size());
    ds.state = delta_of(s.dst);
    ds.snapshots = delta_snaps.back().data();
    ds.n_snapshots = static_cast<int>(s.saves.size());
    delta_seqs.push_back(ds);
  }
  cpu::causal_conv1d_silu_batch(conv_seqs.data(), static_cast<int>(conv_seqs.size()), h.conv_w_.data(), cd, d.K, cd,
                                pool);
  const cpu::GatedDeltaParams p{d.nk, d.nv, d.dk, d.dv, cd, nv, vd};
  cpu::gated_delta_batch(delta_seqs.data(), static_cast<int>(delta_seqs.size()), p, pool);

  // mixed: the CPU's conv outputs with q/k normalized as the CPU kernel does inside.
  std::vector<float> want_mixed = x;
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t kh = 0; kh < 2 * d.nk; ++kh) {
      float* head = want_mixed.data() + t * cd + kh * d.dk;
      l2norm_scaled(head, d.dk, kh < d.nk ? 1.0f / std::sqrt(static_cast<float>(d.dk)) : 1.0f, head);
    }
  }
  const double e_mixed = max_abs_diff(h.mixed_.data(), want_mixed.data(), want_mixed.size());
  const double e_g = max_abs_diff(h.g_.data(), g.data(), g.size());
  const double e_beta = max_abs_diff(h.beta_.data(), beta.data(), beta.size());
  const double e_core = max_abs_diff(h.core_.data(), core.data(), core.size());
  double max_core = 0;
  for (float v : core) max_core = std::max(max_core, double(std::fabs(v)));
  // Slots 0-2 and checkpoints 5-7 were written; 3 and 4 keep their contents.
  const double e_states = max_abs_diff(gpu_states.data(), st.data(), st.size());
  std::printf(
      "[ cuda gdn ] dk %d dv %d, %d columns per warp: max |gpu - cpu| mixed %.3g g %.3g beta %.3g core %.3g "
      "(max |core| %.3g) states %.3g\n",
      d.dk, d.dv, d.columns, e_mixed, e_g, e_beta, e_core, max_core, e_states);
  EXPECT_LT(e_mixed, 1e-5);
  EXPECT_LT(e_g, 1e-5);
  EXPECT_LT(e_beta, 1e-6);
  EXPECT_LT(e_core, 1e-4 * std::max(1.0, max_core));
  EXPECT_LT(e_states, 1e-4);
  EXPECT_GT(max_core, 1e-3);  // the outputs are not all zeros
}

TEST_P(GatedDeltaCuda, StepsOfAnySizeGiveBitIdenticalResults) {
  const Dims d = GetParam();
  const auto proj = random_floats(static_cast<size_t>(kTokens * d.P()), 12, -1.0f, 1.0f);
  Harness whole(d, kStates, proj, kTokens, 22);
  whole.run(whole_step());
  const std::vector<float> want_states = whole.states();
  for (int32_t chunk : {1, 3}) {
    Harness h(d, kStates, proj, kTokens, 22);
    for (const std::vector<StepSeq>& step : chunked_steps(chunk)) h.run(step);
    EXPECT_EQ(h.mixed_, whole.mixed_) << "chunk " << chunk;
    EXPECT_EQ(h.core_, whole.core_) << "chunk " << chunk;
    EXPECT_EQ(h.states(), want_states) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatedDeltaCuda,
                         ::testing::Values(Dims{2, 4, 16, 16, 4, 8}, Dims{2, 4, 40, 24, 4, 8},
                                           Dims{1, 2, 128, 64, 3, 8}, Dims{2, 4, 16, 16, 4, 4},
                                           Dims{2, 4, 40, 24, 4, 4}, Dims{1, 2, 128, 64, 3, 4}));

// The gated RMSNorm and the sigmoid gate against their host formulas.
TEST(GatedDeltaCudaOps, GatedNormAndSigmoidGate) {
  RILL_REQUIRE_GPU();
  const int64_t T = 7, H = 3, D = 24, zs = 100, zoff = 13;
  const auto core = random_floats(static_cast<size_t>(T * H * D), 31, -2.0f, 2.0f);
  const auto zbuf = random_floats(static_cast<size_t>(T * zs), 32, -3.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(D), 33, 0.5f, 1.5f);
  std::vector<float> want(static_cast<size_t>(T * H * D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* x = core.data() + (t * H + h) * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(x[i]) * x[i];
      const float scale = 1.0f / std::sqrt(static_cast<float>(ss / D) + 1e-6f);
      for (int64_t i = 0; i < D; ++i) {
        const float z = zbuf[t * zs + zoff + h * D + i];
        want[(t * H + h) * D + i] = (x[i] * scale * w[i]) * (z / (1.0f + std::exp(-z)));
      }
    }
  }
  auto core_d = upload(core), z_d = upload(zbuf), w_d = upload(w);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto out = testing::poisoned(want.size() * 4);
    gdn_gated_norm(core_d.as<float>(), z_d.as<float>() + zoff, zs, w_d.as<float>(), T, H, D, 1e-6f, dt, out.data(),
                   nullptr);
    const size_t es = dt == DType::kF32 ? 4 : 2;
    const auto got = testing::decode(dt, download<uint8_t>(out, want.size() * es));
    const double tol = dt == DType::kF32 ? 1e-5 : 2e-2;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::fabs(want[i]))) << "gated norm " << i;
    }
  }
  const int64_t W = 40, gs = 90;
  const auto x = random_floats(static_cast<size_t>(T * W), 34, -2.0f, 2.0f);
  const auto gate = random_floats(static_cast<size_t>(T * gs), 35, -4.0f, 4.0f);
  auto x_d = upload(x), gate_d = upload(gate);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto out = testing::poisoned(static_cast<size_t>(T * W) * 4);
    sigmoid_gate_mul(x_d.as<float>(), gate_d.as<float>() + 50, gs, T, W, dt, out.data(), nullptr);
    const size_t es = dt == DType::kF32 ? 4 : 2;
    const auto got = testing::decode(dt, download<uint8_t>(out, static_cast<size_t>(T * W) * es));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < W; ++i) {
        const float want_v = x[t * W + i] * (1.0f / (1.0f + std::exp(-gate[t * gs + 50 + i])));
        ASSERT_NEAR(got[t * W + i], want_v, (dt == DType::kF32 ? 1e-6 : 1e-2) * std::max(1.0f, std::fabs(want_v)));
      }
    }
  }
}

}  // namespace
}  // namespace rill::cuda
