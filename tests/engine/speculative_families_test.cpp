// Speculative decoding on the Hugging Face goldens (tiny random-weight
// checkpoints of each family, ../shared/goldens/hf): with the n-gram
// speculator on, greedy output still equals transformers' greedy
// continuation, and prompts that repeat themselves (so drafts are proposed
// and mostly rejected: random weights do not copy) give the tokens they give
// without speculation, alone and batched. Families: Llama, Mistral (sliding
// window), Gemma 2 / 3 (sliding and full groups), the MoEs Mixtral and
// Qwen3-MoE. The hybrid Qwen3-Next runs without speculation (its recurrent
// state is not rolled back yet): the engine says so and its output is
// unchanged.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>

#include "golden_util.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::unique_ptr<Engine> load(const std::string& dir, const std::string& spec) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 6;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  auto e = Engine::load(dir, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

class SpeculativeFamily : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    golden_ = test::read_hf_golden(dir_);
  }
  std::string dir_;
  test::HfGolden golden_;
};

TEST_P(SpeculativeFamily, GreedyOutputIsTheSameWithAndWithout) {
  auto on = load(dir_, "ngram");
  auto off = load(dir_, "off");
  ASSERT_TRUE(on && off);
  test::expect_greedy_prefixes(*on, golden_, 3, std::string(GetParam()) + " with speculation");
  std::vector<std::vector<int32_t>> prompts;
  for (auto p : test::prompts_from(golden_.prompt_ids)) {
    if (p.size() > 12) p.resize(12);
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin(), p.end());  // the tail occurred before: drafts are proposed
    prompts.push_back(twice);
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = test::generate_all(*off, prompts, greedy, false, 1, 16);
  const auto alone = test::generate_all(*on, prompts, greedy, false, 1, 16);
  const auto batched = test::generate_all(*on, prompts, greedy, true, 2, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(want[i].size(), 16u);
    EXPECT_EQ(alone[i], want[i]) << GetParam() << ", prompt " << i;
    EXPECT_EQ(batched[i], want[i]) << GetParam() << ", prompt " << i << " batched";
  }
  const EngineStats st = on->stats();
  EXPECT_EQ(st.speculator, "ngram");
  EXPECT_GT(st.spec_draft_tokens, 0) << GetParam();
  std::printf("%s: %lld draft tokens verified, %lld accepted\n", GetParam(),
              static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

INSTANTIATE_TEST_SUITE_P(Families, SpeculativeFamily,
                         ::testing::Values("llama", "mistral-swa", "gemma2", "gemma3", "mixtral", "qwen3-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(SpeculativeHybrid, RecurrentModelsRunWithoutSpeculation) {
  const std::string dir = test::hf_golden_dir("qwen3-next");
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);
  auto on = load(dir, "ngram");
  ASSERT_TRUE(on);
  EXPECT_EQ(on->stats().speculator, "") << "speculation must be refused for a recurrent model";
  test::expect_greedy_prefixes(*on, g, 2, "qwen3-next with --spec ngram");
  EXPECT_EQ(on->stats().spec_draft_tokens, 0);
}

}  // namespace
}  // namespace rill
