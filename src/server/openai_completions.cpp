// POST /v1/completions: raw prompts (text or token ids, one or a batch),
// n choices each, no chat template and no output parsing; streamed as
// text_completion chunks or returned as one text_completion.
#include "model/model.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/openai_common.h"
#include "server/sse.h"
#include "text/fim.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using openai::ojson;

constexpr size_t kMaxPrompts = 64;

struct RawPrompt {
  ChatPrompt prompt;
  std::string text;  // for echo
};

// What a choice echoes: the prompt text, and with logprobs the prompt
// tokens' entries in front of the generated ones.
struct Echo {
  std::string text;                                 // "" without echo
  std::shared_ptr<const std::vector<int32_t>> ids;  // the prompt; null without echo
};

bool is_id_array(const ojson& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const ojson& x : v) {
    if (!json_integer(x)) return false;  // the integer rule (field_reader.h)
  }
  return true;
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]. With a
// suffix (fill-in-the-middle: `fim` set), text prompts only, each rendered
// as the prefix before it.
std::variant<std::vector<RawPrompt>, ApiError> read_prompts(const ServerContext& ctx, const FieldReader& body,
                                                            const FimTokens* fim, std::string_view suffix) {
  const ojson* it = body.find("prompt");
  if (it == nullptr) return body.error("prompt", "field required");
  const Tokenizer* tok = ctx.engine.tokenizer();
  const int64_t n_vocab = ctx.engine.model().n_vocab();
  std::vector<ojson> items;
  if (it->is_string() || is_id_array(*it)) {
    items.push_back(*it);
  } else if (it->is_array() && !it->empty()) {
    for (const ojson& x : *it) items.push_back(x);
  } else {
    return body.error("prompt",
                      "expected a string, an array of strings, an "
                      "array of token ids or an array of those");
  }
  if (items.size() > kMaxPrompts) return body.error("prompt", "at most " + std::to_string(kMaxPrompts) + " prompts");
  std::vector<RawPrompt> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string param = items.size() == 1 && (it->is_string() || is_id_array(*it))
                                  ? std::string("prompt")
                                  : "prompt[" + std::to_string(i) + "]";
    RawPrompt p;
    p.prompt.param = param;
    p.prompt.parser.parse_reasoning = false;
    p.prompt.parser.parse_tool_calls = false;
    if (items[i].is_string()) {
      if (tok == nullptr) return field_error(param, "this model has no tokenizer; send token ids");
      p.text = items[i].get<std::string>();
      if (fim != nullptr) {
        p.prompt.ids = render_fim(*tok, *fim, p.text, suffix);
      } else {
        // As vLLM / transformers: BOS as the model adds it, special tokens in
        // the text recognised.
        p.prompt.ids = tok->encode(p.text, /*add_special=*/true, /*parse_special=*/true);
      }
    } else if (fim != nullptr) {
      return field_error(param, "with a suffix the prompt must be text (the prefix), not token ids");
    } else if (is_id_array(items[i])) {
      for (size_t k = 0; k < items[i].size(); ++k) {
        const ojson& x = items[i][k];
        const int64_t id = *json_integer(x);
        if (id < 0 || id >= n_vocab) {
          return field_error(param, "token id " + x.dump() + " at index " + std::to_string(k) +
                                        " is outside the vocabulary (" + std::to_string(n_vocab) + " tokens)");
        }
        p.prompt.ids.push_back(static_cast<int32_t>(id));
      }
      if (tok != nullptr) p.text = tok->decode(p.prompt.ids, /*skip_special=*/false);
    } else {
      return field_error(param, "expected a string or an array of token ids");
    }
    if (p.prompt.ids.empty()) return field_error(param, "the prompt is empty");
    out.push_back(std::move(p));
  }
  return out;
}

class CompletionCall final : public openai::OpenAiCall {
 public:
  CompletionCall(ServerContext& ctx, std::shared_ptr<Responder> res, const openai::CommonFields& f, bool logprobs,
                 std::vector<Echo> echo)
      : OpenAiCall(ctx, std::move(res), f.stream, openai::new_id("cmpl-")),
        model_(f.model),
        include_usage_(f.include_usage),
        logprobs_(logprobs),
        n_per_prompt_(static_cast<size_t>(f.n)),
        echo_(std::move(echo)),
        offsets_(echo_.size()),
        echo_sent_(echo_.size(), false) {
    for (size_t i = 0; i < echo_.size(); ++i) offsets_[i] = echo_[i].text.size();
  }

 private:
  ojson chunk(ojson choices) const {
    ojson c = envelope("text_completion", model_, std::move(choices));
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }
  std::string choice_frame(size_t index, std::string text, ojson logprobs, ojson finish_reason) const {
    ojson choice = {{"index", index},
                    {"text", std::move(text)},
                    {"logprobs", std::move(logprobs)},
                    {"finish_reason", std::move(finish_reason)}};
    return sse_data(openai::json_text(chunk(ojson::array({std::move(choice)}))));
  }

  // The prompt's logprobs come with its first token: with them the echo
  // waits for that event.
  bool echo_waits(size_t index) const { return logprobs_ && echo_[index].ids != nullptr; }

  // The echoed prompt's logprobs (null when not asked for).
  ojson prompt_logprobs(size_t index, std::span<const SampledToken> scores) const {
    const Tokenizer* tok = ctx_.engine.tokenizer();
    if (!echo_waits(index) || tok == nullptr) return nullptr;
    ojson logprobs = openai::empty_completion_logprobs();
    size_t offset = 0;
    openai::append_prompt_logprobs(*tok, *echo_[index].ids, scores, logprobs, offset);
    return logprobs;
  }

  std::string open_frames() override {
    std::string frames;
    for (size_t i = 0; i < echo_.size(); ++i) {
      if (!echo_[i].text.empty() && !echo_waits(i)) frames += choice_frame(i, echo_[i].text, nullptr, nullptr);
    }
    return frames;
  }

  std::string delta_frames(size_t index, const OutputDelta& d, const GenerationEvent& event) override {
    std::string frames;
    if (echo_waits(index) && !echo_sent_[index]) {  // the first event carries the prompt's logprobs
      echo_sent_[index] = true;
      frames = choice_frame(index, echo_[index].text, prompt_logprobs(index, event.prompt_logprobs), nullptr);
    }
    ojson logprobs = nullptr;
    const Tokenizer* tok = ctx_.engine.tokenizer();
    if (logprobs_ && tok != nullptr) {
      auto shown = openai::shown_logprobs(event);
      if (!shown.empty()) {
        logprobs = openai::empty_completion_logprobs();
        openai::append_completion_logprobs(*tok, shown, logprobs, offsets_[index]);
      }
    }
    if (d.content.empty() && logprobs.is_null()) return frames;
    return frames + choice_frame(index, d.content, std::move(logprobs), nullptr);
  }

  std::string finish_frames(size_t index, const ChatResult& r) override {
    return choice_frame(index, "", nullptr, r.finish_reason);
  }

  std::string close_frames(const std::vector<ChatResult>& results) override {
    if (!include_usage_) return "";
    ojson c = chunk(ojson::array());
    c["usage"] = openai::usage_json(results, n_per_prompt_);
    return sse_data(openai::json_text(c));
  }

  ojson response(const std::vector<ChatResult>& results) override {
    ojson choices = ojson::array();
    const Tokenizer* tok = ctx_.engine.tokenizer();
    for (size_t i = 0; i < results.size(); ++i) {
      const ChatResult& r = results[i];
      ojson logprobs = nullptr;
      if (logprobs_ && tok != nullptr) {
        logprobs = prompt_logprobs(i, r.prompt_logprobs);
        if (logprobs.is_null()) logprobs = openai::empty_completion_logprobs();
        size_t offset = echo_[i].text.size();
        openai::append_completion_logprobs(*tok, openai::shown_logprobs(r), logprobs, offset);
      }
      choices.push_back({{"index", i},
                         {"text", echo_[i].text + r.content},
                         {"logprobs", std::move(logprobs)},
                         {"finish_reason", r.finish_reason}});
    }
    ojson reply = envelope("text_completion", model_, std::move(choices));
    reply["usage"] = openai::usage_json(results, n_per_prompt_);
    return reply;
  }

  const std::string model_;
  const bool include_usage_, logprobs_;
  const size_t n_per_prompt_;
  const std::vector<Echo> echo_;  // per choice
  std::vector<size_t> offsets_;   // per choice: text offset of the next streamed token
  std::vector<bool> echo_sent_;   // per choice: the waiting echo went out (echo_waits)
};

}  // namespace

void handle_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);

  const FieldReader body(std::get<ojson>(parsed));

  std::optional<bool> echo;
  if (auto e = body.read_bool("echo", echo)) return send_error(*res, *e);
  openai::RequestLimits limits = openai::request_limits(ctx);
  limits.allow_zero_max_tokens = echo.value_or(false);  // max_tokens 0: score the prompt (OpenAI's echo)
  openai::CommonFields f;
  if (auto e = openai::read_common(limits, body, f)) return send_error(*res, *e);
  std::optional<int64_t> logprobs, best_of;
  std::optional<std::string> suffix;
  if (auto e = body.read_int("logprobs", 0, kMaxTopLogprobs, logprobs)) return send_error(*res, *e);
  if (auto e = body.read_int("best_of", 1, f.n, best_of)) return send_error(*res, *e);
  if (auto e = body.read_string("suffix", suffix)) return send_error(*res, *e);
  std::optional<FimTokens> fim;
  if (suffix && !suffix->empty()) {
    const Tokenizer* tok = ctx.engine.tokenizer();
    if (tok != nullptr) fim = find_fim_tokens(*tok);
    if (!fim) {
      return send_error(*res, body.error("suffix",
                                         "this model has no fill-in-the-middle tokens (such as "
                                         "<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), so it "
                                         "cannot complete between a prompt and a suffix"));
    }
  }
  f.generation.logprobs = logprobs ? static_cast<int32_t>(*logprobs) : -1;
  // echo + logprobs: the prompt tokens' logprobs too (the first is null).
  if (echo.value_or(false) && logprobs) f.generation.prompt_logprobs = static_cast<int32_t>(*logprobs);
  // response_format, grammar, regex, choice (structured_output.h).
  OutputConstraint constraint;
  if (auto e = read_response_format(body, constraint)) return send_error(*res, *e);
  if (auto e = read_grammar_fields(body, constraint)) return send_error(*res, *e);
  bool names_tokens = false;
  auto grammar = compile_constraint(constraint, ctx.engine.tokenizer(), &names_tokens);
  if (auto* e = std::get_if<ApiError>(&grammar)) return send_error(*res, *e);
  if (names_tokens) f.generation.skip_special_tokens = false;  // the named tokens are the text's
  f.generation.grammar = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(std::move(grammar));

  auto prompts = read_prompts(ctx, body, fim ? &*fim : nullptr, suffix.value_or(""));
  if (auto* e = std::get_if<ApiError>(&prompts)) return send_error(*res, *e);
  const std::vector<RawPrompt>& raw = std::get<std::vector<RawPrompt>>(prompts);

  std::vector<openai::OpenAiCall::Job> jobs;
  std::vector<Echo> echoes;
  for (size_t p = 0; p < raw.size(); ++p) {
    const auto ids = std::make_shared<const std::vector<int32_t>>(raw[p].prompt.ids);
    for (int i = 0; i < f.n; ++i) {
      const int index = static_cast<int>(p) * f.n + i;
      jobs.push_back({&raw[p].prompt, openai::choice_request(ctx, f, index)});
      echoes.push_back(echo.value_or(false) ? Echo{raw[p].text, ids} : Echo{"", nullptr});
    }
  }
  auto call = std::make_shared<CompletionCall>(ctx, res, f, logprobs.has_value(), std::move(echoes));
  call->run(std::move(jobs));
}

}  // namespace rill::server
