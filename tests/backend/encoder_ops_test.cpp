// The encoder ops of backend/backend.h (layer_norm, gelu_erf, add,
// attention_bidirectional) on the CPU Backend against plain double-precision
// references, on seeded random inputs; a step of two sequences checks that
// attention stays inside each sequence and sees both directions. Other
// Backends report has_encoder_ops() false until they implement them (and
// would then join tests/backend/backend_ops_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace rill {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(EncoderOps, CpuHasThemAndTheBaseBackendDoesNot) {
  EXPECT_TRUE(make_cpu_backend(1)->has_encoder_ops());
  struct Bare : Backend {  // only the pure virtuals: what a Backend without encoder ops inherits
    const char* name() const override { return "bare"; }
    DType act_dtype() const override { return DType::kF32; }
    AttentionRouting attention_routing(DType, int32_t) const override { return {}; }
    Result<Weight> place(const HostMatrix*, int, const std::string&) override { return Weight{}; }
    Result<Vec> place_vector(const float*, int64_t, const std::string&) override { return Vec{}; }
    Result<Rope> place_rope(const RopeTable&) override { return Rope{}; }
    Status reserve(const StepLimits&) override { return {}; }
    Result<Buffer> allocate(size_t, const std::string&) override { return Buffer{}; }
    Status copy_in(void*, const void*, size_t) override { return {}; }
    Status copy_out(void*, const void*, size_t) override { return {}; }
    void embed(const Weight&, const int32_t*, int64_t, Tensor) override {}
    void rms_norm(Tensor, const int32_t*, Vec, float, float, Tensor) override {}
    Status matmul(const Weight&, Tensor, Tensor, bool, Vec) override { return {}; }
    void add_bias(Tensor, Vec) override {}
    void rope_store_kv(const RopeKvOp&, const StepMetadata&) override {}
    void attention(const AttentionOp&, const StepMetadata&) override {}
    void glu(Glu, Tensor, Tensor) override {}
    void softcap(Tensor, float) override {}
    void scale(Tensor, float) override {}
    void post_norm_add(Tensor, Vec, Tensor, Vec, float, float, Tensor) override {}
  };
  EXPECT_FALSE(Bare{}.has_encoder_ops());
}

TEST(EncoderOps, LayerNormGeluAndAddMatchDoubleReferences) {
  auto b = make_cpu_backend(2);
  const int64_t rows = 5, cols = 384;
  std::vector<float> x = random_floats(rows * cols, 1, 3.0f), w = random_floats(cols, 2), bias = random_floats(cols, 3);
  for (int64_t i = 0; i < cols; ++i) x[static_cast<size_t>(i)] += 10.0f;  // a row with a large mean
  auto wv = b->place_vector(w.data(), cols, "w");
  auto bv = b->place_vector(bias.data(), cols, "b");
  ASSERT_TRUE(wv.ok() && bv.ok());
  std::vector<float> out(x.size());
  b->layer_norm(Tensor::dense(x.data(), DType::kF32, rows, cols), *wv, *bv, 1e-12f,
                Tensor::dense(out.data(), DType::kF32, rows, cols));
  std::vector<float> want(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) mean += row[i];
    mean /= double(cols);
    for (int64_t i = 0; i < cols; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= double(cols);
    for (int64_t i = 0; i < cols; ++i)
      want[static_cast<size_t>(r * cols + i)] = static_cast<float>(
          (row[i] - mean) / std::sqrt(var + 1e-12) * w[static_cast<size_t>(i)] + bias[static_cast<size_t>(i)]);
  }
  const float tol = 1e-5f * max_abs(want);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], tol) << i;

  // In place (out aliases x) gives the same bits.
  std::vector<float> in_place = x;
  b->layer_norm(Tensor::dense(in_place.data(), DType::kF32, rows, cols), *wv, *bv, 1e-12f,
                Tensor::dense(in_place.data(), DType::kF32, rows, cols));
  EXPECT_EQ(in_place, out);

  std::vector<float> g = x;
  b->gelu_erf(Tensor::dense(g.data(), DType::kF32, rows, cols));
  for (size_t i = 0; i < g.size(); ++i) {
    const double v = x[i];
    ASSERT_NEAR(g[i], 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))), 1e-5 * std::max(1.0, std::fabs(v))) << i;
  }

  std::vector<float> y = random_floats(x.size(), 4), sum = y;
  b->add(Tensor::dense(sum.data(), DType::kF32, rows, cols), Tensor::dense(x.data(), DType::kF32, rows, cols));
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(sum[i], y[i] + x[i]);
}

TEST(EncoderOps, BidirectionalAttentionStaysInsideEachSequence) {
  auto b = make_cpu_backend(2);
  const int32_t n_head = 3, hd = 8, width = n_head * hd;
  const int32_t q_start[] = {0, 7}, q_len[] = {7, 4}, kv_len[] = {7, 4};
  const int32_t n = 11;
  std::vector<float> qkv = random_floats(static_cast<size_t>(n) * 3 * width, 5, 2.0f);
  std::vector<float> out(static_cast<size_t>(n) * width);
  StepMetadata md;
  md.n_tokens = n;
  md.n_seqs = 2;
  md.q_start = q_start;
  md.q_len = q_len;
  md.kv_len = kv_len;
  BidirectionalAttentionOp op;
  op.qkv = Tensor::dense(qkv.data(), DType::kF32, n, 3 * width);
  op.out = Tensor::dense(out.data(), DType::kF32, n, width);
  op.n_head = n_head;
  op.head_dim = hd;
  op.scale = 1.0f / std::sqrt(float(hd));
  b->attention_bidirectional(op, md);
  for (int s = 0; s < 2; ++s) {
    for (int32_t i = q_start[s]; i < q_start[s] + q_len[s]; ++i) {
      for (int32_t h = 0; h < n_head; ++h) {
        std::vector<double> p;
        double best = -1e300, total = 0;
        for (int32_t j = q_start[s]; j < q_start[s] + q_len[s]; ++j) {  // every key of the sequence, both ways
          double dot = 0;
          for (int32_t d = 0; d < hd; ++d)
            dot += double(qkv[static_cast<size_t>(i * 3 * width + h * hd + d)]) *
                   qkv[static_cast<size_t>(j * 3 * width + width + h * hd + d)];
          p.push_back(dot * op.scale);
          best = std::max(best, p.back());
        }
        for (double& v : p) total += (v = std::exp(v - best));
        for (int32_t d = 0; d < hd; ++d) {
          double want = 0;
          for (int32_t j = 0; j < q_len[s]; ++j)
            want += p[static_cast<size_t>(j)] / total *
                    qkv[static_cast<size_t>((q_start[s] + j) * 3 * width + 2 * width + h * hd + d)];
          ASSERT_NEAR(out[static_cast<size_t>(i * width + h * hd + d)], want, 1e-5) << "token " << i << " head " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill
