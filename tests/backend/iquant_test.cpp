// The low-bit GGUF types Q2_K, Q3_K, IQ4_NL, IQ4_XS: dequantization against
// the gguf package's numpy reference, the scalar dots against a second,
// independent transcription of their definition (read from the block bytes
// the way llama.cpp's code does, not through quants.h's helpers: llama.cpp's
// x86 vec_dot order for Q2_K, Q3_K, IQ4_NL; for IQ4_XS rill's own, one exact
// int32 per super-block, which stays within rounding of llama.cpp's), and
// every ISA's gemm tiles against the scalar reference bit for bit, for every
// tile shape, long rows, batches, odd IQ4_NL block counts and extreme values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::random_weight_rows;

const DType kTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS};

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ref::dequantize_row(t, src, out.data(), n);
  return out;
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

TEST(IQuant, TypeInfoAndPartners) {
  EXPECT_EQ(dtype_info(DType::kQ2_K).block_bytes, 84);
  EXPECT_EQ(dtype_info(DType::kQ3_K).block_bytes, 110);
  EXPECT_EQ(dtype_info(DType::kIQ4_NL).block_bytes, 18);
  EXPECT_EQ(dtype_info(DType::kIQ4_XS).block_bytes, 136);
  EXPECT_EQ(dtype_name(DType::kIQ4_XS), "IQ4_XS");
  EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(DType::kIQ4_NL)), "IQ4_NL");
  EXPECT_EQ(vec_dot_partner(DType::kIQ4_NL), DType::kQ8_0);
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS}) EXPECT_EQ(vec_dot_partner(t), DType::kQ8_K);
}

// Goldens from gguf.quants (tools/make_iquant_goldens.py).
TEST(IQuant, DequantizeMatchesGgufNumpyReference) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/quants/iquant_blocks.json");
  ASSERT_TRUE(f) << "tests/data/quants/iquant_blocks.json missing";
  const auto j = nlohmann::json::parse(f);
  int n_types = 0;
  for (DType t : kTypes) {
    const auto& entry = j["types"][std::string(dtype_name(t))];
    const auto raw = from_hex(entry["hex"].get<std::string>());
    const auto want = entry["values"].get<std::vector<float>>();
    ASSERT_EQ(raw.size() % static_cast<size_t>(dtype_info(t).block_bytes), 0u);
    ASSERT_EQ(want.size() / static_cast<size_t>(dtype_info(t).block_size),
              raw.size() / static_cast<size_t>(dtype_info(t).block_bytes));
    const auto got = dequant(t, raw.data(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << dtype_name(t) << " element " << i;
    ++n_types;
  }
  EXPECT_EQ(n_types, 4);
}

TEST(IQuant, HandBuiltBlocks) {
  // IQ4_NL: element j (< 16) is the low nibble of qs[j], j + 16 the high one.
  BlockIQ4_NL nl{};
  nl.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) nl.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto v = dequant(DType::kIQ4_NL, &nl, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v[j], 0.5f * kIq4nlValues[j]);
    EXPECT_EQ(v[j + 16], 0.5f * kIq4nlValues[15 - j]);
  }
  // Q2_K: q = 3 everywhere, scale nibble 2 and min nibble 5 in sub-block 0, else 0.
  BlockQ2_K q2{};
  q2.d = f32_to_f16(0.25f);
  q2.dmin = f32_to_f16(1.0f);
  q2.scales[0] = 0x52;
  std::memset(q2.qs, 0xFF, sizeof(q2.qs));
  v = dequant(DType::kQ2_K, &q2, 256);
  for (int e = 0; e < 16; ++e) EXPECT_EQ(v[e], 0.25f * 2 * 3 - 5.0f);
  for (int e = 16; e < 256; ++e) EXPECT_EQ(v[e], 0.0f);
  // Q3_K: scale 6-bit 33 (so +1) for sub-block 5 only; hmask bit set -> q = low bits.
  BlockQ3_K q3{};
  q3.d = f32_to_f16(2.0f);
  for (int j = 0; j < 16; ++j) {  // all scales 32 (-> 0) except sub-block 5 = 33
    const int s = j == 5 ? 33 : 32;
    if (j < 8)
      q3.scales[j] = static_cast<uint8_t>((q3.scales[j] & 0xF0) | (s & 0xF));
    else
      q3.scales[j - 8] = static_cast<uint8_t>((q3.scales[j - 8] & 0x0F) | ((s & 0xF) << 4));
    q3.scales[8 + j % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (j / 4)));
  }
  // sub-block 5 = elements 80..95 = half 0, chunk 2 (shift 4), l = 16..31; hmask bit 2
  for (int l = 16; l < 32; ++l) {
    q3.qs[l] = static_cast<uint8_t>((l % 4) << 4);
    if (l % 2) q3.hmask[l] = 1 << 2;
  }
  v = dequant(DType::kQ3_K, &q3, 256);
  for (int e = 0; e < 256; ++e) {
    const int l = e % 32;
    const float want = e >= 80 && e < 96 ? 2.0f * ((l % 4) - (l % 2 ? 0 : 4)) : 0.0f;
    EXPECT_EQ(v[e], want) << e;
  }
  // IQ4_XS: sub-block 3's scale 6-bit 40 (-> 8), the rest 32 (-> 0); all codes 15 (113).
  BlockIQ4_XS xs{};
  xs.d = f32_to_f16(0.125f);
  for (int j = 0; j < 8; ++j) {
    const int s = j == 3 ? 40 : 32;
    xs.scales_l[j / 2] |= static_cast<uint8_t>((s & 0xF) << (4 * (j % 2)));
    xs.scales_h |= static_cast<uint16_t>((s >> 4) << (2 * j));
  }
  std::memset(xs.qs, 0xFF, sizeof(xs.qs));
  v = dequant(DType::kIQ4_XS, &xs, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(v[e], e / 32 == 3 ? 0.125f * 8 * 113 : 0.0f) << e;
}

// --- llama.cpp's vec_dot (x86 AVX2 / AVX-512 builds), transcribed -----------

float hsum_float_8(const float* a) {  // extract hi + lo, movehl, movehdup
  float r[4];
  for (int i = 0; i < 4; ++i) r[i] = a[i + 4] + a[i];
  const float s0 = r[0] + r[2], s1 = r[1] + r[3];
  return s0 + s1;
}

// ggml_vec_dot_q2_K_q8_K: mins from the high nibbles times bsums (madd), then
// per 128-element half 4 x maddubs(q2 bits, q8) madd'ed with the scale shuffle.
float llama_q2_k(int64_t nb, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* x = w + i * 84;
    const auto& y = reinterpret_cast<const BlockQ8_K*>(a)[i];
    uint16_t dh, dmh;
    std::memcpy(&dh, x + 80, 2);
    std::memcpy(&dmh, x + 82, 2);
    const float d = y.d * f16_to_f32(dh), dmin = -y.d * f16_to_f32(dmh);
    for (int l = 0; l < 8; ++l)
      acc[l] = std::fmaf(
          dmin, static_cast<float>((x[2 * l] >> 4) * y.bsums[2 * l] + (x[2 * l + 1] >> 4) * y.bsums[2 * l + 1]),
          acc[l]);
    int32_t sumi[8] = {};
    const uint8_t* q2 = x + 16;
    const int8_t* q8 = y.qs;
    for (int j = 0; j < 2; ++j, q2 += 32) {
      for (int c = 0; c < 4; ++c, q8 += 32) {
        for (int b = 0; b < 32; ++b) {
          const int scale = x[8 * j + 2 * c + (b >= 16)] & 0xF;  // get_scale_shuffle_q3k(c) of scales[j]
          sumi[b / 4] += scale * ((q2[b] >> (2 * c)) & 3) * q8[b];
        }
      }
    }
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum_float_8(acc);
}

// ggml_vec_dot_q3_K_q8_K: scales through the aux/kmask shuffle, minus 32;
// maddubs(low 2 bits) - maddubs(4 where the hmask bit is clear).
float llama_q3_k(int64_t nb, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* x = w + i * 110;
    const auto& y = reinterpret_cast<const BlockQ8_K*>(a)[i];
    uint16_t dh;
    std::memcpy(&dh, x + 108, 2);
    const float d = y.d * f16_to_f32(dh);
    uint32_t aux[3];
    std::memcpy(aux, x + 96, 12);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    const uint32_t s32[4] = {(aux[0] & k2) | (((aux[2] >> 0) & k1) << 4), (aux[1] & k2) | (((aux[2] >> 2) & k1) << 4),
                             ((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4),
                             ((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4)};
    int8_t scales[16];
    std::memcpy(scales, s32, 16);
    for (auto& s : scales) s = static_cast<int8_t>(s - 32);
    int32_t sumi[8] = {};
    const uint8_t* hm = x;
    const uint8_t* q3 = x + 32;
    const int8_t* q8 = y.qs;
    int bit = 0;
    for (int j = 0; j < 2; ++j, q3 += 32) {
      for (int c = 0; c < 4; ++c, q8 += 32, ++bit) {
        for (int b = 0; b < 32; ++b) {
          const int low = (q3[b] >> (2 * c)) & 3;
          const int h = (hm[b] >> bit) & 1 ? 0 : 4;
          sumi[b / 4] += scales[8 * j + 2 * c + (b >= 16)] * (low * q8[b] - h * q8[b]);
        }
      }
    }
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum_float_8(acc);
}

const int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_XS blocks read as ggml_vec_dot_iq4_xs_q8_K does (ls1/ls2 from scales_l
// nibbles and scales_h >> 4 per pair). kLanes: llama.cpp's 8 lanes, one fma
// each per super-block, and its horizontal add; otherwise rill's definition
// (quants_iq_ref.cpp): the super-block's sum as one integer (int64 here, so
// an int32 overflow in a kernel would show), one fma.
template <bool kLanes>
float iq4_xs_dot(int64_t nb, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {};
  float acc1 = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* x = w + i * 136;
    const auto& y = reinterpret_cast<const BlockQ8_K*>(a)[i];
    uint16_t dh, sh;
    std::memcpy(&dh, x, 2);
    std::memcpy(&sh, x + 2, 2);
    const uint8_t* qs = x + 8;
    const int8_t* q8 = y.qs;
    int32_t sumi[8] = {};
    for (int ib = 0; ib < 8; ib += 2) {
      const int ls1 = ((x[4 + ib / 2] & 0xf) | ((sh << 4) & 0x30)) - 32;
      const int ls2 = ((x[4 + ib / 2] >> 4) | ((sh << 2) & 0x30)) - 32;
      sh = static_cast<uint16_t>(sh >> 4);
      for (int b = 0; b < 32; ++b) {
        const int v1 = kValues[b < 16 ? qs[b] & 0xf : qs[b - 16] >> 4];
        const int v2 = kValues[b < 16 ? qs[16 + b] & 0xf : qs[b] >> 4];
        sumi[b / 4] += ls1 * v1 * q8[b] + ls2 * v2 * q8[32 + b];
      }
      qs += 32;
      q8 += 64;
    }
    const float d = f16_to_f32(dh) * y.d;
    int64_t isum = 0;
    for (int l = 0; l < 8; ++l) {
      acc[l] = std::fmaf(d, static_cast<float>(sumi[l]), acc[l]);
      isum += sumi[l];
    }
    acc1 = std::fmaf(d, static_cast<float>(isum), acc1);
  }
  return kLanes ? hsum_float_8(acc) : acc1;
}

// ggml_vec_dot_iq4_nl_q8_0: accum1 (even blocks) and accum2 (odd), then a scalar tail.
float llama_iq4_nl(int64_t nb, const uint8_t* w, const uint8_t* a) {
  float acc1[8] = {}, acc2[8] = {};
  auto block = [&](int64_t ib, int32_t lanes[8]) {
    const uint8_t* x = w + ib * 18;
    const auto& y = reinterpret_cast<const BlockQ8_0*>(a)[ib];
    for (int l = 0; l < 8; ++l) lanes[l] = 0;
    for (int b = 0; b < 32; ++b) lanes[b / 4] += kValues[b < 16 ? x[2 + b] & 0xf : x[2 + b - 16] >> 4] * y.qs[b];
    uint16_t dh;
    std::memcpy(&dh, x, 2);
    return f16_to_f32(y.d) * f16_to_f32(dh);
  };
  int64_t ib = 0;
  int32_t lanes[8];
  for (; ib + 1 < nb; ib += 2) {
    float d = block(ib, lanes);
    for (int l = 0; l < 8; ++l) acc1[l] = std::fmaf(d, static_cast<float>(lanes[l]), acc1[l]);
    d = block(ib + 1, lanes);
    for (int l = 0; l < 8; ++l) acc2[l] = std::fmaf(d, static_cast<float>(lanes[l]), acc2[l]);
  }
  float sum8[8];
  for (int l = 0; l < 8; ++l) sum8[l] = acc1[l] + acc2[l];
  float sumf = hsum_float_8(sum8);
  for (; ib < nb; ++ib) {
    const float d = block(ib, lanes);
    int s = 0;
    for (int l = 0; l < 8; ++l) s += lanes[l];
    sumf = std::fmaf(d, static_cast<float>(s), sumf);
  }
  return sumf;
}

float independent_dot(DType t, int64_t n, const uint8_t* w, const uint8_t* a) {
  switch (t) {
    case DType::kQ2_K:
      return llama_q2_k(n / 256, w, a);
    case DType::kQ3_K:
      return llama_q3_k(n / 256, w, a);
    case DType::kIQ4_XS:
      return iq4_xs_dot<false>(n / 256, w, a);
    default:
      return llama_iq4_nl(n / 32, w, a);
  }
}

std::vector<uint8_t> quantize_rows(DType p, const std::vector<float>& x, int64_t n, int n_t) {
  std::vector<uint8_t> a(row_bytes(p, n) * static_cast<size_t>(n_t));
  for (int c = 0; c < n_t; ++c) ref::quantize_row(p, x.data() + c * n, a.data() + c * row_bytes(p, n), n);
  return a;
}

TEST(IQuant, ReferenceMatchesIndependentTranscription) {
  for (DType t : kTypes) {
    for (int64_t n : {256, 2048, 2304}) {  // 2304 / 32 = 72 blocks; 2336 below: odd IQ4_NL count
      const auto w = random_weight_rows(t, 3, n, 7 + static_cast<uint32_t>(n));
      const auto x = random_floats(n * 2, 8, -3.0f, 3.0f);
      const DType p = vec_dot_partner(t);
      const auto a = quantize_rows(p, x, n, 2);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 2; ++c) {
          const uint8_t* wr = w.data() + r * row_bytes(t, n);
          const uint8_t* ar = a.data() + c * row_bytes(p, n);
          const float want = independent_dot(t, n, wr, ar), got = ref::vec_dot(t, n, wr, ar);
          EXPECT_TRUE(same_bits(want, got)) << dtype_name(t) << " n=" << n << ": " << got << " vs " << want;
        }
    }
  }
  for (int64_t n : {32, 96, 2336}) {
    const auto w = random_weight_rows(DType::kIQ4_NL, 1, n, 3);
    const auto x = random_floats(n, 4, -3.0f, 3.0f);
    const auto a = quantize_rows(DType::kQ8_0, x, n, 1);
    EXPECT_TRUE(same_bits(independent_dot(DType::kIQ4_NL, n, w.data(), a.data()),
                          ref::vec_dot(DType::kIQ4_NL, n, w.data(), a.data())))
        << n;
  }
}

// rill's IQ4_XS (one int32 per super-block) and llama.cpp's (8 lanes, each
// converted and fma'd) differ only by f32 rounding.
TEST(IQuant, IQ4XSWithinRoundingOfLlamaCppLanes) {
  for (int64_t n : {256, 2048, 8192}) {
    const auto w = random_weight_rows(DType::kIQ4_XS, 4, n, 40 + static_cast<uint32_t>(n));
    const auto x = random_floats(n, 41, -3.0f, 3.0f);
    const auto a = quantize_rows(DType::kQ8_K, x, n, 1);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* wr = w.data() + r * row_bytes(DType::kIQ4_XS, n);
      const auto wf = dequant(DType::kIQ4_XS, wr, n);
      const auto af = dequant(DType::kQ8_K, a.data(), n);
      double mag = 0.0;
      for (int64_t i = 0; i < n; ++i) mag += std::fabs(static_cast<double>(wf[i]) * af[i]);
      const float rill = ref::vec_dot(DType::kIQ4_XS, n, wr, a.data()), llama = iq4_xs_dot<true>(n / 256, wr, a.data());
      EXPECT_NEAR(rill, llama, 1e-6 * mag) << "n=" << n << " row " << r;
      EXPECT_TRUE(same_bits(rill, iq4_xs_dot<false>(n / 256, wr, a.data())));
    }
  }
}

// The reference dot equals the f64 dot of the dequantized rows up to f32 rounding.
TEST(IQuant, ReferenceMatchesDequantizedDot) {
  const int64_t n = 1024;
  for (DType t : kTypes) {
    const auto w = random_weight_rows(t, 1, n, 11);
    const auto x = random_floats(n, 12);
    const DType p = vec_dot_partner(t);
    const auto a = quantize_rows(p, x, n, 1);
    const auto wf = dequant(t, w.data(), n);
    const auto af = dequant(p, a.data(), n);
    double want = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      want += static_cast<double>(wf[i]) * af[i];
      mag += std::fabs(static_cast<double>(wf[i]) * af[i]);
    }
    EXPECT_NEAR(ref::vec_dot(t, n, w.data(), a.data()), want, 1e-5 * mag + 1e-6) << dtype_name(t);
  }
}

void expect_gemm_matches_reference(DType t, int64_t n, int n_r, int n_t, uint32_t seed, float x_range,
                                   std::vector<uint8_t>* w_override = nullptr) {
  const auto w = w_override ? *w_override : random_weight_rows(t, n_r, n, seed);
  const auto x = random_floats(n * n_t, seed + 1, -x_range, x_range);
  const DType p = vec_dot_partner(t);
  const auto a = quantize_rows(p, x, n, n_t);
  const size_t ws = row_bytes(t, n), as = row_bytes(p, n);
  const int64_t ys = n_r + 3;
  std::vector<float> want(static_cast<size_t>(ys * n_t), -7.0f);
  ref::gemm_tile(t, n, w.data(), ws, n_r, a.data(), as, n_t, want.data(), ys);
  for (int c = 0; c < n_t; ++c)
    for (int r = 0; r < n_r; ++r)
      ASSERT_TRUE(same_bits(want[c * ys + r], independent_dot(t, n, w.data() + r * ws, a.data() + c * as)));
  for (Isa isa : available_isas()) {
    const GemmTileFn gemm = kernels(isa).gemm[static_cast<size_t>(t)];
    ASSERT_NE(gemm, nullptr) << isa_name(isa) << " " << dtype_name(t);
    std::vector<float> got(want.size(), -7.0f);
    gemm(n, w.data(), ws, n_r, a.data(), as, n_t, got.data(), ys);
    for (int c = 0; c < n_t; ++c)
      for (int64_t r = 0; r < ys; ++r)
        ASSERT_TRUE(same_bits(got[c * ys + r], want[c * ys + r]))
            << isa_name(isa) << " " << dtype_name(t) << " n=" << n << " " << n_r << "x" << n_t << " at row " << r
            << " token " << c << ": " << got[c * ys + r] << " vs " << want[c * ys + r];
  }
}

TEST(IQuant, GemmBitExactAllShapes) {
  uint32_t seed = 100;
  for (DType t : kTypes)
    for (int64_t n : {256, 768})
      for (int n_r = 1; n_r <= 9; ++n_r)
        for (int n_t = 1; n_t <= 9; ++n_t) expect_gemm_matches_reference(t, n, n_r, n_t, seed++, 3.0f);
}

TEST(IQuant, GemmBitExactLongRowsBatchesAndOddBlockCounts) {
  uint32_t seed = 500;
  for (DType t : kTypes) {
    expect_gemm_matches_reference(t, 8192, 6, 5, seed++, 3.0f);
    expect_gemm_matches_reference(t, 2048, 64, 17, seed++, 3.0f);
  }
  for (int64_t n : {32, 96, 288, 2080})  // odd numbers of IQ4_NL blocks
    for (int n_t : {1, 2, 3, 4, 5, 9, 17}) expect_gemm_matches_reference(DType::kIQ4_NL, n, 5, n_t, seed++, 3.0f);
}

// Prefill-sized batches: IQ4_NL's token-pair groups (16 tokens a group, rows
// in column chunks) and IQ4_XS's row tile (16-row groups, column chunks of 8
// super-blocks, token blocks of 64), partial groups, rows of several
// chunks, odd rows and more rows than a per-call table (64).
TEST(IQuant, GemmBitExactTokenPairGroups) {
  uint32_t seed = 700;
  for (DType t : kTypes)
    for (int64_t n : {256, 2048, 2304})
      for (int n_t : {9, 10, 16, 17, 33})
        for (int n_r : {1, 3}) expect_gemm_matches_reference(t, n, n_r, n_t, seed++, 3.0f);
  for (DType t : kTypes) expect_gemm_matches_reference(t, 512, 70, 9, seed++, 3.0f);
  expect_gemm_matches_reference(DType::kIQ4_XS, 2304, 37, 70, seed++, 3.0f);
  expect_gemm_matches_reference(DType::kIQ4_XS, 4352, 20, 131, seed++, 3.0f);
}

// Extreme values: the largest codes and scales against activations of +-127
// exercise maddubs' i16 range and the sign trick (3 token rows: the
// small-batch tiles; 17: the token-pair groups).
TEST(IQuant, GemmBitExactExtremeValues) {
  const int64_t n = 512;
  uint32_t seed = 900;
  for (DType t : kTypes) {
    auto w = random_weight_rows(t, 4, n, 3);
    const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
    for (size_t b = 0; b < w.size() / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      switch (t) {
        case DType::kQ2_K:
          std::memset(blk, 0xFF, 80);  // scales, mins 15; q = 3
          break;
        case DType::kQ3_K:
          std::memset(blk, 0x00, 96);                      // q = -4 everywhere
          std::memset(blk + 96, b % 2 ? 0x00 : 0xFF, 12);  // scales -32 or 31
          break;
        case DType::kIQ4_NL:
          std::memset(blk + 2, b % 2 ? 0x00 : 0xFF, 16);  // -127 or 113
          break;
        default:
          std::memset(blk + 2, 0x00, 6);    // scales -32
          std::memset(blk + 8, 0x00, 128);  // -127
          break;
      }
    }
    // +-1 alternating activations quantize to +-127.
    constexpr int kT = 17;
    std::vector<float> x(static_cast<size_t>(n * kT));
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 3) % 2 ? 1.0f : -1.0f;
    const DType p = vec_dot_partner(t);
    const auto a = quantize_rows(p, x, n, kT);
    const size_t ws = row_bytes(t, n), as = row_bytes(p, n);
    float want[kT][4], got[kT][4];
    ref::gemm_tile(t, n, w.data(), ws, 4, a.data(), as, kT, &want[0][0], 4);
    EXPECT_TRUE(same_bits(want[0][0], independent_dot(t, n, w.data(), a.data()))) << dtype_name(t);
    for (Isa isa : available_isas()) {
      for (int n_t : {3, kT}) {
        kernels(isa).gemm[static_cast<size_t>(t)](n, w.data(), ws, 4, a.data(), as, n_t, &got[0][0], 4);
        for (int c = 0; c < n_t; ++c)
          for (int r = 0; r < 4; ++r)
            EXPECT_TRUE(same_bits(got[c][r], want[c][r])) << isa_name(isa) << " " << dtype_name(t) << " " << n_t
                                                          << " tokens: " << got[c][r] << " vs " << want[c][r];
      }
    }
    ++seed;
  }
}

// matmul (the op the models call: quantizes x, splits rows over the pool)
// gives ref::vec_dot's bits for decode (1 token) and batched prefill.
TEST(IQuant, MatmulEqualsReferenceDots) {
  ThreadPool pool(2);
  Scratch scratch;
  const int64_t n_rows = 37, n_cols = 1024;
  for (DType t : kTypes) {
    const auto wbytes = random_weight_rows(t, n_rows, n_cols, 77);
    WeightView w{t, n_rows, n_cols, wbytes.data(), row_bytes(t, n_cols)};
    for (int64_t n_tokens : {1, 2, 7, 33}) {
      const auto x = random_floats(n_cols * n_tokens, 78, -2.0f, 2.0f);
      scratch.reserve(matmul_scratch_bytes(t, n_cols, n_tokens));
      std::vector<float> y(static_cast<size_t>(n_rows * n_tokens));
      matmul(w, x.data(), n_tokens, y.data(), pool, scratch);
      const DType p = vec_dot_partner(t);
      std::vector<uint8_t> a(row_bytes(p, n_cols));
      for (int64_t tk = 0; tk < n_tokens; ++tk) {
        ref::quantize_row(p, x.data() + tk * n_cols, a.data(), n_cols);
        for (int64_t r = 0; r < n_rows; ++r) {
          const float want = ref::vec_dot(t, n_cols, wbytes.data() + r * w.row_stride, a.data());
          ASSERT_TRUE(same_bits(y[tk * n_rows + r], want)) << dtype_name(t) << " tokens " << n_tokens << " row " << r
                                                           << ": " << y[tk * n_rows + r] << " vs " << want;
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
