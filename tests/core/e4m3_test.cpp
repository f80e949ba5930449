// core/e4m3.h: the host's e4m3 (fn) decoding and rounding, the reference of
// CUDA's fp8 KV (backend/cuda/kv_types.cuh; cvt.rn.satfinite on the device):
//  - every finite code decodes to the OCP table's value (spot checks) and
//    rounds back to itself;
//  - rounding is to the nearest value, ties to the even code, checked
//    against a search over all 127 magnitudes on a dense grid and at every
//    midpoint;
//  - saturation at +-448 (never the NaN code), NaN to 0x7f, signed zero kept.
#include "core/e4m3.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace rill {
namespace {

// The nearest magnitude by search: codes 0..126 ascend.
uint8_t nearest_by_search(float a) {
  uint8_t best = 0;
  for (int c = 1; c <= 126; ++c) {
    const float d = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a), db = std::fabs(e4m3_value(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = static_cast<uint8_t>(c);
  }
  return best;
}

TEST(E4m3, DecodesTheOcpTable) {
  EXPECT_EQ(e4m3_value(0x00), 0.0f);
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_value(0x38), 1.0f);
  EXPECT_EQ(e4m3_value(0x7e), 448.0f);
  EXPECT_EQ(e4m3_value(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_value(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_value(0xff)));
}

TEST(E4m3, EveryFiniteCodeRoundsBackToItself) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(e4m3_round(e4m3_value(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(E4m3, RoundsToNearestTiesToEven) {
  // A dense grid over the whole range, both signs.
  for (float a = 0.0f; a < 460.0f; a = a < 0.05f ? a + 1.0f / 8192 : a * 1.0009f + 1e-7f) {
    const uint8_t want = a >= 448.0f ? 0x7e : nearest_by_search(a);
    ASSERT_EQ(e4m3_round(a), want) << a;
    ASSERT_EQ(e4m3_round(-a), want | 0x80) << -a;
  }
  // Every midpoint between neighbours goes to the even code.
  for (int c = 0; c < 126; ++c) {
    const float mid = (e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2;
    EXPECT_EQ(e4m3_round(mid), c % 2 == 0 ? c : c + 1) << mid;
  }
}

TEST(E4m3, SaturatesAndKeepsNanAndSignedZero) {
  EXPECT_EQ(e4m3_round(448.0f), 0x7e);
  EXPECT_EQ(e4m3_round(464.0f), 0x7e);  // would round to 480, which e4m3fn lacks
  EXPECT_EQ(e4m3_round(1e30f), 0x7e);
  EXPECT_EQ(e4m3_round(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_round(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_round(std::nanf("")), 0x7f);
  EXPECT_EQ(e4m3_round(-0.0f), 0x80);
  EXPECT_EQ(e4m3_round(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
}

// The branch-free decoder the CPU's fp8 attention uses, against the
// reference for all 256 codes, bit for bit (signed zeros and subnormals
// included); both NaN codes NaN.
TEST(E4m3, BranchFreeDecoderIsTheReferenceForEveryCode) {
  for (int i = 0; i < 256; ++i) {
    const auto b = static_cast<uint8_t>(i);
    const float want = e4m3_value(b), got = e4m3_to_f32(b);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << i;
      continue;
    }
    uint32_t wb, gb;
    std::memcpy(&wb, &want, 4);
    std::memcpy(&gb, &got, 4);
    EXPECT_EQ(gb, wb) << "code " << i << ": " << got << " against " << want;
  }
}

}  // namespace
}  // namespace rill
