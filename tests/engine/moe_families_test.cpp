// The mixture-of-experts families of the Llama graph (Mixtral, Qwen3-MoE,
// GLM-4.5: partial rotary, q/k norm, the sigmoid router with a shared
// expert and a first dense layer) on the CPU, held to
// Hugging Face transformers on the tiny random-weight models in
// ../shared/goldens/hf: logits within 1e-3 at every prompt position, whole
// and in prefill chunks, the greedy continuation identical; and through the
// engine, prompts of different lengths batched together give exactly the
// tokens they give alone.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

using test::HfGolden;

class MoeParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    golden_ = test::read_hf_golden(dir_);
    auto files = open_model_files(dir_);
    ASSERT_TRUE(files.ok()) << files.error().message;
    files_ = *files;
    ASSERT_GT(files_->config.n_expert, 0) << GetParam() << " is not a mixture of experts";
  }

  std::unique_ptr<Model> create(int max_batch_tokens) {
    ModelOptions opts;
    opts.n_threads = 2;
    opts.n_ctx = 256;
    opts.max_batch_tokens = max_batch_tokens;
    auto model = create_model(builtin_registry(), infer_profile(*files_), files_, opts);
    EXPECT_TRUE(model.ok()) << model.error().message;
    return model.ok() ? std::move(model).value() : nullptr;
  }

  std::string dir_;
  HfGolden golden_;
  std::shared_ptr<ModelFiles> files_;
};

// The whole prompt in one step, and in chunks of 7 and of 1 token.
TEST_P(MoeParity, LogitsMatchTransformersWholeAndChunked) {
  for (int chunk : {64, 7, 1}) {
    auto model = create(chunk);
    ASSERT_TRUE(model);
    SequenceRunner runner(*model);
    auto logits = runner.score(golden_.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const double max_err = test::max_golden_error((*logits), golden_);
    EXPECT_LT(max_err, 1e-3) << GetParam() << ", chunks of " << chunk << ": max |logit - reference| = " << max_err;
  }
}

TEST_P(MoeParity, GreedyIdsMatchTransformers) {
  auto model = create(7);
  ASSERT_TRUE(model);
  SequenceRunner runner(*model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(golden_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(golden_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, golden_.greedy_ids) << GetParam();
}

TEST_P(MoeParity, EngineTokensAreTheSameAloneAndBatched) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 10;
  o.max_running = 8;
  o.kv_cache_mb = 4;
  o.check_integrity = true;
  auto engine = Engine::load(dir_, o);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  Engine& e = **engine;
  const auto prompts = test::prompts_from(golden_.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 11;
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto alone = test::generate_all(e, prompts, s, false, 1, 12);
    const auto batched = test::generate_all(e, prompts, s, true, 2, 12);
    const auto cached = test::generate_all(e, prompts, s, true, 1, 12);  // prefix-cache hits
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(alone[i].size(), 12u);
      EXPECT_EQ(batched[i], alone[i]) << GetParam() << ", prompt " << i << ", temperature " << s.temperature;
      EXPECT_EQ(cached[i], alone[i]) << GetParam() << ", prompt " << i << " from the prefix cache";
    }
  }
  EXPECT_EQ(e.stats().integrity_errors, 0) << e.stats().last_integrity_error;
}

INSTANTIATE_TEST_SUITE_P(MoeFamilies, MoeParity, ::testing::Values("mixtral", "qwen3-moe", "glm4-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace rill
