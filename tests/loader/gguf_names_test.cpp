// GGUF -> Hugging Face tensor names and GGUF metadata -> ModelConfig.
#include "loader/gguf_names.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <tuple>

#include "gguf_writer.h"
#include "loader/model_files.h"
#include "loader/mtp_layers.h"

namespace rill {
namespace {

using testing::GgufWriter;
using testing::parse_image;

TEST(GgufNames, MapsLlamaFamilyNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"},
      {"blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight"},
      {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"},
      {"blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"},
      {"blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"},
      {"blk.3.attn_output.bias", "model.layers.3.self_attn.o_proj.bias"},
      {"blk.7.attn_q_norm.weight", "model.layers.7.self_attn.q_norm.weight"},
      {"blk.7.attn_k_norm.weight", "model.layers.7.self_attn.k_norm.weight"},
      {"blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"},
      {"blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"},
      {"blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"},
      {"blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"},
  };
  for (const auto& [gguf, hf] : kCases) EXPECT_EQ(gguf_to_hf_tensor_name(gguf), hf) << gguf;
}

// llama.cpp's MTP tensors (blk.N.nextn.*, N past the decoder layers) take
// DeepSeek-V3's Hugging Face names (loader/mtp_layers.h), in every family.
TEST(GgufNames, MapsNextnNamesToDeepSeekMtpNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"blk.46.nextn.eh_proj.weight", "model.layers.46.eh_proj.weight"},
      {"blk.46.nextn.enorm.weight", "model.layers.46.enorm.weight"},
      {"blk.46.nextn.hnorm.weight", "model.layers.46.hnorm.weight"},
      {"blk.46.nextn.embed_tokens.weight", "model.layers.46.embed_tokens.weight"},
      {"blk.46.nextn.shared_head_head.weight", "model.layers.46.shared_head.head.weight"},
      {"blk.46.nextn.shared_head_norm.weight", "model.layers.46.shared_head.norm.weight"},
  };
  for (const char* arch : {"glm4moe", "deepseek2", "glm-dsa", "qwen35moe", "llama"}) {
    for (const auto& [gguf, hf] : kCases) EXPECT_EQ(gguf_to_hf_tensor_name(gguf, arch), hf) << arch << " " << gguf;
  }
}

// Gemma 2/3 files name their sandwich norms differently: ffn_norm is the
// norm before the MLP there, and the post norms have names of their own.
TEST(GgufNames, MapsGemmaNamesPerArchitecture) {
  const std::pair<const char*, const char*> kCases[] = {
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.0.post_attention_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
      {"blk.4.ffn_norm.weight", "model.layers.4.pre_feedforward_layernorm.weight"},
      {"blk.4.post_ffw_norm.weight", "model.layers.4.post_feedforward_layernorm.weight"},
      {"blk.2.attn_q_norm.weight", "model.layers.2.self_attn.q_norm.weight"},
      {"blk.2.ffn_gate.weight", "model.layers.2.mlp.gate_proj.weight"},
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
  };
  for (const char* arch : {"gemma2", "gemma3"}) {
    std::set<std::string> seen;
    for (const auto& [gguf, hf] : kCases) {
      EXPECT_EQ(gguf_to_hf_tensor_name(gguf, arch), hf) << arch << " " << gguf;
      EXPECT_TRUE(seen.insert(hf).second) << hf;
    }
  }
  // Other architectures keep the Llama meaning of ffn_norm; Gemma-only names stay unmapped.
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.4.ffn_norm.weight", "llama"), "model.layers.4.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.4.post_ffw_norm.weight", "qwen2"), std::nullopt);
}

TEST(GgufNames, UnknownNamesStayUnmapped) {
  for (const char* name : {"rope_freqs.weight", "blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q",
                           "blk.0.unknown.weight", "blk.0", "blk..attn_q.weight", "blk.-1.attn_q.weight",
                           "blk.1234567890.attn_q.weight", "", "blk.", "token_embd.weight.x", "xblk.0.attn_q.weight"}) {
    EXPECT_EQ(gguf_to_hf_tensor_name(name), std::nullopt) << name;
  }
}

// A small llama file with every config key (values as in SmolLM2 where possible).
GgufWriter llama_file(std::string_view arch = "llama", uint32_t context_length = 8192) {
  const std::string a(arch);
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(a + ".context_length", context_length);
  w.add_u32(a + ".embedding_length", 576);
  w.add_u32(a + ".block_count", 30);
  w.add_u32(a + ".feed_forward_length", 1536);
  w.add_u32(a + ".attention.head_count", 9);
  w.add_u32(a + ".attention.head_count_kv", 3);
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f32(a + ".rope.freq_base", 100000.0f);
  w.add_u32(a + ".rope.dimension_count", 64);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  std::vector<std::string> tokens;
  for (int i = 0; i < 2000; ++i) tokens.push_back("t" + std::to_string(i));
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_array<int32_t>("small", GgufType::kI32, {1, 2});
  return w;
}

ModelConfig config_of(const GgufWriter& w) {
  const auto image = w.build();
  auto f = parse_image(image);
  if (!f.ok()) {
    ADD_FAILURE() << f.error().message;
    return {};
  }
  auto c = gguf_model_config(**f);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : ModelConfig{};
}

std::string config_error(const GgufWriter& w) {
  const auto image = w.build();
  auto f = parse_image(image);
  if (!f.ok()) return "(parse error) " + f.error().message;
  auto c = gguf_model_config(**f);
  return c.ok() ? "(no error)" : c.error().message;
}

TEST(GgufConfig, LlamaKeysFillTheConfig) {
  const ModelConfig c = config_of(llama_file());
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_vocab, 2000);  // from the token list: no llama.vocab_size
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_head_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1536);
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.generation.bos_token_id, 1);
  EXPECT_EQ(c.generation.eos_token_ids, std::vector<int32_t>{2});
  // raw: metadata without the big tokenizer arrays, f32 at f32 precision.
  EXPECT_FALSE(c.raw.contains("tokenizer.ggml.tokens"));
  EXPECT_EQ(c.raw["small"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(c.raw["llama.attention.layer_norm_rms_epsilon"].dump(), "1e-05");
  EXPECT_EQ(c.raw["general.architecture"], "llama");
}

TEST(GgufConfig, DefaultsAndExplicitKeys) {
  GgufWriter with_output;
  with_output.add_string("general.architecture", "qwen2");
  with_output.add_u32("qwen2.context_length", 4096);
  with_output.add_u32("qwen2.embedding_length", 256);
  with_output.add_u32("qwen2.block_count", 2);
  with_output.add_u32("qwen2.feed_forward_length", 512);
  with_output.add_u32("qwen2.attention.head_count", 8);
  with_output.add_u32("qwen2.vocab_size", 100);
  with_output.add_u32("tokenizer.ggml.eos_token_id", 7);
  with_output.add_u32("tokenizer.ggml.eot_token_id", 9);
  with_output.add_tensor("output.weight", 0, {4}, std::vector<uint8_t>(16));
  const ModelConfig c = config_of(with_output);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c.n_head_kv, 8);  // = head_count
  EXPECT_EQ(c.head_dim, 32);  // n_embd / n_head
  EXPECT_EQ(c.rope_dim, 32);  // = head_dim
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.n_vocab, 100);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.generation.bos_token_id, std::nullopt);
  EXPECT_EQ(c.generation.eos_token_ids, (std::vector<int32_t>{7, 9}));

  GgufWriter q3 = llama_file("qwen3");
  q3.add_u32("qwen3.attention.key_length", 128);
  q3.add_u32("qwen3.attention.sliding_window", 4096);
  const ModelConfig c3 = config_of(q3);
  EXPECT_EQ(c3.architecture, "qwen3");
  EXPECT_EQ(c3.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c3.head_dim, 128);
  EXPECT_EQ(c3.rope_dim, 64);  // partial rotary, as written
  EXPECT_EQ(c3.sliding_window, 4096);
}

TEST(GgufConfig, GemmaArchitecturesMapToTheirModelTypes) {
  GgufWriter g2 = llama_file("gemma2");
  g2.add_u32("gemma2.attention.sliding_window", 4096);
  g2.add_f32("gemma2.attn_logit_softcapping", 50.0f);
  const ModelConfig c2 = config_of(g2);
  EXPECT_EQ(c2.architecture, "gemma2");
  EXPECT_EQ(c2.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c2.sliding_window, 4096);
  EXPECT_EQ(c2.raw["gemma2.attn_logit_softcapping"], 50.0);
  const ModelConfig c3 = config_of(llama_file("gemma3"));
  EXPECT_EQ(c3.architecture, "gemma3_text");
  EXPECT_EQ(c3.rope_style, RopeStyle::kHalf);
}

TEST(GgufConfig, RopeScaling) {
  GgufWriter w = llama_file("qwen2");
  w.add_string("qwen2.rope.scaling.type", "yarn");
  w.add_f32("qwen2.rope.scaling.factor", 4.0f);
  w.add_u32("qwen2.rope.scaling.original_context_length", 32768);
  ModelConfig c = config_of(w);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 32768);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0f);
  EXPECT_EQ(c.rope_scaling.attention_factor, std::nullopt);

  w = llama_file();
  w.add_string("llama.rope.scaling.type", "linear");
  w.add_f32("llama.rope.scaling.factor", 2.0f);
  c = config_of(w);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 2.0f);

  w = llama_file();
  w.add_string("llama.rope.scaling.type", "none");
  EXPECT_EQ(config_of(w).rope_scaling.type, RopeScaling::Type::kNone);

  w = llama_file();
  w.add_string("llama.rope.scaling.type", "longrope");
  EXPECT_EQ(config_error(w), "x.gguf: unsupported 'llama.rope.scaling.type' value 'longrope'");
}

TEST(GgufConfig, ErrorsNameTheFileAndKey) {
  GgufWriter w;
  w.add_string("general.architecture", "foo");
  EXPECT_EQ(config_error(w), "x.gguf: unsupported architecture 'foo'");
  EXPECT_EQ(config_error(GgufWriter()), "x.gguf: missing metadata key 'general.architecture'");

  w = GgufWriter();
  w.add_string("general.architecture", "llama");
  EXPECT_EQ(config_error(w), "x.gguf: missing metadata key 'llama.embedding_length'");

  auto broken = [](const std::string& key, auto value, GgufType type) {
    GgufWriter b;
    b.add_string("general.architecture", "llama");
    const std::pair<const char*, uint32_t> kKeys[] = {
        {"llama.context_length", 8192},      {"llama.embedding_length", 576},   {"llama.block_count", 30},
        {"llama.feed_forward_length", 1536}, {"llama.attention.head_count", 9}, {"llama.attention.head_count_kv", 3}};
    for (const auto& [k, v] : kKeys)
      if (key != k) b.add_u32(k, v);
    b.add(key, type, value);
    return b;
  };
  EXPECT_EQ(config_error(broken("llama.block_count", int32_t{-3}, GgufType::kI32)),
            "x.gguf: 'llama.block_count' must be a positive integer");
  EXPECT_EQ(config_error(broken("llama.attention.head_count_kv", uint32_t{4}, GgufType::kU32)),
            "x.gguf: attention.head_count 9 is not a multiple of head_count_kv 4");
  EXPECT_EQ(config_error(broken("llama.attention.head_count", uint32_t{1000}, GgufType::kU32)),
            "x.gguf: attention.head_count 1000 is not a multiple of head_count_kv 3");
  EXPECT_EQ(config_error(broken("llama.embedding_length", 1.5f, GgufType::kF32)),
            "x.gguf: 'llama.embedding_length' must be a positive integer");
  // No vocab size anywhere.
  EXPECT_NE(config_error(broken("llama.rope.freq_base", 1e4f, GgufType::kF32)).find("vocabulary size"),
            std::string::npos);
  // A NaN epsilon.
  GgufWriter bad_eps = broken("llama.attention.layer_norm_rms_epsilon", std::nanf(""), GgufType::kF32);
  bad_eps.add_u32("llama.vocab_size", 10);
  EXPECT_EQ(config_error(bad_eps), "x.gguf: 'llama.attention.layer_norm_rms_epsilon' must be a positive number");
}

TEST(GgufConfig, RawMetadataIsValidJsonEvenForBadUtf8) {
  GgufWriter w = llama_file();
  w.add_string("general.name", "ok \xff\xc3 \xe2\x82\xac");
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.raw["general.name"], "ok \xEF\xBF\xBD\xEF\xBF\xBD \xe2\x82\xac");
  EXPECT_NO_THROW((void)c.raw.dump());
}

TEST(GgufConfig, DefaultModel) {
  const std::string path = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto r = gguf_model_config(**f);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_vocab, 49152);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_head_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1536);
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);  // SmolLM2 has no output.weight
  EXPECT_EQ(c.generation.bos_token_id, 1);
  EXPECT_EQ(c.generation.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(c.raw.contains("tokenizer.ggml.tokens"));
  EXPECT_FALSE(c.raw.contains("tokenizer.ggml.merges"));
  EXPECT_TRUE(c.raw.contains("tokenizer.chat_template"));
  EXPECT_EQ(c.raw["llama.rope.freq_base"], 100000.0);

  // Every tensor of the model maps to a canonical name, and no two collide.
  std::set<std::string> names;
  for (const auto& t : (*f)->tensors()) {
    auto hf = gguf_to_hf_tensor_name(t.name);
    ASSERT_TRUE(hf.has_value()) << t.name;
    EXPECT_TRUE(names.insert(*hf).second) << *hf;
  }
  EXPECT_EQ(names.size(), 272u);
  EXPECT_TRUE(names.count("model.layers.29.mlp.down_proj.weight"));
}

// llama.cpp's qwen35 / qwen3next names: the linear-attention layers' ssm_*
// tensors and attn_qkv / attn_gate map to Hugging Face's linear_attn.*;
// other architectures leave them unmapped.
TEST(GgufNames, MapsHybridNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"blk.0.attn_qkv.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"},
      {"blk.0.attn_gate.weight", "model.layers.0.linear_attn.in_proj_z.weight"},
      {"blk.0.ssm_beta.weight", "model.layers.0.linear_attn.in_proj_b.weight"},
      {"blk.0.ssm_alpha.weight", "model.layers.0.linear_attn.in_proj_a.weight"},
      {"blk.0.ssm_ba.weight", "model.layers.0.linear_attn.in_proj_ba.weight"},
      {"blk.0.ssm_in.weight", "model.layers.0.linear_attn.in_proj_qkvz.weight"},
      {"blk.0.ssm_conv1d.weight", "model.layers.0.linear_attn.conv1d.weight"},
      {"blk.0.ssm_dt.bias", "model.layers.0.linear_attn.dt_bias"},
      {"blk.0.ssm_a", "model.layers.0.linear_attn.A"},
      {"blk.0.ssm_norm.weight", "model.layers.0.linear_attn.norm.weight"},
      {"blk.0.ssm_out.weight", "model.layers.0.linear_attn.out_proj.weight"},
      {"blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
      {"blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
      {"blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"},
      {"blk.3.ffn_gate_exps.weight", "model.layers.3.mlp.experts.gate_proj.weight"},
      {"blk.3.ffn_gate_inp_shexp.weight", "model.layers.3.mlp.shared_expert_gate.weight"},
  };
  for (const char* arch : {"qwen35", "qwen3next"}) {
    std::set<std::string> seen;
    for (const auto& [gguf, hf] : kCases) {
      EXPECT_EQ(gguf_to_hf_tensor_name(gguf, arch), hf) << arch << " " << gguf;
      EXPECT_TRUE(seen.insert(hf).second) << hf;
    }
  }
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.ssm_a", "qwen3"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_gate.weight", "llama"), std::nullopt);
}

GgufWriter hybrid_file(uint32_t n_blocks = 4, uint32_t inner_size = 64) {
  GgufWriter w;
  w.add_string("general.architecture", "qwen35");
  w.add_u32("qwen35.context_length", 512);
  w.add_u32("qwen35.embedding_length", 64);
  w.add_u32("qwen35.block_count", n_blocks);
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
  w.add_u32("qwen35.ssm.inner_size", inner_size);
  return w;
}

TEST(GgufConfig, HybridKeysBecomeTheHuggingFaceFields) {
  GgufWriter w = hybrid_file();
  w.add_array<uint8_t>("qwen35.attention.recurrent_layers", GgufType::kBool, {1, 0, 1, 0});
  ModelConfig c = config_of(w);
  EXPECT_EQ(c.architecture, "qwen3_5_text");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.rope_dim, 4);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.raw["linear_conv_kernel_dim"], 4);
  EXPECT_EQ(c.raw["linear_key_head_dim"], 16);
  EXPECT_EQ(c.raw["linear_value_head_dim"], 16);
  EXPECT_EQ(c.raw["linear_num_key_heads"], 2);
  EXPECT_EQ(c.raw["linear_num_value_heads"], 4);
  EXPECT_EQ(c.raw["layer_types"],
            nlohmann::json({"linear_attention", "full_attention", "linear_attention", "full_attention"}));

  // Without the list: every full_attention_interval-th layer is full attention.
  w = hybrid_file();
  w.add_u32("qwen35.full_attention_interval", 2);
  EXPECT_EQ(config_of(w).raw["layer_types"], c.raw["layer_types"]);

  // Multi-token-prediction blocks come last and are not decoder layers.
  w = hybrid_file(5);
  w.add_u32("qwen35.nextn_predict_layers", 1);
  w.add_array<uint8_t>("qwen35.attention.recurrent_layers", GgufType::kBool, {1, 0, 1, 0, 0});
  c = config_of(w);
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.raw["layer_types"].size(), 4u);
}

TEST(GgufConfig, HybridErrorsNameTheFileAndKey) {
  GgufWriter w;
  w.add_string("general.architecture", "qwen3next");
  for (const char* k : {"context_length", "embedding_length", "block_count", "feed_forward_length",
                        "attention.head_count", "vocab_size"}) {
    w.add_u32(std::string("qwen3next.") + k, 64);
  }
  EXPECT_EQ(config_error(w), "x.gguf: missing metadata key 'qwen3next.ssm.conv_kernel'");

  w = hybrid_file();
  w.add_array<uint8_t>("qwen35.attention.recurrent_layers", GgufType::kBool, {1, 0, 1});
  EXPECT_EQ(config_error(w),
            "x.gguf: 'qwen35.attention.recurrent_layers' has 3 entries, expected 4 "
            "('qwen35.block_count')");
  w = hybrid_file();
  w.add_array<float>("qwen35.attention.recurrent_layers", GgufType::kF32, {1, 0, 1, 0});
  EXPECT_EQ(config_error(w), "x.gguf: 'qwen35.attention.recurrent_layers' must hold booleans");
  w = hybrid_file();
  w.add_u32("qwen35.nextn_predict_layers", 4);
  EXPECT_EQ(config_error(w),
            "x.gguf: 'qwen35.nextn_predict_layers' (4) leaves no decoder layers of "
            "'qwen35.block_count' (4)");
  // A hostile layer count is refused before any per-layer loop runs.
  EXPECT_EQ(config_error(hybrid_file(0xFFFFFFFFu)), "x.gguf: 'qwen35.block_count' (4294967295) exceeds 4096 layers");
  EXPECT_EQ(config_error(hybrid_file(4, 63)),
            "x.gguf: 'qwen35.ssm.inner_size' (63) is not a multiple of 'qwen35.ssm.time_step_rank' (4)");
}

}  // namespace
}  // namespace rill

namespace rill {
namespace {

// llama.cpp's gpt-oss names: post_attention_norm is the norm before the MoE
// FFN, attn_sinks the per-head sink logits, and the router and the stacked
// experts carry biases; "gpt-oss" files are the gpt_oss model type.
TEST(GgufNames, MapsGptOssNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"blk.1.attn_sinks.weight", "model.layers.1.self_attn.sinks"},
      {"blk.1.ffn_gate_inp.weight", "model.layers.1.mlp.router.weight"},
      {"blk.1.ffn_gate_inp.bias", "model.layers.1.mlp.router.bias"},
      {"blk.1.ffn_gate_exps.weight", "model.layers.1.mlp.experts.gate_proj.weight"},
      {"blk.1.ffn_gate_exps.bias", "model.layers.1.mlp.experts.gate_proj.bias"},
      {"blk.1.ffn_up_exps.bias", "model.layers.1.mlp.experts.up_proj.bias"},
      {"blk.1.ffn_down_exps.weight", "model.layers.1.mlp.experts.down_proj.weight"},
      {"blk.1.ffn_down_exps.bias", "model.layers.1.mlp.experts.down_proj.bias"},
      {"blk.1.attn_q.bias", "model.layers.1.self_attn.q_proj.bias"},
      {"blk.1.attn_output.bias", "model.layers.1.self_attn.o_proj.bias"},
      {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
  };
  std::set<std::string> seen;
  for (const auto& [gguf, hf] : kCases) {
    EXPECT_EQ(gguf_to_hf_tensor_name(gguf, "gpt-oss"), hf) << gguf;
    EXPECT_TRUE(seen.insert(hf).second) << hf;
  }
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.1.attn_sinks.weight", "llama"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.1.ffn_gate_inp.weight", "qwen3moe"), "model.layers.1.mlp.gate.weight");

  GgufWriter w = llama_file("gpt-oss");
  w.add_u32("gpt-oss.expert_count", 32);
  w.add_u32("gpt-oss.expert_used_count", 4);
  w.add_u32("gpt-oss.expert_feed_forward_length", 2880);
  w.add_u32("gpt-oss.attention.sliding_window", 128);
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.architecture, "gpt_oss");
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c.n_expert, 32);
  EXPECT_EQ(c.n_ff_expert, 2880);
  EXPECT_EQ(c.sliding_window, 128);
}

TEST(GgufNames, MapsMlaRoutedMoeAndGemma4Names) {
  const std::tuple<const char*, const char*, const char*> kCases[] = {
      {"deepseek2", "blk.0.attn_q_a.weight", "model.layers.0.self_attn.q_a_proj.weight"},
      {"deepseek2", "blk.0.attn_kv_a_mqa.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"},
      {"deepseek2", "blk.0.attn_k_b.weight", "model.layers.0.self_attn.k_b_proj.weight"},
      {"deepseek2", "blk.0.attn_v_b.weight", "model.layers.0.self_attn.v_b_proj.weight"},
      {"deepseek2", "blk.1.exp_probs_b.bias", "model.layers.1.mlp.gate.e_score_correction_bias"},
      {"deepseek2", "blk.1.ffn_up_shexp.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"},
      {"minicpm3", "blk.2.attn_kv_b.weight", "model.layers.2.self_attn.kv_b_proj.weight"},
      {"glm4moe", "blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"glm4moe", "blk.1.ffn_gate_exps.weight", "model.layers.1.mlp.experts.gate_proj.weight"},
      {"qwen3moe", "blk.1.ffn_up_shexp.weight", "model.layers.1.mlp.shared_expert.up_proj.weight"},
      {"glm-dsa", "blk.0.attn_k_b.weight", "model.layers.0.self_attn.k_b_proj.weight"},
      {"glm-dsa", "blk.0.attn_q_b.weight", "model.layers.0.self_attn.q_b_proj.weight"},
      {"glm-dsa", "blk.0.indexer.attn_q_b.weight", "model.layers.0.self_attn.indexer.wq_b.weight"},
      {"glm-dsa", "blk.0.indexer.attn_k.weight", "model.layers.0.self_attn.indexer.wk.weight"},
      {"glm-dsa", "blk.0.indexer.k_norm.weight", "model.layers.0.self_attn.indexer.k_norm.weight"},
      {"glm-dsa", "blk.0.indexer.k_norm.bias", "model.layers.0.self_attn.indexer.k_norm.bias"},
      {"glm-dsa", "blk.0.indexer.proj.weight", "model.layers.0.self_attn.indexer.weights_proj.weight"},
      {"glm-dsa", "blk.3.exp_probs_b.bias", "model.layers.3.mlp.gate.e_score_correction_bias"},
      {"glm-dsa", "blk.3.ffn_down_exps.weight", "model.layers.3.mlp.experts.down_proj.weight"},
      {"glm-dsa", "blk.3.ffn_gate_shexp.weight", "model.layers.3.mlp.shared_experts.gate_proj.weight"},
      {"gemma4", "per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"},
      {"gemma4", "blk.3.layer_output_scale.weight", "model.layers.3.layer_scalar"},
      {"gemma4", "blk.3.proj.weight", "model.layers.3.per_layer_projection.weight"},
      {"gemma4", "blk.3.ffn_gate_up_exps.weight", "model.layers.3.experts.gate_up_proj"},
      {"gemma4", "blk.3.ffn_down_exps.scale", "model.layers.3.router.per_expert_scale"},
      {"gemma4", "blk.3.ffn_norm.weight", "model.layers.3.pre_feedforward_layernorm.weight"},
  };
  for (const auto& [arch, gguf, hf] : kCases) EXPECT_EQ(gguf_to_hf_tensor_name(gguf, arch), hf) << arch << " " << gguf;
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.attn_k_b.weight", "llama"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.3.proj.weight", "gemma3"), std::nullopt);
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.0.indexer.attn_k.weight", "deepseek2"), std::nullopt);
}

// deepseek2 / glm4moe: llama.cpp's defaults for the sigmoid router's keys.
TEST(GgufConfig, RoutedMoeKeysBecomeTheHuggingFaceFields) {
  GgufWriter w = llama_file("glm4moe");
  w.add_u32("glm4moe.expert_count", 8);
  w.add_u32("glm4moe.expert_used_count", 2);
  w.add_u32("glm4moe.expert_feed_forward_length", 32);
  w.add_u32("glm4moe.expert_shared_count", 1);
  w.add_u32("glm4moe.leading_dense_block_count", 2);
  w.add_u32("glm4moe.nextn_predict_layers", 1);
  w.add_u32("glm4moe.expert_group_count", 4);
  w.add_u32("glm4moe.expert_group_used_count", 2);
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.architecture, "glm4_moe");
  EXPECT_EQ(c.n_layer, 29);  // the MTP block left out
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c.n_ff_shared_expert, 32);
  EXPECT_FALSE(c.norm_topk_prob);  // no expert_weights_norm: llama.cpp does not renormalise
  EXPECT_EQ(c.raw.at("n_routed_experts"), 8);
  EXPECT_EQ(c.raw.at("n_group"), 4);
  EXPECT_EQ(c.raw.at("topk_group"), 2);
  EXPECT_EQ(c.raw.at("routed_scaling_factor"), 1.0);

  GgufWriter d = llama_file("deepseek2");
  d.add_u32("deepseek2.expert_count", 8);
  d.add_u32("deepseek2.expert_used_count", 2);
  d.add_u32("deepseek2.expert_feed_forward_length", 32);
  d.add_u32("deepseek2.expert_gating_func", 1);
  EXPECT_EQ(config_error(d),
            "x.gguf: 'deepseek2.expert_gating_func' is 1: only the sigmoid router (2) is supported for deepseek_v3");
}

// minicpm: the muP keys become config.json's scale_emb, scale_depth
// (residual_scale x sqrt(n_layer)) and dim_model_base (n_embd /
// logit_scale); a file without them gets MiniCPM-2B's 12, 1.4 and 256.
TEST(GgufConfig, MinicpmScalesBecomeTheHuggingFaceFields) {
  GgufWriter w = llama_file("minicpm");  // 30 blocks, 576 wide
  w.add_f32("minicpm.embedding_scale", 10.0f);
  w.add_f32("minicpm.residual_scale", 0.25f);
  w.add_f32("minicpm.logit_scale", 4.5f);
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.architecture, "minicpm");
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);  // q/k permuted as llama's
  EXPECT_DOUBLE_EQ(c.raw.at("scale_emb").get<double>(), 10.0);
  EXPECT_NEAR(c.raw.at("scale_depth").get<double>(), 0.25 * std::sqrt(30.0), 1e-12);
  EXPECT_DOUBLE_EQ(c.raw.at("dim_model_base").get<double>(), 128.0);

  const ModelConfig d = config_of(llama_file("minicpm"));
  EXPECT_DOUBLE_EQ(d.raw.at("scale_emb").get<double>(), 12.0);
  EXPECT_NEAR(d.raw.at("scale_depth").get<double>(), 1.4, 1e-6);
  EXPECT_NEAR(d.raw.at("dim_model_base").get<double>(), 256.0, 1e-4);

  GgufWriter bad = llama_file("minicpm");
  bad.add_f32("minicpm.logit_scale", -1.0f);
  EXPECT_EQ(config_error(bad), "x.gguf: 'minicpm.logit_scale' must be a positive number");
}

// glm-dsa (GLM-5) with GLM-5's sizes: the MLA, router and indexer keys
// become the Hugging Face fields model/arch/deepseek_config.cpp reads.
GgufWriter glm_dsa_file(uint32_t context_length = 8192) {
  GgufWriter w = llama_file("glm-dsa", context_length);  // 30 blocks, rope.dimension_count 64
  w.add_u32("glm-dsa.expert_count", 8);
  w.add_u32("glm-dsa.expert_used_count", 2);
  w.add_u32("glm-dsa.expert_feed_forward_length", 32);
  w.add_u32("glm-dsa.expert_shared_count", 1);
  w.add_u32("glm-dsa.leading_dense_block_count", 3);
  w.add_u32("glm-dsa.nextn_predict_layers", 1);
  w.add_u32("glm-dsa.attention.q_lora_rank", 2048);
  w.add_u32("glm-dsa.attention.kv_lora_rank", 512);
  w.add_u32("glm-dsa.attention.key_length", 512 + 64);
  w.add_u32("glm-dsa.attention.value_length", 512);
  w.add_u32("glm-dsa.attention.key_length_mla", 192 + 64);
  w.add_u32("glm-dsa.attention.value_length_mla", 256);
  return w;
}

void add_indexer(GgufWriter& w, uint32_t top_k = 2048) {
  w.add_u32("glm-dsa.attention.indexer.head_count", 32);
  w.add_u32("glm-dsa.attention.indexer.key_length", 128);
  w.add_u32("glm-dsa.attention.indexer.top_k", top_k);
}

TEST(GgufConfig, GlmDsaKeysBecomeTheHuggingFaceFields) {
  GgufWriter w = glm_dsa_file();
  add_indexer(w);
  std::vector<uint8_t> types(29, 0);
  for (size_t il = 0; il < types.size(); il += 3) types[il] = 1;
  w.add_array<uint8_t>("glm-dsa.attention.indexer.types", GgufType::kBool, types);
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.architecture, "glm_moe_dsa");
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.n_layer, 29);  // the MTP block left out
  EXPECT_EQ(c.n_head_kv, c.n_head);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.raw.at("q_lora_rank"), 2048);
  EXPECT_EQ(c.raw.at("kv_lora_rank"), 512);
  EXPECT_EQ(c.raw.at("qk_nope_head_dim"), 192);
  EXPECT_EQ(c.raw.at("qk_rope_head_dim"), 64);
  EXPECT_EQ(c.raw.at("v_head_dim"), 256);
  EXPECT_EQ(c.raw.at("rope_interleave"), true);
  EXPECT_EQ(c.raw.at("index_n_heads"), 32);
  EXPECT_EQ(c.raw.at("index_head_dim"), 128);
  EXPECT_EQ(c.raw.at("index_topk"), 2048);
  nlohmann::json want = nlohmann::json::array();
  for (uint8_t t : types) want.push_back(t ? "full" : "shared");
  EXPECT_EQ(c.raw.at("indexer_types"), want);
}

// Without attention.indexer.types llama.cpp gives GLM-5 / 5.1 files (context
// below 2^20) an indexer on every layer and longer ones GLM-5.2's pattern.
// No expert_gating_func: llama.cpp's glm-dsa routes with a sigmoid.
TEST(GgufConfig, GlmDsaIndexerTypesDefaultAsLlamaCppReadsThem) {
  GgufWriter w = glm_dsa_file();
  add_indexer(w);
  const ModelConfig c = config_of(w);
  EXPECT_EQ(c.raw.at("indexer_types"), nlohmann::json(std::vector<std::string>(29, "full")));
  EXPECT_EQ(c.raw.at("n_routed_experts"), 8);

  GgufWriter l = glm_dsa_file(1048576);
  add_indexer(l);
  const ModelConfig c52 = config_of(l);
  std::vector<std::string> want;
  for (int il = 0; il < 29; ++il) want.push_back(il < 2 || (il - 2) % 4 == 0 ? "full" : "shared");
  EXPECT_EQ(c52.raw.at("indexer_types"), nlohmann::json(want));

  GgufWriter one = glm_dsa_file();
  add_indexer(one);
  one.add_bool("glm-dsa.attention.indexer.types", true);  // one value for every layer
  EXPECT_EQ(config_of(one).raw.at("indexer_types"), nlohmann::json(std::vector<std::string>(29, "full")));
}

TEST(GgufConfig, GlmDsaErrorsNameTheKey) {
  GgufWriter none = glm_dsa_file();
  EXPECT_EQ(config_error(none), "x.gguf: missing metadata key 'glm-dsa.attention.indexer.head_count'");

  GgufWriter zero = glm_dsa_file();
  add_indexer(zero, 0);
  EXPECT_EQ(config_error(zero), "x.gguf: 'glm-dsa.attention.indexer.top_k' must be a positive integer");

  GgufWriter len = glm_dsa_file();
  add_indexer(len);
  len.add_array<uint8_t>("glm-dsa.attention.indexer.types", GgufType::kBool, std::vector<uint8_t>(30, 1));
  EXPECT_EQ(config_error(len),
            "x.gguf: 'glm-dsa.attention.indexer.types' has 30 entries, expected 29 (one per decoder layer)");

  GgufWriter str = glm_dsa_file();
  add_indexer(str);
  str.add_string_array("glm-dsa.attention.indexer.types", std::vector<std::string>(29, "full"));
  EXPECT_EQ(config_error(str), "x.gguf: 'glm-dsa.attention.indexer.types' must hold booleans");

  GgufWriter first = glm_dsa_file();
  add_indexer(first);
  first.add_bool("glm-dsa.attention.indexer.types", false);
  EXPECT_EQ(config_error(first),
            "x.gguf: 'glm-dsa.attention.indexer.types' makes layer 0 shared (it has no full layer before it)");

  GgufWriter softmax = glm_dsa_file();
  add_indexer(softmax);
  softmax.add_u32("glm-dsa.expert_gating_func", 1);
  EXPECT_EQ(config_error(softmax),
            "x.gguf: 'glm-dsa.expert_gating_func' is 1: only the sigmoid router (2) is supported for glm_moe_dsa");
}

// The fuzz seed tools/make_gguf_fuzz_seeds.py writes for glm-dsa (written by
// the gguf package) is a whole config, so fuzzing starts inside read_dsa.
TEST(GgufConfig, GlmDsaFuzzSeedIsAConfig) {
  std::ifstream in(std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/glm_dsa_tiny.gguf", std::ios::binary);
  const std::vector<uint8_t> image{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_FALSE(image.empty());
  auto f = parse_image(image);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto c = gguf_model_config(**f);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "glm_moe_dsa");
  EXPECT_EQ(c->n_layer, 2);  // the MTP block left out
  EXPECT_EQ(c->raw.at("indexer_types"), nlohmann::json({"full", "shared"}));
  EXPECT_EQ(gguf_to_hf_tensor_name("blk.2.nextn.eh_proj.weight", "glm-dsa"), "model.layers.2.eh_proj.weight");
}

// The minicpm fuzz seed (MiniCPM 4's scale keys and LongRoPE factors) is a
// whole config too, so fuzzing starts inside read_minicpm / read_longrope.
TEST(GgufConfig, MinicpmLongRopeFuzzSeedIsAConfig) {
  std::ifstream in(std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/minicpm_longrope_tiny.gguf",
                   std::ios::binary);
  const std::vector<uint8_t> image{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_FALSE(image.empty());
  auto f = parse_image(image);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto c = gguf_model_config(**f);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "minicpm");
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(c->rope_scaling.short_factor, std::vector<float>(4, 1.5f));
  EXPECT_EQ(c->rope_scaling.long_factor, std::vector<float>(4, 4.0f));
  EXPECT_EQ(c->rope_scaling.original_max_position, 256);
  EXPECT_DOUBLE_EQ(c->raw.at("scale_emb").get<double>(), 12.0);
  EXPECT_NEAR(c->raw.at("dim_model_base").get<double>(), 32.0 / 0.125, 1e-9);
}

// GLM-5's MTP block in llama.cpp's layout (blk.{n_layer}.nextn.* plus the
// block's decoder tensors, block_count counting it) is found by
// loader/mtp_layers under DeepSeek's names, as --spec mtp reads them.
TEST(GgufConfig, GlmDsaMtpBlockIsFound) {
  constexpr int64_t E = 576;  // llama_file's embedding_length
  GgufWriter w = glm_dsa_file();
  add_indexer(w);
  auto f32 = [](int64_t n) { return std::vector<uint8_t>(static_cast<size_t>(n) * 4, 0); };
  w.add_tensor("blk.29.nextn.eh_proj.weight", 0, {2 * E, E}, f32(2 * E * E));  // ne: innermost first
  for (const char* t : {"blk.29.nextn.enorm.weight", "blk.29.nextn.hnorm.weight",
                        "blk.29.nextn.shared_head_norm.weight", "blk.29.attn_norm.weight"})
    w.add_tensor(t, 0, {E}, f32(E));
  const std::string path = testing::write_temp_file(w.build(), "glm_dsa_mtp.gguf");
  auto files = open_model_files(path);
  ASSERT_TRUE(files.ok()) << files.error().message;
  EXPECT_EQ((*files)->config.n_layer, 29);
  auto layers = find_mtp_layers(**files);
  ASSERT_TRUE(layers.ok()) << layers.error().message;
  EXPECT_EQ(layers->naming, MtpLayers::Naming::kNextn);
  ASSERT_EQ(layers->n_layers(), 1);
  EXPECT_EQ(layers->prefixes[0], "model.layers.29.");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rill
