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

using openai::bad_field;
using openai::ojson;

const char* type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_boolean()) return "a boolean";
  return "a number";
}

// tools and tool_choice -> ChatInput::tools ("none": no tools; a named
// function: only that one).
std::optional<ApiError> read_tools(const ojson& body, ChatInput& in) {
  auto tools_it = body.find("tools");
  ojson tools = tools_it == body.end() ? ojson(nullptr) : *tools_it;
  std::set<std::string> names;
  if (!tools.is_null()) {
    if (!tools.is_array()) return bad_field("tools", std::string("expected an array, got ") + type_name(tools));
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      const ojson& t = tools[i];
      if (!t.is_object()) return bad_field(p, "expected an object {\"type\": \"function\", \"function\": {...}}");
      auto type = t.find("type");
      if (type == t.end() || !type->is_string() || *type != "function") {
        return bad_field(p + ".type", "expected \"function\"");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) return bad_field(p + ".function", "expected an object");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
        return bad_field(p + ".function.name", "expected a non-empty string");
      }
      if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null() && !params->is_object()) {
        return bad_field(p + ".function.parameters", "expected a JSON Schema object");
      }
      names.insert(name->get<std::string>());
    }
  }
  auto choice_it = body.find("tool_choice");
  if (choice_it != body.end() && !choice_it->is_null()) {
    const ojson& choice = *choice_it;
    if (choice.is_string()) {
      const std::string& c = choice.get_ref<const std::string&>();
      if (c == "none") {
        tools = nullptr;
      } else if (c != "auto" && c != "required") {
        return bad_field("tool_choice", "expected \"none\", \"auto\", \"required\" or a named function");
      } else if (c == "required" && names.empty()) {
        return bad_field("tool_choice", "\"required\" needs tools");
      }
    } else if (choice.is_object()) {
      auto fn = choice.find("function");
      if (fn == choice.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return bad_field("tool_choice", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      const std::string name = (*fn)["name"].get<std::string>();
      if (!names.count(name)) return bad_field("tool_choice", "no tool named '" + name + "' in tools");
      ojson only = ojson::array();
      for (const ojson& t : tools) {
        if (t["function"]["name"] == name) only.push_back(t);
      }
      tools = std::move(only);
    } else {
      return bad_field("tool_choice", std::string("expected a string or an object, got ") + type_name(choice));
    }
  }
  in.tools = tools.is_array() && !tools.empty() ? tools : ojson(nullptr);
  return std::nullopt;
}

// reasoning_effort and chat_template_kwargs -> ChatInput::template_kwargs.
std::optional<ApiError> read_template_kwargs(const ojson& body, ChatInput& in) {
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_field("chat_template_kwargs", std::string("expected an object, got ") + type_name(*it));
    in.template_kwargs = *it;
  }
  std::optional<std::string> effort;
  if (auto e = openai::read_string(body, "reasoning_effort", effort)) return e;
  if (effort) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high"};
    if (!kEfforts.count(*effort)) {
      return bad_field("reasoning_effort", "expected one of none, minimal, low, medium, high");
    }
    // An explicit chat_template_kwargs.enable_thinking wins.
    if (!in.template_kwargs.contains("enable_thinking")) in.template_kwargs["enable_thinking"] = *effort != "none";
    if (!in.template_kwargs.contains("reasoning_effort")) in.template_kwargs["reasoning_effort"] = *effort;
  }
  return std::nullopt;
}

std::optional<ApiError> read_response_format(const ojson& body) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return bad_field("response_format", "expected an object");
  auto type = it->find("type");
  if (type == it->end() || !type->is_string() ||
      (*type != "text" && *type != "json_object" && *type != "json_schema")) {
    return bad_field("response_format.type", "expected \"text\", \"json_object\" or \"json_schema\"");
  }
  return std::nullopt;
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, bool with_index, size_t first_index) {
  ojson out = ojson::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    ojson c = ojson::object();
    if (with_index) c["index"] = first_index + k;
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
        n_choices_(static_cast<size_t>(f.n)),
        n_tool_calls_(n_choices_, 0) {}

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

  std::string delta_frames(size_t index, const OutputDelta& d, const GenerationEvent& event) override {
    ojson delta = ojson::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      delta["tool_calls"] = tool_calls_json(d.tool_calls, /*with_index=*/true, n_tool_calls_[index]);
      n_tool_calls_[index] += d.tool_calls.size();
    }
    ojson logprobs = nullptr;
    if (logprobs_ && ctx_.engine.tokenizer() != nullptr) {
      auto shown = openai::shown_logprobs(event);
      if (!shown.empty()) logprobs = {{"content", openai::chat_logprobs(*ctx_.engine.tokenizer(), shown)}};
    }
    if (delta.empty() && logprobs.is_null()) return "";
    return choice_frame(index, std::move(delta), std::move(logprobs), nullptr);
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
      if (!r.reasoning.empty()) message["reasoning_content"] = r.reasoning;
      if (!r.tool_calls.empty()) message["tool_calls"] = tool_calls_json(r.tool_calls, false, 0);
      ojson logprobs = nullptr;
      if (logprobs_ && ctx_.engine.tokenizer() != nullptr) {
        logprobs = {{"content", openai::chat_logprobs(*ctx_.engine.tokenizer(), openai::shown_logprobs(r))},
                    {"refusal", nullptr}};
      }
      choices.push_back(
          {{"index", i}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)}, {"finish_reason", r.finish_reason}});
    }
    ojson reply = envelope("chat.completion", model_, std::move(choices));
    reply["usage"] = openai::usage_json(results, n_choices_);
    return reply;
  }

  const std::string model_;
  const bool include_usage_, logprobs_;
  const size_t n_choices_;
  std::vector<size_t> n_tool_calls_;  // per choice: tool calls streamed so far (their delta index)
};

}  // namespace

void handle_chat_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  const ojson& body = std::get<ojson>(parsed);

  openai::CommonFields f;
  if (auto e = openai::read_common(ctx, body, f)) return send_error(*res, *e);
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) return send_error(*res, bad_field("messages", "field required"));
  ChatInput input;
  input.messages = *messages;
  if (auto e = read_tools(body, input)) return send_error(*res, *e);
  if (auto e = read_template_kwargs(body, input)) return send_error(*res, *e);
  if (auto e = read_response_format(body)) return send_error(*res, *e);
  std::optional<bool> logprobs;
  std::optional<int64_t> top_logprobs;
  if (auto e = openai::read_bool(body, "logprobs", logprobs)) return send_error(*res, *e);
  if (auto e = openai::read_int(body, "top_logprobs", 0, kMaxTopLogprobs, top_logprobs)) return send_error(*res, *e);
  if (top_logprobs && !logprobs.value_or(false)) {
    return send_error(*res, bad_field("top_logprobs", "logprobs must be true when top_logprobs is set"));
  }
  f.generation.logprobs = logprobs.value_or(false) ? static_cast<int32_t>(top_logprobs.value_or(0)) : -1;

  auto prompt = prepare_chat_prompt(ctx, input);
  if (auto* e = std::get_if<ApiError>(&prompt)) return send_error(*res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);

  auto call = std::make_shared<ChatCall>(ctx, res, f, logprobs.value_or(false));
  std::vector<openai::OpenAiCall::Job> jobs;
  for (int i = 0; i < f.n; ++i) jobs.push_back({&chat_prompt, openai::choice_request(ctx, f, i)});
  call->run(std::move(jobs));
}

}  // namespace rill::server
