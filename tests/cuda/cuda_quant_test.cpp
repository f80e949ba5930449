// Quantized weights on the device (backend/cuda/quant.h) held to the CPU
// reference on random blocks of every GGUF type the kernels read:
//  - dequantize_rows equals cpu::ref::dequantize_row bit for bit (F32), and
//    that value rounded to nearest even in BF16/F16; the embedding gather
//    likewise;
//  - quant_gemv (1..11 tokens, x in F32 and BF16) equals the f64 sum of the
//    reference-dequantized weights times x within 1e-5 of sum |w x| per
//    output (f32 accumulation over at most 9,216 terms: about 1e-6 seen);
//    a token's result is the same bits alone and in a batch;
//  - quant_matmul's dequantize-then-GEMM path (17 and 40 tokens; whole and
//    in row chunks) equals the f64 sum over the weights as the GEMM sees
//    them (rounded to x's dtype) within 1e-5 of sum |w x|, and the exact
//    weights within 4e-3 of sum |w x| for BF16 (weights and x rounded to
//    bf16: relative error <= 2^-9 each).
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "../backend/quant_test_util.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::decode;
using testing::download;
using testing::encode;
using testing::poisoned;
using testing::round_to;
using testing::upload;

const DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kMXFP4};

struct Shape {
  int64_t rows, cols;
};

// Shapes per block size: a single block, SmolLM2's widths, an 8B-like
// width, and rows long enough for the split (four warps per row) GEMV.
std::vector<Shape> shapes(DType t) {
  if (dtype_info(t).block_size == 256) return {{1, 256}, {67, 1536}, {300, 4096}, {40, 9216}};
  return {{1, 32}, {67, 576}, {300, 4096}, {40, 9216}};
}

std::vector<float> dequant_ref(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::ref::dequantize_row(t, w.data() + static_cast<size_t>(r) * row_bytes(t, cols), out.data() + r * cols, cols);
  }
  return out;
}

// Largest |y - sum w x| / sum |w x| over all outputs, w = deq (optionally
// rounded to wt), x as given; y [n, rows].
double max_rel_err(const std::vector<float>& y, const std::vector<float>& deq, const std::vector<float>& x, int64_t n,
                   int64_t rows, int64_t cols, DType wt = DType::kF32, const std::vector<float>* y0 = nullptr) {
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = y0 ? (*y0)[static_cast<size_t>(t * rows + r)] : 0.0, a = std::fabs(s);
      for (int64_t c = 0; c < cols; ++c) {
        const double p =
            double(round_to(wt, deq[static_cast<size_t>(r * cols + c)])) * x[static_cast<size_t>(t * cols + c)];
        s += p;
        a += std::fabs(p);
      }
      const double e = std::fabs(double(y[static_cast<size_t>(t * rows + r)]) - s) / (a + 1e-30);
      if (!(e <= worst)) worst = e;  // NaN propagates
    }
  }
  return worst;
}

TEST(CudaQuant, DequantizeMatchesTheCpuReferenceBitForBit) {
  RILL_REQUIRE_GPU();
  for (DType t : kTypes) {
    const int64_t rows = 37, cols = dtype_info(t).block_size == 256 ? 1536 : 576, row0 = 5, n = 20;
    const auto w = cpu::testing::random_weight_rows(t, rows, cols, 7 + static_cast<uint32_t>(t));
    const auto ref = dequant_ref(t, w, rows, cols);
    const auto dw = upload(w);
    for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
      const size_t es = out == DType::kF32 ? 4 : 2;
      auto d = poisoned(static_cast<size_t>(n * cols) * es);
      dequantize_rows(t, dw.data(), cols, row0, n, out, d.data(), nullptr);
      const auto got = decode(out, download<uint8_t>(d, static_cast<size_t>(n * cols) * es));
      int64_t n_diff = 0;
      for (int64_t i = 0; i < n * cols; ++i) {
        const float want = round_to(out, ref[static_cast<size_t>(row0 * cols + i)]);
        n_diff += std::memcmp(&want, &got[static_cast<size_t>(i)], 4) != 0;
      }
      EXPECT_EQ(n_diff, 0) << dtype_name(t) << " -> " << dtype_name(out);
    }
  }
}

TEST(CudaQuant, EmbeddingGatherMatchesTheCpuReference) {
  RILL_REQUIRE_GPU();
  for (DType t : kTypes) {
    const int64_t rows = 50, cols = dtype_info(t).block_size == 256 ? 512 : 576;
    const auto w = cpu::testing::random_weight_rows(t, rows, cols, 11 + static_cast<uint32_t>(t));
    const auto ref = dequant_ref(t, w, rows, cols);
    const std::vector<int32_t> ids = {3, 49, 0, 3, 17, 31, 8};
    const auto dw = upload(w);
    const auto di = upload(ids);
    auto d = poisoned(ids.size() * static_cast<size_t>(cols) * 4);
    embed_rows_any(t, dw.data(), cols, di.as<int32_t>(), static_cast<int64_t>(ids.size()), d.as<float>(), nullptr);
    const auto got = download<float>(d, ids.size() * static_cast<size_t>(cols));
    int64_t n_diff = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < cols; ++c) n_diff += got[i * cols + c] != ref[static_cast<size_t>(ids[i] * cols + c)];
    EXPECT_EQ(n_diff, 0) << dtype_name(t);
  }
}

TEST(CudaQuant, GemvMatchesTheCpuReferenceAndIsBatchInvariant) {
  RILL_REQUIRE_GPU();
  for (DType t : kTypes) {
    double worst = 0;
    for (const Shape& s : shapes(t)) {
      const auto w = cpu::testing::random_weight_rows(t, s.rows, s.cols,
                                                      21 + static_cast<uint32_t>(t) + static_cast<uint32_t>(s.cols));
      const auto deq = dequant_ref(t, w, s.rows, s.cols);
      const auto dw = upload(w);
      for (DType xt : {DType::kF32, DType::kBF16}) {
        const int64_t n_max = 11;
        auto x = testing::random_floats(static_cast<size_t>(n_max * s.cols), 5 + static_cast<uint32_t>(s.rows));
        for (float& v : x) v = round_to(xt, v);
        const auto dx = upload(encode(xt, x));
        std::vector<float> alone;  // token t computed alone: [n_max, rows]
        for (int64_t t0 = 0; t0 < n_max; ++t0) {
          auto dy = poisoned(static_cast<size_t>(s.rows) * 4);
          const size_t es = xt == DType::kF32 ? 4 : 2;
          quant_gemv(t, dw.data(), xt, dx.as<uint8_t>() + static_cast<size_t>(t0 * s.cols) * es, 1, s.rows, s.cols,
                     dy.as<float>(), false, nullptr);
          const auto y = download<float>(dy, static_cast<size_t>(s.rows));
          alone.insert(alone.end(), y.begin(), y.end());
        }
        const double e1 = max_rel_err(alone, deq, x, n_max, s.rows, s.cols);
        EXPECT_LT(e1, 1e-5) << dtype_name(t) << " " << s.rows << "x" << s.cols << " x " << dtype_name(xt);
        worst = std::max(worst, e1);
        for (int64_t n : {3, 8, 11}) {
          // accumulate = true onto known values; then the batch's rows vs alone.
          const auto y0 = testing::random_floats(static_cast<size_t>(n * s.rows), 99);
          const auto dy = upload(y0);
          quant_gemv(t, dw.data(), xt, dx.data(), n, s.rows, s.cols, dy.as<float>(), true, nullptr);
          const auto y = download<float>(dy, static_cast<size_t>(n * s.rows));
          const double e = max_rel_err(y, deq, x, n, s.rows, s.cols, DType::kF32, &y0);
          EXPECT_LT(e, 1e-5) << dtype_name(t) << " n=" << n;
          auto dz = poisoned(static_cast<size_t>(n * s.rows) * 4);
          quant_gemv(t, dw.data(), xt, dx.data(), n, s.rows, s.cols, dz.as<float>(), false, nullptr);
          const auto z = download<float>(dz, static_cast<size_t>(n * s.rows));
          int64_t n_diff = 0;
          for (size_t i = 0; i < z.size(); ++i) n_diff += std::memcmp(&z[i], &alone[i], 4) != 0;
          EXPECT_EQ(n_diff, 0) << dtype_name(t) << " " << s.rows << "x" << s.cols << ": " << n
                               << " tokens differ from one at a time";
        }
      }
    }
    std::printf("[ cuda quant ] %-5s gemv: max |y - ref| / sum|w x| = %.3g\n", std::string(dtype_name(t)).c_str(),
                worst);
  }
}

TEST(CudaQuant, DequantizeThenGemmMatchesTheCpuReference) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  for (DType t : kTypes) {
    double worst_path = 0, worst_exact = 0;
    for (const Shape& s : shapes(t)) {
      const auto w = cpu::testing::random_weight_rows(t, s.rows, s.cols,
                                                      31 + static_cast<uint32_t>(t) + static_cast<uint32_t>(s.cols));
      const auto deq = dequant_ref(t, w, s.rows, s.cols);
      const auto dw = upload(w);
      for (DType xt : {DType::kBF16, DType::kF32}) {
        for (int64_t n : {17, 40}) {
          auto x = testing::random_floats(static_cast<size_t>(n * s.cols), 3 + static_cast<uint32_t>(n));
          for (float& v : x) v = round_to(xt, v);
          const auto dx = upload(encode(xt, x));
          // Whole matrix, then row chunks of a third (at least one row).
          const int64_t chunk = std::max<int64_t>(1, s.rows / 3);
          for (int64_t w_elems : {s.rows * s.cols, chunk * s.cols}) {
            const size_t es = xt == DType::kF32 ? 4 : 2;
            auto sw = poisoned(static_cast<size_t>(w_elems) * es);
            auto sy = poisoned(static_cast<size_t>(n * chunk) * 4);
            QuantScratch scratch{sw.data(), w_elems, sy.as<float>(), n * chunk};
            const auto y0 = testing::random_floats(static_cast<size_t>(n * s.rows), 77);
            const auto dy = upload(y0);
            const Status st_mm =
                quant_matmul(gemm, scratch, t, dw.data(), xt, dx.data(), n, s.rows, s.cols, dy.as<float>(), true, st);
            ASSERT_TRUE(st_mm.ok()) << st_mm.error().message;
            const auto y = download<float>(dy, static_cast<size_t>(n * s.rows));
            const double ep = max_rel_err(y, deq, x, n, s.rows, s.cols, xt, &y0);
            const double ee = max_rel_err(y, deq, x, n, s.rows, s.cols, DType::kF32, &y0);
            EXPECT_LT(ep, 1e-5) << dtype_name(t) << " " << s.rows << "x" << s.cols << " n=" << n << " x "
                                << dtype_name(xt) << " scratch " << w_elems;
            EXPECT_LT(ee, xt == DType::kF32 ? 1e-5 : 4e-3) << dtype_name(t) << " n=" << n << " " << dtype_name(xt);
            worst_path = std::max(worst_path, ep);
            if (xt == DType::kBF16) worst_exact = std::max(worst_exact, ee);
          }
        }
      }
    }
    std::printf(
        "[ cuda quant ] %-5s dequant+GEMM: vs its rounded weights %.3g, bf16 vs exact weights %.3g "
        "(of sum|w x|)\n",
        std::string(dtype_name(t)).c_str(), worst_path, worst_exact);
  }
}

TEST(CudaQuant, TooSmallAScratchIsAnError) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  QuantScratch none;
  const Status s = quant_matmul(gemm, none, DType::kQ4_0, nullptr, DType::kBF16, nullptr, 16, 64, 64, nullptr, false,
                                (*ctx)->stream());
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace rill::cuda
