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

}  // namespace
}  // namespace rill
