// Quantized weights on the device (backend/cuda/quant.h) held to the CPU
// reference on random blocks of every GGUF type the kernels read:
//  - dequantize_rows equals cpu::ref::dequantize_row bit for bit (F32), and
//    that value rounded to nearest even in BF16/F16; the embedding gather
//    likewise;
//  - quant_gemv (1..11 tokens, x in F32 and BF16) equals the f64 sum of the
//    reference-dequantized weights times x within 1e-5 of sum |w x| per
//    output (f32 accumulation over at most 9,216 terms: about 1e-6 seen);
//    a token's result is the same bits alone and in a batch;
//  - Q8_0's GEMV (8B-like widths 4,096 and 14,336, rows split four ways
//    at 9,216 and 14,336) equals a host emulation of quant_gemv.cu's
//    documented order bit for bit (lane l sums items l, l + 32, .. of its
//    part by fmaf, then the warp's xor tree, then the parts in order), 1
//    and 8 tokens, F32 and BF16 x: a rewrite of the kernel must keep it;
//  - quant_matmul's dequantize-then-GEMM path (17 and 40 tokens; whole and
//    in row chunks) equals the f64 sum over the weights as the GEMM sees
//    them (rounded to x's dtype) within 1e-5 of sum |w x|, and the exact
//    weights within 4e-3 of sum |w x| for BF16 (weights and x rounded to
//    bf16: relative error <= 2^-9 each);
//  - the int8 path (Q4_K, Q6_K, Q8_0; quantize_x8 + quant_mma, 1..64
//    tokens, x in F32 and BF16): x's int8 copy is what the host computes
//    (d = max |x| / 127, q = x / d to nearest even), y equals the f64 sum of
//    the reference weights times that copy within 1e-5 of sum |w x|, and
//    the exact x within sum |w| d / 2 (+1e-5 sum |w x|); a token's result is
//    the same bits alone and in any batch; y_stride leaves other columns
//    alone; quant_matmul takes the path when its scratch has room for x;
//    quant_mmq (Q8_0 / Q4_K; quant_mma's calls of 9+ tokens on
//    matrices of enough rows) gives one-token quant_mma's bits at each of
//    its block sizes, with and without the cluster K split, plain and
//    accumulating into strided rows, and writes no token past n; and
//    quant_matmul takes it at 24 tokens of a tall matrix;
//  - quant_matmul_parts over a matrix of Q4_K, Q6_K and Q4_K rows equals
//    the reference on each path (GEMV, int8, dequantize + GEMM).
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
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
  // (rows, cols, row0, n): row0 = 5 starts off a 16-byte boundary for the
  // types whose rows are not whole 16-byte words (the item kernel); 0 and 8
  // start on one (the tile kernel), with n leaving a partial last tile
  // (and, for Q8_0, a tail of bytes that is no whole word); the 300-row
  // matrix is many tiles.
  struct Case {
    int64_t rows, cols, row0, n;
  };
  for (DType t : kTypes) {
    const bool k256 = dtype_info(t).block_size == 256;
    const int64_t c = k256 ? 1536 : 576;
    for (const Case& cs : {Case{37, c, 5, 20}, Case{37, c, 0, 37}, Case{37, c, 8, 29}, Case{300, 4096, 16, 284}}) {
      const auto w = cpu::testing::random_weight_rows(t, cs.rows, cs.cols, 7 + static_cast<uint32_t>(t));
      const auto ref = dequant_ref(t, w, cs.rows, cs.cols);
      const auto dw = upload(w);
      // shift 1 (16-bit outputs): the output 8 bytes past a 16-byte
      // boundary, which sends every type to the item kernel whatever row0
      // is (its 16-bit stores need 8-byte alignment; its f32 stores, 16).
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int shift : {0, 1}) {
          if (shift == 1 && out == DType::kF32) continue;
          const size_t es = out == DType::kF32 ? 4 : 2, n_out = static_cast<size_t>(cs.n * cs.cols);
          const size_t lead = static_cast<size_t>(shift) * 8;
          auto d = poisoned(lead + (n_out + 64) * es);  // 64 more: nothing past the rows is written
          dequantize_rows(t, dw.data(), cs.cols, cs.row0, cs.n, out, d.as<uint8_t>() + lead, nullptr);
          const auto all = download<uint8_t>(d, lead + (n_out + 64) * es);
          const std::vector<uint8_t> raw(all.begin() + static_cast<std::ptrdiff_t>(lead), all.end());
          const auto got = decode(out, raw);
          int64_t n_diff = 0;
          for (size_t i = 0; i < n_out; ++i) {
            const float want = round_to(out, ref[static_cast<size_t>(cs.row0 * cs.cols) + i]);
            n_diff += std::memcmp(&want, &got[i], 4) != 0;
          }
          const std::string what = std::string(dtype_name(t)) + " -> " + std::string(dtype_name(out)) + ", rows " +
                                   std::to_string(cs.row0) + " + " + std::to_string(cs.n) + " of " +
                                   std::to_string(cs.rows) + " x " + std::to_string(cs.cols) + ", output shift " +
                                   std::to_string(shift);
          EXPECT_EQ(n_diff, 0) << what;
          EXPECT_EQ(std::count(raw.begin() + static_cast<std::ptrdiff_t>(n_out * es), raw.end(), uint8_t{0xff}),
                    static_cast<std::ptrdiff_t>(64 * es))
              << what << ": written past the rows";
          EXPECT_EQ(std::count(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(lead), uint8_t{0xff}),
                    static_cast<std::ptrdiff_t>(lead))
              << what << ": written before the rows";
        }
      }
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

// quant_gemv's result for one row and token, computed on the host in the
// kernel's order (quant_gemv.cu): deq the reference weights (Q8_0's d * q,
// rounded as the kernel rounds it), items of 8 columns.
float gemv_order_ref(const float* deq, const float* x, int64_t cols) {
  const int64_t n_items = cols / 8;
  const int n_split = n_items >= 1024 ? 4 : 1;
  const int64_t per = (n_items + n_split - 1) / n_split;
  float s = 0.0f;
  for (int p = 0; p < n_split; ++p) {
    float v[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t it = p * per + l; it < std::min(n_items, (p + 1) * per); it += 32) {
        for (int64_t c = 8 * it; c < 8 * it + 8; ++c) acc = std::fma(deq[c], x[c], acc);
      }
      v[l] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) {
      float nv[32];
      for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ o];
      std::memcpy(v, nv, sizeof v);
    }
    s = p == 0 ? v[0] : s + v[0];
  }
  return s;
}

TEST(CudaQuant, Q8GemvEqualsItsDocumentedOrderBitForBit) {
  RILL_REQUIRE_GPU();
  const DType t = DType::kQ8_0;
  for (const Shape& s : std::vector<Shape>{{300, 4096}, {40, 14336}, {40, 9216}, {67, 576}, {5, 256}}) {
    const auto w = cpu::testing::random_weight_rows(t, s.rows, s.cols, 7 + static_cast<uint32_t>(s.cols));
    const auto deq = dequant_ref(t, w, s.rows, s.cols);
    const auto dw = upload(w);
    for (DType xt : {DType::kF32, DType::kBF16}) {
      const int64_t n = 8;
      auto x = testing::random_floats(static_cast<size_t>(n * s.cols), 3 + static_cast<uint32_t>(s.rows));
      for (float& v : x) v = round_to(xt, v);
      const auto dx = upload(encode(xt, x));
      std::vector<float> want(static_cast<size_t>(n * s.rows));
      for (int64_t k = 0; k < n; ++k) {
        for (int64_t r = 0; r < s.rows; ++r) {
          want[static_cast<size_t>(k * s.rows + r)] =
              gemv_order_ref(&deq[static_cast<size_t>(r * s.cols)], &x[static_cast<size_t>(k * s.cols)], s.cols);
        }
      }
      for (int64_t nt : {int64_t{1}, n}) {
        auto dy = poisoned(static_cast<size_t>(n * s.rows) * 4);
        quant_gemv(t, dw.data(), xt, dx.data(), nt, s.rows, s.cols, dy.as<float>(), false, nullptr);
        const auto y = download<float>(dy, static_cast<size_t>(nt * s.rows));
        int64_t n_diff = 0;
        for (size_t i = 0; i < y.size(); ++i) n_diff += std::memcmp(&y[i], &want[i], 4) != 0;
        EXPECT_EQ(n_diff, 0) << s.rows << "x" << s.cols << " x " << dtype_name(xt) << " n=" << nt;
      }
    }
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

const DType kMmaTypes[] = {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};

// x [n, cols] as quantize_x8 rounds it: per token and 32 columns
// d = max |x| / 127, q = x / d to nearest even (both in f32), value q d; and
// d / 2 per element (the bound of that rounding).
std::vector<float> x8_ref(const std::vector<float>& x, int64_t n, int64_t cols, std::vector<float>* half_d) {
  std::vector<float> out(x.size());
  half_d->assign(x.size(), 0.0f);
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * 32 + i)]));
    const float d = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      const size_t k = static_cast<size_t>(b * 32 + i);
      const float q = amax > 0 ? std::nearbyint(x[k] / d) : 0.0f;
      out[k] = static_cast<float>(double(q) * double(d));
      (*half_d)[k] = d / 2;
    }
  }
  return out;
}

// Largest |y - sum w x| over the bound sum |w| half_d + 1e-5 sum |w x|.
double max_over_x8_bound(const std::vector<float>& y, const std::vector<float>& deq, const std::vector<float>& x,
                         const std::vector<float>& half_d, int64_t n, int64_t rows, int64_t cols) {
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0, bound = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double w = deq[static_cast<size_t>(r * cols + c)];
        const size_t k = static_cast<size_t>(t * cols + c);
        s += w * x[k];
        a += std::fabs(w * x[k]);
        bound += std::fabs(w) * half_d[k];
      }
      const double e = std::fabs(double(y[static_cast<size_t>(t * rows + r)]) - s) / (bound + 1e-5 * a + 1e-30);
      if (!(e <= worst)) worst = e;
    }
  }
  return worst;
}

TEST(CudaQuant, QuantizeX8MatchesTheHostRounding) {
  RILL_REQUIRE_GPU();
  const int64_t n = 5, cols = 4096;
  auto x = testing::random_floats(static_cast<size_t>(n * cols), 41, -3.0f, 3.0f);
  for (int64_t c = 0; c < 32; ++c) x[static_cast<size_t>(64 + c)] = 0.0f;  // an all-zero block
  for (DType xt : {DType::kF32, DType::kBF16}) {
    std::vector<float> xr = x;
    for (float& v : xr) v = round_to(xt, v);
    std::vector<float> half_d;
    const auto want = x8_ref(xr, n, cols, &half_d);
    const auto dx = upload(encode(xt, xr));
    auto dq = poisoned(quantized_x_bytes(n, cols));
    quantize_x8(xt, dx.data(), n, cols, dq.data(), nullptr);
    const auto q = download<int8_t>(dq, static_cast<size_t>(n * cols));
    const auto ds = download<float>(dq, static_cast<size_t>(n * cols / 4 + 2 * (n * cols / 32)));
    int64_t n_diff = 0;
    for (int64_t b = 0; b < n * cols / 32; ++b) {
      const float d = ds[static_cast<size_t>(n * cols / 4 + 2 * b)];
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const size_t k = static_cast<size_t>(b * 32 + i);
        // Stored in the fragments' order: columns 4t..4t+3, 16+4t..16+4t+3, t = 0..3.
        const size_t at = static_cast<size_t>(b * 32 + 8 * ((i & 15) >> 2) + 4 * (i >> 4) + (i & 3));
        n_diff += static_cast<float>(double(q[at]) * double(d)) != want[k];
        sum += q[at];
      }
      n_diff += ds[static_cast<size_t>(n * cols / 4 + 2 * b + 1)] != d * static_cast<float>(sum);
    }
    EXPECT_EQ(n_diff, 0) << dtype_name(xt);
  }
}

TEST(CudaQuant, MmaMatchesTheCpuReferenceAndIsBatchInvariant) {
  RILL_REQUIRE_GPU();
  const int64_t n_max = kMmaMaxTokens;
  for (DType t : kMmaTypes) {
    double worst_q = 0, worst_x = 0;
    int n_mmq = 0;
    for (const Shape& s : shapes(t)) {
      const auto w = cpu::testing::random_weight_rows(t, s.rows, s.cols,
                                                      51 + static_cast<uint32_t>(t) + static_cast<uint32_t>(s.cols));
      const auto deq = dequant_ref(t, w, s.rows, s.cols);
      const auto dw = upload(w);
      for (DType xt : {DType::kF32, DType::kBF16}) {
        const size_t es = xt == DType::kF32 ? 4 : 2;
        auto x = testing::random_floats(static_cast<size_t>(n_max * s.cols), 7 + static_cast<uint32_t>(s.rows));
        for (float& v : x) v = round_to(xt, v);
        std::vector<float> half_d;
        const auto x8 = x8_ref(x, n_max, s.cols, &half_d);
        const auto dx = upload(encode(xt, x));
        auto dq = poisoned(quantized_x_bytes(n_max, s.cols));
        // Every token alone: [n_max, rows].
        std::vector<float> alone;
        for (int64_t t0 = 0; t0 < n_max; ++t0) {
          quantize_x8(xt, dx.as<uint8_t>() + static_cast<size_t>(t0 * s.cols) * es, 1, s.cols, dq.data(), nullptr);
          auto dy = poisoned(static_cast<size_t>(s.rows) * 4);
          quant_mma(t, dw.data(), dq.data(), 1, s.rows, s.cols, dy.as<float>(), s.rows, false, nullptr);
          const auto y = download<float>(dy, static_cast<size_t>(s.rows));
          alone.insert(alone.end(), y.begin(), y.end());
        }
        const double eq = max_rel_err(alone, deq, x8, n_max, s.rows, s.cols);
        const double ex = max_over_x8_bound(alone, deq, x, half_d, n_max, s.rows, s.cols);
        EXPECT_LT(eq, 1e-5) << dtype_name(t) << " " << s.rows << "x" << s.cols << " x " << dtype_name(xt);
        EXPECT_LE(ex, 1.0) << dtype_name(t) << " " << s.rows << "x" << s.cols << " x " << dtype_name(xt);
        worst_q = std::max(worst_q, eq);
        worst_x = std::max(worst_x, ex);
        for (int64_t n : {3, 8, 11, 17, 40, 64}) {
          quantize_x8(xt, dx.data(), n, s.cols, dq.data(), nullptr);
          // accumulate = true onto known values, rows y_stride = rows + 5 apart.
          const int64_t stride = s.rows + 5;
          const auto y0 = testing::random_floats(static_cast<size_t>(n * stride), 99);
          const auto dy = upload(y0);
          quant_mma(t, dw.data(), dq.data(), n, s.rows, s.cols, dy.as<float>(), stride, true, nullptr);
          const auto y = download<float>(dy, static_cast<size_t>(n * stride));
          std::vector<float> yc, y0c;
          int64_t n_touched = 0;
          for (int64_t tk = 0; tk < n; ++tk) {
            for (int64_t r = 0; r < stride; ++r) {
              const size_t k = static_cast<size_t>(tk * stride + r);
              if (r < s.rows) {
                yc.push_back(y[k]);
                y0c.push_back(y0[k]);
              } else {
                n_touched += std::memcmp(&y[k], &y0[k], 4) != 0;
              }
            }
          }
          EXPECT_EQ(n_touched, 0) << dtype_name(t) << " n=" << n << ": columns past n_rows written";
          const double e = max_rel_err(yc, deq, x8, n, s.rows, s.cols, DType::kF32, &y0c);
          EXPECT_LT(e, 1e-5) << dtype_name(t) << " n=" << n;
          auto dz = poisoned(static_cast<size_t>(n * s.rows) * 4);
          quant_mma(t, dw.data(), dq.data(), n, s.rows, s.cols, dz.as<float>(), s.rows, false, nullptr);
          const auto z = download<float>(dz, static_cast<size_t>(n * s.rows));
          int64_t n_diff = 0;
          for (size_t i = 0; i < z.size(); ++i) n_diff += std::memcmp(&z[i], &alone[i], 4) != 0;
          EXPECT_EQ(n_diff, 0) << dtype_name(t) << " " << s.rows << "x" << s.cols << ": " << n
                               << " tokens differ from one at a time";
        }
        // quant_mmq at each of its block sizes (quant_mma picks one): the
        // same bits as one token at a time through quant_mma.
        for (int64_t n : {1, 8, 17, 40, 64}) {
          if (!quant_mmq_fits(t, dw.data(), n, s.cols)) continue;
          ++n_mmq;
          quantize_x8(xt, dx.data(), n, s.cols, dq.data(), nullptr);
          for (int split : {1, 8}) {
            for (int rows : {32, 64, 128}) {
              const std::string what = std::string(dtype_name(t)) + " " + std::to_string(s.rows) + "x" +
                                       std::to_string(s.cols) + ": quant_mmq, " + std::to_string(rows) +
                                       " rows a block, k_split " + std::to_string(split) + ", " + std::to_string(n) +
                                       " tokens";
              // One token row more than n, left alone.
              auto dz = poisoned(static_cast<size_t>((n + 1) * s.rows) * 4);
              const auto before = download<float>(dz, static_cast<size_t>((n + 1) * s.rows));
              quant_mmq(t, dw.data(), dq.data(), n, s.rows, s.cols, dz.as<float>(), s.rows, false, nullptr, rows,
                        split);
              const auto z = download<float>(dz, static_cast<size_t>((n + 1) * s.rows));
              int64_t n_diff = 0, n_touched = 0;
              for (size_t i = 0; i < static_cast<size_t>(n * s.rows); ++i) {
                n_diff += std::memcmp(&z[i], &alone[i], 4) != 0;
              }
              for (size_t i = static_cast<size_t>(n * s.rows); i < z.size(); ++i) {
                n_touched += std::memcmp(&z[i], &before[i], 4) != 0;
              }
              EXPECT_EQ(n_diff, 0) << what << ": differs from quant_mma one token at a time";
              EXPECT_EQ(n_touched, 0) << what << ": wrote past its tokens";
              // accumulate onto known values, rows y_stride = rows + 5
              // apart: each output y0 + alone (one f32 add), other
              // columns untouched.
              const int64_t stride = s.rows + 5;
              const auto y0 = testing::random_floats(static_cast<size_t>(n * stride), 77);
              const auto dy = upload(y0);
              quant_mmq(t, dw.data(), dq.data(), n, s.rows, s.cols, dy.as<float>(), stride, true, nullptr, rows, split);
              const auto y = download<float>(dy, static_cast<size_t>(n * stride));
              n_diff = 0;
              for (int64_t tk = 0; tk < n; ++tk) {
                for (int64_t r = 0; r < stride; ++r) {
                  const size_t k = static_cast<size_t>(tk * stride + r);
                  const float want = r < s.rows ? y0[k] + alone[static_cast<size_t>(tk * s.rows + r)] : y0[k];
                  n_diff += std::memcmp(&y[k], &want, 4) != 0;
                }
              }
              EXPECT_EQ(n_diff, 0) << what << ", accumulating into strided rows";
            }
          }
        }
      }
    }
    // Every shape's columns are a multiple of 256 but for the 1 x 32 /
    // 67 x 576 Q8_0 ones: quant_mmq must have run for every type (Q6_K's
    // rows of 1, 6 and 36 super-blocks are not 16-byte aligned: staged as
    // the pieces holding them, the last row's last piece cut at W's end).
    EXPECT_GT(n_mmq, 0) << dtype_name(t);
    std::printf("[ cuda quant ] %-5s int8 mma: vs its int8 x %.3g of sum|w x|; vs exact x %.3g of the rounding bound\n",
                std::string(dtype_name(t)).c_str(), worst_q, worst_x);
  }
}

TEST(CudaQuant, QuantMatmulTakesTheInt8PathWhenItsScratchHasRoom) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  const int64_t rows = 96, cols = 1024, n = 12;
  for (DType t : kMmaTypes) {
    const auto w = cpu::testing::random_weight_rows(t, rows, cols, 61 + static_cast<uint32_t>(t));
    const auto dw = upload(w);
    const auto x = testing::random_floats(static_cast<size_t>(n * cols), 8);
    const auto dx = upload(encode(DType::kBF16, x));
    // Direct: quantize_x8 + quant_mma.
    auto dq = poisoned(quantized_x_bytes(n, cols));
    quantize_x8(DType::kBF16, dx.data(), n, cols, dq.data(), st);
    auto dd = poisoned(static_cast<size_t>(n * rows) * 4);
    quant_mma(t, dw.data(), dq.data(), n, rows, cols, dd.as<float>(), rows, false, st);
    // Through quant_matmul with room for x (and none for a dequantized copy).
    auto xq = poisoned(quantized_x_bytes(n, cols));
    QuantScratch scratch;
    scratch.xq = xq.data();
    scratch.xq_bytes = quantized_x_bytes(n, cols);
    auto dy = poisoned(static_cast<size_t>(n * rows) * 4);
    const Status s =
        quant_matmul(gemm, scratch, t, dw.data(), DType::kBF16, dx.data(), n, rows, cols, dy.as<float>(), false, st);
    ASSERT_TRUE(s.ok()) << s.error().message;
    cudaStreamSynchronize(st);
    const auto want = download<float>(dd, static_cast<size_t>(n * rows));
    const auto got = download<float>(dy, static_cast<size_t>(n * rows));
    int64_t n_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) n_diff += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(n_diff, 0) << dtype_name(t);
  }
}

// quant_matmul at 24 tokens (past quant_mma's own 16) on a matrix with
// rows enough to take quant_mmq by default (a 128-row block for every SM): the same bits as
// quant_mma one token at a time, and with no room for a dequantized copy
// (that path would be an error).
TEST(CudaQuant, QuantMatmulTakesQuantMmqForTallMatrices) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  const int64_t rows = 128 * sm_count() + 37, cols = 512, n = 24;
  for (DType t : {DType::kQ8_0, DType::kQ4_K}) {
    const auto w = cpu::testing::random_weight_rows(t, rows, cols, 71 + static_cast<uint32_t>(t));
    const auto dw = upload(w);
    ASSERT_EQ(quant_mmq_eligible(t, dw.data(), n, rows, cols), quant_mmq_on()) << dtype_name(t);
    const auto x = testing::random_floats(static_cast<size_t>(n * cols), 9);
    const auto dx = upload(encode(DType::kBF16, x));
    std::vector<float> alone;
    auto dq = poisoned(quantized_x_bytes(1, cols));
    for (int64_t tk = 0; tk < n; ++tk) {
      quantize_x8(DType::kBF16, dx.as<uint8_t>() + static_cast<size_t>(tk * cols) * 2, 1, cols, dq.data(), st);
      auto d1 = poisoned(static_cast<size_t>(rows) * 4);
      quant_mma(t, dw.data(), dq.data(), 1, rows, cols, d1.as<float>(), rows, false, st);
      const auto y1 = download<float>(d1, static_cast<size_t>(rows));
      alone.insert(alone.end(), y1.begin(), y1.end());
    }
    auto xq = poisoned(quantized_x_bytes(kMmaMaxTokens, cols));
    QuantScratch scratch;
    scratch.xq = xq.data();
    scratch.xq_bytes = quantized_x_bytes(kMmaMaxTokens, cols);
    auto dy = poisoned(static_cast<size_t>(n * rows) * 4);
    const Status s =
        quant_matmul(gemm, scratch, t, dw.data(), DType::kBF16, dx.data(), n, rows, cols, dy.as<float>(), false, st);
    if (!quant_mmq_on()) {
      EXPECT_FALSE(s.ok()) << "RILL_QUANT_MMQ=0: the dequantizing path, with no scratch for it";
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto got = download<float>(dy, static_cast<size_t>(n * rows));
    int64_t n_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) n_diff += std::memcmp(&got[i], &alone[i], 4) != 0;
    EXPECT_EQ(n_diff, 0) << dtype_name(t) << " " << rows << " x " << cols << ", " << n << " tokens";
  }
}

TEST(CudaQuant, MixedTypePartsMatchTheReferenceOnEveryPath) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  const int64_t cols = 1536;
  const DType types[] = {DType::kQ4_K, DType::kQ6_K, DType::kQ4_K};
  const int64_t part_rows[] = {40, 24, 19};
  const int64_t rows = 40 + 24 + 19;
  std::vector<DeviceBuffer> dev;
  std::vector<QuantPart> parts;
  std::vector<float> deq;  // [rows, cols]
  for (int i = 0; i < 3; ++i) {
    const auto w = cpu::testing::random_weight_rows(types[i], part_rows[i], cols, 71 + static_cast<uint32_t>(i));
    const auto d = dequant_ref(types[i], w, part_rows[i], cols);
    deq.insert(deq.end(), d.begin(), d.end());
    dev.push_back(upload(w));
    parts.push_back({dev.back().data(), types[i], part_rows[i]});
  }
  for (int64_t n : {3, 24, 80}) {
    const auto x = testing::random_floats(static_cast<size_t>(n * cols), 13 + static_cast<uint32_t>(n));
    const auto dx = upload(encode(DType::kF32, x));
    std::vector<float> half_d;
    const auto x8 = x8_ref(x, n, cols, &half_d);
    for (bool with_xq : {false, true}) {
      auto sw = poisoned(static_cast<size_t>(rows * cols) * 4);
      auto xq = poisoned(quantized_x_bytes(n, cols));
      QuantScratch scratch{sw.data(), rows * cols, nullptr, 0};
      if (with_xq) {
        scratch.xq = xq.data();
        scratch.xq_bytes = quantized_x_bytes(n, cols);
      }
      const auto y0 = testing::random_floats(static_cast<size_t>(n * rows), 5);
      const auto dy = upload(y0);
      const Status s =
          quant_matmul_parts(gemm, scratch, parts.data(), 3, DType::kF32, dx.data(), n, cols, dy.as<float>(), true, st);
      ASSERT_TRUE(s.ok()) << s.error().message;
      const auto y = download<float>(dy, static_cast<size_t>(n * rows));
      const bool int8 = with_xq && n <= kInt8PathMaxTokens;
      const double e = max_rel_err(y, deq, int8 ? x8 : x, n, rows, cols, DType::kF32, &y0);
      EXPECT_LT(e, 1e-5) << "n=" << n << (int8 ? " int8 path" : n <= kGemvMaxTokens ? " GEMV" : " dequant+GEMM");
    }
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

// Times, not a check (gtest_filter it on a device): quantize_x8 +
// quant_mmq at each block size against dequantize + cuBLASLt (the path
// 17..64 tokens take without it) and quant_mma (its own kernel up to 16
// tokens, or quant_mmq where eligible) over the Llama-3.1-8B's shapes
// (Q6_K: its LM head and down), 3-12 copies
// of each matrix in turn (so that one call's weights are not in L2 for
// the next), median of 5 runs of 12 back-to-back calls; GB/s of weights.
TEST(CudaQuant, DeviceTimingMmq) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  cudaStream_t st = (*ctx)->stream();
  const struct {
    const char* name;
    int64_t rows, cols;
  } kShapes[] = {{"qkv", 6144, 4096},
                 {"o", 4096, 4096},
                 {"gate_up", 28672, 4096},
                 {"down", 4096, 14336},
                 {"lm_head", 128256, 4096}};
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  for (DType t : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    for (const auto& sh : kShapes) {
      // Q4_K_M's Q6_K matrices: the LM head and half the layers' down (and
      // v); the LM head in Q6_K alone (431 MB: 3 copies).
      const bool lm_head = std::strcmp(sh.name, "lm_head") == 0;
      if (t == DType::kQ6_K ? !lm_head && std::strcmp(sh.name, "down") != 0 : lm_head) continue;
      const size_t bytes = row_bytes(t, sh.cols) * static_cast<size_t>(sh.rows);
      std::vector<DeviceBuffer> w;
      // Copies enough that one call's weights have left the L2 (50 MB on
      // an H100) by their next turn: 150 MB of them, 3 to 12.
      const int copies = static_cast<int>(std::clamp<size_t>((150u << 20) / bytes + 1, 3, 12));
      for (int c = 0; c < copies; ++c) {
        w.push_back(poisoned(bytes));
        ASSERT_EQ(cudaMemset(w.back().data(), 0x11, bytes), cudaSuccess);  // finite scales
      }
      auto x = poisoned(static_cast<size_t>(64 * sh.cols) * 2);
      ASSERT_EQ(cudaMemset(x.data(), 0x3c, static_cast<size_t>(64 * sh.cols) * 2), cudaSuccess);
      auto xq = poisoned(quantized_x_bytes(64, sh.cols));
      auto y = poisoned(static_cast<size_t>(64 * sh.rows) * 4);
      auto scratch = poisoned(static_cast<size_t>(sh.rows * sh.cols) * 2);
      auto time = [&](auto&& fn) {
        std::vector<double> ts;
        for (int rep = 0; rep < 6; ++rep) {
          cudaEventRecord(e0, st);
          for (int k = 0; k < 12; ++k) fn(w[static_cast<size_t>(k % copies)].data());
          cudaEventRecord(e1, st);
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (rep > 0) ts.push_back(ms * 1e3 / 12);
        }
        std::sort(ts.begin(), ts.end());
        return ts[ts.size() / 2];
      };
      for (int n : {8, 16, 32, 64}) {
        ASSERT_TRUE(quant_mmq_fits(t, w[0].data(), n, sh.cols));
        const double base = time([&](void* p) {
          dequantize_rows(t, p, sh.cols, 0, sh.rows, DType::kBF16, scratch.data(), st);
          ASSERT_TRUE(gemm.run(DType::kBF16, scratch.data(), x.data(), n, sh.rows, sh.cols, y.as<float>(), false).ok());
        });
        const double mma = time([&](void* p) {
          quantize_x8(DType::kBF16, x.data(), n, sh.cols, xq.data(), st);
          quant_mma(t, p, xq.data(), n, sh.rows, sh.cols, y.as<float>(), sh.rows, false, st);
        });
        std::printf("[ quant mmq ] %-4s %-7s n=%d: dequant+gemm %.1f us %.0f GB/s; quant_mma%s %.1f us %.0f GB/s;",
                    std::string(dtype_name(t)).c_str(), sh.name, n, base, bytes / base / 1e3,
                    quant_mmq_eligible(t, w[0].data(), n, sh.rows, sh.cols) ? " (mmq)" : "", mma, bytes / mma / 1e3);
        for (int split : {1, 8}) {
          for (int rows : {0, 32, 64, 128}) {
            if (split == 8 && rows == 0) continue;
            const double us = time([&](void* p) {
              quantize_x8(DType::kBF16, x.data(), n, sh.cols, xq.data(), st);
              quant_mmq(t, p, xq.data(), n, sh.rows, sh.cols, y.as<float>(), sh.rows, false, st, rows, split);
            });
            std::printf(" mmq%s %s %.1f us %.0f GB/s (%.2fx);", split == 8 ? " split" : "",
                        rows == 0 ? "auto" : std::to_string(rows).c_str(), us, bytes / us / 1e3, base / us);
          }
        }
        std::printf("\n");
      }
    }
  }
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace rill::cuda
