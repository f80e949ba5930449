// The hybrid gated-DeltaNet models (../shared/goldens/hf qwen3_5 and
// qwen3-next) served by the engine: greedy ids equal Hugging Face's; prompts
// of different lengths batched together, split into chunks at other places
// than alone, give exactly their alone tokens (greedy and seeded); and a
// prefix-cache hit resumes the recurrent state from a checkpoint, reports
// cached_tokens and gives the cold run's tokens and log-probabilities.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

struct Output {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;  // the chosen token's and the top-5's, per token
  Usage usage;
};

Output collect(RequestHandle& h) {
  Output out;
  GenerationEvent ev;
  while (h.next(ev)) {
    EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
    out.ids.insert(out.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    for (const SampledToken& t : ev.logprobs) {
      out.logprobs.push_back(t.logprob);
      for (int i = 0; i < t.n_top; ++i) out.logprobs.push_back(t.top[static_cast<size_t>(i)].logprob);
    }
    if (ev.finished) out.usage = ev.usage;
  }
  return out;
}

GenerationRequest request(std::vector<int32_t> prompt, uint64_t ns, int32_t max_tokens = 12,
                          std::optional<uint64_t> seed = std::nullopt) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.cache_namespace = ns;
  r.logprobs = 5;
  if (seed) {
    r.sampling.temperature = 0.9f;
    r.sampling.seed = seed;
  } else {
    r.sampling.temperature = 0.0f;
  }
  return r;
}

class HybridEngine : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = kGoldens + GetParam();
    if (!std::filesystem::exists(dir_ + "/golden.json")) GTEST_SKIP() << dir_ << " not found";
    std::ifstream in(dir_ + "/golden.json");
    const auto j = nlohmann::json::parse(in);
    golden_prompt_ = j["prompt_ids"].get<std::vector<int32_t>>();
    golden_greedy_ = j["greedy_ids"].get<std::vector<int32_t>>();
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 160;
    o.max_batch_tokens = 13;  // chunked prefill; batched prompts split at other places than alone
    o.max_running = 8;
    o.check_integrity = true;
    auto e = Engine::load(dir_, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value();
    std::mt19937 rng(5);
    for (int len : {3, 9, 17, 24, 33, 40, 47, 58}) {
      std::vector<int32_t> p;
      for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(3 + rng() % 500));
      prompts_.push_back(std::move(p));
    }
  }
  void TearDown() override {
    if (engine_) {
      EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
    }
  }
  Output run(GenerationRequest r) {
    auto h = engine_->submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return collect(*h);
  }
  std::vector<Output> run_all(uint64_t ns, std::optional<uint64_t> seed, bool concurrent) {
    std::vector<Output> out;
    if (!concurrent) {
      for (size_t i = 0; i < prompts_.size(); ++i) out.push_back(run(request(prompts_[i], ns + i, 12, seed)));
      return out;
    }
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      auto h = engine_->submit(request(prompts_[i], ns + i, 12, seed));
      EXPECT_TRUE(h.ok()) << h.error().message;
      hs.push_back(std::move(h).value());
    }
    for (auto& h : hs) out.push_back(collect(h));
    return out;
  }

  std::string dir_;
  std::vector<int32_t> golden_prompt_, golden_greedy_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(HybridEngine, GreedyIdsMatchTransformers) {
  const Output out = run(request(golden_prompt_, 1, static_cast<int32_t>(golden_greedy_.size())));
  EXPECT_EQ(out.ids, golden_greedy_);
}

TEST_P(HybridEngine, BatchedPromptsGiveTheirAloneTokens) {
  uint64_t ns = 100;
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>{}, std::optional<uint64_t>{11}}) {
    const auto alone = run_all(ns, seed, false);
    const auto batched = run_all(ns + 100, seed, true);  // fresh namespaces: no cache hits
    ns += 200;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      ASSERT_EQ(alone[i].ids.size(), 12u);
      EXPECT_EQ(batched[i].ids, alone[i].ids) << "prompt " << i << (seed ? " seeded" : " greedy");
      EXPECT_EQ(batched[i].logprobs, alone[i].logprobs) << "prompt " << i;
      EXPECT_EQ(batched[i].usage.cached_tokens, 0);
    }
  }
  EXPECT_GT(engine_->stats().batch_size_sum, engine_->stats().steps);  // steps did batch several prompts
}

TEST_P(HybridEngine, PrefixHitResumesFromACheckpointAndMatchesTheColdRun) {
  // A first turn, then a second that extends it (prompt + reply + more).
  const std::vector<int32_t>& p = prompts_[6];  // 47 tokens: last full prompt block ends at 32
  const Output first = run(request(p, 7));
  std::vector<int32_t> second = p;
  second.insert(second.end(), first.ids.begin(), first.ids.end());
  for (int32_t id : {5, 6, 7, 8}) second.push_back(id);
  const Output hit = run(request(second, 7));
  const Output cold = run(request(second, 8));
  EXPECT_EQ(hit.usage.cached_tokens, 32);
  EXPECT_EQ(cold.usage.cached_tokens, 0);
  EXPECT_EQ(hit.ids, cold.ids);
  EXPECT_EQ(hit.logprobs, cold.logprobs);  // bit-identical: same logits
  // The same prompt again resumes later: its own prompt's last full block (48).
  const Output again = run(request(second, 7));
  EXPECT_EQ(again.usage.cached_tokens, 48);
  EXPECT_EQ(again.ids, cold.ids);
  EXPECT_EQ(again.logprobs, cold.logprobs);
  // Batched prompts sharing a prefix, all hitting the cache at once.
  std::vector<RequestHandle> hs;
  for (int32_t tail = 0; tail < 4; ++tail) {
    auto q = second;
    q.push_back(100 + tail);
    auto h = engine_->submit(request(q, 7));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(h).value());
  }
  for (int32_t tail = 0; tail < 4; ++tail) {
    const Output got = collect(hs[static_cast<size_t>(tail)]);
    auto q = second;
    q.push_back(100 + tail);
    const Output want = run(request(q, 1000 + static_cast<uint64_t>(tail)));
    EXPECT_GE(got.usage.cached_tokens, 48) << tail;
    EXPECT_EQ(got.ids, want.ids) << tail;
    EXPECT_EQ(got.logprobs, want.logprobs) << tail;
  }
}

// SequenceRunner (rill run / score): chunked prefill of 7-token steps and
// decode on its slot's recurrent state; a follow-up continues the state, a
// prompt that leaves the cached sequence starts it again.
TEST_P(HybridEngine, SequenceRunnerContinuesOrRestartsTheState) {
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok());
  ModelOptions mo;
  mo.n_threads = 2;
  mo.n_ctx = 128;
  mo.max_batch_tokens = 7;
  mo.n_kv_slots = 2;  // slot 1: the fresh runner
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model), fresh(**model, 1);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(golden_greedy_.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto ignore = [](int32_t) { return true; };
  auto first = runner.generate(golden_prompt_, go, ignore);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->ids, golden_greedy_);
  // Continues everything cached (prompt + all but the last output token).
  auto follow = golden_prompt_;
  follow.insert(follow.end(), golden_greedy_.begin(), golden_greedy_.end());
  follow.push_back(42);
  go.max_tokens = 6;
  auto cont = runner.generate(follow, go, ignore);
  ASSERT_TRUE(cont.ok());
  EXPECT_EQ(cont->timings.n_cached, static_cast<int>(golden_prompt_.size() + golden_greedy_.size() - 1));
  auto want = fresh.generate(follow, go, ignore);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(cont->ids, want->ids);
  // Leaves the cached sequence: the state starts again from position 0.
  std::vector<int32_t> diverge(golden_prompt_.begin(), golden_prompt_.begin() + 10);
  diverge.push_back(7);
  auto restart = runner.generate(diverge, go, ignore);
  ASSERT_TRUE(restart.ok());
  EXPECT_EQ(restart->timings.n_cached, 0);
  fresh.reset();
  want = fresh.generate(diverge, go, ignore);
  EXPECT_EQ(restart->ids, want->ids);
}

INSTANTIATE_TEST_SUITE_P(Hybrid, HybridEngine, ::testing::Values("qwen3_5", "qwen3-next"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace rill
