// config.json -> ModelConfig against the golden models' configs (values read
// independently here), both RoPE forms, generation_config, and error messages.
#include "loader/hf_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "refused_goldens.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGoldenDir = std::string(RILL_SHARED_DIR) + "/goldens/hf";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A fresh temp directory removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("rill_hfcfg_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.n_vocab, b.n_vocab);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_ff, b.n_ff);
  EXPECT_EQ(a.max_position, b.max_position);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.rope_style, b.rope_style);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position, b.rope_scaling.original_max_position);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.attention_factor, b.rope_scaling.attention_factor);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.generation.eos_token_ids, b.generation.eos_token_ids);
}

// Fields every golden family shares, checked against config.json itself.
void check_common(const std::string& family, const ModelConfig& c) {
  SCOPED_TRACE(family);
  json j = read_json(kGoldenDir + "/" + family + "/config.json");
  EXPECT_EQ(c.architecture, j["model_type"].get<std::string>());
  EXPECT_EQ(c.n_vocab, j["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.n_embd, j["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.n_layer, j["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c.n_head, j["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.n_head_kv, j["num_key_value_heads"].get<int64_t>());
  const int64_t head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
                               ? j["head_dim"].get<int64_t>()
                               : j["hidden_size"].get<int64_t>() / j["num_attention_heads"].get<int64_t>();
  EXPECT_EQ(c.head_dim, head_dim);
  EXPECT_EQ(c.rope_dim, head_dim);
  EXPECT_EQ(c.n_ff, j["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.max_position, j["max_position_embeddings"].get<int64_t>());
  EXPECT_FLOAT_EQ(c.rms_norm_eps, j["rms_norm_eps"].get<float>());
  EXPECT_FLOAT_EQ(c.rope_theta, j["rope_parameters"]["rope_theta"].get<float>());
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(c.tie_word_embeddings, j["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.hidden_act, j["hidden_act"].get<std::string>());
  EXPECT_EQ(c.generation.eos_token_ids, std::vector<int32_t>{j["eos_token_id"].get<int32_t>()});
  EXPECT_EQ(c.generation.bos_token_id, j["bos_token_id"].get<int32_t>());
  EXPECT_EQ(c.raw, j);
}

TEST(HfConfig, GoldenFamilies) {
  for (const char* family : {"llama", "llama3-tied", "mistral-swa", "qwen2", "qwen3"}) {
    auto c = load_hf_config(kGoldenDir + "/" + family);
    ASSERT_TRUE(c.ok()) << family << ": " << c.error().message;
    check_common(family, *c);
  }
  auto llama = load_hf_config(kGoldenDir + "/llama").value();
  EXPECT_EQ(llama.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(llama.sliding_window, 0);

  auto tied = load_hf_config(kGoldenDir + "/llama3-tied").value();
  EXPECT_TRUE(tied.tie_word_embeddings);
  EXPECT_EQ(tied.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(tied.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(tied.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(tied.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(tied.rope_scaling.original_max_position, 64);
  EXPECT_FLOAT_EQ(tied.rope_theta, 500000.0f);

  EXPECT_EQ(load_hf_config(kGoldenDir + "/mistral-swa").value().sliding_window, 8);
  // qwen2/qwen3: sliding_window null and use_sliding_window false.
  EXPECT_EQ(load_hf_config(kGoldenDir + "/qwen2").value().sliding_window, 0);
  EXPECT_EQ(load_hf_config(kGoldenDir + "/qwen3").value().head_dim, 32);
}

TEST(HfConfig, EveryGoldenConfigLoads) {
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (!entry.is_directory()) continue;
    auto c = load_hf_config(entry.path().string());
    const auto refused = testing::refused_golden_configs().find(entry.path().filename().string());
    if (refused != testing::refused_golden_configs().end()) {
      ASSERT_FALSE(c.ok()) << entry.path() << " loads now: take it off refused_goldens.h";
      EXPECT_NE(c.error().message.find(refused->second), std::string::npos) << c.error().message;
      continue;
    }
    EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.error().message;
  }
  // Gemma: hidden_activation, per-layer-type rope (full_attention theta), head_dim null (mixtral).
  auto gemma3 = load_hf_config(kGoldenDir + "/gemma3").value();
  EXPECT_EQ(gemma3.hidden_act, "gelu_pytorch_tanh");
  EXPECT_FLOAT_EQ(gemma3.rope_theta, 1000000.0f);
  EXPECT_EQ(gemma3.sliding_window, 8);
  EXPECT_TRUE(gemma3.raw["rope_parameters"].contains("sliding_attention"));
  EXPECT_EQ(load_hf_config(kGoldenDir + "/mixtral").value().head_dim, 16);
  // Partial rotary: head_dim 16 * 0.25.
  EXPECT_EQ(load_hf_config(kGoldenDir + "/qwen3-next").value().rope_dim, 4);
  EXPECT_EQ(load_hf_config(kGoldenDir + "/qwen3_5").value().rope_dim, 4);
}

// transformers v4 wrote rope_theta + rope_scaling; v5 writes rope_parameters.
TEST(HfConfig, V4AndV5RopeFormsAgree) {
  json v5 = read_json(kGoldenDir + "/llama3-tied/config.json");
  json v4 = v5;
  v4.erase("rope_parameters");
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 64}};
  json v4_type = v4;  // older configs spell it "type"
  v4_type["rope_scaling"].erase("rope_type");
  v4_type["rope_scaling"]["type"] = "llama3";

  TempDir d5("v5"), d4("v4"), d4t("v4t");
  d5.write("config.json", v5.dump());
  d4.write("config.json", v4.dump());
  d4t.write("config.json", v4_type.dump());
  auto c5 = load_hf_config(d5.path.string());
  auto c4 = load_hf_config(d4.path.string());
  auto c4t = load_hf_config(d4t.path.string());
  ASSERT_TRUE(c5.ok()) << c5.error().message;
  ASSERT_TRUE(c4.ok()) << c4.error().message;
  ASSERT_TRUE(c4t.ok()) << c4t.error().message;
  EXPECT_EQ(c5->rope_scaling.type, RopeScaling::Type::kLlama3);
  expect_same(*c5, *c4);
  expect_same(*c5, *c4t);

  // Yarn in both forms, with the v5 per-layer-type layout.
  json y5 = v5;
  y5["rope_parameters"] = {{"full_attention",
                            {{"rope_type", "yarn"},
                             {"rope_theta", 1e6},
                             {"factor", 4.0},
                             {"beta_fast", 16.0},
                             {"beta_slow", 2.0},
                             {"attention_factor", 0.5},
                             {"original_max_position_embeddings", 128}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  json y4 = v5;
  y4.erase("rope_parameters");
  y4["rope_theta"] = 1e6;
  y4["rope_scaling"] = y5["rope_parameters"]["full_attention"];
  y4["rope_scaling"].erase("rope_theta");
  auto cy5 = parse_hf_config(y5, "y5/config.json");
  auto cy4 = parse_hf_config(y4, "y4/config.json");
  ASSERT_TRUE(cy5.ok()) << cy5.error().message;
  ASSERT_TRUE(cy4.ok()) << cy4.error().message;
  EXPECT_EQ(cy5->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_FLOAT_EQ(cy5->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(cy5->rope_scaling.beta_fast, 16.0f);
  EXPECT_EQ(cy5->rope_scaling.attention_factor, 0.5f);
  EXPECT_EQ(cy5->rope_scaling.original_max_position, 128);
  expect_same(*cy5, *cy4);
}

TEST(HfConfig, DefaultsAndSlidingWindowRules) {
  json j = {{"model_type", "qwen2"},      {"vocab_size", 100},        {"hidden_size", 64},
            {"num_hidden_layers", 2},     {"num_attention_heads", 8}, {"sliding_window", 4096},
            {"use_sliding_window", false}};
  auto c = parse_hf_config(j, "m/config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->n_head_kv, 8);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->rope_dim, 8);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->hidden_act, "silu");
  j["use_sliding_window"] = true;
  EXPECT_EQ(parse_hf_config(j, "m/config.json")->sliding_window, 4096);
  j["num_key_value_heads"] = nullptr;  // null means default
  EXPECT_EQ(parse_hf_config(j, "m/config.json")->n_head_kv, 8);
}

TEST(HfConfig, TextConfigOfMultimodalWrappers) {
  json j = {{"model_type", "wrapper"},
            {"tie_word_embeddings", true},
            {"eos_token_id", {7, 8}},
            {"text_config",
             {{"model_type", "qwen3_5_text"},
              {"vocab_size", 100},
              {"hidden_size", 64},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4}}}};
  auto c = parse_hf_config(j, "m/config.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->architecture, "qwen3_5_text");
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->generation.eos_token_ids, (std::vector<int32_t>{7, 8}));
  auto bad = parse_hf_config({{"text_config", {{"model_type", "x"}}}}, "m/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "m/config.json: field 'text_config.vocab_size' missing");
}

TEST(HfConfig, GenerationConfigOverlaysConfigEos) {
  TempDir d("gen");
  json cfg = read_json(kGoldenDir + "/llama/config.json");
  cfg["eos_token_id"] = {2, 5};
  d.write("config.json", cfg.dump());
  auto c = load_hf_config(d.path.string());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->generation.eos_token_ids, (std::vector<int32_t>{2, 5}));  // no generation_config
  EXPECT_FALSE(c->generation.temperature);

  d.write("generation_config.json", R"({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
      "repetition_penalty": 1.1, "do_sample": true, "bos_token_id": 1})");
  c = load_hf_config(d.path.string());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->generation.eos_token_ids, (std::vector<int32_t>{2, 5}));  // kept from config.json
  EXPECT_FLOAT_EQ(*c->generation.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*c->generation.top_p, 0.9f);
  EXPECT_EQ(*c->generation.top_k, 20);
  EXPECT_FLOAT_EQ(*c->generation.min_p, 0.05f);
  EXPECT_FLOAT_EQ(*c->generation.repetition_penalty, 1.1f);
  EXPECT_TRUE(*c->generation.do_sample);
  EXPECT_EQ(*c->generation.bos_token_id, 1);

  d.write("generation_config.json", R"({"eos_token_id": [9, 10, 11]})");
  EXPECT_EQ(load_hf_config(d.path.string())->generation.eos_token_ids, (std::vector<int32_t>{9, 10, 11}));
  d.write("generation_config.json", R"({"eos_token_id": "x"})");
  auto bad = load_hf_config(d.path.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("generation_config.json: field 'eos_token_id'"), std::string::npos);
  d.write("generation_config.json", "{");
  bad = load_hf_config(d.path.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("generation_config.json: not valid JSON"), std::string::npos);
}

TEST(HfConfig, ErrorsNameFileAndField) {
  const json base = read_json(kGoldenDir + "/llama/config.json");
  struct Case {
    const char* key;
    json value;  // null: erase the key
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", nullptr, "field 'hidden_size' missing"},
      {"model_type", nullptr, "field 'model_type' missing"},
      {"vocab_size", nullptr, "field 'vocab_size' missing"},
      {"hidden_size", "64", "field 'hidden_size' must be an integer, got string"},
      {"num_hidden_layers", 2.5, "field 'num_hidden_layers' must be an integer, got float"},
      {"num_attention_heads", 0, "field 'num_attention_heads' is out of range"},
      {"num_hidden_layers", 1 << 30, "field 'num_hidden_layers' is out of range (1073741824; at most 4096)"},
      {"num_key_value_heads", 3, "field 'num_key_value_heads' (3) must divide num_attention_heads (4)"},
      {"rms_norm_eps", true, "field 'rms_norm_eps' must be a number, got boolean"},
      {"tie_word_embeddings", 1, "field 'tie_word_embeddings' must be a boolean, got integer"},
      {"rope_parameters", json::array(), "field 'rope_parameters' must be an object, got array"},
      {"rope_parameters", {{"rope_type", "longrope"}}, "'longrope' is not supported"},
      {"rope_parameters", {{"rope_theta", "big"}}, "field 'rope_parameters.rope_theta' must be a number"},
      {"eos_token_id", {1, "x"}, "field 'eos_token_id' must be a token id or a list of token ids"},
      {"partial_rotary_factor", 1.5, "field 'partial_rotary_factor' must be in (0, 1]"},
  };
  for (const Case& k : cases) {
    json j = base;
    if (k.value.is_null())
      j.erase(k.key);
    else
      j[k.key] = k.value;
    TempDir d("err");
    d.write("config.json", j.dump());
    auto c = load_hf_config(d.path.string());
    ASSERT_FALSE(c.ok()) << k.key;
    const std::string want = (d.path / "config.json").string() + ": ";
    EXPECT_EQ(c.error().message.rfind(want, 0), 0u) << c.error().message;
    EXPECT_NE(c.error().message.find(k.message), std::string::npos) << c.error().message;
  }
  TempDir d("err2");
  auto none = load_hf_config(d.path.string());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("config.json: missing"), std::string::npos);
  d.write("config.json", "{\"a\": ");
  EXPECT_NE(load_hf_config(d.path.string()).error().message.find("config.json: not valid JSON"), std::string::npos);
  d.write("config.json", "[]");
  EXPECT_NE(load_hf_config(d.path.string()).error().message.find("config.json: not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace rill
