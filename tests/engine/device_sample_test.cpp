// The engine's device-sampling path: steps whose every sampling row has
// unedited logits and no logprobs take ids from Model::forward_sample (a
// draw where the model runs under each row's parameters and Philox(seed,
// draw index)); steps with any other row sample forward()'s logits here.
// Checked over FakeModel, whose forward_sample draws with the host
// reference of the device rule (Sampler::reference_draw): seeded requests
// give the same tokens whichever path each step took, so a request's
// stream does not depend on what shares its steps. Also: the Sampler's own
// draws follow backend/sampling.h (kept sets, Philox stream).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "fake_model.h"
#include "rill/engine.h"

namespace rill {
namespace {

using testing::FakeModel;

struct Outcome {
  std::vector<std::vector<int32_t>> ids;  // per request
  int n_sample_calls = 0, n_greedy_calls = 0, n_logit_calls = 0;
};

Outcome run_all(const std::vector<GenerationRequest>& requests, bool device) {
  auto model = std::make_unique<FakeModel>(
      FakeModel::Options{.n_vocab = 96, .n_blocks = 512, .device_greedy = device, .device_sample = device});
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
    GenerationEvent ev;
    while (h.next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    }
    out.ids.push_back(std::move(ids));
  }
  out.n_sample_calls = raw->n_sample_calls();
  out.n_greedy_calls = raw->n_greedy_calls();
  out.n_logit_calls = raw->n_logit_calls();
  return out;
}

GenerationRequest seeded(int32_t salt, int32_t max_tokens) {
  GenerationRequest r;
  for (int32_t i = 0; i < 3 + salt % 5; ++i) r.prompt.push_back((i * 13 + salt * 7 + 1) % 96);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 1.5f + 0.5f * static_cast<float>(salt % 4);  // FakeModel's top logits are ~1 apart
  r.sampling.seed = 1000 + static_cast<uint64_t>(salt);
  switch (salt % 4) {
    case 1:
      r.sampling.top_k = 5;
      break;
    case 2:
      r.sampling.top_p = 0.8f;
      break;
    case 3:
      r.sampling.top_k = 20, r.sampling.top_p = 0.9f, r.sampling.min_p = 0.05f;
      break;
    default:
      break;
  }
  return r;
}

TEST(DeviceSample, SeededStepsTakeIdsOnlyAndGiveTheHostTokens) {
  std::vector<GenerationRequest> rs;
  for (int32_t i = 0; i < 12; ++i) rs.push_back(seeded(i, 8 + i));
  GenerationRequest g = seeded(12, 10);
  g.sampling.temperature = 0.0f;  // a greedy row in a sampled step
  rs.push_back(g);
  const Outcome host = run_all(rs, false);
  const Outcome dev = run_all(rs, true);
  ASSERT_EQ(host.ids.size(), dev.ids.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(host.ids[i], dev.ids[i]) << "request " << i;
    EXPECT_EQ(dev.ids[i].size(), static_cast<size_t>(rs[i].max_tokens));
  }
  EXPECT_EQ(dev.n_logit_calls, 0) << "a step of unedited rows sampled on the host";
  EXPECT_GT(dev.n_sample_calls, 0);
  EXPECT_EQ(host.n_sample_calls, 0);
  // The draws were random: some request left its greedy continuation.
  std::vector<GenerationRequest> greedy = rs;
  for (GenerationRequest& r : greedy) r.sampling.temperature = 0.0f;
  EXPECT_NE(run_all(greedy, true).ids, dev.ids);
}

TEST(DeviceSample, ARequestGetsTheSameTokensAloneAndBesideRowsThatNeedLogits) {
  // Alone, every step of request 0 goes ids-only; beside a logprobs request
  // and a penalised one, the shared steps sample on the host.
  const GenerationRequest r = seeded(3, 12);
  const Outcome alone = run_all({r}, true);
  EXPECT_EQ(alone.n_logit_calls, 0);
  GenerationRequest lp = seeded(5, 6);
  lp.logprobs = 2;
  GenerationRequest pen = seeded(6, 4);
  pen.sampling.frequency_penalty = 0.5f;
  const Outcome mixed = run_all({r, lp, pen}, true);
  EXPECT_GT(mixed.n_logit_calls, 0);
  EXPECT_GT(mixed.n_sample_calls, 0) << "once the others finish, steps should go ids-only";
  EXPECT_EQ(alone.ids[0], mixed.ids[0]);
  EXPECT_EQ(mixed.ids[1], run_all({lp}, false).ids[0]);
}

// The kept set is a prefix of the ranking (p descending, id ascending):
// check the bound against a brute-force sort on random rows with ties.
TEST(DeviceSample, KeptBoundIsTheFiltersPrefixOfTheRanking) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t V = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = static_cast<float>(static_cast<int>(rng() % 40)) * 0.25f - 5.0f;  // many ties
    SamplingParams p;
    p.temperature = 0.3f + static_cast<float>(rng() % 20) * 0.1f;
    p.top_k = rng() % 3 == 0 ? 0 : static_cast<int>(rng() % (V + 3));
    p.top_p = rng() % 3 == 0 ? 1.0f : static_cast<float>(rng() % 1000) / 1000.0f;
    p.min_p = rng() % 3 == 0 ? 0.0f : static_cast<float>(rng() % 1000) / 2000.0f;
    if (p.top_k == 1) p.top_k = 2;
    Sampler s(p, V);
    const uint64_t bound = s.kept_bound(l.data());
    // Reference: sort by (p desc, id asc), apply the three cuts in order.
    float mx = l[0];
    for (float x : l) mx = std::max(mx, x);
    const float inv_t = 1.0f / p.temperature;
    std::vector<std::pair<float, int32_t>> c;
    for (int64_t i = 0; i < V; ++i)
      c.emplace_back(sampling_prob(l[static_cast<size_t>(i)], mx, inv_t), static_cast<int32_t>(i));
    std::sort(c.begin(), c.end(),
              [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    size_t n = c.size();
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) n = static_cast<size_t>(p.top_k);
    if (p.top_p < 1.0f) {
      // The total in the Sampler's order: ranked when top-k cut, else by id.
      double total = 0, cum = 0;
      if (n < c.size()) {
        for (size_t i = 0; i < n; ++i) total += c[i].first;
      } else {
        for (int64_t i = 0; i < V; ++i) total += sampling_prob(l[static_cast<size_t>(i)], mx, inv_t);
      }
      size_t keep = n;
      for (size_t i = 0; i < n; ++i) {
        cum += c[i].first;
        if (cum >= p.top_p * total) {
          keep = i + 1;
          break;
        }
      }
      n = keep;
    }
    std::vector<int32_t> kept;
    for (size_t i = 0; i < n; ++i) {
      if (p.min_p <= 0.0f || c[i].first >= p.min_p) kept.push_back(c[i].second);
    }
    if (kept.empty()) kept.push_back(c[0].second);
    std::sort(kept.begin(), kept.end());
    std::vector<int32_t> got;
    for (int64_t i = 0; i < V; ++i) {
      if (sampling_key(sampling_prob(l[static_cast<size_t>(i)], mx, inv_t), static_cast<int32_t>(i)) >= bound) {
        got.push_back(static_cast<int32_t>(i));
      }
    }
    EXPECT_EQ(got, kept) << "trial " << trial << " V " << V << " k " << p.top_k << " p " << p.top_p << " min_p "
                         << p.min_p;
  }
}

TEST(DeviceSample, DrawsFollowThePhiloxStreamOfSeedAndDrawIndex) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  Sampler s(p, 4);
  for (uint64_t k = 0; k < 200; ++k) {
    std::vector<float> l(4, 0.0f);  // uniform over 4: the token is floor(4u)
    const int32_t id = s.sample(l.data());
    EXPECT_EQ(id, static_cast<int32_t>(4.0 * sampling_uniform(99, k))) << "draw " << k;
  }
  EXPECT_EQ(s.n_draws(), 200u);
  // A device draw takes the next index, and reference_draw reproduces it.
  const DeviceSamplingParams d = s.take_device_draw();
  EXPECT_EQ(d.counter, 200u);
  EXPECT_EQ(d.seed, 99u);
  std::vector<float> l(4, 0.0f);
  EXPECT_EQ(Sampler::reference_draw(d, l.data(), 4), static_cast<int32_t>(4.0 * sampling_uniform(99, 200)));
  // Argmax draws take no index.
  SamplingParams g;
  g.temperature = 0.0f;
  Sampler sg(g, 4);
  (void)sg.take_device_draw();
  EXPECT_EQ(sg.n_draws(), 0u);
}

// Philox4x32-10 known-answer vectors (Random123's kat_vectors).
TEST(DeviceSample, PhiloxMatchesTheKnownAnswers) {
  uint32_t a[4] = {0, 0, 0, 0};
  philox4x32_10(a, 0, 0);
  EXPECT_EQ(a[0], 0x6627e8d5u);
  EXPECT_EQ(a[1], 0xe169c58du);
  EXPECT_EQ(a[2], 0xbc57ac4cu);
  EXPECT_EQ(a[3], 0x9b00dbd8u);
  uint32_t b[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  philox4x32_10(b, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b[0], 0x408f276du);
  EXPECT_EQ(b[1], 0x41c83b0eu);
  EXPECT_EQ(b[2], 0xa20bc7c6u);
  EXPECT_EQ(b[3], 0x6d5451fdu);
}

TEST(DeviceSample, ExpIsWithinTwoUlpOfTheLibraryAndExactAtZero) {
  EXPECT_EQ(sampling_exp(0.0f), 1.0f);
  EXPECT_EQ(sampling_exp(-90.0f), 0.0f);
  EXPECT_EQ(sampling_exp(std::nanf("")), 0.0f);
  double worst = 0;
  for (float x = -85.9f; x <= 0.0f; x += 0.0137f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(sampling_exp(x) - ref) / ref);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of float is 1.2e-7 .. 2.4e-7 relative
}

}  // namespace
}  // namespace rill
