// The host restatement of the Q8_0 dp4a decode GEMV (q8_dp4a_ref.h) on the
// CPU, so its rounding and order are checked where no GPU is:
//  - x's int8 rounding: |q| <= 127, the block's largest |x| at 127, ties to
//    even, |x - q d| <= d / 2, an all-zero block all zero;
//  - the unit split covers every column of a row once, for widths of whole
//    and partial 256-column tiles and every parts count;
//  - the ordered f32 result is within its stated bound of the f64 sum over
//    the unquantized x (and near the f64 sum over the int8 x).
// The device kernel is held to this restatement bit for bit in
// tests/cuda/q8_dp4a_test.cpp.
#include "q8_dp4a_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "quant_test_util.h"

namespace rill::testing {
namespace {

TEST(Q8Dp4aRef, QuantizesXToNearestEvenWithinHalfAStep) {
  const int64_t n = 3, cols = 96;
  auto x = cpu::testing::random_floats(n * cols, 5, -2.0f, 2.0f);
  for (int c = 0; c < 32; ++c) x[static_cast<size_t>(32 + c)] = 0.0f;  // block 1: all zero
  // Block 2: max |x| = 127, so d = 1 and x / d exact: ties at .5.
  const float ties[] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f};
  for (int c = 0; c < 32; ++c) x[static_cast<size_t>(64 + c)] = c < 8 ? ties[c] : 0.25f * static_cast<float>(c);
  const X8 r = quantize_x8_ref(x, n, cols);
  EXPECT_EQ(r.d[1], 0.0f);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(r.q[static_cast<size_t>(32 + c)], 0);
  EXPECT_EQ(r.d[2], 1.0f);
  const int want[] = {127, 2, 4, -2, -4, 0, 0, 2};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(r.q[static_cast<size_t>(64 + c)], want[c]) << ties[c];
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    const float d = r.d[static_cast<size_t>(b)];
    int max_q = 0;
    for (int i = 0; i < 32; ++i) {
      const size_t k = static_cast<size_t>(b * 32 + i);
      const int q = r.q[k];
      EXPECT_LE(std::abs(q), 127);
      max_q = std::max(max_q, std::abs(q));
      // x / d is rounded before q: past d / 2 by at most 127 d 2^-24.
      EXPECT_LE(std::fabs(static_cast<double>(x[k]) - static_cast<double>(q) * d), (0.5 + 1e-5) * d) << k;
    }
    if (d > 0) {
      EXPECT_EQ(max_q, 127) << b;
    }
  }
}

TEST(Q8Dp4aRef, UnitsCoverEveryColumnOnce) {
  for (int64_t cols : {32, 256, 576, 2048, 2080, 4096, 4128, 14336}) {
    const int64_t n_units = cols / cuda::kQ8Dp4aUnitCols;
    const int n_parts = cuda::q8_dp4a_parts(cols);
    std::vector<int> seen(static_cast<size_t>(cols), 0);
    for (int p = 0; p < n_parts; ++p) {
      for (int l = 0; l < 32; ++l) {
        for (int64_t u = 32 * p + l; u < n_units; u += 32 * n_parts) {
          const int64_t b = u / 2;
          const int h = static_cast<int>(u % 2);
          for (int k = 0; k < 8; ++k) {
            ++seen[static_cast<size_t>(32 * b + 8 * h + k)];
            ++seen[static_cast<size_t>(32 * b + 16 + 8 * h + k)];
          }
        }
      }
    }
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(seen[static_cast<size_t>(c)], 1) << cols << " column " << c;
  }
  EXPECT_EQ(cuda::q8_dp4a_parts(576), 1);
  EXPECT_EQ(cuda::q8_dp4a_parts(2048), 2);
  EXPECT_EQ(cuda::q8_dp4a_parts(4096), 4);
}

TEST(Q8Dp4aRef, OrderedSumIsWithinItsBoundOfTheExactProduct) {
  for (int64_t cols : {32, 576, 2080, 4096, 14336}) {
    const int64_t rows = 9, n = 3;
    const auto w = cpu::testing::random_weight_rows(DType::kQ8_0, rows, cols, 17 + static_cast<uint32_t>(cols));
    const auto x = cpu::testing::random_floats(n * cols, 23, -3.0f, 3.0f);
    const X8 x8 = quantize_x8_ref(x, n, cols);
    double worst = 0, worst_q = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* xq = x8.q.data() + t * cols;
      const float* dx = x8.d.data() + t * (cols / 32);
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = w.data() + r * (cols / 32) * 34;
        const float y = q8_dp4a_row_ref(row, xq, dx, cols);
        worst = std::max(worst, q8_dp4a_error_over_bound(y, row, x.data() + t * cols, dx, cols));
        // Against the int8 x exactly: only the f32 sums' rounding.
        double s = 0, a = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = static_cast<double>(q8_scale(row, c / 32)) * q8_code(row, c / 32, static_cast<int>(c % 32)) *
                           (static_cast<double>(xq[c]) * dx[c / 32]);
          s += p;
          a += std::fabs(p);
        }
        worst_q = std::max(worst_q, std::fabs(y - s) / (a + 1e-30));
        // accumulate: y0 + the same sum.
        EXPECT_EQ(q8_dp4a_row_ref(row, xq, dx, cols, true, 0.75f), 0.75f + y);
      }
    }
    EXPECT_LE(worst, 1.0) << cols;
    EXPECT_LT(worst_q, 1e-5) << cols;
  }
}

}  // namespace
}  // namespace rill::testing
