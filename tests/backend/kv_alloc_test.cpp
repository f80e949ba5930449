// Per-channel bit widths for K (backend/cpu/kv_alloc.h): the allocation
// against the plain greedy loop its contract states, the encoder against
// q4c's at 4 bits and against its per-width bounds, the bit-plane layout,
// and the block scores (reference, AVX-512) against dequantize-then-dot.
#include "backend/cpu/kv_alloc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "core/dtype.h"
#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

constexpr int kT = kKvChanTokens;

// The contract's loop, restated plainly: O(width^2 * 4).
std::vector<uint8_t> naive_bits(const std::vector<double>& q, const std::vector<double>& r, int64_t hd, RopePairs pairs,
                                bool one_bit = true) {
  const auto W = static_cast<int64_t>(q.size());
  auto ok = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  std::vector<double> w(static_cast<size_t>(W));
  bool any = false;
  for (int64_t c = 0; c < W; ++c) {
    const int64_t i = c % hd, base = c - i;
    const int64_t p = pairs == RopePairs::kInterleaved ? base + (i ^ 1) : base + (i < hd / 2 ? i + hd / 2 : i - hd / 2);
    double v = 0.5 * (ok(q[c]) + ok(q[p])) * ok(r[c]);
    if (!std::isfinite(v)) v = std::numeric_limits<double>::max();
    w[c] = v;
    any = any || v > 0;
  }
  std::vector<uint8_t> b(static_cast<size_t>(W), any ? 0 : 4);
  if (!any) return b;
  // one_bit false: a channel at 0 moves to 2 (key 0.625 w); with one bit
  // left, the best channel of 2..7 bits takes it (else the best at 0).
  for (int64_t left = 4 * W; !one_bit && left > 0;) {
    auto best_of = [&](bool zeros) {
      int64_t best = -1;
      double best_key = 0;
      for (int64_t c = 0; c < W; ++c) {
        if (b[c] >= 8 || (!zeros && b[c] == 0)) continue;
        const double key = b[c] == 0 ? 0.625 * w[c] : std::ldexp(w[c], -2 * b[c]);
        if (best < 0 || key > best_key) {
          best = c;
          best_key = key;
        }
      }
      return best;
    };
    int64_t c = best_of(true);
    if (b[c] == 0 && left == 1 && best_of(false) >= 0) c = best_of(false);
    const int step = b[c] == 0 && left >= 2 ? 2 : 1;
    b[c] = static_cast<uint8_t>(b[c] + step);
    left -= step;
  }
  if (!one_bit) return b;
  for (int64_t n = 0; n < 4 * W; ++n) {
    int64_t best = -1;
    double best_key = 0;
    for (int64_t c = 0; c < W; ++c) {
      if (b[c] >= 8) continue;
      const double key = std::ldexp(w[c], -2 * b[c]);
      if (best < 0 || key > best_key) {
        best = c;
        best_key = key;
      }
    }
    ++b[best];
  }
  return b;
}

// ~3% 2 bits, 30% 3, 42% 4, 17% 5, 5% 6, 2% 7, 0.5% 8 of 192 channels (sum
// 768 = 4 * 192), shuffled: the shape of the lead's measured allocations.
std::vector<uint8_t> realistic_mix(int64_t width, uint32_t seed) {
  const int counts[9] = {0, 0, 6, 57, 81, 33, 10, 4, 1};
  std::vector<uint8_t> b;
  while (static_cast<int64_t>(b.size()) < width) {
    for (int bits = 0; bits <= 8; ++bits)
      b.insert(b.end(), static_cast<size_t>(counts[bits]), static_cast<uint8_t>(bits));
  }
  b.resize(static_cast<size_t>(width));
  std::mt19937 rng(seed);
  std::shuffle(b.begin(), b.end(), rng);
  return b;
}

// Random K-like rows [32][width]: N(0, 1) channels, some offset outliers.
std::vector<float> random_rows(int64_t width, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(kT * width));
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t c = 0; c < width; ++c) {
      float v = nd(rng);
      if (c % 37 == 5) v = 6.0f + 3.0f * v;
      if (c % 53 == 8) v = -1e-3f * v;
      if (c % 61 == 7) v = 2.5f;  // constant
      x[static_cast<size_t>(t * width + c)] = v;
    }
  }
  return x;
}

// Token j's code of channel c, read from its planes by hand.
int code_of(const uint8_t* block, int64_t width, const std::vector<uint8_t>& b, int64_t c, int j) {
  const int64_t off = alloc_plane_offset(b.data(), width, c);
  int q = 0;
  for (int k = 0; k < b[c]; ++k) {
    const uint8_t* p = block + off + 4 * k;
    const uint32_t plane = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    q |= static_cast<int>((plane >> j) & 1u) << k;
  }
  return q;
}

TEST(KvAlloc, RopePartners) {
  EXPECT_EQ(rope_partner(0, 8, RopePairs::kInterleaved), 1);
  EXPECT_EQ(rope_partner(5, 8, RopePairs::kInterleaved), 4);
  EXPECT_EQ(rope_partner(8 + 3, 8, RopePairs::kInterleaved), 8 + 2);
  EXPECT_EQ(rope_partner(1, 8, RopePairs::kNeox), 5);
  EXPECT_EQ(rope_partner(8 + 6, 8, RopePairs::kNeox), 8 + 2);
}

// Partial rotary (rot_dim < head_dim): neox pairs within the rotated part,
// the channels past it are their own partners.
TEST(KvAlloc, RopePartnersOfAPartialRotation) {
  EXPECT_EQ(rope_partner(1, 8, RopePairs::kNeox, 4), 3);
  EXPECT_EQ(rope_partner(8 + 3, 8, RopePairs::kNeox, 4), 8 + 1);
  EXPECT_EQ(rope_partner(5, 8, RopePairs::kNeox, 4), 5);
  EXPECT_EQ(rope_partner(8 + 7, 8, RopePairs::kInterleaved, 4), 8 + 7);
  EXPECT_EQ(rope_partner(2, 8, RopePairs::kInterleaved, 4), 3);
  EXPECT_EQ(rope_partner(1, 8, RopePairs::kNeox, 8), rope_partner(1, 8, RopePairs::kNeox));
  // An unrotated channel's weight is its own query energy, not a mean with another's.
  const std::vector<double> q = {1, 1, 1, 1, 100, 0, 0, 0}, r(8, 1.0);
  std::vector<uint8_t> full(8), part(8);
  allocate_channel_bits(q.data(), r.data(), 8, 8, RopePairs::kNeox, full.data(), true);
  allocate_channel_bits(q.data(), r.data(), 8, 8, RopePairs::kNeox, part.data(), true, 4);
  EXPECT_EQ(full[0], full[4]);  // pairs (0, 4): one mean energy
  EXPECT_GT(part[4], part[0]);  // channel 4 unrotated: its own, larger energy
  EXPECT_EQ(part[5], 0);        // no query energy, no bits while others want them
}

// Gemma 4's proportional RoPE: pairs (i, i + head_dim / 2) of the whole
// head, only the first rotated_pairs at a nonzero angle: the others'
// channels are their own partners.
TEST(KvAlloc, RopePartnersOfAProportionalRotation) {
  EXPECT_EQ(rope_partner(1, 8, RopePairs::kNeox, 8, 2), 5);
  EXPECT_EQ(rope_partner(5, 8, RopePairs::kNeox, 8, 2), 1);
  EXPECT_EQ(rope_partner(2, 8, RopePairs::kNeox, 8, 2), 2);
  EXPECT_EQ(rope_partner(8 + 7, 8, RopePairs::kNeox, 8, 2), 8 + 7);
  EXPECT_EQ(rope_partner(3, 8, RopePairs::kInterleaved, 8, 2), 2);
  EXPECT_EQ(rope_partner(4, 8, RopePairs::kInterleaved, 8, 2), 4);
  EXPECT_EQ(rope_partner(6, 8, RopePairs::kNeox, 8, 4), rope_partner(6, 8, RopePairs::kNeox));
  EXPECT_EQ(rope_partner(6, 8, RopePairs::kNeox, 8, 0), 6) << "no pair rotates";
  const std::vector<double> q = {1, 1, 100, 1, 1, 1, 0, 1}, r(8, 1.0);
  std::vector<uint8_t> all(8), some(8);
  allocate_channel_bits(q.data(), r.data(), 8, 8, RopePairs::kNeox, all.data(), true, 8);
  allocate_channel_bits(q.data(), r.data(), 8, 8, RopePairs::kNeox, some.data(), true, 8, 2);
  EXPECT_EQ(all[2], all[6]);   // pair (2, 6) rotating: one mean energy
  EXPECT_GT(some[2], all[2]);  // at angle 0: channel 2 keeps its own, larger energy
  EXPECT_EQ(some[6], 0);
}

// The heap's widths equal the plain loop's on random statistics with ties,
// zeros, negatives, NaNs and infinities; sums 4 * width, each in 0..8.
TEST(KvAlloc, AllocationMatchesThePlainLoop) {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> ln(0.0, 2.0);
  std::uniform_int_distribution<int> pick(0, 19);
  for (int64_t hd : {8, 64, 128}) {
    for (int64_t n_kv : {1, 3}) {
      for (RopePairs pairs : {RopePairs::kInterleaved, RopePairs::kNeox}) {
        const int64_t W = hd * n_kv;
        std::vector<double> q(static_cast<size_t>(W)), r(static_cast<size_t>(W));
        for (int64_t c = 0; c < W; ++c) {
          q[c] = ln(rng);
          r[c] = ln(rng);
          switch (pick(rng)) {
            case 0:
              r[c] = 0;
              break;
            case 1:
              q[c] = -1;
              break;
            case 2:
              r[c] = std::nan("");
              break;
            case 3:
              q[c] = INFINITY;
              break;
            case 4:
              r[c] = 1.0;
              q[c] = 1.0;
              break;  // ties
            case 5:
              r[c] = 1e300;
              q[c] = 1e300;
              break;  // overflows: the largest double
            default:
              break;
          }
        }
        for (const bool one_bit : {true, false}) {
          std::vector<uint8_t> got(static_cast<size_t>(W));
          allocate_channel_bits(q.data(), r.data(), W, hd, pairs, got.data(), one_bit);
          const std::vector<uint8_t> want = naive_bits(q, r, hd, pairs, one_bit);
          ASSERT_EQ(got, want) << "hd " << hd << " heads " << n_kv << " one_bit " << one_bit;
          int64_t sum = 0, ones = 0;
          for (uint8_t b : got) {
            ASSERT_LE(b, 8);
            sum += b;
            ones += b == 1;
          }
          ASSERT_EQ(sum, 4 * W);
          if (!one_bit) {
            ASSERT_EQ(ones, 0) << "hd " << hd << " heads " << n_kv;
          }
        }
      }
    }
  }
}

TEST(KvAlloc, AllocationEdgeCases) {
  const int64_t hd = 8, W = 16;
  std::vector<double> q(W, 0.0), r(W, 1.0);
  std::vector<uint8_t> b(W);
  allocate_channel_bits(q.data(), r.data(), W, hd, RopePairs::kNeox, b.data());
  EXPECT_EQ(b, std::vector<uint8_t>(W, 4)) << "no statistics: q4c's widths";
  // One weighted pair takes 8 bits each; the rest goes to the lowest indices.
  q.assign(W, 0.0);
  q[3] = 1.0;  // its NeoX partner 7 shares the pair's energy
  allocate_channel_bits(q.data(), r.data(), W, hd, RopePairs::kNeox, b.data());
  std::vector<uint8_t> want(W, 0);
  want[3] = want[7] = 8;
  for (int c = 0, left = 4 * W - 16; left > 0; ++c) {
    if (c == 3 || c == 7) continue;
    want[c] = 8;
    left -= 8;
  }
  EXPECT_EQ(b, want);
  // Weights 16x apart: two bits more (each bit quarters a key).
  q.assign(W, 1.0);
  r.assign(W, 1.0);
  for (int c = 0; c < W; c += 2) r[c] = 16.0;
  allocate_channel_bits(q.data(), r.data(), W, hd, RopePairs::kInterleaved, b.data());
  for (int c = 0; c < W; ++c) EXPECT_EQ(b[c], c % 2 == 0 ? 5 : 3) << c;
}

// With every width 4 a block holds q4c's z, d and codes (so decodes to
// q4c's values bit for bit), with and without sequence_start.
TEST(KvAlloc, Width4IsQ4c) {
  std::mt19937 rng(11);
  const int64_t W = 192;
  const std::vector<uint8_t> b(W, 4);
  for (int rep = 0; rep < 6; ++rep) {
    const bool start = rep % 2 == 1;
    std::vector<float> x = random_rows(W, rng);
    std::vector<uint8_t> y(static_cast<size_t>(alloc_block_bytes(b.data(), W)));
    ASSERT_EQ(y.size(), static_cast<size_t>(19 * W));
    std::vector<uint8_t> q4c(row_bytes(kKvQ4Chan, W) * kT);
    quantize_alloc_block(x.data(), W, W, b.data(), y.data(), start);
    quantize_chan_block(x.data(), W, W, q4c.data(), start);
    ASSERT_EQ(0, std::memcmp(y.data(), q4c.data(), static_cast<size_t>(3 * W))) << "z and d";
    std::vector<float> got(x.size()), want(x.size());
    dequantize_alloc_block(y.data(), W, b.data(), got.data());
    dequantize_chan_block(q4c.data(), W, want.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    for (int64_t c = 0; c < W; ++c) {
      for (int j = 0; j < kT; ++j) {
        const uint8_t byte = q4c[static_cast<size_t>(3 * W + c * 16 + j % 16)];
        ASSERT_EQ(code_of(y.data(), W, b, c, j), j < 16 ? byte & 15 : byte >> 4);
      }
    }
  }
}

// Every width 0..8: codes within 0..2^b - 1, in the stored planes,
// decoded as z + step * code; values inside the grid within half a step;
// b = 0 stores f16 of the mean (of token 0 at a sequence's start); the
// sequence's first key held as q4c's test holds it at b >= 1.
TEST(KvAlloc, EveryWidthRoundTrips) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t W = 9 * 8;
  std::vector<uint8_t> b(W);
  for (int64_t c = 0; c < W; ++c) b[c] = static_cast<uint8_t>(c % 9);
  for (bool start : {false, true}) {
    std::vector<float> x = random_rows(W, rng);
    std::vector<uint8_t> y(static_cast<size_t>(alloc_block_bytes(b.data(), W)));
    quantize_alloc_block(x.data(), W, W, b.data(), y.data(), start);
    std::vector<float> back(x.size());
    dequantize_alloc_block(y.data(), W, b.data(), back.data());
    for (int64_t c = 0; c < W; ++c) {
      uint16_t zh;
      std::memcpy(&zh, y.data() + 2 * c, 2);
      const float z = f16_to_f32(zh), d = e4m3_value(y[static_cast<size_t>(2 * W + c)]) / 16.0f;
      const int L = (1 << b[c]) - 1;
      float col[kT];
      for (int j = 0; j < kT; ++j) col[j] = x[static_cast<size_t>(j * W + c)];
      ChanCodes want;
      quantize_chan_values(col, b[c], start, &want);
      ASSERT_EQ(zh, want.z);
      if (b[c] == 0) {
        double mean = 0;
        for (float v : col) mean += v;
        mean /= kT;
        ASSERT_EQ(zh, f32_to_f16(start ? col[0] : static_cast<float>(mean))) << c;
      }
      for (int j = 0; j < kT; ++j) {
        const int q = code_of(y.data(), W, b, c, j);
        ASSERT_EQ(q, want.q[j]);
        ASSERT_LE(q, L);
        const float got = back[static_cast<size_t>(j * W + c)];
        ASSERT_EQ(got, z + d * static_cast<float>(q));
        const float v = col[j];
        if (b[c] > 0 && v >= z && v <= z + d * static_cast<float>(L)) {
          ASSERT_LE(std::fabs(v - got), 0.5f * d * (1 + 1e-5f) + 1e-6f * std::fabs(v)) << c << " " << j;
        }
      }
      if (start && b[c] >= 1 && d > 0) {
        const float v0 = col[0], got0 = back[static_cast<size_t>(c)];
        // As q4c's test: within a tenth of a step and z's f16 rounding.
        ASSERT_LE(std::fabs(v0 - got0), 0.1f * d + std::ldexp(std::fabs(z), -11)) << "sink, channel " << c;
      }
    }
  }
}

// The same N(0, 1) channels at every width: from 2 bits on, each bit
// lowers the squared error. Not from 0 to 1: q4c's steps around (max -
// min) / L suit 15 levels, but at L = 1 the step is the whole range (the
// least-squares 1-bit step of a Gaussian is ~1.6 sigma against a range of
// ~4 sigma), so 1 bit does worse than z alone at the mean. Printed per
// width, relative to the values' energy.
TEST(KvAlloc, MoreBitsLessErrorFromTwoBits) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  double err[kKvChanMaxBits + 1] = {}, energy = 0;
  for (int ch = 0; ch < 256; ++ch) {
    float col[kT];
    for (float& v : col) {
      v = nd(rng);
      energy += double{v} * v;
    }
    for (int b = 0; b <= kKvChanMaxBits; ++b) {
      ChanCodes codes;
      quantize_chan_values(col, b, false, &codes);
      const float z = f16_to_f32(codes.z), d = e4m3_value(codes.d) / 16.0f;
      for (int j = 0; j < kT; ++j) {
        const double e = double{col[j]} - double{z + d * static_cast<float>(codes.q[j])};
        err[b] += e * e;
      }
    }
  }
  std::printf("q4a encoder, N(0,1) channels, squared error / energy by width 0..8:");
  for (double e : err) std::printf(" %.3g", e / energy);
  std::printf("\n");
  for (int b = 2; b <= kKvChanMaxBits; ++b) EXPECT_LT(err[b], err[b - 1]) << b;
}

// A channel holding a NaN or an infinity: every width as q4c treats it
// (z at or below the finite minimum, d = 0, codes 0), b = 0 too.
TEST(KvAlloc, NonFiniteChannelsKeepZAlone) {
  std::mt19937 rng(3);
  const int64_t W = 9 * 4;
  std::vector<uint8_t> b(W);
  for (int64_t c = 0; c < W; ++c) b[c] = static_cast<uint8_t>(c % 9);
  std::vector<float> x = random_rows(W, rng);
  for (int64_t c = 0; c < W; ++c) {
    const int kind = static_cast<int>(c / 9);  // 0 NaN, 1 +inf, 2 -inf, 3 finite
    const float bad = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
    if (kind < 3) x[static_cast<size_t>(5 * W + c)] = bad;
  }
  std::vector<uint8_t> y(static_cast<size_t>(alloc_block_bytes(b.data(), W)));
  quantize_alloc_block(x.data(), W, W, b.data(), y.data());
  const std::vector<uint8_t> four(W, 4);
  std::vector<uint8_t> q4c(static_cast<size_t>(19 * W));
  quantize_chan_block(x.data(), W, W, q4c.data());
  for (int64_t c = 0; c < 27; ++c) {
    float mn = INFINITY;
    for (int j = 0; j < kT; ++j) mn = std::min(mn, x[static_cast<size_t>(j * W + c)]);
    uint16_t zh;
    std::memcpy(&zh, y.data() + 2 * c, 2);
    ASSERT_LE(f16_to_f32(zh), mn) << c;
    ASSERT_EQ(y[static_cast<size_t>(2 * W + c)], 0) << c;
    uint16_t zq;
    std::memcpy(&zq, q4c.data() + 2 * c, 2);
    ASSERT_EQ(zh, zq) << "as q4c, channel " << c;
    for (int j = 0; j < kT; ++j) ASSERT_EQ(code_of(y.data(), W, b, c, j), 0);
  }
}

// Scores: the reference (double) against dequantize-then-dot in double,
// and each AVX-512 form against the reference within its stated bound.
TEST(KvAlloc, BlockScores) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const int64_t hd = 64, n_kv = 3, W = hd * n_kv;
  for (int variant = 0; variant < 4; ++variant) {
    // All 4; the mix; the mix at a sequence start; every width 0..8 (c % 9).
    std::vector<uint8_t> b = variant == 0 ? std::vector<uint8_t>(W, 4) : realistic_mix(W, 100 + variant);
    if (variant == 3) {
      for (int64_t c = 0; c < W; ++c) b[c] = static_cast<uint8_t>(c % 9);
    }
    std::vector<float> x = random_rows(W, rng);
    std::vector<uint8_t> y(static_cast<size_t>(alloc_block_bytes(b.data(), W)));
    quantize_alloc_block(x.data(), W, W, b.data(), y.data(), variant == 2);
    std::vector<float> back(x.size());
    dequantize_alloc_block(y.data(), W, b.data(), back.data());
    for (int n_rows : {1, 3, 5}) {
      std::vector<float> q(static_cast<size_t>(n_rows * hd));
      for (float& v : q) v = nd(rng);
      for (int64_t head = 0; head < n_kv; ++head) {
        const AllocHead h = alloc_head(y.data(), W, b.data(), alloc_plane_offset(b.data(), W, head * hd), head, hd);
        std::vector<float> ref(static_cast<size_t>(n_rows * kT));
        alloc_block_scores_ref(h, q.data(), n_rows, ref.data());
        for (int r = 0; r < n_rows; ++r) {
          // The bound's scale: sum_c |q_c z_c| + |q_c step_c| (2^b - 1).
          double scale = 0;
          int64_t n_terms = hd + 4;
          for (int64_t c = 0; c < hd; ++c) {
            const int64_t ch = head * hd + c;
            uint16_t zh;
            std::memcpy(&zh, y.data() + 2 * ch, 2);
            const double qc = q[static_cast<size_t>(r * hd + c)];
            scale += std::fabs(qc * f16_to_f32(zh)) +
                     std::fabs(qc * e4m3_value(y[static_cast<size_t>(2 * W + ch)]) / 16.0) * ((1 << b[ch]) - 1);
            n_terms += b[ch];
          }
          for (int j = 0; j < kT; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < hd; ++c) {
              dot += double{q[static_cast<size_t>(r * hd + c)]} * back[static_cast<size_t>(j * W + head * hd + c)];
            }
            // The reference is exact but for its one rounding; the decoded
            // values are rounded to f32 once each.
            const float s = ref[static_cast<size_t>(r * kT + j)];
            ASSERT_NEAR(s, dot, std::ldexp(std::fabs(dot), -24) + std::ldexp(scale, -23)) << r << " " << j;
          }
          if (!cpu_features().avx512) continue;
          std::vector<float> got(static_cast<size_t>(n_rows * kT)), wide(got.size());
          detail::alloc_block_scores_avx512(h, q.data(), n_rows, got.data());
          detail::alloc_block_scores_widen_avx512(h, q.data(), n_rows, wide.data());
          const double bound = static_cast<double>(n_terms) * std::ldexp(scale, -24);
          for (int j = 0; j < kT; ++j) {
            const size_t i = static_cast<size_t>(r * kT + j);
            ASSERT_NEAR(got[i], ref[i], bound) << "masked adds, row " << r << " token " << j;
            ASSERT_NEAR(wide[i], ref[i], bound) << "widened, row " << r << " token " << j;
          }
        }
      }
    }
  }
  if (!cpu_features().avx512) GTEST_SKIP() << "no AVX-512: the reference alone";
}

}  // namespace
}  // namespace rill::cpu
