#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace rill {
namespace {

std::vector<float> logits_of(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  auto l = logits_of({0.1f, 2.0f, -1.0f, 2.0f, 1.9f});
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(argmax(l.data(), 5), 1);
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

}  // namespace
}  // namespace rill
