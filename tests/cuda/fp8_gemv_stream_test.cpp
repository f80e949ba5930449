// The streaming FP8 GEMV (backend/cuda/fp8.h: fp8_gemv_stream,
// RILL_FP8_GEMV=v2) held to the order fp8.h documents, restated on the
// host:
//  - every token count of 1..8 and 11 tokens (x F32 and BF16; overwriting,
//    and accumulating 1 and 3 tokens) is the host restatement's bits: per
//    part lane sums of fused products in column order, the xor tree, the
//    parts in order, the row's scale, + y;
//  - the same bits as fp8_gemv (its 16-byte kernel), and within 1e-5 of
//    sum |w x| of the f64 product of the dequantized weights and x;
//  - batch invariance: a token alone and among 8 gives the same bits;
//  - every configuration the kernel bench times (rows an item, items in
//    flight, blocks per SM) gives the same bits;
//  - shapes: one row; a row shorter than one lane's vector; column counts
//    of 1, 2, 4, 5, 7, 8 and 14 slots a part (padded to a multiple of the
//    items in flight); rows not a multiple of the row groups; the 1 x 8,
//    2 x 4 and 4 x 2 (rows an item x items in flight) configurations of
//    one token and 1 x 4, 1 x 2 of more; rows split in 2 and 4 parts, the
//    last short; more warps than row groups (warps with nothing to do);
//    more than 32 rows a warp (the scales' next chunks); y past the results
//    untouched; a poisoned y overwritten by fp8_gemv.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::encode;
using testing::random_floats;
using testing::round_to;
using testing::upload;

float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

struct Shape {
  int64_t rows, cols;
};

// Row r of the placed matrix `bytes` (kFp8Rows) times token row xt, in the
// documented order (fp8.h, fp8_gemv_stream), without the + y.
float host_ordered(const std::vector<uint8_t>& bytes, int64_t r, const float* xt, int64_t n_rows, int64_t n_cols) {
  const uint8_t* row = bytes.data() + r * static_cast<int64_t>(fp8_row_bytes(n_cols));
  float scale;
  std::memcpy(&scale, row, 4);
  const uint8_t* q = row + kFp8RowHeader;
  const int64_t n_vec = n_cols / 16, parts = fp8_gemv_parts(n_rows, n_cols);
  const int64_t per = ((n_vec + parts - 1) / parts + 31) / 32 * 32;
  float total = 0.0f;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t end = std::min(n_vec, (p + 1) * per);
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t i = p * per + l; i < end; i += 32) {
        for (int e = 0; e < 16; ++e) acc = std::fma(e4m3_value(q[i * 16 + e]), xt[i * 16 + e], acc);
      }
      lane[l] = acc;
    }
    for (int o = 16; o > 0; o >>= 1) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
      std::memcpy(lane, next, sizeof lane);
    }
    total = p == 0 ? lane[0] : total + lane[0];
  }
  const volatile float product = total * scale;  // one rounding, as __fmul_rn
  return product;
}

double f64_bound(const std::vector<uint8_t>& bytes, int64_t r, const float* xt, int64_t n_cols, double* mag) {
  const uint8_t* row = bytes.data() + r * static_cast<int64_t>(fp8_row_bytes(n_cols));
  float scale;
  std::memcpy(&scale, row, 4);
  double sum = 0;
  *mag = 0;
  for (int64_t c = 0; c < n_cols; ++c) {
    const double p = double(e4m3_value(row[kFp8RowHeader + c])) * scale * xt[c];
    sum += p;
    *mag += std::fabs(p);
  }
  return sum;
}

// Random weights with a few larger entries and one all-zero row, quantized
// on the device.
DeviceBuffer make_weights(const Shape& s, uint32_t seed) {
  std::vector<float> w = random_floats(static_cast<size_t>(s.rows * s.cols), seed, -0.05f, 0.05f);
  for (size_t i = 0; i < w.size(); i += 97) w[i] *= 20;
  if (s.rows > 2) std::fill(w.begin() + s.cols, w.begin() + 2 * s.cols, 0.0f);
  DeviceBuffer in = upload(w);
  auto out = DeviceBuffer::allocate(fp8_matrix_bytes(s.rows, s.cols), "fp8 weights");
  EXPECT_TRUE(out.ok());
  quantize_fp8_rows(DType::kF32, in.data(), s.rows, s.cols, out->as<uint8_t>(),
                    const_cast<float*>(fp8_scales(out->data(), s.rows, s.cols)), nullptr);
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  return std::move(out).value();
}

// Rows an item x items in flight each shape takes on an H200 (132 SMs:
// 2,112 warps; fp8_gemv_stream.cu's rows_per_item: 4 x 2 from 4,224 rows,
// 2 x 4 from 2,112, else 1 x 8), and its parts and slots a part (padded to
// a multiple of the items in flight).
const Shape kShapes[] = {
    {1, 16},        // one row, one vector: 1 slot (padded to 8)
    {3, 48},        // 3 vectors: lanes past them idle
    {67, 576},      // 36 vectors, 1 part, 2 slots
    {5, 2064},      // 129 vectors, 1 part, 5 slots
    {259, 4096},    // 2 parts of 4 slots; rows not a multiple of a group
    {100, 7680},    // 2 parts of 256 vectors (the last 224): 8 slots
    {40, 9216},     // 4 parts of 160 vectors (the last 96): 5 slots
    {33, 14336},    // 4 parts of 7 slots
    {2500, 4096},   // 2 x 4, 1,250 groups
    {4500, 2048},   // 4 x 2, 1,125 groups, 1 part of 4 slots
    {9000, 64},     // 4 x 2, 1 slot (padded to 2), 2,250 groups: 1-2 a warp
    {140001, 16},   // 4 x 2, 35,001 groups: 16-17 a warp, 64+ rows (the scales' chunk rotates); last group short
    {4096, 14336},  // the 8B's down: 2 x 4, 2 parts of 14 slots (padded to 16)
};

class Fp8GemvStream : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8GemvStream, MatchesTheHostOrderAndFp8Gemv) {
  RILL_REQUIRE_GPU();
  const DType xt = GetParam();
  for (const Shape s : kShapes) {
    SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols) + " x " + std::string(dtype_name(xt)));
    const DeviceBuffer q = make_weights(s, 3);
    const auto bytes = download<uint8_t>(q, fp8_matrix_bytes(s.rows, s.cols));
    const int64_t kTok = s.rows * s.cols > 4'000'000 ? 3 : 11;  // fewer host sums for the large shapes
    std::vector<float> x = random_floats(static_cast<size_t>(kTok * s.cols), 5);
    for (float& v : x) v = round_to(xt, v);
    const DeviceBuffer xd = upload(encode(xt, x));
    const size_t x_bytes = xt == DType::kF32 ? 4 : 2;
    // y is one float longer than the results (a canary: never written)
    const int64_t ys_total = kTok * s.rows + 1;
    std::vector<float> want(static_cast<size_t>(kTok * s.rows));
    for (int64_t t = 0; t < kTok; ++t) {
      for (int64_t r = 0; r < s.rows; ++r) {
        want[t * s.rows + r] = host_ordered(bytes, r, x.data() + t * s.cols, s.rows, s.cols);
        double mag = 0;
        const double sum = f64_bound(bytes, r, x.data() + t * s.cols, s.cols, &mag);
        ASSERT_NEAR(want[t * s.rows + r], sum, 1e-5 * mag + 1e-30) << "host order, token " << t << " row " << r;
      }
    }
    auto y = DeviceBuffer::allocate(static_cast<size_t>(ys_total) * 4, "y");
    ASSERT_TRUE(y.ok());
    // every token count in one launch (8 a launch past 8), token 0 first
    std::vector<int64_t> counts;
    for (int64_t n = 1; n <= std::min<int64_t>(8, kTok); ++n) counts.push_back(n);
    if (kTok > 8) counts.push_back(kTok);
    for (const int64_t n : counts) {
      RILL_CUDA_CHECK(cudaMemset(y->data(), 0xff, static_cast<size_t>(ys_total) * 4));
      fp8_gemv_stream(q.as<uint8_t>(), xt, xd.data(), n, s.rows, s.cols, y->as<float>(), false, nullptr);
      const auto got = download<float>(*y, static_cast<size_t>(n * s.rows + 1));
      int64_t bad = 0;
      for (int64_t i = 0; i < n * s.rows; ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(bad, 0) << n << " tokens: results differing from the host order";
      uint32_t canary;
      std::memcpy(&canary, &got[n * s.rows], 4);
      EXPECT_EQ(canary, 0xffffffffu) << n << " tokens: wrote past its results";
    }
    // a later token alone: the bits it had among the others
    const int64_t last = kTok - 1;
    fp8_gemv_stream(q.as<uint8_t>(), xt, xd.as<uint8_t>() + last * s.cols * x_bytes, 1, s.rows, s.cols, y->as<float>(),
                    false, nullptr);
    {
      const auto got = download<float>(*y, static_cast<size_t>(s.rows));
      for (int64_t r = 0; r < s.rows; ++r) ASSERT_EQ(got[r], want[last * s.rows + r]) << "token " << last << " alone";
    }
    // fp8_gemv (either kernel, by RILL_FP8_GEMV) gives the same bits, over
    // a poisoned y (a kernel that writes nothing fails)
    RILL_CUDA_CHECK(cudaMemset(y->data(), 0xff, static_cast<size_t>(ys_total) * 4));
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    fp8_gemv(q.as<uint8_t>(), xt, xd.data(), kTok, s.rows, s.cols, y->as<float>(), false, nullptr);
    {
      const auto got = download<float>(*y, static_cast<size_t>(kTok * s.rows));
      int64_t bad = 0;
      for (int64_t i = 0; i < kTok * s.rows; ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(bad, 0) << "fp8_gemv: results differing from the host order";
    }
    // accumulating: y + the same bits (one token: its own configuration)
    for (const int64_t n_acc : {int64_t{1}, std::min<int64_t>(3, kTok)}) {
      const std::vector<float> y0 = random_floats(static_cast<size_t>(n_acc * s.rows), 17);
      const DeviceBuffer ya = upload(y0);
      fp8_gemv_stream(q.as<uint8_t>(), xt, xd.data(), n_acc, s.rows, s.cols, ya.as<float>(), true, nullptr);
      const auto acc = download<float>(ya, static_cast<size_t>(n_acc * s.rows));
      for (int64_t i = 0; i < n_acc * s.rows; ++i) {
        ASSERT_EQ(acc[i], y0[i] + want[i]) << n_acc << " tokens accumulated, entry " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(XTypes, Fp8GemvStream, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// Every configuration bench_fp8_kernels times (one token, bf16 x) gives
// fp8_gemv's bits.
TEST(Fp8GemvStreamVariants, GiveFp8GemvsBits) {
  RILL_REQUIRE_GPU();
  for (const Shape s :
       {Shape{140001, 16}, Shape{9000, 64}, Shape{4500, 2048}, Shape{300, 4096}, Shape{33, 14336}, Shape{5, 2064}}) {
    SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols));
    const DeviceBuffer q = make_weights(s, 41);
    std::vector<float> x = random_floats(static_cast<size_t>(s.cols), 43);
    for (float& v : x) v = round_to(DType::kBF16, v);
    const DeviceBuffer xd = upload(encode(DType::kBF16, x));
    auto y = DeviceBuffer::allocate(static_cast<size_t>(s.rows) * 4, "y");
    auto yv = DeviceBuffer::allocate(static_cast<size_t>(s.rows) * 4, "yv");
    ASSERT_TRUE(y.ok() && yv.ok());
    fp8_gemv_variant(1, q.as<uint8_t>(), xd.data(), s.rows, s.cols, y->as<float>(), nullptr);  // fp8_gemv's R4U2
    const auto want = download<float>(*y, static_cast<size_t>(s.rows));
    for (int v = 0; v < fp8_gemv_stream_n_variants(); ++v) {
      RILL_CUDA_CHECK(cudaMemset(yv->data(), 0xff, static_cast<size_t>(s.rows) * 4));
      fp8_gemv_stream_variant(v, q.as<uint8_t>(), xd.data(), s.rows, s.cols, yv->as<float>(), nullptr);
      const auto got = download<float>(*yv, static_cast<size_t>(s.rows));
      int64_t bad = 0;
      for (int64_t r = 0; r < s.rows; ++r) bad += std::memcmp(&got[r], &want[r], 4) != 0;
      EXPECT_EQ(bad, 0) << fp8_gemv_stream_variant_name(v) << ": rows differing from fp8_gemv";
    }
  }
}

}  // namespace
}  // namespace rill::cuda
