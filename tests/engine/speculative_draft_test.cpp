// The draft-model speculator (`--spec draft=PATH`, engine/draft_speculator.h)
// on the Hugging Face goldens (tiny random-weight checkpoints sharing a
// 512-token vocabulary) and the default model: the target's greedy and
// seeded output is the same with and without it; a golden drafting for
// itself has its drafts accepted, a different model of the same vocabulary
// has them rejected (so the draft's KV rolls back), alone and batched with
// opted-out rows; a vocabulary or tokenizer mismatch is refused at load
// naming both files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "golden_util.h"
#include "rill/engine.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

EngineOptions options(const std::string& spec) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 6;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  return o;
}

std::unique_ptr<Engine> load(const std::string& dir, const std::string& spec) {
  auto e = Engine::load(dir, options(spec));
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

// Greedy runs with rows i where opt_out[i] opting out ("speculative": false),
// all submitted at once.
std::vector<std::vector<int32_t>> run_batched(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<bool>& opt_out, int max_tokens) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<RequestHandle> hs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    r.speculative = !opt_out[i];
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationEvent ev;
    while (hs[i].next(ev)) {
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
    }
  }
  return out;
}

class DraftSpeculator : public ::testing::Test {
 protected:
  void SetUp() override {
    llama_ = test::hf_golden_dir("llama");
    tied_ = test::hf_golden_dir("llama3-tied");
    if (!test::has_hf_golden(llama_) || !test::has_hf_golden(tied_)) GTEST_SKIP() << "llama goldens not found";
  }
  std::string llama_, tied_;
};

// The golden drafting for itself: the draft's greedy tokens are the
// target's, so (nearly) every draft holds, and the output is transformers'.
TEST_F(DraftSpeculator, AGoldenDraftingForItselfIsAccepted) {
  const test::HfGolden g = test::read_hf_golden(llama_);
  auto on = load(llama_, "draft=" + llama_);
  auto off = load(llama_, "off");
  ASSERT_TRUE(on && off);
  EXPECT_EQ(on->stats().speculator, "draft");
  test::expect_greedy_prefixes(*on, g, 3, "llama drafting for itself");
  const auto prompts = test::prompts_from(g.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = test::generate_all(*off, prompts, greedy, false, 1, 32);
  const auto got = test::generate_all(*on, prompts, greedy, false, 1, 32);
  EXPECT_EQ(got, want);
  const EngineStats st = on->stats();
  std::printf("llama for itself: %lld drafted, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens, 50);
  // On the CPU a verify row equals its decode row bit for bit, and the
  // draft computes its tokens in the same forms (BatchSeq::decode_from).
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

// Another model of the same vocabulary: its drafts are mostly rejected, the
// draft's KV rolls back to the accepted tokens each round, and the output
// is still the target's, greedy and seeded, alone and batched with rows
// that opt out.
TEST_F(DraftSpeculator, ADifferentModelsDraftsAreRejectedAndOutputIsTheSame) {
  const test::HfGolden g = test::read_hf_golden(tied_);
  auto on = load(tied_, "draft=" + llama_);
  auto off = load(tied_, "off");
  ASSERT_TRUE(on && off);
  test::expect_greedy_prefixes(*on, g, 3, "llama3-tied with a llama draft");
  const auto prompts = test::prompts_from(g.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.seed = 11;
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto want = test::generate_all(*off, prompts, s, false, 1, 32);
    EXPECT_EQ(test::generate_all(*on, prompts, s, false, 1, 32), want) << "temperature " << s.temperature;
    EXPECT_EQ(test::generate_all(*on, prompts, s, true, 2, 32), want) << "temperature " << s.temperature << " batched";
  }
  std::vector<bool> opt_out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) opt_out[i] = i % 2 == 1;
  const auto want = test::generate_all(*off, prompts, greedy, false, 3, 32);
  EXPECT_EQ(run_batched(*on, prompts, opt_out, 32), want);
  const EngineStats st = on->stats();
  std::printf("llama for llama3-tied: %lld drafted, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens - st.spec_accepted_tokens, 20) << "too few rejections to test the rollback";
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

TEST_F(DraftSpeculator, AVocabularyMismatchIsRefusedNamingBothFiles) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found";
  auto e = Engine::load(llama_, options("draft=" + kModel));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find(kModel), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find(llama_), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("vocabulary"), std::string::npos) << e.error().message;
  auto missing = Engine::load(llama_, options("draft=" + llama_ + "/nothing-here"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nothing-here"), std::string::npos) << missing.error().message;
}

// The default model drafting for itself (meaningless for speed, exact for
// the mechanism): real weights, a real tokenizer on both sides.
TEST(DraftSpeculatorDefaultModel, DraftingForItselfKeepsTheOutput) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
  EngineOptions o = options("draft=" + kModel);
  o.n_ctx = 256;
  o.max_batch_tokens = 64;
  o.max_running = 2;
  o.kv_cache_mb = 32;
  auto on = Engine::load(kModel, o);
  ASSERT_TRUE(on.ok()) << on.error().message;
  o.spec = "off";
  auto off = Engine::load(kModel, o);
  ASSERT_TRUE(off.ok()) << off.error().message;
  std::vector<std::vector<int32_t>> prompts;
  for (const char* t : {"The capital of France is", "def fibonacci(n):"}) {
    prompts.push_back((*on)->tokenizer()->encode(t, true, false));
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = test::generate_all(**off, prompts, greedy, false, 1, 24);
  EXPECT_EQ(test::generate_all(**on, prompts, greedy, true, 1, 24), want);
  const EngineStats st = (*on)->stats();
  std::printf("SmolLM2 for itself: %lld drafted, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens, 10);
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;

  // Another tokenizer (MiniLM's WordPiece) is refused naming both files.
  const std::string other = std::string(RILL_MODEL_DIR) + "/all-MiniLM-L6-v2";
  if (!std::filesystem::exists(other)) GTEST_SKIP() << other << " not found";
  auto bad = Engine::load(kModel, options("draft=" + other));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tokenizer"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find(other), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find(kModel), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace rill
