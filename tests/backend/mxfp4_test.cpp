// MXFP4 (ggml type 39, gpt-oss's expert weights in GGUF files): block
// dequantization and the dot product with Q8_0 activations against the
// gguf package's numpy reference (tools/make_mxfp4_golden.py), hand-built
// blocks (the e2m1 table, the subnormal e8m0 scales), and the matmul
// against the scalar dot product.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "core/thread_pool.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

nlohmann::json golden() {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/quants/mxfp4.json");
  EXPECT_TRUE(f) << "tests/data/quants/mxfp4.json missing";
  return f ? nlohmann::json::parse(f) : nlohmann::json::object();
}

TEST(Mxfp4, TypeIsGgmls) {
  EXPECT_EQ(static_cast<uint32_t>(DType::kMXFP4), 39u);
  const DTypeInfo info = dtype_info(DType::kMXFP4);
  EXPECT_EQ(info.block_size, 32);
  EXPECT_EQ(info.block_bytes, 17);
  EXPECT_TRUE(info.quantized);
  EXPECT_EQ(vec_dot_partner(DType::kMXFP4), DType::kQ8_0);
}

TEST(Mxfp4, HandBuiltBlock) {
  BlockMXFP4 b{};
  b.e = 128;  // 2^(128 - 127) = 2: values are 2 * e2m1 = kMxfp4Values[q]
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> v(32);
  ref::dequantize_row(DType::kMXFP4, &b, v.data(), 32);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], 2.0f * e2m1[j]) << j;
    EXPECT_EQ(v[j + 16], 2.0f * e2m1[15 - j]) << j;
  }
  // e = 0 and 1 are subnormal halves: 2^-128 and 2^-127.
  EXPECT_EQ(e8m0_to_f32_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_f32_half(1), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_f32_half(254), std::ldexp(1.0f, 126));
}

TEST(Mxfp4, DequantizeMatchesGgufNumpyReference) {
  const auto j = golden();
  if (j.empty()) return;
  const int64_t n_cols = j["n_cols"].get<int64_t>();
  const auto raw = from_hex(j["weights"]["hex"].get<std::string>());
  const auto want = j["weights"]["values"].get<std::vector<float>>();
  const int64_t n = static_cast<int64_t>(want.size());
  ASSERT_EQ(n, j["weights"]["n_rows"].get<int64_t>() * n_cols);
  ASSERT_EQ(raw.size(), row_bytes(DType::kMXFP4, n));
  std::vector<float> got(static_cast<size_t>(n));
  ref::dequantize_row(DType::kMXFP4, raw.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;  // exact: powers of two times e2m1
}

TEST(Mxfp4, DotWithQ8_0MatchesTheReference) {
  const auto j = golden();
  if (j.empty()) return;
  const int64_t n_cols = j["n_cols"].get<int64_t>();
  const auto w = from_hex(j["weights"]["hex"].get<std::string>());
  const auto a = from_hex(j["q8_0"]["hex"].get<std::string>());
  const size_t wrow = row_bytes(DType::kMXFP4, n_cols), arow = row_bytes(DType::kQ8_0, n_cols);
  const auto rows = j["dots"]["weight_rows"].get<std::vector<int>>();
  const auto want = j["dots"]["values"].get<std::vector<std::vector<double>>>();
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < 2; ++i) {
      const float got =
          ref::vec_dot(DType::kMXFP4, n_cols, w.data() + static_cast<size_t>(rows[r]) * wrow, a.data() + i * arow);
      EXPECT_NEAR(got, want[r][i], 1e-5 * std::max(1.0, std::fabs(want[r][i]))) << "row " << rows[r] << " x " << i;
    }
  }
}

// The matmul (activations quantized to Q8_0 by the kernels, the MXFP4 gemm
// the scalar table's on every ISA) equals the scalar dot product of the row
// with the quantized activations.
TEST(Mxfp4, MatmulEqualsTheScalarDot) {
  constexpr int64_t kRows = 37, kCols = 256, kTokens = 5;
  auto wbuf = testing::random_weight_rows(DType::kMXFP4, kRows, kCols, 11);
  for (int64_t b = 0; b < kRows * kCols / 32; ++b)
    wbuf[static_cast<size_t>(b) * 17] = static_cast<uint8_t>(120 + b % 9);
  const auto x = testing::random_floats(kTokens * kCols, 5, -2.0f, 2.0f);
  WeightView w;
  w.dtype = DType::kMXFP4;
  w.n_rows = kRows;
  w.n_cols = kCols;
  w.data = wbuf.data();
  w.row_stride = row_bytes(DType::kMXFP4, kCols);
  ThreadPool pool(2);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(DType::kMXFP4, kCols, kTokens));
  std::vector<float> y(static_cast<size_t>(kTokens * kRows));
  matmul(w, x.data(), kTokens, y.data(), pool, scratch);
  std::vector<BlockQ8_0> q(kCols / 32);
  for (int64_t t = 0; t < kTokens; ++t) {
    ref::quantize_row_q8_0(x.data() + t * kCols, q.data(), kCols);
    for (int64_t r = 0; r < kRows; ++r) {
      const float want = ref::vec_dot(DType::kMXFP4, kCols, wbuf.data() + r * w.row_stride, q.data());
      EXPECT_NEAR(y[static_cast<size_t>(t * kRows + r)], want, 1e-5f * std::max(1.0f, std::fabs(want)))
          << "token " << t << " row " << r;
    }
  }
}

}  // namespace
}  // namespace rill::cpu
