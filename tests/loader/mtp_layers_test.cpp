// find_mtp_layers (loader/mtp_layers.h): the tiny DeepSeek-V3 checkpoint
// with an MTP layer (tests/data/mtp-deepseek-v3, tools/make_mtp_golden.py)
// has one, under model.layers.3.; the transformers-saved golden declares
// one but dropped its weights (an error naming the files, the key and the
// tensor); a model that declares none has none; Qwen3-Next's mtp.* naming
// is found from its config key, with the shapes checked; a GGUF's
// blk.N.nextn.* layer from <arch>.nextn_predict_layers.
#include "loader/mtp_layers.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_writer.h"

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

// llama.cpp's GGUF: block_count counts the MTP block, nextn_predict_layers
// says how many of the last blocks are MTP; blk.N.nextn.* (loader/
// gguf_names.cpp) become the DeepSeek names under model.layers.N.
TEST(MtpLayers, FindsAGgufsNextnLayer) {
  constexpr int64_t E = 64;
  testing::GgufWriter w;
  w.add_string("general.architecture", "qwen35");
  w.add_u32("qwen35.context_length", 512);
  w.add_u32("qwen35.embedding_length", E);
  w.add_u32("qwen35.block_count", 5);
  w.add_u32("qwen35.feed_forward_length", 128);
  w.add_u32("qwen35.attention.head_count", 4);
  w.add_u32("qwen35.attention.head_count_kv", 2);
  w.add_u32("qwen35.attention.key_length", 16);
  w.add_u32("qwen35.rope.dimension_count", 4);
  w.add_u32("qwen35.vocab_size", 512);
  w.add_u32("qwen35.ssm.conv_kernel", 4);
  w.add_u32("qwen35.ssm.state_size", 16);
  w.add_u32("qwen35.ssm.group_count", 2);
  w.add_u32("qwen35.ssm.time_step_rank", 4);
  w.add_u32("qwen35.ssm.inner_size", 64);
  w.add_u32("qwen35.nextn_predict_layers", 1);
  auto f32 = [](int64_t n) { return std::vector<uint8_t>(static_cast<size_t>(n) * 4, 0); };
  w.add_tensor("blk.4.nextn.eh_proj.weight", 0, {2 * E, E}, f32(2 * E * E));  // ne: innermost first
  for (const char* t : {"blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight", "blk.4.nextn.shared_head_norm.weight",
                        "blk.4.attn_norm.weight"})
    w.add_tensor(t, 0, {E}, f32(E));
  const std::string path = testing::write_temp_file(w.build(), "mtp.gguf");
  auto files = open_model_files(path);
  ASSERT_TRUE(files.ok()) << files.error().message;
  EXPECT_EQ((*files)->config.n_layer, 4);
  auto layers = find_mtp_layers(**files);
  ASSERT_TRUE(layers.ok()) << layers.error().message;
  EXPECT_EQ(layers->naming, MtpLayers::Naming::kNextn);
  ASSERT_EQ(layers->n_layers(), 1);
  EXPECT_EQ(layers->prefixes[0], "model.layers.4.");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rill
