// attend_f16_rounded_group_avx512 (decode attention for the query heads of
// one KV head at once) gives each head exactly the bits of the per-head
// kernel attend_f16_rounded_avx512 with single_query, over paged K/V with a
// shuffled block table, for every supported (head_dim, heads) shape, window
// and softcap, and context lengths around the 16- and 64-key steps; also
// with every KV head of a row in one call (F16GroupArgs::n_kv_heads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/cpu_features.h"
#include "core/half.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::random_floats;

struct Case {
  int64_t head_dim;
  int n_heads;
  int64_t n_kv, window;
  float softcap;
};

// One call of attend_f16_rounded_group_avx512 against the per-head kernel,
// head by head. fused_kv_heads 0: a row holds 2 KV heads and the call takes
// the second; otherwise the row holds that many and one call takes them all.
void expect_heads_match(const Case& c, int fused_kv_heads, uint32_t& seed) {
  SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " heads " << c.n_heads << " n_kv " << c.n_kv
                                    << " window " << c.window << " softcap " << c.softcap << " fused KV heads "
                                    << fused_kv_heads);
  const int n_kv_heads = fused_kv_heads > 0 ? fused_kv_heads : 2;
  const int first = fused_kv_heads > 0 ? 0 : 1, n_call = fused_kv_heads > 0 ? fused_kv_heads : 1;
  const int64_t row = n_kv_heads * c.head_dim;
  constexpr int32_t kShift = 4;
  const int64_t n_blocks = (c.n_kv + 15) >> kShift;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(n_blocks - 1 - b);
  std::shuffle(table.begin(), table.end(), std::mt19937(seed));
  std::vector<uint16_t> k(static_cast<size_t>(n_blocks * 16 * row)), v(k.size());
  const auto kf = random_floats(static_cast<int64_t>(k.size()), seed++, -2.0f, 2.0f);
  const auto vf = random_floats(static_cast<int64_t>(v.size()), seed++);
  for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(kf[i]);
  for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_f16(vf[i]);
  PagedKv kv;  // at KV head `first`
  kv.k = reinterpret_cast<const uint8_t*>(k.data()) + first * c.head_dim * 2;
  kv.v = reinterpret_cast<const uint8_t*>(v.data()) + first * c.head_dim * 2;
  kv.table = table.data();
  kv.block_shift = kShift;
  kv.row_bytes = static_cast<size_t>(row) * 2;
  kv.block_bytes = 16 * kv.row_bytes;

  const int n_q_heads = n_call * c.n_heads;
  const auto qf = random_floats(n_q_heads * c.head_dim, seed++, -2.0f, 2.0f);
  std::vector<uint16_t> q16(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) q16[i] = f32_to_f16(qf[i]);
  const int64_t pos = c.n_kv - 1;
  const int64_t j_begin = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
  const int64_t stride = c.n_kv + 5;

  std::vector<float> scores(static_cast<size_t>(n_q_heads * stride)), got(qf.size(), -9.0f);
  std::vector<uint16_t> probs(scores.size());
  detail::F16GroupArgs g;
  g.q16 = q16.data();
  g.kv = kv;
  g.head_dim = c.head_dim;
  g.j_begin = j_begin;
  g.j_end = c.n_kv;
  g.n_heads = c.n_heads;
  g.scale = 0.125f;
  g.softcap = c.softcap;
  g.scores = scores.data();
  g.probs16 = probs.data();
  g.scratch_stride = stride;
  g.out = got.data();
  g.n_kv_heads = n_call;
  detail::attend_f16_rounded_group_avx512(g);

  for (int h = 0; h < n_q_heads; ++h) {
    std::vector<float> s1(static_cast<size_t>(c.n_kv)), want(static_cast<size_t>(c.head_dim), -7.0f);
    std::vector<uint16_t> p1(s1.size());
    detail::F16AttendArgs a;
    a.q16 = q16.data() + h * c.head_dim;
    a.kv = kv;
    a.kv.k += (h / c.n_heads) * c.head_dim * 2;  // query head h reads KV head first + h / n_heads
    a.kv.v += (h / c.n_heads) * c.head_dim * 2;
    a.head_dim = c.head_dim;
    a.j_begin = j_begin;
    a.j_end = c.n_kv;
    a.scale = 0.125f;
    a.softcap = c.softcap;
    a.scores = s1.data();
    a.probs16 = p1.data();
    a.out = want.data();
    a.single_query = true;
    detail::attend_f16_rounded_avx512(a);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data() + h * c.head_dim, want.size() * sizeof(float))) << "head " << h;
    // The result is a real attention output: finite and not all zero.
    EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](float x) { return x != 0.0f; }));
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int64_t hd : {64, 128, 192, 256}) {
    const int max_heads = detail::attend_f16_group_max_heads(hd);
    EXPECT_GE(max_heads, 1) << hd;
    for (int nh = 1; nh <= max_heads; ++nh) {
      for (int64_t n_kv : {1, 15, 16, 17, 63, 64, 65, 200, 333}) cases.push_back({hd, nh, n_kv, 0, 0.0f});
      cases.push_back({hd, nh, 300, 100, 0.0f});  // sliding window: keys before pos - 99 masked
      cases.push_back({hd, nh, 90, 0, 30.0f});    // softcap
    }
  }
  return cases;
}

TEST(AttentionF16Group, EachHeadMatchesThePerHeadKernel) {
  if (!cpu_features().avx512) GTEST_SKIP() << "needs AVX-512";
  EXPECT_EQ(detail::attend_f16_group_max_heads(96), 0);
  uint32_t seed = 7;
  for (const Case& c : all_cases()) expect_heads_match(c, 0, seed);
}

// One call over every KV head of a row (the decode path with a sequence per
// thread) gives each query head the per-head kernel's bits too.
TEST(AttentionF16Group, AllKvHeadsInOneCallMatchThePerHeadKernel) {
  if (!cpu_features().avx512) GTEST_SKIP() << "needs AVX-512";
  uint32_t seed = 70;
  for (const Case& c : all_cases())
    for (int kv_heads : {2, 3, detail::kMaxFusedKvHeads}) expect_heads_match(c, kv_heads, seed);
}

}  // namespace
}  // namespace rill::cpu
