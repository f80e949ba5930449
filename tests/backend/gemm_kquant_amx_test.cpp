// The AMX int8 K-quant gemm (backend/cpu/gemm_kquant_amx.h) gives the bits
// of the AVX-512 VNNI row tile it replaces, and of the scalar reference, for
// Q4_K, Q5_K, Q6_K and IQ4_XS: shapes with token tails (not multiples of
// the 32-token pass or the 16-token tile), row tails (not multiples of the
// 16-row group), several super-blocks and partial column chunks, extreme
// values; and through the matmul driver. Skipped where AMX is not usable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_kquant_amx.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::random_floats;
using testing::random_weight_rows;

const DType kAmxTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS};

std::vector<uint8_t> quantize_q8k(const std::vector<float>& x, int64_t n, int n_t) {
  std::vector<uint8_t> a(row_bytes(DType::kQ8_K, n) * static_cast<size_t>(n_t));
  for (int c = 0; c < n_t; ++c)
    ref::quantize_row(DType::kQ8_K, x.data() + c * n, a.data() + c * row_bytes(DType::kQ8_K, n), n);
  return a;
}

#define SKIP_WITHOUT_AMX()                                                                  \
  if (!kquant_amx_usable())                                                                 \
  GTEST_SKIP() << "AMX int8 is not usable here (CPUID AMX-TILE/AMX-INT8, XCR0 tile state, " \
                  "AVX-512 VNNI or Linux's arch_prctl(ARCH_REQ_XCOMP_PERM) permission missing)"

// AMX entry vs the VNNI row tile vs the reference, bit for bit, y strided
// with guard values past the rows and one guard token row past the last.
void expect_amx_equals_row_tile(DType t, const std::vector<uint8_t>& w, int64_t n, int n_r,
                                const std::vector<uint8_t>& a, int n_t) {
  const size_t ws = row_bytes(t, n), as = row_bytes(DType::kQ8_K, n);
  const int64_t ys = n_r + 3;
  std::vector<float> amx(static_cast<size_t>(ys * (n_t + 1)), -7.0f), vnni(amx), want(amx);
  kquant_amx_gemm(t)(n, w.data(), ws, n_r, a.data(), as, n_t, amx.data(), ys);
  kquant_amx_fallback(t)(n, w.data(), ws, n_r, a.data(), as, n_t, vnni.data(), ys);
  ref::gemm_tile(t, n, w.data(), ws, n_r, a.data(), as, n_t, want.data(), ys);
  ASSERT_EQ(std::memcmp(vnni.data(), want.data(), want.size() * 4), 0) << dtype_name(t) << ": row tile vs reference";
  for (int64_t r = 0; r < ys; ++r) ASSERT_EQ(amx[n_t * ys + r], -7.0f) << dtype_name(t) << ": wrote past the tokens";
  for (int c = 0; c < n_t; ++c)
    for (int64_t r = 0; r < ys; ++r)
      ASSERT_EQ(std::memcmp(&amx[c * ys + r], &vnni[c * ys + r], 4), 0)
          << dtype_name(t) << " n=" << n << " " << n_r << " rows x " << n_t << " tokens, at row " << r << " token " << c
          << ": " << amx[c * ys + r] << " vs " << vnni[c * ys + r];
}

void expect_random_case(DType t, int64_t n, int n_r, int n_t, uint32_t seed) {
  const auto w = random_weight_rows(t, n_r, n, seed);
  const auto a = quantize_q8k(random_floats(n * n_t, seed + 1, -3.0f, 3.0f), n, n_t);
  expect_amx_equals_row_tile(t, w, n, n_r, a, n_t);
}

TEST(KQuantAmx, EqualsRowTileWithTails) {
  SKIP_WITHOUT_AMX();
  uint32_t seed = 300;
  for (DType t : kAmxTypes) {
    ASSERT_NE(kquant_amx_gemm(t), nullptr);
    ASSERT_NE(kquant_amx_fallback(t), nullptr);
    expect_random_case(t, 256, 1, 32, seed++);    // one super-block, one row, one full pass
    expect_random_case(t, 512, 16, 48, seed++);   // a full row group, a half pass
    expect_random_case(t, 2304, 37, 70, seed++);  // 9 super-blocks (a chunk and a tail), rows 37, tokens 70
    expect_random_case(t, 4352, 20, 33, seed++);  // 17 super-blocks, one token past a pass
    expect_random_case(t, 768, 45, 47, seed++);   // 3 super-blocks, tokens 47 (a 15-token second tile)
    // Fewer tokens than a pass: the fallback, the same bits.
    expect_random_case(t, 512, 9, kquant_amx_min_tokens() - 1, seed++);
  }
}

// The largest magnitudes each type's weights reach (|scale x value| up to
// 4096: both split parts at their ends) against activations of +-127.
TEST(KQuantAmx, EqualsRowTileAtExtremeValues) {
  SKIP_WITHOUT_AMX();
  const int64_t n = 512;
  constexpr int kR = 19, kT = 35;
  for (DType t : kAmxTypes) {
    for (int variant = 0; variant < 2; ++variant) {
      auto w = random_weight_rows(t, kR, n, 11);
      const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
      for (size_t b = 0; b < w.size() / bb; ++b) {
        uint8_t* blk = w.data() + b * bb;
        if (t == DType::kQ6_K) {
          std::memset(blk, variant ? 0x00 : 0xFF, 192);                                 // q = 0 (q - 32 = -32) or 63
          for (int j = 0; j < 16; ++j) blk[192 + j] = (j + variant) % 2 ? 0x80 : 0x7F;  // scales -128 / 127
        } else if (t == DType::kIQ4_XS) {
          // scales_h, scales_l: s = 0 (s - 32 = -32) or 63; values -127 (nibble 0) or 113 (15)
          std::memset(blk + 2, variant ? 0x00 : 0xFF, 6);
          std::memset(blk + 8, variant ? 0x00 : 0xFF, bb - 8);
        } else {
          std::memset(blk + 4, 0xFF, bb - 4);  // scales and mins 63, q = 15 (31)
        }
      }
      std::vector<float> x(static_cast<size_t>(n * kT));
      for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 3 + static_cast<size_t>(variant)) % 2 ? 1.0f : -1.0f;
      expect_amx_equals_row_tile(t, w, n, kR, quantize_q8k(x, n, kT), kT);
    }
  }
}

// A CPU whose CPUID and XCR0 offer AMX int8 (and AVX-512 VNNI) must get
// the path: a permission request or feature check that broke would
// otherwise only make the tests above skip.
TEST(KQuantAmx, UsableWhereverTheCpuOffersIt) {
  const CpuFeatures& f = cpu_features();
  if (!f.amx_int8 || !f.avx512_vnni) GTEST_SKIP() << "this CPU offers no AMX int8 with AVX-512 VNNI";
  EXPECT_TRUE(kquant_amx_usable()) << "CPUID and XCR0 offer AMX int8, but the Linux permission request failed";
}

// RILL_CPU_AMX takes 0 or 1 (or nothing); the CLI refuses anything else.
TEST(KQuantAmx, EnvSwitchTakesZeroOrOne) {
  const char* old = std::getenv("RILL_CPU_AMX");
  const std::string saved = old ? old : "";
  for (const char* ok : {"0", "1"}) {
    ::setenv("RILL_CPU_AMX", ok, 1);
    EXPECT_FALSE(kquant_amx_env_error().has_value()) << ok;
  }
  for (const char* bad : {"yes", "", "2", "01"}) {
    ::setenv("RILL_CPU_AMX", bad, 1);
    const auto err = kquant_amx_env_error();
    ASSERT_TRUE(err.has_value()) << "'" << bad << "'";
    EXPECT_NE(err->find("RILL_CPU_AMX"), std::string::npos) << *err;
  }
  ::unsetenv("RILL_CPU_AMX");
  EXPECT_FALSE(kquant_amx_env_error().has_value());
  if (old) ::setenv("RILL_CPU_AMX", saved.c_str(), 1);
}

// Through the matmul driver (row chunks, 2 threads) with the process's
// table: when it holds the AMX entry, every output equals the reference's
// bits on the same Q8_K activations (which the row tile's also do).
TEST(KQuantAmx, MatmulDriverEqualsReference) {
  SKIP_WITHOUT_AMX();
  const char* env = std::getenv("RILL_CPU_AMX");
  const bool installed = env == nullptr || std::strcmp(env, "0") != 0;
  const int64_t n_rows = 150, n_cols = 2304, n_tokens = 77;
  for (DType t : kAmxTypes) {
    EXPECT_EQ(kernels().gemm[static_cast<size_t>(t)] == kquant_amx_gemm(t), installed) << dtype_name(t);
    const auto w = random_weight_rows(t, n_rows, n_cols, 91);
    const auto x = random_floats(n_cols * n_tokens, 92, -2.0f, 2.0f);
    const WeightView view{t, n_rows, n_cols, w.data(), row_bytes(t, n_cols)};
    ThreadPool pool(2);
    Scratch scratch;
    scratch.reserve(matmul_scratch_bytes(t, n_cols, n_tokens));
    std::vector<float> got(static_cast<size_t>(n_rows * n_tokens)), want(got.size());
    matmul(view, x.data(), n_tokens, got.data(), pool, scratch);
    const auto a = quantize_q8k(x, n_cols, static_cast<int>(n_tokens));
    ref::gemm_tile(t, n_cols, w.data(), view.row_stride, static_cast<int>(n_rows), a.data(),
                   row_bytes(DType::kQ8_K, n_cols), static_cast<int>(n_tokens), want.data(), n_rows);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << dtype_name(t);
  }
}

}  // namespace
}  // namespace rill::cpu
