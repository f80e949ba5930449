// The MLA family's configuration (model/arch/deepseek.cpp): what a
// deepseek_v3 / minicpm3 config.json may not say is refused at load with
// the file and the field named;
// the registry binds both model types to their CPU and CUDA ids.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
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
  for (const char* graph : {"deepseek_v3", "minicpm3"}) {
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

}  // namespace
}  // namespace rill
