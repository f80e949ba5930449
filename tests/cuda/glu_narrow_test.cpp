// The 16-bit gate/up route of Backend::matmul_glu on CUDA: Gemm::run_narrow
// against cpu::matmul (one rounding of each sum to the weights' dtype on top
// of the GEMM's f32 tolerance), and glu_narrow against the f32 kernels
// (silu_mul, gelu_tanh_mul) fed the same 16-bit values widened to f32: the
// same formula in f32, so at most one ulp of the output type apart (the
// compilers may contract the two kernels' arithmetic differently), and
// against the CPU's GLU within the output's rounding.
// Skipped where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/glu_narrow.h"
#include "backend/cuda/ops.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

size_t elem_bytes(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// One ulp of t at |v| (f32's for kF32).
double ulp_at(DType t, float v) {
  const int mant = t == DType::kBF16 ? 7 : t == DType::kF16 ? 10 : 23;
  const double a = std::max(std::fabs(double(v)), t == DType::kF16 ? 6.1e-5 : 1e-30);
  return std::ldexp(1.0, std::ilogb(a) - mant);
}

TEST(GluNarrow, MatchesTheF32KernelsOnTheSameValues) {
  RILL_REQUIRE_GPU();
  struct Case {
    int64_t rows, n_ff, offset;  // offset: elements into the buffers (misaligned rows take the scalar kernel)
  };
  for (const bool gelu : {false, true}) {
    for (const DType in : {DType::kBF16, DType::kF16}) {
      for (const DType out : {DType::kBF16, DType::kF16, DType::kF32}) {
        for (const Case c :
             {Case{1, 4096, 0}, Case{7, 1000, 0}, Case{300, 264, 0}, Case{5, 1001, 0}, Case{3, 512, 1}}) {
          SCOPED_TRACE(std::string(gelu ? "gelu" : "silu") + " in " + std::string(dtype_name(in)) + " out " +
                       std::string(dtype_name(out)) + " rows " + std::to_string(c.rows) + " n_ff " +
                       std::to_string(c.n_ff) + " offset " + std::to_string(c.offset));
          const size_t n = static_cast<size_t>(c.rows * 2 * c.n_ff);
          auto gu = random_floats(n, 21, -9, 9);
          for (float& v : gu) v = round_to(in, v);  // the 16-bit values both kernels see
          std::vector<float> padded(static_cast<size_t>(c.offset), 0.0f);
          padded.insert(padded.end(), gu.begin(), gu.end());
          const DeviceBuffer d_in = upload(encode(in, padded));
          const DeviceBuffer d_f32 = upload(gu);
          const size_t out_n = static_cast<size_t>(c.rows * c.n_ff), es = elem_bytes(out);
          DeviceBuffer d_got = poisoned((out_n + c.offset) * es), d_want = poisoned(out_n * es);
          glu_narrow(gelu, in, static_cast<const uint8_t*>(d_in.data()) + c.offset * 2, c.rows, c.n_ff, out,
                     static_cast<uint8_t*>(d_got.data()) + c.offset * es, nullptr);
          if (gelu) {
            gelu_tanh_mul(d_f32.as<float>(), c.rows, c.n_ff, out, d_want.data(), nullptr);
          } else {
            silu_mul(d_f32.as<float>(), c.rows, c.n_ff, out, d_want.data(), nullptr);
          }
          const auto got_all = decode(out, download<uint8_t>(d_got, (out_n + c.offset) * es));
          const std::vector<float> got(got_all.begin() + c.offset, got_all.end());
          const auto want = decode(out, download<uint8_t>(d_want, out_n * es));
          std::vector<float> cpu(out_n);
          for (int64_t r = 0; r < c.rows; ++r) {
            const float* g = &gu[static_cast<size_t>(r * 2 * c.n_ff)];
            (gelu ? cpu::gelu_tanh_mul : cpu::silu_mul)(g, g + c.n_ff, &cpu[static_cast<size_t>(r * c.n_ff)], c.n_ff);
          }
          size_t exact = 0;
          for (size_t i = 0; i < out_n; ++i) {
            ASSERT_TRUE(std::isfinite(got[i])) << i;
            ASSERT_LE(std::fabs(double(got[i]) - want[i]), (out == DType::kF32 ? 8 : 1) * ulp_at(out, want[i])) << i;
            ASSERT_NEAR(got[i], cpu[i], 2 * ulp_at(out, cpu[i]) + 1e-5 * std::fabs(cpu[i]) + 1e-6) << i;
            exact += got[i] == want[i];
          }
          // 16-bit outputs an ulp apart only where the f32 values round differently
          if (out != DType::kF32) {
            EXPECT_GE(exact, out_n * 99 / 100);
          }
        }
      }
    }
  }
}

TEST(GluNarrow, RunNarrowIsTheGemmRoundedOnce) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  ThreadPool pool(2);
  cpu::Scratch scratch;
  struct Shape {
    int64_t n, rows, cols;
  };
  for (const DType t : {DType::kF16, DType::kBF16}) {
    for (const Shape s : {Shape{1, 200, 96}, Shape{9, 2 * 264, 256}, Shape{64, 512, 1000}, Shape{300, 2 * 520, 512}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(s.n) + " rows " + std::to_string(s.rows));
      const auto w = encode(t, random_floats(static_cast<size_t>(s.rows * s.cols), 31));
      auto x = random_floats(static_cast<size_t>(s.n * s.cols), 32);
      for (float& v : x) v = round_to(t, v);
      cpu::WeightView wv{t, s.rows, s.cols, w.data(), row_bytes(t, s.cols)};
      scratch.reserve(cpu::matmul_scratch_bytes(t, s.cols, s.n));
      std::vector<float> want(static_cast<size_t>(s.n * s.rows));
      cpu::matmul(wv, x.data(), s.n, want.data(), pool, scratch);
      const DeviceBuffer dw = upload(w), dx = upload(encode(t, x));
      DeviceBuffer dy = poisoned(want.size() * 2);
      ASSERT_TRUE(gemm.run_narrow(t, dw.data(), dx.data(), s.n, s.rows, s.cols, dy.data()).ok());
      const auto got = decode(t, download<uint8_t>(dy, want.size() * 2));
      double scale = 0;
      for (float v : want) scale = std::max(scale, std::fabs(double(v)));
      const double sum_tol = 1e-5 * std::sqrt(double(s.cols)) * scale + 1e-6;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        ASSERT_LE(std::fabs(double(got[i]) - want[i]), ulp_at(t, want[i]) + sum_tol) << i;
      }
    }
  }
  // F32 weights have no narrow output: refused, not run.
  EXPECT_FALSE(gemm.run_narrow(DType::kF32, nullptr, nullptr, 4, 8, 8, nullptr).ok());
}

}  // namespace
}  // namespace rill::cuda
