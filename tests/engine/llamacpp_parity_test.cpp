// Parity with llama.cpp on the default model (SmolLM2-135M-Instruct Q4_1):
// the greedy continuation of every prompt in tests/data/llamacpp/
// smollm2_greedy.json (made by tools/make_llamacpp_goldens.py) is identical,
// and the first-step logits agree to the golden's 5 decimals.
//
// The goldens come from llama.cpp built natively on an AVX-512 machine, and
// rill reproduces that build's arithmetic (quantized dot-product order, exp
// approximation, f16 attention rounding) on its AVX-512 path. A model this
// small and quantized turns last-bit differences into different tokens, so
// on CPUs without AVX-512 (where llama.cpp itself computes differently)
// these tests are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kGolden = std::string(RILL_TEST_DATA) + "/llamacpp/smollm2_greedy.json";

class LlamaCppParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto files = open_model_files(kModel);
    ASSERT_TRUE(files.ok()) << files.error().message;
    ModelOptions opts;
    opts.n_threads = 2;
    opts.n_ctx = 512;
    auto model = create_model(builtin_registry(), infer_profile(**files), *files, opts);
    ASSERT_TRUE(model.ok()) << model.error().message;
    model_ = std::move(model).value().release();
    std::ifstream in(kGolden);
    golden_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete golden_;
    model_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
    if (cpu::best_isa() != cpu::Isa::kAvx512) {
      GTEST_SKIP() << "the llama.cpp goldens were made on AVX-512; this CPU path is " << cpu::isa_name(cpu::best_isa());
    }
  }
  static Model* model_;
  static nlohmann::json* golden_;
};
Model* LlamaCppParity::model_ = nullptr;
nlohmann::json* LlamaCppParity::golden_ = nullptr;

TEST_F(LlamaCppParity, GreedyIdsMatchOnEveryPrompt) {
  const int eos = (*golden_)["header"]["eos_id"].get<int>();
  int n_prompts = 0;
  for (const auto& p : (*golden_)["prompts"]) {
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    SequenceRunner runner(*model_);
    GenerationOptions go;
    go.max_tokens = static_cast<int>(expected.size());
    go.eos_ids = {eos};
    go.sampling.temperature = 0;
    auto got = runner.generate(prompt, go, [](int32_t) { return true; });
    ASSERT_TRUE(got.ok()) << got.error().message;
    size_t first_diff = 0;
    while (first_diff < expected.size() && first_diff < got->ids.size() &&
           got->ids[first_diff] == expected[first_diff]) {
      ++first_diff;
    }
    EXPECT_EQ(got->ids, expected) << p["name"].get<std::string>() << ": first difference at step " << first_diff
                                  << " (llama.cpp margin there: "
                                  << (first_diff < p["steps"].size() ? p["steps"][first_diff]["margin"].dump() : "-")
                                  << ")";
    ++n_prompts;
  }
  EXPECT_GE(n_prompts, 5);
}

TEST_F(LlamaCppParity, FirstStepLogitsAgree) {
  const auto& p = (*golden_)["prompts"][0];
  const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
  const auto ref = p["first_step_logits"].get<std::vector<float>>();
  SequenceRunner runner(*model_);
  auto logits = runner.score(prompt);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const size_t V = ref.size();
  ASSERT_EQ(static_cast<int64_t>(V), model_->n_vocab());
  const float* last = logits->data() + (prompt.size() - 1) * V;
  double max_err = 0;
  for (size_t i = 0; i < V; ++i) max_err = std::max(max_err, std::fabs(double(last[i]) - ref[i]));
  EXPECT_LT(max_err, 1e-4) << "max |logit - llama.cpp| = " << max_err;
  RecordProperty("max_abs_logit_error", std::to_string(max_err));
  std::printf("max |logit - llama.cpp| at the first step: %.5f\n", max_err);
}

}  // namespace
}  // namespace rill
