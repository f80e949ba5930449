// Speculative decoding over KV tails (k4c / k4a, model/kv_tails.h): a
// step encodes every KV block it completes, so a rejection inside a block
// the verify step completed would leave the accepted tokens before it in
// no tail; the engine ends drafts before the owed token's block does
// (EngineImpl::draft_length). On the fake model (whose tails refuse any
// step that does not continue where its tail allows, as KvTails::check
// does) and on the default model in k4c and k4a, greedy and seeded output
// are the same with and without drafting.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/replay_speculator.h"
#include "fake_model.h"
#include "golden_util.h"
#include "model/kv_types.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()))).string();
}

// Prompts with their greedy continuations: what a replay file records.
std::vector<std::vector<int32_t>> recorded(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<std::vector<int32_t>>& outputs) {
  std::vector<std::vector<int32_t>> r;
  for (size_t i = 0; i < prompts.size(); ++i) {
    r.push_back(prompts[i]);
    r.back().insert(r.back().end(), outputs[i].begin(), outputs[i].end());
  }
  return r;
}

std::unique_ptr<Engine> fake_engine(const std::string& spec, int32_t tail_slots) {
  testing::FakeModel::Options mo;
  mo.n_vocab = 50;
  mo.block_size = 4;
  mo.n_blocks = 256;
  mo.max_batch_tokens = 64;
  mo.max_batch_seqs = 64;
  mo.kv_tail_slots = tail_slots;
  EngineOptions o;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 6;  // longer than a block: a verify step may complete one and start the next
  auto e = Engine::create(std::make_unique<testing::FakeModel>(mo), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

TEST(SpeculativeKvTails, FakeTailsKeepTheOutputAndDraftsNeverCompleteABlock) {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i) prompts.push_back({i + 1, 2 * i + 3, 7, i, 11});
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto off = fake_engine("off", 8);
  const auto want = test::generate_all(*off, prompts, greedy, true, 1, 40);
  const std::string path = temp_path("rill_replay_tails_");
  ASSERT_TRUE(write_replay_file(path, recorded(prompts, want)).ok());
  for (const char* acceptance : {"", ":0.7", ":0.4"}) {
    auto on = fake_engine("replay=" + path + acceptance, 8);
    EXPECT_EQ(test::generate_all(*on, prompts, greedy, true, 2, 40), want) << acceptance;
    const EngineStats s = on->stats();
    EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
    EXPECT_GT(s.spec_draft_tokens, 30) << acceptance;
    if (*acceptance == '\0') {
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens);
    } else {
      EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << acceptance;
    }
  }
  // Without tails the drafts are not cut at block ends: more of them.
  auto tailed = fake_engine("replay=" + path, 8);
  auto plain = fake_engine("replay=" + path, 0);
  EXPECT_EQ(test::generate_all(*tailed, prompts, greedy, true, 3, 40), want);
  EXPECT_EQ(test::generate_all(*plain, prompts, greedy, true, 3, 40), want);
  EXPECT_LT(tailed->stats().spec_draft_tokens, plain->stats().spec_draft_tokens);
  std::filesystem::remove(path);
}

// The default model in k4c and k4a: drafts from a replay file at partial
// acceptance (many rejections) and from the
// n-gram speculator give the tokens of the same engine without drafting,
// greedy and seeded, alone and batched. Holds because k4c's logits do not
// depend on how a sequence's tokens are split into steps (a 1 + k token
// verify step computes the KV of one-token steps, bit for bit).
const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

std::unique_ptr<Engine> k4_engine(const char* pair, const std::string& spec) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 512;
  o.max_batch_tokens = 96;
  o.max_running = 4;
  o.kv_cache_mb = 64;
  o.check_integrity = true;
  const auto types = parse_kv_pair(pair);
  EXPECT_TRUE(types.has_value()) << pair;
  o.kv_types.k = types->k;
  o.kv_types.v = types->v;
  o.spec = spec;
  o.spec_tokens = 6;
  auto e = Engine::load(kModel, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

TEST(SpeculativeKvTails, DefaultModelK4cAndK4aOutputIsTheSameWithAndWithoutDrafts) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
  for (const char* pair : {"k4c", "k4a"}) {
    auto off = k4_engine(pair, "off");
    const char* const texts[] = {
        "Copy the code exactly.\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\nCopy:\ndef add(",
        "Rewrite the text, replacing 'cat' with 'dog'.\nText: The cat sat on the mat. The cat was happy and the "
        "cat purred.\nRewritten: The dog",
        "The capital of France is",
    };
    std::vector<std::vector<int32_t>> prompts;
    for (const char* t : texts) prompts.push_back(off->tokenizer()->encode(t, true, false));
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingParams seeded;
    seeded.temperature = 0.7f;
    seeded.seed = 3;
    const auto want_greedy = test::generate_all(*off, prompts, greedy, false, 1, 48);
    const auto want_seeded = test::generate_all(*off, prompts, seeded, false, 1, 48);
    const std::string path = temp_path("rill_replay_k4_");
    ASSERT_TRUE(write_replay_file(path, recorded(prompts, want_greedy)).ok());
    for (const std::string& spec : {"replay=" + path + ":0.6", std::string("ngram")}) {
      auto on = k4_engine(pair, spec);
      EXPECT_EQ(test::generate_all(*on, prompts, greedy, false, 1, 48), want_greedy) << pair << " " << spec;
      EXPECT_EQ(test::generate_all(*on, prompts, greedy, true, 2, 48), want_greedy) << pair << " " << spec;
      EXPECT_EQ(test::generate_all(*on, prompts, seeded, true, 3, 48), want_seeded) << pair << " " << spec;
      const EngineStats s = on->stats();
      EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
      // One tail per running request, not per draft's logit row.
      EXPECT_EQ(s.kv_tail_bytes, off->stats().kv_tail_bytes);
      EXPECT_GT(s.spec_accepted_tokens, 0) << pair << " " << spec;
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace rill
