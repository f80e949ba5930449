#pragma once
// Everything `rill run/score/inspect` need from a model path: files, the
// chosen implementation, tokenizer and chat template.
#include <memory>
#include <string>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill::cli {

// The default model: $RILL_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
// under the working directory or beside the executable's parent directory.
std::string default_model_path();

struct LoadedModel {
  std::shared_ptr<ModelFiles> files;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;              // null when the model ships none
  std::optional<ChatTemplate> chat_template;         // unset when the model ships none
};

struct LoadOptions {
  bool need_model = true;
  bool need_tokenizer = true;
  ModelOptions model;
};

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options);

}  // namespace rill::cli
