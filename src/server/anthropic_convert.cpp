#include "server/anthropic_convert.h"

#include <climits>
#include <map>
#include <random>

#include "server/sse.h"

namespace rill::server {

namespace {

using Json = nlohmann::ordered_json;

ApiError bad_field(const std::string& field, const std::string& what) {
  ApiError e;
  e.status = 400;
  e.message = field + ": " + what;
  e.param = field;
  return e;
}

std::string index_path(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

void append_text(std::string& out, const std::string& text) {
  if (text.empty()) return;
  if (!out.empty()) out += "\n";
  out += text;
}

// A content block's type, or an error naming it.
std::optional<ApiError> block_type(const Json& block, const std::string& path, std::string& type) {
  if (!block.is_object()) return bad_field(path, "expected a content block object");
  auto it = block.find("type");
  if (it == block.end()) return bad_field(path + ".type", "field required");
  if (!it->is_string()) return bad_field(path + ".type", "expected a string");
  type = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> unsupported_block(const std::string& type, const std::string& path) {
  if (type == "image") return bad_field(path, "images are not supported");
  if (type == "document") return bad_field(path, "documents are not supported");
  return bad_field(path + ".type", "content block type \"" + type + "\" is not supported");
}

// A text block's text, appended to `out`.
std::optional<ApiError> text_block(const Json& block, const std::string& path, std::string& out) {
  auto it = block.find("text");
  if (it == block.end()) return bad_field(path + ".text", "field required");
  if (!it->is_string()) return bad_field(path + ".text", "expected a string");
  append_text(out, it->get<std::string>());
  return std::nullopt;
}

// system, and tool_result content: a string or an array of text blocks.
std::optional<ApiError> string_or_text_blocks(const Json& value, const std::string& path, std::string& out) {
  if (value.is_string()) {
    out = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array()) return bad_field(path, "expected a string or an array of text blocks");
  for (size_t j = 0; j < value.size(); ++j) {
    const std::string bpath = index_path(path, j);
    std::string type;
    if (auto e = block_type(value[j], bpath, type)) return e;
    if (type != "text") return unsupported_block(type, bpath);
    if (auto e = text_block(value[j], bpath, out)) return e;
  }
  return std::nullopt;
}

struct Translator {
  Json& messages;
  std::map<std::string, std::string> tool_names;  // tool_use id -> tool name

  // Anthropic merges consecutive turns of one role; templates that insist on
  // alternation need that too.
  void push_turn(const std::string& role, std::string text, Json tool_calls) {
    if (!messages.empty()) {
      Json& last = messages.back();
      if (last["role"] == role && last["content"].is_string()) {
        std::string merged = last["content"].get<std::string>();
        append_text(merged, text);
        last["content"] = merged;
        if (!tool_calls.empty()) {
          if (!last.contains("tool_calls")) last["tool_calls"] = Json::array();
          for (auto& c : tool_calls) last["tool_calls"].push_back(std::move(c));
        }
        return;
      }
    }
    Json m = {{"role", role}, {"content", std::move(text)}};
    if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
    messages.push_back(std::move(m));
  }

  std::optional<ApiError> message(const Json& msg, size_t i) {
    const std::string path = index_path("messages", i);
    if (!msg.is_object()) return bad_field(path, "expected a message object");
    auto role_it = msg.find("role");
    if (role_it == msg.end()) return bad_field(path + ".role", "field required");
    if (!role_it->is_string() || (*role_it != "user" && *role_it != "assistant"))
      return bad_field(path + ".role", "must be \"user\" or \"assistant\"");
    const std::string role = role_it->get<std::string>();
    auto content_it = msg.find("content");
    if (content_it == msg.end()) return bad_field(path + ".content", "field required");
    const Json& content = *content_it;
    if (content.is_string()) {
      push_turn(role, content.get<std::string>(), Json::array());
      return std::nullopt;
    }
    if (!content.is_array()) return bad_field(path + ".content", "expected a string or an array of content blocks");

    std::string text;
    Json tool_calls = Json::array();
    bool had_tool_results = false;
    for (size_t j = 0; j < content.size(); ++j) {
      const std::string bpath = index_path(path + ".content", j);
      const Json& block = content[j];
      std::string type;
      if (auto e = block_type(block, bpath, type)) return e;
      if (type == "text") {
        if (auto e = text_block(block, bpath, text)) return e;
      } else if (type == "thinking" || type == "redacted_thinking") {
        continue;  // the model's earlier reasoning is not replayed
      } else if (type == "tool_use") {
        if (role != "assistant") return bad_field(bpath + ".type", "tool_use blocks belong to assistant messages");
        if (auto e = tool_use(block, bpath, tool_calls)) return e;
      } else if (type == "tool_result") {
        if (role != "user") return bad_field(bpath + ".type", "tool_result blocks belong to user messages");
        if (auto e = tool_result(block, bpath)) return e;
        had_tool_results = true;
      } else {
        return unsupported_block(type, bpath);
      }
    }
    if (!had_tool_results || !text.empty() || !tool_calls.empty()) push_turn(role, std::move(text), std::move(tool_calls));
    return std::nullopt;
  }

  std::optional<ApiError> tool_use(const Json& block, const std::string& path, Json& tool_calls) {
    auto id = block.find("id");
    auto name = block.find("name");
    if (id == block.end() || !id->is_string()) return bad_field(path + ".id", "expected a string");
    if (name == block.end() || !name->is_string()) return bad_field(path + ".name", "expected a string");
    Json input = Json::object();
    if (auto it = block.find("input"); it != block.end()) {
      if (!it->is_object()) return bad_field(path + ".input", "expected an object");
      input = *it;
    }
    tool_names[id->get<std::string>()] = name->get<std::string>();
    tool_calls.push_back({{"id", *id},
                          {"type", "function"},
                          {"function", {{"name", *name}, {"arguments", dump_json(input)}}}});
    return std::nullopt;
  }

  // A role "tool" message, emitted at once: tool results go before the
  // user's text of the same turn.
  std::optional<ApiError> tool_result(const Json& block, const std::string& path) {
    auto id = block.find("tool_use_id");
    if (id == block.end()) return bad_field(path + ".tool_use_id", "field required");
    if (!id->is_string()) return bad_field(path + ".tool_use_id", "expected a string");
    std::string text;
    if (auto it = block.find("content"); it != block.end() && !it->is_null()) {
      if (auto e = string_or_text_blocks(*it, path + ".content", text)) return e;
    }
    if (auto it = block.find("is_error"); it != block.end()) {
      if (!it->is_boolean()) return bad_field(path + ".is_error", "expected a boolean");
      if (it->get<bool>()) text = "Error: " + text;
    }
    Json m = {{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(text)}};
    if (auto n = tool_names.find(id->get<std::string>()); n != tool_names.end()) m["name"] = n->second;
    messages.push_back(std::move(m));
    return std::nullopt;
  }
};

std::optional<ApiError> parse_tools(const Json& body, Json& tools) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return bad_field("tools", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string path = index_path("tools", i);
    if (!t.is_object()) return bad_field(path, "expected a tool object");
    if (auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom")
      return bad_field(path + ".type", "only client tools (type \"custom\") are supported");
    auto name = t.find("name");
    if (name == t.end()) return bad_field(path + ".name", "field required");
    if (!name->is_string() || name->get<std::string>().empty()) return bad_field(path + ".name", "expected a non-empty string");
    auto schema = t.find("input_schema");
    if (schema == t.end()) return bad_field(path + ".input_schema", "field required");
    if (!schema->is_object()) return bad_field(path + ".input_schema", "expected an object");
    Json fn = {{"name", *name}};
    if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (!d->is_string()) return bad_field(path + ".description", "expected a string");
      fn["description"] = *d;
    }
    fn["parameters"] = *schema;
    if (tools.is_null()) tools = Json::array();
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return std::nullopt;
}

// Applies tool_choice to the translated tools (see the header).
std::optional<ApiError> apply_tool_choice(const Json& body, Json& tools) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return bad_field("tool_choice", "expected an object");
  auto type = it->find("type");
  if (type == it->end()) return bad_field("tool_choice.type", "field required");
  if (*type == "auto" || *type == "any") return std::nullopt;
  if (*type == "none") {
    tools = nullptr;
    return std::nullopt;
  }
  if (*type != "tool") return bad_field("tool_choice.type", "must be one of \"auto\", \"any\", \"tool\", \"none\"");
  auto name = it->find("name");
  if (name == it->end() || !name->is_string()) return bad_field("tool_choice.name", "expected a string");
  if (tools.is_array()) {
    for (const auto& t : tools) {
      if (t["function"]["name"] == *name) {
        tools = Json::array({t});
        return std::nullopt;
      }
    }
  }
  return bad_field("tool_choice.name", "no tool named \"" + name->get<std::string>() + "\" in tools");
}

std::optional<ApiError> parse_thinking(const Json& body, Json& template_kwargs) {
  auto it = body.find("thinking");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return bad_field("thinking", "expected an object");
  auto type = it->find("type");
  if (type == it->end()) return bad_field("thinking.type", "field required");
  if (*type == "enabled" || *type == "adaptive") {
    template_kwargs["enable_thinking"] = true;
  } else if (*type == "disabled") {
    template_kwargs["enable_thinking"] = false;
  } else {
    return bad_field("thinking.type", "must be \"enabled\", \"adaptive\" or \"disabled\"");
  }
  return std::nullopt;
}

std::optional<ApiError> optional_number(const Json& body, const char* field, double lo, double hi,
                                        std::optional<float>& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad_field(field, "expected a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    return bad_field(field, "must be between " + dump_json(Json(lo)) + " and " + dump_json(Json(hi)));
  out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> parse_generation(const Json& body, AnthropicRequest& req) {
  auto mt = body.find("max_tokens");
  if (mt == body.end() || mt->is_null()) return bad_field("max_tokens", "field required");
  if (!mt->is_number_integer()) return bad_field("max_tokens", "expected an integer");
  if (mt->get<int64_t>() < 1 || mt->get<int64_t>() > INT32_MAX) return bad_field("max_tokens", "must be at least 1");
  req.chat.generation.max_tokens = static_cast<int32_t>(mt->get<int64_t>());

  if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return bad_field("stop_sequences", "expected an array of strings");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& s = (*it)[i];
      if (!s.is_string()) return bad_field(index_path("stop_sequences", i), "expected a string");
      if (s.get<std::string>().empty()) return bad_field(index_path("stop_sequences", i), "must not be empty");
      req.chat.generation.stop.push_back(s.get<std::string>());
    }
  }
  if (auto e = optional_number(body, "temperature", 0.0, 2.0, req.sampling.temperature)) return e;
  if (auto e = optional_number(body, "top_p", 0.0, 1.0, req.sampling.top_p)) return e;
  if (auto it = body.find("top_k"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad_field("top_k", "expected an integer");
    if (it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) return bad_field("top_k", "must be at least 0");
    req.sampling.top_k = static_cast<int>(it->get<int64_t>());
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad_field("stream", "expected a boolean");
    req.stream = it->get<bool>();
  }
  return std::nullopt;
}

}  // namespace

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const nlohmann::ordered_json& body,
                                                                 bool count_tokens) {
  if (!body.is_object()) return bad_field("body", "expected a JSON object");
  AnthropicRequest req;

  auto model = body.find("model");
  if (model == body.end() || model->is_null()) return bad_field("model", "field required");
  if (!model->is_string()) return bad_field("model", "expected a string");
  req.model = model->get<std::string>();

  if (!count_tokens) {
    if (auto e = parse_generation(body, req)) return *e;
  }

  Json& messages = req.chat.messages;
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    std::string system;
    if (auto e = string_or_text_blocks(*it, "system", system)) return *e;
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", std::move(system)}});
  }
  auto msgs = body.find("messages");
  if (msgs == body.end() || msgs->is_null()) return bad_field("messages", "field required");
  if (!msgs->is_array()) return bad_field("messages", "expected an array");
  if (msgs->empty()) return bad_field("messages", "must contain at least one message");
  Translator translator{messages, {}};
  for (size_t i = 0; i < msgs->size(); ++i) {
    if (auto e = translator.message((*msgs)[i], i)) return *e;
  }

  req.chat.tools = nullptr;
  if (auto e = parse_tools(body, req.chat.tools)) return *e;
  if (auto e = apply_tool_choice(body, req.chat.tools)) return *e;
  if (auto e = parse_thinking(body, req.chat.template_kwargs)) return *e;
  return req;
}

std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const std::string& body, bool count_tokens) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ApiError e;
    e.message = "invalid JSON in the request body";
    return e;
  }
  return parse_anthropic_request(j, count_tokens);
}

std::string new_anthropic_id(const char* prefix) {
  static constexpr char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

AnthropicStop anthropic_stop(const ChatResult& result) {
  if (result.finish_reason == "tool_calls" || (!result.tool_calls.empty() && result.finish_reason == "stop"))
    return {"tool_use", std::nullopt};
  if (result.finish_reason == "length") return {"max_tokens", std::nullopt};
  if (result.finish_reason == "stop" && !result.stop_string.empty()) return {"stop_sequence", result.stop_string};
  return {"end_turn", std::nullopt};
}

nlohmann::ordered_json anthropic_usage(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens - usage.cached_tokens},
          {"output_tokens", usage.completion_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", usage.cached_tokens}};
}

namespace {

Json stop_sequence_json(const AnthropicStop& stop) {
  return stop.sequence ? Json(*stop.sequence) : Json(nullptr);
}

Json tool_use_block(const ToolCall& call) {
  Json input = Json::parse(call.arguments, nullptr, false);
  if (input.is_discarded() || !input.is_object()) input = Json::object();
  return {{"type", "tool_use"}, {"id", new_anthropic_id("toolu_")}, {"name", call.name}, {"input", std::move(input)}};
}

}  // namespace

nlohmann::ordered_json anthropic_message(const std::string& id, const std::string& model, const ChatResult& result,
                                         const AnthropicStop& stop) {
  Json content = Json::array();
  if (!result.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", result.reasoning}, {"signature", ""}});
  if (!result.content.empty() || (result.reasoning.empty() && result.tool_calls.empty()))
    content.push_back({{"type", "text"}, {"text", result.content}});
  for (const auto& call : result.tool_calls) content.push_back(tool_use_block(call));
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", std::move(content)},
          {"stop_reason", stop.reason},
          {"stop_sequence", stop_sequence_json(stop)},
          {"usage", anthropic_usage(result.usage)}};
}

std::string AnthropicStreamEncoder::start(const Usage& usage) {
  Json message = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", model_},
                  {"content", Json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", anthropic_usage(usage)}};
  return sse_event("message_start", dump_json({{"type", "message_start"}, {"message", std::move(message)}}));
}

std::string AnthropicStreamEncoder::open(Block kind) {
  open_ = kind;
  open_index_ = n_blocks_++;
  Json block = kind == Block::kThinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                        : Json{{"type", "text"}, {"text", ""}};
  return sse_event("content_block_start", dump_json({{"type", "content_block_start"},
                                                     {"index", open_index_},
                                                     {"content_block", std::move(block)}}));
}

std::string AnthropicStreamEncoder::close() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  return sse_event("content_block_stop", dump_json({{"type", "content_block_stop"}, {"index", open_index_}}));
}

std::string AnthropicStreamEncoder::delta(const OutputDelta& delta) {
  std::string out;
  auto block_delta = [&](int index, Json d) {
    out += sse_event("content_block_delta",
                     dump_json({{"type", "content_block_delta"}, {"index", index}, {"delta", std::move(d)}}));
  };
  if (!delta.reasoning.empty()) {
    if (open_ != Block::kThinking) {
      out += close();
      out += open(Block::kThinking);
    }
    block_delta(open_index_, {{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
  }
  if (!delta.content.empty()) {
    if (open_ != Block::kText) {
      out += close();
      out += open(Block::kText);
    }
    block_delta(open_index_, {{"type", "text_delta"}, {"text", delta.content}});
  }
  for (const auto& call : delta.tool_calls) {
    out += close();
    const int index = n_blocks_++;
    Json block = tool_use_block(call);
    const std::string arguments = dump_json(block["input"]);
    block["input"] = Json::object();
    out += sse_event("content_block_start", dump_json({{"type", "content_block_start"},
                                                       {"index", index},
                                                       {"content_block", std::move(block)}}));
    block_delta(index, {{"type", "input_json_delta"}, {"partial_json", arguments}});
    out += sse_event("content_block_stop", dump_json({{"type", "content_block_stop"}, {"index", index}}));
  }
  return out;
}

std::string AnthropicStreamEncoder::finish(const ChatResult& result, const AnthropicStop& stop) {
  std::string out;
  if (n_blocks_ == 0) out += open(Block::kText);
  out += close();
  Json delta = {{"stop_reason", stop.reason}, {"stop_sequence", stop_sequence_json(stop)}};
  out += sse_event("message_delta", dump_json({{"type", "message_delta"},
                                               {"delta", std::move(delta)},
                                               {"usage", anthropic_usage(result.usage)}}));
  out += sse_event("message_stop", dump_json({{"type", "message_stop"}}));
  return out;
}

std::string AnthropicStreamEncoder::error(const std::string& message) {
  return sse_event("error", dump_json({{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}}));
}

}  // namespace rill::server
