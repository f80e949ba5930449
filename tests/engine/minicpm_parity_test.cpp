// MiniCPM 1/2/4 (`minicpm`: the Llama graph with MiniCPM's muP scales,
// model/mup_scales.h) against the float64 numpy model of
// tools/make_minicpm_golden.py (transformers has no MiniCPM class) on three
// tiny random checkpoints in tests/data: minicpm (its own lm_head),
// minicpm-tied (the embedding as the head) and minicpm-longrope (minicpm's
// weights with MiniCPM 4's LongRoPE factors), all GQA (4 heads over 2 KV
// heads). Logits within 1e-3 at every prompt position with the prompt whole
// and in chunks of 7, 5 and 1 tokens, the greedy continuation identical;
// through the engine, prompts of different lengths batched (split into
// chunks at other places than alone) give their alone tokens and
// log-probabilities, and a prefix-cache hit gives the cold run's. What the
// graph does not run (MiniCPM4's sparse attention, LongRoPE past
// original_max_position_embeddings, MiniCPM-MoE, another activation,
// missing scales) is refused naming the field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "parity_engine.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::string data_dir(const std::string& name) {
  return std::string(RILL_TEST_DATA) + "/" + name;
}

Result<std::unique_ptr<Model>> open(const std::string& dir, int max_batch_tokens) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.max_batch_tokens = max_batch_tokens;
  opts.kv_block_size = 4;
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

class MinicpmParity : public ::testing::TestWithParam<std::string>, protected test::ParityEngine {
 protected:
  void SetUp() override {
    dir_ = data_dir(GetParam());
    g_ = test::read_hf_golden(dir_);
  }
  std::string dir_;
  test::HfGolden g_;
};

TEST_P(MinicpmParity, LogitsMatchTheReferenceAtEveryPositionWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    auto model = open(dir_, chunk);
    ASSERT_TRUE(model.ok()) << model.error().message;
    SequenceRunner runner(**model);
    auto logits = runner.score(g_.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const double max_err = test::max_golden_error(*logits, g_);
    EXPECT_LT(max_err, 1e-3) << GetParam() << ", chunks of " << chunk << ": max |logit - reference| = " << max_err;
    std::printf("%s, prefill chunk %d: max |logit - reference| %.2e\n", GetParam().c_str(), chunk, max_err);
  }
}

TEST_P(MinicpmParity, GreedyTokensMatchTheReference) {
  auto model = open(dir_, 7);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ((*model)->config().architecture, "minicpm");
  SequenceRunner runner(**model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(g_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(g_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, g_.greedy_ids) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Minicpm, MinicpmParity, ::testing::Values("minicpm", "minicpm-tied", "minicpm-longrope"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A golden's weights with an edited config.json, in a temp dir.
std::string with_config(const std::function<void(nlohmann::json&)>& edit, const std::string& golden = "minicpm") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("rill_minicpm_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(data_dir(golden) + "/model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(data_dir(golden) + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

TEST(MinicpmModel, UnsupportedFieldsAreRefusedByName) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* want;
  };
  const Case kCases[] = {
      {[](nlohmann::json& c) {
         c["sparse_config"] = {{"kernel_size", 32}, {"topk", 64}, {"dense_len", 8192}};
       },
       "field 'sparse_config' (MiniCPM4's InfLLM v2 sparse attention) is not supported"},
      // LongRoPE with max_position_embeddings past the original: MiniCPM's
      // modeling applies the long factors and a magnitude scale at every
      // length, llama.cpp the short ones; below it, a scale under 1.
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "longrope"},
                              {"long_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"short_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"original_max_position_embeddings", 256}};
       },
       "field 'rope_scaling.original_max_position_embeddings' (256) differs from max_position_embeddings (512)"},
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "longrope"},
                              {"long_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"short_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"original_max_position_embeddings", 1024}};
       },
       "field 'rope_scaling.original_max_position_embeddings' (1024) differs from max_position_embeddings (512)"},
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "longrope"}, {"long_factor", {1.0, 1.0}}, {"short_factor", {1.0, 1.0}}};
       },
       "field 'rope_scaling.short_factor' must list 4 numbers (one per rotated pair)"},
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "longrope"},
                              {"long_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"short_factor", {1.0, 1.0, 1.0, 1.0}},
                              {"attention_factor", 1.2}};
       },
       "field 'rope_scaling.attention_factor' is not part of MiniCPM's LongRoPE"},
      {[](nlohmann::json& c) {
         c["num_experts"] = 8;
         c["num_experts_per_tok"] = 2;
       },
       "field 'num_experts' (MiniCPM-MoE's experts) is not supported"},
      {[](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "field 'hidden_act' 'gelu' is not supported by minicpm"},
      {[](nlohmann::json& c) { c["mlp_bias"] = true; }, "field 'mlp_bias' must be false"},
      {[](nlohmann::json& c) { c["use_mup"] = false; }, "field 'use_mup' must be true"},
      {[](nlohmann::json& c) { c.erase("scale_emb"); }, "field 'scale_emb' is missing (needed by minicpm)"},
      {[](nlohmann::json& c) { c.erase("dim_model_base"); }, "field 'dim_model_base' is missing (needed by minicpm)"},
      {[](nlohmann::json& c) { c["scale_depth"] = -1.4; }, "field 'scale_depth' must be a positive number"},
  };
  for (const Case& k : kCases) {
    const std::string dir = with_config(k.edit);
    auto model = open(dir, 8);
    ASSERT_FALSE(model.ok()) << k.want;
    EXPECT_NE(model.error().message.find(k.want), std::string::npos) << model.error().message;
    EXPECT_NE(model.error().message.find("config.json"), std::string::npos) << model.error().message;
    std::filesystem::remove_all(dir);
  }
}

// LongRoPE's short factors hold up to original_max_position_embeddings
// (512 here); a longer context would need the long ones: refused.
TEST(MinicpmModel, LongRopePastTheOriginalContextIsRefused) {
  auto files = open_model_files(data_dir("minicpm-longrope"));
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions opts;
  opts.n_threads = 1;
  opts.n_ctx = 1024;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("a context of 1024 tokens is past LongRoPE's "
                                       "original_max_position_embeddings (512)"),
            std::string::npos)
      << model.error().message;
  opts.n_ctx = 512;
  EXPECT_TRUE(create_model(builtin_registry(), infer_profile(**files), *files, opts).ok());
}

// The scales are what moves the logits: the same weights read as plain
// llama (no scales) miss the reference by far more than the bound.
TEST(MinicpmModel, TheScalesAreApplied) {
  const test::HfGolden g = test::read_hf_golden(data_dir("minicpm"));
  const std::string dir = with_config([](nlohmann::json& c) { c["model_type"] = "llama"; });
  auto model = open(dir, 64);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  auto logits = runner.score(g.prompt_ids);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  EXPECT_GT(test::max_golden_error(*logits, g), 0.1);
  std::filesystem::remove_all(dir);
}

using Output = test::ParityOutput;

class MinicpmEngine : public ::testing::TestWithParam<std::string>, protected test::ParityEngine {
 protected:
  void SetUp() override {
    const std::string dir = data_dir(GetParam());
    g_ = test::read_hf_golden(dir);
    load_parity_engine(dir, 128, 300);
  }
  void TearDown() override { expect_intact(); }

  test::HfGolden g_;
};

TEST_P(MinicpmEngine, GreedyIdsMatchTheReference) {
  GenerationRequest r = test::parity_request(g_.prompt_ids, 1);
  r.max_tokens = static_cast<int32_t>(g_.greedy_ids.size());
  EXPECT_EQ(run(std::move(r)).ids, g_.greedy_ids);
}

TEST_P(MinicpmEngine, BatchedPromptsGiveTheirAloneTokens) {
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

TEST_P(MinicpmEngine, PrefixHitMatchesTheColdRun) {
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

INSTANTIATE_TEST_SUITE_P(Minicpm, MinicpmEngine, ::testing::Values("minicpm", "minicpm-tied", "minicpm-longrope"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace rill
