// fp8_route (backend/cuda/fp8.h): the one rule that fp8_matmul,
// fp8_matmul_glu, fp8_quantizes_x and fp8_glu_fusable read, held to a table
// of the routes they took before the rule was one function (main at
// 9847597), with the switches at their defaults (fp8_mma and Gemm's bf16 D
// off) and gemm_stream's route off (force_fp8_stream(0); its own tests
// follow):
//  - one token of f32 / bf16 x: the GEMV; of f16 x: the GEMM where the
//    scratch holds x and cuBLASLt has one, else quant_matmul;
//  - 2..8 tokens: the GEMM where cuBLASLt has one and the scratch holds x,
//    else the GEMV (f32 / bf16 x) or quant_matmul;
//  - more tokens: the GEMM, else quant_matmul (no scratch: quant_matmul);
//  - batch-invariant mode: quant_matmul, and no GLU fusion;
//  - the GLU: fused where the GEMM route is taken without outer-vector
//    scales, never for one token of f32 / bf16 x or odd rows;
//  - fp8_quantizes_x exactly where the route is the GEMM.
// The scratch is described, never touched (fp8_route reads its sizes).
// Skipped without a CUDA device (cuBLASLt answers what it supports), and
// when the environment sets one of the switches.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/hopper/gemm_stream.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

// force_fp8_stream(on) for the guard's lifetime, then back to the
// environment's band, however the test leaves.
class ForceStream {
 public:
  explicit ForceStream(int on) { force_fp8_stream(on); }
  ForceStream(const ForceStream&) = delete;
  ForceStream& operator=(const ForceStream&) = delete;
  ~ForceStream() { force_fp8_stream(-1); }
};

const char* route_name(Fp8Route r) {
  switch (r) {
    case Fp8Route::kNone:
      return "none";
    case Fp8Route::kStream:
      return "stream";
    case Fp8Route::kMma:
      return "mma";
    case Fp8Route::kMmaBf16x:
      return "mma_bf16x";
    case Fp8Route::kGemv:
      return "gemv";
    case Fp8Route::kGemm:
      return "gemm";
    case Fp8Route::kDequant:
      return "dequant";
  }
  return "?";
}

// A scratch for `tokens` tokens of up to `cols` columns: pointers that are
// not null, never read.
Fp8Scratch described(int64_t tokens, int64_t cols) {
  Fp8Scratch s;
  s.xq = reinterpret_cast<uint8_t*>(uintptr_t{256});
  s.xs = reinterpret_cast<float*>(uintptr_t{512});
  s.d = reinterpret_cast<float*>(uintptr_t{1024});
  s.max_tokens = tokens;
  s.x_elems = tokens * cols;
  s.d_floats = tokens * 4096;
  return s;
}

TEST(Fp8Route, TheRoutesBeforeTheRuleWasOneFunction) {
  RILL_REQUIRE_GPU();
  for (const char* v : {"RILL_FP8_MMA", "RILL_FP8_BF16_D"}) {
    if (std::getenv(v) != nullptr) GTEST_SKIP() << v << " is set";
  }
  const ForceStream off(0);  // the table is of the routes before gemm_stream
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  ASSERT_FALSE(gemm.fp8_bf16_d());
  const Fp8Scratch none, scratch = described(256, 14336);
  struct Shape {
    int64_t rows, cols;
  };
  int64_t checked = 0, gemm_routes = 0;
  for (const Shape sh : {Shape{4096, 4096}, Shape{6144, 4096}, Shape{4096, 14336}, Shape{57344, 4096}}) {
    for (const int64_t n : {1, 2, 5, 8, 9, 64, 128}) {
      const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(sh.cols));
      const bool has_gemm = gemm.fp8_gemm_supported(n, sh.rows, sh.cols, w_ld);
      const bool outer = has_gemm && gemm.fp8_gemm_outer_scales(n, sh.rows, sh.cols, w_ld);
      for (const DType x : {DType::kBF16, DType::kF32, DType::kF16}) {
        for (const Fp8Scratch* fp8 : {&none, &scratch}) {
          const std::string what = std::to_string(n) + " tokens, " + std::to_string(sh.rows) + " x " +
                                   std::to_string(sh.cols) + ", x " + std::string(dtype_name(x)) +
                                   (fp8 == &none ? ", no scratch" : ", scratch");
          const bool x_gemv = x != DType::kF16;
          const bool fits = fp8->xq && n <= fp8->max_tokens && n * sh.cols <= fp8->x_elems;
          Fp8Route want = Fp8Route::kDequant;
          if (n <= kGemvMaxTokens && x_gemv && (n == 1 || !has_gemm)) {
            want = Fp8Route::kGemv;
          } else if (fits && has_gemm) {
            want = Fp8Route::kGemm;
          }
          const Fp8Route got = fp8_route(gemm, *fp8, x, n, sh.rows, sh.cols, false);
          EXPECT_EQ(got, want) << what << ": " << route_name(got) << " against " << route_name(want);
          EXPECT_EQ(fp8_quantizes_x(gemm, *fp8, x, n, sh.rows, sh.cols, false), want == Fp8Route::kGemm) << what;
          gemm_routes += want == Fp8Route::kGemm;

          const bool fused = !(n == 1 && x_gemv) && fits && has_gemm && !outer;
          const Fp8Route glu = fp8_route(gemm, *fp8, x, n, sh.rows, sh.cols, true);
          EXPECT_EQ(glu, fused ? Fp8Route::kGemm : Fp8Route::kNone) << what << " (GLU): " << route_name(glu);
          EXPECT_EQ(fp8_glu_fusable(gemm, *fp8, x, n, sh.rows, sh.cols), fused) << what;
          EXPECT_EQ(fp8_quantizes_x(gemm, *fp8, x, n, sh.rows, sh.cols, true), fused) << what << " (GLU)";
          EXPECT_EQ(fp8_route(gemm, *fp8, x, n, sh.rows + 1, sh.cols, true), Fp8Route::kNone) << what << ", odd rows";

          gemm.set_batch_invariant(true);
          EXPECT_EQ(fp8_route(gemm, *fp8, x, n, sh.rows, sh.cols, false), Fp8Route::kDequant) << what << ", invariant";
          EXPECT_EQ(fp8_route(gemm, *fp8, x, n, sh.rows, sh.cols, true), Fp8Route::kNone) << what << ", invariant";
          EXPECT_FALSE(fp8_quantizes_x(gemm, *fp8, x, n, sh.rows, sh.cols, false)) << what << ", invariant";
          gemm.set_batch_invariant(false);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, 0, 4096, 4096, false), Fp8Route::kNone);
  EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, 4, 0, 4096, false), Fp8Route::kNone);
  // The table is not all one route: cuBLASLt has FP8 GEMMs for the 8B's
  // shapes at 64 and 128 tokens.
  EXPECT_GT(gemm_routes, 0);
  std::printf("[ fp8 route ] %lld cases, %lld of them the GEMM\n", static_cast<long long>(checked),
              static_cast<long long>(gemm_routes));
}

// By default 2..64 tokens take gemm_stream (the shapes of the table above
// where it can), more tokens keep the table's routes.
TEST(Fp8Route, StreamTakesTwoTo64TokensByDefault) {
  RILL_REQUIRE_GPU();
  if (!gemm_stream_available()) GTEST_SKIP() << "gemm_stream needs an sm_90 device";
  if (std::getenv("RILL_FP8_STREAM") != nullptr) GTEST_SKIP() << "RILL_FP8_STREAM is set";
  const ForceStream env(-1);
  ASSERT_EQ(fp8_stream_max_tokens(), 64);
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const Fp8Scratch scratch = described(256, 14336);
  for (const int64_t n : {2, 5, 8, 9, 33, 64}) {
    EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, n, 6144, 4096, false), Fp8Route::kStream) << n;
    EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, n, 57344, 4096, true), Fp8Route::kStream) << n;
  }
  EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, 1, 6144, 4096, false), Fp8Route::kGemv);
  EXPECT_NE(fp8_route(gemm, scratch, DType::kBF16, 65, 6144, 4096, false), Fp8Route::kStream);
  EXPECT_NE(fp8_route(gemm, scratch, DType::kBF16, 128, 6144, 4096, false), Fp8Route::kStream);
}

// With force_fp8_stream(1): 2..128 tokens that fit the scratch take gemm_stream
// (the GLU too, fused with its scale pass; x quantized), whatever x's type;
// one token, more than 128, no scratch and batch-invariant mode keep their
// routes.
TEST(Fp8Route, StreamTakesTwoTo128TokensWhenOn) {
  RILL_REQUIRE_GPU();
  if (!gemm_stream_available()) GTEST_SKIP() << "gemm_stream needs an sm_90 device";
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const Fp8Scratch none, scratch = described(256, 14336);
  ForceStream guard(0);
  const Fp8Route before_1 = fp8_route(gemm, scratch, DType::kBF16, 1, 4096, 4096, false);
  const Fp8Route before_200 = fp8_route(gemm, scratch, DType::kBF16, 200, 4096, 4096, false);
  const Fp8Route before_none = fp8_route(gemm, none, DType::kBF16, 64, 4096, 4096, false);
  force_fp8_stream(1);  // the guard sets it back
  for (const int64_t n : {2, 8, 64, 128}) {
    for (const DType x : {DType::kBF16, DType::kF32, DType::kF16}) {
      SCOPED_TRACE(std::to_string(n) + " tokens, x " + std::string(dtype_name(x)));
      EXPECT_EQ(fp8_route(gemm, scratch, x, n, 6144, 4096, false), Fp8Route::kStream);
      EXPECT_EQ(fp8_route(gemm, scratch, x, n, 57344, 4096, true), Fp8Route::kStream);
      EXPECT_TRUE(fp8_glu_fusable(gemm, scratch, x, n, 57344, 4096));
      EXPECT_TRUE(fp8_quantizes_x(gemm, scratch, x, n, 4096, 14336, false));
      EXPECT_EQ(fp8_route(gemm, scratch, x, n, 57345, 4096, true), Fp8Route::kNone);
      gemm.set_batch_invariant(true);
      EXPECT_EQ(fp8_route(gemm, scratch, x, n, 6144, 4096, false), Fp8Route::kDequant);
      gemm.set_batch_invariant(false);
      gemm.set_fp8_fast_accum(false);  // f32 accumulation asked for: not gemm_stream's
      EXPECT_NE(fp8_route(gemm, scratch, x, n, 6144, 4096, false), Fp8Route::kStream);
      gemm.set_fp8_fast_accum(true);
    }
  }
  EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, 1, 4096, 4096, false), before_1);
  EXPECT_EQ(fp8_route(gemm, scratch, DType::kBF16, 200, 4096, 4096, false), before_200);
  EXPECT_EQ(fp8_route(gemm, none, DType::kBF16, 64, 4096, 4096, false), before_none);
}

}  // namespace
}  // namespace rill::cuda
