// The multi-head latent attention family (deepseek_v3: q/kv LoRA, the
// sigmoid group-limited MoE with a shared expert, first layer dense;
// minicpm3: the muP scales) against Hugging Face transformers on the tiny
// random models in ../shared/goldens/hf: logits within 1e-3 at every prompt
// position with the prompt whole and in chunks of 7, 5 and 1 tokens, the
// greedy continuation identical; the KV cache holds one latent row per
// token and layer; through the engine, prompts of different lengths batched
// (split into chunks at other places than alone) give their alone tokens and
// log-probabilities, and a prefix-cache hit gives the cold run's; yarn rope
// scaling (no golden) loads and moves every position after the first. The
// engine tests also run GLM-5 (glm_moe_dsa; its parity: dsa_parity_test).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "parity_engine.h"
#include "rill/engine.h"

namespace rill {
namespace {

Result<std::unique_ptr<Model>> open(const std::string& dir, int max_batch_tokens) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.max_batch_tokens = max_batch_tokens;
  opts.kv_block_size = 4;
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

class MlaParity : public ::testing::TestWithParam<std::string>, protected test::ParityEngine {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    g_ = test::read_hf_golden(dir_);
  }
  std::string dir_;
  test::HfGolden g_;
};

TEST_P(MlaParity, LogitsMatchTransformersAtEveryPositionWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    auto model = open(dir_, chunk);
    ASSERT_TRUE(model.ok()) << model.error().message;
    SequenceRunner runner(**model);
    auto logits = runner.score(g_.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const double max_err = test::max_golden_error(*logits, g_);
    EXPECT_LT(max_err, 1e-3) << GetParam() << ", chunks of " << chunk << ": max |logit - reference| = " << max_err;
  }
}

TEST_P(MlaParity, GreedyTokensMatchTransformers) {
  auto model = open(dir_, 7);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(g_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(g_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, g_.greedy_ids) << GetParam();
}

// The cache keeps kv_lora_rank + qk_rope_head_dim f32 values per token and
// layer (16 + 8 in both goldens, 3 layers), split over the K and V planes.
TEST_P(MlaParity, KvCacheHoldsOneLatentRowPerTokenAndLayer) {
  auto model = open(dir_, 8);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto& raw = (*model)->config().raw;
  const size_t row = raw["kv_lora_rank"].get<size_t>() + raw["qk_rope_head_dim"].get<size_t>();
  const auto n_layers = static_cast<size_t>((*model)->config().n_layer);
  EXPECT_EQ((*model)->kv_bytes_per_token(), n_layers * row * sizeof(float));
  const auto layers = (*model)->kv_layers();
  ASSERT_EQ(layers.size(), n_layers);
  EXPECT_EQ(layers[0].row_bytes, row / 2 * sizeof(float));
  ASSERT_EQ((*model)->kv_spec().size(), 1u);
  EXPECT_EQ((*model)->kv_spec()[0].kind, LayerKind::kFull);
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaParity, ::testing::Values("deepseek-v3", "minicpm3"), [](const auto& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

// The golden's weights with an edited config.json, in a temp dir.
std::string with_config(const std::string& family, const std::function<void(nlohmann::json&)>& edit) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("rill_mla_yarn_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(test::hf_golden_dir(family) + "/model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(test::hf_golden_dir(family) + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

// DeepSeek-V3's yarn (factor 40, mscale = mscale_all_dim = 1, as its
// config.json has it) loads and changes attention: the softmax scale grows
// by mscale(40, 1)^2 and the frequencies change. No golden has yarn, so this
// only checks where the change can show: position 0 attends to itself alone
// (a softmax of one score is 1 whatever the scale, RoPE is the identity), so
// its logits stay; later positions move.
TEST(MlaModel, YarnRopeScalingChangesOnlyLaterPositions) {
  if (!test::has_hf_golden(test::hf_golden_dir("deepseek-v3"))) GTEST_SKIP();
  auto score = [](const std::string& dir) {
    auto model = open(dir, 32);
    EXPECT_TRUE(model.ok()) << model.error().message;
    SequenceRunner runner(**model);
    const std::vector<int32_t> prompt = {180, 496, 430, 186};
    auto logits = runner.score(prompt);
    EXPECT_TRUE(logits.ok());
    return logits.ok() ? *logits : std::vector<float>{};
  };
  const std::vector<float> plain = score(test::hf_golden_dir("deepseek-v3"));
  const std::string yarn = with_config("deepseek-v3", [](nlohmann::json& c) {
    c["rope_parameters"] = {{"rope_type", "yarn"},   {"factor", 40.0},
                            {"rope_theta", 10000.0}, {"mscale", 1.0},
                            {"mscale_all_dim", 1.0}, {"beta_fast", 32.0},
                            {"beta_slow", 1.0},      {"original_max_position_embeddings", 64}};
  });
  const std::vector<float> scaled = score(yarn);
  std::filesystem::remove_all(yarn);
  ASSERT_EQ(plain.size(), scaled.size());
  const size_t V = 512;
  // Position 0 attends to itself only: softmax of one score is 1 whatever
  // the scale, so the first row is unchanged; later rows differ.
  double first = 0, later = 0;
  for (size_t i = 0; i < V; ++i) first = std::max(first, std::fabs(double(plain[i]) - scaled[i]));
  for (size_t i = V; i < plain.size(); ++i) later = std::max(later, std::fabs(double(plain[i]) - scaled[i]));
  EXPECT_LT(first, 1e-6);
  EXPECT_GT(later, 1e-4);
}

using Output = test::ParityOutput;

class MlaEngine : public ::testing::TestWithParam<std::string>, protected test::ParityEngine {
 protected:
  void SetUp() override {
    const std::string dir = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
    // GLM-5: the causal top-k's reference (tests/engine/dsa_parity_test.cpp).
    g_ = test::read_hf_golden(GetParam() == "glm-5" ? std::string(RILL_TEST_DATA) + "/glm-5-causal" : dir);
    std::ifstream in(dir + "/config.json");
    const auto cfg = nlohmann::json::parse(in);
    row_ = cfg["kv_lora_rank"].get<int>() + cfg["qk_rope_head_dim"].get<int>() + cfg.value("index_head_dim", 0);
    load_parity_engine(dir, 128, 500);
  }
  void TearDown() override { expect_intact(); }

  test::HfGolden g_;
  int row_ = 0;  // f32 values per token and layer: latent, rope key, indexer key (GLM-5)
};

// /stats' kv.bytes_per_token: the latent rows, 3 layers x (16 + 8) f32,
// GLM-5's with its indexer key (+ 16).
TEST_P(MlaEngine, StatsReportTheLatentKvBytesPerToken) {
  EXPECT_EQ(row_, GetParam() == "glm-5" ? 16 + 8 + 16 : 16 + 8);
  EXPECT_EQ(engine_->stats().kv_bytes_per_token, 3 * row_ * 4);
}

TEST_P(MlaEngine, GreedyIdsMatchTransformers) {
  GenerationRequest r = test::parity_request(g_.prompt_ids, 1);
  r.max_tokens = static_cast<int32_t>(g_.greedy_ids.size());
  EXPECT_EQ(run(std::move(r)).ids, g_.greedy_ids);
}

TEST_P(MlaEngine, BatchedPromptsGiveTheirAloneTokens) {
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

TEST_P(MlaEngine, PrefixHitMatchesTheColdRun) {
  const std::vector<int32_t>& p = prompts_[6];  // 47 tokens
  const Output first = run(test::parity_request(p, 7));
  std::vector<int32_t> second = p;
  second.insert(second.end(), first.ids.begin(), first.ids.end());
  for (int32_t id : {5, 6, 7, 8}) second.push_back(id);
  const Output hit = run(test::parity_request(second, 7));
  const Output cold = run(test::parity_request(second, 8));
  EXPECT_GE(hit.usage.cached_tokens, 48);
  EXPECT_EQ(cold.usage.cached_tokens, 0);
  EXPECT_EQ(hit.ids, cold.ids);
  EXPECT_EQ(hit.logprobs, cold.logprobs);  // bit-identical: same logits
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaEngine, ::testing::Values("deepseek-v3", "minicpm3", "glm-5"), [](const auto& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

}  // namespace
}  // namespace rill
