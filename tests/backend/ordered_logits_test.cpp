// backend/cpu/ordered_logits.h, the CPU arithmetic of Backend::ordered_logits
// (Gemma 4's assistant's head): the picked groups against a stable sort of
// the scores (descending, ties to the lower group) over rows with many
// ties, every group count up to all of them; the fill against its formula;
// the eight-lane dot product against a double one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/ordered_logits.h"

namespace rill::cpu {
namespace {

TEST(OrderedLogits, PicksTheTopGroupsInOrderWithTiesToTheLowerGroup) {
  std::mt19937 rng(5);
  for (const int32_t C : {1, 7, 64, 2048}) {
    for (const int32_t K : {1, 3, 32, C}) {
      if (K > C) continue;
      for (const int64_t per : {int64_t{1}, int64_t{4}}) {
        std::vector<int32_t> ordering(static_cast<size_t>(C * per));
        std::iota(ordering.begin(), ordering.end(), 0);
        std::shuffle(ordering.begin(), ordering.end(), rng);
        for (int row = 0; row < 4; ++row) {
          // Few distinct values: ties everywhere, at the cut too.
          std::uniform_int_distribution<int> level(0, row == 0 ? 2 : 9);
          std::vector<float> scores(static_cast<size_t>(C));
          for (float& s : scores) s = static_cast<float>(level(rng)) * 0.25f - 1.0f;
          std::vector<int32_t> order(static_cast<size_t>(C));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
          });
          std::vector<int32_t> want;
          for (int32_t k = 0; k < K; ++k) {
            const auto c = static_cast<size_t>(order[static_cast<size_t>(k)]);
            want.insert(want.end(), ordering.begin() + static_cast<std::ptrdiff_t>(c * per),
                        ordering.begin() + static_cast<std::ptrdiff_t>((c + 1) * per));
          }
          std::vector<int32_t> got(static_cast<size_t>(K * per), -1);
          pick_ordered_tokens(scores.data(), C, K, ordering.data(), per, got.data());
          ASSERT_EQ(got, want) << "C " << C << " K " << K << " per " << per << " row " << row;
        }
      }
    }
  }
}

// NaN scores rank as -infinity (a NaN hidden row must still pick valid
// groups, never an index outside the ordering): NaN first, NaN at the cut,
// and a row of NaN only.
TEST(OrderedLogits, NanScoresRankBelowEveryNumber) {
  constexpr int32_t C = 6, K = 3;
  const std::vector<int32_t> ordering = {50, 51, 52, 53, 54, 55};
  const float nan = NAN;
  const std::vector<std::pair<std::vector<float>, std::vector<int32_t>>> rows = {
      {{nan, 1.0f, 2.0f, nan, 0.5f, -INFINITY}, {52, 51, 54}},
      {{0.0f, nan, 0.0f, -INFINITY, nan, 3.0f}, {55, 50, 52}},
      {{nan, nan, nan, nan, nan, nan}, {50, 51, 52}},
      {{-INFINITY, nan, 1.0f, nan, nan, nan}, {52, 50, 51}},
  };
  for (const auto& [scores, want] : rows) {
    std::vector<int32_t> got(K, -1);
    pick_ordered_tokens(scores.data(), C, K, ordering.data(), 1, got.data());
    EXPECT_EQ(got, want);
  }
}

TEST(OrderedLogits, FillsEveryOtherTokenWithTheSmallestDotMinusOne) {
  const std::vector<int32_t> picked = {5, 0, 9};
  const std::vector<float> dots = {1.5f, -2.0f, 0.25f};
  std::vector<float> logits(12, NAN);
  fill_masked_logits(dots.data(), picked.data(), 3, logits.data(), 12);
  for (int32_t v = 0; v < 12; ++v) {
    const float want = v == 5 ? 1.5f : v == 0 ? -2.0f : v == 9 ? 0.25f : -3.0f;
    EXPECT_EQ(logits[static_cast<size_t>(v)], want) << v;
  }
}

TEST(OrderedLogits, EightLaneDotMatchesADoubleDot) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{24}, int64_t{259}}) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = d(rng), b[i] = d(rng);
    double want = 0;
    for (size_t i = 0; i < a.size(); ++i) want += double(a[i]) * b[i];
    EXPECT_NEAR(dot_lanes8(a.data(), b.data(), n), want, 1e-5 * static_cast<double>(n)) << n;
  }
}

}  // namespace
}  // namespace rill::cpu
