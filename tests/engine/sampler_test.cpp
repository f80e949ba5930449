#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace rill {
namespace {

std::vector<float> logits_of(std::initializer_list<float> v) {
  return std::vector<float>(v);
}

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  auto l = logits_of({0.1f, 2.0f, -1.0f, 2.0f, 1.9f});
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(argmax(l.data(), 5), 1);
}

// The reference: the plain scan argmax() must equal on every input.
int32_t scalar_argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

TEST(Sampler, ArgmaxEqualsTheScalarScanOnTiesNansInfinitiesAndTails) {
  std::mt19937 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 200);
    std::vector<float> x(static_cast<size_t>(n));
    const int kind = trial % 5;
    for (auto& v : x) {
      const uint32_t r = rng() % 100;
      if (kind == 0)
        v = static_cast<float>(static_cast<int>(rng() % 7) - 3);  // many ties
      else
        v = std::uniform_real_distribution<float>(-5, 5)(rng);
      if (kind >= 2 && r < 5) v = nan;
      if (kind >= 3 && r >= 95) v = r % 2 ? inf : -inf;
      if (kind == 4 && r >= 90 && r < 95) v = r % 2 ? 0.0f : -0.0f;
    }
    if (trial % 17 == 0) x[0] = nan;
    if (trial % 19 == 0) std::fill(x.begin(), x.end(), -inf);
    ASSERT_EQ(argmax(x.data(), n), scalar_argmax(x.data(), n)) << "trial " << trial << " n " << n;
  }
}

TEST(Sampler, TopKOfOneIsGreedyEvenWithTemperature) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  p.seed = 1;
  Sampler s(p, 4);
  for (int i = 0; i < 50; ++i) {
    auto l = logits_of({0.0f, 0.5f, 0.4f, 0.3f});
    EXPECT_EQ(s.sample(l.data()), 1);
  }
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto draw = [](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = seed;
    Sampler s(p, 8);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> l(8, 0.0f);  // uniform
      out.push_back(s.sample(l.data()));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p, 3);
  const float raw[3] = {0.0f, std::log(2.0f), std::log(5.0f)};  // probabilities 1/8, 2/8, 5/8
  std::map<int, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    float l[3] = {raw[0], raw[1], raw[2]};
    ++count[s.sample(l)];
  }
  // 40k draws: the standard error of each frequency is below 0.0025.
  EXPECT_NEAR(count[0] / double(n), 1.0 / 8, 0.01);
  EXPECT_NEAR(count[1] / double(n), 2.0 / 8, 0.01);
  EXPECT_NEAR(count[2] / double(n), 5.0 / 8, 0.01);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  auto top_share = [](float temperature) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 3;
    Sampler s(p, 2);
    int top = 0;
    for (int i = 0; i < 20000; ++i) {
      float l[2] = {1.0f, 0.0f};
      top += s.sample(l) == 0;
    }
    return top / 20000.0;
  };
  const double e = std::exp(1.0);
  EXPECT_NEAR(top_share(1.0f), e / (e + 1), 0.015);
  EXPECT_NEAR(top_share(0.5f), e * e / (e * e + 1), 0.015);
  EXPECT_GT(top_share(0.1f), 0.99);
  EXPECT_NEAR(top_share(100.0f), 0.5, 0.02);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.6f;  // probabilities 0.5, 0.3, 0.2: keeps {0, 1}
  p.seed = 11;
  Sampler s(p, 3);
  std::map<int, int> count;
  for (int i = 0; i < 10000; ++i) {
    float l[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    ++count[s.sample(l)];
  }
  EXPECT_EQ(count[2], 0);
  EXPECT_NEAR(count[0] / 10000.0, 0.5 / 0.8, 0.02);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.5f;  // probabilities 0.5, 0.3, 0.2: 0.2 < 0.25 is dropped
  p.seed = 5;
  Sampler s(p, 3);
  for (int i = 0; i < 5000; ++i) {
    float l[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    EXPECT_NE(s.sample(l), 2);
  }
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4);
  const int32_t prompt[] = {0, 1};
  s.add_prompt_tokens(prompt);
  // 0: 3.0 -> 1.5, 1: -1.0 -> -2.0, 2: 2.0 untouched, 3: 1.0 untouched
  float l[4] = {3.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(l), 2);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[1], -2.0f);
  EXPECT_FLOAT_EQ(l[2], 2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputTokensOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 3);
  const int32_t prompt[] = {2};
  s.add_prompt_tokens(prompt);  // no effect on these penalties
  s.add_output_token(0);
  s.add_output_token(0);
  s.add_output_token(1);
  float l[3] = {1.0f, 1.0f, 1.0f};
  s.sample(l);
  EXPECT_FLOAT_EQ(l[0], 1.0f - 0.5f - 0.25f * 2);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 0.5f - 0.25f * 1);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
}

// Reference logprobs: log-softmax in double, all ids sorted by (logprob
// descending, id ascending).
std::vector<TokenLogprob> reference_logprobs(const std::vector<float>& logits) {
  const double max_l = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(l - max_l);
  const double lse = max_l + std::log(sum);
  std::vector<TokenLogprob> all;
  for (size_t i = 0; i < logits.size(); ++i) {
    all.push_back({static_cast<int32_t>(i), static_cast<float>(logits[i] - lse)});
  }
  std::sort(all.begin(), all.end(), [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  });
  return all;
}

// Random logits on a 1/4 grid, so ties (broken by the lower id) are common.
std::vector<float> random_logits(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> q(-40, 40);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& x : l) x = static_cast<float>(q(rng)) * 0.25f;
  return l;
}

TEST(SamplerLogprobs, TopEntriesAndChosenLogprobMatchTheReference) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 200; ++iter) {
    const int n_vocab = iter % 4 == 0 ? 3000 : 1 + static_cast<int>(rng() % 50);
    const int n_top = static_cast<int>(rng() % 22);  // 0..21, clamped to 20 and n_vocab
    SamplingParams p;
    p.temperature = iter % 3 == 0 ? 0.0f : 0.7f;
    p.top_k = iter % 5 == 0 ? 3 : 0;
    p.top_p = iter % 7 == 0 ? 0.5f : 1.0f;
    p.seed = static_cast<uint64_t>(iter);
    Sampler s(p, n_vocab);
    auto l = random_logits(rng, n_vocab);
    const auto ref = reference_logprobs(l);
    SampledToken out;
    const int32_t id = s.sample(l.data(), n_top, &out);
    EXPECT_EQ(out.id, id);
    ASSERT_EQ(out.n_top, std::min({n_top, kMaxTopLogprobs, n_vocab}));
    for (int k = 0; k < out.n_top; ++k) {
      EXPECT_EQ(out.top[k].id, ref[k].id) << "iter " << iter << " rank " << k;
      EXPECT_NEAR(out.top[k].logprob, ref[k].logprob, 1e-5f);
    }
    const auto chosen = std::find_if(ref.begin(), ref.end(), [&](const TokenLogprob& t) { return t.id == id; });
    EXPECT_NEAR(out.logprob, chosen->logprob, 1e-5f);
  }
}

TEST(SamplerLogprobs, GreedyPickHasTheMaxLogprob) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 6);
  auto l = logits_of({0.5f, 3.0f, -2.0f, 3.0f, 1.0f, 0.0f});
  const auto ref = reference_logprobs(l);
  SampledToken out;
  EXPECT_EQ(s.sample(l.data(), 2, &out), 1);
  EXPECT_EQ(out.top[0].id, 1);
  EXPECT_EQ(out.top[1].id, 3);  // same logit: the lower id ranks first
  EXPECT_EQ(out.logprob, out.top[0].logprob);
  EXPECT_NEAR(out.logprob, ref[0].logprob, 1e-6f);
}

TEST(SamplerLogprobs, TopCoveringTheVocabSumsToOne) {
  SamplingParams p;
  p.seed = 4;
  Sampler s(p, 5);
  auto l = logits_of({1.0f, -3.0f, 2.5f, 0.0f, 0.25f});
  SampledToken out;
  s.sample(l.data(), kMaxTopLogprobs, &out);
  ASSERT_EQ(out.n_top, 5);
  double total = 0.0;
  for (int k = 0; k < out.n_top; ++k) total += std::exp(double(out.top[k].logprob));
  EXPECT_NEAR(total, 1.0, 1e-6);
  for (int k = 1; k < out.n_top; ++k) EXPECT_GE(out.top[k - 1].logprob, out.top[k].logprob);
}

TEST(SamplerLogprobs, AreTakenAfterPenaltiesAndBeforeTemperature) {
  SamplingParams p;
  p.temperature = 0.25f;
  p.top_k = 2;
  p.repetition_penalty = 2.0f;
  p.seed = 8;
  Sampler s(p, 4);
  const int32_t prompt[] = {0};
  s.add_prompt_tokens(prompt);
  auto l = logits_of({4.0f, 1.0f, 2.0f, 0.5f});
  // Penalised logits {2, 1, 2, 0.5}; the softmax is over all four tokens,
  // untempered, though top-k keeps only two for the draw.
  const auto ref = reference_logprobs(logits_of({2.0f, 1.0f, 2.0f, 0.5f}));
  SampledToken out;
  const int32_t id = s.sample(l.data(), 4, &out);
  EXPECT_TRUE(id == 0 || id == 2);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(out.top[k].id, ref[k].id);
    EXPECT_NEAR(out.top[k].logprob, ref[k].logprob, 1e-6f);
  }
}

TEST(SamplerLogprobs, DoNotChangeTheDraws) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  p.seed = 21;
  Sampler plain(p, 64);
  Sampler with_logprobs(p, 64);
  std::mt19937 rng(5);
  for (int i = 0; i < 500; ++i) {
    auto a = random_logits(rng, 64);
    auto b = a;
    SampledToken out;
    EXPECT_EQ(plain.sample(a.data()), with_logprobs.sample(b.data(), 5, &out));
    EXPECT_EQ(a, b);
  }
}

TEST(SamplerLogitBias, ForcesATokenUnderGreedyAndSampling) {
  for (float temperature : {0.0f, 1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 13;
    p.logit_bias = {{3, 100.0f}, {1, -100.0f}};
    Sampler s(p, 5);
    for (int i = 0; i < 1000; ++i) {
      auto l = logits_of({1.0f, 5.0f, 2.0f, -4.0f, 0.0f});
      ASSERT_EQ(s.sample(l.data()), 3) << "temperature " << temperature;
    }
  }
  // A large negative bias bans the argmax under greedy.
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.0f}};
  Sampler s(p, 3);
  auto l = logits_of({1.0f, 5.0f, 2.0f});
  EXPECT_EQ(s.sample(l.data()), 2);
  EXPECT_FLOAT_EQ(l[1], -95.0f);
}

TEST(SamplerLogitBias, IsAppliedBeforePenaltiesAndIgnoresInvalidIds) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{-1, 50.0f}, {4, 50.0f}, {1 << 30, 50.0f}, {0, 1.0f}};
  Sampler s(p, 4);
  const int32_t prompt[] = {0};
  s.add_prompt_tokens(prompt);
  auto l = logits_of({3.0f, 1.0f, 2.0f, 0.5f});
  EXPECT_EQ(s.sample(l.data()), 0);  // (3 + 1) / 2 = 2 ties token 2: lower id
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[1], 1.0f);
  EXPECT_FLOAT_EQ(l[2], 2.0f);
  EXPECT_FLOAT_EQ(l[3], 0.5f);
}

}  // namespace
}  // namespace rill

namespace rill {
namespace {

std::vector<uint64_t> random_mask(std::mt19937& rng, int n_vocab, int n_allowed) {
  std::vector<int> ids(static_cast<size_t>(n_vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<uint64_t> mask(static_cast<size_t>((n_vocab + 63) / 64), 0);
  for (int i = 0; i < n_allowed; ++i) mask[static_cast<size_t>(ids[i]) / 64] |= uint64_t{1} << (ids[i] % 64);
  return mask;
}

bool allowed(const std::vector<uint64_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
}

TEST(SamplerMask, GreedyTakesTheBestAllowedToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 200);
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    auto logits = random_logits(rng, 200);
    const auto mask = random_mask(rng, 200, 1 + i % 7);
    int32_t best = -1;
    for (int32_t t = 0; t < 200; ++t) {
      if (allowed(mask, t) && (best < 0 || logits[t] > logits[best])) best = t;
    }
    EXPECT_EQ(s.sample(logits.data(), -1, nullptr, mask), best);
  }
}

TEST(SamplerMask, SeededDrawsStayInsideTheMaskAndFollowItsSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.top_k = 40;
  p.seed = 9;
  Sampler s(p, 130);  // a partial last mask word
  std::mt19937 rng(4);
  for (int i = 0; i < 2000; ++i) {
    auto logits = random_logits(rng, 130);
    const auto mask = random_mask(rng, 130, 1 + i % 5);
    EXPECT_TRUE(allowed(mask, s.sample(logits.data(), -1, nullptr, mask))) << i;
  }
  // Two allowed tokens with logits 0 and ln 3 among far better masked ones:
  // drawn 1:3.
  SamplingParams q;
  q.seed = 17;
  Sampler t(q, 64);
  std::vector<uint64_t> mask = {(uint64_t{1} << 5) | (uint64_t{1} << 40)};
  int n40 = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<float> logits(64, 10.0f);
    logits[5] = 0.0f;
    logits[40] = std::log(3.0f);
    const int32_t id = t.sample(logits.data(), -1, nullptr, mask);
    ASSERT_TRUE(id == 5 || id == 40);
    n40 += id == 40;
  }
  EXPECT_NEAR(n40 / 4000.0, 0.75, 0.03);
}

TEST(SamplerMask, TakesTheSameDrawsAsTheUnmaskedStreamAndUnmaskedLogprobs) {
  // The mask consumes no extra randomness: with an all-allowed mask the
  // tokens are the unmasked ones; logprobs describe the unmasked row.
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 5;
  Sampler plain(p, 100), masked(p, 100);
  std::vector<uint64_t> all = {~uint64_t{0}, ~uint64_t{0}};
  std::mt19937 rng(6);
  for (int i = 0; i < 300; ++i) {
    auto a = random_logits(rng, 100);
    auto b = a;
    EXPECT_EQ(plain.sample(a.data()), masked.sample(b.data(), -1, nullptr, all));
  }
  Sampler lp_plain(p, 100), lp_masked(p, 100);
  for (int i = 0; i < 50; ++i) {
    auto a = random_logits(rng, 100);
    auto b = a;
    const auto mask = random_mask(rng, 100, 3);
    SampledToken out_plain, out_masked;
    lp_plain.sample(a.data(), 4, &out_plain);
    const int32_t id = lp_masked.sample(b.data(), 4, &out_masked, mask);
    ASSERT_TRUE(allowed(mask, id));
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(out_masked.top[k].id, out_plain.top[k].id);
      EXPECT_FLOAT_EQ(out_masked.top[k].logprob, out_plain.top[k].logprob);
    }
    // The chosen token's logprob is its unmasked one.
    float expected = 0;
    for (int k = 0; k < 100; ++k) {
      if (k == id) expected = out_plain.top[0].logprob - (a[static_cast<size_t>(out_plain.top[0].id)] - a[k]);
    }
    EXPECT_NEAR(out_masked.logprob, expected, 1e-4f);
  }
}

}  // namespace
}  // namespace rill
