// Mixture-of-experts configuration: the config.json fields of Mixtral,
// Qwen3-MoE and Qwen3-Next, the GGUF `<arch>.expert_*` keys, and the GGUF
// expert tensor names.
#include <gtest/gtest.h>

#include "gguf_writer.h"
#include "loader/gguf_names.h"
#include "loader/hf_config.h"

namespace rill {
namespace {

using nlohmann::json;
const std::string kGoldenDir = std::string(RILL_SHARED_DIR) + "/goldens/hf";

TEST(MoeConfig, GoldenConfigs) {
  auto mixtral = load_hf_config(kGoldenDir + "/mixtral");
  ASSERT_TRUE(mixtral.ok()) << mixtral.error().message;
  EXPECT_EQ(mixtral->n_expert, 4);
  EXPECT_EQ(mixtral->n_expert_used, 2);
  EXPECT_EQ(mixtral->n_ff_expert, 128);  // intermediate_size
  EXPECT_EQ(mixtral->n_ff_shared_expert, 0);
  EXPECT_TRUE(mixtral->norm_topk_prob);
  EXPECT_EQ(mixtral->moe_layer_step, 1);

  auto qwen = load_hf_config(kGoldenDir + "/qwen3-moe");
  ASSERT_TRUE(qwen.ok()) << qwen.error().message;
  EXPECT_EQ(qwen->n_expert, 8);
  EXPECT_EQ(qwen->n_expert_used, 2);
  EXPECT_EQ(qwen->n_ff_expert, 32);  // moe_intermediate_size
  EXPECT_EQ(qwen->n_ff, 128);
  EXPECT_TRUE(qwen->norm_topk_prob);
  EXPECT_TRUE(qwen->dense_layers.empty());

  auto next = load_hf_config(kGoldenDir + "/qwen3-next");
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->n_expert, 4);  // num_experts
  EXPECT_EQ(next->n_ff_shared_expert, 32);

  auto dense = load_hf_config(kGoldenDir + "/qwen3");
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->n_expert, 0);
}

// DeepSeek-V3 / GLM-4.5: n_routed_experts, ungated shared experts of
// n_shared_experts x moe_intermediate_size, the first layers dense.
TEST(MoeConfig, RoutedExpertConfigs) {
  for (const char* family : {"deepseek-v3", "glm4-moe"}) {
    auto c = load_hf_config(kGoldenDir + "/" + family);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->n_expert, 8) << family;
    EXPECT_EQ(c->n_expert_used, 2);
    EXPECT_EQ(c->n_ff_expert, 32);
    EXPECT_EQ(c->n_ff_shared_expert, 32);
    EXPECT_TRUE(c->norm_topk_prob);
    EXPECT_EQ(c->dense_layers, std::vector<int64_t>{0});
  }
  json j = {{"model_type", "glm4_moe"},   {"vocab_size", 100},        {"hidden_size", 64},
            {"num_hidden_layers", 4},     {"num_attention_heads", 4}, {"intermediate_size", 128},
            {"n_routed_experts", 8},      {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
            {"first_k_dense_replace", 2}, {"n_shared_experts", 2}};
  auto c = parse_hf_config(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->norm_topk_prob);  // transformers' default for these routers
  EXPECT_EQ(c->dense_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c->n_ff_shared_expert, 64);
  for (auto [key, value] : {std::pair<const char*, json>{"topk_method", "group_limited_greedy"},
                            {"scoring_func", "softmax"},
                            {"n_group", 3},
                            {"first_k_dense_replace", 5},
                            {"routed_scaling_factor", -1.0}}) {
    json bad = j;
    bad[key] = value;
    auto r = parse_hf_config(bad, "config.json");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.error().message.find(std::string("'") + key + "'"), std::string::npos) << r.error().message;
  }
}

json qwen3_moe() {
  return {{"model_type", "qwen3_moe"}, {"vocab_size", 100},        {"hidden_size", 64},
          {"num_hidden_layers", 4},    {"num_attention_heads", 4}, {"intermediate_size", 128},
          {"num_experts", 8},          {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}};
}

TEST(MoeConfig, DefaultsAndLayerRules) {
  // transformers' defaults: Qwen3-MoE does not renormalise, Qwen3-Next does,
  // Mixtral always does whatever the config says.
  auto c = parse_hf_config(qwen3_moe(), "config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FALSE(c->norm_topk_prob);
  json j = qwen3_moe();
  j["model_type"] = "qwen3_next";
  EXPECT_TRUE(parse_hf_config(j, "config.json")->norm_topk_prob);
  j["model_type"] = "mixtral";
  j["norm_topk_prob"] = false;
  EXPECT_TRUE(parse_hf_config(j, "config.json")->norm_topk_prob);

  j = qwen3_moe();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  c = parse_hf_config(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->moe_layer_step, 2);
  EXPECT_EQ(c->dense_layers, std::vector<int64_t>{3});

  j = qwen3_moe();
  j.erase("num_experts");
  j.erase("num_experts_per_tok");
  EXPECT_EQ(parse_hf_config(j, "config.json")->n_expert, 0);
}

TEST(MoeConfig, ErrorsNameTheField) {
  auto expect_error = [](json j, const std::string& field) {
    auto c = parse_hf_config(j, "dir/config.json");
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_NE(c.error().message.find("dir/config.json"), std::string::npos) << c.error().message;
    EXPECT_NE(c.error().message.find(field), std::string::npos) << c.error().message;
  };
  json j = qwen3_moe();
  j.erase("num_experts_per_tok");
  expect_error(j, "num_experts_per_tok");
  j = qwen3_moe();
  j["num_experts_per_tok"] = 9;
  expect_error(j, "num_experts_per_tok");
  j = qwen3_moe();
  j["mlp_only_layers"] = {4};
  expect_error(j, "mlp_only_layers");
  j = qwen3_moe();
  j["mlp_only_layers"] = "0";
  expect_error(j, "mlp_only_layers");
  j = qwen3_moe();
  j["norm_topk_prob"] = 1;
  expect_error(j, "norm_topk_prob");
}

TEST(MoeConfig, GgufExpertNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"blk.0.ffn_gate_inp.weight", "model.layers.0.mlp.gate.weight"},
      {"blk.5.ffn_gate_exps.weight", "model.layers.5.mlp.experts.gate_proj.weight"},
      {"blk.5.ffn_up_exps.weight", "model.layers.5.mlp.experts.up_proj.weight"},
      {"blk.5.ffn_down_exps.weight", "model.layers.5.mlp.experts.down_proj.weight"},
      {"blk.2.ffn_gate_shexp.weight", "model.layers.2.mlp.shared_expert.gate_proj.weight"},
      {"blk.2.ffn_up_shexp.weight", "model.layers.2.mlp.shared_expert.up_proj.weight"},
      {"blk.2.ffn_down_shexp.weight", "model.layers.2.mlp.shared_expert.down_proj.weight"},
      {"blk.2.ffn_gate_inp_shexp.weight", "model.layers.2.mlp.shared_expert_gate.weight"},
      // Older Mixtral files: one tensor per expert.
      {"blk.31.ffn_gate.7.weight", "model.layers.31.mlp.experts.7.gate_proj.weight"},
      {"blk.0.ffn_up.0.weight", "model.layers.0.mlp.experts.0.up_proj.weight"},
      {"blk.1.ffn_down.12.weight", "model.layers.1.mlp.experts.12.down_proj.weight"},
  };
  for (const auto& [gguf, hf] : kCases) EXPECT_EQ(gguf_to_hf_tensor_name(gguf), hf) << gguf;
  for (const char* name : {"blk.0.ffn_gate.x.weight", "blk.0.ffn_gate.01.weight", "blk.0.ffn_gate..weight",
                           "blk.0.ffn_gate.1.bias", "blk.0.ffn_gate.1", "blk.0.ffn_up.1.weight.x",
                           "blk.0.ffn_gate_exps.bias", "blk.0.ffn_down.1234567890.weight"}) {
    EXPECT_EQ(gguf_to_hf_tensor_name(name), std::nullopt) << name;
  }
}

testing::GgufWriter moe_file(const std::string& arch, uint32_t n_used = 8) {
  testing::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".context_length", 4096);
  w.add_u32(arch + ".embedding_length", 2048);
  w.add_u32(arch + ".block_count", 48);
  w.add_u32(arch + ".attention.head_count", 32);
  w.add_u32(arch + ".attention.head_count_kv", 4);
  w.add_u32(arch + ".attention.key_length", 128);
  w.add_u32(arch + ".vocab_size", 151936);
  w.add_u32(arch + ".expert_count", 128);
  w.add_u32(arch + ".expert_used_count", n_used);
  return w;
}

TEST(MoeConfig, GgufExpertKeys) {
  // Qwen3-30B-A3B's keys.
  testing::GgufWriter w = moe_file("qwen3moe");
  w.add_u32("qwen3moe.feed_forward_length", 6144);
  w.add_u32("qwen3moe.expert_feed_forward_length", 768);
  auto file = testing::parse_image(w.build());
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto c = gguf_model_config(**file);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "qwen3_moe");
  EXPECT_EQ(c->rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c->n_expert, 128);
  EXPECT_EQ(c->n_expert_used, 8);
  EXPECT_EQ(c->n_ff_expert, 768);
  EXPECT_EQ(c->n_ff, 6144);
  EXPECT_TRUE(c->norm_topk_prob);

  // No feed_forward_length: experts only.
  w = moe_file("qwen3moe");
  w.add_u32("qwen3moe.expert_feed_forward_length", 768);
  w.add_bool("qwen3moe.expert_weights_norm", false);
  c = gguf_model_config(*testing::parse_image(w.build()).value());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->n_ff, 0);
  EXPECT_FALSE(c->norm_topk_prob);

  // llama.cpp writes Mixtral as "llama" with experts (n_ff: the experts').
  w = moe_file("llama");
  w.add_u32("llama.feed_forward_length", 14336);
  c = gguf_model_config(*testing::parse_image(w.build()).value());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "mixtral");
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c->n_ff_expert, 14336);

  w = moe_file("llama", 129);
  w.add_u32("llama.feed_forward_length", 14336);
  c = gguf_model_config(*testing::parse_image(w.build()).value());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("expert_used_count"), std::string::npos) << c.error().message;

  auto bad = moe_file("qwen3moe");
  bad.add_u32("qwen3moe.feed_forward_length", 6144);
  bad.add_string("qwen3moe.expert_weights_norm", "yes");
  c = gguf_model_config(*testing::parse_image(bad.build()).value());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("expert_weights_norm"), std::string::npos) << c.error().message;

  // Neither feed_forward_length nor expert_feed_forward_length.
  c = gguf_model_config(*testing::parse_image(moe_file("qwen3moe").build()).value());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("expert_feed_forward_length"), std::string::npos) << c.error().message;
}

}  // namespace
}  // namespace rill
