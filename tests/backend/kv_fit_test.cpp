// kv_fit.h: the rotated encoder's candidate errors on AVX-512 and AVX2 are
// the scalar loop's bits, on the blocks that stress each rounding: Gaussian
// blocks at the search's own grid, values on the levels' rounding ties,
// subnormal and huge scales, zero scales, and NaN / inf elements.
#include "backend/cpu/kv_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/half.h"

namespace rill::cpu::detail {
namespace {

// Candidate scales as fit_scale makes them: from the block's signed
// maximum onto the first and the last level, times 1 .. 0.6, rounded to
// f16; plus a few the grid never holds (0, an f16 subnormal, f16's largest).
std::vector<float> candidates(const std::vector<float>& x, FitLevels lv) {
  float m = 0.0f, amax = 0.0f;
  for (const float v : x) {
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      m = v;
    }
  }
  if (m == 0.0f) m = 1.0f;
  const float first = lv.nl ? -127.0f : static_cast<float>(lv.lo), last = lv.nl ? 113.0f : static_cast<float>(lv.hi);
  std::vector<float> d;
  for (const float top : {first, last}) {
    for (int i = 0; i <= 16; ++i)
      d.push_back(f16_to_f32(f32_to_f16(m / top * (1.0f - 0.025f * static_cast<float>(i)))));
  }
  d.push_back(0.0f);
  d.push_back(0x1p-24f);
  d.push_back(65504.0f);
  d.push_back(-d[3]);
  return d;
}

using FitErrors = void (*)(const float*, int, const float*, int, FitLevels, double*);
struct Kernel {
  const char* name;
  FitErrors fn;
};
// The vector kernels this CPU runs.
std::vector<Kernel> vector_kernels() {
  std::vector<Kernel> k;
  if (cpu_features().avx512) k.push_back({"avx512", fit_errors_avx512});
  if (cpu_features().avx2) k.push_back({"avx2", fit_errors_avx2});
  return k;
}

TEST(KvFit, VectorCandidateErrorsAreTheScalarBits) {
  if (vector_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const Kernel& k : vector_kernels()) {
    SCOPED_TRACE(k.name);
    std::mt19937 rng(29);
    std::normal_distribution<float> nd;
    std::uniform_int_distribution<int> pick(0, 7);
    const FitLevels level_sets[] = {{false, -8, 7}, {false, -127, 127}, {true, 0, 15}};
    const float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
    int compared = 0;
    for (const int n : {32, 64}) {
      for (const FitLevels lv : level_sets) {
        for (int trial = 0; trial < 400; ++trial) {
          std::vector<float> x(static_cast<size_t>(n));
          const int kind = trial % 8;
          const float scale = kind == 5 ? 1e-6f : kind == 6 ? 3e4f : 1.0f;
          for (float& v : x) v = nd(rng) * scale;
          if (kind == 1) {  // values on the levels' ties: k + 0.5 steps of the first candidate
            const float d = candidates(x, lv)[0];
            for (float& v : x) v = (std::floor(v / d) + 0.5f) * d;
          }
          if (kind == 2) x[static_cast<size_t>(pick(rng))] = kNan;
          if (kind == 3) x[static_cast<size_t>(pick(rng))] = pick(rng) % 2 ? kInf : -kInf;
          if (kind == 4) std::fill(x.begin() + n / 2, x.end(), 0.0f);  // half a block of zeros
          if (kind == 7) x[static_cast<size_t>(pick(rng))] = -0.0f;
          const std::vector<float> d = candidates(x, lv);
          const int n_d = static_cast<int>(d.size());
          std::vector<double> want(d.size()), got(d.size(), -1.0);
          fit_errors_ref(x.data(), n, d.data(), n_d, lv, want.data());
          k.fn(x.data(), n, d.data(), n_d, lv, got.data());
          for (int c = 0; c < n_d; ++c) {
            // Bits, except that any NaN matches any NaN (a NaN error never wins).
            if (std::isnan(want[static_cast<size_t>(c)])) {
              EXPECT_TRUE(std::isnan(got[static_cast<size_t>(c)])) << n << " " << lv.nl << " " << trial << " " << c;
            } else {
              EXPECT_EQ(0, std::memcmp(&want[static_cast<size_t>(c)], &got[static_cast<size_t>(c)], sizeof(double)))
                  << "n " << n << " nl " << lv.nl << " lo " << lv.lo << " trial " << trial << " candidate " << c << ": "
                  << want[static_cast<size_t>(c)] << " against " << got[static_cast<size_t>(c)];
            }
            ++compared;
          }
        }
      }
    }
    EXPECT_EQ(compared, 2 * 3 * 400 * 38);
  }
}

// Fewer candidates than a vector, and more than a kernel's groups hold
// (the scalar loop takes those): the same bits.
TEST(KvFit, VectorKernelsTakeAnyCandidateCount) {
  if (vector_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const Kernel& k : vector_kernels()) {
    SCOPED_TRACE(k.name);
    std::mt19937 rng(31);
    std::normal_distribution<float> nd;
    std::vector<float> x(32);
    for (float& v : x) v = nd(rng);
    for (const int n_d : {1, 7, 8, 9, 64, 65, 100}) {
      std::vector<float> d(static_cast<size_t>(n_d));
      for (int c = 0; c < n_d; ++c) d[static_cast<size_t>(c)] = f16_to_f32(f32_to_f16(0.01f + 0.003f * c));
      std::vector<double> want(d.size()), got(d.size() + 1, -7.0);
      fit_errors_ref(x.data(), 32, d.data(), n_d, {false, -127, 127}, want.data());
      k.fn(x.data(), 32, d.data(), n_d, {false, -127, 127}, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(double))) << n_d;
      EXPECT_EQ(got.back(), -7.0) << "wrote past err[" << n_d << "]";
    }
  }
}

// k4c / k4a's K codes in each vector kernel's lanes: the scalar codes and
// squared errors, bit for bit, at every width (1..8 bits), on Gaussian
// channels, channels on the codes' rounding ties, zero steps, NaN and inf
// values, and zeros far above or below the values (every code clamped).
TEST(KvFit, VectorChanCodesAreTheScalarBits) {
  using ChanCodes = void (*)(const float*, float, float, float, int, int*, double*);
  std::vector<std::pair<const char*, ChanCodes>> kernels;
  if (cpu_features().avx512) kernels.emplace_back("avx512", chan_codes_avx512);
  if (cpu_features().avx2) kernels.emplace_back("avx2", chan_codes_avx2);
  if (kernels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const auto& [name, kernel] : kernels) {
    SCOPED_TRACE(name);
    std::mt19937 rng(37);
    std::normal_distribution<float> nd;
    const float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
    int compared = 0;
    for (int bits = 1; bits <= 8; ++bits) {
      const int levels = (1 << bits) - 1;
      for (int trial = 0; trial < 200; ++trial) {
        float x[32];
        for (float& v : x) v = nd(rng);
        const int kind = trial % 6;
        float zf = f16_to_f32(f32_to_f16(-2.5f));
        float step = kind == 2 ? 0.0f : 5.0f / static_cast<float>(levels);
        if (kind == 1) {  // ties: x on zf + (k + 0.5) step
          for (int j = 0; j < 32; ++j) x[j] = zf + (static_cast<float>(j % (levels + 1)) + 0.5f) * step;
        }
        if (kind == 3) {
          x[trial % 32] = kNan;
          x[(trial + 5) % 32] = trial % 2 ? kInf : -kInf;
        }
        if (kind == 4) zf = 40.0f;   // every code clamped to 0
        if (kind == 5) zf = -40.0f;  // every code clamped to the top
        const float inv = step > 0.0f ? 1.0f / step : 0.0f;
        int want_code[32], got_code[32];
        double want_sq[32], got_sq[32];
        chan_codes_ref(x, zf, step, inv, levels, want_code, want_sq);
        kernel(x, zf, step, inv, levels, got_code, got_sq);
        for (int j = 0; j < 32; ++j) {
          ASSERT_EQ(want_code[j], got_code[j]) << "bits " << bits << " trial " << trial << " j " << j;
          if (std::isnan(want_sq[j])) {
            ASSERT_TRUE(std::isnan(got_sq[j])) << bits << " " << trial << " " << j;
          } else {
            ASSERT_EQ(0, std::memcmp(&want_sq[j], &got_sq[j], sizeof(double)))
                << "bits " << bits << " trial " << trial << " j " << j << ": " << want_sq[j] << " against "
                << got_sq[j];
          }
          ++compared;
        }
      }
    }
    EXPECT_EQ(compared, 8 * 200 * 32);
  }
}

}  // namespace
}  // namespace rill::cpu::detail
