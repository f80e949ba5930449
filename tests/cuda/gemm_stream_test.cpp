// gemm_stream (TMA + wgmma decode GEMM, hopper/gemm_stream.h) held to an
// f64 sum over the same 16-bit values: every token tile (16..128), every
// split count, f16 and bf16, overwrite / accumulate / narrow output, rows
// and columns that are not whole tiles, and nothing written outside y's
// n x rows; a configuration repeats its bits. Skipped without a device
// that runs it (compute capability 9.0).
#include "backend/cuda/hopper/gemm_stream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

#define REQUIRE_STREAM()                                                               \
  do {                                                                                 \
    RILL_REQUIRE_GPU();                                                                \
    if (!gemm_stream_available()) GTEST_SKIP() << "gemm_stream needs an sm_90 device"; \
  } while (0)

struct Problem {
  DType dtype;
  int64_t n, rows, cols;
  std::vector<float> w, x;  // the 16-bit values, as the device sees them
  DeviceBuffer dw, dx;
};

Problem make_problem(DType dtype, int64_t n, int64_t rows, int64_t cols, uint32_t seed) {
  Problem p{dtype,
            n,
            rows,
            cols,
            random_floats(static_cast<size_t>(rows * cols), seed),
            random_floats(static_cast<size_t>(n * cols), seed + 1),
            {},
            {}};
  for (float& v : p.w) v = round_to(dtype, v);
  for (float& v : p.x) v = round_to(dtype, v);
  p.dw = upload(encode(dtype, p.w));
  p.dx = upload(encode(dtype, p.x));
  return p;
}

// Worst |got - (y0 + W x)| over sum |w x| per output (f64 reference).
double worst_error(const Problem& p, const std::vector<float>& got, const std::vector<float>& y0) {
  return worst_gemm_error(p.w, p.x, p.n, p.rows, p.cols, got, y0);
}

GemmStreamArgs args_for(const Problem& p, void* y, int splits, bool accumulate, bool narrow, int variant = 0) {
  GemmStreamArgs a;
  a.dtype = p.dtype;
  a.w = p.dw.data();
  a.x = p.dx.data();
  a.n = p.n;
  a.rows = p.rows;
  a.cols = p.cols;
  a.y = y;
  a.splits = splits;
  a.accumulate = accumulate;
  a.narrow = narrow;
  a.variant = variant;
  return a;
}

// f32 accumulation of exact 16-bit products: a few 2^-24 per term.
constexpr double kTol = 1e-5;
// 16 bytes of 0xff past y's n x rows must survive every call.
constexpr size_t kGuard = 16;

// Runs one configuration (y poisoned, or y0 uploaded to accumulate onto)
// and returns y's n x rows as f32 (narrow: decoded from 16 bits).
std::vector<float> run(cudaStream_t stream, const Problem& p, int splits, const std::vector<float>& y0, bool narrow,
                       int variant = 0) {
  const size_t count = static_cast<size_t>(p.n * p.rows);
  const size_t elem = narrow ? 2 : 4;
  DeviceBuffer y = poisoned(count * elem + kGuard);
  if (!y0.empty()) {
    RILL_CUDA_CHECK(cudaMemcpy(y.data(), y0.data(), count * 4, cudaMemcpyHostToDevice));
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  EXPECT_TRUE(gemm_stream(args_for(p, y.data(), splits, !y0.empty(), narrow, variant), stream));
  RILL_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<uint8_t> bytes = download<uint8_t>(y, count * elem + kGuard);
  for (size_t i = count * elem; i < bytes.size(); ++i) {
    EXPECT_EQ(bytes[i], 0xff) << "byte " << i - count * elem << " past y written";
  }
  if (narrow) return decode(p.dtype, std::vector<uint8_t>(bytes.begin(), bytes.begin() + count * 2));
  std::vector<float> out(count);
  std::memcpy(out.data(), bytes.data(), count * 4);
  return out;
}

TEST(GemmStream, MatchesTheExactSumAtEveryTileAndSplit) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  const cudaStream_t st = (*ctx)->stream();
  struct Shape {
    int64_t n, rows, cols;
  };
  // Token tiles 16 (1, 2, 16), 32 (17, 32), 64 (33, 64), 128 (100, 128);
  // rows past a slab (200, 300), columns past a chunk (136, 520, 1000).
  // Rows not whole quads (130, 1): the epilogue's element-by-element path.
  const Shape shapes[] = {{1, 128, 64},     {2, 256, 512},   {16, 200, 136},  {17, 128, 1024},
                          {32, 384, 520},   {33, 256, 1000}, {64, 512, 2048}, {100, 300, 512},
                          {128, 256, 1024}, {16, 130, 256},  {5, 1, 128}};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Shape& s : shapes) {
      const Problem p = make_problem(dtype, s.n, s.rows, s.cols, static_cast<uint32_t>(s.n * 7 + s.rows));
      for (int splits : kGemmStreamSplits) {
        if (splits > (s.cols + 63) / 64) continue;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(s.n) + " x " + std::to_string(s.rows) +
                     " x " + std::to_string(s.cols) + ", " + std::to_string(splits) + " splits");
        const std::vector<float> got = run(st, p, splits, {}, false);
        EXPECT_LT(worst_error(p, got, {}), kTol);
        // The same configuration twice: the same bits.
        EXPECT_EQ(run(st, p, splits, {}, false), got);
      }
    }
  }
}

TEST(GemmStream, VariantsGiveTheSameBits) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  const cudaStream_t st = (*ctx)->stream();
  for (int64_t n : {3, 20, 64, 128}) {
    const Problem p = make_problem(DType::kBF16, n, 256, 1096, static_cast<uint32_t>(n + 90));
    for (int splits : kGemmStreamSplits) {
      SCOPED_TRACE(std::to_string(n) + " tokens, " + std::to_string(splits) + " splits");
      const std::vector<float> v0 = run(st, p, splits, {}, false, 0);
      EXPECT_LT(worst_error(p, v0, {}), kTol);
      EXPECT_EQ(run(st, p, splits, {}, false, 1), v0);
      const std::vector<float> v2 = run(st, p, splits, {}, false, 2);
      EXPECT_LT(worst_error(p, v2, {}), kTol);
      if (splits == 1) {
        EXPECT_EQ(v2, v0);
      }
    }
  }
}

TEST(GemmStream, AccumulatesOntoY) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  for (int splits : {1, 4}) {
    const Problem p = make_problem(DType::kBF16, 64, 384, 1024, 31);
    const std::vector<float> y0 = random_floats(static_cast<size_t>(p.n * p.rows), 32, -4.0f, 4.0f);
    SCOPED_TRACE(std::to_string(splits) + " splits");
    EXPECT_LT(worst_error(p, run((*ctx)->stream(), p, splits, y0, false), y0), kTol);
  }
}

TEST(GemmStream, NarrowOutputIsTheSumRoundedOnce) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const Problem p = make_problem(dtype, 48, dtype == DType::kBF16 ? 256 : 130, 768, 41);
    const std::vector<float> wide = run((*ctx)->stream(), p, 2, {}, false);
    const std::vector<float> narrow = run((*ctx)->stream(), p, 2, {}, true);
    ASSERT_EQ(wide.size(), narrow.size());
    for (size_t i = 0; i < wide.size(); ++i) {
      ASSERT_EQ(narrow[i], round_to(dtype, wide[i])) << dtype_name(dtype) << " output " << i;
    }
  }
}

// y need not be 16-byte aligned: an output 4 bytes into its buffer is
// written element by element, the same bits as an aligned one.
TEST(GemmStream, UnalignedOutputIsWrittenAsAnAlignedOne) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  const cudaStream_t st = (*ctx)->stream();
  const Problem p = make_problem(DType::kBF16, 24, 256, 512, 81);
  const size_t count = static_cast<size_t>(p.n * p.rows);
  for (int splits : {1, 2}) {
    const std::vector<float> want = run(st, p, splits, {}, false);
    DeviceBuffer y = poisoned((count + 1) * 4);
    ASSERT_TRUE(gemm_stream(args_for(p, y.as<float>() + 1, splits, false, false), st));
    RILL_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<float> got = download<float>(y, count + 1);
    EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()), want) << splits << " splits";
  }
}

TEST(GemmStream, RefusesWhatItCannotTake) {
  REQUIRE_STREAM();
  const Problem p = make_problem(DType::kBF16, 8, 128, 256, 51);
  DeviceBuffer y = poisoned(8 * 128 * 4);
  const GemmStreamArgs ok = args_for(p, y.data(), 1, false, false);
  EXPECT_TRUE(gemm_stream_supported(ok));
  GemmStreamArgs a = ok;
  a.n = kGemmStreamMaxTokens + 1;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.n = 0;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.cols = 252;  // rows of 504 bytes: not whole 16-byte units for the copy engine
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.cols = 56;  // less than one 64-column chunk
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.splits = 3;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.splits = 8;  // 256 columns: 4 chunks
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.narrow = a.accumulate = true;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.x = static_cast<const uint8_t*>(p.dx.data()) + 2;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.dtype = DType::kF32;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.variant = kGemmStreamVariants;
  EXPECT_FALSE(gemm_stream_supported(a));
  a = ok;
  a.variant = 2;
  a.splits = 4;  // 256 columns: 2 chunks of 128
  EXPECT_FALSE(gemm_stream_supported(a));
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok());
  a = ok;
  a.splits = 3;
  EXPECT_FALSE(gemm_stream(a, (*ctx)->stream()));  // refused: nothing launched
}

// The e4m3 form: FP8 rows w_ld bytes apart (a 16-byte header before each,
// as fp8.h's kFp8Rows), e4m3 tokens, y (+)= xs[t] ws[r] sum, or the
// unscaled sums; held to an f64 sum of the exact products within what the
// tensor cores' FP8 accumulation along K costs (cuBLASLt's fast
// accumulation measured up to 6.9e-4 of sum |w x| at 4,096 columns).
TEST(GemmStream, E4m3MatchesTheExactSum) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  const cudaStream_t st = (*ctx)->stream();
  constexpr double kFp8Tol = 2e-3;
  double worst_seen = 0;
  struct Shape {
    int64_t n, rows, cols;
  };
  for (const Shape sh : {Shape{2, 128, 128}, Shape{16, 300, 2048}, Shape{64, 256, 4112}, Shape{100, 384, 1024},
                         Shape{128, 256, 4096}, Shape{8, 130, 256}}) {
    const int64_t w_ld = sh.cols + 16;
    std::mt19937 rng(static_cast<uint32_t>(sh.n * 31 + sh.cols));
    std::uniform_real_distribution<float> d(-448.0f, 448.0f), sd(0.001f, 0.01f);
    std::vector<uint8_t> wq(static_cast<size_t>(sh.rows * w_ld), 0), xq(static_cast<size_t>(sh.n * sh.cols));
    for (int64_t r = 0; r < sh.rows; ++r) {
      for (int64_t c = 0; c < sh.cols; ++c) wq[static_cast<size_t>(r * w_ld + 16 + c)] = e4m3_round(d(rng));
    }
    for (uint8_t& b : xq) b = e4m3_round(d(rng));
    std::vector<float> ws(static_cast<size_t>(sh.rows)), xs(static_cast<size_t>(sh.n));
    for (float& v : ws) v = sd(rng);
    for (float& v : xs) v = sd(rng);
    const DeviceBuffer dw = upload(wq), dx = upload(xq), dws = upload(ws), dxs = upload(xs);
    // The unscaled exact sums and their magnitudes, [t, r].
    std::vector<double> ref(static_cast<size_t>(sh.n * sh.rows)), mag(ref.size());
    for (int64_t t = 0; t < sh.n; ++t) {
      for (int64_t r = 0; r < sh.rows; ++r) {
        double sum = 0, m = 0;
        for (int64_t c = 0; c < sh.cols; ++c) {
          const double v = double(e4m3_value(wq[static_cast<size_t>(r * w_ld + 16 + c)])) *
                           e4m3_value(xq[static_cast<size_t>(t * sh.cols + c)]);
          sum += v;
          m += std::fabs(v);
        }
        ref[static_cast<size_t>(t * sh.rows + r)] = sum;
        mag[static_cast<size_t>(t * sh.rows + r)] = m;
      }
    }
    std::map<std::pair<int, int>, std::vector<float>> unscaled;  // (variant, splits): the plain sums
    for (bool scaled : {false, true}) {
      for (bool accumulate : {false, true}) {
        for (int variant = 0; variant < kGemmStreamVariants; ++variant) {
          for (int splits : kGemmStreamSplits) {
            GemmStreamArgs a;
            a.e4m3 = true;
            a.w = static_cast<const uint8_t*>(dw.data()) + 16;
            a.w_ld = w_ld;
            a.x = dx.data();
            a.ws = scaled ? dws.as<float>() : nullptr;
            a.xs = scaled ? dxs.as<float>() : nullptr;
            a.n = sh.n;
            a.rows = sh.rows;
            a.cols = sh.cols;
            a.accumulate = accumulate;
            a.splits = splits;
            a.variant = variant;
            a.y = dw.data();  // a 16-byte aligned stand-in to ask about the shape
            if (!gemm_stream_supported(a)) continue;
            SCOPED_TRACE(std::to_string(sh.n) + " x " + std::to_string(sh.rows) + " x " + std::to_string(sh.cols) +
                         (scaled ? ", scaled" : ", unscaled") + (accumulate ? ", accumulating" : "") + ", variant " +
                         std::to_string(variant) + ", " + std::to_string(splits) + " splits");
            const size_t count = static_cast<size_t>(sh.n * sh.rows);
            const std::vector<float> y0 =
                accumulate ? random_floats(count, 5, -1.0f, 1.0f) : std::vector<float>(count, 0.0f);
            DeviceBuffer y = upload(y0);
            a.y = y.data();
            ASSERT_TRUE(gemm_stream(a, st));
            RILL_CUDA_CHECK(cudaStreamSynchronize(st));
            const std::vector<float> got = download<float>(y, count);
            double worst = 0;
            for (int64_t t = 0; t < sh.n; ++t) {
              for (int64_t r = 0; r < sh.rows; ++r) {
                const double scale = scaled ? double(xs[static_cast<size_t>(t)]) * ws[static_cast<size_t>(r)] : 1.0;
                const size_t i = static_cast<size_t>(t * sh.rows + r);
                const double err = std::fabs(double(got[i]) - y0[i] - ref[i] * scale) / (mag[i] * scale + 1e-30);
                worst = std::isnan(err) ? INFINITY : std::max(worst, err);
              }
            }
            EXPECT_LT(worst, kFp8Tol);
            // The scales as fp8_scale_rows applies them: sum x xs[t] x ws[r], in f32.
            if (!accumulate && !scaled) unscaled[{variant, splits}] = got;
            if (!accumulate && scaled) {
              const std::vector<float>& plain = unscaled[{variant, splits}];
              ASSERT_EQ(plain.size(), got.size());
              for (size_t i = 0; i < got.size(); ++i) {
                const size_t t = i / static_cast<size_t>(sh.rows), r = i % static_cast<size_t>(sh.rows);
                ASSERT_EQ(got[i], plain[i] * xs[t] * ws[r]) << "output " << i;
              }
            }
            worst_seen = std::max(worst_seen, worst);
          }
        }
      }
    }
  }
  std::printf("[ gemm_stream e4m3 ] worst error %.3g of sum |w x|\n", worst_seen);
}

// Gemm times gemm_stream beside cuBLASLt; whichever it keeps, the result is
// the exact sum's, accumulating too, and set_stream(false) leaves it out.
TEST(GemmStream, GemmKeepsTheExactSumWithItTimedIn) {
  REQUIRE_STREAM();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  for (bool on : {true, false}) {
    Gemm gemm(**ctx);
    gemm.set_stream(on);
    for (int64_t n : {4, 64, 128}) {
      SCOPED_TRACE(std::string(on ? "stream timed in, " : "stream off, ") + std::to_string(n) + " tokens");
      const Problem p = make_problem(DType::kBF16, n, 1024, 2048, static_cast<uint32_t>(n + 60));
      DeviceBuffer y = poisoned(static_cast<size_t>(n * p.rows) * 4);
      ASSERT_TRUE(gemm.run(DType::kBF16, p.dw.data(), p.dx.data(), n, p.rows, p.cols, y.as<float>(), false).ok());
      EXPECT_LT(worst_error(p, download<float>(y, static_cast<size_t>(n * p.rows)), {}), kTol);
      const std::vector<float> y0 = random_floats(static_cast<size_t>(n * p.rows), 61);
      const Problem q = make_problem(DType::kBF16, n, 1024, 4096, static_cast<uint32_t>(n + 70));
      DeviceBuffer acc = upload(y0);
      ASSERT_TRUE(gemm.run(DType::kBF16, q.dw.data(), q.dx.data(), n, q.rows, q.cols, acc.as<float>(), true).ok());
      EXPECT_LT(worst_error(q, download<float>(acc, static_cast<size_t>(n * q.rows)), y0), kTol);
    }
  }
}

}  // namespace
}  // namespace rill::cuda
