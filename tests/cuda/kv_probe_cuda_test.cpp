// The KV types' device helpers held bit for bit to their references
// (backend/cuda/kv_probe.h's hooks):
//  - mma_tile.cuh load8h<KvT> (f16 arithmetic on load8_biased's level
//    bytes) gives the bits of __floats2half2_rn of KvT::load8's f32 values
//    for q8_0, q4_0 and iq4_nl: every level byte (q4_0 / iq4_nl: every
//    pair of codes a byte holds) under scales at f16's edges (smallest
//    subnormal, largest subnormal, smallest normal, 1, largest finite,
//    +-inf, NaN, -0); equal bits except where both are NaN;
//  - kv_rotated.cuh Iq4nlLevels::code (a 4-step midpoint search) gives the
//    CPU's iq4_nl code (backend/cpu/kv_quant.cpp NlLevels::code: the count
//    of midpoints strictly below y) at each midpoint, its float neighbours
//    both ways, each level, +-0, +-inf and NaN.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/quants.h"
#include "backend/cuda/kv_probe.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

constexpr uint16_t kScales[] = {0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x8000};

bool f16_nan(uint16_t b) {
  return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0;
}

// One row: for each scale, blocks whose level bytes run through 0..255
// (a block is the f16 scale then qs_bytes level bytes).
std::vector<uint8_t> all_bytes_row(int qs_bytes) {
  std::vector<uint8_t> row;
  for (const uint16_t s : kScales) {
    for (int b0 = 0; b0 < 256; b0 += qs_bytes) {
      row.push_back(static_cast<uint8_t>(s & 0xff));
      row.push_back(static_cast<uint8_t>(s >> 8));
      for (int j = 0; j < qs_bytes; ++j) row.push_back(static_cast<uint8_t>(b0 + j));
    }
  }
  return row;
}

TEST(KvProbe, Load8hIsTheF32RouteRoundedToF16) {
  RILL_REQUIRE_GPU();
  struct Case {
    DType t;
    int qs_bytes;
  };
  for (const Case c : {Case{DType::kQ8_0, 32}, Case{DType::kQ4_0, 16}, Case{DType::kIQ4_NL, 16}}) {
    const std::vector<uint8_t> row = all_bytes_row(c.qs_bytes);
    std::vector<uint16_t> via_h, via_f32;
    const Status st = probe_load8h(c.t, row, via_h, via_f32);
    ASSERT_TRUE(st.ok()) << st.error().message;
    const size_t blocks = row.size() / static_cast<size_t>(2 + c.qs_bytes);
    ASSERT_EQ(via_h.size(), blocks * 32);
    ASSERT_EQ(via_f32.size(), blocks * 32);
    int mismatches = 0;
    for (size_t i = 0; i < via_h.size(); ++i) {
      if (via_h[i] == via_f32[i] || (f16_nan(via_h[i]) && f16_nan(via_f32[i]))) continue;
      if (++mismatches <= 8) {
        const size_t blk = i / 32;
        const size_t at = blk * static_cast<size_t>(2 + c.qs_bytes);
        ADD_FAILURE() << dtype_name(c.t) << " block " << blk << " (scale 0x" << std::hex
                      << (row[at] | (row[at + 1] << 8)) << ") element " << std::dec << i % 32 << ": load8h 0x"
                      << std::hex << via_h[i] << ", f32 route 0x" << via_f32[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(c.t);
  }
}

TEST(KvProbe, Load8hRefusesOtherTypes) {
  RILL_REQUIRE_GPU();
  std::vector<uint16_t> a, b;
  EXPECT_FALSE(probe_load8h(DType::kF16, std::vector<uint8_t>(64), a, b).ok());
  EXPECT_FALSE(probe_load8h(DType::kQ8_0, std::vector<uint8_t>(35), a, b).ok());
}

// backend/cpu/kv_quant.cpp NlLevels::code (file-local there): the number
// of midpoints 0.5 (v[i] + v[i + 1]) strictly below y, in f32.
int cpu_iq4nl_code(float y) {
  int q = 0;
  for (int i = 0; i < 15; ++i) {
    q += y > 0.5f * static_cast<float>(cpu::kIq4nlValues[i] + cpu::kIq4nlValues[i + 1]) ? 1 : 0;
  }
  return q;
}

TEST(KvProbe, Iq4nlCodeIsTheCpusCount) {
  RILL_REQUIRE_GPU();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> y = {
      0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 15; ++i) {
    const float mid = 0.5f * static_cast<float>(cpu::kIq4nlValues[i] + cpu::kIq4nlValues[i + 1]);
    y.push_back(mid);
    y.push_back(std::nextafter(mid, kInf));
    y.push_back(std::nextafter(mid, -kInf));
  }
  for (const int8_t v : cpu::kIq4nlValues) y.push_back(static_cast<float>(v));
  std::vector<int> codes;
  const Status st = probe_iq4nl_code(y, codes);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(codes.size(), y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(codes[i], cpu_iq4nl_code(y[i])) << "y " << y[i] << " (" << std::hexfloat << y[i] << ")";
  }
  // The count's edges: a midpoint takes the lower level, its next float up the higher.
  EXPECT_EQ(cpu_iq4nl_code(-115.5f), 0);
  EXPECT_EQ(cpu_iq4nl_code(std::nextafter(-115.5f, kInf)), 1);
  EXPECT_EQ(cpu_iq4nl_code(kInf), 15);
}

}  // namespace
}  // namespace rill::cuda
