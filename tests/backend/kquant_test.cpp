// The K-quant dots (Q4_K, Q5_K, Q6_K x Q8_K): the scalar reference follows
// rill's definition (per super-block exact int32 sums, one fma each; checked
// here against a second, independent transcription written from the integer
// values), and every ISA's gemm gives the reference's bits for every tile
// shape, batch size and row length, including rows of extreme values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quants.h"
#include "core/half.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::random_weight_rows;

const DType kKTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// A K-quant super-block's integer values, read through the block layout
// independently of quants_ref.cpp's helpers.
struct KValues {
  int q[256];      // unsigned values (Q6_K: 0..63, before the -32)
  int scale[256];  // scale of each element
  int mn[8];       // Q4_K/Q5_K mins
  float d, dmin;
};

KValues k_values(DType t, const uint8_t* blk) {
  KValues v{};
  if (t == DType::kQ6_K) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t byte = b.ql[64 * h + l + (k % 2) * 32];
      const int nib = k < 2 ? (byte & 0xF) : (byte >> 4);
      v.q[e] = nib | (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4);
      v.scale[e] = b.scales[e / 16];
    }
    v.d = f16_to_f32(b.d);
    return v;
  }
  const uint8_t* scales = t == DType::kQ4_K ? reinterpret_cast<const BlockQ4_K*>(blk)->scales
                                            : reinterpret_cast<const BlockQ5_K*>(blk)->scales;
  const uint8_t* qs =
      t == DType::kQ4_K ? reinterpret_cast<const BlockQ4_K*>(blk)->qs : reinterpret_cast<const BlockQ5_K*>(blk)->qs;
  int sc[8];
  for (int j = 0; j < 8; ++j) {
    // GGML's get_scale_min_k4
    if (j < 4) {
      sc[j] = scales[j] & 63;
      v.mn[j] = scales[j + 4] & 63;
    } else {
      sc[j] = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
      v.mn[j] = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
  }
  for (int e = 0; e < 256; ++e) {
    const int g = e / 64, l = e % 32;
    const uint8_t byte = qs[32 * g + l];
    v.q[e] = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
    if (t == DType::kQ5_K) v.q[e] |= ((reinterpret_cast<const BlockQ5_K*>(blk)->qh[l] >> (e / 32)) & 1) << 4;
    v.scale[e] = sc[e / 32];
  }
  uint16_t dh, dmh;
  std::memcpy(&dh, blk, 2);
  std::memcpy(&dmh, blk + 2, 2);
  v.d = f16_to_f32(dh);
  v.dmin = f16_to_f32(dmh);
  return v;
}

// rill's K-quant definition (quants_ref.cpp), transcribed from the integer
// values: per super-block the exact sums (in int64, so an overflow of the
// kernels' int32 would show) of scale * q * a (Q6_K: q - 32) and, for
// Q4_K/Q5_K, of min * (sub-block sum of a), each fma'd once into a single
// f32 accumulator (with a.d * w.d and -a.d * w.dmin).
float independent_k_dot(DType t, int64_t n, const uint8_t* w, const uint8_t* a) {
  const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) {
    const KValues v = k_values(t, w + i * bb);
    const auto& y = reinterpret_cast<const BlockQ8_K*>(a)[i];
    const int offset = t == DType::kQ6_K ? 32 : 0;
    int64_t isum = 0, msum = 0;
    for (int e = 0; e < 256; ++e) isum += static_cast<int64_t>(v.scale[e]) * (v.q[e] - offset) * y.qs[e];
    acc = std::fmaf(y.d * v.d, static_cast<float>(isum), acc);
    if (t == DType::kQ6_K) continue;
    for (int e = 0; e < 256; ++e) msum += static_cast<int64_t>(v.mn[e / 32]) * y.qs[e];
    acc = std::fmaf(-y.d * v.dmin, static_cast<float>(msum), acc);
  }
  return acc;
}

std::vector<uint8_t> quantize_rows(DType p, const std::vector<float>& x, int64_t n, int n_t) {
  std::vector<uint8_t> a(row_bytes(p, n) * static_cast<size_t>(n_t));
  for (int c = 0; c < n_t; ++c) ref::quantize_row(p, x.data() + c * n, a.data() + c * row_bytes(p, n), n);
  return a;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

TEST(KQuant, ReferenceFollowsItsDefinition) {
  for (DType t : kKTypes) {
    for (int64_t n : {256, 2048}) {
      const auto w = random_weight_rows(t, 3, n, 7 + static_cast<uint32_t>(n));
      const auto x = random_floats(n * 2, 8, -3.0f, 3.0f);
      const auto a = quantize_rows(DType::kQ8_K, x, n, 2);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 2; ++c) {
          const uint8_t* wr = w.data() + r * row_bytes(t, n);
          const uint8_t* ar = a.data() + c * row_bytes(DType::kQ8_K, n);
          const float want = independent_k_dot(t, n, wr, ar), got = ref::vec_dot(t, n, wr, ar);
          EXPECT_TRUE(same_bits(want, got)) << dtype_name(t) << " n=" << n << ": " << got << " vs " << want;
        }
    }
  }
}

// Every ISA, every tile shape up to 9 x 9 (past the register tiles), bits equal.
void expect_gemm_matches_reference(DType t, int64_t n, int n_r, int n_t, uint32_t seed, float x_range) {
  const auto w = random_weight_rows(t, n_r, n, seed);
  const auto x = random_floats(n * n_t, seed + 1, -x_range, x_range);
  const auto a = quantize_rows(DType::kQ8_K, x, n, n_t);
  const size_t ws = row_bytes(t, n), as = row_bytes(DType::kQ8_K, n);
  const int64_t ys = n_r + 3;
  std::vector<float> want(static_cast<size_t>(ys * n_t), -7.0f);
  ref::gemm_tile(t, n, w.data(), ws, n_r, a.data(), as, n_t, want.data(), ys);
  for (Isa isa : available_isas()) {
    std::vector<float> got(want.size(), -7.0f);
    kernels(isa).gemm[static_cast<size_t>(t)](n, w.data(), ws, n_r, a.data(), as, n_t, got.data(), ys);
    for (int c = 0; c < n_t; ++c)
      for (int64_t r = 0; r < ys; ++r)
        ASSERT_TRUE(same_bits(got[c * ys + r], want[c * ys + r]))
            << isa_name(isa) << " " << dtype_name(t) << " n=" << n << " " << n_r << "x" << n_t << " at row " << r
            << " token " << c << ": " << got[c * ys + r] << " vs " << want[c * ys + r];
  }
}

TEST(KQuant, GemmBitExactAllShapes) {
  uint32_t seed = 100;
  for (DType t : kKTypes)
    for (int64_t n : {256, 768})
      for (int n_r = 1; n_r <= 9; ++n_r)
        for (int n_t = 1; n_t <= 9; ++n_t) expect_gemm_matches_reference(t, n, n_r, n_t, seed++, 3.0f);
}

TEST(KQuant, GemmBitExactLongRowsAndBatches) {
  uint32_t seed = 500;
  for (DType t : kKTypes) {
    expect_gemm_matches_reference(t, 8192, 6, 5, seed++, 3.0f);
    expect_gemm_matches_reference(t, 2048, 64, 17, seed++, 3.0f);
  }
  // The row tiles take whole prefills: token blocks of 64 and column chunks
  // of 8 super-blocks with their partial tails, partial 16-row groups.
  for (DType t : kKTypes) {
    expect_gemm_matches_reference(t, 2304, 37, 70, seed++, 3.0f);
    expect_gemm_matches_reference(t, 4352, 20, 131, seed++, 3.0f);
  }
}

// Prefill-sized batches: the AVX-512 path repacks 9+ token rows in pairs,
// 16-token groups x 1 row for rows of up to 8 super-blocks and 8-token
// groups x 2 rows for longer ones; full and partial groups and pairs, odd
// row counts, both group shapes.
TEST(KQuant, GemmBitExactTokenPairGroups) {
  uint32_t seed = 900;
  for (DType t : kKTypes)
    for (int64_t n : {256, 2048, 2304, 4096})
      for (int n_t : {9, 10, 15, 16, 17, 24, 33})
        for (int n_r : {1, 3, 4}) expect_gemm_matches_reference(t, n, n_r, n_t, seed++, 3.0f);
  for (DType t : kKTypes) expect_gemm_matches_reference(t, 512, 70, 9, seed++, 3.0f);  // past the 64-row scale table
}

// Extreme values: all-ones quant bytes (q = 15 / 31 / 63 with the largest
// scales) against activations of +-127 exercise maddubs' i16 range.
TEST(KQuant, GemmBitExactExtremeValues) {
  const int64_t n = 512;
  for (DType t : kKTypes) {
    auto w = random_weight_rows(t, 4, n, 3);
    const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
    for (size_t b = 0; b < w.size() / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      if (t == DType::kQ6_K) {
        std::memset(blk, 0xFF, 192);                                      // ql, qh: q = 63
        for (int j = 0; j < 16; ++j) blk[192 + j] = j % 2 ? 0x80 : 0x7F;  // scales -128 / 127
      } else {
        std::memset(blk + 4, 0xFF, bb - 4);  // scales and mins 63, q = 15 (31)
      }
    }
    // 17 token rows: the one-token tiles and the token-pair groups alike.
    constexpr int kT = 17;
    std::vector<float> x(static_cast<size_t>(n * kT));
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 3) % 2 ? 1.0f : -1.0f;
    const auto a = quantize_rows(DType::kQ8_K, x, n, kT);
    const size_t ws = row_bytes(t, n), as = row_bytes(DType::kQ8_K, n);
    float want[kT][4], got[kT][4];
    ref::gemm_tile(t, n, w.data(), ws, 4, a.data(), as, kT, &want[0][0], 4);
    for (Isa isa : available_isas()) {
      for (int n_t : {3, kT}) {
        kernels(isa).gemm[static_cast<size_t>(t)](n, w.data(), ws, 4, a.data(), as, n_t, &got[0][0], 4);
        for (int c = 0; c < n_t; ++c)
          for (int r = 0; r < 4; ++r)
            EXPECT_TRUE(same_bits(got[c][r], want[c][r])) << isa_name(isa) << " " << dtype_name(t) << " " << n_t
                                                          << " tokens: " << got[c][r] << " vs " << want[c][r];
      }
      EXPECT_TRUE(same_bits(want[0][0], independent_k_dot(t, n, w.data(), a.data())));
    }
  }
}

// Q6_K's super-block int32 at its largest magnitude: every q = 0 (q - 32 =
// -32), every scale -128, every activation -127: 256 * 32 * 128 * 127 =
// 133,169,152 per super-block, which every path must hold exactly; the
// token counts reach the one-token tiles and the prefill tiles.
TEST(KQuant, Q6KSuperblockSumAtItsLargest) {
  const int64_t n = 1024;
  const DType t = DType::kQ6_K;
  auto w = random_weight_rows(t, 5, n, 17);
  for (size_t b = 0; b < w.size() / sizeof(BlockQ6_K); ++b) {
    auto* blk = reinterpret_cast<BlockQ6_K*>(w.data()) + b;
    std::memset(blk->ql, 0, sizeof(blk->ql));
    std::memset(blk->qh, 0, sizeof(blk->qh));
    for (int8_t& sc : blk->scales) sc = -128;
  }
  constexpr int kT = 21;
  std::vector<float> x(static_cast<size_t>(n * kT), 1.0f);
  for (int64_t i = n; i < 2 * n; ++i) x[i] = -1.0f;  // token 1: +127 instead
  const auto a = quantize_rows(DType::kQ8_K, x, n, kT);
  EXPECT_EQ(reinterpret_cast<const BlockQ8_K*>(a.data())->qs[0], -127);
  const size_t ws = row_bytes(t, n), as = row_bytes(DType::kQ8_K, n);
  std::vector<float> want(static_cast<size_t>(5 * kT));
  ref::gemm_tile(t, n, w.data(), ws, 5, a.data(), as, kT, want.data(), 5);
  EXPECT_TRUE(same_bits(want[0], independent_k_dot(t, n, w.data(), a.data())));
  for (Isa isa : available_isas())
    for (int n_t : {1, 4, kT}) {
      std::vector<float> got(want.size(), -7.0f);
      kernels(isa).gemm[static_cast<size_t>(t)](n, w.data(), ws, 5, a.data(), as, n_t, got.data(), 5);
      for (int i = 0; i < 5 * n_t; ++i)
        EXPECT_TRUE(same_bits(got[i], want[i])) << isa_name(isa) << " " << n_t << " tokens at " << i;
    }
}

// Every ISA's Q8_K quantizer gives the reference's bytes, including an
// all-zero block, ties of +-max (the first one sets the sign), exact halves
// and a lone extreme value.
TEST(KQuant, Q8KQuantizersMatchReferenceBytes) {
  const int64_t n = 1024;
  auto x = random_floats(n, 31, -2.0f, 2.0f);
  for (int i = 0; i < 256; ++i) x[256 + i] = 0.0f;  // block 1: zeros
  x[520] = -4.0f;                                   // block 2: -4 first, then +4
  x[600] = 4.0f;
  x[800] = 127.0f;  // block 3: iscale = -1, exact halves
  for (int i = 0; i < 16; ++i) x[801 + i] = 0.5f + static_cast<float>(i);
  const DType p = DType::kQ8_K;
  std::vector<uint8_t> want(row_bytes(p, n));
  ref::quantize_row(p, x.data(), want.data(), n);
  for (Isa isa : available_isas()) {
    std::vector<uint8_t> got(row_bytes(p, n), 0xAB);
    kernels(isa).quantize[static_cast<size_t>(p)](x.data(), got.data(), n);
    EXPECT_EQ(want, got) << isa_name(isa);
  }
  EXPECT_EQ(reinterpret_cast<const BlockQ8_K*>(want.data())[2].qs[520 - 512], -127);
}

}  // namespace
}  // namespace rill::cpu
