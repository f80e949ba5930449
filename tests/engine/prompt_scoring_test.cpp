// Prompt scoring (GenerationRequest::prompt_logprobs, prompt_only) over a
// FakeModel, whose logits at a position depend on every token up to it: each
// prompt token's logprob is held to the log-softmax of the reference row,
// alone, batched with generation, after a prefix-cache fill, under
// preemption, and with steps that have fewer logit rows than the prompt has
// tokens (the model fails a step that returns more than max_batch_seqs rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fake_model.h"
#include "rill/engine.h"

namespace rill {
namespace {

using testing::FakeModel;

std::unique_ptr<Engine> make_engine(FakeModel::Options mo) {
  EngineOptions eo;
  eo.check_integrity = true;
  eo.max_batch_tokens = mo.max_batch_tokens;
  auto e = Engine::create(std::make_unique<FakeModel>(mo), nullptr, eo);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

std::vector<int32_t> prompt_of(int32_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((i * 11 + salt * 5 + i * i) % 64);
  return p;
}

std::vector<int32_t> greedy_reference(std::vector<int32_t> prompt, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = FakeModel::next_token(prompt, 64);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

// The logprob of prompt[p + 1] after prompt[0..p], and the n_top best ids.
struct Expected {
  double logprob = 0;
  std::vector<int32_t> top;
};
Expected expected_at(const std::vector<int32_t>& prompt, size_t p, int n_top) {
  std::vector<float> l(64);
  FakeModel::logits_for(std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(p + 1)), 64, l.data());
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float x : l) sum += std::exp(double(x) - mx);
  Expected e;
  e.logprob = double(l[static_cast<size_t>(prompt[p + 1])]) - mx - std::log(sum);
  std::vector<int32_t> ids(64);
  for (int32_t i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  e.top.assign(ids.begin(), ids.begin() + n_top);
  return e;
}

struct Scored {
  std::vector<SampledToken> prompt;
  std::vector<int32_t> ids;
  int events_with_prompt = 0;
  GenerationEvent last;
};

Scored drain(RequestHandle& h) {
  Scored s;
  GenerationEvent ev;
  while (h.next(ev)) {
    if (!ev.prompt_logprobs.empty()) {
      ++s.events_with_prompt;
      EXPECT_TRUE(ev.finished || !ev.token_ids.empty()) << "prompt logprobs come with the first token";
    }
    s.prompt.insert(s.prompt.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
    s.ids.insert(s.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    if (ev.finished) s.last = ev;
  }
  return s;
}

void expect_scores(const std::vector<int32_t>& prompt, const Scored& s, int n_top) {
  ASSERT_EQ(s.prompt.size(), prompt.size() - 1);
  EXPECT_EQ(s.events_with_prompt, 1);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const Expected want = expected_at(prompt, p, n_top);
    const SampledToken& got = s.prompt[p];
    EXPECT_EQ(got.id, prompt[p + 1]) << "position " << p;
    EXPECT_NEAR(got.logprob, want.logprob, 1e-5) << "position " << p;
    ASSERT_EQ(got.n_top, n_top);
    for (int k = 0; k < n_top; ++k) EXPECT_EQ(got.top[size_t(k)].id, want.top[size_t(k)]) << "position " << p;
  }
}

GenerationRequest scoring(std::vector<int32_t> prompt, int n_top, bool prompt_only, int32_t max_tokens = 4) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.prompt_logprobs = n_top;
  r.prompt_only = prompt_only;
  r.max_tokens = prompt_only ? 0 : max_tokens;
  return r;
}

TEST(PromptScoring, PromptOnlyScoresEveryTokenAfterTheFirstAndSamplesNothing) {
  // 16 rows per step for a 45-token prompt: the prompt is scored over steps.
  auto e = make_engine({.n_blocks = 128, .max_batch_tokens = 64, .max_batch_seqs = 16});
  const auto p = prompt_of(45, 1);
  auto h = e->submit(scoring(p, 3, true));
  ASSERT_TRUE(h.ok()) << h.error().message;
  const Scored s = drain(*h);
  expect_scores(p, s, 3);
  EXPECT_TRUE(s.ids.empty());
  EXPECT_EQ(s.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(s.last.usage.prompt_tokens, 45);
  EXPECT_EQ(s.last.usage.completion_tokens, 0);
  EXPECT_EQ(e->stats().integrity_errors, 0);
}

TEST(PromptScoring, ScoringThenGeneratingGivesTheGreedyTokens) {
  auto e = make_engine({.n_blocks = 128, .max_batch_tokens = 64, .max_batch_seqs = 16});
  const auto p = prompt_of(30, 2);
  auto h = e->submit(scoring(p, 0, false, 5));
  ASSERT_TRUE(h.ok()) << h.error().message;
  const Scored s = drain(*h);
  expect_scores(p, s, 0);
  EXPECT_EQ(s.ids, greedy_reference(p, 5));
}

TEST(PromptScoring, ACachedPrefixIsComputedAgainForItsLogits) {
  auto e = make_engine({.n_blocks = 128, .max_batch_tokens = 64, .max_batch_seqs = 16});
  const auto p = prompt_of(41, 3);
  GenerationRequest plain = scoring(p, -1, false, 2);
  auto a = e->submit(std::move(plain));
  ASSERT_TRUE(a.ok());
  drain(*a);
  auto b = e->submit(scoring(p, 2, true));
  ASSERT_TRUE(b.ok());
  const Scored s = drain(*b);
  EXPECT_EQ(s.last.usage.cached_tokens, 0);
  expect_scores(p, s, 2);
  // Its blocks still feed the cache: a plain request after it hits.
  auto c = e->submit(scoring(p, -1, false, 2));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(drain(*c).last.usage.cached_tokens, 40);
}

TEST(PromptScoring, BatchedWithGenerationAndPreemptionEveryScoreHolds) {
  // 48 blocks of 4 tokens for 8 requests of up to 60 tokens each: requests
  // are preempted and resume; scored rows are never delivered twice.
  auto e = make_engine({.n_blocks = 48, .max_batch_tokens = 32, .max_batch_seqs = 8});
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(20 + 5 * i, 10 + i));
    GenerationRequest r =
        i % 2 == 0 ? scoring(prompts.back(), 1, i % 4 == 0, 16) : scoring(prompts.back(), -1, false, 16);
    auto h = e->submit(std::move(r));
    ASSERT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
  }
  for (int i = 0; i < 8; ++i) {
    const Scored s = drain(hs[size_t(i)]);
    ASSERT_NE(s.last.finish_reason, FinishReason::kError) << s.last.error;
    if (i % 2 == 0) expect_scores(prompts[size_t(i)], s, 1);
    if (i % 4 != 0) {
      EXPECT_EQ(s.ids, greedy_reference(prompts[size_t(i)], 16)) << "request " << i;
    }
  }
  const EngineStats st = e->stats();
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
  std::printf("preemptions: %lld\n", static_cast<long long>(st.preemptions));
}

TEST(PromptScoring, ValidationNamesTheField) {
  auto e = make_engine({});
  GenerationRequest r = scoring(prompt_of(4, 0), kMaxTopLogprobs + 1, true);
  auto h = e->submit(std::move(r));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("prompt_logprobs"), std::string::npos);
  GenerationRequest zero = scoring(prompt_of(4, 0), -1, false, 0);
  auto z = e->submit(std::move(zero));
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message.find("max_tokens"), std::string::npos);
}

}  // namespace
}  // namespace rill
