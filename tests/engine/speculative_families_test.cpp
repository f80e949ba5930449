// Speculative decoding on the Hugging Face goldens (tiny random-weight
// checkpoints of each family, ../shared/goldens/hf): with the n-gram
// speculator on, greedy output still equals transformers' greedy
// continuation, and prompts that repeat themselves (so drafts are proposed
// and mostly rejected: random weights do not copy) give the tokens they give
// without speculation, alone and batched. Families: Llama, Mistral (sliding
// window), Gemma 2 / 3 (sliding and full groups), the MoEs Mixtral and
// Qwen3-MoE; and the hybrid Qwen3-Next, whose recurrent state rolls back
// with the rejected drafts (alone, batched with opted-out rows, and the
// prefix cache after rejections equal to a cold run's).
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

// The hybrid Qwen3-Next: a rejected draft rolls the gated-DeltaNet state
// back to the verify state of the last accepted position (kv/state_pool.h).
// Small KV blocks put prefix checkpoints (every 8th block boundary) inside
// the drafted spans.
std::unique_ptr<Engine> load_hybrid(const std::string& dir, const std::string& spec) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 6;
  o.kv_cache_mb = 8;
  o.kv_block_size = 4;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  auto e = Engine::load(dir, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

// Prompts whose tail occurred before, so the n-gram speculator drafts.
std::vector<std::vector<int32_t>> repeating_prompts(const test::HfGolden& g) {
  std::vector<std::vector<int32_t>> prompts;
  for (auto p : test::prompts_from(g.prompt_ids)) {
    if (p.size() > 12) p.resize(12);
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin(), p.end());
    prompts.push_back(twice);
  }
  return prompts;
}

struct RowsRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<Usage> usage;
};

// Greedy runs of `prompts`, one after another or all submitted at once;
// rows with speculate[i] false opt out.
RowsRun run_rows(Engine& e, const std::vector<std::vector<int32_t>>& prompts, const std::vector<bool>& speculate,
                 bool concurrent, uint64_t ns, int max_tokens) {
  RowsRun out{std::vector<std::vector<int32_t>>(prompts.size()), std::vector<Usage>(prompts.size())};
  std::vector<RequestHandle> hs;
  auto drain = [&](RequestHandle& h, size_t i) {
    GenerationEvent ev;
    while (h.next(ev)) {
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
      out.tokens[i].insert(out.tokens[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) out.usage[i] = ev.usage;
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    r.cache_namespace = ns;
    r.speculative = speculate[i];
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
    if (!concurrent) drain(hs.back(), i);
  }
  if (concurrent) {
    for (size_t i = 0; i < prompts.size(); ++i) drain(hs[i], i);
  }
  return out;
}

class SpeculativeHybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir("qwen3-next");
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    golden_ = test::read_hf_golden(dir_);
  }
  std::string dir_;
  test::HfGolden golden_;
};

TEST_F(SpeculativeHybrid, GreedyOutputIsTheSameWithRejectedDrafts) {
  auto on = load_hybrid(dir_, "ngram");
  auto off = load_hybrid(dir_, "off");
  ASSERT_TRUE(on && off);
  ASSERT_EQ(on->stats().speculator, "ngram");
  test::expect_greedy_prefixes(*on, golden_, 3, "qwen3-next with speculation");
  // Prompts holding the model's own continuation of their start, so some
  // drafts hold and rollbacks land on every verify state, not only the first.
  auto prompts = repeating_prompts(golden_);
  const std::vector<bool> all(prompts.size(), true);
  const RowsRun own = run_rows(*off, prompts, all, false, 1, 24);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> start(prompts[i].begin(), prompts[i].begin() + prompts[i].size() / 2);
    prompts[i] = start;
    prompts[i].insert(prompts[i].end(), own.tokens[i].begin(), own.tokens[i].end());
    prompts[i].insert(prompts[i].end(), start.begin(), start.end());
  }
  const RowsRun want = run_rows(*off, prompts, all, false, 1, 40);
  const RowsRun alone = run_rows(*on, prompts, all, false, 1, 40);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(want.tokens[i].size(), 40u);
    EXPECT_EQ(alone.tokens[i], want.tokens[i]) << "prompt " << i;
  }
  const EngineStats st = on->stats();
  std::printf("qwen3-next: %lld draft tokens verified, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens - st.spec_accepted_tokens, 0) << "no draft was rejected: no rollback was tested";
  EXPECT_GT(st.spec_accepted_tokens, 0) << "no draft held: only rollbacks to the owed token were tested";
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

// Speculating and opted-out rows in one batch: every row's tokens are its
// tokens alone without speculation.
TEST_F(SpeculativeHybrid, SpeculatingAndOptedOutRowsShareABatch) {
  auto on = load_hybrid(dir_, "ngram");
  auto off = load_hybrid(dir_, "off");
  ASSERT_TRUE(on && off);
  auto prompts = repeating_prompts(golden_);
  const auto base = prompts;
  for (const auto& p : base) prompts.push_back(p);  // each prompt once speculating, once opted out
  std::vector<bool> speculate(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) speculate[i] = i < base.size() ? i % 2 == 0 : i % 2 == 1;
  const RowsRun want = run_rows(*off, prompts, std::vector<bool>(prompts.size(), false), false, 1, 24);
  const RowsRun batched = run_rows(*on, prompts, speculate, true, 1, 24);
  int64_t drafted = 0, rejected = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched.tokens[i], want.tokens[i]) << "prompt " << i << (speculate[i] ? " speculating" : " opted out");
    if (!speculate[i]) {
      EXPECT_EQ(batched.usage[i].draft_tokens, 0) << "prompt " << i;
    }
    drafted += batched.usage[i].draft_tokens;
    rejected += batched.usage[i].draft_tokens - batched.usage[i].accepted_draft_tokens;
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(on->stats().integrity_errors, 0) << on->stats().last_integrity_error;
}

// After speculating requests with rejected drafts finish, the prefix cache
// (blocks and recurrent checkpoints) is what a run without speculation
// leaves: continuing each conversation matches the same prefix and gives
// the same tokens.
TEST_F(SpeculativeHybrid, PrefixCacheAfterRejectionsEqualsTheColdState) {
  // The cold run: the same engine options (so the same checkpoint slots),
  // every row opted out.
  auto on = load_hybrid(dir_, "ngram");
  auto off = load_hybrid(dir_, "ngram");
  ASSERT_TRUE(on && off);
  // Each conversation is continued right after it ran, while its
  // checkpoints are among the few the pool keeps (one per running request).
  for (const auto& prompt : repeating_prompts(golden_)) {
    const RowsRun a = run_rows(*off, {prompt}, {false}, false, 1, 40);
    const RowsRun b = run_rows(*on, {prompt}, {true}, false, 1, 40);
    ASSERT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(on->stats().kv_blocks_cached, off->stats().kv_blocks_cached);
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), a.tokens[0].begin(), a.tokens[0].end());
    const RowsRun cold = run_rows(*off, {next}, {false}, false, 1, 8);
    const RowsRun warm = run_rows(*on, {next}, {false}, false, 1, 8);
    EXPECT_EQ(warm.usage[0].cached_tokens, cold.usage[0].cached_tokens);
    EXPECT_GT(warm.usage[0].cached_tokens, 0);
    EXPECT_EQ(warm.tokens[0], cold.tokens[0]);
  }
  ASSERT_GT(on->stats().spec_draft_tokens - on->stats().spec_accepted_tokens, 0) << "no draft was rejected";
  EXPECT_EQ(on->stats().integrity_errors, 0) << on->stats().last_integrity_error;
}

}  // namespace
}  // namespace rill
