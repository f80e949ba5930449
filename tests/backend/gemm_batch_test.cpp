// Batched gemm calls give exactly the bits of one call per token row (the
// engine's batch invariance, and llama.cpp parity, rest on it), for every
// ISA's gemm, every weight type, call shapes spanning many register tiles,
// lone leftover token rows, and rows too long for the AVX-512 path's
// per-call token table.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quants.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::random_weight_rows;

const DType kTypes[] = {DType::kQ4_0,   DType::kQ4_1,   DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                        DType::kQ4_K,   DType::kQ5_K,   DType::kQ6_K, DType::kQ2_K, DType::kQ3_K,
                        DType::kIQ4_XS, DType::kIQ4_NL, DType::kF16};

void expect_batched_equals_single(Isa isa, DType t, int64_t n, int n_r, int n_t, uint32_t seed) {
  const DType p = vec_dot_partner(t);
  const auto w = random_weight_rows(t, n_r, n, seed);
  const auto x = random_floats(n * n_t, seed + 1, -3.0f, 3.0f);
  const size_t ws = row_bytes(t, n);
  const size_t as = p == DType::kF32 ? static_cast<size_t>(n) * 4 : row_bytes(p, n);
  std::vector<uint8_t> a(as * static_cast<size_t>(n_t));
  for (int c = 0; c < n_t; ++c) ref::quantize_row(p, x.data() + c * n, a.data() + c * as, n);
  const GemmTileFn gemm = kernels(isa).gemm[static_cast<size_t>(t)];
  ASSERT_NE(gemm, nullptr);
  const int64_t ys = n_r + 5;  // a stride wider than the rows: nothing else is written
  std::vector<float> batched(static_cast<size_t>(ys * n_t), -7.0f), single(batched.size(), -7.0f);
  gemm(n, w.data(), ws, n_r, a.data(), as, n_t, batched.data(), ys);
  for (int c = 0; c < n_t; ++c) gemm(n, w.data(), ws, n_r, a.data() + c * as, as, 1, single.data() + c * ys, ys);
  for (int c = 0; c < n_t; ++c)
    for (int64_t r = 0; r < ys; ++r) {
      const float b = batched[c * ys + r], s = single[c * ys + r];
      ASSERT_EQ(std::memcmp(&b, &s, 4), 0)
          << isa_name(isa) << " " << dtype_name(t) << " n=" << n << " rows " << n_r << " tokens " << n_t << " at row "
          << r << " token " << c << ": " << b << " vs " << s;
    }
}

TEST(GemmBatch, BatchedCallsEqualOneTokenCalls) {
  uint32_t seed = 11;
  for (Isa isa : available_isas()) {
    for (DType t : kTypes) {
      for (int64_t n : {256, 576, 1536}) {
        for (int n_r : {1, 3, 4, 9, 64}) {
          for (int n_t : {2, 3, 4, 5, 7, 8, 9, 13, 16, 17}) {
            if (isa == Isa::kScalar && (n_r > 4 || n_t > 4)) continue;  // slow; the shape logic is shared
            expect_batched_equals_single(isa, t, n, n_r, n_t, seed++);
          }
        }
      }
    }
  }
}

// 8224 columns = 257 blocks of 32: past the AVX-512 token scale table (256
// blocks); 2080 = 65 blocks: past the signed types' start table (64 blocks)
// but within the scale table.
TEST(GemmBatch, LongRowsEqualOneTokenCalls) {
  for (Isa isa : available_isas()) {
    if (isa == Isa::kScalar) continue;
    for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0}) {
      for (int64_t n : {2080, 8224}) {
        for (int n_t : {2, 5, 8, 9, 18})
          expect_batched_equals_single(isa, t, n, 6, n_t, 100 + static_cast<uint32_t>(n_t));
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
