#include "cli/chat_repl.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "engine/sequence_runner.h"
#include "text/detokenizer.h"

namespace rill::cli {
namespace {

std::string piece_or_empty(const Tokenizer& tok, std::optional<int32_t> id) {
  return id ? tok.token_to_piece(*id) : std::string();
}

Result<std::vector<int32_t>> encode_conversation(const LoadedModel& m, const nlohmann::json& messages) {
  const Tokenizer& tok = *m.tokenizer;
  nlohmann::json ctx = {
      {"messages", messages},
      {"add_generation_prompt", true},
      {"bos_token", piece_or_empty(tok, tok.bos_id())},
      {"eos_token", piece_or_empty(tok, tok.eos_id())},
  };
  RILL_ASSIGN_OR_RETURN(std::string text, m.chat_template->render(ctx));
  // As transformers' apply_chat_template: the template writes the special
  // tokens itself, so none are added here.
  return tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
}

}  // namespace

Result<std::vector<int32_t>> encode_prompt(const LoadedModel& m, const std::string& user, const std::string& system,
                                           bool raw) {
  if (raw || !m.chat_template) {
    return m.tokenizer->encode(system.empty() ? user : system + "\n" + user, /*add_special=*/true,
                               /*parse_special=*/false);
  }
  nlohmann::json messages = nlohmann::json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", user}});
  return encode_conversation(m, messages);
}

std::vector<int32_t> eos_ids(const LoadedModel& m) {
  std::vector<int32_t> ids = m.files->config.generation.eos_token_ids;
  if (m.tokenizer) {
    for (int32_t id : m.tokenizer->eos_ids()) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  return ids;
}

int run_chat(const RunOptions& o) {
  LoadOptions lo;
  lo.model.n_threads = o.threads;
  lo.model.n_ctx = o.ctx_size;
  lo.model.device = o.device.value();
  lo.model.tensor_parallel = o.device.tensor_parallel;
  lo.model.batch_invariant = o.device.batch_invariant;
  lo.model.quantize = o.device.quantization();
  lo.model.cuda_device_sampling = !o.device.host_sampling;
  auto path = resolve_model_path(o.model);
  if (!path.ok()) {
    std::fprintf(stderr, "rill run: %s\n", path.error().message.c_str());
    return 1;
  }
  auto loaded = load_model(*path, lo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "rill run: %s\n", loaded.error().message.c_str());
    return 1;
  }
  LoadedModel& m = *loaded;
  if (!m.tokenizer || !m.chat_template) {
    std::fprintf(stderr, "rill run: %s has no %s; use --prompt or --prompt-ids\n", m.files->path.c_str(),
                 m.tokenizer ? "chat template" : "tokenizer");
    return 1;
  }
  const bool tty = ::isatty(STDIN_FILENO);
  std::fprintf(stderr, "rill: chatting with %s (%s). /reset clears the conversation, /exit or Ctrl-D quits.\n",
               m.files->path.c_str(), m.files->config.architecture.c_str());

  GenerationOptions go;
  go.max_tokens = o.max_tokens;
  go.sampling = resolve_sampling(o, m.files->config.generation);
  go.eos_ids = eos_ids(m);
  SequenceRunner runner(*m.model);
  nlohmann::json messages = nlohmann::json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});

  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = nlohmann::json::array();
      if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
      runner.reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto prompt = encode_conversation(m, messages);
    if (!prompt.ok()) {
      std::fprintf(stderr, "rill: %s\n", prompt.error().message.c_str());
      messages.erase(messages.end() - 1);
      continue;
    }
    const int64_t room = m.model->n_ctx() - static_cast<int64_t>(prompt->size());
    if (room < 1) {
      std::fprintf(stderr, "rill: the conversation fills the context (%lld tokens); /reset to start over\n",
                   static_cast<long long>(m.model->n_ctx()));
      messages.erase(messages.end() - 1);
      continue;
    }
    go.max_tokens = static_cast<int>(std::min<int64_t>(o.max_tokens, room));
    IncrementalDecoder decoder(*m.tokenizer);
    std::string reply;
    auto result = runner.generate(*prompt, go, [&](int32_t id) {
      if (m.tokenizer->is_special(id)) return true;
      std::string piece = decoder.push(id);
      reply += piece;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    if (!result.ok()) {
      std::fprintf(stderr, "\nrill: %s\n", result.error().message.c_str());
      messages.erase(messages.end() - 1);
      continue;
    }
    std::string rest = decoder.flush();
    reply += rest;
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  if (tty) std::fprintf(stderr, "\n");
  return 0;
}

}  // namespace rill::cli
