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
#include "backend/cuda/cuda_backend.h"
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

// The CUDA backend's matmul_glu with dense 16-bit weights: up to
// kGemvMaxTokens tokens, and with F16 activations at any count, today's
// matmul then glu, bit for bit; beyond, with BF16, the narrow route (the scratch then holds gate/up in the activation
// dtype, checked) within the rounding of gate/up to 16 bits (half an ulp each, amplified up to ~4x by the activation's
// slope at negative gates) and of both outputs: six ulps of the output, plus the two GEMMs' summation orders.
TEST(GluNarrow, BackendMatmulGluRoundsGateUpOnce) {
  RILL_REQUIRE_GPU();
  const int64_t cols = 512, max_tokens = 300;
  for (const DType act : {DType::kBF16, DType::kF16}) {
    for (const int64_t F : {int64_t{344}, int64_t{1001}}) {
      const std::vector<float> w = random_floats(static_cast<size_t>(2 * F * cols), 41, -0.1f, 0.1f);
      CudaBackendOptions o;
      o.act = act;
      auto b = make_cuda_backend(o);
      ASSERT_TRUE(b.ok()) << b.error().message;
      const HostMatrix parts[2] = {{w.data(), DType::kF32, F, cols, static_cast<size_t>(cols) * 4},
                                   {w.data() + F * cols, DType::kF32, F, cols, static_cast<size_t>(cols) * 4}};
      auto wt = (*b)->place(parts, 2, "mlp.{gate,up}_proj");
      ASSERT_TRUE(wt.ok()) << wt.error().message;
      ASSERT_TRUE((*b)->reserve({max_tokens, 4, 64}).ok());
      const size_t ab = elem_bytes(act);
      auto xb = (*b)->allocate(static_cast<size_t>(max_tokens * cols) * ab, "x");
      auto gu_a = (*b)->allocate(static_cast<size_t>(max_tokens * 2 * F) * 4, "gate_up a");
      auto gu_b = (*b)->allocate(static_cast<size_t>(max_tokens * 2 * F) * 4, "gate_up b");
      auto out_a = (*b)->allocate(static_cast<size_t>(max_tokens * F) * ab, "out a");
      auto out_b = (*b)->allocate(static_cast<size_t>(max_tokens * F) * ab, "out b");
      ASSERT_TRUE(xb.ok() && gu_a.ok() && gu_b.ok() && out_a.ok() && out_b.ok());
      for (const int64_t n : {int64_t{1}, int64_t{8}, int64_t{9}, int64_t{64}, int64_t{300}}) {
        std::vector<float> x = random_floats(static_cast<size_t>(n * cols), 42 + static_cast<uint32_t>(n));
        const std::vector<uint8_t> xbytes = encode(act, x);
        ASSERT_TRUE((*b)->copy_in(xb->data(), xbytes.data(), xbytes.size()).ok());
        const Tensor xt = Tensor::dense(xb->data(), act, n, cols);
        const Tensor ga = Tensor::dense(gu_a->data(), DType::kF32, n, 2 * F),
                     gb = Tensor::dense(gu_b->data(), DType::kF32, n, 2 * F);
        const Tensor oa = Tensor::dense(out_a->data(), act, n, F), ob = Tensor::dense(out_b->data(), act, n, F);
        for (const Glu kind : {Glu::kSilu, Glu::kGeluTanh}) {
          SCOPED_TRACE(std::string(dtype_name(act)) + " F " + std::to_string(F) + ", " + std::to_string(n) + " tokens" +
                       (kind == Glu::kGeluTanh ? ", GELU-tanh" : ", SiLU"));
          ASSERT_TRUE((*b)->matmul(*wt, xt, ga, false).ok());
          (*b)->glu(kind, ga, oa);
          ASSERT_TRUE((*b)->matmul_glu(*wt, xt, kind, gb, ob).ok());
          std::vector<float> gate_up(static_cast<size_t>(n * 2 * F));
          ASSERT_TRUE((*b)->copy_out(gate_up.data(), gu_a->data(), gate_up.size() * 4).ok());
          std::vector<uint8_t> want_b(static_cast<size_t>(n * F) * ab), got_b(want_b.size());
          ASSERT_TRUE((*b)->copy_out(want_b.data(), out_a->data(), want_b.size()).ok());
          ASSERT_TRUE((*b)->copy_out(got_b.data(), out_b->data(), got_b.size()).ok());
          if (n <= kGemvMaxTokens || act != DType::kBF16) {
            // matmul then glu (F16 stays on it: 16-bit gate/up could
            // overflow f16's range), bit for bit where cuBLASLt repeats its
            // own bits run to run.
            std::vector<uint8_t> again(want_b.size());
            ASSERT_TRUE((*b)->matmul(*wt, xt, ga, false).ok());
            (*b)->glu(kind, ga, oa);
            ASSERT_TRUE((*b)->copy_out(again.data(), out_a->data(), again.size()).ok());
            if (again == want_b) {
              EXPECT_EQ(got_b, want_b) << "matmul_glu is not matmul then glu here";
            }
            continue;
          }
          // The narrow route ran: the scratch's first n x 2F 16-bit values
          // are gate/up in act (within one rounding of today's f32 ones).
          std::vector<uint8_t> scratch(static_cast<size_t>(n * 2 * F) * ab);
          ASSERT_TRUE((*b)->copy_out(scratch.data(), gu_b->data(), scratch.size()).ok());
          const std::vector<float> narrow = decode(act, scratch);
          double gmax = 0;
          int64_t close = 0;
          for (size_t i = 0; i < narrow.size(); ++i) {
            gmax = std::max(gmax, std::fabs(double(gate_up[i])));
            close += std::fabs(double(narrow[i]) - gate_up[i]) <= ulp_at(act, gate_up[i]) + 1e-5;
          }
          EXPECT_GE(close, static_cast<int64_t>(narrow.size()) * 99 / 100)
              << "the scratch does not hold 16-bit gate/up";
          const std::vector<float> want = decode(act, want_b), got = decode(act, got_b);
          const double abs_tol = 2e-5 * std::sqrt(double(cols)) * gmax * (gmax + 1);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(std::isfinite(got[i])) << i;
            ASSERT_LE(std::fabs(double(got[i]) - want[i]), 6 * ulp_at(act, want[i]) + abs_tol) << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill::cuda
