#pragma once
// Everything `rill run/score/inspect` need from a model path: files, the
// chosen implementation, tokenizer and chat template.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill::cli {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// What the default-model search reads from the process (a struct so tests
// can pass their own).
struct ModelSearchEnv {
  std::string rill_model;           // $RILL_MODEL
  std::filesystem::path cwd;        // the working directory
  std::filesystem::path exe;        // this executable
  std::string xdg_data_home, home;  // $XDG_DATA_HOME, $HOME
  static ModelSearchEnv current();
};

// The places the default model is looked for, in order: $RILL_MODEL;
// ./models/; <exe>/../models/ (the build tree: build/rill); <exe>/../share/
// rill/models/ (an install prefix: PREFIX/bin/rill); $XDG_DATA_HOME/rill/
// models/ (default ~/.local/share/rill/models/).
std::vector<std::filesystem::path> default_model_candidates(const ModelSearchEnv& env);

// `given` when not empty, else the first default candidate that exists; the
// error lists every place searched.
Result<std::string> resolve_model_path(const std::string& given, const ModelSearchEnv& env = ModelSearchEnv::current());

struct LoadedModel {
  std::shared_ptr<ModelFiles> files;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;       // null when the model ships none
  std::optional<ChatTemplate> chat_template;  // unset when the model ships none
};

struct LoadOptions {
  bool need_model = true;
  bool need_tokenizer = true;
  ModelOptions model;
};

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options);

}  // namespace rill::cli
