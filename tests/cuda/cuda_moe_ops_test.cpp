// The CUDA MoE kernels (backend/cuda/moe.h) and the CUDA Backend's moe_ffn
// (backend/cuda/moe_ffn.h) against the CPU:
//  - moe_route: top-k ids and weights against a host softmax top-k (with and
//    without norm_topk_prob), and its grouping: each expert's pairs in
//    increasing order, padded rows inside the expert's padded range;
//  - moe_gemv: every (token, slot) pair's rows against a double reference
//    (f32, f16, bf16; the CUDA-core GEMV and the tensor-core kernel), with
//    experts that get more pairs than one pass takes, and a token's outputs
//    bit-identical alone and in a batch;
//  - moe_gemv over MXFP4 experts (gpt-oss's GGUF) against the f64 sum of
//    the reference-dequantized weights, batch invariant likewise;
//  - the CUDA Backend's moe_ffn against MoeFfn::forward (the CPU reference)
//    with and without a shared expert, in decode steps (device routing) and
//    prefill steps (grouped GEMMs for bf16; f32 always routes on the
//    device), f32 within 1e-5 and bf16 weights within bf16 error.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "../backend/quant_test_util.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe.h"
#include "cuda_test_util.h"
#include "model/moe.h"

namespace rill {
namespace {

using cuda::testing::download;
using cuda::testing::poisoned;
using cuda::testing::random_floats;
using cuda::testing::round_to;
using cuda::testing::upload;

// Device buffers of one routing result for n tokens.
struct DeviceRouting {
  cuda::DeviceBuffer ids, weights, offsets, active, n_active, sorted, padded, rows;
  cuda::MoeRouting r;
  DeviceRouting(int64_t n, int32_t X, int32_t K) {
    const size_t pairs = static_cast<size_t>(n * K);
    ids = poisoned(pairs * 4);
    weights = poisoned(pairs * 4);
    offsets = poisoned((X + 1) * 4);
    active = poisoned(X * 4);
    n_active = poisoned(4);
    sorted = poisoned(pairs * 4);
    padded = poisoned((X + 1) * 4);
    rows = poisoned(pairs * 4);
    r = {ids.as<int32_t>(),      weights.as<float>(),  offsets.as<int32_t>(), active.as<int32_t>(),
         n_active.as<int32_t>(), sorted.as<int32_t>(), padded.as<int32_t>(),  rows.as<int32_t>()};
  }
};

// Host top-k: softmax, K arg-max passes (lower id on ties), ordered by id.
void host_route(const float* l, int32_t X, int32_t K, bool norm, int32_t* ids, float* ws) {
  std::vector<double> p(l, l + X);
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& v : p) sum += (v = std::exp(v - mx));
  for (double& v : p) v /= sum;
  std::vector<int32_t> pick;
  double picked = 0;
  for (int32_t k = 0; k < K; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < X; ++e) {
      if (std::find(pick.begin(), pick.end(), e) != pick.end()) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    pick.push_back(best);
    picked += p[best];
  }
  std::sort(pick.begin(), pick.end());
  for (int32_t k = 0; k < K; ++k) {
    ids[k] = pick[k];
    ws[k] = static_cast<float>(norm ? p[pick[k]] / picked : p[pick[k]]);
  }
}

// The softmax router of Mixtral / Qwen3-MoE (MoeRouter's defaults).
cuda::MoeRouter softmax_router(int32_t X, int32_t K, bool norm) {
  cuda::MoeRouter m;
  m.n_expert = X;
  m.n_expert_used = K;
  m.norm_topk_prob = norm;
  return m;
}

void check_route(int64_t n, int32_t X, int32_t K, bool norm, int32_t pad, uint32_t seed) {
  const std::vector<float> logits = random_floats(static_cast<size_t>(n * X), seed, -3.0f, 3.0f);
  cuda::DeviceBuffer dl = upload(logits);
  DeviceRouting d(n, X, K);
  cuda::moe_route(dl.as<float>(), n, softmax_router(X, K, norm), pad, d.r, nullptr);
  const size_t pairs = static_cast<size_t>(n * K);
  const auto ids = download<int32_t>(d.ids, pairs);
  const auto ws = download<float>(d.weights, pairs);
  const auto offsets = download<int32_t>(d.offsets, X + 1);
  const auto padded = download<int32_t>(d.padded, X + 1);
  const auto active = download<int32_t>(d.active, X);
  const auto n_active = download<int32_t>(d.n_active, 1)[0];
  const auto sorted = download<int32_t>(d.sorted, pairs);
  const auto rows = download<int32_t>(d.rows, pairs);
  std::vector<int32_t> ref_ids(pairs);
  std::vector<float> ref_ws(pairs);
  for (int64_t t = 0; t < n; ++t) host_route(&logits[t * X], X, K, norm, &ref_ids[t * K], &ref_ws[t * K]);
  EXPECT_EQ(ids, ref_ids);
  double max_err = 0;
  for (size_t i = 0; i < pairs; ++i) max_err = std::max(max_err, std::fabs(double(ws[i]) - ref_ws[i]));
  EXPECT_LT(max_err, 1e-6);
  // Grouping: expert e's pairs, increasing, in sorted[offsets[e], offsets[e + 1]).
  int32_t expect_active = 0, expect_off = 0, expect_pad = 0;
  for (int32_t e = 0; e < X; ++e) {
    std::vector<int32_t> mine;
    for (size_t i = 0; i < pairs; ++i) {
      if (ids[i] == e) mine.push_back(static_cast<int32_t>(i));
    }
    ASSERT_EQ(offsets[e], expect_off) << "expert " << e;
    ASSERT_EQ(padded[e], expect_pad) << "expert " << e;
    EXPECT_EQ(std::vector<int32_t>(sorted.begin() + offsets[e], sorted.begin() + offsets[e] + mine.size()), mine);
    for (size_t j = 0; j < mine.size(); ++j) EXPECT_EQ(rows[mine[j]], padded[e] + static_cast<int32_t>(j));
    if (!mine.empty()) {
      EXPECT_EQ(active[expect_active++], e);
    }
    expect_off += static_cast<int32_t>(mine.size());
    expect_pad += (static_cast<int32_t>(mine.size()) + pad - 1) / pad * pad;
  }
  EXPECT_EQ(offsets[X], expect_off);
  EXPECT_EQ(padded[X], expect_pad);
  EXPECT_EQ(n_active, expect_active);
}

TEST(CudaMoe, RouteMatchesHostTopK) {
  RILL_REQUIRE_GPU();
  check_route(37, 8, 2, true, 16, 1);
  check_route(37, 8, 2, false, 1, 2);
  check_route(300, 64, 8, true, 16, 3);  // several tokens per warp, 64 experts
  check_route(5, 512, 10, true, 16, 4);  // Qwen3-Next's router size
  check_route(1, 4, 4, true, 16, 5);     // every expert used
}

// y[p] = W_{ids[p]} x[p / K] for n tokens through moe_gemv (after moe_route).
std::vector<float> run_gemv(DType dt, const std::vector<float>& w, int32_t X, int64_t rows, int64_t cols,
                            const std::vector<float>& x, const std::vector<float>& logits, int64_t n, int32_t K,
                            bool tensor_cores) {
  cuda::DeviceBuffer dw = upload(cuda::testing::encode(dt, w));
  cuda::DeviceBuffer dx = upload(cuda::testing::encode(dt, std::vector<float>(x.begin(), x.begin() + n * cols)));
  cuda::DeviceBuffer dl = upload(std::vector<float>(logits.begin(), logits.begin() + n * X));
  DeviceRouting d(n, X, K);
  cuda::moe_route(dl.as<float>(), n, softmax_router(X, K, true), 1, d.r, nullptr);
  cuda::DeviceBuffer y = poisoned(static_cast<size_t>(n * K * rows) * 4);
  const size_t es = dt == DType::kF32 ? 4 : 2;
  const cuda::MoeExperts ex{dw.data(), dt, static_cast<size_t>(rows * cols) * es, rows, cols};
  cuda::moe_gemv(ex, dx.data(), dt, K, d.r, static_cast<int32_t>(std::min<int64_t>(n * K, X)), y.as<float>(),
                 tensor_cores, nullptr);
  return download<float>(y, static_cast<size_t>(n * K * rows));
}

TEST(CudaMoe, ExpertGemvMatchesReferenceAndIsBatchInvariant) {
  RILL_REQUIRE_GPU();
  const int32_t X = 4, K = 2;
  const int64_t rows = 40, n = 80;  // 160 pairs over 4 experts: several passes of 8 (GEMV) or 32 (tensor cores)
  struct Case {
    int64_t cols;
    bool tensor_cores;
  };
  for (const Case cs : {Case{264, true}, Case{256, true}, Case{256, false}}) {  // 264: not a multiple of 32
    const int64_t cols = cs.cols;
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      const bool mma = cs.tensor_cores && cuda::moe_mma_supported(dt, cols);
      std::vector<float> w = random_floats(static_cast<size_t>(X * rows * cols), 11);
      std::vector<float> x = random_floats(static_cast<size_t>(n * cols), 12);
      for (float& v : w) v = round_to(dt, v);
      for (float& v : x) v = round_to(dt, v);
      const std::vector<float> logits = random_floats(static_cast<size_t>(n * X), 13, -2.0f, 2.0f);
      const std::vector<float> y = run_gemv(dt, w, X, rows, cols, x, logits, n, K, cs.tensor_cores);
      std::vector<int32_t> ids(static_cast<size_t>(n * K));
      std::vector<float> ws(ids.size());
      for (int64_t t = 0; t < n; ++t) host_route(&logits[t * X], X, K, true, &ids[t * K], &ws[t * K]);
      double max_err = 0;
      for (int64_t p = 0; p < n * K; ++p) {
        const float* we = &w[static_cast<size_t>(ids[p]) * rows * cols];
        for (int64_t r = 0; r < rows; ++r) {
          double ref = 0;
          for (int64_t c = 0; c < cols; ++c) ref += double(we[r * cols + c]) * x[(p / K) * cols + c];
          max_err = std::max(max_err, std::fabs(ref - y[p * rows + r]));
        }
      }
      EXPECT_LT(max_err, 1e-4) << dtype_name(dt) << " cols " << cols << (mma ? " tensor cores" : " GEMV");
      // Token 0 alone, and tokens 0..2: the same bits as in the batch of 80.
      for (int64_t m : {int64_t{1}, int64_t{3}}) {
        const std::vector<float> few = run_gemv(dt, w, X, rows, cols, x, logits, m, K, cs.tensor_cores);
        EXPECT_TRUE(std::equal(few.begin(), few.end(), y.begin()))
            << dtype_name(dt) << " cols " << cols << (mma ? " tensor cores" : " GEMV") << ": " << m << " tokens";
      }
    }
  }
}

// Experts in MXFP4 blocks (gpt-oss's GGUF): the expert-indexed GEMV decodes
// them as cpu::ref::dequantize_row (held to the gguf package's numpy
// reference by tests/backend/mxfp4_test.cpp; cuda_quant_test.cpp holds the
// device decoder to it bit for bit). Every pair's rows against the f64 sum
// of the dequantized weights times x (in F32, F16 and BF16) within 1e-5 of
// sum |w x|, and a token's rows the same bits alone and in the batch.
TEST(CudaMoe, Mxfp4ExpertGemvMatchesTheDequantizedReference) {
  RILL_REQUIRE_GPU();
  const int32_t X = 4, K = 2;
  const int64_t rows = 40, cols = 2880, n = 40;  // gpt-oss-20b's width; 80 pairs: several passes of 8
  const size_t rb = row_bytes(DType::kMXFP4, cols);
  const auto wq = cpu::testing::random_weight_rows(DType::kMXFP4, X * rows, cols, 21);
  std::vector<float> w(static_cast<size_t>(X * rows * cols));
  for (int64_t r = 0; r < X * rows; ++r) {
    cpu::ref::dequantize_row(DType::kMXFP4, wq.data() + static_cast<size_t>(r) * rb, w.data() + r * cols, cols);
  }
  const std::vector<float> logits = random_floats(static_cast<size_t>(n * X), 23, -2.0f, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> ws(ids.size());
  for (int64_t t = 0; t < n; ++t) host_route(&logits[t * X], X, K, true, &ids[t * K], &ws[t * K]);
  const cuda::DeviceBuffer dw = upload(wq);
  const cuda::MoeExperts ex{dw.data(), DType::kMXFP4, rb * static_cast<size_t>(rows), rows, cols};
  for (DType xt : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<float> x = random_floats(static_cast<size_t>(n * cols), 22);
    for (float& v : x) v = round_to(xt, v);
    auto run = [&](int64_t m) {
      cuda::DeviceBuffer dx = upload(cuda::testing::encode(xt, std::vector<float>(x.begin(), x.begin() + m * cols)));
      cuda::DeviceBuffer dl = upload(std::vector<float>(logits.begin(), logits.begin() + m * X));
      DeviceRouting d(m, X, K);
      cuda::moe_route(dl.as<float>(), m, softmax_router(X, K, true), 1, d.r, nullptr);
      cuda::DeviceBuffer y = poisoned(static_cast<size_t>(m * K * rows) * 4);
      cuda::moe_gemv(ex, dx.data(), xt, K, d.r, static_cast<int32_t>(std::min<int64_t>(m * K, X)), y.as<float>(), true,
                     nullptr);
      return download<float>(y, static_cast<size_t>(m * K * rows));
    };
    const std::vector<float> y = run(n);
    double worst = 0;
    for (int64_t p = 0; p < n * K; ++p) {
      const float* we = &w[static_cast<size_t>(ids[p]) * rows * cols];
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double t = double(we[r * cols + c]) * x[(p / K) * cols + c];
          ref += t;
          mag += std::fabs(t);
        }
        const double e = std::fabs(ref - y[p * rows + r]) / (mag + 1e-30);
        if (!(e <= worst)) worst = e;
      }
    }
    EXPECT_LT(worst, 1e-5) << "x " << dtype_name(xt);
    std::printf("[ cuda mxfp4 ] moe_gemv x %s: max |y - ref| / sum |w x| = %.3g\n", std::string(dtype_name(xt)).c_str(),
                worst);
    for (int64_t m : {int64_t{1}, int64_t{3}}) {
      const std::vector<float> few = run(m);
      EXPECT_TRUE(std::equal(few.begin(), few.end(), y.begin())) << "x " << dtype_name(xt) << ": " << m << " tokens";
    }
  }
}

// A random MoE layer on the host (f32 views of owned vectors).
struct RandomMoe {
  MoeParams p;
  std::vector<std::vector<float>> store;
  MoeWeights w;
  Linear mat(int64_t r, int64_t c, std::mt19937& rng, float scale, DType round) {
    std::normal_distribution<float> d(0.0f, scale);
    store.emplace_back(static_cast<size_t>(r * c));
    for (float& v : store.back()) v = round_to(round, d(rng));
    Linear l;
    l.w = {DType::kF32, r, c, store.back().data(), static_cast<size_t>(c) * 4};
    return l;
  }
  RandomMoe(const MoeParams& params, uint32_t seed, DType round) : p(params) {
    std::mt19937 rng(seed);
    store.reserve(static_cast<size_t>(4 * p.n_expert + 8));  // views keep their addresses
    w.router = mat(p.n_expert, p.n_embd, rng, 0.5f, round);
    for (int64_t e = 0; e < p.n_expert; ++e) {
      GluFfnWeights f;
      f.gate = mat(p.n_ff, p.n_embd, rng, 0.2f, round);
      f.up = mat(p.n_ff, p.n_embd, rng, 0.2f, round);
      f.down = mat(p.n_embd, p.n_ff, rng, 0.2f, round);
      w.experts.push_back(f);
    }
    if (p.n_ff_shared > 0) {
      GluFfnWeights f;
      f.gate = mat(p.n_ff_shared, p.n_embd, rng, 0.2f, round);
      f.up = mat(p.n_ff_shared, p.n_embd, rng, 0.2f, round);
      f.down = mat(p.n_embd, p.n_ff_shared, rng, 0.2f, round);
      w.shared = f;
      w.shared_gate = mat(1, p.n_embd, rng, 0.3f, round);
    }
  }
};

// The CUDA Backend's moe_ffn (act: the device dtype; a prefill step or a
// decode step) against MoeFfn::forward over the same weights; returns max
// |gpu - cpu| and the largest |cpu| output.
std::pair<double, double> compare_with_cpu(const MoeParams& p, DType act, bool grouped, int64_t n, uint32_t seed) {
  const RandomMoe host(p, seed, act);
  auto ffn = MoeFfn::create(p, host.w);
  EXPECT_TRUE(ffn.ok()) << ffn.error().message;
  std::vector<float> h = random_floats(static_cast<size_t>(n * p.n_embd), seed + 1);
  for (float& v : h) v = round_to(act, v);
  MoeScratch scratch;
  scratch.reserve(p, n);
  auto host_ops = cpu::make_host_ops(2);
  std::vector<float> ref(h.size());
  ffn->forward(h.data(), n, ref.data(), scratch, *host_ops);

  auto backend = make_cuda_backend({act, false, 0});
  EXPECT_TRUE(backend.ok()) << backend.error().message;
  Backend& dev = **backend;
  auto placed = dev.place_moe(ffn->host(), "test layer");
  EXPECT_TRUE(placed.ok()) << placed.error().message;
  EXPECT_TRUE(dev.reserve({n, 1, 64}).ok());
  const std::vector<uint8_t> h_act = cuda::testing::encode(act, h);
  const std::vector<float> base = random_floats(h.size(), seed + 2);  // the residual the result adds to
  auto dh = dev.allocate(h_act.size(), "test input");
  auto dx = dev.allocate(base.size() * 4, "test residual");
  EXPECT_TRUE(dh.ok() && dx.ok());
  EXPECT_TRUE(dev.copy_in(dh->data(), h_act.data(), h_act.size()).ok());
  EXPECT_TRUE(dev.copy_in(dx->data(), base.data(), base.size() * 4).ok());
  const Tensor in = Tensor::dense(dh->data(), act, n, p.n_embd);
  const Tensor x = Tensor::dense(dx->data(), DType::kF32, n, p.n_embd);
  StepMetadata step;
  step.n_tokens = static_cast<int32_t>(n);
  step.n_tiles = grouped ? 1 : 0;  // a prefill step: the grouped GEMMs (bf16)
  const Status st = dev.moe_ffn(*placed, in, in, x, true, step);
  EXPECT_TRUE(st.ok()) << st.error().message;
  std::vector<float> out(h.size());
  EXPECT_TRUE(dev.copy_out(out.data(), dx->data(), out.size() * 4).ok());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(out[i]) - base[i] - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return {max_err, max_ref};
}

MoeParams params(int64_t n_ff_shared) {
  MoeParams p;
  p.n_embd = 64;
  p.n_expert = 8;
  p.n_expert_used = 2;
  p.n_ff = 40;
  p.norm_topk_prob = true;
  p.n_ff_shared = n_ff_shared;
  return p;
}

TEST(CudaMoe, BlockMatchesCpuMoeFfn) {
  RILL_REQUIRE_GPU();
  for (int64_t shared : {int64_t{0}, int64_t{48}}) {
    for (bool grouped : {false, true}) {
      const auto [err, ref] = compare_with_cpu(params(shared), DType::kF32, grouped, 45, 21);
      EXPECT_GT(ref, 0.05);
      EXPECT_LT(err, 1e-5) << "shared " << shared << (grouped ? " prefill step" : " decode step");
      std::printf("[ cuda moe ] f32 shared=%d %s: max |gpu - cpu| = %.3g (max |out| %.3g)\n", int(shared),
                  grouped ? "prefill step" : "decode step", err, ref);
    }
  }
  MoeParams p = params(0);
  p.norm_topk_prob = false;
  const auto [err, ref] = compare_with_cpu(p, DType::kF32, false, 7, 22);
  EXPECT_LT(err, 1e-5) << "raw top-k probabilities";
}

// bf16 weights and inputs (the CPU computes in f32 over the same rounded
// values; the GPU rounds silu(gate) * up to bf16 before down).
TEST(CudaMoe, BlockMatchesCpuWithBf16Weights) {
  RILL_REQUIRE_GPU();
  for (bool grouped : {false, true}) {
    const auto [err, ref] = compare_with_cpu(params(48), DType::kBF16, grouped, 40, 31);
    EXPECT_LT(err, 0.02 * ref) << (grouped ? "grouped" : "device routing");
    std::printf("[ cuda moe ] bf16 %s: max |gpu - cpu| = %.3g (max |out| %.3g)\n",
                grouped ? "grouped GEMMs" : "device routing", err, ref);
  }
}

}  // namespace
}  // namespace rill
