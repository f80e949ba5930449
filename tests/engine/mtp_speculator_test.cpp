// The MTP speculator (`--spec mtp`, engine/mtp_speculator.h) on the tiny
// DeepSeek-V3 checkpoint with an MTP layer (tests/data/mtp-deepseek-v3,
// tools/make_mtp_golden.py): greedy and seeded output equal the output
// without speculation, alone and batched with opted-out rows, with drafts
// proposed and counted in the stats and usage (random weights: mostly
// rejected, so the rollback runs); its first draft is the numpy
// reference's; `--spec mtp` on a model without MTP layers, or whose files
// dropped them, is refused naming the model.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kMtpCheckpoint = std::string(RILL_TEST_DATA) + "/mtp-deepseek-v3";

EngineOptions options(const std::string& spec) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 4;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  return o;
}

TEST(MtpSpeculator, OutputIsTheSameWithAndWithout) {
  const std::string deepseek = test::hf_golden_dir("deepseek-v3");
  if (!test::has_hf_golden(deepseek)) GTEST_SKIP() << deepseek << " not found";
  auto on = Engine::load(kMtpCheckpoint, options("mtp"));
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto off = Engine::load(kMtpCheckpoint, options("off"));
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ((*on)->stats().speculator, "mtp");
  const test::HfGolden g = test::read_hf_golden(deepseek);
  test::expect_greedy_prefixes(**on, g, 2, "deepseek-v3 with --spec mtp");
  const auto prompts = test::prompts_from(g.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.seed = 5;
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto want = test::generate_all(**off, prompts, s, false, 1, 24);
    EXPECT_EQ(test::generate_all(**on, prompts, s, false, 1, 24), want) << "temperature " << s.temperature;
    EXPECT_EQ(test::generate_all(**on, prompts, s, true, 2, 24), want) << "temperature " << s.temperature << " batched";
  }
  const EngineStats st = (*on)->stats();
  std::printf("deepseek-v3 MTP (random weights): %lld drafted, %lld accepted\n",
              static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_GT(st.spec_draft_tokens, 50);
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;

  // Usage reports the request's drafted and accepted tokens.
  GenerationRequest r;
  r.prompt = prompts[1];
  r.max_tokens = 16;
  r.ignore_eos = true;
  r.sampling = greedy;
  auto h = (*on)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.error().message;
  GenerationEvent ev;
  Usage usage;  // the last event's
  while (h->next(ev)) usage = ev.usage;
  EXPECT_GT(usage.draft_tokens, 0);
  EXPECT_LE(usage.accepted_draft_tokens, usage.draft_tokens);
  std::vector<int32_t> speculated;
  for (const bool speculative : {true, false}) {  // "speculative": false opts out, same tokens
    GenerationRequest q;
    q.prompt = prompts[2];
    q.max_tokens = 16;
    q.ignore_eos = true;
    q.sampling = greedy;
    q.speculative = speculative;
    auto hq = (*on)->submit(std::move(q));
    ASSERT_TRUE(hq.ok()) << hq.error().message;
    std::vector<int32_t> out;
    while (hq->next(ev)) {
      out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
      usage = ev.usage;
    }
    if (speculative) {
      EXPECT_GT(usage.draft_tokens, 0);
      speculated = out;
    } else {
      EXPECT_EQ(usage.draft_tokens, 0);
      EXPECT_EQ(out, speculated);
    }
  }
}

// The first draft after a prompt is the MTP head's argmax at the prompt's
// last position, which the numpy reference computed (mtp_greedy's last).
TEST(MtpSpeculator, FirstDraftIsTheReferenceHeads) {
  std::ifstream in(kMtpCheckpoint + "/golden.json");
  ASSERT_TRUE(in);
  const auto gold = nlohmann::json::parse(in);
  EngineOptions o = options("mtp");
  o.spec_tokens = 1;
  auto on = Engine::load(kMtpCheckpoint, o);
  ASSERT_TRUE(on.ok()) << on.error().message;
  GenerationRequest r;
  r.prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  r.max_tokens = 3;  // the first token, then one verify step with the first draft
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  auto h = (*on)->submit(std::move(r));
  ASSERT_TRUE(h.ok()) << h.error().message;
  std::vector<int32_t> out;
  GenerationEvent ev;
  while (h->next(ev)) out.insert(out.end(), ev.token_ids.begin(), ev.token_ids.end());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], gold["next_token"].get<int32_t>());
  const EngineStats st = (*on)->stats();
  ASSERT_EQ(st.spec_draft_tokens, 1);
  // The draft held iff the target's second token is the head's guess.
  EXPECT_EQ(st.spec_accepted_tokens, out[1] == gold["mtp_greedy"].back().get<int32_t>() ? 1 : 0);
}

TEST(MtpSpeculator, AModelWithoutMtpLayersIsRefusedNamingIt) {
  const std::string llama = test::hf_golden_dir("llama"), deepseek = test::hf_golden_dir("deepseek-v3");
  if (!test::has_hf_golden(llama) || !test::has_hf_golden(deepseek)) GTEST_SKIP() << "goldens not found";
  auto none = Engine::load(llama, options("mtp"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find(llama), std::string::npos) << none.error().message;
  EXPECT_NE(none.error().message.find("no multi-token-prediction"), std::string::npos) << none.error().message;
  // The transformers-saved golden declares a layer and dropped its weights.
  auto dropped = Engine::load(deepseek, options("mtp"));
  ASSERT_FALSE(dropped.ok());
  EXPECT_NE(dropped.error().message.find(deepseek), std::string::npos) << dropped.error().message;
  EXPECT_NE(dropped.error().message.find("model.layers.3.eh_proj.weight"), std::string::npos)
      << dropped.error().message;
}

}  // namespace
}  // namespace rill
