// Gemm's per-shape algorithm choice by measurement (gemm.h, gemm_tune.h):
// the tuned plan computes what the heuristic's plan computes, within the
// rounding of an f32-accumulated GEMM (both held to an f64 sum over the same
// bf16 values); a shape is timed once and keeps its algorithm; shapes past
// 128 tokens share their power-of-two bucket's timing; a first call inside
// a graph capture is not timed; an accumulating call's timing leaves y's
// contents alone. No timing is asserted. Skipped where no CUDA device is.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_tune.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

struct Problem {
  int64_t n, rows, cols;
  std::vector<float> w, x;  // bf16 values, as the device sees them
  DeviceBuffer dw, dx;
};

Problem make_problem(int64_t n, int64_t rows, int64_t cols, uint32_t seed) {
  Problem p{n,
            rows,
            cols,
            random_floats(static_cast<size_t>(rows * cols), seed),
            random_floats(static_cast<size_t>(n * cols), seed + 1),
            {},
            {}};
  for (float& v : p.w) v = round_to(DType::kBF16, v);
  for (float& v : p.x) v = round_to(DType::kBF16, v);
  p.dw = upload(encode(DType::kBF16, p.w));
  p.dx = upload(encode(DType::kBF16, p.x));
  return p;
}

// Worst |got - (y0 + W x)| over sum |w x| per output (f64 reference).
double worst_error(const Problem& p, const std::vector<float>& got, const std::vector<float>& y0) {
  return worst_gemm_error(p.w, p.x, p.n, p.rows, p.cols, got, y0);
}

// y = W x (poisoned first, so every output must be written), or y0 + W x.
std::vector<float> run(Gemm& gemm, const Problem& p, const std::vector<float>& y0) {
  DeviceBuffer y = y0.empty() ? poisoned(static_cast<size_t>(p.n * p.rows) * 4) : upload(y0);
  const Status st = gemm.run(DType::kBF16, p.dw.data(), p.dx.data(), p.n, p.rows, p.cols, y.as<float>(), !y0.empty());
  EXPECT_TRUE(st.ok()) << st.error().message;
  return download<float>(y, static_cast<size_t>(p.n * p.rows));
}

// f32 accumulation over bf16 products: a few 2^-24 per term, far under this.
constexpr double kTol = 1e-5;

TEST(GemmTune, TunedPlanComputesWhatTheHeuristicPlanComputes) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm tuned(**ctx), heuristic(**ctx);
  heuristic.set_tuning(false);
  ASSERT_TRUE(tuned.tuning());
  int64_t shapes = 0;
  // Decode-like (few tokens, long rows: split-K candidates) and prefill-like shapes.
  for (const auto& [n, rows, cols] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 1536, 4096}, {128, 1024, 2048}, {16, 4096, 1024}, {600, 768, 1024}}) {
    SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(rows) + " x " + std::to_string(cols));
    const Problem p = make_problem(n, rows, cols, static_cast<uint32_t>(n + rows));
    const std::vector<float> a = run(tuned, p, {}), b = run(heuristic, p, {});
    EXPECT_LT(worst_error(p, a, {}), kTol);
    EXPECT_LT(worst_error(p, b, {}), kTol);
    // Accumulating: the timing runs must not have added into y.
    const std::vector<float> y0 = random_floats(static_cast<size_t>(n * rows), 77);
    Problem q = make_problem(n, rows, cols, static_cast<uint32_t>(n + rows + 5));
    Gemm fresh(**ctx);  // this shape's first call accumulates
    EXPECT_LT(worst_error(q, run(fresh, q, y0), y0), kTol);
    EXPECT_EQ(fresh.timings(), 1);
    ++shapes;
  }
  EXPECT_EQ(tuned.timings(), shapes);
  EXPECT_EQ(heuristic.timings(), 0);
}

TEST(GemmTune, EachShapeIsTimedOnceAndKeepsItsAlgorithm) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const Problem p = make_problem(64, 2048, 1024, 5);
  const std::vector<float> first = run(gemm, p, {});
  EXPECT_EQ(gemm.timings(), 1);
  for (int i = 0; i < 3; ++i) {
    // The same algorithm on the same operands: the same bits.
    EXPECT_EQ(run(gemm, p, {}), first);
  }
  EXPECT_EQ(gemm.timings(), 1);
  // Another token count of 128 or fewer: a shape of its own.
  const Problem p48 = make_problem(48, 2048, 1024, 6);
  EXPECT_LT(worst_error(p48, run(gemm, p48, {}), {}), kTol);
  EXPECT_EQ(gemm.timings(), 2);
  // 300 and 400 tokens share the bucket of 512: one timing for both.
  const Problem p300 = make_problem(300, 512, 1024, 7), p400 = make_problem(400, 512, 1024, 8);
  EXPECT_LT(worst_error(p300, run(gemm, p300, {}), {}), kTol);
  EXPECT_EQ(gemm.timings(), 3);
  EXPECT_LT(worst_error(p400, run(gemm, p400, {}), {}), kTol);
  EXPECT_EQ(gemm.timings(), 3);
  // Another matrix shape at a seen token count: timed.
  const Problem wide = make_problem(64, 1024, 2048, 9);
  EXPECT_LT(worst_error(wide, run(gemm, wide, {}), {}), kTol);
  EXPECT_EQ(gemm.timings(), 4);
}

TEST(GemmTune, FirstCallInsideAGraphCaptureTakesTheHeuristicsFirst) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const Problem p = make_problem(32, 1024, 1024, 10);
  DeviceBuffer y = poisoned(static_cast<size_t>(p.n * p.rows) * 4);
  const cudaStream_t st = (*ctx)->stream();
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status run_st = gemm.run(DType::kBF16, p.dw.data(), p.dx.data(), p.n, p.rows, p.cols, y.as<float>(), false);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(run_st.ok()) << run_st.error().message;
  EXPECT_EQ(gemm.timings(), 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_LT(worst_error(p, download<float>(y, static_cast<size_t>(p.n * p.rows)), {}), kTol);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // Later eager calls keep the shape's algorithm: still no timing.
  EXPECT_LT(worst_error(p, run(gemm, p, {}), {}), kTol);
  EXPECT_EQ(gemm.timings(), 0);
}

TEST(GemmTune, FastestIsTheEarliestOfTheLeastTimes) {
  EXPECT_EQ(fastest({}), -1);
  EXPECT_EQ(fastest({-1.0f, -1.0f}), -1);
  EXPECT_EQ(fastest({0.5f, 0.25f, 0.25f, -1.0f}), 1);
  EXPECT_EQ(fastest({-1.0f, 0.75f, 0.5f}), 2);
}

}  // namespace
}  // namespace rill::cuda
