// matmul (best ISA, through the pool) against a naive f64 reference over
// several shapes, weight types and thread counts; get_rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::random_floats;
using testing::random_weight_rows;

struct Shape {
  int64_t n_rows, n_cols, n_tokens;
};

// y_ref[t, r] = sum_c W[r, c] * a[t, c] in f64, with a the activations after
// the same quantization matmul applies (so only summation order differs).
// Q4_1/Q5_1 take their m * sum(a) term from Q8_1's stored s = f16(d * sum(q))
// as llama.cpp does, so the reference does too: m is zeroed in the
// dequantized weights and m_b * s_b added per block.
void check_matmul(DType t, const Shape& s, int n_threads) {
  const auto w = random_weight_rows(t, s.n_rows, s.n_cols, static_cast<uint32_t>(s.n_rows * 31 + s.n_cols));
  const auto x = random_floats(s.n_cols * s.n_tokens, static_cast<uint32_t>(s.n_tokens));
  WeightView view{t, s.n_rows, s.n_cols, w.data(), row_bytes(t, s.n_cols)};

  const DType p = vec_dot_partner(t);
  const bool has_m = p == DType::kQ8_1;
  const int64_t n_blocks = s.n_cols / 32;
  std::vector<float> wf(static_cast<size_t>(s.n_rows * s.n_cols));
  std::vector<float> wm(has_m ? static_cast<size_t>(s.n_rows * n_blocks) : 0);  // m of each block
  std::vector<uint8_t> w_no_m = w;
  const size_t block_bytes = static_cast<size_t>(dtype_info(t).block_bytes);
  if (has_m) {
    for (int64_t b = 0; b < s.n_rows * n_blocks; ++b) {
      uint16_t m;
      std::memcpy(&m, w.data() + b * block_bytes + 2, 2);
      wm[b] = f16_to_f32(m);
      std::memset(w_no_m.data() + b * block_bytes + 2, 0, 2);
    }
  }
  for (int64_t r = 0; r < s.n_rows; ++r)
    dequantize_row(t, w_no_m.data() + r * view.row_stride, wf.data() + r * s.n_cols, s.n_cols);
  std::vector<float> af(x.size());
  std::vector<float> as(has_m ? static_cast<size_t>(s.n_tokens * n_blocks) : 0);  // Q8_1 s per block
  std::vector<uint8_t> qa(p == DType::kF32 ? 0 : row_bytes(p, s.n_cols));
  for (int64_t i = 0; i < s.n_tokens; ++i) {
    if (p == DType::kF32) {
      std::copy_n(x.data() + i * s.n_cols, s.n_cols, af.data() + i * s.n_cols);
    } else {
      ref::quantize_row(p, x.data() + i * s.n_cols, qa.data(), s.n_cols);
      dequantize_row(p, qa.data(), af.data() + i * s.n_cols, s.n_cols);
      if (has_m)
        for (int64_t b = 0; b < n_blocks; ++b)
          as[i * n_blocks + b] = f16_to_f32(reinterpret_cast<BlockQ8_1*>(qa.data())[b].s);
    }
  }

  ThreadPool pool(n_threads);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(t, s.n_cols, s.n_tokens));
  const int64_t y_stride = s.n_rows + 3;  // a strided output
  std::vector<float> y(static_cast<size_t>(y_stride * s.n_tokens), -7.0f);
  matmul(view, x.data(), s.n_tokens, y.data(), pool, scratch, y_stride);

  for (int64_t i = 0; i < s.n_tokens; ++i) {
    for (int64_t r = 0; r < s.n_rows; ++r) {
      double want = 0.0, mag = 0.0;
      for (int64_t c = 0; c < s.n_cols; ++c) {
        const double prod = static_cast<double>(wf[r * s.n_cols + c]) * af[i * s.n_cols + c];
        want += prod;
        mag += std::fabs(prod);
      }
      for (int64_t b = 0; has_m && b < n_blocks; ++b) {
        const double prod = static_cast<double>(wm[r * n_blocks + b]) * as[i * n_blocks + b];
        want += prod;
        mag += std::fabs(prod);
      }
      ASSERT_NEAR(y[i * y_stride + r], want, 1e-5 * mag + 1e-6)
          << dtype_name(t) << " " << s.n_rows << "x" << s.n_cols << " tokens " << s.n_tokens << " threads " << n_threads
          << " at token " << i << " row " << r;
    }
    for (int64_t r = s.n_rows; r < y_stride; ++r) ASSERT_EQ(y[i * y_stride + r], -7.0f) << "wrote past n_rows";
  }
}

TEST(Matmul, AllTypesMatchF64Reference) {
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                         DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  for (DType t : types) {
    for (const Shape& s : {Shape{37, 256, 1}, Shape{64, 512, 5}, Shape{13, 256, 9}}) {
      for (int threads : {1, 2, 3}) check_matmul(t, s, threads);
    }
  }
}

TEST(Matmul, DefaultModelShapes) {
  // SmolLM2-135M: q/o [576 x 576], k/v [192 x 576], down [576 x 1536]; decode and a prefill chunk.
  for (const Shape& s : {Shape{576, 576, 1}, Shape{192, 576, 1}, Shape{576, 1536, 1}, Shape{192, 576, 70}}) {
    check_matmul(DType::kQ4_1, s, 2);
  }
  check_matmul(DType::kQ8_0, Shape{1000, 576, 1}, 2);
  check_matmul(DType::kQ8_0, Shape{100, 576, 33}, 2);
}

TEST(Matmul, GroupEqualsSeparateCalls) {
  for (int64_t n_tokens : {1, 6, 37}) {
    const int64_t n_cols = 576;
    const auto wq = random_weight_rows(DType::kQ4_1, 576, n_cols, 1);
    const auto wk = random_weight_rows(DType::kQ4_1, 192, n_cols, 2);
    const auto wv = random_weight_rows(DType::kQ5_1, 64, n_cols, 3);  // same partner (Q8_1)
    const WeightView vq{DType::kQ4_1, 576, n_cols, wq.data(), row_bytes(DType::kQ4_1, n_cols)};
    const WeightView vk{DType::kQ4_1, 192, n_cols, wk.data(), row_bytes(DType::kQ4_1, n_cols)};
    const WeightView vv{DType::kQ5_1, 64, n_cols, wv.data(), row_bytes(DType::kQ5_1, n_cols)};
    const auto x = random_floats(n_cols * n_tokens, 4);
    ThreadPool pool(2);
    Scratch scratch;
    scratch.reserve(matmul_scratch_bytes(DType::kQ4_1, n_cols, n_tokens));
    std::vector<float> yq(576 * n_tokens), yk(192 * n_tokens), yv(64 * n_tokens);
    const WeightView* ws[] = {&vq, &vk, &vv};
    float* ys[] = {yq.data(), yk.data(), yv.data()};
    matmul_group(ws, ys, 3, x.data(), n_tokens, pool, scratch);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> want(ws[i]->n_rows * n_tokens);
      matmul(*ws[i], x.data(), n_tokens, want.data(), pool, scratch);
      for (size_t e = 0; e < want.size(); ++e) ASSERT_EQ(ys[i][e], want[e]) << "matrix " << i << " tokens " << n_tokens;
    }
  }
}

// The K-quants' (and IQ4_XS's) batch tiles take a whole prefill per call
// (Kernels::gemm_max_tokens): through the driver, on 2 threads, a 150-token
// matmul (token blocks, column chunks, partial row groups) gives every token
// the bits it gets alone.
TEST(Matmul, KQuantPrefillEqualsOneTokenAtATime) {
  const int64_t n_rows = 200, n_cols = 2304, n_tokens = 150;
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
    const auto w = random_weight_rows(t, n_rows, n_cols, 77);
    const auto x = random_floats(n_cols * n_tokens, 78);
    const WeightView view{t, n_rows, n_cols, w.data(), row_bytes(t, n_cols)};
    ThreadPool pool(2);
    Scratch scratch;
    scratch.reserve(matmul_scratch_bytes(t, n_cols, n_tokens));
    std::vector<float> batched(static_cast<size_t>(n_rows * n_tokens)), alone(static_cast<size_t>(n_rows));
    matmul(view, x.data(), n_tokens, batched.data(), pool, scratch);
    for (int64_t c = 0; c < n_tokens; ++c) {
      matmul(view, x.data() + c * n_cols, 1, alone.data(), pool, scratch);
      ASSERT_EQ(std::memcmp(alone.data(), batched.data() + c * n_rows, alone.size() * 4), 0)
          << dtype_name(t) << ": token " << c << " differs from its one-token matmul";
    }
  }
}

TEST(GetRows, GathersDequantizedRows) {
  const int64_t n_rows = 10, n_cols = 64;
  const auto w = random_weight_rows(DType::kQ8_0, n_rows, n_cols, 3);
  WeightView view{DType::kQ8_0, n_rows, n_cols, w.data(), row_bytes(DType::kQ8_0, n_cols)};
  const int32_t ids[] = {7, 0, 7, 9};
  std::vector<float> out(4 * n_cols), row(n_cols);
  get_rows(view, ids, 4, out.data());
  for (int i = 0; i < 4; ++i) {
    dequantize_row(DType::kQ8_0, w.data() + ids[i] * view.row_stride, row.data(), n_cols);
    for (int64_t c = 0; c < n_cols; ++c) ASSERT_EQ(out[i * n_cols + c], row[c]);
  }
}

}  // namespace
}  // namespace rill::cpu
