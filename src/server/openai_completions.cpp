// POST /v1/completions: raw prompts (text or token ids, one or a batch),
// n choices each, no chat template and no output parsing; streamed as
// text_completion chunks or returned as one text_completion.
#include "model/model.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/openai_common.h"
#include "server/sse.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using openai::ojson;

constexpr size_t kMaxPrompts = 64;

struct RawPrompt {
  ChatPrompt prompt;
  std::string text;  // for echo
};

bool is_id_array(const ojson& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const ojson& x : v) {
    if (!json_integer(x)) return false;  // the integer rule (field_reader.h)
  }
  return true;
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...].
std::variant<std::vector<RawPrompt>, ApiError> read_prompts(const ServerContext& ctx, const FieldReader& body) {
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
    return body.error("prompt", "expected a string, an array of strings, an array of token ids or an array of those");
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
      // As vLLM / transformers: BOS as the model adds it, special tokens in the text recognised.
      p.prompt.ids = tok->encode(p.text, /*add_special=*/true, /*parse_special=*/true);
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
                 std::vector<std::string> echo)
      : OpenAiCall(ctx, std::move(res), f.stream, openai::new_id("cmpl-")),
        model_(f.model),
        include_usage_(f.include_usage),
        logprobs_(logprobs),
        n_per_prompt_(static_cast<size_t>(f.n)),
        echo_(std::move(echo)),
        offsets_(echo_.size()) {
    for (size_t i = 0; i < echo_.size(); ++i) offsets_[i] = echo_[i].size();
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

  std::string open_frames() override {
    std::string frames;
    for (size_t i = 0; i < echo_.size(); ++i) {
      if (!echo_[i].empty()) frames += choice_frame(i, echo_[i], nullptr, nullptr);
    }
    return frames;
  }

  std::string delta_frames(size_t index, const OutputDelta& d, const GenerationEvent& event) override {
    ojson logprobs = nullptr;
    const Tokenizer* tok = ctx_.engine.tokenizer();
    if (logprobs_ && tok != nullptr) {
      auto shown = openai::shown_logprobs(event);
      if (!shown.empty()) {
        logprobs = openai::empty_completion_logprobs();
        openai::append_completion_logprobs(*tok, shown, logprobs, offsets_[index]);
      }
    }
    if (d.content.empty() && logprobs.is_null()) return "";
    return choice_frame(index, d.content, std::move(logprobs), nullptr);
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
        logprobs = openai::empty_completion_logprobs();
        size_t offset = echo_[i].size();
        openai::append_completion_logprobs(*tok, openai::shown_logprobs(r), logprobs, offset);
      }
      choices.push_back({{"index", i},
                         {"text", echo_[i] + r.content},
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
  const std::vector<std::string> echo_;  // per choice: the prompt text when echo, else ""
  std::vector<size_t> offsets_;          // per choice: text offset of the next streamed token
};

}  // namespace

void handle_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);

  const FieldReader body(std::get<ojson>(parsed));

  openai::CommonFields f;
  if (auto e = openai::read_common(openai::request_limits(ctx), body, f)) return send_error(*res, *e);
  std::optional<bool> echo;
  std::optional<int64_t> logprobs, best_of;
  std::optional<std::string> suffix;
  if (auto e = body.read_bool("echo", echo)) return send_error(*res, *e);
  if (auto e = body.read_int("logprobs", 0, kMaxTopLogprobs, logprobs)) return send_error(*res, *e);
  if (auto e = body.read_int("best_of", 1, f.n, best_of)) return send_error(*res, *e);
  if (auto e = body.read_string("suffix", suffix)) return send_error(*res, *e);
  if (suffix && !suffix->empty()) return send_error(*res, body.error("suffix", "not supported"));
  f.generation.logprobs = logprobs ? static_cast<int32_t>(*logprobs) : -1;
  // response_format, grammar, regex, choice (structured_output.h).
  OutputConstraint constraint;
  if (auto e = read_response_format(body, constraint)) return send_error(*res, *e);
  if (auto e = read_grammar_fields(body, constraint)) return send_error(*res, *e);
  auto grammar = compile_constraint(constraint);
  if (auto* e = std::get_if<ApiError>(&grammar)) return send_error(*res, *e);
  f.generation.grammar = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(std::move(grammar));

  auto prompts = read_prompts(ctx, body);
  if (auto* e = std::get_if<ApiError>(&prompts)) return send_error(*res, *e);
  const std::vector<RawPrompt>& raw = std::get<std::vector<RawPrompt>>(prompts);

  std::vector<openai::OpenAiCall::Job> jobs;
  std::vector<std::string> echo_text;
  for (size_t p = 0; p < raw.size(); ++p) {
    for (int i = 0; i < f.n; ++i) {
      const int index = static_cast<int>(p) * f.n + i;
      jobs.push_back({&raw[p].prompt, openai::choice_request(ctx, f, index)});
      echo_text.push_back(echo.value_or(false) ? raw[p].text : std::string());
    }
  }
  auto call = std::make_shared<CompletionCall>(ctx, res, f, logprobs.has_value(), std::move(echo_text));
  call->run(std::move(jobs));
}

}  // namespace rill::server
