// ReplaySpeculator (engine/replay_speculator.h), the benchmark instrument
// behind `rill bench --spec replay=FILE`: it proposes a recorded
// continuation only where the request's tokens are a prefix of it; at
// acceptance 1 every draft of a greedy rerun holds, at acceptance A about a
// fraction A of the proposed tokens are the recorded ones; the engine's
// output is the same either way (drafts only change the number of steps).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "engine/replay_speculator.h"
#include "engine/speculator.h"
#include "fake_model.h"
#include "golden_util.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::vector<int32_t> propose(Speculator& s, const std::vector<int32_t>& tokens, int32_t k) {
  std::vector<int32_t> out;
  s.propose(0, tokens, k, out);
  return out;
}

TEST(ReplaySpeculator, ProposesTheRecordedContinuationOfAPrefix) {
  ReplaySpeculator s({{5, 6, 7, 8, 9, 10}, {5, 1, 2, 3}}, 1.0);
  EXPECT_EQ(propose(s, {5, 6}, 3), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(propose(s, {5, 1}, 4), (std::vector<int32_t>{2, 3}));  // up to the recording's end
  EXPECT_TRUE(propose(s, {5, 1, 2, 3}, 4).empty());                // nothing recorded beyond
  EXPECT_TRUE(propose(s, {5, 6, 0}, 2).empty());                   // diverged from every recording
  EXPECT_TRUE(propose(s, {4}, 2).empty());
}

TEST(ReplaySpeculator, AcceptanceReplacesAboutThatFractionOfTheDrafts) {
  std::vector<int32_t> seq(20001);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>(i % 97);
  for (double a : {0.0, 0.25, 0.5, 0.9}) {
    ReplaySpeculator s({seq}, a);
    const auto d = propose(s, {seq.front()}, 20000);
    ASSERT_EQ(d.size(), 20000u);
    int kept = 0;
    for (size_t i = 0; i < d.size(); ++i) kept += d[i] == seq[i + 1];
    EXPECT_NEAR(kept / 20000.0, a, 0.02) << "acceptance " << a;
    EXPECT_EQ(propose(s, {seq.front()}, 20000), d);  // the same drafts every time
  }
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()))).string();
}

TEST(ReplaySpeculator, FilesAreCheckedAndNamed) {
  const std::string path = temp_path("rill_replay_");
  ASSERT_TRUE(write_replay_file(path, {{1, 2, 3}, {4}}).ok());
  auto ok = make_speculator("replay=" + path + ":0.5");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_STREQ(ok.value()->name(), "replay");

  auto missing = make_speculator("replay=" + path + ".none");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(path + ".none"), std::string::npos);
  auto bad_acceptance = make_speculator("replay=" + path + ":1.5");
  ASSERT_FALSE(bad_acceptance.ok());
  EXPECT_NE(bad_acceptance.error().message.find("[0, 1]"), std::string::npos);
  for (const char* body : {"[]", "{\"sequences\": 3}", "{\"sequences\": [[]]}", "{\"sequences\": [[-1]]}", "{"}) {
    std::ofstream(path) << body;
    auto bad = make_speculator("replay=" + path);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_NE(bad.error().message.find(path), std::string::npos) << body;
  }
  std::filesystem::remove(path);
}

std::unique_ptr<Engine> fake_engine(const std::string& spec) {
  testing::FakeModel::Options mo;
  mo.n_vocab = 50;
  mo.block_size = 4;
  mo.n_blocks = 256;
  mo.max_batch_tokens = 64;
  mo.max_batch_seqs = 64;
  EngineOptions o;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  auto e = Engine::create(std::make_unique<testing::FakeModel>(mo), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

// A greedy run recorded, then replayed: the same output, and at acceptance 1
// every draft holds (the FakeModel's KV checks catch a wrong rollback).
TEST(ReplaySpeculator, ReplayedRunsKeepTheOutputAndAcceptWhatTheyShould) {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i) prompts.push_back({i + 1, 2 * i + 3, 7, i});
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto off = fake_engine("off");
  const auto want = test::generate_all(*off, prompts, greedy, true, 1, 30);
  std::vector<std::vector<int32_t>> recorded;
  for (size_t i = 0; i < prompts.size(); ++i) {
    recorded.push_back(prompts[i]);
    recorded.back().insert(recorded.back().end(), want[i].begin(), want[i].end());
  }
  const std::string path = temp_path("rill_replay_run_");
  ASSERT_TRUE(write_replay_file(path, recorded).ok());

  auto perfect = fake_engine("replay=" + path);
  EXPECT_EQ(test::generate_all(*perfect, prompts, greedy, true, 2, 30), want);
  const EngineStats p = perfect->stats();
  EXPECT_GT(p.spec_draft_tokens, 50);
  EXPECT_EQ(p.spec_accepted_tokens, p.spec_draft_tokens);
  EXPECT_EQ(p.integrity_errors, 0) << p.last_integrity_error;

  auto half = fake_engine("replay=" + path + ":0.5");
  EXPECT_EQ(test::generate_all(*half, prompts, greedy, true, 3, 30), want);
  const EngineStats h = half->stats();
  EXPECT_GT(h.spec_accepted_tokens, 0);
  EXPECT_LT(h.spec_accepted_tokens, h.spec_draft_tokens);
  EXPECT_EQ(h.integrity_errors, 0) << h.last_integrity_error;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rill
