// Speculative decoding on the CUDA models (the engine's verify chunks: the
// owed token and its drafts in one multi-token chunk with a logit row each,
// taken by forward_greedy when every row is greedy, else by forward and the
// host sampler). With --batch-invariant, so a verify chunk's rows are
// bit-identical to one-token decode steps:
//  1. HF goldens (f32, as loaded): greedy output equals transformers'
//     continuation with --spec ngram, and prompts that repeat themselves
//     (drafts proposed, mostly rejected) give the tokens they give without
//     speculation, alone and batched;
//     the hybrid qwen3-next included (its recurrent state rolled back);
//  2. the draft-model speculator (llama goldens): the same output, a self
//     draft accepted throughout;
//  3. the default model on an edit prompt (drafts mostly held): greedy and
//     seeded output the same with and without speculation.
// Skipped without a CUDA device or the model files.
#include <cstdlib>
#include <filesystem>

#include "../engine/golden_util.h"
#include "cuda_test_util.h"
#include "rill/engine.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

// The default model: RILL_MODEL_DIR in the environment overrides the
// build-time path (a GPU machine gets the model carried elsewhere).
std::string default_model() {
  const char* env = std::getenv("RILL_MODEL_DIR");
  return std::string(env ? env : RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

EngineOptions cuda_options(const std::string& spec) {
  EngineOptions o;
  o.device = Device::kCuda;
  o.batch_invariant = true;
  o.n_ctx = 256;
  o.max_batch_tokens = 64;
  o.max_running = 6;
  o.kv_cache_mb = 16;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  return o;
}

class CudaSpeculative : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaSpeculative, GreedyOutputIsTheSameWithAndWithout) {
  RILL_REQUIRE_GPU();
  const std::string dir = test::hf_golden_dir(GetParam());
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);
  auto on = Engine::load(dir, cuda_options("ngram"));
  auto off = Engine::load(dir, cuda_options("off"));
  ASSERT_TRUE(on.ok()) << on.error().message;
  ASSERT_TRUE(off.ok()) << off.error().message;
  test::expect_greedy_prefixes(**on, g, 3, std::string(GetParam()) + " on CUDA with speculation");
  std::vector<std::vector<int32_t>> prompts;
  for (auto p : test::prompts_from(g.prompt_ids)) {
    if (p.size() > 12) p.resize(12);
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin(), p.end());
    prompts.push_back(twice);
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = test::generate_all(**off, prompts, greedy, false, 1, 16);
  const auto alone = test::generate_all(**on, prompts, greedy, false, 1, 16);
  const auto batched = test::generate_all(**on, prompts, greedy, true, 2, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(alone[i], want[i]) << GetParam() << ", prompt " << i;
    EXPECT_EQ(batched[i], want[i]) << GetParam() << ", prompt " << i << " batched";
  }
  EXPECT_GT((*on)->stats().spec_draft_tokens, 0);
  EXPECT_EQ((*on)->stats().integrity_errors, 0) << (*on)->stats().last_integrity_error;
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSpeculative, ::testing::Values("llama", "gemma2", "qwen3-moe", "qwen3-next"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// The draft-model speculator on the device: the llama golden drafting for
// itself is accepted throughout (batch-invariant rows), a llama draft for
// llama3-tied (same vocabulary, other weights) is rejected, and the
// target's greedy output is the same either way.
TEST(CudaSpeculativeDraft, OutputIsTheSameAndASelfDraftIsAccepted) {
  RILL_REQUIRE_GPU();
  const std::string llama = test::hf_golden_dir("llama"), tied = test::hf_golden_dir("llama3-tied");
  if (!test::has_hf_golden(llama) || !test::has_hf_golden(tied)) GTEST_SKIP() << "llama goldens not found";
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (const auto& [target, draft] : {std::pair{llama, llama}, std::pair{tied, llama}}) {
    auto on = Engine::load(target, cuda_options("draft=" + draft));
    auto off = Engine::load(target, cuda_options("off"));
    ASSERT_TRUE(on.ok()) << on.error().message;
    ASSERT_TRUE(off.ok()) << off.error().message;
    const test::HfGolden g = test::read_hf_golden(target);
    const auto prompts = test::prompts_from(g.prompt_ids);
    const auto want = test::generate_all(**off, prompts, greedy, false, 1, 24);
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, false, 1, 24), want) << target;
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, true, 2, 24), want) << target << " batched";
    const EngineStats st = (*on)->stats();
    EXPECT_GT(st.spec_draft_tokens, 0) << target;
    if (target == draft) {
      EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens) << "a model drafting for itself";
    } else {
      EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens) << "another model's drafts";
    }
    EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
  }
}

TEST(CudaSpeculativeDefaultModel, EditOutputIsTheSameWithAndWithout) {
  RILL_REQUIRE_GPU();
  const std::string model = default_model();
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " not found";
  EngineOptions o_on = cuda_options("ngram"), o_off = cuda_options("off");
  o_on.n_ctx = o_off.n_ctx = 512;
  o_on.kv_cache_mb = o_off.kv_cache_mb = 64;
  auto on = Engine::load(model, o_on);
  auto off = Engine::load(model, o_off);
  ASSERT_TRUE(on.ok()) << on.error().message;
  ASSERT_TRUE(off.ok()) << off.error().message;
  const std::vector<std::vector<int32_t>> prompts = {(*on)->tokenizer()->encode(
      "Rewrite the text, replacing 'cat' with 'dog'.\nText: The cat sat on the mat. The cat was happy and the cat "
      "purred.\nRewritten: The dog",
      true, false)};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.7f;
  seeded.seed = 3;
  for (const SamplingParams& s : {greedy, seeded}) {
    EXPECT_EQ(test::generate_all(**on, prompts, s, false, 1, 32), test::generate_all(**off, prompts, s, false, 1, 32))
        << "temperature " << s.temperature;
  }
  EXPECT_GT((*on)->stats().spec_accepted_tokens, 0);
}

}  // namespace
}  // namespace rill
