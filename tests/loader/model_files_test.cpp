// open_model_files: every golden HF directory, a sharded split of one of them,
// chat template sources, corruption and missing pieces, and the default GGUF.
#include "loader/model_files.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader/gguf.h"
#include "refused_goldens.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGoldenDir = std::string(RILL_SHARED_DIR) + "/goldens/hf";
const std::string kGguf = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
}
void write_text(const fs::path& path, const std::string& s) {
  std::ofstream(path, std::ios::binary) << s;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("rill_mf_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

// Copies a golden model directory's config files (not the weights).
void copy_configs(const std::string& family, const fs::path& to) {
  for (const char* f : {"config.json", "generation_config.json"})
    fs::copy_file(fs::path(kGoldenDir) / family / f, to / f, fs::copy_options::overwrite_existing);
}

// Writes a safetensors file holding `names` taken from the parsed golden
// header `header` and its data section `data` (read here without rill).
void write_subset(const fs::path& path, const json& header, const uint8_t* data,
                  const std::vector<std::string>& names) {
  json h = json::object();
  std::vector<uint8_t> out_data;
  for (const auto& n : names) {
    json e = header.at(n);
    const uint64_t b = e["data_offsets"][0], en = e["data_offsets"][1];
    e["data_offsets"] = {out_data.size(), out_data.size() + (en - b)};
    out_data.insert(out_data.end(), data + b, data + en);
    h[n] = e;
  }
  std::string hs = h.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  out.insert(out.end(), hs.begin(), hs.end());
  out.insert(out.end(), out_data.begin(), out_data.end());
  write_bytes(path, out);
}

// Splits golden `family` into two shards + index under `dir`; returns the header.
json split_golden(const std::string& family, const fs::path& dir, json* index_out) {
  std::vector<uint8_t> bytes = read_bytes(fs::path(kGoldenDir) / family / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n));
  header.erase("__metadata__");
  std::vector<std::string> first, second;
  json index = {{"metadata", {{"total_size", bytes.size() - 8 - n}}}, {"weight_map", json::object()}};
  size_t i = 0;
  for (auto it = header.begin(); it != header.end(); ++it, ++i) {
    auto& half = i % 2 ? second : first;
    half.push_back(it.key());
    index["weight_map"][it.key()] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  const uint8_t* data = bytes.data() + 8 + n;
  write_subset(dir / "model-00001-of-00002.safetensors", header, data, first);
  write_subset(dir / "model-00002-of-00002.safetensors", header, data, second);
  write_text(dir / "model.safetensors.index.json", index.dump());
  copy_configs(family, dir);
  *index_out = index;
  return header;
}

TEST(ModelFiles, EveryGoldenDirectoryOpens) {
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (!entry.is_directory()) continue;
    SCOPED_TRACE(entry.path().string());
    auto files = open_model_files(entry.path().string());
    const auto refused = testing::refused_golden_configs().find(entry.path().filename().string());
    if (refused != testing::refused_golden_configs().end()) {
      ASSERT_FALSE(files.ok()) << "it opens now: take it off refused_goldens.h";
      EXPECT_NE(files.error().message.find(refused->second), std::string::npos) << files.error().message;
      continue;
    }
    ASSERT_TRUE(files.ok()) << files.error().message;
    const ModelFiles& m = **files;
    json cfg = json::parse(std::ifstream(entry.path() / "config.json"));
    EXPECT_EQ(m.format, ModelFormat::kHuggingFace);
    EXPECT_EQ(m.config.architecture, cfg["model_type"].get<std::string>());
    EXPECT_EQ(m.config.raw, cfg);
    EXPECT_EQ(m.mappings.size(), 1u);
    // The embedding is [vocab, hidden]; the final norm [hidden].
    auto emb = m.require("model.embed_tokens.weight", {cfg["vocab_size"], cfg["hidden_size"]});
    ASSERT_TRUE(emb.ok()) << emb.error().message;
    EXPECT_EQ((*emb)->dtype, DType::kF32);
    EXPECT_EQ((*emb)->n_bytes, size_t((*emb)->n_elements()) * 4);
    EXPECT_EQ((*emb)->file, (entry.path() / "model.safetensors").string());
    EXPECT_TRUE(m.require("model.norm.weight", {cfg["hidden_size"]}).ok());
    EXPECT_EQ(m.find("lm_head.weight") == nullptr, cfg["tie_word_embeddings"].get<bool>());
    EXPECT_TRUE(m.tokenizer_json_path.empty());
    EXPECT_TRUE(m.chat_template.empty());
  }
}

TEST(ModelFiles, RequireAndShapeString) {
  auto files = open_model_files(kGoldenDir + "/llama");
  ASSERT_TRUE(files.ok()) << files.error().message;
  const ModelFiles& m = **files;
  const TensorRef* lm = m.find("lm_head.weight");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(lm->shape_string(), "[512, 64]");
  EXPECT_EQ(lm->n_elements(), 512 * 64);
  auto bad = m.require("lm_head.weight", {32000, 64});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message,
            kGoldenDir + "/llama/model.safetensors: tensor 'lm_head.weight' has shape [512, 64], expected [32000, 64]");
  auto missing = m.require("x", {1});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, kGoldenDir + "/llama: missing tensor 'x'");
  TensorRef scalar;
  EXPECT_EQ(scalar.shape_string(), "[]");
  EXPECT_EQ(scalar.n_elements(), 1);
}

TEST(ModelFiles, ShardedCheckpointGivesIdenticalTensors) {
  TempDir d("sharded");
  json index;
  json header = split_golden("llama", d.path, &index);
  auto whole = open_model_files(kGoldenDir + "/llama");
  auto sharded = open_model_files(d.str());
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  ASSERT_TRUE(sharded.ok()) << sharded.error().message;
  EXPECT_EQ((*sharded)->mappings.size(), 2u);
  ASSERT_EQ((*sharded)->tensors.size(), (*whole)->tensors.size());
  ASSERT_EQ((*sharded)->tensors.size(), header.size());
  for (const auto& [name, t] : (*whole)->tensors) {
    SCOPED_TRACE(name);
    const TensorRef* s = (*sharded)->find(name);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->dtype, t.dtype);
    EXPECT_EQ(s->shape, t.shape);
    ASSERT_EQ(s->n_bytes, t.n_bytes);
    EXPECT_EQ(std::memcmp(s->data, t.data, t.n_bytes), 0);
    EXPECT_EQ(fs::path(s->file).filename().string(), index["weight_map"][name].get<std::string>());
  }
}

TEST(ModelFiles, ShardErrorsNameFilesAndTensor) {
  {
    TempDir d("noshard");
    json index;
    split_golden("llama", d.path, &index);
    fs::remove(d.path / "model-00002-of-00002.safetensors");
    auto r = open_model_files(d.str());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(
        r.error().message.find("model.safetensors.index.json: shard 'model-00002-of-00002.safetensors' does not exist"),
        std::string::npos)
        << r.error().message;
  }
  {
    TempDir d("missingtensor");
    json index;
    split_golden("llama", d.path, &index);
    index["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors";
    write_text(d.path / "model.safetensors.index.json", index.dump());
    auto r = open_model_files(d.str());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("tensor 'model.extra.weight' is missing from its shard " +
                                     (d.path / "model-00001-of-00002.safetensors").string()),
              std::string::npos)
        << r.error().message;
  }
  {
    TempDir d("badindex");
    json index;
    split_golden("llama", d.path, &index);
    write_text(d.path / "model.safetensors.index.json", "{\"weight_map\": [");
    auto r = open_model_files(d.str());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("model.safetensors.index.json: not valid JSON"), std::string::npos);
  }
}

TEST(ModelFiles, CorruptOrMissingPiecesAreErrors) {
  const fs::path golden = fs::path(kGoldenDir) / "qwen2";
  std::vector<uint8_t> weights = read_bytes(golden / "model.safetensors");
  auto expect_error = [](const fs::path& dir, const std::string& what) {
    auto r = open_model_files(dir.string());
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  };
  {
    TempDir d("noweights");
    copy_configs("qwen2", d.path);
    expect_error(d.path, d.str() + ": no model.safetensors or model.safetensors.index.json");
  }
  {
    TempDir d("truncated");
    copy_configs("qwen2", d.path);
    write_bytes(d.path / "model.safetensors", std::vector<uint8_t>(weights.begin(), weights.end() - 100));
    expect_error(d.path, (d.path / "model.safetensors").string() + ": tensor '");
    write_bytes(d.path / "model.safetensors", std::vector<uint8_t>(weights.begin(), weights.begin() + 100));
    expect_error(d.path, (d.path / "model.safetensors").string() + ": header length");
  }
  {
    TempDir d("noconfig");
    write_bytes(d.path / "model.safetensors", weights);
    expect_error(d.path, (d.path / "config.json").string() + ": missing");
    json cfg = json::parse(std::ifstream(golden / "config.json"));
    cfg.erase("num_hidden_layers");
    write_text(d.path / "config.json", cfg.dump());
    expect_error(d.path, (d.path / "config.json").string() + ": field 'num_hidden_layers' missing");
    cfg["num_hidden_layers"] = "3";
    write_text(d.path / "config.json", cfg.dump());
    expect_error(d.path, "field 'num_hidden_layers' must be an integer, got string");
  }
  auto none = open_model_files("/nonexistent/rill/model");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("/nonexistent/rill/model"), std::string::npos);
  auto not_model = open_model_files((golden / "config.json").string());
  ASSERT_FALSE(not_model.ok());
  EXPECT_NE(not_model.error().message.find("not a GGUF file or a Hugging Face model directory"), std::string::npos);
}

TEST(ModelFiles, TokenizerPathsAndChatTemplateSources) {
  TempDir d("template");
  copy_configs("llama", d.path);
  fs::copy_file(fs::path(kGoldenDir) / "llama" / "model.safetensors", d.path / "model.safetensors");
  write_text(d.path / "tokenizer.json", "{}");
  write_text(d.path / "tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  auto m = open_model_files(d.str());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->tokenizer_json_path, (d.path / "tokenizer.json").string());
  EXPECT_EQ((*m)->tokenizer_config_path, (d.path / "tokenizer_config.json").string());
  EXPECT_EQ((*m)->chat_template, "{{ messages }}");

  write_text(d.path / "tokenizer_config.json",
             R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(open_model_files(d.str()).value()->chat_template, "D");

  write_text(d.path / "chat_template.jinja", "J");
  EXPECT_EQ(open_model_files(d.str()).value()->chat_template, "J");

  write_text(d.path / "tokenizer_config.json", R"({"chat_template": 5})");
  auto bad = open_model_files(d.str());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tokenizer_config.json: field 'chat_template'"), std::string::npos);
}

// A minimal GGUF v3 image: no metadata, one 256x1 tensor of GGML type 16 (IQ2_XXS).
TEST(ModelFiles, GgufUnsupportedTensorTypeIsNamed) {
  std::vector<uint8_t> b;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(uint8_t(v >> (8 * i)));
  };
  const std::string name = "blk.0.attn_q.weight";
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  put(3, 4);  // version
  put(1, 8);  // n_tensors
  put(0, 8);  // n_kv
  put(name.size(), 8);
  b.insert(b.end(), name.begin(), name.end());
  put(2, 4);  // n_dims
  put(256, 8);
  put(1, 8);
  put(16, 4);  // IQ2_XXS
  put(0, 8);   // offset
  while (b.size() % 32) b.push_back(0);
  b.resize(b.size() + 66);
  TempDir d("iq2");
  // No .gguf suffix: detected by its magic.
  write_bytes(d.path / "model.bin", b);
  auto r = open_model_files((d.path / "model.bin").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            (d.path / "model.bin").string() + ": tensor 'blk.0.attn_q.weight' has unsupported type IQ2_XXS");
}

TEST(ModelFiles, DefaultGgufModel) {
  if (!fs::exists(kGguf)) GTEST_SKIP() << kGguf << " not present";
  auto m = open_model_files(kGguf);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelFiles& f = **m;
  EXPECT_EQ(f.format, ModelFormat::kGguf);
  ASSERT_NE(f.gguf, nullptr);
  EXPECT_EQ(f.config.architecture, "llama");
  EXPECT_EQ(f.config.n_embd, 576);
  EXPECT_EQ(f.config.n_layer, 30);
  EXPECT_EQ(f.tensors.size(), f.gguf->tensors().size());
  EXPECT_NE(f.chat_template.find("im_start"), std::string::npos);
  // SmolLM2 ties its embeddings: token_embd [49152, 576] (GGML ne reversed).
  auto emb = f.require("model.embed_tokens.weight", {49152, 576});
  ASSERT_TRUE(emb.ok()) << emb.error().message;
  auto q = f.require("model.layers.0.self_attn.q_proj.weight", {576, 576});
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ((*q)->file, kGguf);
  EXPECT_EQ((*q)->n_bytes, row_bytes((*q)->dtype, 576) * 576);
  for (const GgufTensorInfo& info : f.gguf->tensors()) {
    bool found = false;
    for (const auto& [name, t] : f.tensors) found |= t.data == info.data && t.n_bytes == info.n_bytes;
    EXPECT_TRUE(found) << info.name;
  }
}

}  // namespace
}  // namespace rill
