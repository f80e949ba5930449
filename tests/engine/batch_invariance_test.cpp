// Batch invariance on the real default model (SmolLM2-135M-Instruct Q4_1):
// 16 different prompts run concurrently through the engine produce exactly
// the tokens each produces alone, greedy and with a fixed seed. The step
// budget is small so that, batched, prompts are split into chunks at other
// places than alone. This holds by construction (every row's reductions run
// in an order independent of the batch), so it holds on every CPU path.
#include <gtest/gtest.h>

#include <filesystem>

#include "golden_util.h"
#include "rill/engine.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

const char* const kPrompts[16] = {
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Once upon a time, in a small village by the mountains, there lived",
    "def fibonacci(n):",
    "Translate to German: good morning",
    "What is the boiling point of water at sea level? Answer briefly.",
    "A recipe for pancakes needs",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "Explain why the sky is blue to a five year old child, in two sentences.",
    "SELECT name FROM users WHERE",
    "My favourite book is",
    "In 1969, astronauts",
    "Q: How many legs does a spider have?\nA:",
    "Dear hiring manager, I am writing to apply for",
};

class DefaultModelBatchInvariance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.max_batch_tokens = 48;  // chunks: batched prompts split at other places than alone
    o.max_running = 16;
    o.kv_cache_mb = 64;
    o.check_integrity = true;
    auto e = Engine::load(kModel, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value();
    for (const char* p : kPrompts) prompts_.push_back(engine_->tokenizer()->encode(p, true, false));
  }
  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(DefaultModelBatchInvariance, GreedyTokensAreTheSameAloneAndBatched) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto alone = test::generate_all(*engine_, prompts_, greedy, false, 1, 20);
  const auto batched = test::generate_all(*engine_, prompts_, greedy, true, 2, 20);
  const auto cached = test::generate_all(*engine_, prompts_, greedy, true, 1, 20);  // prefix-cache hits
  for (size_t i = 0; i < prompts_.size(); ++i) {
    ASSERT_EQ(alone[i].size(), 20u);
    EXPECT_EQ(batched[i], alone[i]) << "prompt " << i << ": " << kPrompts[i];
    EXPECT_EQ(cached[i], alone[i]) << "prompt " << i << " from the prefix cache";
  }
  EXPECT_GT(engine_->stats().cached_tokens, 0);
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
}

TEST_F(DefaultModelBatchInvariance, SeededSamplingIsTheSameAloneAndBatched) {
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_p = 0.95f;
  s.seed = 7;
  const auto alone = test::generate_all(*engine_, prompts_, s, false, 1, 20);
  const auto batched = test::generate_all(*engine_, prompts_, s, true, 2, 20);
  for (size_t i = 0; i < prompts_.size(); ++i) EXPECT_EQ(batched[i], alone[i]) << "prompt " << i;
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
}

// Real traffic's shape (issue 15): six long generations, three greedy and
// three seeded, submitted together into a KV pool too small for them, so
// requests are preempted and recomputed as prefills of prompt + output so
// far; and prompts of 16k + 1 tokens served again from the prefix cache, so
// their last prompt token is computed in a step of its own. Every output
// must be token-identical to the request's alone run. On AVX-512 the f16
// attention has a decode and a prefill arithmetic (llama.cpp's); before a
// token's form followed its position (BatchSeq::decode_from) rather than its
// step's size, a recomputed output token got prefill bits and a re-forwarded
// prompt token decode bits, and the tokens after them changed.
struct TrafficRun {
  std::vector<std::vector<int32_t>> ids;
  std::vector<int32_t> preemptions;
};

// Prompts `which` of `prompts`, prompt i greedy when i is even, else seeded.
TrafficRun run_traffic(Engine& e, const std::vector<std::vector<int32_t>>& prompts, const std::vector<size_t>& which,
                       bool concurrent, uint64_t ns, int max_tokens) {
  const size_t n = which.size();
  TrafficRun out{std::vector<std::vector<int32_t>>(n), std::vector<int32_t>(n, 0)};
  auto request = [&](size_t k) {
    const size_t i = which[k];
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.cache_namespace = ns;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 100 + i;
    } else {
      r.sampling.temperature = 0.0f;
    }
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return std::move(h).value();
  };
  auto drain = [&](RequestHandle& h, size_t k) {
    GenerationEvent ev;
    while (h.next(ev)) {
      out.ids[k].insert(out.ids[k].end(), ev.token_ids.begin(), ev.token_ids.end());
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
      if (ev.finished) out.preemptions[k] = ev.usage.preemptions;
    }
  };
  std::vector<RequestHandle> hs;
  for (size_t k = 0; k < n; ++k) {
    hs.push_back(request(k));
    if (!concurrent) drain(hs.back(), k);
  }
  if (concurrent) {
    for (size_t k = 0; k < n; ++k) drain(hs[k], k);
  }
  return out;
}

// Latency-aware planning sizes prefill chunks by measured step time, so the
// chunking changes from run to run: a 1 ms target holds every prefill share
// at its floor while streams decode, and each prompt's tokens are still
// those it produces alone.
TEST(DefaultModelStepPlanning, ATightStepTargetChunksPromptsWithoutChangingTokens) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 512;
  o.max_batch_tokens = 48;
  o.max_running = 16;
  o.kv_cache_mb = 64;
  o.max_step_ms = 1;
  auto loaded = Engine::load(kModel, o);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Engine& e = **loaded;
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : kPrompts) prompts.push_back(e.tokenizer()->encode(p, true, false));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto alone = test::generate_all(e, prompts, greedy, false, 1, 12);
  const int64_t capped_before = e.stats().steps_prefill_capped;
  const auto batched = test::generate_all(e, prompts, greedy, true, 2, 12);
  EXPECT_GT(e.stats().steps_prefill_capped, capped_before) << "the target was meant to cut prefill shares";
  EXPECT_GT(e.stats().step_ms_per_token, 0.0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(alone[i].size(), 12u);
    EXPECT_EQ(batched[i], alone[i]) << "prompt " << i << ": " << kPrompts[i];
  }
}

size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(DefaultModelTraffic, LongConcurrentPreemptedAndCachedRunsMatchAlone) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
  // Past where the old code diverged: from token 20 when preempted, from
  // token 2 for a re-forwarded prompt token.
  constexpr int kTokens = 96;
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 512;
  o.max_running = 8;
  // 6 MiB: 17 blocks of 16 tokens (23 KiB of KV per token), room for any
  // one of the requests alone but not for six together.
  o.kv_cache_mb = 6;
  auto loaded = Engine::load(kModel, o);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Engine& e = **loaded;
  std::vector<std::vector<int32_t>> prompts;
  for (int i : {0, 3, 4, 6, 10, 15}) prompts.push_back(e.tokenizer()->encode(kPrompts[i], true, false));
  // Prompts 1 and 2: BOS + 16 tokens (a full block of the prefix cache and
  // one token after it), cut from a longer text.
  std::string text;
  for (const char* p : kPrompts) text += std::string(p) + " ";
  const std::vector<int32_t> long_ids = e.tokenizer()->encode(text, true, false);
  ASSERT_GE(long_ids.size(), 32u);
  for (size_t i : {1u, 2u}) {
    const size_t off = i == 1 ? 8 : 16;
    prompts[i] = {long_ids[0]};
    prompts[i].insert(prompts[i].end(), long_ids.begin() + static_cast<ptrdiff_t>(off),
                      long_ids.begin() + static_cast<ptrdiff_t>(off + 16));
  }
  const std::vector<size_t> all = {0, 1, 2, 3, 4, 5};

  const TrafficRun alone = run_traffic(e, prompts, all, /*concurrent=*/false, 1, kTokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(alone.ids[i].size(), static_cast<size_t>(kTokens));
    ASSERT_EQ(alone.preemptions[i], 0) << "prompt " << i << " must fit the pool alone";
  }
  const int64_t preempted_before = e.stats().preemptions;
  const TrafficRun batched = run_traffic(e, prompts, all, /*concurrent=*/true, 2, kTokens);
  EXPECT_GT(e.stats().preemptions, preempted_before) << "the pool was meant to force preemption";
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched.ids[i], alone.ids[i])
        << "prompt " << i << " (" << (i % 2 ? "seeded" : "greedy") << ", " << batched.preemptions[i]
        << " preemptions): first difference at token " << first_difference(batched.ids[i], alone.ids[i]);
  }
  for (size_t i : {1u, 2u}) {
    const int64_t cached_before = e.stats().cached_tokens;
    run_traffic(e, prompts, {i}, false, 3, kTokens);  // fills the cache (namespace 3)
    const TrafficRun again = run_traffic(e, prompts, {i}, false, 3, kTokens);
    EXPECT_EQ(e.stats().cached_tokens - cached_before, 16) << "prompt " << i << ": one block from the prefix cache";
    EXPECT_EQ(again.ids[0], alone.ids[i]) << "prompt " << i << " from the prefix cache: first difference at token "
                                          << first_difference(again.ids[0], alone.ids[i]);
  }
}

}  // namespace
}  // namespace rill
