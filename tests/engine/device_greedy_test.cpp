// The engine's ids-only path: steps whose every sampling row is plain greedy
// (no logprobs, penalties or logit bias) take token ids from
// Model::forward_greedy (argmax where the model runs; on a GPU no logit row
// crosses to the host); any other step samples forward()'s logits on the
// CPU. Checked over FakeModel (tests/engine/fake_model.h) with and without
// forward_greedy: every request gets the same tokens (and logprobs) either
// way, and the path taken is the one the rows allow.
#include <gtest/gtest.h>

#include "engine/sampler.h"
#include "fake_model.h"
#include "rill/engine.h"

namespace rill {
namespace {

using testing::FakeModel;

struct Outcome {
  std::vector<std::vector<int32_t>> ids;  // per request
  std::vector<std::vector<SampledToken>> logprobs;
  int n_greedy_calls = 0, n_logit_calls = 0;
};

std::vector<int32_t> prompt_of(int32_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((i * 11 + salt * 5 + 3) % 64);
  return p;
}

// Submits all requests at once (so they share steps) and drains them.
Outcome run_all(const std::vector<GenerationRequest>& requests, bool device_greedy) {
  auto model = std::make_unique<FakeModel>(FakeModel::Options{.n_blocks = 512, .device_greedy = device_greedy});
  FakeModel* raw = model.get();
  EngineOptions eo;
  eo.check_integrity = true;
  auto e = Engine::create(std::move(model), nullptr, eo);
  EXPECT_TRUE(e.ok()) << e.error().message;
  std::vector<RequestHandle> hs;
  for (const GenerationRequest& r : requests) {
    auto h = (*e)->submit(r);
    EXPECT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
  }
  Outcome out;
  for (RequestHandle& h : hs) {
    std::vector<int32_t> ids;
    std::vector<SampledToken> lps;
    GenerationEvent ev;
    while (h.next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
    out.ids.push_back(std::move(ids));
    out.logprobs.push_back(std::move(lps));
  }
  out.n_greedy_calls = raw->n_greedy_calls();
  out.n_logit_calls = raw->n_logit_calls();
  return out;
}

GenerationRequest greedy(int32_t salt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = prompt_of(4 + salt * 3, salt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.ids.size(), b.ids.size());
  for (size_t i = 0; i < a.ids.size(); ++i) {
    EXPECT_EQ(a.ids[i], b.ids[i]) << "request " << i;
    ASSERT_EQ(a.logprobs[i].size(), b.logprobs[i].size()) << "request " << i;
    for (size_t k = 0; k < a.logprobs[i].size(); ++k) {
      EXPECT_EQ(a.logprobs[i][k].id, b.logprobs[i][k].id);
      EXPECT_EQ(a.logprobs[i][k].logprob, b.logprobs[i][k].logprob);
    }
  }
}

TEST(Sampler, PlainGreedyIsArgmaxWithNothingThatReadsTheLogits) {
  auto plain = [](SamplingParams p) { return Sampler(p, 16).is_plain_greedy(); };
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(plain(p));
  p.top_p = 0.5f;  // ignored by an argmax draw
  p.min_p = 0.3f;
  EXPECT_TRUE(plain(p));
  SamplingParams k1;
  k1.temperature = 0.8f;
  k1.top_k = 1;
  EXPECT_TRUE(plain(k1));
  SamplingParams t;
  t.temperature = 0.8f;
  EXPECT_FALSE(plain(t));
  SamplingParams rep = p;
  rep.repetition_penalty = 1.1f;
  EXPECT_FALSE(plain(rep));
  SamplingParams pres = p;
  pres.presence_penalty = 0.5f;
  EXPECT_FALSE(plain(pres));
  SamplingParams freq = p;
  freq.frequency_penalty = -0.5f;
  EXPECT_FALSE(plain(freq));
  SamplingParams bias = p;
  bias.logit_bias = {{3, 5.0f}};
  EXPECT_FALSE(plain(bias));
}

TEST(DeviceGreedy, AllGreedyStepsTakeIdsOnlyAndGiveTheCpuTokens) {
  std::vector<GenerationRequest> rs;
  for (int32_t i = 0; i < 12; ++i) rs.push_back(greedy(i, 6 + i));
  GenerationRequest k1 = greedy(12, 9);
  k1.sampling.temperature = 0.7f;  // top_k 1: still an argmax
  k1.sampling.top_k = 1;
  rs.push_back(k1);
  const Outcome cpu = run_all(rs, false);
  const Outcome dev = run_all(rs, true);
  expect_same(cpu, dev);
  EXPECT_EQ(cpu.n_greedy_calls, 0);
  EXPECT_EQ(dev.n_logit_calls, 0) << "a greedy-only step sampled on the host";
  EXPECT_GT(dev.n_greedy_calls, 0);
  // Requests continue differently, so a row mix-up would show.
  EXPECT_NE(dev.ids[0], dev.ids[1]);
}

TEST(DeviceGreedy, RowsThatNeedLogitsKeepTheStepOnTheHostWithTheSameTokens) {
  std::vector<GenerationRequest> rs;
  for (int32_t i = 0; i < 6; ++i) rs.push_back(greedy(i, 20));  // outlive the others: later steps go ids-only
  GenerationRequest seeded = greedy(6, 6);
  seeded.sampling.temperature = 0.9f;
  seeded.sampling.seed = 77;
  rs.push_back(seeded);
  GenerationRequest lp = greedy(7, 5);
  lp.logprobs = 3;
  rs.push_back(lp);
  GenerationRequest rep = greedy(8, 7);
  rep.sampling.repetition_penalty = 1.3f;
  rs.push_back(rep);
  GenerationRequest bias = greedy(9, 4);
  bias.sampling.logit_bias = {{5, 200.0f}};  // forces token 5, which argmax of the raw row rarely is
  rs.push_back(bias);
  GenerationRequest pres = greedy(10, 6);
  pres.sampling.presence_penalty = 30.0f;
  rs.push_back(pres);

  const Outcome cpu = run_all(rs, false);
  const Outcome dev = run_all(rs, true);
  expect_same(cpu, dev);
  EXPECT_EQ(dev.ids[9], std::vector<int32_t>(4, 5));  // the bias reached the logits
  EXPECT_EQ(dev.logprobs[7].size(), 5u);
  EXPECT_GT(dev.n_logit_calls, 0) << "steps with sampled rows must read logits";
  EXPECT_GT(dev.n_greedy_calls, 0) << "once only greedy rows are left, steps should go ids-only";
}

}  // namespace
}  // namespace rill
