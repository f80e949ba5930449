// attend_f16_rounded_tile_avx512 (prefill attention for a tile of (query,
// head) rows sharing one KV head) gives every row exactly the bits of the
// per-row kernel attend_f16_rounded_avx512 in the batched (prefill) form,
// over paged K/V with a shuffled block table, at every supported head_dim,
// for tiles of 1..16 rows whose key counts sit around the 16-key blocks and
// differ from row to row, with and without softcap and sliding windows; and
// attention_f16_rounded_batch, which now takes the tiles for prefill, still
// gives each (query, head) the per-row kernel's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/cpu_features.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::random_floats;

// f16 K/V of n_kv keys, rows of n_kv_heads heads, in blocks of 16 keys
// placed through a shuffled table.
struct PagedF16 {
  std::vector<int32_t> table;
  std::vector<uint16_t> k, v;
  PagedKv kv;  // at KV head 0
  PagedF16(int64_t n_kv, int64_t n_kv_heads, int64_t hd, uint32_t seed) {
    const int64_t row = n_kv_heads * hd, n_blocks = (n_kv + 15) / 16;
    table.resize(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    k.resize(static_cast<size_t>(n_blocks * 16 * row));
    v.resize(k.size());
    const auto kf = random_floats(static_cast<int64_t>(k.size()), seed + 1, -2.0f, 2.0f);
    const auto vf = random_floats(static_cast<int64_t>(v.size()), seed + 2);
    for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(kf[i]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_f16(vf[i]);
    kv.k = reinterpret_cast<const uint8_t*>(k.data());
    kv.v = reinterpret_cast<const uint8_t*>(v.data());
    kv.table = table.data();
    kv.block_shift = 4;
    kv.row_bytes = static_cast<size_t>(row) * 2;
    kv.block_bytes = 16 * kv.row_bytes;
  }
};

// Row r of q16 alone through the per-row kernel (prefill form), at KV head
// kvh: AVX-512's, or with avx2 attend_f16_rounded_avx2.
std::vector<float> per_row(const uint16_t* q16, const PagedKv& head_kv, int64_t hd, int64_t j_begin, int64_t j_end,
                           float softcap, bool avx2 = false) {
  std::vector<float> s(static_cast<size_t>(j_end)), out(static_cast<size_t>(hd), -7.0f);
  std::vector<uint16_t> p(s.size());
  detail::F16AttendArgs a;
  a.q16 = q16;
  a.kv = head_kv;
  a.head_dim = hd;
  a.j_begin = j_begin;
  a.j_end = j_end;
  a.scale = 0.125f;
  a.softcap = softcap;
  a.scores = s.data();
  a.probs16 = p.data();
  a.out = out.data();
  a.single_query = false;
  if (avx2) {
    detail::attend_f16_rounded_avx2(a);
  } else {
    detail::attend_f16_rounded_avx512(a);
  }
  return out;
}

// window > 0: row r sees its last `window` keys. avx2: the AVX2 tile
// against the AVX2 per-row kernel.
void expect_tile_matches(int64_t hd, int n_rows, int64_t base, float softcap, int64_t window, uint32_t& seed,
                         bool avx2 = false) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << hd << " rows " << n_rows << " base " << base << " softcap "
                                    << softcap << " window " << window << (avx2 ? " avx2" : ""));
  // Rows in groups of 3 (a query's heads) share a key count; each next
  // query sees one more key, so counts cross the 16-key blocks in a tile.
  std::vector<int64_t> j_end(static_cast<size_t>(n_rows));
  std::vector<int64_t> j_begin(static_cast<size_t>(n_rows), 0);
  for (int r = 0; r < n_rows; ++r) {
    j_end[static_cast<size_t>(r)] = base + r / 3;
    if (window > 0) j_begin[static_cast<size_t>(r)] = std::max<int64_t>(0, base + r / 3 - window);
  }
  const int64_t n_kv = *std::max_element(j_end.begin(), j_end.end());
  const PagedF16 kvs(n_kv, 2, hd, seed++);
  PagedKv head_kv = kvs.kv;  // the second KV head of each row
  head_kv.k += hd * 2;
  head_kv.v += hd * 2;
  const auto qf = random_floats(n_rows * hd, seed++, -2.0f, 2.0f);
  std::vector<uint16_t> q16(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) q16[i] = f32_to_f16(qf[i]);
  const int64_t stride = n_kv + 3;
  std::vector<float> scores(static_cast<size_t>(n_rows * stride)), got(qf.size(), -9.0f);
  std::vector<uint16_t> probs(scores.size());
  std::vector<float*> outs(static_cast<size_t>(n_rows));
  for (int r = 0; r < n_rows; ++r) outs[static_cast<size_t>(r)] = got.data() + r * hd;
  detail::F16TileArgs t;
  t.q16 = q16.data();
  t.j_end = j_end.data();
  t.kv = head_kv;
  t.head_dim = hd;
  t.n_rows = n_rows;
  t.scale = 0.125f;
  t.softcap = softcap;
  t.scores = scores.data();
  t.probs16 = probs.data();
  t.scratch_stride = stride;
  t.out = outs.data();
  t.j_begin = window > 0 ? j_begin.data() : nullptr;
  if (avx2) {
    detail::attend_f16_rounded_tile_avx2(t);
  } else {
    detail::attend_f16_rounded_tile_avx512(t);
  }
  for (int r = 0; r < n_rows; ++r) {
    const auto want = per_row(q16.data() + r * hd, head_kv, hd, j_begin[static_cast<size_t>(r)],
                              j_end[static_cast<size_t>(r)], softcap, avx2);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data() + r * hd, want.size() * sizeof(float))) << "row " << r;
    EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](float x) { return x != 0.0f; }));
  }
}

TEST(AttentionF16Tile, EachRowMatchesThePerRowKernel) {
  if (!cpu_features().avx512) GTEST_SKIP() << "needs AVX-512";
  uint32_t seed = 5;
  for (int64_t hd : {64, 128, 192, 256}) {
    for (int rows : {1, 2, 3, 4, 5, 7, 12, detail::kMaxTileRows}) {
      for (int64_t base : {1, 14, 16, 30, 63, 200}) expect_tile_matches(hd, rows, base, 0.0f, 0, seed);
    }
    expect_tile_matches(hd, 9, 90, 30.0f, 0, seed);
    // Windows: starts inside and at the 16-key blocks, rows with no whole
    // block, a window of one key.
    for (int64_t window : {1, 5, 16, 17, 40}) {
      for (int64_t base : {3, 33, 100}) expect_tile_matches(hd, 12, base, 0.0f, window, seed);
    }
    expect_tile_matches(hd, 7, 90, 30.0f, 20, seed);
    // The first rows with no whole block, starting before the later rows' first block.
    expect_tile_matches(hd, 15, 45, 0.0f, 20, seed);
    expect_tile_matches(hd, 16, 46, 0.0f, 23, seed);
  }
}

// The AVX2 tile (attend_f16_rounded_tile_avx2) against the AVX2 per-row
// kernel: head_dims that are multiples of 8 from 8 to 256 (the 32-dim
// output chunks and their 1-3 register tails), tiles of 1-16 rows (the
// 4-row scoring and 3-row value groups and their tails), key counts that
// differ from row to row, softcap and windows.
TEST(AttentionF16Tile, Avx2EachRowMatchesThePerRowKernel) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  uint32_t seed = 7;
  for (int64_t hd : {8, 24, 40, 64, 96, 128, 200, 256}) {
    EXPECT_TRUE(detail::attend_f16_tile_avx2_supported(hd));
    for (int rows : {1, 2, 3, 4, 5, 6, 7, 11, detail::kMaxTileRows}) {
      for (int64_t base : {1, 17, 70}) expect_tile_matches(hd, rows, base, 0.0f, 0, seed, true);
    }
    expect_tile_matches(hd, 9, 90, 30.0f, 0, seed, true);
    for (int64_t window : {1, 5, 40}) expect_tile_matches(hd, 12, 33, 0.0f, window, seed, true);
    expect_tile_matches(hd, 7, 90, 30.0f, 20, seed, true);
  }
  EXPECT_FALSE(detail::attend_f16_tile_avx2_supported(12));
  EXPECT_FALSE(detail::attend_f16_tile_avx2_supported(264));
}

// softmax_to_f16_avx2 against the scalar softmax_to_f16 (expf a key at a
// time, the sum in order): every probability within one f16 step of the
// scalar's, on rows of 1-70 scores spread over [-120, 30] (exps below
// 2^-126 are 0 in both after the f16 rounding) and on rows of one score.
TEST(AttentionF16Tile, Avx2SoftmaxIsWithinAnF16StepOfTheScalar) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  for (int64_t n : {1, 2, 7, 8, 9, 16, 31, 70}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " seed " << seed);
      const auto s0 = random_floats(n, seed, -120.0f, 30.0f);
      std::vector<float> a(s0.begin(), s0.end()), b = a;
      std::vector<uint16_t> pa(static_cast<size_t>(n)), pb(pa.size());
      detail::softmax_to_f16(a.data(), pa.data(), n);
      detail::softmax_to_f16_avx2(b.data(), pb.data(), n);
      int differ = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float x = f16_to_f32(pa[static_cast<size_t>(j)]), y = f16_to_f32(pb[static_cast<size_t>(j)]);
        ASSERT_LE(std::fabs(x - y), std::max(std::fabs(x), 6.1e-5f) / 1024) << "key " << j;
        differ += x != y;
      }
      EXPECT_LE(differ, std::max<int64_t>(1, n / 8));
    }
  }
}

// attention_f16_rounded_batch over one sequence of shape c: every (query,
// head) row the per-row kernel's bits (AVX-512's, or with avx2 the AVX2
// one). AVX-512's decode-form rows (decode_from) take llama.cpp's
// single-query arithmetic, which the group tests hold: skipped there; the
// AVX2 kernel has one form, so its rows are all compared.
struct DispatchShape {
  int64_t heads, kv_heads, hd, n_q, n_kv, decode_from, window;
};
void expect_batch_rows_match(const DispatchShape& c, bool avx2, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " n_q " << c.n_q
                                    << " n_kv " << c.n_kv << " decode_from " << c.decode_from << " window " << c.window
                                    << (avx2 ? " avx2" : ""));
  const PagedF16 kvs(c.n_kv, c.kv_heads, c.hd, seed);
  AttentionParams p;
  p.n_head = c.heads;
  p.n_head_kv = c.kv_heads;
  p.head_dim = c.hd;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  p.window = c.window;
  const auto q = random_floats(c.n_q * c.heads * c.hd, seed + 1, -2.0f, 2.0f);
  std::vector<int32_t> pos(static_cast<size_t>(c.n_q));
  for (int64_t i = 0; i < c.n_q; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(c.n_kv - c.n_q + i);
  std::vector<float> got(q.size(), -9.0f);
  const AttentionSeq seq{q.data(), pos.data(), c.n_q, kvs.kv, c.n_kv, got.data(), c.decode_from};
  ThreadPool pool(2);
  attention_f16_rounded_batch(&seq, 1, p, pool);
  for (int64_t i = 0; i < c.n_q; ++i) {
    if (!avx2 && c.decode_from >= 0 && pos[static_cast<size_t>(i)] >= c.decode_from) continue;  // the decode form
    for (int64_t h = 0; h < c.heads; ++h) {
      std::vector<uint16_t> q16(static_cast<size_t>(c.hd));
      for (int64_t d = 0; d < c.hd; ++d) q16[static_cast<size_t>(d)] = f32_to_f16(q[(i * c.heads + h) * c.hd + d]);
      PagedKv head_kv = kvs.kv;
      const int64_t kvh = h / (c.heads / c.kv_heads);
      head_kv.k += kvh * c.hd * 2;
      head_kv.v += kvh * c.hd * 2;
      const int64_t end = pos[static_cast<size_t>(i)] + 1;
      const auto want =
          per_row(q16.data(), head_kv, c.hd, c.window > 0 ? std::max<int64_t>(0, end - c.window) : 0, end, 0.0f, avx2);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data() + (i * c.heads + h) * c.hd, want.size() * sizeof(float)))
          << "query " << i << " head " << h;
    }
  }
}

// The dispatcher at head_dims AVX-512's exact kernel does not take (so on
// every x86 machine the AVX2 tiles, which take decode queries too): every
// (query, head) row of a prefill or a decode step the AVX2 per-row
// kernel's bits, with decode-form rows inside the prompt and with a window.
TEST(AttentionF16Tile, Avx2PrefillRowsAreThePerRowKernels) {
  if (!cpu_features().avx2) GTEST_SKIP() << "needs AVX2";
  for (const DispatchShape& c : {DispatchShape{12, 4, 96, 37, 37, -1, 0}, DispatchShape{12, 4, 96, 20, 90, 80, 0},
                                 DispatchShape{12, 4, 96, 1, 300, -1, 0}, DispatchShape{16, 2, 40, 1, 77, -1, 30},
                                 DispatchShape{8, 1, 80, 9, 40, -1, 0}, DispatchShape{6, 3, 40, 50, 100, -1, 23}}) {
    ASSERT_FALSE(detail::attend_f16_exact_supported(c.hd));
    expect_batch_rows_match(c, true, 31);
  }
}

// The dispatcher: a prefill of many queries over 9 query heads sharing 3
// KV heads (the default model's shape) and over 16 heads sharing 1 (tiles
// of one query), every (query, head) row the per-row kernel's bits, with
// and without decode_from inside the prompt (those rows take the decode
// form, one by one) and with a sliding window.
TEST(AttentionF16Tile, PrefillRowsAreThePerRowKernels) {
  if (!cpu_features().avx512) GTEST_SKIP() << "needs AVX-512";
  for (const DispatchShape& c : {DispatchShape{9, 3, 64, 37, 37, -1, 0}, DispatchShape{9, 3, 64, 20, 90, 80, 0},
                                 DispatchShape{16, 1, 128, 5, 40, -1, 0}, DispatchShape{4, 4, 256, 18, 18, -1, 0},
                                 DispatchShape{9, 3, 64, 60, 100, -1, 23}, DispatchShape{8, 2, 256, 30, 70, 65, 32}}) {
    expect_batch_rows_match(c, false, 21);
  }
}

}  // namespace
}  // namespace rill::cpu
