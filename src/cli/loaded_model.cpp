#include "cli/loaded_model.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "model/registry.h"

namespace rill::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("RILL_MODEL"); env && *env) return env;
  const std::string rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(rel)) return rel;
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    // build/rill -> <repo>/models/...
    auto candidate = std::filesystem::path(exe).parent_path().parent_path() / rel;
    if (std::filesystem::exists(candidate)) return candidate.string();
  }
  return rel;
}

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
  LoadedModel m;
  RILL_ASSIGN_OR_RETURN(m.files, open_model_files(path));
  if (options.need_tokenizer) {
    if (m.files->gguf) {
      RILL_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_gguf(*m.files->gguf));
    } else if (!m.files->tokenizer_json_path.empty()) {
      RILL_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_tokenizer_json(m.files->tokenizer_json_path));
    }
    if (!m.files->chat_template.empty()) {
      RILL_ASSIGN_OR_RETURN(m.chat_template, ChatTemplate::parse(m.files->chat_template));
    }
  }
  if (options.need_model) {
    RILL_ASSIGN_OR_RETURN(m.model, create_model(builtin_registry(), infer_profile(*m.files), m.files,
                                                options.model));
  }
  return m;
}

}  // namespace rill::cli
