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
#include "parity_engine.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

using Output = test::ParityOutput;
using test::collect_output;

class HybridEngine : public ::testing::TestWithParam<std::string>, protected test::ParityEngine {
 protected:
  void SetUp() override {
    dir_ = kGoldens + GetParam();
    if (!std::filesystem::exists(dir_ + "/golden.json")) GTEST_SKIP() << dir_ << " not found";
    std::ifstream in(dir_ + "/golden.json");
    const auto j = nlohmann::json::parse(in);
    golden_prompt_ = j["prompt_ids"].get<std::vector<int32_t>>();
    golden_greedy_ = j["greedy_ids"].get<std::vector<int32_t>>();
    load_parity_engine(dir_, 160, 500);
  }
  void TearDown() override { expect_intact(); }

  std::string dir_;
  std::vector<int32_t> golden_prompt_, golden_greedy_;
};

TEST_P(HybridEngine, GreedyIdsMatchTransformers) {
  const Output out = run(test::parity_request(golden_prompt_, 1, static_cast<int32_t>(golden_greedy_.size())));
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
  const Output first = run(test::parity_request(p, 7));
  std::vector<int32_t> second = p;
  second.insert(second.end(), first.ids.begin(), first.ids.end());
  for (int32_t id : {5, 6, 7, 8}) second.push_back(id);
  const Output hit = run(test::parity_request(second, 7));
  const Output cold = run(test::parity_request(second, 8));
  EXPECT_EQ(hit.usage.cached_tokens, 32);
  EXPECT_EQ(cold.usage.cached_tokens, 0);
  EXPECT_EQ(hit.ids, cold.ids);
  EXPECT_EQ(hit.logprobs, cold.logprobs);  // bit-identical: same logits
  // The same prompt again resumes later: its own prompt's last full block (48).
  const Output again = run(test::parity_request(second, 7));
  EXPECT_EQ(again.usage.cached_tokens, 48);
  EXPECT_EQ(again.ids, cold.ids);
  EXPECT_EQ(again.logprobs, cold.logprobs);
  // Batched prompts sharing a prefix, all hitting the cache at once.
  std::vector<RequestHandle> hs;
  for (int32_t tail = 0; tail < 4; ++tail) {
    auto q = second;
    q.push_back(100 + tail);
    auto h = engine_->submit(test::parity_request(q, 7));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(h).value());
  }
  for (int32_t tail = 0; tail < 4; ++tail) {
    const Output got = collect_output(hs[static_cast<size_t>(tail)]);
    auto q = second;
    q.push_back(100 + tail);
    const Output want = run(test::parity_request(q, 1000 + static_cast<uint64_t>(tail)));
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
