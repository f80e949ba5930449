#include "core/half.h"

#include <gtest/gtest.h>

#include <cmath>

namespace rill {
namespace {

TEST(Half, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / nan
    EXPECT_EQ(f32_to_f16(f16_to_f32(bits)), bits) << std::hex << h;
  }
}

TEST(Half, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                      // rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(std::nanf("")) & 0x7fc0, 0x7fc0);
}

}  // namespace
}  // namespace rill
