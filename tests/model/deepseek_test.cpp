// The MLA family's configuration (model/arch/deepseek_config.cpp): what a
// deepseek_v3 / minicpm3 / glm_moe_dsa config.json may not say is refused
// at load with the file and the field named;
// the registry binds both model types to their CPU and CUDA ids.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

Result<std::unique_ptr<Model>> open(const std::string& dir) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions o;
  o.n_threads = 1;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;
  return create_model(builtin_registry(), infer_profile(*files), files, o);
}

// The golden's weights with an edited config.json, in a temp dir.
std::string with_config(const std::string& family, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("rill_mla_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kGoldens + family + "/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  std::ifstream in(kGoldens + family + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

TEST(MlaModel, RegistryBindsBothModelTypes) {
  for (const char* graph : {"deepseek_v3", "minicpm3", "glm_moe_dsa"}) {
    ModelProfile p{graph, "hf", "autoregressive", std::nullopt, std::nullopt, std::nullopt};
    auto cpu = builtin_registry().select(p, Device::kCpu);
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    EXPECT_EQ((*cpu)->id, std::string(graph) + ".cpu");
    auto cuda = builtin_registry().select(p, Device::kCuda);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    EXPECT_EQ((*cuda)->id, std::string(graph) + ".cuda");
  }
}

TEST(MlaModel, ConfigErrorsNameTheFileAndField) {
  if (!fs::exists(kGoldens + "deepseek-v3/golden.json")) GTEST_SKIP();
  struct Case {
    const char* family;
    std::function<void(nlohmann::json&)> edit;
    const char* want;
  };
  const Case kCases[] = {
      {"deepseek-v3", [](nlohmann::json& c) { c.erase("kv_lora_rank"); }, "'kv_lora_rank' is missing"},
      {"deepseek-v3", [](nlohmann::json& c) { c["qk_rope_head_dim"] = 7; }, "qk_rope_head_dim 7"},
      {"deepseek-v3", [](nlohmann::json& c) { c["v_head_dim"] = "16"; }, "'v_head_dim'"},
      {"deepseek-v3", [](nlohmann::json& c) { c["attention_bias"] = true; }, "attention_bias"},
      {"deepseek-v3", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "hidden_act 'gelu'"},
      {"deepseek-v3", [](nlohmann::json& c) { c["topk_method"] = "greedy"; }, "'topk_method'"},
      {"deepseek-v3", [](nlohmann::json& c) { c["n_group"] = 3; }, "'n_group'"},
      {"deepseek-v3",
       [](nlohmann::json& c) {
         c["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
       },
       "default and yarn RoPE only"},
      {"minicpm3", [](nlohmann::json& c) { c["rope_interleave"] = true; }, "rope_interleave"},
      {"minicpm3", [](nlohmann::json& c) { c["scale_depth"] = "1.4"; }, "'scale_depth'"},
      {"glm-5", [](nlohmann::json& c) { c.erase("index_topk"); }, "'index_topk' is missing"},
      {"glm-5", [](nlohmann::json& c) { c["rope_interleave"] = false; }, "rope_interleave false"},
      {"glm-5", [](nlohmann::json& c) { c["index_head_dim"] = 4; }, "index_head_dim 4"},
      {"glm-5",
       [](nlohmann::json& c) {
         c["indexer_types"] = {"full", "shared"};
       },
       "one indexer type per layer"},
      {"glm-5",
       [](nlohmann::json& c) {
         c["indexer_types"] = {"shared", "full", "full"};
       },
       "layer 0 must be full"},
      {"glm-5",
       [](nlohmann::json& c) {
         c["indexer_types"] = {"full", "full", "dense"};
       },
       "entry 2"},
      {"glm-5",
       [](nlohmann::json& c) {
         c["mlp_layer_types"] = {"dense", "dense", "sparse"};
       },
       "mlp_layer_types[1]"},
  };
  for (const Case& k : kCases) {
    const std::string dir = with_config(k.family, k.edit);
    auto model = open(dir);
    ASSERT_FALSE(model.ok()) << k.want;
    EXPECT_NE(model.error().message.find(k.want), std::string::npos) << model.error().message;
    EXPECT_NE(model.error().message.find("config.json"), std::string::npos) << model.error().message;
    fs::remove_all(dir);
  }
}

// A full indexer layer needs its indexer's weights: the golden's layer 2 is
// shared and has none, and the error names the tensor.
TEST(MlaModel, Glm5FullLayerWithoutIndexerWeightsIsRefused) {
  if (!fs::exists(kGoldens + "glm-5/golden.json")) GTEST_SKIP();
  const std::string dir = with_config("glm-5", [](nlohmann::json& c) {
    c["indexer_types"] = {"full", "full", "full"};
  });
  auto model = open(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("model.layers.2.self_attn.indexer."), std::string::npos)
      << model.error().message;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rill

namespace rill {
namespace {

// The MTP head (ModelOptions::mtp, Model::forward_mtp) on the tiny
// DeepSeek-V3 checkpoint with an MTP layer (tests/data/mtp-deepseek-v3):
// the model's greedy pick after the prompt is the golden's next_token, and
// the MTP head's logits at every prompt position (t_{p+1} the next prompt
// token, the last row the model's pick) equal the numpy reference of
// tools/make_mtp_golden.py, whole and fed in two chunks (the MTP layer's KV
// carried between steps).
TEST(MlaModel, MtpHeadMatchesTheNumpyReference) {
  const std::string dir = std::string(RILL_TEST_DATA) + "/mtp-deepseek-v3";
  std::ifstream in(dir + "/golden.json");
  ASSERT_TRUE(in) << dir;
  const auto gold = nlohmann::json::parse(in);
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = gold["mtp_logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(prompt.size());
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 1;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;
  auto plain = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ((*plain)->n_mtp_layers(), 0);  // bound only when asked for
  o.mtp = true;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  ASSERT_EQ(m.n_mtp_layers(), 1);
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  const std::vector<int32_t> table = slot_block_table(0, m.n_ctx(), m.kv_block_size());

  Batch b;
  b.add_sequence(prompt.data(), n, 0, true, table);
  std::vector<float> logits(static_cast<size_t>(V)), hidden(static_cast<size_t>(n * E));
  ASSERT_TRUE(m.forward_hidden(b, logits.data(), hidden.data()).ok());
  const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(next, gold["next_token"].get<int32_t>());

  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(next);
  for (const int32_t split : {n, 9}) {  // whole, then positions [0, 9) and [9, n)
    std::vector<float> got(static_cast<size_t>(n * V));
    for (int32_t from = 0; from < n; from += split) {
      const int32_t len = std::min(split, n - from);
      Batch mb;
      mb.add_sequence(shifted.data() + from, len, from, false, table);
      for (int32_t i = 0; i < len; ++i) mb.sample_rows.push_back(i);
      ASSERT_TRUE(m.forward_mtp(mb, hidden.data() + static_cast<size_t>(from * E),
                                got.data() + static_cast<size_t>(from * V), nullptr)
                      .ok());
    }
    double err = 0;
    for (int32_t r = 0; r < n; ++r)
      for (int64_t v = 0; v < V; ++v)
        err = std::max(err, std::fabs(double(got[static_cast<size_t>(r * V + v)]) - want[r][v]));
    std::printf("MTP head, chunks of %d: max |logit - numpy reference| = %.3g\n", split, err);
    EXPECT_LT(err, 1e-3) << "chunks of " << split;
    const auto first_draft = static_cast<int32_t>(std::max_element(got.end() - V, got.end()) - (got.end() - V));
    EXPECT_EQ(first_draft, gold["mtp_greedy"].back().get<int32_t>()) << "chunks of " << split;
  }
  // A model without MTP layers is refused, naming the file.
  const std::string llama = kGoldens + "llama";
  if (!fs::exists(llama + "/config.json")) return;
  auto lf = open_model_files(llama);
  ASSERT_TRUE(lf.ok()) << lf.error().message;
  auto none = create_model(builtin_registry(), infer_profile(**lf), *lf, o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find(llama), std::string::npos) << none.error().message;
}

}  // namespace
}  // namespace rill
