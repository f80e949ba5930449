#pragma once
// Test helpers: load the shared tokenizers (gunzipped into a temp dir once
// per process), SmolLM2's GGUF tokenizer, and the golden files.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "loader/gguf.h"
#include "text/tokenizer.h"

namespace rill::testing {

// A per-process temp dir, removed at exit (the unpacked files are large).
inline std::string tokenizer_temp_dir() {
  struct TempDir {
    std::string path;
    TempDir() {
      std::string tmpl = (std::filesystem::temp_directory_path() / "rill_tok_XXXXXX").string();
      if (mkdtemp(tmpl.data()) != nullptr) path = tmpl;
    }
    ~TempDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  };
  static const TempDir dir;
  return dir.path;
}

// Returns the path of a plain tokenizer.json for shared model `name`
// (llama3, qwen3, gemma3), with its tokenizer_config.json beside it, or ""
// when the shared files are missing.
inline std::string shared_tokenizer_json(const std::string& name) {
  const std::filesystem::path src = std::filesystem::path(RILL_SHARED_DIR) / "tokenizers" / name;
  if (!std::filesystem::exists(src / "tokenizer.json.gz")) return "";
  const std::filesystem::path dst = std::filesystem::path(tokenizer_temp_dir()) / name;
  const std::filesystem::path json = dst / "tokenizer.json";
  if (std::filesystem::exists(json)) return json.string();
  std::filesystem::create_directories(dst);
  const std::string cmd = "gunzip -c '" + (src / "tokenizer.json.gz").string() + "' > '" + json.string() + "'";
  if (std::system(cmd.c_str()) != 0) return "";
  if (std::filesystem::exists(src / "tokenizer_config.json"))
    std::filesystem::copy_file(src / "tokenizer_config.json", dst / "tokenizer_config.json",
                               std::filesystem::copy_options::overwrite_existing);
  return json.string();
}

inline std::string smollm2_gguf_path() {
  const std::string p = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(p) ? p : "";
}

// Loads (once per process) the tokenizer for `name`: llama3, qwen3, gemma3
// or smollm2. Returns nullptr when its files are missing; fails on errors.
inline const Tokenizer* load_tokenizer(const std::string& name, std::string* error = nullptr) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<Tokenizer> tok;
  if (name == "smollm2") {
    const std::string path = smollm2_gguf_path();
    if (path.empty()) return nullptr;
    auto gguf = GgufFile::open(path);
    if (!gguf.ok()) {
      if (error) *error = gguf.error().message;
      return nullptr;
    }
    auto t = Tokenizer::from_gguf(*gguf.value());
    if (!t.ok()) {
      if (error) *error = t.error().message;
      return nullptr;
    }
    tok = std::move(t).value();
  } else {
    const std::string path = shared_tokenizer_json(name);
    if (path.empty()) return nullptr;
    auto t = Tokenizer::from_tokenizer_json(path);
    if (!t.ok()) {
      if (error) *error = t.error().message;
      return nullptr;
    }
    tok = std::move(t).value();
  }
  return (cache[name] = std::move(tok)).get();
}

inline nlohmann::json load_golden(const std::string& name) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/tokenizer/" + name + ".json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace rill::testing
