// The Q8_0 dp4a decode GEMV (quant.h: q8_dp4a_gemv, repack_q8_0_rows;
// its arithmetic: backend/cuda/q8_dp4a_order.h) on random Q8_0 rows:
//  - equals the host restatement of its documented order
//    (tests/backend/q8_dp4a_ref.h: quantize_x8's rounding, exact unit dots,
//    the lanes' fma chains, the xor tree, the parts in order) bit for bit,
//    from both layouts (GGUF blocks and the repacked rows), 1..8 and 11
//    tokens, x in F32 and BF16, accumulating and not, rows y_stride apart
//    (columns past n_rows untouched); widths of whole and partial
//    256-column tiles (32, 576, 2,080, 4,128) and 8B-like ones;
//  - is within sum |w| d_x / 2 + 1e-5 sum |w x| of the f64 product with
//    the unquantized x (the rounding of x to int8);
//  - a token's row is the same bits alone and among 8 (batch invariance);
//  - quant_matmul (and quant_matmul_parts) takes it by default (no
//    RILL_Q8_DP4A=0) for 1..8 tokens of Q8_0 and keeps quant_mma past 8.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../backend/q8_dp4a_ref.h"
#include "../backend/quant_test_util.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/quant.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::encode;
using testing::poisoned;
using testing::round_to;
using testing::upload;

struct Shape {
  int64_t rows, cols;
};

const Shape kShapes[] = {{3, 32}, {5, 256}, {67, 576}, {33, 2080}, {300, 4096}, {17, 4128}, {40, 14336}};

// x [n, cols] rounded to xt, its int8 copy as the host restates it, and
// the device buffers (W as given and repacked).
struct Case {
  std::vector<uint8_t> w;
  std::vector<float> x;
  rill::testing::X8 x8;
};

Case make_case(const Shape& s, int64_t n, DType xt, uint32_t seed) {
  Case c;
  c.w = cpu::testing::random_weight_rows(DType::kQ8_0, s.rows, s.cols, seed);
  c.x = testing::random_floats(static_cast<size_t>(n * s.cols), seed + 1, -2.0f, 2.0f);
  for (float& v : c.x) v = round_to(xt, v);
  c.x8 = rill::testing::quantize_x8_ref(c.x, n, s.cols);
  return c;
}

// The restatement's y [n, rows] (accumulate: onto y0, rows stride apart).
std::vector<float> want_y(const Case& c, const Shape& s, int64_t n, bool accumulate = false,
                          const std::vector<float>* y0 = nullptr, int64_t stride = 0) {
  if (stride <= 0) stride = s.rows;
  std::vector<float> y(static_cast<size_t>(n * s.rows));
  const int64_t nb = s.cols / 32;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < s.rows; ++r) {
      const float base = accumulate ? (*y0)[static_cast<size_t>(t * stride + r)] : 0.0f;
      y[static_cast<size_t>(t * s.rows + r)] = rill::testing::q8_dp4a_row_ref(
          c.w.data() + r * nb * 34, c.x8.q.data() + t * s.cols, c.x8.d.data() + t * nb, s.cols, accumulate, base);
    }
  }
  return y;
}

TEST(CudaQ8Dp4a, EqualsItsDocumentedOrderBitForBit) {
  RILL_REQUIRE_GPU();
  const int64_t n_max = 11;
  for (const Shape& s : kShapes) {
    for (DType xt : {DType::kF32, DType::kBF16}) {
      const Case c = make_case(s, n_max, xt, 7 + static_cast<uint32_t>(s.cols + s.rows));
      const auto dw = upload(c.w);
      auto dr = poisoned(c.w.size());
      repack_q8_0_rows(dw.data(), s.rows, s.cols, dr.data(), nullptr);
      const auto dx = upload(encode(xt, c.x));
      auto dq = poisoned(quantized_x_bytes(n_max, s.cols));
      const auto all = want_y(c, s, n_max);
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 11}) {
        quantize_x8(xt, dx.data(), n, s.cols, dq.data(), nullptr);
        for (Q8Layout layout : {Q8Layout::kGguf, Q8Layout::kRows}) {
          const void* w = layout == Q8Layout::kGguf ? dw.data() : dr.data();
          const char* lname = layout == Q8Layout::kGguf ? "gguf" : "rows";
          for (bool acc : {false, true}) {
            const int64_t stride = s.rows + 3;
            const auto y0 = testing::random_floats(static_cast<size_t>(n * stride), 31 + static_cast<uint32_t>(n));
            const auto dy = upload(y0);
            q8_dp4a_gemv(layout, w, dq.data(), n, s.rows, s.cols, dy.as<float>(), stride, acc, nullptr);
            const auto y = download<float>(dy, static_cast<size_t>(n * stride));
            const auto want = acc ? want_y(c, s, n, true, &y0, stride) : all;
            int64_t n_diff = 0, n_touched = 0;
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t r = 0; r < stride; ++r) {
                const float got = y[static_cast<size_t>(t * stride + r)];
                if (r < s.rows) {
                  n_diff += std::memcmp(&got, &want[static_cast<size_t>(t * s.rows + r)], 4) != 0;
                } else {
                  n_touched += std::memcmp(&got, &y0[static_cast<size_t>(t * stride + r)], 4) != 0;
                }
              }
            }
            EXPECT_EQ(n_diff, 0) << s.rows << "x" << s.cols << " x " << dtype_name(xt) << " n=" << n << " " << lname
                                 << (acc ? " accumulate" : "");
            EXPECT_EQ(n_touched, 0) << s.rows << "x" << s.cols << " n=" << n << ": columns past n_rows written";
          }
        }
      }
    }
  }
}

TEST(CudaQ8Dp4a, IsWithinTheInt8RoundingOfTheExactProduct) {
  RILL_REQUIRE_GPU();
  const int64_t n = 8;
  double worst = 0;
  for (const Shape& s : kShapes) {
    for (DType xt : {DType::kF32, DType::kBF16}) {
      const Case c = make_case(s, n, xt, 101 + static_cast<uint32_t>(s.cols));
      const auto dw = upload(c.w);
      const auto dx = upload(encode(xt, c.x));
      auto dq = poisoned(quantized_x_bytes(n, s.cols));
      quantize_x8(xt, dx.data(), n, s.cols, dq.data(), nullptr);
      auto dy = poisoned(static_cast<size_t>(n * s.rows) * 4);
      q8_dp4a_gemv(Q8Layout::kGguf, dw.data(), dq.data(), n, s.rows, s.cols, dy.as<float>(), 0, false, nullptr);
      const auto y = download<float>(dy, static_cast<size_t>(n * s.rows));
      const int64_t nb = s.cols / 32;
      double e = 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < s.rows; ++r) {
          const double v =
              rill::testing::q8_dp4a_error_over_bound(y[static_cast<size_t>(t * s.rows + r)], c.w.data() + r * nb * 34,
                                                      c.x.data() + t * s.cols, c.x8.d.data() + t * nb, s.cols);
          if (!(v <= e)) e = v;  // NaN propagates
        }
      }
      EXPECT_LE(e, 1.0) << s.rows << "x" << s.cols << " x " << dtype_name(xt);
      worst = std::max(worst, e);
    }
  }
  std::printf("[ cuda q8 dp4a ] max |y - exact| over the int8-rounding bound: %.3g\n", worst);
}

TEST(CudaQ8Dp4a, ATokensRowIsTheSameAloneAndAmongEight) {
  RILL_REQUIRE_GPU();
  const int64_t n = 8;
  for (const Shape& s : kShapes) {
    const DType xt = DType::kBF16;
    const Case c = make_case(s, n, xt, 211 + static_cast<uint32_t>(s.cols));
    const auto dw = upload(c.w);
    const auto dx = upload(encode(xt, c.x));
    auto dq = poisoned(quantized_x_bytes(n, s.cols));
    quantize_x8(xt, dx.data(), n, s.cols, dq.data(), nullptr);
    auto dy = poisoned(static_cast<size_t>(n * s.rows) * 4);
    q8_dp4a_gemv(Q8Layout::kGguf, dw.data(), dq.data(), n, s.rows, s.cols, dy.as<float>(), 0, false, nullptr);
    const auto batch = download<float>(dy, static_cast<size_t>(n * s.rows));
    int64_t n_diff = 0;
    for (int64_t t = 0; t < n; ++t) {
      auto d1 = poisoned(quantized_x_bytes(1, s.cols));
      quantize_x8(xt, dx.as<uint8_t>() + static_cast<size_t>(t * s.cols) * 2, 1, s.cols, d1.data(), nullptr);
      auto dz = poisoned(static_cast<size_t>(s.rows) * 4);
      q8_dp4a_gemv(Q8Layout::kGguf, dw.data(), d1.data(), 1, s.rows, s.cols, dz.as<float>(), 0, false, nullptr);
      const auto z = download<float>(dz, static_cast<size_t>(s.rows));
      for (int64_t r = 0; r < s.rows; ++r) {
        n_diff += std::memcmp(&z[static_cast<size_t>(r)], &batch[static_cast<size_t>(t * s.rows + r)], 4) != 0;
      }
    }
    EXPECT_EQ(n_diff, 0) << s.rows << "x" << s.cols << ": a token alone differs from the same token among 8";
  }
}

// The switch is read once per process: on unless the environment says
// RILL_Q8_DP4A=0 (this test skips then).
TEST(CudaQ8Dp4a, QuantMatmulTakesItByDefault) {
  RILL_REQUIRE_GPU();
  const char* e = std::getenv("RILL_Q8_DP4A");
  if (e && std::strcmp(e, "0") == 0) GTEST_SKIP() << "RILL_Q8_DP4A=0 in the environment";
  ASSERT_TRUE(q8_dp4a_on());
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  const int64_t rows = 96, cols = 1024, n_max = 12;
  const auto w = cpu::testing::random_weight_rows(DType::kQ8_0, rows, cols, 61);
  const auto dw = upload(w);
  const auto x = testing::random_floats(static_cast<size_t>(n_max * cols), 8);
  const auto dx = upload(encode(DType::kBF16, x));
  auto xq = poisoned(quantized_x_bytes(n_max, cols));
  QuantScratch scratch;
  scratch.xq = xq.data();
  scratch.xq_bytes = quantized_x_bytes(n_max, cols);
  for (int64_t n : {1, 8, 12}) {
    auto dq = poisoned(quantized_x_bytes(n, cols));
    quantize_x8(DType::kBF16, dx.data(), n, cols, dq.data(), st);
    auto dd = poisoned(static_cast<size_t>(n * rows) * 4);
    if (n <= kQ8Dp4aMaxTokens) {
      q8_dp4a_gemv(Q8Layout::kGguf, dw.data(), dq.data(), n, rows, cols, dd.as<float>(), rows, false, st);
    } else {
      quant_mma(DType::kQ8_0, dw.data(), dq.data(), n, rows, cols, dd.as<float>(), rows, false, st);
    }
    const auto want = download<float>(dd, static_cast<size_t>(n * rows));
    auto dy = poisoned(static_cast<size_t>(n * rows) * 4);
    Status s = quant_matmul(gemm, scratch, DType::kQ8_0, dw.data(), DType::kBF16, dx.data(), n, rows, cols,
                            dy.as<float>(), false, st);
    ASSERT_TRUE(s.ok()) << s.error().message;
    // The same matrix as two parts of 40 and 56 rows.
    const QuantPart parts[] = {{dw.data(), DType::kQ8_0, 40},
                               {dw.as<uint8_t>() + static_cast<size_t>(40 * (cols / 32) * 34), DType::kQ8_0, 56}};
    auto dp = poisoned(static_cast<size_t>(n * rows) * 4);
    s = quant_matmul_parts(gemm, scratch, parts, 2, DType::kBF16, dx.data(), n, cols, dp.as<float>(), false, st);
    ASSERT_TRUE(s.ok()) << s.error().message;
    cudaStreamSynchronize(st);
    const auto got = download<float>(dy, static_cast<size_t>(n * rows));
    const auto got_p = download<float>(dp, static_cast<size_t>(n * rows));
    int64_t n_diff = 0, n_diff_p = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      n_diff += std::memcmp(&got[i], &want[i], 4) != 0;
      n_diff_p += std::memcmp(&got_p[i], &want[i], 4) != 0;
    }
    EXPECT_EQ(n_diff, 0) << "quant_matmul n=" << n;
    EXPECT_EQ(n_diff_p, 0) << "quant_matmul_parts n=" << n;
  }
  // A fused matrix of mixed types (a Q8_0 part and a Q6_K part, as a GGUF's
  // qkv may be): each part takes its own path, the Q8_0 part dp4a and the
  // Q6_K part quant_mma, at 1 token as at 8, both from one quantized x.
  const int64_t rows_k = 56;
  const auto wk = cpu::testing::random_weight_rows(DType::kQ6_K, rows_k, cols, 62);
  const auto dwk = upload(wk);
  const QuantPart mixed[] = {{dw.data(), DType::kQ8_0, rows}, {dwk.data(), DType::kQ6_K, rows_k}};
  const int64_t n_all = rows + rows_k;
  for (int64_t n : {1, 8}) {
    auto dq = poisoned(quantized_x_bytes(n, cols));
    quantize_x8(DType::kBF16, dx.data(), n, cols, dq.data(), st);
    auto dd = poisoned(static_cast<size_t>(n * n_all) * 4);
    q8_dp4a_gemv(Q8Layout::kGguf, dw.data(), dq.data(), n, rows, cols, dd.as<float>(), n_all, false, st);
    quant_mma(DType::kQ6_K, dwk.data(), dq.data(), n, rows_k, cols, dd.as<float>() + rows, n_all, false, st);
    const auto want = download<float>(dd, static_cast<size_t>(n * n_all));
    auto dp = poisoned(static_cast<size_t>(n * n_all) * 4);
    const Status s =
        quant_matmul_parts(gemm, scratch, mixed, 2, DType::kBF16, dx.data(), n, cols, dp.as<float>(), false, st);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto got = download<float>(dp, static_cast<size_t>(n * n_all));
    int64_t n_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) n_diff += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(n_diff, 0) << "mixed Q8_0 + Q6_K parts, n=" << n;
  }
}

}  // namespace
}  // namespace rill::cuda
