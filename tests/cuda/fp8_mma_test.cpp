// fp8_mma and fp8_mma_glu (backend/cuda/fp8_mma.cu, issue 23): the FP8
// GEMM of our own for decode batches.
//  - against the host's exact (f64) sum of the e4m3 products, times the
//    token and row scales: within 1e-4 of sum |w x| (f32 accumulation on
//    the tensor cores over up to 14,336 columns; a wrong fragment, swizzle
//    or scale is off by ~100%), over shapes whose columns are whole 16s but
//    not whole 128s (a stage's last chunks empty), rows not whole slabs of
//    128, split and unsplit plans (ksplit forced to 1 and 3 too), 2..100
//    tokens (100: two launches of 64 and 36);
//  - against cuBLASLt's FP8 GEMM (Gemm::run_fp8, f32 accumulation) on the
//    same xq / xs within both bounds (2e-4 of sum |w x|);
//  - batch invariance, bit for bit: a token alone, among 17 and among 64
//    (at other places) gives the same bits, split and unsplit;
//  - accumulate: y0 + the overwriting result, bit for bit;
//  - the GLU epilogue: fp8_mma_glu equals fp8_mma then silu_mul /
//    gelu_tanh_mul bit for bit (F32, F16, BF16 out; split and unsplit);
//  - the same (but cuBLASLt) for fp8_mma_bf16x / fp8_mma_glu_bf16x (x in
//    bf16 as it is; the exact sums of e4m3(w) x);
//  - with RILL_FP8_MMA=1 and =2 (the device script runs the binary again
//    so): fp8_matmul and fp8_matmul_glu take it (the same bits).
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::encode;
using testing::random_floats;
using testing::round_to;
using testing::upload;

DeviceBuffer alloc(size_t bytes) {
  auto b = DeviceBuffer::allocate(bytes + 16, "test buffer");
  EXPECT_TRUE(b.ok());
  RILL_CUDA_CHECK(cudaMemset(b->data(), 0, bytes + 16));
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  return std::move(b).value();
}

// One problem: FP8 weights [rows, cols] quantized on the device, n tokens
// of bf16 x quantized on the device (quantize_fp8_tokens), the host copies
// of the codes and scales, and the exact sums.
struct Problem {
  int64_t rows = 0, cols = 0, n = 0;
  DeviceBuffer w, xb, xq, xs, part;  // xb: x in bf16
  int64_t part_floats = 0;
  std::vector<uint8_t> wq_host, xq_host;
  std::vector<float> ws_host, xs_host, x_host;

  Problem(int64_t rows_, int64_t cols_, int64_t n_, uint32_t seed) : rows(rows_), cols(cols_), n(n_) {
    std::vector<float> wf = random_floats(static_cast<size_t>(rows * cols), seed, -0.05f, 0.05f);
    for (size_t i = 0; i < wf.size(); i += 97) wf[i] *= 20;  // outliers: unequal row scales
    if (rows > 2) std::fill(wf.begin() + cols, wf.begin() + 2 * cols, 0.0f);
    const DeviceBuffer wsrc = upload(encode(DType::kF32, wf));
    w = alloc(fp8_matrix_bytes(rows, cols));
    quantize_fp8_rows(DType::kF32, wsrc.data(), rows, cols, w.as<uint8_t>(),
                      const_cast<float*>(fp8_scales(w.data(), rows, cols)), nullptr);
    std::vector<float> x = random_floats(static_cast<size_t>(n * cols), seed + 1);
    for (size_t i = 0; i < x.size(); i += 131) x[i] *= 8;
    for (float& v : x) v = round_to(DType::kBF16, v);
    x_host = x;
    xb = upload(encode(DType::kBF16, x));
    xq = alloc(static_cast<size_t>(n * cols));
    xs = alloc(static_cast<size_t>(n) * 4);
    quantize_fp8_tokens(DType::kBF16, xb.data(), n, cols, xq.as<uint8_t>(), xs.as<float>(), nullptr);
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto bytes = download<uint8_t>(w, fp8_matrix_bytes(rows, cols));
    wq_host.resize(static_cast<size_t>(rows * cols));
    ws_host.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(wq_host.data() + r * cols, bytes.data() + r * fp8_row_bytes(cols) + kFp8RowHeader,
                  static_cast<size_t>(cols));
    }
    std::memcpy(ws_host.data(), bytes.data() + rows * fp8_row_bytes(cols), static_cast<size_t>(rows) * 4);
    xq_host = download<uint8_t>(xq, static_cast<size_t>(n * cols));
    xs_host = download<float>(xs, static_cast<size_t>(n));
    part_floats = 0;
    for (const int k : {0, 1, 2, 3, 4, 8}) {
      part_floats = std::max({part_floats, fp8_mma_part_floats(n, rows, cols, false, k),
                              fp8_mma_part_floats(n, rows, cols, rows % 2 == 0, k)});
    }
    part = alloc(static_cast<size_t>(std::max<int64_t>(part_floats, 1)) * 4);
  }

  // The exact scaled sum and sum |w x| x scales of (token t, row r): of
  // the e4m3 codes of x and w (bf16x: of w's codes and x in bf16).
  void exact(int64_t t, int64_t r, double& sum, double& mag, bool bf16x = false) const {
    double s = 0, m = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xv = bf16x ? double(x_host[t * cols + c]) : e4m3_value(xq_host[t * cols + c]);
      const double p = e4m3_value(wq_host[r * cols + c]) * xv;
      s += p;
      m += std::fabs(p);
    }
    const double scale = (bf16x ? 1.0 : double(xs_host[t])) * ws_host[r];
    sum = s * scale;
    mag = m * scale;
  }

  // fp8_mma (bf16x: fp8_mma_bf16x) of tokens [t0, t0 + count) into y (y0
  // first when given).
  std::vector<float> run(int ksplit, bool accumulate = false, const std::vector<float>* y0 = nullptr, int64_t t0 = 0,
                         int64_t count = -1, bool bf16x = false) const {
    const int64_t nt = count < 0 ? n : count;
    const DeviceBuffer y = y0 ? upload(*y0) : testing::poisoned(static_cast<size_t>(nt * rows) * 4);
    if (bf16x) {
      fp8_mma_bf16x(w.as<uint8_t>(), xb.as<uint8_t>() + t0 * cols * 2, nt, rows, cols, y.as<float>(), accumulate,
                    part.as<float>(), part_floats, nullptr, ksplit);
    } else {
      fp8_mma(w.as<uint8_t>(), xq.as<uint8_t>() + t0 * cols, xs.as<float>() + t0, nt, rows, cols, y.as<float>(),
              accumulate, part.as<float>(), part_floats, nullptr, ksplit);
    }
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    return download<float>(y, static_cast<size_t>(nt * rows));
  }
};

std::string trace(const Problem& p, int ksplit, bool bf16x = false) {
  return std::to_string(p.rows) + " x " + std::to_string(p.cols) + ", " + std::to_string(p.n) + " tokens, ksplit " +
         (ksplit ? std::to_string(ksplit) : std::string("auto")) + (bf16x ? ", bf16 x" : ", e4m3 x");
}

TEST(Fp8Mma, MatchesTheExactSumOfTheE4m3Products) {
  RILL_REQUIRE_GPU();
  struct Case {
    int64_t rows, cols, n;
  };
  // 300 x 4096: 3 slabs, split; 4100 x 208: 33 slabs, 2 chunks of which
  // the second has 80 columns; 128 x 1040: one slab, 9 chunks (the last
  // 16 columns); 2000 x 14336: down's width.
  for (const Case c : {Case{300, 4096, 2}, Case{300, 4096, 37}, Case{300, 4096, 100}, Case{4100, 208, 9},
                       Case{4100, 208, 64}, Case{128, 1040, 16}, Case{2000, 14336, 24}}) {
    const Problem p(c.rows, c.cols, c.n, 7 + static_cast<uint32_t>(c.rows + c.n));
    for (const bool bf16x : {false, true}) {
      std::vector<double> sums(static_cast<size_t>(p.n * p.rows)), mags(sums.size());
      for (int64_t t = 0; t < p.n; ++t) {
        for (int64_t r = 0; r < p.rows; ++r) p.exact(t, r, sums[t * p.rows + r], mags[t * p.rows + r], bf16x);
      }
      for (const int ksplit : {0, 1, 3}) {
        SCOPED_TRACE(trace(p, ksplit, bf16x));
        const std::vector<float> got = p.run(ksplit, false, nullptr, 0, -1, bf16x);
        double worst = 0;
        int64_t bad = 0;
        for (int64_t t = 0; t < p.n; ++t) {
          for (int64_t r = 0; r < p.rows; ++r) {
            const double sum = sums[t * p.rows + r], mag = mags[t * p.rows + r];
            const double err = std::fabs(got[static_cast<size_t>(t * p.rows + r)] - sum);
            const bool ok = err <= 1e-4 * mag + 1e-30;  // NaN fails
            if (!ok && bad++ < 5) {
              ADD_FAILURE() << "token " << t << " row " << r << ": " << got[static_cast<size_t>(t * p.rows + r)]
                            << " against " << sum << " (sum |w x| " << mag << ")";
            }
            if (mag > 0) worst = std::max(worst, err / mag);
          }
        }
        EXPECT_EQ(bad, 0);
        std::printf("[ fp8 mma ] %s: worst error / sum |w x| = %.3g\n", trace(p, ksplit, bf16x).c_str(), worst);
      }
    }
  }
}

TEST(Fp8Mma, AgreesWithCublasLt) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  gemm.set_fp8_fast_accum(false);
  const Problem p(1024, 4096, 40, 91);
  const int64_t ld = static_cast<int64_t>(fp8_row_bytes(p.cols));
  ASSERT_TRUE(gemm.fp8_gemm_supported(p.n, p.rows, p.cols, ld)) << "cuBLASLt offers no FP8 GEMM here";
  const DeviceBuffer y = testing::poisoned(static_cast<size_t>(p.n * p.rows) * 4);
  const DeviceBuffer d = alloc(static_cast<size_t>(p.n * p.rows) * 4);
  ASSERT_TRUE(gemm.run_fp8(p.w.as<uint8_t>() + kFp8RowHeader, ld, fp8_scales(p.w.data(), p.rows, p.cols),
                           p.xq.as<uint8_t>(), p.xs.as<float>(), p.n, p.rows, p.cols, y.as<float>(), false,
                           d.as<float>(), p.n * p.rows)
                  .ok());
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  const auto lt = download<float>(y, static_cast<size_t>(p.n * p.rows));
  const std::vector<float> got = p.run(0);
  double worst = 0;
  int64_t bad = 0;
  for (int64_t t = 0; t < p.n; ++t) {
    for (int64_t r = 0; r < p.rows; ++r) {
      double sum = 0, mag = 0;
      p.exact(t, r, sum, mag);
      const size_t i = static_cast<size_t>(t * p.rows + r);
      const double diff = std::fabs(double(got[i]) - lt[i]);
      bad += !(diff <= 2e-4 * mag + 1e-30);
      if (mag > 0) worst = std::max(worst, diff / mag);
    }
  }
  EXPECT_EQ(bad, 0) << "outputs differ from cuBLASLt's by more than 2e-4 of sum |w x|";
  std::printf(
      "[ fp8 mma ] against cuBLASLt (f32 accumulation), 1024 x 4096, 40 tokens: worst |diff| / sum |w x| = "
      "%.3g\n",
      worst);
}

TEST(Fp8Mma, ATokensResultDoesNotDependOnTheBatch) {
  RILL_REQUIRE_GPU();
  for (const int64_t rows : {int64_t{300}, int64_t{1000}}) {
    const Problem p(rows, 2048, 100, 33);
    for (const bool bf16x : {false, true}) {
      for (const int ksplit : {0, 1, 4}) {
        SCOPED_TRACE(trace(p, ksplit, bf16x));
        const std::vector<float> all = p.run(ksplit, false, nullptr, 0, -1, bf16x);  // 64 + 36
        const std::vector<float> first64 = p.run(ksplit, false, nullptr, 0, 64, bf16x);
        for (const int64_t t : {int64_t{0}, int64_t{5}, int64_t{37}, int64_t{63}, int64_t{64}, int64_t{99}}) {
          const std::vector<float> alone = p.run(ksplit, false, nullptr, t, 1, bf16x);
          EXPECT_EQ(std::memcmp(alone.data(), all.data() + t * rows, static_cast<size_t>(rows) * 4), 0)
              << "token " << t << " alone differs from the same token among 100";
          if (t < 64) {
            EXPECT_EQ(std::memcmp(alone.data(), first64.data() + t * rows, static_cast<size_t>(rows) * 4), 0)
                << "token " << t << " alone differs from the same token among 64";
          }
        }
        // 17 tokens from token 20: token 20 + i at place i.
        const std::vector<float> mid = p.run(ksplit, false, nullptr, 20, 17, bf16x);
        EXPECT_EQ(std::memcmp(mid.data(), all.data() + 20 * rows, mid.size() * 4), 0)
            << "tokens 20..36 as a batch of 17 differ from the same tokens among 100";
      }
    }
  }
}

TEST(Fp8Mma, AccumulatesOntoY) {
  RILL_REQUIRE_GPU();
  const Problem p(700, 1536, 33, 44);
  const std::vector<float> y0 = random_floats(static_cast<size_t>(p.n * p.rows), 45);
  for (const int ksplit : {0, 1}) {
    for (const bool bf16x : {false, true}) {
      SCOPED_TRACE(trace(p, ksplit, bf16x));
      const std::vector<float> plain = p.run(ksplit, false, nullptr, 0, -1, bf16x);
      const std::vector<float> acc = p.run(ksplit, true, &y0, 0, -1, bf16x);
      int64_t bad = 0;
      for (size_t i = 0; i < acc.size(); ++i) {
        const float want = y0[i] + plain[i];
        bad += std::memcmp(&acc[i], &want, 4) != 0;
      }
      EXPECT_EQ(bad, 0) << "of " << acc.size() << " outputs are not y0 + the overwriting result";
    }
  }
}

TEST(Fp8Mma, GluEpilogueEqualsMatmulThenGlu) {
  RILL_REQUIRE_GPU();
  // F 344: 6 slabs (split); 1000: 16 slabs; 4112: 65 slabs.
  for (const int64_t F : {int64_t{344}, int64_t{1000}, int64_t{4112}}) {
    const Problem p(2 * F, 1024, 24, 61 + static_cast<uint32_t>(F));
    for (const int ksplit : {0, 1}) {
      for (const bool bf16x : {false, true}) {
        const std::vector<float> y = p.run(ksplit, false, nullptr, 0, -1, bf16x);  // the scaled gate_up
        const DeviceBuffer gate_up = upload(y);
        for (const DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
          for (const bool gelu : {false, true}) {
            SCOPED_TRACE(trace(p, ksplit, bf16x) + ", out " + std::string(dtype_name(out)) +
                         (gelu ? ", GELU" : ", SiLU"));
            const size_t es = out == DType::kF32 ? 4 : 2, bytes = static_cast<size_t>(p.n * F) * es;
            const DeviceBuffer want = testing::poisoned(bytes), got = testing::poisoned(bytes);
            if (gelu) {
              gelu_tanh_mul(gate_up.as<float>(), p.n, F, out, want.data(), nullptr);
            } else {
              silu_mul(gate_up.as<float>(), p.n, F, out, want.data(), nullptr);
            }
            if (bf16x) {
              fp8_mma_glu_bf16x(p.w.as<uint8_t>(), p.xb.data(), p.n, p.rows, p.cols, gelu, out, got.data(),
                                p.part.as<float>(), p.part_floats, nullptr, ksplit);
            } else {
              fp8_mma_glu(p.w.as<uint8_t>(), p.xq.as<uint8_t>(), p.xs.as<float>(), p.n, p.rows, p.cols, gelu, out,
                          got.data(), p.part.as<float>(), p.part_floats, nullptr, ksplit);
            }
            RILL_CUDA_CHECK(cudaDeviceSynchronize());
            const auto a = download<uint8_t>(want, bytes), b = download<uint8_t>(got, bytes);
            int64_t bad = 0;
            for (size_t i = 0; i < bytes; i += es) bad += std::memcmp(a.data() + i, b.data() + i, es) != 0;
            EXPECT_EQ(bad, 0) << "of " << p.n * F << " GLU outputs differ from fp8_mma then the GLU";
          }
        }
      }
    }
  }
}

// With RILL_FP8_MMA=1 (the device script's second run): fp8_matmul and
// fp8_matmul_glu take fp8_mma for 2..64 tokens (the same bits as calling
// it), cuBLASLt from 65 (not fp8_mma's bits); with RILL_FP8_MMA=2 (its
// third run) fp8_mma_bf16x, on x itself.
TEST(Fp8Mma, Fp8MatmulTakesItWhenSwitchedOn) {
  RILL_REQUIRE_GPU();
  if (!fp8_mma_on()) GTEST_SKIP() << "RILL_FP8_MMA=1 not set";
  force_fp8_stream(0);  // gemm_stream's route comes before fp8_mma's (2..64 tokens by default)
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const int64_t rows = 1000, cols = 2048, F = rows / 2;
  for (const int64_t n : {int64_t{2}, int64_t{64}, int64_t{65}}) {
    SCOPED_TRACE(std::to_string(n) + " tokens");
    if (n > kFp8MmaMaxTokens && !gemm.fp8_gemm_supported(n, rows, cols, static_cast<int64_t>(fp8_row_bytes(cols)))) {
      continue;  // fp8_matmul would need quant_matmul's scratch
    }
    const Problem p(rows, cols, n, 71);
    std::vector<float> x = random_floats(static_cast<size_t>(n * cols), 72);
    for (float& v : x) v = round_to(DType::kBF16, v);
    const DeviceBuffer xd = upload(encode(DType::kBF16, x));
    // The scratch as the backend carves it (two passes over an Arena).
    Arena sizing;
    Fp8Scratch probe;
    probe.carve(sizing, n, cols);
    const DeviceBuffer arena = alloc(sizing.used());
    Arena a(arena.data());
    Fp8Scratch fp8;
    fp8.carve(a, n, cols);
    ASSERT_GT(fp8.mma_part_floats, 0);
    const DeviceBuffer y = testing::poisoned(static_cast<size_t>(n * rows) * 4);
    ASSERT_TRUE(fp8_matmul(gemm, QuantScratch{}, fp8, p.w.data(), DType::kBF16, xd.data(), n, rows, cols, y.as<float>(),
                           false, (*ctx)->stream())
                    .ok());
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = download<float>(y, static_cast<size_t>(n * rows));
    // fp8_mma on the activations fp8_matmul quantized into its scratch
    // (RILL_FP8_MMA=2: fp8_mma_bf16x on x).
    const DeviceBuffer yd = testing::poisoned(static_cast<size_t>(n * rows) * 4);
    if (fp8_mma_bf16x_on()) {
      fp8_mma_bf16x(p.w.as<uint8_t>(), xd.data(), n, rows, cols, yd.as<float>(), false, p.part.as<float>(),
                    p.part_floats, (*ctx)->stream());
    } else {
      fp8_mma(p.w.as<uint8_t>(), fp8.xq, fp8.xs, n, rows, cols, yd.as<float>(), false, p.part.as<float>(),
              p.part_floats, (*ctx)->stream());
    }
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto direct = download<float>(yd, static_cast<size_t>(n * rows));
    const bool same = std::memcmp(got.data(), direct.data(), got.size() * 4) == 0;
    EXPECT_EQ(same, n <= kFp8MmaMaxTokens) << (same ? "fp8_mma's bits past 64 tokens" : "not fp8_mma's bits");
    if (n <= kFp8MmaMaxTokens) {
      EXPECT_TRUE(fp8_glu_fusable(gemm, fp8, DType::kBF16, n, rows, cols));
      const DeviceBuffer gu = alloc(static_cast<size_t>(n * rows) * 4);
      const DeviceBuffer out = testing::poisoned(static_cast<size_t>(n * F) * 2);
      ASSERT_TRUE(fp8_matmul_glu(gemm, fp8, p.w.data(), DType::kBF16, xd.data(), n, rows, cols, false, gu.as<float>(),
                                 DType::kBF16, out.data(), (*ctx)->stream())
                      .ok());
      const DeviceBuffer want = testing::poisoned(static_cast<size_t>(n * F) * 2);
      const DeviceBuffer gate_up = upload(direct);
      silu_mul(gate_up.as<float>(), n, F, DType::kBF16, want.data(), nullptr);
      RILL_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(download<uint8_t>(out, static_cast<size_t>(n * F) * 2),
                download<uint8_t>(want, static_cast<size_t>(n * F) * 2))
          << "fp8_matmul_glu differs from fp8_mma then silu_mul";
    }
  }
  force_fp8_stream(-1);
}

}  // namespace
}  // namespace rill::cuda
