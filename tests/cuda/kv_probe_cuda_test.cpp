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
//    both ways, each level, +-0, +-inf and NaN;
//  - q4_1, q5_0 and q5_1 (kv_types_ggml.cuh): load8h, load8 and the CPU's
//    dequantization agree (GgmlBlocksLoad8hIsTheCpusValues);
//  - iq4_nlh64's blocks of 64: load8h, load8 and the CPU's dequantization
//    agree (Iq4Nl64Load8IsTheCpusValues), and its scale's e4m3 rounding is
//    the CPU's (E4m3RoundIsTheCpus); the same code built for the host runs
//    without a GPU (HostRunsOfTheIq4Nl64CodeAreTheCpus).
// Skipped without a CUDA device (but the host runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/quants.h"
#include "backend/cuda/kv_probe.h"
#include "core/e4m3.h"
#include "core/half.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

constexpr uint16_t kScales[] = {0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x8000};

uint32_t f32_bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

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

// q4_1, q5_0 and q5_1 (kv_types_ggml.cuh, not yet run on a GPU): load8h
// (q5_0: the f16 arithmetic on load8_biased's codes; q4_1 / q5_1: the f32
// route, their levels carry a minimum) and load8 rounded to f16 give the
// CPU's dequantized values rounded to f16, for every pair of codes a byte
// holds under fifth bits all clear, all set and mixed, the scales at f16's
// edges of kScales and minimums of both signs, at f16's edges too.
TEST(KvProbe, GgmlBlocksLoad8hIsTheCpusValues) {
  RILL_REQUIRE_GPU();
  constexpr uint32_t kQh[] = {0u, 0xffffffffu, 0x5555aaaau, 0xa5a55a5au};
  constexpr uint16_t kMins[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7bff, 0x8001, 0xfc00};
  for (const DType t : {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    SCOPED_TRACE(dtype_name(t));
    const bool has_min = t != DType::kQ5_0, has_qh = t != DType::kQ4_1;
    std::vector<uint8_t> row;
    auto put16 = [&](uint16_t v) {
      row.push_back(static_cast<uint8_t>(v & 0xff));
      row.push_back(static_cast<uint8_t>(v >> 8));
    };
    for (const uint16_t d : kScales) {
      for (size_t k = 0; k < (has_min ? std::size(kMins) : 1); ++k) {
        for (size_t h = 0; h < (has_qh ? std::size(kQh) : 1); ++h) {
          for (int b0 = 0; b0 < 256; b0 += 16) {
            put16(d);
            if (has_min) put16(kMins[k]);
            if (has_qh) {
              put16(static_cast<uint16_t>(kQh[h] & 0xffff));
              put16(static_cast<uint16_t>(kQh[h] >> 16));
            }
            for (int j = 0; j < 16; ++j) row.push_back(static_cast<uint8_t>(b0 + j));
          }
        }
      }
    }
    const size_t block_bytes = static_cast<size_t>(dtype_info(t).block_bytes), n = row.size() / block_bytes * 32;
    std::vector<uint16_t> via_h, via_f32;
    const Status st = probe_load8h(t, row, via_h, via_f32);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(via_h.size(), n);
    std::vector<float> cpu_x(n);
    cpu::ref::dequantize_row(t, row.data(), cpu_x.data(), static_cast<int64_t>(n));
    int mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = f32_to_f16(cpu_x[i]);
      const bool nan = f16_nan(via_f32[i]) && f16_nan(want) && f16_nan(via_h[i]);
      if (nan || (via_h[i] == via_f32[i] && via_f32[i] == want)) continue;
      if (++mismatches <= 8) {
        ADD_FAILURE() << "block " << i / 32 << " element " << i % 32 << ": load8h 0x" << std::hex << via_h[i]
                      << ", f32 route 0x" << via_f32[i] << ", CPU 0x" << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
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

// iq4_nlh64's blocks of 64 (kv_types.cuh KvIq4Nl64: an e4m3 scale byte,
// then 32 code bytes, so blocks of 33 bytes put the codes at every
// alignment): load8h (f16 arithmetic on load8_biased's level bytes) is
// load8's f32 route rounded to f16, and load8's f32 values (codes read
// unaligned, funnel-shifted) are the CPU's dequantization
// (cpu::dequantize_row, dq_iq4_nl64's x = e4m3_value / 16 * level), for
// every code byte under e4m3 scales at its edges (0, the smallest and
// largest subnormal, the smallest normal, 1, 448, NaN, -0, -448).
TEST(KvProbe, Iq4Nl64Load8IsTheCpusValues) {
  RILL_REQUIRE_GPU();
  constexpr uint8_t kE4m3[] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x7e, 0x7f, 0x80, 0xfe, 0x3b};
  std::vector<uint8_t> row;
  for (const uint8_t s : kE4m3) {
    for (int b0 = 0; b0 < 256; b0 += 32) {
      row.push_back(s);
      for (int j = 0; j < 32; ++j) row.push_back(static_cast<uint8_t>(b0 + j));
    }
  }
  std::vector<uint16_t> via_h, via_f32;
  const Status st = probe_load8h(kKvIq4Nl64, row, via_h, via_f32);
  ASSERT_TRUE(st.ok()) << st.error().message;
  const size_t n = row.size() / 33 * 64;
  ASSERT_EQ(via_h.size(), n);
  std::vector<float> cpu_x(n);
  cpu::ref::dequantize_row(kKvIq4Nl64, row.data(), cpu_x.data(), static_cast<int64_t>(n));
  int mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t want = f32_to_f16(cpu_x[i]);
    const bool nan = f16_nan(via_f32[i]) && f16_nan(want) && f16_nan(via_h[i]);
    if (nan || (via_h[i] == via_f32[i] && via_f32[i] == want)) continue;
    if (++mismatches <= 8) {
      ADD_FAILURE() << "block " << i / 64 << " (scale 0x" << std::hex << int{row[i / 64 * 33]} << ") element "
                    << std::dec << i % 64 << ": load8h 0x" << std::hex << via_h[i] << ", f32 route 0x" << via_f32[i]
                    << ", CPU 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// kv_rotated.cuh e4m3_round_bits (iq4_nlh64's stored scale, the e4m3 code
// of 16 d) gives core/e4m3.h e4m3_round's byte: every e4m3 value, the
// midpoints between neighbours (ties to the even code) and their float
// neighbours, both signs, the subnormal edge (2^-6), below the smallest
// subnormal's half, 448 and past it (saturating), infinities and NaNs.
std::vector<float> e4m3_edge_values() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {kInf,
                          -kInf,
                          std::numeric_limits<float>::quiet_NaN(),
                          0.0f,
                          -0.0f,
                          448.0f,
                          463.9f,
                          464.0f,
                          480.0f,
                          1e30f,
                          0.015625f,
                          std::ldexp(1.0f, -10),
                          std::ldexp(1.0f, -11),
                          1e-40f,
                          3e38f};
  std::vector<float> values;
  for (int b = 0; b < 0x7f; ++b) values.push_back(e4m3_value(static_cast<uint8_t>(b)));
  for (size_t i = 0; i < values.size(); ++i) {
    for (const float sign : {1.0f, -1.0f}) {
      x.push_back(sign * values[i]);
      if (i + 1 < values.size()) {
        const float mid = 0.5f * (values[i] + values[i + 1]);
        x.push_back(sign * mid);
        x.push_back(sign * std::nextafter(mid, kInf));
        x.push_back(sign * std::nextafter(mid, -kInf));
      }
    }
  }
  return x;
}

void expect_cpu_e4m3(const std::vector<float>& x, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(bytes.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(int{bytes[i]}, int{e4m3_round(x[i])}) << "x " << x[i] << " (" << std::hexfloat << x[i] << ")";
  }
}

TEST(KvProbe, E4m3RoundIsTheCpus) {
  RILL_REQUIRE_GPU();
  const std::vector<float> x = e4m3_edge_values();
  std::vector<uint8_t> bytes;
  const Status st = probe_e4m3_round(x, bytes);
  ASSERT_TRUE(st.ok()) << st.error().message;
  expect_cpu_e4m3(x, bytes);
}

// The same source built for the host (no GPU needed): e4m3_round_bits, and
// KvIq4Nl64's loads (their unaligned code reads, nibbles, e4m3 scale) over
// rows at every alignment against the CPU's dequantization, bit for bit.
TEST(KvProbe, HostRunsOfTheIq4Nl64CodeAreTheCpus) {
  std::vector<uint8_t> bytes;
  const std::vector<float> x = e4m3_edge_values();
  host_e4m3_round(x, bytes);
  expect_cpu_e4m3(x, bytes);
  constexpr uint8_t kE4m3[] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x7e, 0x80, 0xfe, 0x3b, 0x45};
  std::vector<uint8_t> row;
  for (const uint8_t sc : kE4m3) {
    for (int b0 = 0; b0 < 256; b0 += 32) {
      row.push_back(sc);
      for (int j = 0; j < 32; ++j) row.push_back(static_cast<uint8_t>(b0 + j));
    }
  }
  const auto n = static_cast<int64_t>(row.size() / 33 * 64);
  std::vector<float> want(static_cast<size_t>(n));
  cpu::ref::dequantize_row(kKvIq4Nl64, row.data(), want.data(), n);
  for (size_t lead = 0; lead < 4; ++lead) {
    std::vector<uint8_t> buf(lead + row.size() + 8, 0xEE);
    std::copy(row.begin(), row.end(), buf.begin() + static_cast<ptrdiff_t>(lead));
    std::vector<float> l1(want.size()), l4(want.size()), l8(want.size());
    host_iq4nl64_loads(buf.data() + lead, n, l1.data(), l4.data(), l8.data());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(f32_bits(l1[i]), f32_bits(want[i])) << "load1, lead " << lead << " element " << i;
      ASSERT_EQ(f32_bits(l4[i]), f32_bits(want[i])) << "load4, lead " << lead << " element " << i;
      ASSERT_EQ(f32_bits(l8[i]), f32_bits(want[i])) << "load8, lead " << lead << " element " << i;
    }
  }
}

}  // namespace
}  // namespace rill::cuda
