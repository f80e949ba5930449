// Quantized KV (issue 22): the store path's blocks against gguf.quants
// (tools/make_kv_quant_goldens.py), the Hadamard rotation, and attention
// over every KV type against f32 attention, within stated bounds, on a
// paged layout, with sliding windows, and batch invariant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace rill::cpu {
namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<float> floats_from_hex(const std::string& hex) {
  const auto b = from_hex(hex);
  std::vector<float> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

struct Named {
  const char* name;
  DType t;
};
constexpr Named kGoldenTypes[] = {{"F16", DType::kF16},   {"BF16", DType::kBF16}, {"Q8_0", DType::kQ8_0},
                                  {"Q4_0", DType::kQ4_0}, {"Q4_1", DType::kQ4_1}, {"Q5_0", DType::kQ5_0},
                                  {"Q5_1", DType::kQ5_1}};

TEST(KvQuant, StoreMatchesGgufQuantize) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/quants/kv_quant.json");
  ASSERT_TRUE(f) << "tests/data/quants/kv_quant.json missing (tools/make_kv_quant_goldens.py)";
  const auto j = nlohmann::json::parse(f);
  const int64_t n_rows = j["n_rows"], width = j["width"];
  const std::vector<float> x = floats_from_hex(j["input_hex"]);
  ASSERT_EQ(static_cast<int64_t>(x.size()), n_rows * width);
  for (const Named& n : kGoldenTypes) {
    SCOPED_TRACE(n.name);
    const auto want = from_hex(j["types"][n.name]["hex"]);
    const auto want_values = floats_from_hex(j["types"][n.name]["values_hex"]);
    const size_t rb = row_bytes(n.t, width);
    ASSERT_EQ(want.size(), rb * static_cast<size_t>(n_rows));
    std::vector<uint8_t> got(want.size());
    for (int64_t r = 0; r < n_rows; ++r) {
      ref::quantize_kv_row(n.t, x.data() + r * width, got.data() + static_cast<size_t>(r) * rb, width);
    }
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i;
    // The attention kernels' dequantizers, every ISA built here, read the same values.
    std::vector<detail::KvDequant> dqs = {detail::kv_dequant_scalar(n.t)};
    if (best_isa() != Isa::kScalar) dqs.push_back(detail::kv_dequant_avx2(n.t));
    for (detail::KvDequant dq : dqs) {
      std::vector<float> v(static_cast<size_t>(width));
      for (int64_t r = 0; r < n_rows; ++r) {
        dq(got.data() + static_cast<size_t>(r) * rb, v.data(), width);
        for (int64_t c = 0; c < width; ++c) {
          const float w = want_values[static_cast<size_t>(r * width + c)];
          ASSERT_NEAR(v[static_cast<size_t>(c)], w, 1e-6f * std::max(1.0f, std::fabs(w))) << r << "," << c;
        }
      }
    }
  }
}

TEST(KvQuant, HadamardIsOrthonormalAndSelfInverse) {
  // Order 4 by hand: H4 / 2.
  float x[4] = {1, 2, 3, 4};
  hadamard_rotate(x, 4);
  EXPECT_FLOAT_EQ(x[0], 5.0f);   // (1+2+3+4)/2
  EXPECT_FLOAT_EQ(x[1], -1.0f);  // (1-2+3-4)/2
  EXPECT_FLOAT_EQ(x[2], -2.0f);  // (1+2-3-4)/2
  EXPECT_FLOAT_EQ(x[3], 0.0f);   // (1-2-3+4)/2
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t n : {32, 64, 128, 256}) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = nd(rng), b[i] = nd(rng);
    double dot0 = 0;
    for (size_t i = 0; i < a.size(); ++i) dot0 += double{a[i]} * b[i];
    std::vector<float> ra = a, rb = b;
    hadamard_rotate(ra.data(), n);
    hadamard_rotate(rb.data(), n);
    double dot1 = 0;
    for (size_t i = 0; i < a.size(); ++i) dot1 += double{ra[i]} * rb[i];
    EXPECT_NEAR(dot1, dot0, 1e-4 * std::sqrt(static_cast<double>(n)));
    hadamard_rotate(ra.data(), n);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(ra[i], a[i], 1e-5f);
  }
}

// Every stored element within the worst case of its block's type: half a
// step of the block's scale plus the scale's f16 rounding times the level,
// a whole step on the short side of q4_0/q5_0 (levels -8..7: the side
// opposite the block's maximum is clipped one step short). A scale taken
// from a wrong maximum or rounded wrongly breaks these on outlier data.
TEST(KvQuant, StoreErrorWithinTheBlockStep) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int64_t n = 64 * 16;
  std::vector<float> x(n), back(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 64 == 5 ? 30.0f : i % 7 == 0 ? 0.01f : 1.0f);
  struct Bound {
    DType t;
    double levels;      // steps from the block's min to max (or max-abs to 0)
    bool asymmetric;    // q4_1 / q5_1: step = (max - min) / levels
    double step_share;  // |error| <= step_share * step
  };
  for (const Bound& b :
       {Bound{DType::kQ8_0, 127, false, 0.5}, Bound{DType::kQ4_0, 8, false, 1.0}, Bound{DType::kQ5_0, 16, false, 1.0},
        Bound{DType::kQ4_1, 15, true, 0.5}, Bound{DType::kQ5_1, 31, true, 0.5}}) {
    SCOPED_TRACE(dtype_name(b.t));
    std::vector<uint8_t> y(row_bytes(b.t, n));
    ref::quantize_kv_row(b.t, x.data(), y.data(), n);
    detail::kv_dequant_scalar(b.t)(y.data(), back.data(), n);
    for (int64_t blk = 0; blk < n / 32; ++blk) {
      const float* xb = x.data() + blk * 32;
      float amax = 0, lo = INFINITY, hi = -INFINITY;
      for (int j = 0; j < 32; ++j)
        amax = std::max(amax, std::fabs(xb[j])), lo = std::min(lo, xb[j]), hi = std::max(hi, xb[j]);
      const double step = b.asymmetric ? (hi - lo) / b.levels : amax / b.levels;
      // f16 scale (and q4_1/q5_1's f16 min): relative 2^-11 each, at most `levels` steps away.
      const double slack = step * b.levels * 0x1p-11 + (b.asymmetric ? std::fabs(lo) * 0x1p-11 : 0.0);
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(double{back[blk * 32 + j]} - xb[j]), b.step_share * step + slack + 1e-7) << blk << "," << j;
      }
    }
  }
}

// Rotated types are rill's own encoding (quantize_rotated_row): levels for
// the least squared error, then a scale that does not shrink the block.
// On the near-Gaussian values of a rotated head that must beat the max-abs
// scale of GGUF's quantizers in squared error (measured on N(0, 1): q4_0
// 0.90x, q8_0 0.96x of the reference's), and no block may come back
// shrunk or grown along itself: x_hat . x = x . x up to the f16 scale.
TEST(KvQuant, RotatedEncoderBeatsMaxAbsScaleUnshrunk) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 512;
  std::vector<float> x(n), back(n), back_ref(n);
  for (float& v : x) v = nd(rng);
  for (const auto& [t, ratio] : {std::pair{DType::kQ4_0, 0.92}, std::pair{DType::kQ8_0, 0.98}}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> y(row_bytes(t, n)), y_ref(row_bytes(t, n));
    quantize_rotated_row(t, x.data(), y.data(), n);
    ref::quantize_kv_row(t, x.data(), y_ref.data(), n);
    detail::kv_dequant_scalar(t)(y.data(), back.data(), n);
    detail::kv_dequant_scalar(t)(y_ref.data(), back_ref.data(), n);
    double se = 0, se_ref = 0;
    for (int64_t blk = 0; blk < n / 32; ++blk) {
      double xx = 0, xy = 0;
      for (int64_t j = blk * 32; j < blk * 32 + 32; ++j) {
        se += (double{back[j]} - x[j]) * (double{back[j]} - x[j]);
        se_ref += (double{back_ref[j]} - x[j]) * (double{back_ref[j]} - x[j]);
        xx += double{x[j]} * x[j];
        xy += double{x[j]} * back[j];
      }
      ASSERT_NEAR(xy / xx, 1.0, 1e-3) << "block " << blk;
    }
    std::printf("%s rotated encoder: %.3fx the max-abs scale's squared error\n", std::string(dtype_name(t)).c_str(),
                se / se_ref);
    EXPECT_LT(se, ratio * se_ref);
  }
}

// iq4_nlh's blocks are GGML's IQ4_NL bytes: the KV decoder reads them as
// the weights' reference dequantizer (quants.h, itself checked against the
// gguf package) does.
TEST(KvQuant, Iq4nlBlocksDecodeAsGgml) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 64;
  std::vector<float> x(n), back(n), ref_back(n);
  for (float& v : x) v = nd(rng) * 3.0f;
  std::vector<uint8_t> y(row_bytes(DType::kIQ4_NL, n));
  ASSERT_EQ(y.size(), static_cast<size_t>(n / 32 * 18));
  quantize_rotated_row(DType::kIQ4_NL, x.data(), y.data(), n);
  detail::kv_dequant_scalar(DType::kIQ4_NL)(y.data(), back.data(), n);
  ref::dequantize_row(DType::kIQ4_NL, y.data(), ref_back.data(), n);
  EXPECT_EQ(0, std::memcmp(back.data(), ref_back.data(), back.size() * 4));
}

// The iq4_nlh encoder against a plain restatement of its contract
// (kv_quant.h): per block of 32, candidate scales m / v * (1 - 0.025 i)
// for v the first and the last level, i = 0..16, then the least-squares
// scale of the best one's codes; each rounded to f16; codes the nearest
// level (argmin over the 16, the lower on a tie); the least error wins
// (the first on a tie); the stored d is x.x / x.x_hat of the winner's codes.
void iq4nl_reference(const float* x, uint8_t* out) {
  float m = 0;
  for (int j = 0; j < 32; ++j) m = std::fabs(x[j]) > std::fabs(m) ? x[j] : m;
  int best_q[32] = {};
  std::fill(best_q, best_q + 32, 8);
  double best = INFINITY;
  auto codes = [&](float d, int* q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    double err = 0;
    for (int j = 0; j < 32; ++j) {
      const float y = x[j] * id;
      int k = 0;
      for (int i = 1; i < 16; ++i) {
        if (std::fabs(y - kIq4nlValues[i]) < std::fabs(y - kIq4nlValues[k])) k = i;
      }
      q[j] = k;
      const double e = double{x[j]} - double{static_cast<float>(kIq4nlValues[k]) * d};
      err += e * e;
    }
    return err;
  };
  auto consider = [&](float d) {
    int q[32];
    const double err = codes(f16_to_f32(f32_to_f16(d)), q);
    if (err < best) {
      best = err;
      std::copy(q, q + 32, best_q);
    }
  };
  uint16_t dh = 0;
  if (m != 0.0f) {
    for (const float top : {-127.0f, 113.0f}) {
      for (int i = 0; i <= 16; ++i) consider(m / top * (1.0f - 0.025f * static_cast<float>(i)));
    }
    double xq = 0, qq = 0, xx = 0;
    for (int j = 0; j < 32; ++j) {
      xq += double{x[j]} * kIq4nlValues[best_q[j]];
      qq += static_cast<double>(kIq4nlValues[best_q[j]]) * kIq4nlValues[best_q[j]];
    }
    consider(static_cast<float>(xq / qq));
    xq = 0;
    for (int j = 0; j < 32; ++j) {
      xx += double{x[j]} * x[j];
      xq += double{x[j]} * kIq4nlValues[best_q[j]];
    }
    dh = f32_to_f16(static_cast<float>(xx / xq));
  }
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < 16; ++j) out[2 + j] = static_cast<uint8_t>(best_q[j] | (best_q[j + 16] << 4));
}

TEST(KvQuant, Iq4nlEncoderMatchesItsContract) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 256;
  std::vector<float> x(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 6.0f : 1.0f);
  std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block: d = 0
  std::vector<uint8_t> y(row_bytes(DType::kIQ4_NL, n)), want(y.size());
  quantize_rotated_row(DType::kIQ4_NL, x.data(), y.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) iq4nl_reference(x.data() + b * 32, want.data() + b * 18);
  for (int64_t b = 0; b < n / 32; ++b) {
    ASSERT_EQ(0, std::memcmp(y.data() + b * 18, want.data() + b * 18, 18)) << "block " << b;
  }
}

// k4c's K (quantize_chan_block): per channel of a block of 32 tokens, the
// codes q = nearbyint((x - z) * (1 / d)) clamped to 0..15 of the stored f16
// zero z and e4m3 step d (x 1/16), decoded exactly as z + d q by
// dequantize_chan_block, with a squared error no larger than any candidate
// its contract names with z the largest f16 at or below the minimum (the
// refit z may only do better); a constant channel has d = 0.
TEST(KvQuant, ChanBlockMatchesItsContract) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  const int64_t W = 192, T = kKvChanTokens;
  std::vector<float> x(static_cast<size_t>(T * W));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < W; ++c) {
      float v = nd(rng);
      if (c % 64 == 5) v = 6.0f + 3.0f * v;  // an outlier channel far from zero
      if (c == 7) v = 2.5f;                  // a constant channel: d = 0
      if (c == 8) v = -1e-3f * v;            // a tiny one (subnormal e4m3 steps)
      x[static_cast<size_t>(t * W + c)] = v;
    }
  }
  std::vector<uint8_t> y(row_bytes(kKvQ4Chan, W) * T);
  ASSERT_EQ(y.size(), static_cast<size_t>(19 * W));
  quantize_chan_block(x.data(), W, W, y.data());
  std::vector<float> back(x.size());
  dequantize_chan_block(y.data(), W, back.data());
  double total = 0, total_lo = 0;
  for (int64_t c = 0; c < W; ++c) {
    uint16_t zh;
    std::memcpy(&zh, y.data() + 2 * c, 2);
    const uint8_t code = y[static_cast<size_t>(2 * W + c)];
    const float z = f16_to_f32(zh), d = e4m3_value(code) / 16.0f;
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t t = 0; t < T; ++t) mn = std::min(mn, x[static_cast<size_t>(t * W + c)]);
    for (int64_t t = 0; t < T; ++t) mx = std::max(mx, x[static_cast<size_t>(t * W + c)]);
    // The largest f16 at or below the minimum (by stepping the bits).
    uint16_t lo = f32_to_f16(mn);
    if (f16_to_f32(lo) > mn) lo = lo & 0x8000 ? static_cast<uint16_t>(lo + 1) : lo == 0 ? 0x8001 : lo - 1;
    ASSERT_LE(f16_to_f32(lo), mn);
    const float z_lo = f16_to_f32(lo);
    auto error_of = [&](float zz, uint8_t k) {
      const float s = e4m3_value(k) / 16.0f, inv = s > 0 ? 1.0f / s : 0.0f;
      double e = 0;
      for (int64_t t = 0; t < T; ++t) {
        const float v = x[static_cast<size_t>(t * W + c)];
        const int q = std::clamp(static_cast<int>(std::nearbyint((v - zz) * inv)), 0, 15);
        e +=
            (double{v} - double{zz + s * static_cast<float>(q)}) * (double{v} - double{zz + s * static_cast<float>(q)});
      }
      return e;
    };
    const double chosen = error_of(z, code);
    double stored = 0;
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t b = y[static_cast<size_t>(3 * W + c * 16 + t % 16)];
      const int q = t < 16 ? b & 15 : b >> 4;
      const float v = x[static_cast<size_t>(t * W + c)], got = back[static_cast<size_t>(t * W + c)];
      ASSERT_EQ(got, z + d * static_cast<float>(q)) << "channel " << c << " token " << t;
      ASSERT_EQ(q, std::clamp(static_cast<int>(std::nearbyint((v - z) * (d > 0 ? 1.0f / d : 0.0f))), 0, 15));
      stored += (double{v} - got) * (double{v} - got);
    }
    ASSERT_EQ(stored, chosen) << c;
    if (mx == z_lo) {
      ASSERT_EQ(code, 0) << c;
      ASSERT_EQ(stored, 0.0) << c;
      continue;
    }
    const int c0 = e4m3_round((mx - z_lo) / 15.0f * 16.0f);
    double best_lo = INFINITY;
    for (int k = std::max(1, c0 - 1); k <= std::min(0x7e, c0 + 3); ++k) {
      best_lo = std::min(best_lo, error_of(z_lo, static_cast<uint8_t>(k)));
    }
    ASSERT_LE(chosen, best_lo) << "channel " << c;
    total += chosen;
    total_lo += best_lo;
  }
  std::printf("q4c: the refit zero leaves %.3fx the squared error of z at the minimum\n", total / total_lo);
}

// k4c's K in a sequence's first block (quantize_chan_block with
// sequence_start): every byte equal to a plain restatement of the contract
// in double (candidates in order: per step code c0 - 1 .. c0 + 3, z at the
// minimum, z refit, then the 16 grids through x_0; error with token 0
// weighted kKvChanSinkWeight; the first least wins); token 0 held to z's f16
// rounding (a tenth of a step at most) where the default encoding leaves it
// up to half a step; and the
// same block encoded without sequence_start keeps its old bytes' error on
// tokens 1..31 within 1.5x.
TEST(KvQuant, ChanSequenceStartHoldsTheFirstKey) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int64_t W = 192, T = kKvChanTokens;
  std::vector<float> x(static_cast<size_t>(T * W));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < W; ++c) {
      float v = nd(rng);
      if (c % 64 == 5) v = 6.0f + 3.0f * v;           // an outlier channel far from zero
      if (t == 0 && c % 3 == 0) v = 4.0f * v - 2.0f;  // the sink an outlier of its channel
      if (c == 7) v = 2.5f;                           // a constant channel: d = 0
      if (c == 8) v = -1e-3f * v;                     // a tiny one (subnormal e4m3 steps)
      x[static_cast<size_t>(t * W + c)] = v;
    }
  }
  std::vector<uint8_t> y(row_bytes(kKvQ4Chan, W) * T), plain(y.size());
  quantize_chan_block(x.data(), W, W, y.data(), /*sequence_start=*/true);
  quantize_chan_block(x.data(), W, W, plain.data());
  std::vector<float> back(x.size()), back_plain(x.size());
  dequantize_chan_block(y.data(), W, back.data());
  dequantize_chan_block(plain.data(), W, back_plain.data());
  double sink = 0, sink_plain = 0, rest = 0, rest_plain = 0;
  for (int64_t c = 0; c < W; ++c) {
    float xc[32];
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t t = 0; t < T; ++t) {
      xc[t] = x[static_cast<size_t>(t * W + c)];
      mn = std::min(mn, xc[t]);
      mx = std::max(mx, xc[t]);
    }
    uint16_t lo = f32_to_f16(mn);
    if (f16_to_f32(lo) > mn) lo = lo & 0x8000 ? static_cast<uint16_t>(lo + 1) : lo == 0 ? 0x8001 : lo - 1;
    // The contract's candidates, restated.
    uint16_t want_z = lo;
    uint8_t want_d = 0;
    int want_q[32] = {};
    double best = INFINITY;
    auto codes_of = [&](uint16_t zh, uint8_t k, int* q) {
      const float zf = f16_to_f32(zh), s = e4m3_value(k) / 16.0f, inv = s > 0 ? 1.0f / s : 0.0f;
      double e = 0;
      for (int64_t t = 0; t < T; ++t) {
        q[t] = std::clamp(static_cast<int>(std::nearbyint((xc[t] - zf) * inv)), 0, 15);
        const double err = double{xc[t]} - double{zf + s * static_cast<float>(q[t])};
        e += (t == 0 ? kKvChanSinkWeight : 1.0) * (err * err);
      }
      return e;
    };
    auto consider = [&](uint16_t zh, uint8_t k) {
      int q[32];
      const double e = codes_of(zh, k, q);
      if (e < best) {
        best = e;
        want_z = zh;
        want_d = k;
        std::copy(q, q + 32, want_q);
      }
    };
    if (mx > f16_to_f32(lo)) {
      const int c0 = e4m3_round((mx - f16_to_f32(lo)) / 15.0f * 16.0f);
      for (int k = std::max(1, c0 - 1); k <= std::min(0x7e, c0 + 3); ++k) {
        const auto kk = static_cast<uint8_t>(k);
        const float s = e4m3_value(kk) / 16.0f;
        consider(lo, kk);
        int q[32];
        codes_of(lo, kk, q);
        double sum = 0;
        for (int64_t t = 0; t < T; ++t) sum += double{xc[t]} - double{s} * q[t];
        consider(f32_to_f16(static_cast<float>(sum / T)), kk);
        for (int q0 = 0; q0 < 16; ++q0) consider(f32_to_f16(xc[0] - s * static_cast<float>(q0)), kk);
      }
    }
    uint16_t zh;
    std::memcpy(&zh, y.data() + 2 * c, 2);
    ASSERT_EQ(zh, want_z) << "channel " << c;
    ASSERT_EQ(y[static_cast<size_t>(2 * W + c)], want_d) << "channel " << c;
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t b = y[static_cast<size_t>(3 * W + c * 16 + t % 16)];
      ASSERT_EQ(t < 16 ? b & 15 : b >> 4, want_q[t]) << "channel " << c << " token " << t;
    }
    const float z = f16_to_f32(zh), d = e4m3_value(want_d) / 16.0f;
    const double e0 = double{xc[0]} - back[static_cast<size_t>(c)];
    // x_0 within a tenth of a step (a grid through it wins unless x_0 is
    // that close to the others' grid already); the default: up to half.
    EXPECT_LE(std::fabs(e0), 0.1 * d + std::ldexp(std::fabs(z), -11)) << c;
    sink += e0 * e0;
    sink_plain +=
        (double{xc[0]} - back_plain[static_cast<size_t>(c)]) * (double{xc[0]} - back_plain[static_cast<size_t>(c)]);
    for (int64_t t = 1; t < T; ++t) {
      const auto i = static_cast<size_t>(t * W + c);
      rest += (double{x[i]} - back[i]) * (double{x[i]} - back[i]);
      rest_plain += (double{x[i]} - back_plain[i]) * (double{x[i]} - back_plain[i]);
    }
  }
  std::printf("q4c sequence start: token 0's squared error %.3g (plain %.3g), tokens 1..31 %.4g (plain %.4g)\n", sink,
              sink_plain, rest, rest_plain);
  EXPECT_LT(sink, 1e-3 * sink_plain);
  EXPECT_LT(rest, 1.5 * rest_plain);
}

// k4c's tail rows: K as llama.cpp's reference q8_0 of the row, V as the
// reference q8_0 of each head Hadamard-rotated (or of the row when V is not
// rotated), the source untouched; each value within half a step of its input.
TEST(KvQuant, ChanTailRowsAreQ8_0OfKAndRotatedV) {
  static_assert(kKvChanTailType == DType::kQ8_0);
  constexpr int64_t kHeads = 3, kHd = 64, kW = kHeads * kHd;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> k(kW), v(kW);
  for (int64_t c = 0; c < kW; ++c) {
    k[static_cast<size_t>(c)] = c % kHd == 7 ? 9.0f + 2.0f * nd(rng) : nd(rng);
    v[static_cast<size_t>(c)] = 0.1f * nd(rng);
  }
  const std::vector<float> k0 = k, v0 = v;
  const size_t rb = row_bytes(DType::kQ8_0, kW);
  ASSERT_EQ(rb, static_cast<size_t>(kW / 32 * 34));
  for (const bool rotated : {true, false}) {
    std::vector<uint8_t> kr(rb), vr(rb), want(rb);
    store_chan_tail_rows(k.data(), v.data(), rotated, kHeads, kHd, kr.data(), vr.data());
    EXPECT_EQ(k, k0);
    EXPECT_EQ(v, v0);
    ref::quantize_kv_row(DType::kQ8_0, k.data(), want.data(), kW);
    EXPECT_EQ(kr, want);
    std::vector<float> rot = v;
    for (int64_t h = 0; h < kHeads && rotated; ++h) hadamard_rotate(rot.data() + h * kHd, kHd);
    ref::quantize_kv_row(DType::kQ8_0, rot.data(), want.data(), kW);
    EXPECT_EQ(vr, want) << "rotated " << rotated;
    std::vector<float> back(kW);
    dequantize_row(DType::kQ8_0, vr.data(), back.data(), kW);
    for (int64_t b = 0; b < kW / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(rot[static_cast<size_t>(b * 32 + j)]));
      for (int j = 0; j < 32; ++j) {
        const size_t i = static_cast<size_t>(b * 32 + j);
        // Half a step of the exact scale d, plus the stored f16 scale's
        // rounding times the largest code (codes are rounded with d).
        const float d = amax / 127.0f, dh = f16_to_f32(f32_to_f16(d));
        EXPECT_LE(std::fabs(back[i] - rot[i]), 0.5f * d + 127.0f * std::fabs(dh - d) + 1e-6f * amax)
            << "rotated " << rotated << " " << i;
      }
    }
  }
}

// k4c's V (iq4_nlh64): blocks of 64 rotated values, byte 0 the e4m3 code of
// d * 16, then element j in the low nibble of byte 1 + j and j + 32 in its
// high one, decoded x = e4m3(byte 0) / 16 * kIq4nlValues[q]; on N(0, 1)
// within the error of iq4_nlh's blocks of 32 with an f16 scale plus the
// coarser scale in 0.375 fewer bits (measured 1.26x its squared error), and
// unshrunk.
TEST(KvQuant, Iq4nl64BlocksDecodeAndFitTheirLevels) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int64_t n = 64 * 512;
  std::vector<float> x(n), a(n), b(n);
  for (float& v : x) v = nd(rng);
  std::fill(x.begin(), x.begin() + 64, 0.0f);  // an all-zero block: d = 0
  std::vector<uint8_t> ya(row_bytes(kKvIq4Nl64, n)), yb(row_bytes(DType::kIQ4_NL, n));
  ASSERT_EQ(ya.size(), static_cast<size_t>(n / 64 * 33));
  quantize_rotated_row(kKvIq4Nl64, x.data(), ya.data(), n);
  quantize_rotated_row(DType::kIQ4_NL, x.data(), yb.data(), n);
  detail::kv_dequant_scalar(kKvIq4Nl64)(ya.data(), a.data(), n);
  detail::kv_dequant_scalar(DType::kIQ4_NL)(yb.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* blk = ya.data() + i / 64 * 33;
    const int j = static_cast<int>(i % 64);
    const int q = j < 32 ? blk[1 + j] & 15 : blk[1 + j - 32] >> 4;
    ASSERT_EQ(a[static_cast<size_t>(i)], e4m3_value(blk[0]) / 16.0f * static_cast<float>(kIq4nlValues[q])) << i;
  }
  EXPECT_EQ(ya[0], 0);
  double ea = 0, eb = 0, xx = 0, xa = 0;
  for (int64_t i = 64; i < n; ++i) {
    ea += (double{a[i]} - x[i]) * (double{a[i]} - x[i]);
    eb += (double{b[i]} - x[i]) * (double{b[i]} - x[i]);
    xx += double{x[i]} * x[i];
    xa += double{x[i]} * a[i];
  }
  std::printf("iq4_nlh64: %.3fx iq4_nlh's squared error on N(0, 1), relative rms %.4f\n", ea / eb, std::sqrt(ea / xx));
  EXPECT_LT(ea, 1.35 * eb);
  EXPECT_NEAR(xa / xx, 1.0, 0.01);  // the scale's e4m3 rounding: within its 1/16 steps, unbiased on average
}

// q8_0h64 (kKvQ8_0x64) against a plain restatement of its contract
// (kv_quant.h): per block of 64, m the signed absolute maximum (the first
// on ties); candidate scales m / v * (1 - 0.025 i) for v = -127 and 127, i =
// 0..16, then the least-squares scale of the best one's codes, each rounded
// to f16; codes nearbyint(x / d) clamped to -127..127; the least squared
// error wins (the first on a tie); the stored d is f16(x.x / x.q) of the
// winner's codes. Bytes: d (f16, little-endian), then the 64 int8 codes.
void q8_0x64_reference(const float* x, uint8_t* out) {
  float m = 0;
  for (int j = 0; j < 64; ++j) m = std::fabs(x[j]) > std::fabs(m) ? x[j] : m;
  int best_q[64] = {};
  double best = INFINITY;
  auto codes = [&](float d, int* q) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    double err = 0;
    for (int j = 0; j < 64; ++j) {
      q[j] = static_cast<int>(std::clamp(std::nearbyint(x[j] * id), -127.0f, 127.0f));
      const double e = double{x[j]} - double{static_cast<float>(q[j]) * d};
      err += e * e;
    }
    return err;
  };
  auto consider = [&](float d) {
    int q[64];
    const double err = codes(f16_to_f32(f32_to_f16(d)), q);
    if (err < best) {
      best = err;
      std::copy(q, q + 64, best_q);
    }
  };
  uint16_t dh = 0;
  if (m != 0.0f) {
    for (const float top : {-127.0f, 127.0f}) {
      for (int i = 0; i <= 16; ++i) consider(m / top * (1.0f - 0.025f * static_cast<float>(i)));
    }
    double xq = 0, qq = 0, xx = 0;
    for (int j = 0; j < 64; ++j) {
      xq += double{x[j]} * best_q[j];
      qq += double{1.0 * best_q[j]} * best_q[j];
    }
    consider(static_cast<float>(xq / qq));
    xq = 0;
    for (int j = 0; j < 64; ++j) {
      xx += double{x[j]} * x[j];
      xq += double{x[j]} * best_q[j];
    }
    dh = f32_to_f16(static_cast<float>(xx / xq));
  }
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < 64; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(best_q[j]));
}

// q8_0h64's encoder byte for byte against q8_0x64_reference (outliers, an
// all-zero block, a block of one tiny value), its bytes decoded as f16 d
// times the int8 code by every dequantizer built here; on N(0, 1) (a rotated
// head) within 1.35x the squared error of q8_0h's blocks of 32 (measured
// 1.254x: the largest of 64 Gaussian values sets a step ~12% wider than the
// largest of 32) and unshrunk (the relative rms and the ratio are printed).
TEST(KvQuant, Q8_0x64BlocksMatchTheirContract) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  const int64_t n = 64 * 256;
  std::vector<float> x(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 89 == 0 ? 7.0f : 1.0f);
  std::fill(x.begin(), x.begin() + 64, 0.0f);  // an all-zero block: d = 0
  std::fill(x.begin() + 64, x.begin() + 128, 0.0f);
  x[100] = -1e-4f;  // a block of one small value: a subnormal f16 scale (steps of 2^-24, 7.6% of it)
  std::vector<uint8_t> y(row_bytes(kKvQ8_0x64, n)), want(y.size());
  ASSERT_EQ(y.size(), static_cast<size_t>(n / 64 * kQ8_0x64Bytes));
  ASSERT_EQ(kQ8_0x64Bytes, 66);
  quantize_rotated_row(kKvQ8_0x64, x.data(), y.data(), n);
  for (int64_t b = 0; b < n / 64; ++b) q8_0x64_reference(x.data() + b * 64, want.data() + b * 66);
  for (int64_t b = 0; b < n / 64; ++b) {
    ASSERT_EQ(0, std::memcmp(y.data() + b * 66, want.data() + b * 66, 66)) << "block " << b;
  }
  EXPECT_EQ(y[0], 0);
  EXPECT_EQ(y[1], 0);
  std::vector<detail::KvDequant> dqs = {detail::kv_dequant_scalar(kKvQ8_0x64)};
  if (best_isa() != Isa::kScalar) dqs.push_back(detail::kv_dequant_avx2(kKvQ8_0x64));
  for (detail::KvDequant dq : dqs) {
    ASSERT_NE(dq, nullptr);
    std::vector<float> back(static_cast<size_t>(n), NAN);
    dq(y.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* blk = y.data() + i / 64 * 66;
      uint16_t dh;
      std::memcpy(&dh, blk, 2);
      const auto q = static_cast<int8_t>(blk[2 + i % 64]);
      ASSERT_GE(q, -127) << i;
      ASSERT_EQ(back[static_cast<size_t>(i)], f16_to_f32(dh) * static_cast<float>(q)) << i;
    }
    EXPECT_NEAR(back[100], -1e-4f, 3e-6f) << "the small value survives its subnormal scale";
  }
  // Gaussian blocks: blocks of 64 against q8_0h's 32.
  std::vector<float> g(n), a(n), b(n);
  for (float& v : g) v = nd(rng);
  std::vector<uint8_t> ya(row_bytes(kKvQ8_0x64, n)), yb(row_bytes(DType::kQ8_0, n));
  quantize_rotated_row(kKvQ8_0x64, g.data(), ya.data(), n);
  quantize_rotated_row(DType::kQ8_0, g.data(), yb.data(), n);
  detail::kv_dequant_scalar(kKvQ8_0x64)(ya.data(), a.data(), n);
  detail::kv_dequant_scalar(DType::kQ8_0)(yb.data(), b.data(), n);
  double ea = 0, eb = 0, xx = 0, xa = 0;
  for (int64_t i = 0; i < n; ++i) {
    ea += (double{a[i]} - g[i]) * (double{a[i]} - g[i]);
    eb += (double{b[i]} - g[i]) * (double{b[i]} - g[i]);
    xx += double{g[i]} * g[i];
    xa += double{g[i]} * a[i];
  }
  std::printf("q8_0h64: %.3fx q8_0h's squared error on N(0, 1), relative rms %.5f\n", ea / eb, std::sqrt(ea / xx));
  EXPECT_LT(ea, 1.35 * eb);
  EXPECT_NEAR(xa / xx, 1.0, 1e-4);  // unshrunk, as q8_0h
}

// A block holding a NaN or an inf: no candidate's error is finite, so the
// codes stay 0 and d is the positive f16 NaN (0x7e00, as CUDA's encoder
// would store it); no undefined conversion on the way (UBSan runs this).
TEST(KvQuant, Q8_0x64NonFiniteBlocksAreCodeZero) {
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x(128, 0.5f);
    x[3] = bad;
    std::vector<uint8_t> y(2 * 66);
    quantize_rotated_row(kKvQ8_0x64, x.data(), y.data(), 128);
    uint16_t dh;
    std::memcpy(&dh, y.data(), 2);
    EXPECT_EQ(dh, 0x7e00) << bad;
    for (int j = 0; j < 64; ++j) ASSERT_EQ(y[static_cast<size_t>(2 + j)], 0) << bad << " " << j;
    // The next block (0.5 everywhere) is untouched by its neighbour.
    std::vector<float> back(128);
    detail::kv_dequant_scalar(kKvQ8_0x64)(y.data(), back.data(), 128);
    for (int j = 64; j < 128; ++j) ASSERT_NEAR(back[static_cast<size_t>(j)], 0.5f, 1e-3f) << bad << " " << j;
  }
}

// iq4_nl's levels against q4_0's uniform ones, both through the rotated
// encoder, on N(0, 1) (what a rotated head is close to): measured 0.87x
// the squared error in the same 18 bytes per block.
TEST(KvQuant, Iq4nlLevelsBeatUniformOnGaussian) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 1024;
  std::vector<float> x(n), a(n), b(n);
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> ya(row_bytes(DType::kQ4_0, n)), yb(row_bytes(DType::kIQ4_NL, n));
  ASSERT_EQ(ya.size(), yb.size());
  quantize_rotated_row(DType::kQ4_0, x.data(), ya.data(), n);
  quantize_rotated_row(DType::kIQ4_NL, x.data(), yb.data(), n);
  detail::kv_dequant_scalar(DType::kQ4_0)(ya.data(), a.data(), n);
  detail::kv_dequant_scalar(DType::kIQ4_NL)(yb.data(), b.data(), n);
  double ea = 0, eb = 0, xx = 0, xb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ea += (double{a[i]} - x[i]) * (double{a[i]} - x[i]);
    eb += (double{b[i]} - x[i]) * (double{b[i]} - x[i]);
    xx += double{x[i]} * x[i];
    xb += double{x[i]} * b[i];
  }
  std::printf("iq4_nlh: %.3fx q4_0h's squared error on N(0, 1)\n", eb / ea);
  EXPECT_LT(eb, 0.92 * ea);
  EXPECT_NEAR(xb / xx, 1.0, 1e-3);  // unshrunk, as q4_0h
}

struct KvCase {
  const char* name;
  DType k, v;
  bool k_rot, v_rot;
  float bound;  // max |out - out_f32| (V ~ N(0, 1))
};
// Bounds (full context; twice that with a window): about twice the error
// measured on this data (K with outlier
// channels, q ~ N(0, 1/4), V ~ N(0, 1)): f16 0.0002, bf16 0.0013, q8_0
// 0.0056, q5_0 0.048, q5_1 0.031, q4_0 0.113, q4_1 0.058, q4_0h 0.039,
// q8_0h 0.0029, k:q8_0/v:q4_0h 0.033, k:f32/v:q5_1 0.013, fp8 (e4m3, no
// scale) 0.0235.
constexpr KvCase kCases[] = {
    {"f16", DType::kF16, DType::kF16, false, false, 0.001f},
    {"bf16", DType::kBF16, DType::kBF16, false, false, 0.005f},
    {"q8_0", DType::kQ8_0, DType::kQ8_0, false, false, 0.012f},
    {"q5_0", DType::kQ5_0, DType::kQ5_0, false, false, 0.1f},
    {"q5_1", DType::kQ5_1, DType::kQ5_1, false, false, 0.07f},
    {"q4_0", DType::kQ4_0, DType::kQ4_0, false, false, 0.25f},
    {"q4_1", DType::kQ4_1, DType::kQ4_1, false, false, 0.12f},
    {"q4_0h", DType::kQ4_0, DType::kQ4_0, true, true, 0.09f},
    {"q8_0h", DType::kQ8_0, DType::kQ8_0, true, true, 0.006f},
    {"iq4_nlh", DType::kIQ4_NL, DType::kIQ4_NL, true, true, 0.09f},
    {"k:q8_0h/v:iq4_nlh", DType::kQ8_0, DType::kIQ4_NL, true, true, 0.06f},
    {"q8_0h64", kKvQ8_0x64, kKvQ8_0x64, true, true, 0.006f},
    {"k:q8_0h64/v:q4_0", kKvQ8_0x64, DType::kQ4_0, true, false, 0.25f},
    {"k:q8_0/v:q4_0h", DType::kQ8_0, DType::kQ4_0, false, true, 0.06f},
    {"k:f32/v:q5_1", DType::kF32, DType::kQ5_1, false, false, 0.03f},
    {"fp8", kF8E4M3, kF8E4M3, false, false, 0.05f},
};

// A paged KV of n_kv rows in one type per side: blocks of 16 rows in a
// shuffled table, K and V interleaved per block as the PagedKvCache lays
// them out.
struct PagedRows {
  std::vector<uint8_t> data;
  std::vector<int32_t> table;
  PagedKv kv;
};
PagedRows store_paged(const std::vector<float>& k, const std::vector<float>& v, int64_t n_kv, int64_t n_head_kv,
                      int64_t hd, const KvCase& c) {
  const int64_t width = n_head_kv * hd;
  const size_t kr = row_bytes(c.k, width), vr = row_bytes(c.v, width);
  const int32_t bs = 16, n_blocks = static_cast<int32_t>((n_kv + bs - 1) / bs);
  const size_t span = bs * (kr + vr);
  PagedRows p;
  p.data.assign(span * static_cast<size_t>(n_blocks + 3), 0xAB);  // spare blocks stay garbage
  for (int32_t b = 0; b < n_blocks; ++b) p.table.push_back((b * 5 + 2) % (n_blocks + 3));
  std::sort(p.table.begin(), p.table.end());
  std::reverse(p.table.begin(), p.table.end());
  for (int64_t j = 0; j < n_kv; ++j) {
    uint8_t* blk = p.data.data() + static_cast<size_t>(p.table[static_cast<size_t>(j / bs)]) * span;
    store_kv_row(c.k, c.k_rot, k.data() + j * width, blk + static_cast<size_t>(j % bs) * kr, n_head_kv, hd);
    store_kv_row(c.v, c.v_rot, v.data() + j * width, blk + bs * kr + static_cast<size_t>(j % bs) * vr, n_head_kv, hd);
  }
  p.kv.k = p.data.data();
  p.kv.v = p.data.data() + bs * kr;
  p.kv.table = p.table.data();
  p.kv.block_shift = 4;
  p.kv.block_bytes = span;
  p.kv.row_bytes = kr;
  p.kv.v_row_bytes = vr == kr ? 0 : vr;
  return p;
}

struct Problem {
  int64_t n_q = 0, n_kv = 0, n_head = 8, n_head_kv = 2, hd = 64;
  std::vector<float> q, k, v;
  std::vector<int32_t> pos;
};
Problem make_problem(int64_t n_q, int64_t n_kv, uint32_t seed) {
  Problem pr;
  pr.n_q = n_q;
  pr.n_kv = n_kv;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t width = pr.n_head_kv * pr.hd;
  pr.q.resize(static_cast<size_t>(n_q * pr.n_head * pr.hd));
  pr.k.resize(static_cast<size_t>(n_kv * width));
  pr.v.resize(pr.k.size());
  for (float& x : pr.q) x = 0.5f * nd(rng);
  for (size_t i = 0; i < pr.k.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i) % pr.hd;
    pr.k[i] = nd(rng) * (c == 3 ? 8.0f : c == 40 ? -6.0f : 1.0f);  // outlier channels, as real K has
    pr.v[i] = nd(rng);
  }
  for (int64_t i = 0; i < n_q; ++i) pr.pos.push_back(static_cast<int32_t>(n_kv - n_q + i));
  return pr;
}

AttentionParams params(const Problem& pr, int64_t window, float softcap) {
  AttentionParams p;
  p.n_head = pr.n_head;
  p.n_head_kv = pr.n_head_kv;
  p.head_dim = pr.hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(pr.hd));
  p.window = window;
  p.softcap = softcap;
  p.kv_dtype = DType::kF32;
  return p;
}

TEST(KvQuantAttention, EveryTypeAgainstF32) {
  ThreadPool pool(2);
  const Problem pr = make_problem(5, 200, 11);
  const int64_t width = pr.n_head_kv * pr.hd;
  for (int64_t window : {int64_t{0}, int64_t{37}}) {
    for (float softcap : {0.0f, 20.0f}) {
      const AttentionParams p = params(pr, window, softcap);
      std::vector<float> ref(pr.q.size());
      const PagedKv f32 = make_contiguous_kv(pr.k.data(), pr.v.data(), static_cast<size_t>(width) * 4);
      attention(pr.q.data(), pr.pos.data(), pr.n_q, f32, pr.n_kv, p, ref.data(), pool);
      double ms = 0;
      for (float x : ref) ms += double{x} * x;
      const double rms = std::sqrt(ms / static_cast<double>(ref.size()));
      // kCases lists q4_0 / q8_0 before q4_0h / q8_0h, and q4_0h before iq4_nlh.
      double q4_err = 0, q8_err = 0, q4h_err = 0;
      for (const KvCase& c : kCases) {
        SCOPED_TRACE(std::string(c.name) + " window " + std::to_string(window) + " softcap " + std::to_string(softcap));
        const PagedRows rows = store_paged(pr.k, pr.v, pr.n_kv, pr.n_head_kv, pr.hd, c);
        AttentionSeq s;
        s.q = pr.q.data();
        s.q_pos = pr.pos.data();
        s.n_q = pr.n_q;
        s.kv = rows.kv;
        s.n_kv = pr.n_kv;
        std::vector<float> out(pr.q.size(), NAN);
        s.out = out.data();
        attention_quant_batch(&s, 1, p, {c.k, c.v, c.k_rot, c.v_rot}, pool);
        double max_err = 0;
        for (size_t i = 0; i < out.size(); ++i) max_err = std::max(max_err, std::fabs(double{out[i]} - ref[i]));
        // A window of 37 averages fewer V rows, so errors are up to ~2x.
        EXPECT_LT(max_err, window > 0 ? 2 * c.bound : c.bound);
        if (window == 0 && softcap == 0.0f) std::printf("%-16s max |out - out_f32| = %.4f\n", c.name, max_err);
        if (std::string(c.name) == "q4_0") q4_err = max_err;
        if (std::string(c.name) == "q8_0") q8_err = max_err;
        // With outlier channels in K the rotation must pay: q4_0h well below
        // plain q4_0's error (measured: 0.039 against 0.113).
        if (std::string(c.name) == "q4_0h") {
          EXPECT_LT(max_err, 0.7 * q4_err);
          q4h_err = max_err;
        }
        // iq4_nl's levels in the same bytes: its bound, not q4_0h's error.
        // This synthetic K (two channels of 8 and 6 sigma, the rest N(0, 1))
        // rotates into a mixture that the uniform levels fit as well as the
        // Gaussian-spaced ones (max error 0.050 against q4_0h's 0.039); the
        // default model's K is where iq4_nlh pays (docs/perf.md).
        if (std::string(c.name) == "iq4_nlh") {
          EXPECT_LT(max_err, 1.5 * q4h_err);
        }
        // The same for 8 bits: K's outlier channels are what limit q8_0
        // (measured: q8_0h 0.0029 against q8_0's 0.0056).
        if (std::string(c.name) == "q8_0h") {
          EXPECT_LT(max_err, 0.7 * q8_err);
        }
        // q8_0h64: q8_0h's rotation and encoder with one scale per 64
        // values, so also well below plain q8_0's error (measured 0.0033
        // against 0.0056; with the window of 37, 0.0097 against 0.0122).
        if (std::string(c.name) == "q8_0h64") {
          EXPECT_LT(max_err, (window > 0 ? 0.85 : 0.7) * q8_err);
        }
        // The same values dequantized (and rotated back) into f32 rows and run
        // through f32 attention agree to rounding: the kernel reads the blocks
        // it should, window and GQA included.
        std::vector<float> kd(pr.k.size()), vd(pr.v.size()), row(static_cast<size_t>(pr.hd));
        const detail::KvDequant kdq = detail::kv_dequant_scalar(c.k), vdq = detail::kv_dequant_scalar(c.v);
        for (int64_t j = 0; j < pr.n_kv; ++j) {
          for (int64_t h = 0; h < pr.n_head_kv; ++h) {
            kdq(rows.kv.k_row(j) + static_cast<size_t>(h) * row_bytes(c.k, pr.hd), row.data(), pr.hd);
            if (c.k_rot) hadamard_rotate(row.data(), pr.hd);
            std::copy(row.begin(), row.end(), kd.begin() + j * width + h * pr.hd);
            vdq(rows.kv.v_row(j) + static_cast<size_t>(h) * row_bytes(c.v, pr.hd), row.data(), pr.hd);
            if (c.v_rot) hadamard_rotate(row.data(), pr.hd);
            std::copy(row.begin(), row.end(), vd.begin() + j * width + h * pr.hd);
          }
        }
        std::vector<float> deq(pr.q.size());
        attention(pr.q.data(), pr.pos.data(), pr.n_q, make_contiguous_kv(kd.data(), vd.data(), width * 4), pr.n_kv, p,
                  deq.data(), pool);
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], deq[i], 2e-5 * rms) << i;
      }
    }
  }
}

// A (query, head)'s bits depend only on its position and KV: the same
// queries alone, one at a time (decode), or batched with another sequence
// give identical outputs.
TEST(KvQuantAttention, BatchInvariantPerType) {
  ThreadPool pool(2);
  const Problem a = make_problem(6, 90, 21), b = make_problem(3, 150, 22);
  const AttentionParams p = params(a, 0, 0.0f);
  for (const KvCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const PagedRows ra = store_paged(a.k, a.v, a.n_kv, a.n_head_kv, a.hd, c);
    const PagedRows rb = store_paged(b.k, b.v, b.n_kv, b.n_head_kv, b.hd, c);
    const KvSideTypes t{c.k, c.v, c.k_rot, c.v_rot};
    std::vector<float> alone(a.q.size()), batched(a.q.size()), one(a.q.size()), other(b.q.size());
    AttentionSeq sa{a.q.data(), a.pos.data(), a.n_q, ra.kv, a.n_kv, alone.data()};
    attention_quant_batch(&sa, 1, p, t, pool);
    AttentionSeq both[2] = {sa, {b.q.data(), b.pos.data(), b.n_q, rb.kv, b.n_kv, other.data()}};
    both[0].out = batched.data();
    attention_quant_batch(both, 2, p, t, pool);
    const int64_t row = a.n_head * a.hd;
    for (int64_t i = 0; i < a.n_q; ++i) {
      AttentionSeq si{a.q.data() + i * row, a.pos.data() + i, 1, ra.kv, a.pos[static_cast<size_t>(i)] + 1,
                      one.data() + i * row};
      attention_quant_batch(&si, 1, p, t, pool);
    }
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * 4));
    EXPECT_EQ(0, std::memcmp(alone.data(), one.data(), alone.size() * 4));
  }
}

}  // namespace
}  // namespace rill::cpu
