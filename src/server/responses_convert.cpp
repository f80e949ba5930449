#include "server/responses_convert.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "core/json_parse.h"
#include "server/field_reader.h"
#include "server/response_store.h"
#include "server/sse.h"

namespace rill::server {

namespace {

using Json = nlohmann::ordered_json;

// OpenAI's documented metadata shape: at most 16 pairs, keys up to 64
// characters, string values up to 512 characters.
constexpr size_t kMaxMetadataPairs = 16;
constexpr size_t kMaxMetadataKeyChars = 64;
constexpr size_t kMaxMetadataValueChars = 512;

size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::optional<ApiError> read_metadata(const FieldReader& body, Json& out) {
  std::optional<FieldReader> metadata;
  if (auto e = body.read_object("metadata", metadata)) return e;
  if (!metadata) return std::nullopt;
  const Json& m = metadata->value();
  if (m.size() > kMaxMetadataPairs) {
    return metadata->error("at most " + std::to_string(kMaxMetadataPairs) + " key-value pairs");
  }
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (utf8_chars(it.key()) > kMaxMetadataKeyChars) {
      return metadata->error("keys must be at most " + std::to_string(kMaxMetadataKeyChars) + " characters");
    }
    if (!it.value().is_string()) return metadata->type_error(it.key(), "a string");
    if (utf8_chars(it.value().get_ref<const std::string&>()) > kMaxMetadataValueChars) {
      return metadata->error(it.key(), "must be at most " + std::to_string(kMaxMetadataValueChars) + " characters");
    }
  }
  out = m;
  return std::nullopt;
}

// Text parts of a message or function_call_output: [{type, text}].
std::optional<ApiError> read_parts(const FieldReader& parts, bool allow_output_text, Json& out) {
  for (size_t j = 0; j < parts.value().size(); ++j) {
    const FieldReader part = parts.at(j);
    if (!part.value().is_object()) return part.type_error("a content part object");
    std::string type, text;
    if (auto e = part.require_string("type", type)) return e;
    if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return part.error("type", "content part type \"" + type + "\" is not supported (text only)");
    }
    if (type == "refusal") {
      if (auto e = part.require_string("refusal", text)) return e;
    } else if (type == "input_text" || type == "text" || (allow_output_text && type == "output_text")) {
      if (auto e = part.require_string("text", text)) return e;
    } else {
      return part.error("type", "content part type \"" + type + "\" is not supported");
    }
    out.push_back({{"type", type == "input_text" || type == "text" ? "input_text" : "output_text"}, {"text", text}});
  }
  return std::nullopt;
}

std::variant<Json, ApiError> normalize_item(const FieldReader& item) {
  if (!item.value().is_object()) return item.type_error("an input item object");
  std::string type;
  if (item.find("type") == nullptr && item.find("role") != nullptr) {
    type = "message";  // EasyInputMessage: {role, content}
  } else if (auto e = item.require_string("type", type)) {
    return *e;
  }
  if (type == "message") {
    std::string role;
    if (auto e = item.require_string("role", role)) return *e;
    if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
      return item.error("role", "unknown role \"" + role + "\" (expected user, assistant, system or developer)");
    }
    const Json* content = item.find("content");
    if (content == nullptr) return item.error("content", "field required");
    Json parts = Json::array();
    if (content->is_string()) {
      parts.push_back({{"type", role == "assistant" ? "output_text" : "input_text"}, {"text", *content}});
    } else if (content->is_array()) {
      if (auto e = read_parts(item.at("content"), true, parts)) return *e;
    } else {
      return item.type_error("content", "a string or an array of content parts");
    }
    return Json{{"type", "message"}, {"role", role}, {"content", std::move(parts)}};
  }
  if (type == "function_call") {
    std::string call_id, name, arguments;
    if (auto e = item.require_string("call_id", call_id)) return *e;
    if (auto e = item.require_string("name", name)) return *e;
    const Json* args = item.find("arguments");
    if (args == nullptr) return item.error("arguments", "field required");
    if (args->is_string()) {
      arguments = args->get<std::string>();
      // The template will see these parsed (chat_stream.h): refuse here,
      // naming this field, what the depth limit would refuse there.
      auto parsed = parse_json(arguments, {item.path_of("arguments")});
      if (auto* pe = std::get_if<JsonParseError>(&parsed);
          pe != nullptr && pe->kind == JsonParseError::Kind::kTooDeep) {
        return field_error(pe->path, pe->message);
      }
    } else if (args->is_object()) {
      arguments = dump_responses_json(*args);  // lenient: clients that send the object itself
    } else {
      return item.type_error("arguments", "a JSON string");
    }
    return Json{{"type", "function_call"}, {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
  }
  if (type == "function_call_output") {
    std::string call_id, output;
    if (auto e = item.require_string("call_id", call_id)) return *e;
    const Json* out = item.find("output");
    if (out == nullptr) return item.error("output", "field required");
    if (out->is_string()) {
      output = out->get<std::string>();
    } else if (out->is_array()) {
      Json parts = Json::array();
      if (auto e = read_parts(item.at("output"), false, parts)) return *e;
      for (const Json& p : parts) output += (output.empty() ? "" : "\n") + p["text"].get<std::string>();
    } else {
      return item.type_error("output", "a string or an array of content parts");
    }
    return Json{{"type", "function_call_output"}, {"call_id", call_id}, {"output", output}};
  }
  if (type == "reasoning") {
    Json content = Json::array();
    std::optional<FieldReader> c;
    if (auto e = item.read_array("content", c)) return *e;
    if (c) {
      for (size_t j = 0; j < c->value().size(); ++j) {
        const FieldReader part = c->at(j);
        if (!part.value().is_object()) return part.type_error("an object");
        std::string text;
        if (auto e = part.require_string("text", text)) return *e;
        content.push_back({{"type", "reasoning_text"}, {"text", text}});
      }
    }
    return Json{{"type", "reasoning"}, {"summary", Json::array()}, {"content", std::move(content)}};
  }
  if (type == "item_reference") {
    return item.error("type", "item references are not supported; use previous_response_id");
  }
  return item.error("type", "input item type \"" + type + "\" is not supported");
}

std::variant<Json, ApiError> convert_tool(const FieldReader& tool) {
  if (!tool.value().is_object()) return tool.type_error("a tool object");
  std::string type;
  if (auto e = tool.require_string("type", type)) return *e;
  if (type != "function") {
    return tool.error("type", "tool type \"" + type + "\" is not supported (only function tools)");
  }
  // The chat-completions shape {type, function: {name, ...}} is accepted too.
  std::optional<FieldReader> nested;
  if (auto e = tool.read_object("function", nested)) return *e;
  const FieldReader& fields = nested ? *nested : tool;
  Json fn = Json::object();
  std::string name;
  if (auto e = fields.require_string("name", name)) return *e;
  fn["name"] = name;
  std::optional<std::string> description;
  if (auto e = fields.read_string("description", description)) return *e;
  if (description && !description->empty()) fn["description"] = *description;
  if (const Json* params = fields.find("parameters")) {
    if (!params->is_object()) return fields.error("parameters", "expected a JSON schema object");
    fn["parameters"] = *params;
  }
  return Json{{"type", "function"}, {"function", std::move(fn)}};
}

std::string join_text(const Json& parts) {
  std::string out;
  if (!parts.is_array()) return out;
  for (const Json& p : parts) {
    auto t = p.find("text");
    if (t == p.end() || !t->is_string()) continue;
    if (!out.empty()) out += "\n";
    out += t->get<std::string>();
  }
  return out;
}

double round6(float x) {
  return std::round(double(x) * 1e6) / 1e6;
}

}  // namespace

std::string dump_responses_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::variant<ResponsesRequest, ApiError> parse_responses_request(const std::string& body) {
  auto parsed = parse_json(body);
  if (auto* e = std::get_if<JsonParseError>(&parsed)) {
    if (e->kind == JsonParseError::Kind::kTooDeep) return field_error(e->path, e->message);
    return ApiError(400, "the request body is " + e->message, "invalid_request_error");
  }
  return parse_responses_request(std::get<Json>(parsed));
}

std::variant<ResponsesRequest, ApiError> parse_responses_request(const nlohmann::ordered_json& json_body) {
  if (!json_body.is_object()) {
    return ApiError(400, std::string("the request body must be a JSON object, got ") + json_type_name(json_body));
  }
  const FieldReader body(json_body);
  ResponsesRequest req;
  std::optional<std::string> model;
  if (auto e = body.read_string("model", model)) return *e;
  req.model = model.value_or("");

  const Json* input = body.find("input");
  if (input == nullptr) return body.error("input", "field required");
  if (input->is_string()) {
    req.input_items.push_back({{"type", "message"},
                               {"role", "user"},
                               {"content", Json::array({{{"type", "input_text"}, {"text", *input}}})}});
  } else if (input->is_array()) {
    const FieldReader items = body.at("input");
    for (size_t i = 0; i < input->size(); ++i) {
      auto item = normalize_item(items.at(i));
      if (auto* e = std::get_if<ApiError>(&item)) return *e;
      req.input_items.push_back(std::move(std::get<Json>(item)));
    }
  } else {
    return body.type_error("input", "a string or an array of input items");
  }

  if (auto e = body.read_string("instructions", req.instructions)) return *e;
  std::optional<std::string> previous;
  if (auto e = body.read_string("previous_response_id", previous)) return *e;
  req.previous_response_id = previous.value_or("");
  std::optional<bool> stream, store, parallel_tool_calls;
  if (auto e = body.read_bool("stream", stream)) return *e;
  if (auto e = body.read_bool("store", store)) return *e;
  if (auto e = body.read_bool("parallel_tool_calls", parallel_tool_calls)) return *e;
  req.stream = stream.value_or(req.stream);
  req.store = store.value_or(req.store);
  req.parallel_tool_calls = parallel_tool_calls.value_or(req.parallel_tool_calls);
  std::optional<bool> speculative;
  if (auto e = body.read_bool("speculative", speculative)) return *e;
  req.speculative = speculative.value_or(true);
  if (auto e = read_metadata(body, req.metadata)) return *e;

  SamplingOverrides& s = req.sampling;
  if (auto e = body.read_number("temperature", {0, 2}, s.temperature)) return *e;
  if (auto e = body.read_number("top_p", {0, 1}, s.top_p)) return *e;  // 0: greedy (resolve_sampling)
  if (auto e = body.read_number("min_p", {0, 1}, s.min_p)) return *e;
  if (auto e = body.read_number("repetition_penalty", {0, 10, /*lo_open=*/true}, s.repetition_penalty)) return *e;
  std::optional<int64_t> top_k, seed, max_output_tokens;
  if (auto e = body.read_int("top_k", 0, INT32_MAX, top_k)) return *e;
  if (top_k) s.top_k = int(*top_k);
  if (auto e = body.read_int("seed", INT64_MIN, INT64_MAX, seed)) return *e;
  if (seed) s.seed = uint64_t(*seed);
  if (auto e = body.read_int("max_output_tokens", 1, INT32_MAX, max_output_tokens)) return *e;
  if (max_output_tokens) req.max_output_tokens = int32_t(*max_output_tokens);

  // tools and tool_choice
  Json chat_tools = Json::array();
  std::optional<FieldReader> tools;
  if (auto e = body.read_array("tools", tools)) return *e;
  if (tools) {
    req.tools = tools->value();
    for (size_t i = 0; i < tools->value().size(); ++i) {
      auto tool = convert_tool(tools->at(i));
      if (auto* e = std::get_if<ApiError>(&tool)) return *e;
      chat_tools.push_back(std::move(std::get<Json>(tool)));
    }
  }
  if (const Json* choice = body.find("tool_choice")) {
    req.tool_choice = *choice;
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") {
        return body.error("tool_choice", "expected \"none\", \"auto\", \"required\" or {type: function, name}");
      }
      if (c == "none") chat_tools = Json::array();
      req.tools_required = c == "required";
    } else if (choice->is_object()) {
      const FieldReader cr = body.at("tool_choice");
      std::string type, name;
      if (auto e = cr.require_string("type", type)) return *e;
      if (type != "function") return cr.error("type", "only function tool choices are supported");
      if (auto e = cr.require_string("name", name)) return *e;
      Json only = Json::array();
      for (const Json& t : chat_tools) {
        if (t["function"]["name"] == name) only.push_back(t);
      }
      if (only.empty()) return cr.error("name", "no tool named \"" + name + "\" in tools");
      chat_tools = std::move(only);
      req.tools_required = true;
    } else {
      return body.type_error("tool_choice", "a string or an object");
    }
  }
  if (!chat_tools.empty()) req.chat_tools = std::move(chat_tools);

  std::optional<FieldReader> reasoning;
  if (auto e = body.read_object("reasoning", reasoning)) return *e;
  if (reasoning) {
    std::optional<std::string> effort;
    if (auto e = reasoning->read_string("effort", effort)) return *e;
    if (effort && !effort->empty()) {
      if (*effort != "none" && *effort != "minimal" && *effort != "low" && *effort != "medium" && *effort != "high" &&
          *effort != "xhigh") {
        return reasoning->error("effort", "expected none, minimal, low, medium, high or xhigh");
      }
      req.thinking_budget = thinking_budget_for_effort(*effort);
      req.enable_thinking = req.thinking_budget.has_value();
    }
    req.reasoning = {{"effort", effort && !effort->empty() ? Json(*effort) : Json(nullptr)}, {"summary", nullptr}};
  }
  std::optional<FieldReader> text;
  if (auto e = body.read_object("text", text)) return *e;
  if (text) {
    if (auto e = read_text_format(*text, req.constraint)) return *e;
    if (const Json* format = text->find("format")) req.text_format = *format;
  }
  // rill's extensions, as on chat: grammar (GBNF), regex, choice.
  if (auto e = read_grammar_fields(body, req.constraint)) return *e;
  if (const Json* bg = body.find("background"); bg != nullptr && bg->is_boolean() && bg->get<bool>()) {
    return body.error("background", "background responses are not supported");
  }
  return req;
}

nlohmann::ordered_json items_to_messages(const std::string& instructions, const nlohmann::ordered_json& items) {
  Json messages = Json::array();
  if (!instructions.empty()) messages.push_back({{"role", "system"}, {"content", instructions}});
  std::map<std::string, std::string> call_names;  // call_id -> function name
  std::string reasoning;                          // for the next assistant message
  bool last_is_assistant = false;                 // the previous item made messages.back()
  for (const Json& item : items) {
    const std::string type = item.value("type", "message");
    if (type == "message") {
      std::string role = item.value("role", "user");
      if (role == "developer") role = "system";
      Json msg = {{"role", role}, {"content", join_text(item["content"])}};
      if (role == "assistant" && !reasoning.empty()) {
        msg["reasoning_content"] = reasoning;
        reasoning.clear();
      }
      messages.push_back(std::move(msg));
      last_is_assistant = role == "assistant";
    } else if (type == "function_call") {
      const std::string call_id = item.value("call_id", ""), name = item.value("name", "");
      call_names[call_id] = name;
      if (!last_is_assistant) {
        Json msg = {{"role", "assistant"}, {"content", ""}};
        if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        reasoning.clear();
        messages.push_back(std::move(msg));
        last_is_assistant = true;
      }
      Json& msg = messages.back();
      if (!msg.contains("tool_calls")) msg["tool_calls"] = Json::array();
      msg["tool_calls"].push_back({{"id", call_id},
                                   {"type", "function"},
                                   {"function", {{"name", name}, {"arguments", item.value("arguments", "{}")}}}});
    } else if (type == "function_call_output") {
      const std::string call_id = item.value("call_id", "");
      Json msg = {{"role", "tool"}, {"tool_call_id", call_id}, {"content", item.value("output", "")}};
      if (auto it = call_names.find(call_id); it != call_names.end()) msg["name"] = it->second;
      messages.push_back(std::move(msg));
      last_is_assistant = false;
    } else if (type == "reasoning") {
      const std::string text = join_text(item.value("content", Json::array()));
      if (!text.empty()) reasoning += (reasoning.empty() ? "" : "\n") + text;
    }
  }
  return messages;
}

nlohmann::ordered_json response_skeleton(const ResponsesRequest& req, const std::string& id, int64_t created_at,
                                         const std::string& model, const std::string& instructions,
                                         const SamplingParams& sampling) {
  Json r;
  r["id"] = id;
  r["object"] = "response";
  r["created_at"] = created_at;
  r["status"] = "in_progress";
  r["background"] = false;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["instructions"] = instructions.empty() ? Json(nullptr) : Json(instructions);
  r["max_output_tokens"] = req.max_output_tokens ? Json(*req.max_output_tokens) : Json(nullptr);
  r["model"] = model;
  r["output"] = Json::array();
  r["parallel_tool_calls"] = req.parallel_tool_calls;
  r["previous_response_id"] = req.previous_response_id.empty() ? Json(nullptr) : Json(req.previous_response_id);
  r["reasoning"] = req.reasoning.is_null() ? Json{{"effort", nullptr}, {"summary", nullptr}} : req.reasoning;
  r["store"] = req.store;
  r["temperature"] = round6(sampling.temperature);
  r["text"] = {{"format", req.text_format}};
  r["tool_choice"] = req.tool_choice;
  r["tools"] = req.tools;
  r["top_p"] = round6(sampling.top_p);
  r["truncation"] = "disabled";
  r["usage"] = nullptr;
  r["user"] = nullptr;
  r["metadata"] = req.metadata;
  return r;
}

nlohmann::ordered_json responses_usage(const Usage& usage, int32_t reasoning_tokens) {
  return {{"input_tokens", usage.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"output_tokens", usage.completion_tokens},
          {"output_tokens_details",
           {{"reasoning_tokens", usage.reasoning_tokens > 0 ? usage.reasoning_tokens : reasoning_tokens}}},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

std::string ResponsesEncoder::frame(const char* type, nlohmann::ordered_json body) {
  const int64_t seq = sequence_++;
  if (!emit_) return "";
  Json ev = {{"type", type}};
  for (auto& [k, v] : body.items()) ev[k] = std::move(v);
  ev["sequence_number"] = seq;
  return sse_event(type, dump_responses_json(ev));
}

std::string ResponsesEncoder::created(const nlohmann::ordered_json& skeleton) {
  std::string out = frame("response.created", {{"response", skeleton}});
  out += frame("response.in_progress", {{"response", skeleton}});
  return out;
}

std::string ResponsesEncoder::open(Open kind) {
  Json item, part;
  if (kind == Open::kReasoning) {
    item = {{"id", random_id("rs_")},
            {"type", "reasoning"},
            {"summary", Json::array()},
            {"content", Json::array()},
            {"status", "in_progress"}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  } else {
    item = {{"id", random_id("msg_")},
            {"type", "message"},
            {"status", "in_progress"},
            {"content", Json::array()},
            {"role", "assistant"}};
    part = {{"type", "output_text"}, {"annotations", Json::array()}, {"logprobs", Json::array()}, {"text", ""}};
    saw_message_ = true;
  }
  const int64_t index = int64_t(output_.size());
  const std::string item_id = item["id"];
  std::string out = frame("response.output_item.added", {{"output_index", index}, {"item", item}});
  out += frame("response.content_part.added",
               {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  item["content"].push_back(std::move(part));
  output_.push_back(std::move(item));
  open_ = kind;
  return out;
}

std::string ResponsesEncoder::close(const char* status) {
  if (open_ == Open::kNone) return "";
  Json& item = output_.back();
  const int64_t index = int64_t(output_.size()) - 1;
  const std::string item_id = item["id"];
  const Json part = item["content"][0];
  std::string out;
  if (open_ == Open::kReasoning) {
    out += frame("response.reasoning_text.done",
                 {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", part["text"]}});
  } else {
    out += frame("response.output_text.done", {{"item_id", item_id},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"text", part["text"]},
                                               {"logprobs", Json::array()}});
  }
  out += frame("response.content_part.done",
               {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  item["status"] = status;
  out += frame("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Open::kNone;
  return out;
}

std::string ResponsesEncoder::delta(const OutputDelta& d) {
  std::string out;
  auto text = [&](Open kind, const std::string& piece, const char* event) {
    if (piece.empty()) return;
    if (open_ != kind) {
      out += close_call("completed");  // never open here: the parser ends a call before text
      out += close("completed");
      out += open(kind);
    }
    const int64_t index = int64_t(output_.size()) - 1;
    Json& item = output_.back();
    item["content"][0]["text"].get_ref<std::string&>() += piece;
    Json body = {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", piece}};
    if (kind == Open::kMessage) body["logprobs"] = Json::array();
    out += frame(event, std::move(body));
  };
  // A call open since an earlier delta: its pieces, then its end. Text
  // never comes while a call is open (the parser ends a call first).
  const std::vector<ToolCallDelta>& pieces = d.tool_call_deltas;
  size_t k = 0, n_ended = 0;
  for (; k < pieces.size() && call_open_ && pieces[k].name.empty(); ++k) out += call_arguments(pieces[k].arguments);
  if (call_open_ && n_ended < d.tool_calls.size()) {
    out += close_call("completed");
    ++n_ended;
  }
  text(Open::kReasoning, d.reasoning, "response.reasoning_text.delta");
  text(Open::kMessage, d.content, "response.output_text.delta");
  // Calls that begin in this delta: the item added with its name and
  // arguments "", function_call_arguments.delta per piece, then .done and
  // output_item.done when the parser ends the call.
  for (; k < pieces.size(); ++k) {
    if (pieces[k].name.empty()) {
      out += call_arguments(pieces[k].arguments);
      continue;
    }
    if (call_open_ && n_ended < d.tool_calls.size()) {
      out += close_call("completed");
      ++n_ended;
    }
    out += open_call(pieces[k]);
  }
  if (call_open_ && n_ended < d.tool_calls.size()) out += close_call("completed");
  return out;
}

std::string ResponsesEncoder::open_call(const ToolCallDelta& call) {
  std::string out = close("completed");
  saw_call_ = true;
  const int64_t index = int64_t(output_.size());
  Json item = {{"id", random_id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
               {"arguments", ""},        {"call_id", call.id},      {"name", call.name}};
  out += frame("response.output_item.added", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  call_open_ = true;
  return out;
}

std::string ResponsesEncoder::call_arguments(const std::string& piece) {
  if (!call_open_ || piece.empty()) return "";
  Json& item = output_.back();
  item["arguments"].get_ref<std::string&>() += piece;
  return frame("response.function_call_arguments.delta",
               {{"item_id", item["id"]}, {"output_index", int64_t(output_.size()) - 1}, {"delta", piece}});
}

std::string ResponsesEncoder::close_call(const char* status) {
  if (!call_open_) return "";
  call_open_ = false;
  Json& item = output_.back();
  const int64_t index = int64_t(output_.size()) - 1;
  std::string out = frame("response.function_call_arguments.done",
                          {{"item_id", item["id"]}, {"output_index", index}, {"arguments", item["arguments"]}});
  item["status"] = status;
  out += frame("response.output_item.done", {{"output_index", index}, {"item", item}});
  return out;
}

std::string ResponsesEncoder::finish(nlohmann::ordered_json& response, bool incomplete,
                                     const nlohmann::ordered_json& usage) {
  const char* item_status = incomplete ? "incomplete" : "completed";
  std::string out = close_call(item_status);
  out += close(item_status);
  if (!saw_message_ && !saw_call_) {
    out += open(Open::kMessage);
    out += close(item_status);
  }
  response["status"] = item_status;
  response["incomplete_details"] = incomplete ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  response["output"] = output_;
  response["usage"] = usage;
  out += frame(incomplete ? "response.incomplete" : "response.completed", {{"response", response}});
  return out;
}

std::string ResponsesEncoder::failed(nlohmann::ordered_json& response, const std::string& message,
                                     const nlohmann::ordered_json& usage) {
  std::string out = close_call("incomplete");
  out += close("incomplete");
  response["status"] = "failed";
  response["error"] = {{"code", "server_error"}, {"message", message}};
  response["output"] = output_;
  response["usage"] = usage;
  out += frame("response.failed", {{"response", response}});
  return out;
}

}  // namespace rill::server

namespace rill::server {

void assign_item_ids(Json& items) {
  for (Json& item : items) {
    if (!item.is_object() || item.contains("id")) continue;
    const std::string type = item.value("type", "");
    const char* prefix = type == "function_call"          ? "fc_"
                         : type == "function_call_output" ? "fco_"
                         : type == "reasoning"            ? "rs_"
                                                          : "msg_";
    // id first, as OpenAI lists an item's fields.
    Json with_id = {{"id", random_id(prefix)}};
    for (auto& [k, v] : item.items()) with_id[k] = std::move(v);
    item = std::move(with_id);
  }
}

namespace {

// %XX and '+' decoded; false on a malformed escape.
bool url_decode(std::string_view in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '+') {
      out += ' ';
    } else if (c == '%') {
      auto hex = [](char h) {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        return -1;
      };
      if (i + 2 >= in.size()) return false;
      const int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += c;
    }
  }
  return true;
}

ApiError query_error(const std::string& param, const std::string& message) {
  return ApiError(400, param + ": " + message, "invalid_request_error", param);
}

}  // namespace

std::variant<Json, ApiError> input_items_page(const Json& items, const std::string& query) {
  int64_t limit = 20;
  bool ascending = false;
  std::optional<std::string> after, before;
  size_t pos = 0;
  while (pos <= query.size() && !query.empty()) {
    const size_t amp = query.find('&', pos);
    const std::string_view pair(query.data() + pos, (amp == std::string::npos ? query.size() : amp) - pos);
    pos = amp == std::string::npos ? query.size() + 1 : amp + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    std::string key, value;
    if (!url_decode(pair.substr(0, eq), key) ||
        !url_decode(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1), value)) {
      return ApiError(400, "the query string has a malformed %-escape", "invalid_request_error");
    }
    if (key == "limit") {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v < 1 || v > 100) {
        return query_error("limit", "expected an integer from 1 to 100");
      }
      limit = v;
    } else if (key == "order") {
      if (value != "asc" && value != "desc") return query_error("order", "expected asc or desc");
      ascending = value == "asc";
    } else if (key == "after") {
      after = value;
    } else if (key == "before") {
      before = value;
    } else if (key == "include" || key == "include[]") {
      return query_error("include", "not supported: stored input items carry no extra data to include");
    } else {
      // Echoed only when it reads as a parameter name (it goes into JSON).
      const bool plain = !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '[' || c == ']';
      });
      if (!plain) return ApiError(400, "the query string names an unknown parameter", "invalid_request_error");
      return query_error(key, "unknown query parameter");
    }
  }
  // The items in the asked order, then the window between the cursors.
  std::vector<const Json*> ordered;
  for (const Json& item : items) ordered.push_back(&item);
  if (!ascending) std::reverse(ordered.begin(), ordered.end());
  auto index_of = [&](const std::string& id) -> std::optional<size_t> {
    for (size_t i = 0; i < ordered.size(); ++i) {
      if (ordered[i]->is_object() && ordered[i]->value("id", "") == id) return i;
    }
    return std::nullopt;
  };
  size_t first = 0, last = ordered.size();  // [first, last)
  if (after) {
    const auto i = index_of(*after);
    if (!i) return query_error("after", "no input item with id '" + *after + "' in this response");
    first = *i + 1;
  }
  if (before) {
    const auto i = index_of(*before);
    if (!i) return query_error("before", "no input item with id '" + *before + "' in this response");
    last = *i;
  }
  Json data = Json::array();
  // With only `before`, the page is the one just before the cursor.
  if (before && !after && last > static_cast<size_t>(limit)) first = last - static_cast<size_t>(limit);
  for (size_t i = first; i < last && static_cast<int64_t>(data.size()) < limit; ++i) data.push_back(*ordered[i]);
  const bool has_more = first + data.size() < last || (before && !after && first > 0);
  Json page = {{"object", "list"}, {"data", data}};
  page["first_id"] = data.empty() ? Json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? Json(nullptr) : data.back()["id"];
  page["has_more"] = has_more;
  return page;
}

}  // namespace rill::server
