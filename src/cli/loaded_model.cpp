#include "cli/loaded_model.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "core/e4m3.h"
#include "engine/kv_calibration.h"
#include "model/registry.h"

namespace rill::cli {

ModelSearchEnv ModelSearchEnv::current() {
  ModelSearchEnv env;
  auto var = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  env.rill_model = var("RILL_MODEL");
  env.xdg_data_home = var("XDG_DATA_HOME");
  env.home = var("HOME");
  std::error_code ec;
  env.cwd = std::filesystem::current_path(ec);
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) env.exe = std::string(exe, static_cast<size_t>(n));
  return env;
}

std::vector<std::filesystem::path> default_model_candidates(const ModelSearchEnv& env) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  if (!env.rill_model.empty()) out.emplace_back(env.rill_model);
  if (!env.cwd.empty()) out.push_back(env.cwd / "models" / kDefaultModelFile);
  if (!env.exe.empty()) {
    const fs::path prefix = env.exe.parent_path().parent_path();
    out.push_back(prefix / "models" / kDefaultModelFile);
    out.push_back(prefix / "share" / "rill" / "models" / kDefaultModelFile);
  }
  // XDG: an unset or relative $XDG_DATA_HOME means ~/.local/share.
  if (!env.xdg_data_home.empty() && fs::path(env.xdg_data_home).is_absolute()) {
    out.push_back(fs::path(env.xdg_data_home) / "rill" / "models" / kDefaultModelFile);
  } else if (!env.home.empty()) {
    out.push_back(fs::path(env.home) / ".local" / "share" / "rill" / "models" / kDefaultModelFile);
  }
  return out;
}

Result<std::string> resolve_model_path(const std::string& given, const ModelSearchEnv& env) {
  if (!given.empty()) return given;
  // $RILL_MODEL names a model (a file or a directory) explicitly: the loader
  // reports it if it is missing.
  if (!env.rill_model.empty()) return env.rill_model;
  const auto candidates = default_model_candidates(env);
  std::string searched;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidates[i], ec)) return candidates[i].string();
    searched += "\n  " + candidates[i].string();
  }
  return Error{std::string("no model given and the default model (") + kDefaultModelFile +
               ") was not found; searched:" + searched +
               "\n(pass a .gguf file or a Hugging Face model directory, or run `make run` to fetch the default)"};
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
    ModelOptions mo = options.model;
    if (mo.kv_types.mentions(kKvQ4Alloc) && !m.tokenizer && m.files->gguf) {
      RILL_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_gguf(*m.files->gguf));
    } else if (mo.kv_types.mentions(kKvQ4Alloc) && !m.tokenizer && !m.files->tokenizer_json_path.empty()) {
      RILL_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::from_tokenizer_json(m.files->tokenizer_json_path));
    }
    RILL_TRY(add_kv_calibration(m.tokenizer.get(), mo.kv_types));  // q4a's text, on either device
    RILL_ASSIGN_OR_RETURN(m.model, create_model(builtin_registry(), infer_profile(*m.files), m.files, mo));
  }
  return m;
}

}  // namespace rill::cli
