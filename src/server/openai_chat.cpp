// POST /v1/chat/completions: OpenAI chat requests over the shared chat
// pipeline (server/chat_stream.h), n choices per request, streamed as
// chat.completion.chunk frames or returned as one chat.completion.
#include <set>

#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/openai_common.h"
#include "server/sse.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using openai::ojson;

// chat_template_kwargs are template globals; a template reads a few, so more
// than this is a mistake (and the template's globals are a linear list).
constexpr size_t kMaxTemplateKwargs = 64;

// tools, tool_choice and parallel_tool_calls -> ChatInput::tools ("none":
// no tools; a named function: only that one) and tools_required
// ("required" or a named function).
std::optional<ApiError> read_tools(const FieldReader& body, ChatInput& in) {
  std::optional<FieldReader> tools_reader;
  if (auto e = body.read_array("tools", tools_reader)) return e;
  ojson tools = tools_reader ? tools_reader->value() : ojson(nullptr);
  std::set<std::string> names;
  if (tools_reader) {
    for (size_t i = 0; i < tools.size(); ++i) {
      const FieldReader t = tools_reader->at(i);
      if (!t.value().is_object()) return t.error("expected an object {\"type\": \"function\", \"function\": {...}}");
      if (const ojson* v = t.find("type"); v == nullptr || !v->is_string() || *v != "function") {
        return t.error("type", "expected \"function\"");
      }
      std::optional<FieldReader> fn;
      if (auto e = t.read_object("function", fn)) return e;
      if (!fn) return t.error("function", "field required");
      std::string name;
      if (auto e = fn->require_string("name", name)) return e;
      if (name.empty()) return fn->error("name", "expected a non-empty string");
      if (const ojson* params = fn->find("parameters"); params != nullptr && !params->is_object()) {
        return fn->error("parameters", "expected a JSON Schema object");
      }
      names.insert(std::move(name));
    }
  }
  if (const ojson* choice = body.find("tool_choice")) {
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") {
        tools = nullptr;
      } else if (c != "auto" && c != "required") {
        return body.error("tool_choice", "expected \"none\", \"auto\", \"required\" or a named function");
      } else if (c == "required" && names.empty()) {
        return body.error("tool_choice", "\"required\" needs tools");
      }
      in.tools_required = c == "required";
    } else if (choice->is_object()) {
      const FieldReader cr = body.at("tool_choice");
      const ojson* fn = cr.find("function");
      const ojson* name = fn != nullptr && fn->is_object() ? FieldReader(*fn).find("name") : nullptr;
      if (name == nullptr || !name->is_string()) {
        return cr.error("expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      const std::string& wanted = name->get_ref<const std::string&>();
      if (!names.count(wanted)) return cr.error("no tool named '" + wanted + "' in tools");
      ojson only = ojson::array();
      for (const ojson& t : tools) {
        if (t["function"]["name"] == wanted) only.push_back(t);
      }
      tools = std::move(only);
      in.tools_required = true;
    } else {
      return body.type_error("tool_choice", "a string or an object");
    }
  }
  in.tools = tools.is_array() && !tools.empty() ? tools : ojson(nullptr);
  std::optional<bool> parallel;
  if (auto e = body.read_bool("parallel_tool_calls", parallel)) return e;
  in.parallel_tool_calls = parallel.value_or(true);
  return std::nullopt;
}

// reasoning_effort, thinking_budget and chat_template_kwargs -> ChatInput's
// template_kwargs and thinking.
std::optional<ApiError> read_template_kwargs(const FieldReader& body, ChatInput& in) {
  std::optional<FieldReader> kwargs;
  if (auto e = body.read_object("chat_template_kwargs", kwargs)) return e;
  if (kwargs) {
    if (kwargs->value().size() > kMaxTemplateKwargs) {
      return kwargs->error("at most " + std::to_string(kMaxTemplateKwargs) + " entries");
    }
    in.template_kwargs = kwargs->value();
  }
  std::optional<std::string> effort;
  if (auto e = body.read_string("reasoning_effort", effort)) return e;
  if (effort) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high"};
    if (!kEfforts.count(*effort)) {
      return body.error("reasoning_effort", "expected one of none, minimal, low, medium, high");
    }
    // An explicit chat_template_kwargs.enable_thinking wins.
    const std::optional<int32_t> budget = thinking_budget_for_effort(*effort);
    if (!in.template_kwargs.contains("enable_thinking")) in.template_kwargs["enable_thinking"] = budget.has_value();
    in.reasoning_effort = ChatInput::ReasoningEffort{"reasoning_effort", *effort};
    if (budget) in.thinking = ChatInput::ThinkingRequest{"reasoning_effort", *budget};
  }
  // rill extension: the thinking block's budget in tokens (wins over the
  // effort's), which also switches thinking on.
  std::optional<int64_t> budget;
  if (auto e = body.read_int("thinking_budget", 0, INT32_MAX, budget)) return e;
  if (budget) {
    if (!in.template_kwargs.contains("enable_thinking")) in.template_kwargs["enable_thinking"] = true;
    in.thinking = ChatInput::ThinkingRequest{"thinking_budget", static_cast<int32_t>(*budget)};
  }
  return std::nullopt;
}

ojson tool_calls_json(const std::vector<ToolCall>& calls) {
  ojson out = ojson::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    ojson c = ojson::object();
    c["id"] = calls[k].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[k].name}, {"arguments", calls[k].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

class ChatCall final : public openai::OpenAiCall {
 public:
  ChatCall(ServerContext& ctx, std::shared_ptr<Responder> res, const openai::CommonFields& f, bool logprobs)
      : OpenAiCall(ctx, std::move(res), f.stream, openai::new_id("chatcmpl-")),
        model_(f.model),
        include_usage_(f.include_usage),
        logprobs_(logprobs),
        n_choices_(static_cast<size_t>(f.n)) {}

 private:
  ojson chunk(ojson choices) const {
    ojson c = envelope("chat.completion.chunk", model_, std::move(choices));
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }
  std::string choice_frame(size_t index, ojson delta, ojson logprobs, ojson finish_reason) const {
    ojson choice = {{"index", index},
                    {"delta", std::move(delta)},
                    {"logprobs", std::move(logprobs)},
                    {"finish_reason", std::move(finish_reason)}};
    return sse_data(openai::json_text(chunk(ojson::array({std::move(choice)}))));
  }

  std::string open_frames() override {
    std::string frames;
    for (size_t i = 0; i < n_choices_; ++i) {
      frames += choice_frame(i, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    }
    return frames;
  }

  // Text first, then one chunk per call delta, as OpenAI streams calls: the
  // call's first chunk {index, id, type, function: {name, arguments: ""}},
  // then {index, function: {arguments: piece}} chunks.
  std::string delta_frames(size_t index, const OutputDelta& d, const GenerationEvent& event) override {
    ojson delta = ojson::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    ojson logprobs = nullptr;
    if (logprobs_ && ctx_.engine.tokenizer() != nullptr) {
      auto shown = openai::shown_logprobs(event);
      if (!shown.empty()) logprobs = {{"content", openai::chat_logprobs(*ctx_.engine.tokenizer(), shown)}};
    }
    std::string frames;
    if (!delta.empty() || (!logprobs.is_null() && d.tool_call_deltas.empty())) {
      frames += choice_frame(index, std::move(delta), std::move(logprobs), nullptr);
      logprobs = nullptr;
    }
    for (const ToolCallDelta& td : d.tool_call_deltas) {
      ojson call = {{"index", td.index}};
      if (!td.name.empty()) {
        call["id"] = td.id;
        call["type"] = "function";
        call["function"] = {{"name", td.name}, {"arguments", ""}};
      } else {
        call["function"] = {{"arguments", td.arguments}};
      }
      frames += choice_frame(index, {{"tool_calls", ojson::array({std::move(call)})}}, std::move(logprobs), nullptr);
      logprobs = nullptr;
    }
    return frames;
  }

  std::string finish_frames(size_t index, const ChatResult& r) override {
    return choice_frame(index, ojson::object(), nullptr, r.finish_reason);
  }

  std::string close_frames(const std::vector<ChatResult>& results) override {
    if (!include_usage_) return "";
    ojson c = chunk(ojson::array());
    c["usage"] = openai::usage_json(results, n_choices_);
    return sse_data(openai::json_text(c));
  }

  ojson response(const std::vector<ChatResult>& results) override {
    ojson choices = ojson::array();
    for (size_t i = 0; i < results.size(); ++i) {
      const ChatResult& r = results[i];
      ojson message = {{"role", "assistant"}};
      message["content"] = r.content.empty() && !r.tool_calls.empty() ? ojson(nullptr) : ojson(r.content);
      message["refusal"] = nullptr;  // the spec's field; this server never refuses by itself
      if (!r.reasoning.empty()) message["reasoning_content"] = r.reasoning;
      if (!r.tool_calls.empty()) message["tool_calls"] = tool_calls_json(r.tool_calls);
      ojson logprobs = nullptr;
      if (logprobs_ && ctx_.engine.tokenizer() != nullptr) {
        logprobs = {{"content", openai::chat_logprobs(*ctx_.engine.tokenizer(), openai::shown_logprobs(r))},
                    {"refusal", nullptr}};
      }
      choices.push_back({{"index", i},
                         {"message", std::move(message)},
                         {"logprobs", std::move(logprobs)},
                         {"finish_reason", r.finish_reason}});
    }
    ojson reply = envelope("chat.completion", model_, std::move(choices));
    reply["usage"] = openai::usage_json(results, n_choices_);
    return reply;
  }

  const std::string model_;
  const bool include_usage_, logprobs_;
  const size_t n_choices_;
};

}  // namespace

std::variant<openai::ChatRequest, ApiError> openai::parse_chat_request(const RequestLimits& limits,
                                                                       const ojson& json_body) {
  const FieldReader body(json_body);
  ChatRequest r;
  if (auto e = read_common(limits, body, r.common)) return *e;
  const ojson* messages = body.find("messages");
  if (messages == nullptr) return body.error("messages", "field required");
  r.input.messages = *messages;
  if (auto e = read_tools(body, r.input)) return *e;
  if (auto e = read_template_kwargs(body, r.input)) return *e;
  if (auto e = read_response_format(body, r.input.constraint)) return *e;
  if (auto e = read_grammar_fields(body, r.input.constraint)) return *e;
  std::optional<bool> logprobs;
  std::optional<int64_t> top_logprobs;
  if (auto e = body.read_bool("logprobs", logprobs)) return *e;
  if (auto e = body.read_int("top_logprobs", 0, kMaxTopLogprobs, top_logprobs)) return *e;
  if (top_logprobs && !logprobs.value_or(false)) {
    return body.error("top_logprobs", "logprobs must be true when top_logprobs is set");
  }
  r.logprobs = logprobs.value_or(false);
  r.common.generation.logprobs = r.logprobs ? static_cast<int32_t>(top_logprobs.value_or(0)) : -1;
  return r;
}

void handle_chat_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  auto request = openai::parse_chat_request(openai::request_limits(ctx), std::get<ojson>(parsed));
  if (auto* e = std::get_if<ApiError>(&request)) return send_error(*res, *e);
  openai::ChatRequest& r = std::get<openai::ChatRequest>(request);
  const openai::CommonFields& f = r.common;
  const ChatInput& input = r.input;

  auto prompt = prepare_chat_prompt(ctx, input);
  if (auto* e = std::get_if<ApiError>(&prompt)) return send_error(*res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);

  auto call = std::make_shared<ChatCall>(ctx, res, f, r.logprobs);
  std::vector<openai::OpenAiCall::Job> jobs;
  for (int i = 0; i < f.n; ++i) jobs.push_back({&chat_prompt, openai::choice_request(ctx, f, i)});
  call->run(std::move(jobs));
}

}  // namespace rill::server
