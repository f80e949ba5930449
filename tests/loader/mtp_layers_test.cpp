// find_mtp_layers (loader/mtp_layers.h): the tiny DeepSeek-V3 checkpoint
// with an MTP layer (tests/data/mtp-deepseek-v3, tools/make_mtp_golden.py)
// has one, under model.layers.3.; the transformers-saved golden declares
// one but dropped its weights (an error naming the files, the key and the
// tensor); a model that declares none has none; Qwen3-Next's mtp.* naming
// is found from its config key, with the shapes checked.
#include "loader/mtp_layers.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace rill {
namespace {

const std::string kMtpCheckpoint = std::string(RILL_TEST_DATA) + "/mtp-deepseek-v3";

std::string golden_dir(const std::string& family) {
  const char* env = std::getenv("RILL_SHARED_DIR");
  return std::string(env ? env : RILL_SHARED_DIR) + "/goldens/hf/" + family;
}

TEST(MtpLayers, FindsTheDeepSeekMtpLayer) {
  auto files = open_model_files(kMtpCheckpoint);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto layers = find_mtp_layers(**files);
  ASSERT_TRUE(layers.ok()) << layers.error().message;
  EXPECT_EQ(layers->naming, MtpLayers::Naming::kNextn);
  ASSERT_EQ(layers->n_layers(), 1);
  EXPECT_EQ(layers->prefixes[0], "model.layers.3.");
}

TEST(MtpLayers, DeclaredButDroppedWeightsAreAnErrorNamingThem) {
  const std::string dir = golden_dir("deepseek-v3");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found";
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto layers = find_mtp_layers(**files);
  ASSERT_FALSE(layers.ok());
  const std::string& m = layers.error().message;
  EXPECT_NE(m.find(dir), std::string::npos) << m;
  EXPECT_NE(m.find("num_nextn_predict_layers"), std::string::npos) << m;
  EXPECT_NE(m.find("model.layers.3.eh_proj.weight"), std::string::npos) << m;
}

TEST(MtpLayers, AModelThatDeclaresNoneHasNone) {
  const std::string dir = golden_dir("llama");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found";
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto layers = find_mtp_layers(**files);
  ASSERT_TRUE(layers.ok()) << layers.error().message;
  EXPECT_EQ(layers->n_layers(), 0);
}

TEST(MtpLayers, FindsQwenMtpNamesAndChecksTheirShapes) {
  ModelFiles files;
  files.format = ModelFormat::kHuggingFace;
  files.path = "qwen3-next-like";
  files.config.n_embd = 8;
  files.config.n_layer = 4;
  files.config.raw = {{"mtp_num_hidden_layers", 1}};
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorRef t;
    t.name = name;
    t.shape = std::move(shape);
    files.tensors[name] = t;
  };
  add("mtp.fc.weight", {8, 16});
  add("mtp.pre_fc_norm_embedding.weight", {8});
  add("mtp.pre_fc_norm_hidden.weight", {8});
  add("mtp.norm.weight", {8});
  auto missing = find_mtp_layers(files);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("mtp.layers.0.input_layernorm.weight"), std::string::npos)
      << missing.error().message;
  EXPECT_NE(missing.error().message.find("mtp_num_hidden_layers"), std::string::npos) << missing.error().message;
  add("mtp.layers.0.input_layernorm.weight", {8});
  auto layers = find_mtp_layers(files);
  ASSERT_TRUE(layers.ok()) << layers.error().message;
  EXPECT_EQ(layers->naming, MtpLayers::Naming::kQwenMtp);
  ASSERT_EQ(layers->n_layers(), 1);
  EXPECT_EQ(layers->prefixes[0], "mtp.layers.0.");
  add("mtp.fc.weight", {8, 8});  // not [n_embd, 2 n_embd]
  auto bad_shape = find_mtp_layers(files);
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_NE(bad_shape.error().message.find("mtp.fc.weight"), std::string::npos) << bad_shape.error().message;
}

}  // namespace
}  // namespace rill
