// rill score MODEL --ids 1,2,3 --json: logits of every position.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/kv_type_flags.h"
#include "cli/loaded_model.h"
#include "cli/parse_ids.h"
#include "engine/sequence_runner.h"

namespace rill::cli {

Command add_score_command(CLI::App& app) {
  struct Opts {
    std::string model;
    std::string ids;
    bool json = false;
    int threads = 0;
    KvTypeFlags kv_types;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand("score", "Print the logits of every position of a token sequence");
  sub->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  sub->add_option("--ids", o->ids, "comma-separated token ids")->required();
  sub->add_flag("--json", o->json, "print {\"logits\": [[...], ...]} (the only output format)");
  sub->add_option("--threads", o->threads, "CPU threads (default: one per core)");
  o->kv_types.add_to(sub);
  return {sub, [o]() -> int {
            auto ids = parse_ids(o->ids);
            if (!ids.ok()) {
              std::fprintf(stderr, "rill score: --ids: %s\n", ids.error().message.c_str());
              return 2;
            }
            LoadOptions lo;
            lo.need_tokenizer = false;
            lo.model.n_threads = o->threads;
            lo.model.n_ctx = static_cast<int64_t>(ids->size());
            auto kv_types = o->kv_types.value();
            if (!kv_types.ok()) {
              std::fprintf(stderr, "rill score: %s\n", kv_types.error().message.c_str());
              return 2;
            }
            lo.model.kv_types = std::move(kv_types).value();
            auto path = resolve_model_path(o->model);
            if (!path.ok()) {
              std::fprintf(stderr, "rill score: %s\n", path.error().message.c_str());
              return 1;
            }
            auto m = load_model(*path, lo);
            if (!m.ok()) {
              std::fprintf(stderr, "rill score: %s\n", m.error().message.c_str());
              return 1;
            }
            SequenceRunner runner(*m->model);
            auto logits = runner.score(*ids);
            if (!logits.ok()) {
              std::fprintf(stderr, "rill score: %s\n", logits.error().message.c_str());
              return 1;
            }
            const auto V = static_cast<size_t>(m->model->n_vocab());
            nlohmann::json rows = nlohmann::json::array();
            for (size_t t = 0; t < ids->size(); ++t) {
              rows.push_back(std::vector<float>(logits->begin() + t * V, logits->begin() + (t + 1) * V));
            }
            std::cout << nlohmann::json{{"logits", rows}}.dump() << "\n";
            return 0;
          }};
}

}  // namespace rill::cli
