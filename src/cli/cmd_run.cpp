// rill run [MODEL] [--prompt TEXT | --prompt-ids 1,2,3] ...: one completion,
// or (without a prompt) an interactive chat.
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/chat_repl.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "cli/parse_ids.h"
#include "cli/run_options.h"
#include "engine/sequence_runner.h"
#include "text/detokenizer.h"

namespace rill::cli {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SamplingParams resolve_sampling(const RunOptions& o, const GenerationDefaults& d) {
  SamplingParams p;
  const bool model_samples = d.do_sample.value_or(true);
  p.temperature = o.temperature.value_or(model_samples ? d.temperature.value_or(0.7f) : 0.0f);
  p.top_p = o.top_p.value_or(d.top_p.value_or(d.temperature ? 1.0f : 0.9f));
  p.top_k = o.top_k.value_or(d.top_k.value_or(0));
  p.min_p = o.min_p.value_or(d.min_p.value_or(0.0f));
  p.repetition_penalty = o.repeat_penalty.value_or(d.repetition_penalty.value_or(1.0f));
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed;
  return p;
}

namespace {

int run_once(const RunOptions& o, Clock::time_point t_start) {
  const bool from_ids = !o.prompt_ids.empty();
  std::vector<int32_t> prompt;
  if (from_ids) {
    auto ids = parse_ids(o.prompt_ids);
    if (!ids.ok()) {
      std::fprintf(stderr, "rill run: --prompt-ids: %s\n", ids.error().message.c_str());
      return 2;
    }
    prompt = std::move(ids).value();
  }
  LoadOptions lo;
  lo.model.n_threads = o.threads;
  lo.model.n_ctx = o.ctx_size;
  lo.model.device = o.device.value();
  lo.model.tensor_parallel = o.device.tensor_parallel;
  lo.model.batch_invariant = o.device.batch_invariant;
  lo.model.quantize = o.device.quantization();
  lo.model.cuda_device_sampling = !o.device.host_sampling;
  auto kv_types = o.device.kv_types.value();
  if (!kv_types.ok()) {
    std::fprintf(stderr, "rill run: %s\n", kv_types.error().message.c_str());
    return 2;
  }
  lo.model.kv_types = std::move(kv_types).value();
  auto path = resolve_model_path(o.model);
  if (!path.ok()) {
    std::fprintf(stderr, "rill run: %s\n", path.error().message.c_str());
    return 1;
  }
  auto m = load_model(*path, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "rill run: %s\n", m.error().message.c_str());
    return 1;
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!from_ids) {
    if (!m->tokenizer) {
      std::fprintf(stderr, "rill run: %s has no tokenizer; use --prompt-ids\n", m->files->path.c_str());
      return 1;
    }
    auto ids = encode_prompt(*m, o.prompt, o.system, o.raw);
    if (!ids.ok()) {
      std::fprintf(stderr, "rill run: %s\n", ids.error().message.c_str());
      return 1;
    }
    prompt = std::move(ids).value();
  }

  GenerationOptions go;
  go.max_tokens = o.max_tokens;
  go.ignore_eos = o.ignore_eos;
  go.sampling = resolve_sampling(o, m->files->config.generation);
  go.eos_ids = eos_ids(*m);

  std::optional<IncrementalDecoder> decoder;
  if (m->tokenizer) decoder.emplace(*m->tokenizer);
  std::string text;
  double first_token_s = 0;
  SequenceRunner runner(*m->model);
  auto result = runner.generate(prompt, go, [&](int32_t id) {
    if (first_token_s == 0) first_token_s = std::chrono::duration<double>(Clock::now() - t_start).count();
    if (!decoder) return true;
    if (m->tokenizer->is_special(id)) return true;  // end-of-turn markers are not text
    std::string piece = decoder->push(id);
    text += piece;
    if (!o.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  if (!result.ok()) {
    std::fprintf(stderr, "\nrill run: %s\n", result.error().message.c_str());
    return 1;
  }
  if (decoder) {
    std::string rest = decoder->flush();
    text += rest;
    if (!o.json) std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  if (!o.json) {
    std::printf("\n");
    return 0;
  }
  const GenerationTimings& t = result->timings;
  nlohmann::json j = {
      {"ids", result->ids},
      {"text", text},
      {"finish_reason", finish_reason_name(result->finish)},
      {"timings",
       {{"load_s", load_s},
        {"prompt_tokens", t.n_prompt},
        {"prefill_s", t.prefill_s},
        {"decode_tokens", std::max(0, t.n_generated - 1)},
        {"decode_s", t.decode_s},
        {"first_token_s", first_token_s}}},
  };
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "Complete a prompt, or chat in the terminal when no prompt is given");
  sub->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  auto* p =
      sub->add_option("--prompt", o->prompt, "prompt text (rendered with the model's chat template unless --raw)");
  auto* pi = sub->add_option("--prompt-ids", o->prompt_ids, "comma-separated token ids fed as they are (no template)");
  p->excludes(pi);
  sub->add_option("--system", o->system, "system message for the chat template");
  sub->add_option("--max-tokens,-n", o->max_tokens, "tokens to generate at most")->check(CLI::Range(0, 1 << 20));
  sub->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-p", o->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  sub->add_option("--min-p", o->min_p, "drop tokens below min_p x the top probability")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--repeat-penalty", o->repeat_penalty, "repetition penalty over prompt and output (1: off)");
  sub->add_option("--presence-penalty", o->presence_penalty, "OpenAI presence penalty");
  sub->add_option("--frequency-penalty", o->frequency_penalty, "OpenAI frequency penalty");
  sub->add_option("--seed", o->seed, "sampling seed (same seed, same tokens)");
  sub->add_flag("--json", o->json, "print {\"ids\": [...], \"text\": \"...\", ...} instead of streaming text");
  sub->add_flag("--raw", o->raw, "feed --prompt as plain text, without the chat template");
  sub->add_flag("--ignore-eos", o->ignore_eos, "keep generating after end-of-sequence tokens");
  sub->add_option("--threads,-t", o->threads, "CPU threads (default: one per core)");
  o->device.add_to(sub);
  sub->add_option("--ctx-size,-c", o->ctx_size, "context tokens to reserve")->check(CLI::Range(16, 1 << 22));
  return {sub, [o]() -> int {
            const auto t_start = Clock::now();
            if (o->prompt.empty() && o->prompt_ids.empty()) return run_chat(*o);
            return run_once(*o, t_start);
          }};
}

}  // namespace rill::cli
