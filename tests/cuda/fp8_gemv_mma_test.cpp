// fp8_gemv_mma (backend/cuda/fp8_gemv_mma.cu): the FP8 GEMV of 1..8 bf16
// tokens on the tensor cores.
//  - against the host's f64 sum scale[r] x sum_c e4m3(W[r, c]) x[t, c] (x
//    as its bf16 values) within 1e-5 of sum |w x| x scale, over 1, 15, 16,
//    17, 33 rows (a partial row group, two groups) and 64, 192, 4,096 and
//    14,336 columns (one chunk; ranges of one chunk and empty ones; down's
//    width, converted in phases from two tokens), 1..8 tokens, overwriting
//    and accumulating, weights of every e4m3 code (subnormals, 448) and x
//    of ordinary, huge (1e5, 3e6, 1e30), all-tiny (1e-6) and mixed tokens;
//    larger shapes for the grid (300 rows, 4,100 rows, 9,000 rows: two
//    groups a block on a 132-SM device); the worst error printed;
//  - accumulating gives y0 + the overwriting result, bit for bit, and y
//    past the tokens is never written;
//  - batch invariance: every token's result alone and at every place of
//    every batch of 2..8 is the same bits, and so in every configuration
//    (fp8_gemv_mma_variant: one and two row groups a block, ring depths);
//  - fp8_route takes it (kGemvMma) with force_fp8_gemv_mma(1) for 1..8
//    tokens of bf16 x and whole 64s of columns, never for f32 x, 9 tokens,
//    the GLU (kNone) or batch-invariant mode, and not while it is off;
//    fp8_matmul then gives fp8_gemv_mma's bits.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::encode;
using testing::round_to;
using testing::upload;

// FP8 weights made on the host: every finite code equally likely (the NaN
// codes 0x7f / 0xff become +-448), row scales from 2^-14 to 2^-4 (row 0:
// 1); with 3+ rows, row 1 all zeros and row 2 all 448.
struct Weights {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scales;   // [rows]
  DeviceBuffer device;         // kFp8Rows

  Weights(int64_t rows_, int64_t cols_, uint32_t seed) : rows(rows_), cols(cols_) {
    std::mt19937 rng(seed);
    codes.resize(static_cast<size_t>(rows * cols));
    for (uint8_t& c : codes) {
      c = static_cast<uint8_t>(rng() & 0xff);
      if ((c & 0x7f) == 0x7f) c = static_cast<uint8_t>((c & 0x80) | 0x7e);
    }
    if (rows > 2) {
      std::fill(codes.begin() + cols, codes.begin() + 2 * cols, uint8_t{0});
      std::fill(codes.begin() + 2 * cols, codes.begin() + 3 * cols, uint8_t{0x7e});
    }
    scales.resize(static_cast<size_t>(rows));
    std::uniform_real_distribution<float> frac(1.0f, 2.0f);
    for (int64_t r = 0; r < rows; ++r) {
      scales[r] = r == 0 ? 1.0f : std::ldexp(frac(rng), -4 - static_cast<int>(rng() % 11));
    }
    std::vector<uint8_t> bytes(fp8_matrix_bytes(rows, cols), 0);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + r * fp8_row_bytes(cols);
      std::memcpy(row, &scales[r], 4);
      std::memcpy(row + kFp8RowHeader, codes.data() + r * cols, static_cast<size_t>(cols));
    }
    std::memcpy(bytes.data() + rows * fp8_row_bytes(cols), scales.data(), static_cast<size_t>(rows) * 4);
    device = upload(bytes);
  }
  const uint8_t* w() const { return device.as<uint8_t>(); }
};

// Token t's activations by kind (t % 8): ordinary (uniform in [-1, 1], a
// few exact zeros); ordinary with values past f16's range (1e5, +-3e6); all
// tiny (1e-6: f16 subnormals unless scaled up); all huge (1e30); ordinary
// with every third value tiny (1e-7); all zero (the scale's clamp); bf16
// subnormals (1e-39: below the range the scaling keeps exact, still no
// NaN); ordinary. Rounded to bf16.
std::vector<float> activations(int64_t n_tokens, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = c % 53 == 5 ? 0.0f : d(rng);
      switch (t % 8) {
        case 1:
          if (c % 97 == 3) v *= 1e5f;
          if (c % 211 == 7) v = c % 2 ? 3e6f : -3e6f;
          break;
        case 2:
          v *= 1e-6f;
          break;
        case 3:
          v *= 1e30f;
          break;
        case 4:
          if (c % 3 == 0) v *= 1e-7f;
          break;
        case 5:
          v = 0.0f;
          break;
        case 6:
          v *= 1e-39f;
          break;
        default:
          break;
      }
      x[static_cast<size_t>(t * cols + c)] = round_to(DType::kBF16, v);
    }
  }
  return x;
}

// y floats for n tokens: n x rows, then poison (NaN bits) up to 8 tokens
// and one more row block, which the kernel must leave alone.
size_t y_floats(int64_t rows) {
  return static_cast<size_t>((kFp8GemvMmaMaxTokens + 1) * rows);
}
std::vector<float> poison(size_t n) {
  float nan_bits;
  const uint32_t all = 0xffffffffu;
  std::memcpy(&nan_bits, &all, 4);
  return std::vector<float>(n, nan_bits);
}

// fp8_gemv_mma (variant < 0) or a variant of it over tokens [t0, t0 + n)
// of x, y starting as y_init (its first n x rows floats; the rest poison).
std::vector<float> run(const Weights& w, const DeviceBuffer& x, int64_t t0, int64_t n, bool accumulate,
                       const std::vector<float>& y_init, int variant = -1) {
  std::vector<float> y0 = poison(y_floats(w.rows));
  std::copy(y_init.begin(), y_init.begin() + std::min(y_init.size(), static_cast<size_t>(n * w.rows)), y0.begin());
  const DeviceBuffer y = upload(y0);
  const auto* xt = x.as<uint8_t>() + t0 * w.cols * 2;
  if (variant < 0) {
    fp8_gemv_mma(w.w(), xt, n, w.rows, w.cols, y.as<float>(), accumulate, nullptr);
  } else {
    fp8_gemv_mma_variant(variant, w.w(), xt, n, w.rows, w.cols, y.as<float>(), accumulate, nullptr);
  }
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  return download<float>(y, y0.size());
}

bool all_poison(const std::vector<float>& y, size_t from) {
  for (size_t i = from; i < y.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &y[i], 4);
    if (b != 0xffffffffu) return false;
  }
  return true;
}

std::string shape(int64_t rows, int64_t cols, int64_t n) {
  return std::to_string(rows) + " x " + std::to_string(cols) + ", " + std::to_string(n) + " tokens";
}

TEST(Fp8GemvMma, MatchesTheExactSum) {
  RILL_REQUIRE_GPU();
  struct Case {
    int64_t rows, cols;
    std::vector<int64_t> tokens;
  };
  std::vector<Case> cases;
  for (const int64_t rows : {1, 15, 16, 17, 33}) {
    for (const int64_t cols : {4096, 64, 192, 14336}) cases.push_back({rows, cols, {1, 2, 3, 4, 5, 6, 7, 8}});
  }
  cases.push_back({300, 4096, {1, 3, 8}});
  cases.push_back({4100, 192, {1, 8}});
  cases.push_back({9000, 128, {1, 2, 8}});
  double worst = 0;
  for (const Case& c : cases) {
    const Weights w(c.rows, c.cols, 11 + static_cast<uint32_t>(c.rows * 7 + c.cols));
    const std::vector<float> x = activations(kFp8GemvMmaMaxTokens, c.cols, 5 + static_cast<uint32_t>(c.cols));
    const DeviceBuffer xd = upload(encode(DType::kBF16, x));
    // The exact sums and sum |w x|, times the row scale, [8 tokens, rows].
    std::vector<double> sums(static_cast<size_t>(kFp8GemvMmaMaxTokens * c.rows)), mags(sums.size());
    for (int64_t t = 0; t < kFp8GemvMmaMaxTokens; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double p = e4m3_value(w.codes[r * c.cols + k]) * double(x[t * c.cols + k]);
          s += p;
          m += std::fabs(p);
        }
        sums[t * c.rows + r] = s * w.scales[r];
        mags[t * c.rows + r] = m * w.scales[r];
      }
    }
    const std::vector<float> y_start = testing::random_floats(static_cast<size_t>(kFp8GemvMmaMaxTokens * c.rows), 3);
    for (const int64_t n : c.tokens) {
      SCOPED_TRACE(shape(c.rows, c.cols, n));
      const std::vector<float> got = run(w, xd, 0, n, false, {});
      const size_t outs = static_cast<size_t>(n * c.rows);
      EXPECT_TRUE(all_poison(got, outs)) << "y written past the tokens";
      int64_t bad = 0;
      for (size_t i = 0; i < outs; ++i) {
        const double err = std::fabs(double(got[i]) - sums[i]);
        const bool ok = err <= 1e-5 * mags[i] + 1e-30;  // NaN fails
        if (!ok && bad++ < 5) {
          ADD_FAILURE() << "token " << i / c.rows << " row " << i % c.rows << ": " << got[i] << " against " << sums[i]
                        << " (sum |w x| " << mags[i] << ")";
        }
        if (mags[i] > 0) worst = std::max(worst, err / mags[i]);
      }
      EXPECT_EQ(bad, 0);
      // Accumulating: y0 + the overwriting result, rounded once.
      const std::vector<float> acc = run(w, xd, 0, n, true, y_start);
      EXPECT_TRUE(all_poison(acc, outs)) << "y written past the tokens (accumulating)";
      int64_t differ = 0;
      for (size_t i = 0; i < outs; ++i) {
        const float want = y_start[i] + got[i];
        differ += std::memcmp(&want, &acc[i], 4) != 0;
      }
      EXPECT_EQ(differ, 0) << "accumulating is not y0 + the overwriting result";
    }
  }
  std::printf("[ fp8 gemv mma ] worst |error| / sum |w x| = %.3g\n", worst);
}

// An inf or NaN activation makes its token's outputs non-finite (every
// row: a zero weight times inf is NaN too), and leaves the batch's other
// tokens as they are alone.
TEST(Fp8GemvMma, NonFiniteActivationsStayNonFinite) {
  RILL_REQUIRE_GPU();
  const Weights w(33, 4096, 7);
  std::vector<float> x = activations(3, 4096, 29);
  x[4096 + 100] = INFINITY;
  x[2 * 4096 + 7] = NAN;
  const DeviceBuffer xd = upload(encode(DType::kBF16, x));
  const std::vector<float> batch = run(w, xd, 0, 3, false, {});
  const std::vector<float> first = run(w, xd, 0, 1, false, {});
  for (int64_t r = 0; r < w.rows; ++r) {
    EXPECT_EQ(std::memcmp(&batch[r], &first[r], 4), 0) << "finite token, row " << r;
    EXPECT_TRUE(std::isfinite(first[r])) << "row " << r;
    EXPECT_FALSE(std::isfinite(batch[w.rows + r])) << "inf token, row " << r;
    EXPECT_FALSE(std::isfinite(batch[2 * w.rows + r])) << "NaN token, row " << r;
  }
}

TEST(Fp8GemvMma, ATokensResultDoesNotDependOnTheBatch) {
  RILL_REQUIRE_GPU();
  constexpr int64_t kTokens = 15;  // every token of a batch of 8 at every place
  struct Case {
    int64_t rows, cols;
  };
  for (const Case c : {Case{33, 4096}, Case{17, 14336}, Case{300, 192}, Case{9000, 128}, Case{5, 64}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols));
    const Weights w(c.rows, c.cols, 91 + static_cast<uint32_t>(c.cols));
    const DeviceBuffer xd = upload(encode(DType::kBF16, activations(kTokens, c.cols, 17)));
    const size_t rows = static_cast<size_t>(c.rows);
    std::vector<std::vector<float>> alone;
    for (int64_t t = 0; t < kTokens; ++t) alone.push_back(run(w, xd, t, 1, false, {}));
    auto same = [&](const std::vector<float>& batch, int64_t place, int64_t token) {
      return std::memcmp(batch.data() + place * rows, alone[token].data(), rows * 4) == 0;
    };
    for (int64_t n = 2; n <= kFp8GemvMmaMaxTokens; ++n) {
      for (int64_t t0 = 0; t0 + n <= kTokens; ++t0) {
        const std::vector<float> batch = run(w, xd, t0, n, false, {});
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_TRUE(same(batch, i, t0 + i)) << "token " << t0 + i << " at place " << i << " of " << n;
        }
      }
    }
    for (int v = 0; v < fp8_gemv_mma_n_variants(); ++v) {
      SCOPED_TRACE(fp8_gemv_mma_variant_name(v));
      for (int64_t t = 0; t < kTokens; ++t) EXPECT_TRUE(same(run(w, xd, t, 1, false, {}, v), 0, t)) << "token " << t;
      for (const int64_t t0 : {int64_t{0}, int64_t{7}}) {
        const std::vector<float> batch = run(w, xd, t0, 8, false, {}, v);
        for (int64_t i = 0; i < 8; ++i) EXPECT_TRUE(same(batch, i, t0 + i)) << "token " << t0 + i << " of 8";
      }
    }
  }
}

// force_fp8_gemv_mma for one test's scope.
struct ForceGemvMma {
  explicit ForceGemvMma(int on) { force_fp8_gemv_mma(on); }
  ~ForceGemvMma() { force_fp8_gemv_mma(-1); }
  ForceGemvMma(const ForceGemvMma&) = delete;
  ForceGemvMma& operator=(const ForceGemvMma&) = delete;
};

TEST(Fp8GemvMma, Fp8RouteTakesItOnlyWhenSwitchedOn) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  const Fp8Scratch none;  // no scratch: the quantizing routes are out anyway
  if (std::getenv("RILL_FP8_GEMV") == nullptr) {
    EXPECT_FALSE(fp8_gemv_mma_on()) << "on by default";
  }
  {
    ForceGemvMma on(1);
    ASSERT_TRUE(fp8_gemv_mma_on());
    for (int64_t n = 1; n <= 8; ++n) {
      SCOPED_TRACE(std::to_string(n) + " tokens");
      for (const int64_t cols : {64, 192, 4096, 14336}) {
        EXPECT_EQ(fp8_route(gemm, none, DType::kBF16, n, 4096, cols, false), Fp8Route::kGemvMma) << cols;
        EXPECT_EQ(fp8_route(gemm, none, DType::kBF16, n, 4096, cols, true), Fp8Route::kNone) << cols;
        EXPECT_FALSE(fp8_quantizes_x(gemm, none, DType::kBF16, n, 4096, cols, false));
        EXPECT_FALSE(fp8_glu_fusable(gemm, none, DType::kBF16, n, 4096, cols));
      }
      EXPECT_NE(fp8_route(gemm, none, DType::kBF16, n, 4096, 208, false), Fp8Route::kGemvMma) << "208 columns";
      EXPECT_NE(fp8_route(gemm, none, DType::kF32, n, 4096, 4096, false), Fp8Route::kGemvMma) << "f32 x";
    }
    EXPECT_NE(fp8_route(gemm, none, DType::kBF16, 9, 4096, 4096, false), Fp8Route::kGemvMma) << "9 tokens";
    EXPECT_EQ(fp8_route(gemm, none, DType::kBF16, 0, 4096, 4096, false), Fp8Route::kNone);
    gemm.set_batch_invariant(true);
    for (int64_t n = 1; n <= 8; ++n) {
      EXPECT_NE(fp8_route(gemm, none, DType::kBF16, n, 4096, 4096, false), Fp8Route::kGemvMma) << "batch-invariant";
    }
    gemm.set_batch_invariant(false);
  }
  {
    ForceGemvMma off(0);
    EXPECT_FALSE(fp8_gemv_mma_on());
    EXPECT_EQ(fp8_route(gemm, none, DType::kBF16, 1, 4096, 4096, false), Fp8Route::kGemv);
    for (int64_t n = 1; n <= 8; ++n) {
      EXPECT_NE(fp8_route(gemm, none, DType::kBF16, n, 4096, 4096, false), Fp8Route::kGemvMma) << n << " tokens";
    }
  }
}

TEST(Fp8GemvMma, Fp8MatmulRunsItWhenSwitchedOn) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  ForceGemvMma on(1);
  const Weights w(70, 1024, 23);
  const DeviceBuffer xd = upload(encode(DType::kBF16, activations(8, 1024, 29)));
  for (const int64_t n : {int64_t{1}, int64_t{8}}) {
    SCOPED_TRACE(std::to_string(n) + " tokens");
    const std::vector<float> want = run(w, xd, 0, n, false, {});
    const DeviceBuffer y = upload(poison(y_floats(w.rows)));
    ASSERT_TRUE(fp8_matmul(gemm, QuantScratch{}, Fp8Scratch{}, w.w(), DType::kBF16, xd.data(), n, w.rows, w.cols,
                           y.as<float>(), false, (*ctx)->stream())
                    .ok());
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(std::memcmp(download<float>(y, want.size()).data(), want.data(), want.size() * 4), 0)
        << "fp8_matmul differs from fp8_gemv_mma";
  }
}

}  // namespace
}  // namespace rill::cuda
