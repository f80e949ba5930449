// Parity with Hugging Face transformers on the tiny random-weight models in
// ../shared/goldens/hf: logits within 1e-3 at every prompt position and the
// greedy continuation (computed with the KV cache, token by token) identical.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsAndGreedyMatchTransformers) {
  const std::string dir = test::hf_golden_dir(GetParam());
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);

  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 256;
  opts.max_batch_tokens = 7;  // forces chunked prefill over the 24-token prompt
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);

  auto logits = runner.score(g.prompt_ids);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const double max_err = test::max_golden_error((*logits), g);
  EXPECT_LT(max_err, 1e-3) << GetParam() << ": max |logit - reference| = " << max_err;

  runner.reset();
  GenerationOptions go;
  go.max_tokens = static_cast<int>(g.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(g.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, g.greedy_ids) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, HfParity,
                         ::testing::Values("llama", "llama3-tied", "mistral-swa", "qwen2", "qwen3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace rill
