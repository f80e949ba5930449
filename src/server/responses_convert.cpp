#include "server/responses_convert.h"

#include <climits>
#include <cmath>
#include <map>

#include "server/response_store.h"
#include "server/sse.h"

namespace rill::server {

namespace {

using Json = nlohmann::ordered_json;

ApiError bad_field(const std::string& field, const std::string& what) {
  return ApiError(400, field + ": " + what, "invalid_request_error", field);
}

std::string index_path(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

// A field that is absent or null reads as unset.
const Json* field(const Json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> read_string(const Json& obj, const char* name, const std::string& path,
                                    std::string& out, bool required) {
  const Json* v = field(obj, name);
  if (v == nullptr)
    return required ? std::optional(bad_field(path, "field required")) : std::nullopt;
  if (!v->is_string()) return bad_field(path, "expected a string");
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> read_bool(const Json& obj, const char* name, bool& out) {
  const Json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return bad_field(name, "expected a boolean");
  out = v->get<bool>();
  return std::nullopt;
}

// A number in [lo, hi] (`lo_open`: lo itself excluded).
std::optional<ApiError> read_float(const Json& obj, const char* name, double lo, double hi,
                                   bool lo_open, std::optional<float>& out) {
  const Json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return bad_field(name, "expected a number");
  const double x = v->get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) {
    return bad_field(name, "must be " + std::string(lo_open ? "greater than " : "at least ") +
                               nlohmann::json(lo).dump() + " and at most " +
                               nlohmann::json(hi).dump());
  }
  out = float(x);
  return std::nullopt;
}

std::optional<ApiError> read_int(const Json& obj, const char* name, int64_t lo, int64_t hi,
                                 std::optional<int64_t>& out) {
  const Json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) return bad_field(name, "expected an integer");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : v->get<int64_t>();
  if (x < lo || x > hi)
    return bad_field(name, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  out = x;
  return std::nullopt;
}

// Text parts of a message or function_call_output: [{type, text}].
std::optional<ApiError> read_parts(const Json& parts, const std::string& path,
                                   bool allow_output_text, Json& out) {
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string ppath = index_path(path, j);
    const Json& part = parts[j];
    if (!part.is_object()) return bad_field(ppath, "expected a content part object");
    std::string type, text;
    if (auto e = read_string(part, "type", ppath + ".type", type, true)) return e;
    if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return bad_field(ppath + ".type",
                       "content part type \"" + type + "\" is not supported (text only)");
    }
    if (type == "refusal") {
      if (auto e = read_string(part, "refusal", ppath + ".refusal", text, true)) return e;
    } else if (type == "input_text" || type == "text" ||
               (allow_output_text && type == "output_text")) {
      if (auto e = read_string(part, "text", ppath + ".text", text, true)) return e;
    } else {
      return bad_field(ppath + ".type", "content part type \"" + type + "\" is not supported");
    }
    out.push_back({{"type", type == "input_text" || type == "text" ? "input_text" : "output_text"},
                   {"text", text}});
  }
  return std::nullopt;
}

std::variant<Json, ApiError> normalize_item(const Json& item, const std::string& path) {
  if (!item.is_object()) return bad_field(path, "expected an input item object");
  std::string type;
  if (field(item, "type") == nullptr && field(item, "role") != nullptr) {
    type = "message";  // EasyInputMessage: {role, content}
  } else if (auto e = read_string(item, "type", path + ".type", type, true)) {
    return *e;
  }
  if (type == "message") {
    std::string role;
    if (auto e = read_string(item, "role", path + ".role", role, true)) return *e;
    if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
      return bad_field(path + ".role", "unknown role \"" + role +
                                           "\" (expected user, assistant, system or developer)");
    }
    const Json* content = field(item, "content");
    if (content == nullptr) return bad_field(path + ".content", "field required");
    Json parts = Json::array();
    if (content->is_string()) {
      parts.push_back(
          {{"type", role == "assistant" ? "output_text" : "input_text"}, {"text", *content}});
    } else if (content->is_array()) {
      if (auto e = read_parts(*content, path + ".content", true, parts)) return *e;
    } else {
      return bad_field(path + ".content", "expected a string or an array of content parts");
    }
    return Json{{"type", "message"}, {"role", role}, {"content", std::move(parts)}};
  }
  if (type == "function_call") {
    std::string call_id, name, arguments;
    if (auto e = read_string(item, "call_id", path + ".call_id", call_id, true)) return *e;
    if (auto e = read_string(item, "name", path + ".name", name, true)) return *e;
    const Json* args = field(item, "arguments");
    if (args == nullptr) return bad_field(path + ".arguments", "field required");
    if (args->is_string()) {
      arguments = args->get<std::string>();
    } else if (args->is_object()) {
      arguments = dump_responses_json(*args);  // lenient: clients that send the object itself
    } else {
      return bad_field(path + ".arguments", "expected a JSON string");
    }
    return Json{
        {"type", "function_call"}, {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
  }
  if (type == "function_call_output") {
    std::string call_id, output;
    if (auto e = read_string(item, "call_id", path + ".call_id", call_id, true)) return *e;
    const Json* out = field(item, "output");
    if (out == nullptr) return bad_field(path + ".output", "field required");
    if (out->is_string()) {
      output = out->get<std::string>();
    } else if (out->is_array()) {
      Json parts = Json::array();
      if (auto e = read_parts(*out, path + ".output", false, parts)) return *e;
      for (const Json& p : parts)
        output += (output.empty() ? "" : "\n") + p["text"].get<std::string>();
    } else {
      return bad_field(path + ".output", "expected a string or an array of content parts");
    }
    return Json{{"type", "function_call_output"}, {"call_id", call_id}, {"output", output}};
  }
  if (type == "reasoning") {
    Json content = Json::array();
    if (const Json* c = field(item, "content")) {
      if (!c->is_array()) return bad_field(path + ".content", "expected an array");
      for (size_t j = 0; j < c->size(); ++j) {
        const Json& part = (*c)[j];
        std::string text;
        if (!part.is_object())
          return bad_field(index_path(path + ".content", j), "expected an object");
        if (auto e =
                read_string(part, "text", index_path(path + ".content", j) + ".text", text, true))
          return *e;
        content.push_back({{"type", "reasoning_text"}, {"text", text}});
      }
    }
    return Json{{"type", "reasoning"}, {"summary", Json::array()}, {"content", std::move(content)}};
  }
  if (type == "item_reference") {
    return bad_field(path + ".type", "item references are not supported; use previous_response_id");
  }
  return bad_field(path + ".type", "input item type \"" + type + "\" is not supported");
}

std::variant<Json, ApiError> convert_tool(const Json& tool, const std::string& path) {
  if (!tool.is_object()) return bad_field(path, "expected a tool object");
  std::string type;
  if (auto e = read_string(tool, "type", path + ".type", type, true)) return *e;
  if (type != "function") {
    return bad_field(path + ".type",
                     "tool type \"" + type + "\" is not supported (only function tools)");
  }
  if (const Json* nested = field(tool, "function")) {  // the chat-completions shape, accepted too
    if (!nested->is_object()) return bad_field(path + ".function", "expected an object");
    Json flat = {{"type", "function"}};
    flat.update(*nested);
    return convert_tool(flat, path + ".function");
  }
  Json fn = Json::object();
  std::string name;
  if (auto e = read_string(tool, "name", path + ".name", name, true)) return *e;
  fn["name"] = name;
  std::string description;
  if (auto e = read_string(tool, "description", path + ".description", description, false))
    return *e;
  if (!description.empty()) fn["description"] = description;
  if (const Json* params = field(tool, "parameters")) {
    if (!params->is_object())
      return bad_field(path + ".parameters", "expected a JSON schema object");
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
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return ApiError(400, "invalid JSON in the request body", "invalid_request_error");
  return parse_responses_request(parsed);
}

std::variant<ResponsesRequest, ApiError> parse_responses_request(
    const nlohmann::ordered_json& body) {
  if (!body.is_object()) return bad_field("body", "expected a JSON object");
  ResponsesRequest req;
  if (auto e = read_string(body, "model", "model", req.model, false)) return *e;

  const Json* input = field(body, "input");
  if (input == nullptr) return bad_field("input", "field required");
  if (input->is_string()) {
    req.input_items.push_back(
        {{"type", "message"},
         {"role", "user"},
         {"content", Json::array({{{"type", "input_text"}, {"text", *input}}})}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      auto item = normalize_item((*input)[i], index_path("input", i));
      if (auto* e = std::get_if<ApiError>(&item)) return *e;
      req.input_items.push_back(std::move(std::get<Json>(item)));
    }
  } else {
    return bad_field("input", "expected a string or an array of input items");
  }

  if (const Json* v = field(body, "instructions")) {
    if (!v->is_string()) return bad_field("instructions", "expected a string");
    req.instructions = v->get<std::string>();
  }
  if (auto e = read_string(body, "previous_response_id", "previous_response_id",
                           req.previous_response_id, false)) {
    return *e;
  }
  if (auto e = read_bool(body, "stream", req.stream)) return *e;
  if (auto e = read_bool(body, "store", req.store)) return *e;
  if (auto e = read_bool(body, "parallel_tool_calls", req.parallel_tool_calls)) return *e;
  if (const Json* v = field(body, "metadata")) {
    if (!v->is_object()) return bad_field("metadata", "expected an object");
    req.metadata = *v;
  }

  SamplingOverrides& s = req.sampling;
  if (auto e = read_float(body, "temperature", 0, 2, false, s.temperature)) return *e;
  if (auto e = read_float(body, "top_p", 0, 1, true, s.top_p)) return *e;
  if (auto e = read_float(body, "min_p", 0, 1, false, s.min_p)) return *e;
  if (auto e = read_float(body, "repetition_penalty", 0, 10, true, s.repetition_penalty)) return *e;
  std::optional<int64_t> top_k, seed, max_output_tokens;
  if (auto e = read_int(body, "top_k", 0, INT32_MAX, top_k)) return *e;
  if (top_k) s.top_k = int(*top_k);
  if (auto e = read_int(body, "seed", INT64_MIN, INT64_MAX, seed)) return *e;
  if (seed) s.seed = uint64_t(*seed);
  if (auto e = read_int(body, "max_output_tokens", 1, INT32_MAX, max_output_tokens)) return *e;
  if (max_output_tokens) req.max_output_tokens = int32_t(*max_output_tokens);

  // tools and tool_choice
  Json chat_tools = Json::array();
  if (const Json* tools = field(body, "tools")) {
    if (!tools->is_array()) return bad_field("tools", "expected an array of tools");
    req.tools = *tools;
    for (size_t i = 0; i < tools->size(); ++i) {
      auto tool = convert_tool((*tools)[i], index_path("tools", i));
      if (auto* e = std::get_if<ApiError>(&tool)) return *e;
      chat_tools.push_back(std::move(std::get<Json>(tool)));
    }
  }
  if (const Json* choice = field(body, "tool_choice")) {
    req.tool_choice = *choice;
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") {
        return bad_field("tool_choice",
                         "expected \"none\", \"auto\", \"required\" or {type: function, name}");
      }
      if (c == "none") chat_tools = Json::array();
    } else if (choice->is_object()) {
      std::string type, name;
      if (auto e = read_string(*choice, "type", "tool_choice.type", type, true)) return *e;
      if (type != "function")
        return bad_field("tool_choice.type", "only function tool choices are supported");
      if (auto e = read_string(*choice, "name", "tool_choice.name", name, true)) return *e;
      Json only = Json::array();
      for (const Json& t : chat_tools) {
        if (t["function"]["name"] == name) only.push_back(t);
      }
      if (only.empty())
        return bad_field("tool_choice.name", "no tool named \"" + name + "\" in tools");
      chat_tools = std::move(only);
    } else {
      return bad_field("tool_choice", "expected a string or an object");
    }
  }
  if (!chat_tools.empty()) req.chat_tools = std::move(chat_tools);

  if (const Json* r = field(body, "reasoning")) {
    if (!r->is_object()) return bad_field("reasoning", "expected an object");
    std::string effort;
    if (auto e = read_string(*r, "effort", "reasoning.effort", effort, false)) return *e;
    if (!effort.empty()) {
      if (effort != "none" && effort != "minimal" && effort != "low" && effort != "medium" &&
          effort != "high" && effort != "xhigh") {
        return bad_field("reasoning.effort", "expected none, minimal, low, medium, high or xhigh");
      }
      req.enable_thinking = effort != "none" && effort != "minimal";
    }
    req.reasoning = {{"effort", effort.empty() ? Json(nullptr) : Json(effort)},
                     {"summary", nullptr}};
  }
  if (const Json* text = field(body, "text")) {
    if (!text->is_object()) return bad_field("text", "expected an object");
    if (const Json* format = field(*text, "format")) {
      std::string type;
      if (!format->is_object()) return bad_field("text.format", "expected an object");
      if (auto e = read_string(*format, "type", "text.format.type", type, true)) return *e;
      if (type != "text") return bad_field("text.format.type", "only \"text\" output is supported");
    }
  }
  if (const Json* bg = field(body, "background");
      bg != nullptr && bg->is_boolean() && bg->get<bool>()) {
    return bad_field("background", "background responses are not supported");
  }
  return req;
}

nlohmann::ordered_json items_to_messages(const std::string& instructions,
                                         const nlohmann::ordered_json& items) {
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
      msg["tool_calls"].push_back(
          {{"id", call_id},
           {"type", "function"},
           {"function", {{"name", name}, {"arguments", item.value("arguments", "{}")}}}});
    } else if (type == "function_call_output") {
      const std::string call_id = item.value("call_id", "");
      Json msg = {
          {"role", "tool"}, {"tool_call_id", call_id}, {"content", item.value("output", "")}};
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

nlohmann::ordered_json response_skeleton(const ResponsesRequest& req, const std::string& id,
                                         int64_t created_at, const std::string& model,
                                         const std::string& instructions,
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
  r["previous_response_id"] =
      req.previous_response_id.empty() ? Json(nullptr) : Json(req.previous_response_id);
  r["reasoning"] =
      req.reasoning.is_null() ? Json{{"effort", nullptr}, {"summary", nullptr}} : req.reasoning;
  r["store"] = req.store;
  r["temperature"] = round6(sampling.temperature);
  r["text"] = {{"format", {{"type", "text"}}}};
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
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
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
    part = {{"type", "output_text"}, {"annotations", Json::array()}, {"text", ""}};
    saw_message_ = true;
  }
  const int64_t index = int64_t(output_.size());
  const std::string item_id = item["id"];
  std::string out = frame("response.output_item.added", {{"output_index", index}, {"item", item}});
  out +=
      frame("response.content_part.added",
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
    out += frame("response.reasoning_text.done", {{"item_id", item_id},
                                                  {"output_index", index},
                                                  {"content_index", 0},
                                                  {"text", part["text"]}});
  } else {
    out += frame("response.output_text.done", {{"item_id", item_id},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"text", part["text"]},
                                               {"logprobs", Json::array()}});
  }
  out +=
      frame("response.content_part.done",
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
      out += close("completed");
      out += open(kind);
    }
    const int64_t index = int64_t(output_.size()) - 1;
    Json& item = output_.back();
    item["content"][0]["text"].get_ref<std::string&>() += piece;
    Json body = {
        {"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", piece}};
    if (kind == Open::kMessage) body["logprobs"] = Json::array();
    out += frame(event, std::move(body));
  };
  text(Open::kReasoning, d.reasoning, "response.reasoning_text.delta");
  text(Open::kMessage, d.content, "response.output_text.delta");
  for (const ToolCall& call : d.tool_calls) {
    out += close("completed");
    saw_call_ = true;
    const int64_t index = int64_t(output_.size());
    Json item = {{"id", random_id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                 {"arguments", ""},        {"call_id", call.id},      {"name", call.name}};
    const std::string item_id = item["id"];
    out += frame("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += frame("response.function_call_arguments.delta",
                 {{"item_id", item_id}, {"output_index", index}, {"delta", call.arguments}});
    out += frame("response.function_call_arguments.done",
                 {{"item_id", item_id}, {"output_index", index}, {"arguments", call.arguments}});
    item["arguments"] = call.arguments;
    item["status"] = "completed";
    out += frame("response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
  }
  return out;
}

std::string ResponsesEncoder::finish(nlohmann::ordered_json& response, bool incomplete,
                                     const nlohmann::ordered_json& usage) {
  const char* item_status = incomplete ? "incomplete" : "completed";
  std::string out = close(item_status);
  if (!saw_message_ && !saw_call_) {
    out += open(Open::kMessage);
    out += close(item_status);
  }
  response["status"] = item_status;
  response["incomplete_details"] =
      incomplete ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  response["output"] = output_;
  response["usage"] = usage;
  out += frame(incomplete ? "response.incomplete" : "response.completed", {{"response", response}});
  return out;
}

std::string ResponsesEncoder::error(const std::string& message) {
  return frame("error", {{"code", "server_error"}, {"message", message}, {"param", nullptr}});
}

}  // namespace rill::server
