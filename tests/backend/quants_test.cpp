// Block dequantizers, activation quantizers and quantized dot products:
// hand-built blocks, gguf.quants goldens, error bounds, and every ISA's
// kernels against the scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quants.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::random_weight_rows;

const DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                              DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ref::dequantize_row(t, src, out.data(), n);
  return out;
}

TEST(Dequantize, HandBuiltClassicBlocks) {
  BlockQ4_0 q40{};
  q40.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) q40.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto v = dequant(DType::kQ4_0, &q40, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], (j - 8) * 0.5f);
    EXPECT_EQ(v[j + 16], (7 - j) * 0.5f);
  }

  BlockQ4_1 q41{};
  q41.d = f32_to_f16(0.25f);
  q41.m = f32_to_f16(-1.0f);
  for (int j = 0; j < 16; ++j) q41.qs[j] = static_cast<uint8_t>(j | (3 << 4));
  v = dequant(DType::kQ4_1, &q41, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], j * 0.25f - 1.0f);
    EXPECT_EQ(v[j + 16], 3 * 0.25f - 1.0f);
  }

  // Q5: element j's fifth bit is bit j of qh (little-endian u32).
  BlockQ5_0 q50{};
  q50.d = f32_to_f16(2.0f);
  const uint32_t qh = 0x80000001u;  // elements 0 and 31
  std::memcpy(q50.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) q50.qs[j] = 0x21;  // low 1, high 2
  v = dequant(DType::kQ5_0, &q50, 32);
  EXPECT_EQ(v[0], (17 - 16) * 2.0f);
  EXPECT_EQ(v[1], (1 - 16) * 2.0f);
  EXPECT_EQ(v[16], (2 - 16) * 2.0f);
  EXPECT_EQ(v[31], (18 - 16) * 2.0f);

  BlockQ5_1 q51{};
  q51.d = f32_to_f16(1.0f);
  q51.m = f32_to_f16(0.5f);
  std::memcpy(q51.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) q51.qs[j] = 0xF0;
  v = dequant(DType::kQ5_1, &q51, 32);
  EXPECT_EQ(v[0], 16.5f);
  EXPECT_EQ(v[5], 0.5f);
  EXPECT_EQ(v[20], 15.5f);
  EXPECT_EQ(v[31], 31.5f);

  BlockQ8_0 q80{};
  q80.d = f32_to_f16(0.125f);
  for (int j = 0; j < 32; ++j) q80.qs[j] = static_cast<int8_t>(j * 8 - 127);
  v = dequant(DType::kQ8_0, &q80, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v[j], (j * 8 - 127) * 0.125f);
}

// Packs 6-bit scales/mins the way GGML's Q4_K quantizer does.
void pack_scales_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] = sc[j];
      out[j + 4] = mn[j];
    } else {
      out[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
      out[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      out[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
}

TEST(Dequantize, HandBuiltKBlocks) {
  const uint8_t sc[8] = {1, 63, 17, 40, 5, 33, 62, 48};
  const uint8_t mn[8] = {0, 2, 63, 20, 50, 9, 31, 60};
  BlockQ4_K b{};
  b.d = f32_to_f16(0.5f);
  b.dmin = f32_to_f16(0.25f);
  pack_scales_k4(sc, mn, b.scales);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | (((i * 7) % 16) << 4));
  auto v = dequant(DType::kQ4_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, byte = (e / 64) * 32 + e % 32;
    const int q = (e % 64) < 32 ? b.qs[byte] & 0xF : b.qs[byte] >> 4;
    EXPECT_EQ(v[e], 0.5f * sc[sub] * q - 0.25f * mn[sub]) << e;
  }

  BlockQ5_K b5{};
  b5.d = b.d;
  b5.dmin = b.dmin;
  std::memcpy(b5.scales, b.scales, 12);
  std::memcpy(b5.qs, b.qs, 128);
  for (int l = 0; l < 32; ++l) b5.qh[l] = static_cast<uint8_t>(l * 37);
  v = dequant(DType::kQ5_K, &b5, 256);
  for (int e = 0; e < 256; ++e) {
    const int sub = e / 32, byte = (e / 64) * 32 + e % 32;
    int q = (e % 64) < 32 ? b5.qs[byte] & 0xF : b5.qs[byte] >> 4;
    q |= ((b5.qh[e % 32] >> sub) & 1) << 4;
    EXPECT_EQ(v[e], 0.5f * sc[sub] * q - 0.25f * mn[sub]) << e;
  }

  // Q6_K: put q = e % 64 in element e using GGML's bit placement.
  BlockQ6_K b6{};
  b6.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b6.scales[j] = static_cast<int8_t>(j - 8);
  for (int e = 0; e < 256; ++e) {
    const int q = e % 64, half = e / 128, quarter = (e % 128) / 32, l = e % 32;
    uint8_t& ql = b6.ql[half * 64 + l + ((quarter & 1) ? 32 : 0)];
    ql |= static_cast<uint8_t>((q & 0xF) << (quarter >= 2 ? 4 : 0));
    b6.qh[half * 32 + l] |= static_cast<uint8_t>((q >> 4) << (2 * quarter));
  }
  v = dequant(DType::kQ6_K, &b6, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(v[e], 0.5f * (e / 16 - 8) * (e % 64 - 32)) << e;
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

DType dtype_by_name(const std::string& name) {
  for (DType t : kWeightTypes)
    if (dtype_name(t) == name) return t;
  ADD_FAILURE() << "unknown type " << name;
  return DType::kF32;
}

// Goldens from gguf.quants (tools/make_quant_goldens.py).
TEST(Dequantize, MatchesGgufNumpyReference) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/quants/blocks.json");
  ASSERT_TRUE(f) << "tests/data/quants/blocks.json missing";
  const auto j = nlohmann::json::parse(f);
  int n_types = 0;
  for (const auto& [name, entry] : j["types"].items()) {
    const DType t = dtype_by_name(name);
    const auto raw = from_hex(entry["hex"].get<std::string>());
    const auto want = entry["values"].get<std::vector<float>>();
    const auto got = dequant(t, raw.data(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << name << " element " << i;
    ++n_types;
  }
  EXPECT_EQ(n_types, 8);
}

TEST(Dequantize, MatchesDefaultModelRows) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/quants/smollm2_rows.json");
  if (!f) GTEST_SKIP() << "no smollm2_rows.json";
  const auto j = nlohmann::json::parse(f);
  for (const auto& [name, entry] : j["tensors"].items()) {
    const DType t = dtype_by_name(entry["type"].get<std::string>());
    const auto raw = from_hex(entry["hex"].get<std::string>());
    const auto want = entry["values"].get<std::vector<float>>();
    const auto got = dequant(t, raw.data(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << " element " << i;
  }
}

TEST(Quantize, Q8_0AndQ8_1FollowLlamaCpp) {
  const int64_t n = 256;
  auto x = random_floats(n, 7, -3.0f, 3.0f);
  x[5] = 0.0f;
  std::vector<BlockQ8_0> q0(n / 32);
  std::vector<BlockQ8_1> q1(n / 32);
  ref::quantize_row_q8_0(x.data(), q0.data(), n);
  ref::quantize_row_q8_1(x.data(), q1.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    EXPECT_EQ(q0[b].d, f32_to_f16(d));
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(q0[b].qs[j], q1[b].qs[j]);
      EXPECT_LE(std::fabs(q0[b].qs[j] * d - x[b * 32 + j]), d * 0.5f + 1e-6f);
      sum += q1[b].qs[j];
    }
    EXPECT_EQ(q1[b].s, f32_to_f16(d * static_cast<float>(sum)));
  }
  // An all-zero block quantizes to zeros with d = 0.
  std::vector<float> z(32, 0.0f);
  ref::quantize_row_q8_0(z.data(), q0.data(), 32);
  EXPECT_EQ(q0[0].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q0[0].qs[j], 0);
}

TEST(Quantize, Q8_KFollowsLlamaCpp) {
  const int64_t n = 512;
  auto x = random_floats(n, 9, -2.0f, 2.0f);
  x[300] = 5.0f;  // the extreme of block 1 is positive: iscale = -127/max, so it maps to -127
  std::vector<BlockQ8_K> q(n / 256);
  ref::quantize_row_q8_k(x.data(), q.data(), n);
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[b].qs[16 * j + l];
      EXPECT_EQ(q[b].bsums[j], s);
    }
    for (int e = 0; e < 256; ++e)
      EXPECT_LE(std::fabs(q[b].d * q[b].qs[e] - x[b * 256 + e]), std::fabs(q[b].d) * 0.5f + 1e-6f);
  }
  EXPECT_EQ(q[1].qs[300 - 256], -127);
  EXPECT_FLOAT_EQ(q[1].d, -5.0f / 127.0f);
}

// The reference dot equals the f64 dot of the dequantized rows up to f32 rounding.
TEST(VecDot, ReferenceMatchesDequantizedDot) {
  const int64_t n = 512;
  for (DType t : kWeightTypes) {
    const auto w = random_weight_rows(t, 1, n, 11);
    const auto x = random_floats(n, 12);
    const DType p = vec_dot_partner(t);
    std::vector<uint8_t> a(row_bytes(p, n));
    ref::quantize_row(p, x.data(), a.data(), n);
    const auto wf = dequant(t, w.data(), n);
    const auto af = dequant(p, a.data(), n);
    double want = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      want += static_cast<double>(wf[i]) * af[i];
      mag += std::fabs(static_cast<double>(wf[i]) * af[i]);
    }
    const float got = ref::vec_dot(t, n, w.data(), a.data());
    EXPECT_NEAR(got, want, 1e-5 * mag + 1e-6) << dtype_name(t);
  }
}

// Every ISA's activation quantizers produce the reference's bytes.
TEST(FastPaths, QuantizersMatchReferenceBytes) {
  const int64_t n = 1536;
  auto x = random_floats(n, 21, -4.0f, 4.0f);
  for (int i = 0; i < 32; ++i) x[64 + i] = 0.0f;  // an all-zero block
  x[100] = 127.0f * 0.5f;                         // exact halves exercise the rounding mode
  for (Isa isa : available_isas()) {
    const Kernels& k = kernels(isa);
    for (DType p : {DType::kQ8_0, DType::kQ8_1, DType::kQ8_K}) {
      std::vector<uint8_t> want(row_bytes(p, n)), got(row_bytes(p, n));
      ref::quantize_row(p, x.data(), want.data(), n);
      k.quantize[static_cast<size_t>(p)](x.data(), got.data(), n);
      EXPECT_EQ(want, got) << isa_name(isa) << " " << dtype_name(p);
    }
  }
}

// Every ISA's gemm tiles match the scalar reference for all tile shapes.
TEST(FastPaths, GemmTilesMatchReference) {
  for (int64_t n : {256, 512, 1536}) {
    for (DType t : kWeightTypes) {
      if (n % dtype_info(t).block_size) continue;
      const int rows = kMaxTileRows, cols = kMaxTileCols;
      const auto w = random_weight_rows(t, rows, n, static_cast<uint32_t>(n) + 3);
      const auto x = random_floats(n * cols, 5);
      const DType p = vec_dot_partner(t);
      const size_t a_stride = p == DType::kF32 ? n * 4 : row_bytes(p, n);
      std::vector<uint8_t> a(a_stride * cols);
      for (int c = 0; c < cols; ++c) ref::quantize_row(p, x.data() + c * n, a.data() + c * a_stride, n);
      const size_t w_stride = row_bytes(t, n);
      // Tolerance: f32 rounding of differently ordered sums, relative to sum |w * a|.
      float mag[kMaxTileCols][kMaxTileRows];
      for (int c = 0; c < cols; ++c) {
        const auto af = dequant(p, a.data() + c * a_stride, n);
        for (int r = 0; r < rows; ++r) {
          const auto wf = dequant(t, w.data() + r * row_bytes(t, n), n);
          double m = 0.0;
          for (int64_t i = 0; i < n; ++i) m += std::fabs(static_cast<double>(wf[i]) * af[i]);
          mag[c][r] = static_cast<float>(m);
        }
      }
      float want[kMaxTileCols][kMaxTileRows];
      ref::gemm_tile(t, n, w.data(), w_stride, rows, a.data(), a_stride, cols, &want[0][0], kMaxTileRows);
      for (Isa isa : available_isas()) {
        const GemmTileFn gemm = kernels(isa).gemm[static_cast<size_t>(t)];
        ASSERT_NE(gemm, nullptr);
        for (int n_r = 1; n_r <= rows; ++n_r) {
          for (int n_t = 1; n_t <= cols; ++n_t) {
            float got[kMaxTileCols][kMaxTileRows] = {};
            gemm(n, w.data(), w_stride, n_r, a.data(), a_stride, n_t, &got[0][0], kMaxTileRows);
            for (int c = 0; c < n_t; ++c)
              for (int r = 0; r < n_r; ++r)
                EXPECT_NEAR(got[c][r], want[c][r], 1e-6f * mag[c][r] + 1e-6f)
                    << isa_name(isa) << " " << dtype_name(t) << " n=" << n << " tile " << n_r << "x" << n_t << " at "
                    << r << "," << c;
            // Outside the tile nothing is written.
            for (int c = 0; c < cols; ++c)
              for (int r = 0; r < rows; ++r)
                if (c >= n_t || r >= n_r) {
                  EXPECT_EQ(got[c][r], 0.0f);
                }
          }
        }
      }
    }
  }
}

// llama.cpp's x86 vec_dot for Q4_1 x Q8_1 and Q8_0 x Q8_0 (AVX2 / AVX512-VNNI
// builds): 8 f32 lanes, lane l accumulating fma(d_w * d_a, sum of products
// of elements 4l..4l+3, acc) over the blocks in order, then its hsum_float_8
// order, plus (Q4_1) a scalar fma chain of m * s. Our SIMD tiles must give
// exactly these bits for every tile shape, so rill's logits equal llama.cpp's.
float llamacpp_dot(DType t, int64_t n, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {}, summs = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    int q[32], y[32];
    float dw, da;
    if (t == DType::kQ4_1) {
      const auto& wb = reinterpret_cast<const BlockQ4_1*>(w)[b];
      const auto& ab = reinterpret_cast<const BlockQ8_1*>(a)[b];
      for (int j = 0; j < 16; ++j) q[j] = wb.qs[j] & 0xF, q[j + 16] = wb.qs[j] >> 4;
      for (int j = 0; j < 32; ++j) y[j] = ab.qs[j];
      dw = f16_to_f32(wb.d);
      da = f16_to_f32(ab.d);
      summs = std::fmaf(f16_to_f32(wb.m), f16_to_f32(ab.s), summs);
    } else {
      const auto& wb = reinterpret_cast<const BlockQ8_0*>(w)[b];
      const auto& ab = reinterpret_cast<const BlockQ8_0*>(a)[b];
      for (int j = 0; j < 32; ++j) q[j] = wb.qs[j], y[j] = ab.qs[j];
      dw = f16_to_f32(wb.d);
      da = f16_to_f32(ab.d);
    }
    const float d = dw * da;
    for (int l = 0; l < 8; ++l) {
      int lane = 0;
      for (int j = 4 * l; j < 4 * l + 4; ++j) lane += q[j] * y[j];
      acc[l] = std::fmaf(d, static_cast<float>(lane), acc[l]);
    }
  }
  const float h = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  return h + summs;
}

// Every token count 1..9 (one-token decode, the 4-token tiles and their
// lone-token tails, the Q8_0 pair tiles from 9) and 1..5 rows (5: a tile
// and a lone row); row lengths below and above the AVX-512 tiles' per-call
// tables (64 blocks of start lanes, 256 blocks of scales).
TEST(FastPaths, DotsAreBitExactWithLlamaCppOrder) {
  constexpr int kRows = 5, kTokens = 9;
  for (int64_t n : {576, 4096, 8448}) {
    for (DType t : {DType::kQ4_1, DType::kQ8_0}) {
      const DType p = vec_dot_partner(t);
      const auto w = random_weight_rows(t, kRows, n, 91);
      const auto x = random_floats(n * kTokens, 92, -3.0f, 3.0f);
      const size_t ws = row_bytes(t, n), as = row_bytes(p, n);
      std::vector<uint8_t> a(as * kTokens);
      for (int c = 0; c < kTokens; ++c) ref::quantize_row(p, x.data() + c * n, a.data() + c * as, n);
      float want[kTokens][kRows];
      for (int c = 0; c < kTokens; ++c)
        for (int r = 0; r < kRows; ++r) want[c][r] = llamacpp_dot(t, n, w.data() + r * ws, a.data() + c * as);
      for (Isa isa : available_isas()) {
        if (isa == Isa::kScalar) continue;
        for (int n_r = 1; n_r <= kRows; ++n_r) {
          for (int n_t = 1; n_t <= kTokens; ++n_t) {
            float got[kTokens][kRows];
            kernels(isa).gemm[static_cast<size_t>(t)](n, w.data(), ws, n_r, a.data(), as, n_t, &got[0][0], kRows);
            for (int c = 0; c < n_t; ++c)
              for (int r = 0; r < n_r; ++r)
                ASSERT_EQ(got[c][r], want[c][r])
                    << isa_name(isa) << " " << dtype_name(t) << " n=" << n << " tile " << n_r << "x" << n_t;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
