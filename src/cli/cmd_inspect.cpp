// rill inspect MODEL: what a model file is, without building the model.
#include <cstdio>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "loader/gguf.h"
#include "model/fingerprint.h"
#include "model/registry.h"

namespace rill::cli {

namespace {

std::string tokenizer_kind(const ModelFiles& f, bool loaded) {
  if (!loaded) return "none";
  if (f.gguf) {
    return "gguf " + f.gguf->get_string("tokenizer.ggml.model").value_or("?") +
           " (pre: " + f.gguf->get_string("tokenizer.ggml.pre").value_or("default") + ")";
  }
  return "tokenizer.json";
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  struct Opts {
    std::string model;
    std::string device = "cpu";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe a model: architecture, parameters, tensor types, tokenizer");
  sub->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  sub->add_option("--device", o->device, "the device whose implementation to name: cpu or cuda (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--json", o->json, "print JSON");
  return {sub, [o]() -> int {
            LoadOptions lo;
            lo.need_model = false;
            auto path = resolve_model_path(o->model);
            if (!path.ok()) {
              std::fprintf(stderr, "rill inspect: %s\n", path.error().message.c_str());
              return 1;
            }
            auto m = load_model(*path, lo);
            if (!m.ok()) {
              std::fprintf(stderr, "rill inspect: %s\n", m.error().message.c_str());
              return 1;
            }
            const ModelFiles& f = *m->files;
            const ModelConfig& c = f.config;
            int64_t n_params = 0;
            std::map<std::string, int> types;
            for (const auto& [name, t] : f.tensors) {
              n_params += t.n_elements();
              ++types[t.fp8 ? std::string("FP8") : std::string(dtype_name(t.dtype))];  // FP8: as stored
            }
            const Device device = o->device == "cuda" ? Device::kCuda : Device::kCpu;
            auto impl = builtin_registry().select(infer_profile(f), device);
            nlohmann::json j = {
                {"path", f.path},
                {"format", f.format == ModelFormat::kGguf ? "gguf" : "huggingface"},
                {"architecture", c.architecture},
                {"implementation", impl.ok() ? (*impl)->id : "none: " + impl.error().message},
                {"parameters", n_params},
                {"tensor_types", types},
                {"n_tensors", f.tensors.size()},
                {"context_length", c.max_position},
                {"n_layer", c.n_layer},
                {"n_embd", c.n_embd},
                {"n_head", c.n_head},
                {"n_head_kv", c.n_head_kv},
                {"n_vocab", c.n_vocab},
                {"tokenizer", tokenizer_kind(f, m->tokenizer != nullptr)},
                {"chat_template", m->chat_template.has_value()},
                {"config_fingerprint", config_fingerprint(c)},
            };
            if (o->json) {
              std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
              return 0;
            }
            for (const auto& [k, v] : j.items()) {
              std::cout << k << ": "
                        << (v.is_string() ? v.get<std::string>()
                                          : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
                        << "\n";
            }
            return 0;
          }};
}

}  // namespace rill::cli
