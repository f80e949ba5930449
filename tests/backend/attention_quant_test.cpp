// The tile kernels of attention over quantized KV (AVX-512's
// attention_quant_avx512.cpp and AVX2's attention_quant_tile_avx2.cpp,
// each where the CPU runs it) and the per-query AVX2 one against the
// baseline kernel on the same blocks, for every K type x V type and
// head_dim the tiles take, with windows and softcap; their GQA grouping
// against one call per query head and their query tiles against one query
// at a time (bit-identical); and the shapes they refuse.
// kv_quant_test.cpp holds the batched driver (which takes the best tile
// kernel) against f32 attention and checks batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/paged_kv.h"
#include "core/e4m3.h"

namespace rill::cpu {
namespace {

constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                            DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1};

bool rotated_only(DType t) {
  return t == kKvQ8_0x64 || t == DType::kIQ4_NL;
}

// n_kv rows of one KV head (head_dim hd) stored in k / v types, q for G heads.
struct Case {
  int64_t hd = 64, n_kv = 0;
  int g = 1;
  std::vector<float> q;
  std::vector<uint8_t> k, v;
  DType kt, vt;
};
Case make_case(DType kt, DType vt, int64_t hd, int g, int64_t n_kv, uint32_t seed) {
  Case c;
  c.hd = hd;
  c.n_kv = n_kv;
  c.g = g;
  c.kt = kt;
  c.vt = vt;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  c.q.resize(static_cast<size_t>(g * hd));
  for (float& x : c.q) x = 0.5f * nd(rng);
  std::vector<float> row(static_cast<size_t>(hd));
  const size_t kr = row_bytes(kt, hd), vr = row_bytes(vt, hd);
  c.k.resize(kr * static_cast<size_t>(n_kv));
  c.v.resize(vr * static_cast<size_t>(n_kv));
  for (int64_t j = 0; j < n_kv; ++j) {
    for (float& x : row) x = nd(rng);
    // q8_0h64's and iq4_nl's blocks are stored rotated only (no plain encoder).
    store_kv_row(kt, rotated_only(kt), row.data(), c.k.data() + j * kr, 1, hd);
    for (float& x : row) x = nd(rng);
    store_kv_row(vt, rotated_only(vt), row.data(), c.v.data() + j * vr, 1, hd);
  }
  return c;
}

detail::QuantAttendArgs args(const Case& c, const float* q, int n_heads, int64_t j_begin, float softcap,
                             std::vector<float>& scores, float* out) {
  detail::QuantAttendArgs a;
  a.q = q;
  a.kv = make_contiguous_kv(c.k.data(), c.v.data(), row_bytes(c.kt, c.hd));
  a.kv.v_row_bytes = row_bytes(c.vt, c.hd) == row_bytes(c.kt, c.hd) ? 0 : row_bytes(c.vt, c.hd);
  a.k_dequant = detail::kv_dequant_scalar(c.kt);
  a.v_dequant = detail::kv_dequant_scalar(c.vt);
  a.head_dim = c.hd;
  a.j_begin = j_begin;
  a.j_end = c.n_kv;
  a.n_heads = n_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.softcap = softcap;
  scores.assign(static_cast<size_t>(n_heads * c.n_kv), NAN);
  a.scores = scores.data();
  a.out = out;
  return a;
}

// The same problem as one AVX-512 tile: queries i at q + i * n_heads * hd,
// reading keys [jb[i], je[i]).
detail::QuantTileArgs tile_args(const Case& c, const float* q, int n_q, int n_heads, const int64_t* jb,
                                const int64_t* je, float softcap, std::vector<float>& scores, float* out) {
  detail::QuantTileArgs a;
  a.q = q;
  a.kv = make_contiguous_kv(c.k.data(), c.v.data(), row_bytes(c.kt, c.hd));
  a.kv.v_row_bytes = row_bytes(c.vt, c.hd) == row_bytes(c.kt, c.hd) ? 0 : row_bytes(c.vt, c.hd);
  a.head_dim = c.hd;
  a.j_begin = jb;
  a.j_end = je;
  a.n_q = n_q;
  a.n_heads = n_heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.softcap = softcap;
  a.score_stride = c.n_kv;
  scores.assign(static_cast<size_t>(n_q * n_heads * c.n_kv), NAN);
  a.scores = scores.data();
  a.out = out;
  a.out_stride = n_heads * c.hd;
  return a;
}

// The tile kernels this CPU runs (attention_quant.h): AVX-512's and AVX2's.
struct TileKernel {
  const char* name;
  detail::QuantTileAttend (*for_types)(DType, DType, int64_t);
};
std::vector<TileKernel> tile_kernels() {
  std::vector<TileKernel> k;
  if (best_isa() == Isa::kAvx512) k.push_back({"avx512", detail::attend_quant_avx512_for});
  if (best_isa() != Isa::kScalar) k.push_back({"avx2", detail::attend_quant_tile_avx2_for});
  return k;
}

// A tile kernel `fast` and the per-query AVX2 kernel (which the driver no
// longer takes for these shapes) against the baseline kernel on
// case c's g heads, keys [j_begin, n_kv): within 2e-5 of the output's rms.
void expect_fast_and_avx2_match_scalar(const Case& c, detail::QuantTileAttend fast, int g, int64_t j_begin,
                                       float softcap) {
  std::vector<float> ref(c.q.size(), NAN), out(c.q.size(), NAN), s0, s1;
  detail::attend_quant_scalar(args(c, c.q.data(), g, j_begin, softcap, s0, ref.data()));
  const int64_t jb = j_begin, je = c.n_kv;
  fast(tile_args(c, c.q.data(), 1, g, &jb, &je, softcap, s1, out.data()));
  double ms = 0;
  for (float x : ref) ms += double{x} * x;
  const double rms = std::sqrt(ms / static_cast<double>(ref.size()));
  ASSERT_GT(rms, 0.01);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5 * rms) << i;
  std::vector<float> avx2(c.q.size(), NAN);
  detail::QuantAttendArgs a2 = args(c, c.q.data(), g, j_begin, softcap, s0, avx2.data());
  a2.k_dequant = detail::kv_dequant_avx2(c.kt);
  a2.v_dequant = detail::kv_dequant_avx2(c.vt);
  detail::attend_quant_avx2(a2);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(avx2[i], ref[i], 2e-5 * rms) << i;
}

// Same blocks, same math: the two kernels differ only in how the q.k and
// p.v sums associate and in exp (ggml's expf against libm's), so they agree
// to a few f32 ulps of the output's scale (bound 2e-5 * rms, as the
// driver's test holds the kernel to f32 attention over the dequantized rows).
TEST(AttentionQuantTile, MatchesScalarEveryTypePairAndHeadDim) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    uint32_t seed = 1;
    for (int64_t hd : {32, 64, 96, 128, 256}) {
      for (DType kt : kTypes) {
        for (DType vt : kTypes) {
          const detail::QuantTileAttend fast = tk.for_types(kt, vt, hd);
          ASSERT_NE(fast, nullptr);
          const int g = hd <= 64 ? 5 : 3;  // more heads than one V pass takes (4 at hd 64, 2 at 128)
          const Case c = make_case(kt, vt, hd, g, 77, seed++);
          for (int64_t j_begin : {int64_t{0}, int64_t{30}}) {
            for (float softcap : {0.0f, 5.0f}) {
              SCOPED_TRACE(std::string(dtype_name(kt)) + "/" + std::string(dtype_name(vt)) + " hd " +
                           std::to_string(hd) + " j_begin " + std::to_string(j_begin) + " softcap " +
                           std::to_string(softcap));
              expect_fast_and_avx2_match_scalar(c, fast, g, j_begin, softcap);
            }
          }
        }
      }
    }
  }
}

// q8_0h64 (blocks of 64, kKvQ8_0x64) as K, V or both, beside the types it
// is likeliest mixed with, against the baseline and AVX2 kernels on the same
// blocks, at the head_dims it takes (64, 128, 256), with a window, softcap
// and more heads than one V pass takes; tiles bit-identical to one query at
// a time. head_dim 32 and 96 (not whole blocks of 64) get nullptr.
TEST(AttentionQuantTile, Q8_0x64MatchesScalarAndTiles) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    const std::pair<DType, DType> pairs[] = {{kKvQ8_0x64, kKvQ8_0x64},   {kKvQ8_0x64, DType::kF16},
                                             {DType::kF16, kKvQ8_0x64},  {kKvQ8_0x64, DType::kQ4_0},
                                             {DType::kQ8_0, kKvQ8_0x64}, {kKvQ8_0x64, DType::kIQ4_NL}};
    uint32_t seed = 900;
    for (int64_t hd : {64, 128, 256}) {
      for (const auto& [kt, vt] : pairs) {
        const detail::QuantTileAttend fast = tk.for_types(kt, vt, hd);
        ASSERT_NE(fast, nullptr);
        const int g = hd <= 64 ? 5 : 3;
        const Case c = make_case(kt, vt, hd, g, 77, seed++);
        for (int64_t j_begin : {int64_t{0}, int64_t{30}}) {
          for (float softcap : {0.0f, 5.0f}) {
            SCOPED_TRACE(std::string(dtype_name(kt)) + "/" + std::string(dtype_name(vt)) + " hd " + std::to_string(hd) +
                         " j_begin " + std::to_string(j_begin) + " softcap " + std::to_string(softcap));
            expect_fast_and_avx2_match_scalar(c, fast, g, j_begin, softcap);
          }
        }
      }
      // Three queries of g heads as one tile against each alone.
      const int g = 2, n_q = 3;
      const Case c = make_case(kKvQ8_0x64, kKvQ8_0x64, hd, g * n_q, 120, seed++);
      const detail::QuantTileAttend fast = tk.for_types(kKvQ8_0x64, kKvQ8_0x64, hd);
      const int64_t jb[n_q] = {0, 40, 7}, je[n_q] = {100, 119, 120};
      std::vector<float> tiled(c.q.size(), NAN), alone(c.q.size(), NAN), s;
      fast(tile_args(c, c.q.data(), n_q, g, jb, je, 0.0f, s, tiled.data()));
      for (int i = 0; i < n_q; ++i) {
        fast(tile_args(c, c.q.data() + i * g * hd, 1, g, jb + i, je + i, 0.0f, s, alone.data() + i * g * hd));
      }
      EXPECT_EQ(0, std::memcmp(tiled.data(), alone.data(), tiled.size() * sizeof(float))) << "hd " << hd;
    }
    for (int64_t hd : {32, 96}) {
      EXPECT_EQ(tk.for_types(kKvQ8_0x64, kKvQ8_0x64, hd), nullptr) << hd;
      EXPECT_EQ(tk.for_types(DType::kF16, kKvQ8_0x64, hd), nullptr) << hd;
      EXPECT_EQ(tk.for_types(kKvQ8_0x64, DType::kQ8_0, hd), nullptr) << hd;
    }
  }
}

// Grouping the query heads of a KV head (each row dequantized once for all
// of them, V in passes of several heads) leaves each head's bits as a call
// for that head alone would make them.
TEST(AttentionQuantTile, GroupEqualsOneHeadAtATime) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    for (int64_t hd : {64, 96, 128}) {
      for (DType t : {DType::kQ8_0, DType::kQ4_1, DType::kQ5_0}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " hd " + std::to_string(hd));
        const int g = 7;
        const Case c = make_case(t, t, hd, g, 300, static_cast<uint32_t>(hd) + static_cast<uint32_t>(t));
        const detail::QuantTileAttend fast = tk.for_types(t, t, hd);
        ASSERT_NE(fast, nullptr);
        std::vector<float> grouped(c.q.size(), NAN), alone(c.q.size(), NAN), s;
        const int64_t jb = 3, je = c.n_kv;
        fast(tile_args(c, c.q.data(), 1, g, &jb, &je, 0.0f, s, grouped.data()));
        for (int h = 0; h < g; ++h) {
          fast(tile_args(c, c.q.data() + h * hd, 1, 1, &jb, &je, 0.0f, s, alone.data() + h * hd));
        }
        EXPECT_EQ(0, std::memcmp(grouped.data(), alone.data(), grouped.size() * sizeof(float)));
      }
    }
  }
}

// A tile of queries (each row dequantized once for all of them) gives each
// query the bits it gets alone: causal ranges that end apart, a window, an
// empty range (zeros) and more query heads than one K pass takes (16).
TEST(AttentionQuantTile, TileEqualsOneQueryAtATime) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    for (int64_t hd : {64, 128}) {
      for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_1}) {
        for (float softcap : {0.0f, 5.0f}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " hd " + std::to_string(hd));
          const int g = 3, n_q = 6;  // 18 query heads: two K passes
          const Case c = make_case(t, t, hd, g * n_q, 200, static_cast<uint32_t>(hd) * 7 + static_cast<uint32_t>(t));
          const detail::QuantTileAttend fast = tk.for_types(t, t, hd);
          ASSERT_NE(fast, nullptr);
          const int64_t jb[n_q] = {0, 0, 90, 150, 5, 17};
          const int64_t je[n_q] = {180, 181, 182, 150, 199, 200};  // query 3: no keys
          std::vector<float> tiled(c.q.size(), NAN), alone(c.q.size(), NAN), s;
          fast(tile_args(c, c.q.data(), n_q, g, jb, je, softcap, s, tiled.data()));
          for (int i = 0; i < n_q; ++i) {
            fast(tile_args(c, c.q.data() + i * g * hd, 1, g, jb + i, je + i, softcap, s, alone.data() + i * g * hd));
          }
          EXPECT_EQ(0, std::memcmp(tiled.data(), alone.data(), tiled.size() * sizeof(float)));
          for (int64_t d = 0; d < g * hd; ++d) ASSERT_EQ(tiled[static_cast<size_t>(3 * g * hd + d)], 0.0f);
          // And each query agrees with the baseline kernel on its own range.
          for (int i = 0; i < n_q; ++i) {
            if (je[i] <= jb[i]) continue;
            std::vector<float> ref(static_cast<size_t>(g * hd)), s0;
            detail::QuantAttendArgs a = args(c, c.q.data() + i * g * hd, g, jb[i], softcap, s0, ref.data());
            a.j_end = je[i];
            detail::attend_quant_scalar(a);
            for (int64_t d = 0; d < g * hd; ++d) ASSERT_NEAR(tiled[static_cast<size_t>(i * g * hd + d)], ref[d], 1e-5);
          }
        }
      }
    }
  }
}

// fp8's row decoders (the baseline's one code at a time, the AVX2 build's
// 8 in lanes and the rest alone) give e4m3_value for all 256 codes, bit for
// bit, at every offset of a row's remainder.
TEST(AttentionQuantFp8, RowDecodersAreTheReferenceForEveryCode) {
  std::vector<uint8_t> codes(256 + 7);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 % 256);
  std::vector<detail::KvDequant> decoders = {detail::kv_dequant_scalar(kF8E4M3)};
  if (best_isa() != Isa::kScalar) decoders.push_back(detail::kv_dequant_avx2(kF8E4M3));
  for (size_t d = 0; d < decoders.size(); ++d) {
    for (const int64_t n : {int64_t{256}, int64_t{263}, int64_t{5}}) {
      std::vector<float> out(static_cast<size_t>(n), 1.0f);
      decoders[d](codes.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = e4m3_value(codes[static_cast<size_t>(i)]), got = out[static_cast<size_t>(i)];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << "decoder " << d << " element " << i;
          continue;
        }
        ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "decoder " << d << " element " << i << ": " << got;
      }
    }
  }
}

// fp8 (e4m3, as CUDA stores it) takes the AVX-512 kernel with fp8 on both
// sides: against the baseline kernel at every head_dim, with a window and
// softcap, tiles bit-identical to one query at a time; fp8 mixed with
// another type is not taken (the AVX2 kernel serves it).
TEST(AttentionQuantTile, Fp8MatchesScalarAndTiles) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    uint32_t seed = 500;
    for (int64_t hd : {32, 64, 96, 128, 256}) {
      const detail::QuantTileAttend fast = tk.for_types(kF8E4M3, kF8E4M3, hd);
      ASSERT_NE(fast, nullptr) << hd;
      EXPECT_EQ(tk.for_types(kF8E4M3, DType::kQ8_0, hd), nullptr) << hd;
      EXPECT_EQ(tk.for_types(DType::kF16, kF8E4M3, hd), nullptr) << hd;
      const int g = 5;
      const Case c = make_case(kF8E4M3, kF8E4M3, hd, g, 77, seed++);
      for (int64_t j_begin : {int64_t{0}, int64_t{30}}) {
        for (float softcap : {0.0f, 5.0f}) {
          SCOPED_TRACE("hd " + std::to_string(hd) + " j_begin " + std::to_string(j_begin) + " softcap " +
                       std::to_string(softcap));
          expect_fast_and_avx2_match_scalar(c, fast, g, j_begin, softcap);
        }
      }
    }
    // Tiles: three queries of 3 heads, ranges ending apart.
    const int g = 3, n_q = 3;
    const Case c = make_case(kF8E4M3, kF8E4M3, 64, g * n_q, 120, 77);
    const detail::QuantTileAttend fast = tk.for_types(kF8E4M3, kF8E4M3, 64);
    const int64_t jb[n_q] = {0, 40, 7}, je[n_q] = {100, 120, 119};
    std::vector<float> tiled(c.q.size(), NAN), alone(c.q.size(), NAN), s;
    fast(tile_args(c, c.q.data(), n_q, g, jb, je, 0.0f, s, tiled.data()));
    for (int i = 0; i < n_q; ++i) {
      fast(tile_args(c, c.q.data() + i * g * 64, 1, g, jb + i, je + i, 0.0f, s, alone.data() + i * g * 64));
    }
    EXPECT_EQ(0, std::memcmp(tiled.data(), alone.data(), tiled.size() * sizeof(float)));
  }
}

// Shapes the kernel does not take (heads not whole 32-element blocks, other
// head_dims, types that are no KV type) get nullptr: the driver then takes
// the AVX2 kernel.
TEST(AttentionQuantTile, RefusesOtherShapesAndTypes) {
  if (tile_kernels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const TileKernel& tk : tile_kernels()) {
    SCOPED_TRACE(tk.name);
    EXPECT_EQ(tk.for_types(DType::kQ8_0, DType::kQ8_0, 80), nullptr);
    EXPECT_EQ(tk.for_types(DType::kQ8_0, DType::kQ8_0, 512), nullptr);
    EXPECT_EQ(tk.for_types(DType::kQ4_K, DType::kQ8_0, 64), nullptr);
    EXPECT_EQ(tk.for_types(DType::kQ8_0, DType::kQ4_K, 64), nullptr);
    EXPECT_NE(tk.for_types(DType::kQ8_0, DType::kQ4_0, 64), nullptr);
  }
}

}  // namespace
}  // namespace rill::cpu
