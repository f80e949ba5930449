// StepCostModel against known linear costs: the fit recovers them, follows
// a change, and degrades to a conservative fit where the steps seen cannot
// separate the fixed from the per-token cost. Numbers in, numbers out: no
// clock.
#include "engine/step_cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace rill {
namespace {

constexpr double kEps = 1e-9;

TEST(StepCostModel, RecoversALinearCost) {
  StepCostModel m;
  for (int32_t n : {1, 33, 8, 100, 40, 2, 64, 17}) m.observe(n, 0.010 + 0.002 * n);
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.fixed_s(), 0.010, kEps);
  EXPECT_NEAR(m.per_token_s(), 0.002, kEps);
  EXPECT_NEAR(m.predict_s(50), 0.110, kEps);
  EXPECT_EQ(m.max_tokens_within(0.050), 20);
  EXPECT_EQ(m.max_tokens_within(0.0515), 20);
  EXPECT_EQ(m.max_tokens_within(0.005), 0);  // below the fixed cost
}

TEST(StepCostModel, ReadyAfterFourSteps) {
  StepCostModel m;
  for (int i = 0; i < 3; ++i) {
    m.observe(10 + i, 0.02);
    EXPECT_FALSE(m.ready());
  }
  m.observe(20, 0.03);
  EXPECT_TRUE(m.ready());
}

TEST(StepCostModel, IgnoresStepsWithoutTokensOrTime) {
  StepCostModel m;
  m.observe(0, 0.1);
  m.observe(-3, 0.1);
  m.observe(8, 0.0);
  m.observe(8, -1.0);
  m.observe(8, std::numeric_limits<double>::quiet_NaN());
  m.observe(8, std::numeric_limits<double>::infinity());
  EXPECT_EQ(m.n_steps(), 0);
  EXPECT_EQ(m.predict_s(100), 0.0);
}

TEST(StepCostModel, StepsOfOneSizeFitThroughTheOrigin) {
  // Nothing tells the fixed cost from the rate: all of it becomes the rate,
  // so larger steps are over-predicted (a share sized from it errs small).
  StepCostModel m;
  for (int i = 0; i < 10; ++i) m.observe(32, 0.064);
  EXPECT_EQ(m.fixed_s(), 0.0);
  EXPECT_NEAR(m.per_token_s(), 0.002, kEps);
}

TEST(StepCostModel, ANegativeFixedCostFallsBackToTheOrigin) {
  StepCostModel m;
  for (int32_t n : {10, 20, 30, 40}) m.observe(n, -0.010 + 0.002 * n);
  EXPECT_EQ(m.fixed_s(), 0.0);
  EXPECT_GT(m.per_token_s(), 0.0);
  // Through the origin: sum(n t) / sum(n^2) of the decayed observations.
  EXPECT_LT(m.per_token_s(), 0.002);
}

TEST(StepCostModel, FreeTokensAllowAnyStep) {
  StepCostModel m;  // a bandwidth-bound GPU at small steps: time does not grow with tokens
  for (int32_t n : {1, 8, 4, 16, 2}) m.observe(n, 0.005);
  EXPECT_NEAR(m.fixed_s(), 0.005, kEps);
  EXPECT_NEAR(m.per_token_s(), 0.0, kEps);
  EXPECT_EQ(m.max_tokens_within(0.0125), std::numeric_limits<int32_t>::max());
}

TEST(StepCostModel, FollowsAChangeOfCost) {
  StepCostModel m(0.95);
  for (int i = 0; i < 50; ++i) m.observe(1 + i % 40, 0.010 + 0.002 * (1 + i % 40));
  // The machine gets twice as slow (another process took a core).
  for (int i = 0; i < 150; ++i) m.observe(1 + i % 40, 0.020 + 0.004 * (1 + i % 40));
  // 0.95^150 = 0.05% of the weight is left on the old steps.
  EXPECT_NEAR(m.fixed_s(), 0.020, 0.020 * 0.01);
  EXPECT_NEAR(m.per_token_s(), 0.004, 0.004 * 0.01);
}

}  // namespace
}  // namespace rill
