#include "server/anthropic_convert.h"

#include <climits>
#include <map>
#include <random>

#include "core/json_parse.h"
#include "server/field_reader.h"
#include "server/sse.h"

namespace rill::server {

namespace {

using Json = nlohmann::ordered_json;

void append_text(std::string& out, const std::string& text) {
  if (text.empty()) return;
  if (!out.empty()) out += "\n";
  out += text;
}

// A content block's type, or an error naming it.
std::optional<ApiError> block_type(const FieldReader& block, std::string& type) {
  if (!block.value().is_object()) return block.type_error("a content block object");
  return block.require_string("type", type);
}

ApiError unsupported_block(const std::string& type, const FieldReader& block) {
  if (type == "image") return block.error("images are not supported");
  if (type == "document") return block.error("documents are not supported");
  return block.error("type", "content block type \"" + type + "\" is not supported");
}

// A text block's text, appended to `out`.
std::optional<ApiError> text_block(const FieldReader& block, std::string& out) {
  std::string text;
  if (auto e = block.require_string("text", text)) return e;
  append_text(out, text);
  return std::nullopt;
}

// system, and tool_result content: a string or an array of text blocks.
std::optional<ApiError> string_or_text_blocks(const FieldReader& value, std::string& out) {
  if (value.value().is_string()) {
    out = value.value().get<std::string>();
    return std::nullopt;
  }
  if (!value.value().is_array()) return value.type_error("a string or an array of text blocks");
  for (size_t j = 0; j < value.value().size(); ++j) {
    const FieldReader block = value.at(j);
    std::string type;
    if (auto e = block_type(block, type)) return e;
    if (type != "text") return unsupported_block(type, block);
    if (auto e = text_block(block, out)) return e;
  }
  return std::nullopt;
}

struct Translator {
  Json& messages;
  std::map<std::string, std::string> tool_names;  // tool_use id -> tool name

  // Anthropic merges consecutive turns of one role; templates that insist on
  // alternation need that too.
  // `reasoning`: the turn's thinking blocks, as reasoning_content (what
  // templates that replay thinking read).
  void push_turn(const std::string& role, std::string text, Json tool_calls, std::string reasoning = "") {
    if (!messages.empty()) {
      Json& last = messages.back();
      if (last["role"] == role && last["content"].is_string()) {
        std::string merged = last["content"].get<std::string>();
        append_text(merged, text);
        last["content"] = merged;
        if (!reasoning.empty()) {
          std::string r = last.value("reasoning_content", "");
          append_text(r, reasoning);
          last["reasoning_content"] = std::move(r);
        }
        if (!tool_calls.empty()) {
          if (!last.contains("tool_calls")) last["tool_calls"] = Json::array();
          for (auto& c : tool_calls) last["tool_calls"].push_back(std::move(c));
        }
        return;
      }
    }
    Json m = {{"role", role}, {"content", std::move(text)}};
    if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
    if (!reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
    messages.push_back(std::move(m));
  }

  std::optional<ApiError> message(const FieldReader& msg) {
    if (!msg.value().is_object()) return msg.type_error("a message object");
    const Json* role_v = msg.find("role");
    if (role_v == nullptr) return msg.error("role", "field required");
    if (!role_v->is_string() || (*role_v != "user" && *role_v != "assistant"))
      return msg.error("role", "must be \"user\" or \"assistant\"");
    const std::string role = role_v->get<std::string>();
    const Json* content_v = msg.find("content");
    if (content_v == nullptr) return msg.error("content", "field required");
    if (content_v->is_string()) {
      push_turn(role, content_v->get<std::string>(), Json::array());
      return std::nullopt;
    }
    if (!content_v->is_array()) return msg.type_error("content", "a string or an array of content blocks");
    const FieldReader content = msg.at("content");

    std::string text, reasoning;
    Json tool_calls = Json::array();
    bool had_tool_results = false;
    for (size_t j = 0; j < content_v->size(); ++j) {
      const FieldReader block = content.at(j);
      std::string type;
      if (auto e = block_type(block, type)) return e;
      if (type == "text") {
        if (auto e = text_block(block, text)) return e;
      } else if (type == "thinking") {
        // The model's earlier reasoning, for templates that replay it.
        if (role != "assistant") return block.error("type", "thinking blocks belong to assistant messages");
        std::string thinking;
        if (auto e = block.require_string("thinking", thinking)) return e;
        append_text(reasoning, thinking);
      } else if (type == "redacted_thinking") {
        continue;  // encrypted by another provider: nothing a template can show
      } else if (type == "tool_use") {
        if (role != "assistant") return block.error("type", "tool_use blocks belong to assistant messages");
        if (auto e = tool_use(block, tool_calls)) return e;
      } else if (type == "tool_result") {
        if (role != "user") return block.error("type", "tool_result blocks belong to user messages");
        if (auto e = tool_result(block)) return e;
        had_tool_results = true;
      } else {
        return unsupported_block(type, block);
      }
    }
    if (!had_tool_results || !text.empty() || !tool_calls.empty() || !reasoning.empty())
      push_turn(role, std::move(text), std::move(tool_calls), std::move(reasoning));
    return std::nullopt;
  }

  std::optional<ApiError> tool_use(const FieldReader& block, Json& tool_calls) {
    std::string id, name;
    if (auto e = block.require_string("id", id)) return e;
    if (auto e = block.require_string("name", name)) return e;
    std::optional<FieldReader> input_r;
    if (auto e = block.read_object("input", input_r)) return e;
    const Json input = input_r ? input_r->value() : Json::object();
    tool_names[id] = name;
    tool_calls.push_back(
        {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", dump_json(input)}}}});
    return std::nullopt;
  }

  // A role "tool" message, emitted at once: tool results go before the
  // user's text of the same turn.
  std::optional<ApiError> tool_result(const FieldReader& block) {
    std::string id;
    if (auto e = block.require_string("tool_use_id", id)) return e;
    std::string text;
    if (block.find("content") != nullptr) {
      if (auto e = string_or_text_blocks(block.at("content"), text)) return e;
    }
    std::optional<bool> is_error;
    if (auto e = block.read_bool("is_error", is_error)) return e;
    if (is_error.value_or(false)) text = "Error: " + text;
    Json m = {{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(text)}};
    if (auto n = tool_names.find(id); n != tool_names.end()) m["name"] = n->second;
    messages.push_back(std::move(m));
    return std::nullopt;
  }
};

std::optional<ApiError> parse_tools(const FieldReader& body, Json& tools) {
  std::optional<FieldReader> list;
  if (auto e = body.read_array("tools", list)) return e;
  if (!list) return std::nullopt;
  for (size_t i = 0; i < list->value().size(); ++i) {
    const FieldReader t = list->at(i);
    if (!t.value().is_object()) return t.type_error("a tool object");
    if (const Json* type = t.find("type"); type != nullptr && *type != "custom")
      return t.error("type", "only client tools (type \"custom\") are supported");
    std::string name;
    if (auto e = t.require_string("name", name)) return e;
    if (name.empty()) return t.error("name", "expected a non-empty string");
    if (t.find("input_schema") == nullptr) return t.error("input_schema", "field required");
    std::optional<FieldReader> schema;
    if (auto e = t.read_object("input_schema", schema)) return e;
    Json fn = {{"name", name}};
    std::optional<std::string> description;
    if (auto e = t.read_string("description", description)) return e;
    if (description) fn["description"] = *description;
    fn["parameters"] = schema->value();
    if (tools.is_null()) tools = Json::array();
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return std::nullopt;
}

// Applies tool_choice to the translated tools (see the header).
std::optional<ApiError> apply_tool_choice(const FieldReader& body, ChatInput& chat) {
  Json& tools = chat.tools;
  std::optional<FieldReader> choice;
  if (auto e = body.read_object("tool_choice", choice)) return e;
  if (!choice) return std::nullopt;
  std::string type;
  if (auto e = choice->require_string("type", type)) return e;
  std::optional<bool> disable_parallel;
  if (auto e = choice->read_bool("disable_parallel_tool_use", disable_parallel)) return e;
  chat.parallel_tool_calls = !disable_parallel.value_or(false);
  if (type == "auto") return std::nullopt;
  if (type == "any") {
    if (!tools.is_array() || tools.empty()) return choice->error("type", "\"any\" needs tools");
    chat.tools_required = true;
    return std::nullopt;
  }
  if (type == "none") {
    tools = nullptr;
    return std::nullopt;
  }
  if (type != "tool") return choice->error("type", "must be one of \"auto\", \"any\", \"tool\", \"none\"");
  std::string name;
  if (auto e = choice->require_string("name", name)) return e;
  if (tools.is_array()) {
    for (const auto& t : tools) {
      if (t["function"]["name"] == name) {
        tools = Json::array({t});
        chat.tools_required = true;
        return std::nullopt;
      }
    }
  }
  return choice->error("name", "no tool named \"" + name + "\" in tools");
}

// thinking {type: enabled, budget_tokens} (the budget enforced: fewer than
// max_tokens, at least 1 where Anthropic asks for 1,024), adaptive (no
// budget) or disabled -> the template's enable_thinking and ChatInput::thinking.
std::optional<ApiError> parse_thinking(const FieldReader& body, bool count_tokens, ChatInput& chat) {
  std::optional<FieldReader> thinking;
  if (auto e = body.read_object("thinking", thinking)) return e;
  if (!thinking) return std::nullopt;
  const Json* type = thinking->find("type");
  if (type == nullptr) return thinking->error("type", "field required");
  if (*type == "enabled" || *type == "adaptive") {
    chat.template_kwargs["enable_thinking"] = true;
    ChatInput::ThinkingRequest request{"thinking", -1};
    if (*type == "enabled") {
      int64_t budget = 0;
      if (auto e = thinking->require_int("budget_tokens", 1, INT32_MAX, budget)) return e;
      if (!count_tokens && budget >= chat.generation.max_tokens) {
        return thinking->error("budget_tokens",
                               "must be less than max_tokens (" + std::to_string(chat.generation.max_tokens) + ")");
      }
      request.budget = static_cast<int32_t>(budget);
    }
    chat.thinking = std::move(request);
  } else if (*type == "disabled") {
    chat.template_kwargs["enable_thinking"] = false;
  } else {
    return thinking->error("type", "must be \"enabled\", \"adaptive\" or \"disabled\"");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_generation(const FieldReader& body, AnthropicRequest& req) {
  int64_t max_tokens = 0;
  if (auto e = body.require_int("max_tokens", 1, INT32_MAX, max_tokens)) return e;
  req.chat.generation.max_tokens = static_cast<int32_t>(max_tokens);

  std::optional<FieldReader> stops;
  if (auto e = body.read_array("stop_sequences", stops)) return e;
  if (stops) {
    for (size_t i = 0; i < stops->value().size(); ++i) {
      const FieldReader s = stops->at(i);
      if (!s.value().is_string()) return s.type_error("a string");
      if (s.value().get_ref<const std::string&>().empty()) return s.error("must not be empty");
      req.chat.generation.stop.push_back(s.value().get<std::string>());
    }
  }
  if (auto e = body.read_number("temperature", {0.0, 2.0}, req.sampling.temperature)) return e;
  if (auto e = body.read_number("top_p", {0.0, 1.0}, req.sampling.top_p)) return e;
  std::optional<int64_t> top_k;
  if (auto e = body.read_int("top_k", 0, INT32_MAX, top_k)) return e;
  if (top_k) req.sampling.top_k = static_cast<int>(*top_k);
  std::optional<bool> stream;
  if (auto e = body.read_bool("stream", stream)) return e;
  req.stream = stream.value_or(false);
  std::optional<bool> speculative;  // rill: false opts out of the server's speculative decoding
  if (auto e = body.read_bool("speculative", speculative)) return e;
  req.chat.generation.speculative = speculative.value_or(true);
  return std::nullopt;
}

}  // namespace

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const nlohmann::ordered_json& json_body,
                                                                 bool count_tokens) {
  if (!json_body.is_object()) {
    return ApiError(400, std::string("the request body must be a JSON object, got ") + json_type_name(json_body));
  }
  const FieldReader body(json_body);
  AnthropicRequest req;

  if (auto e = body.require_string("model", req.model)) return *e;

  if (!count_tokens) {
    if (auto e = parse_generation(body, req)) return *e;
  }

  Json& messages = req.chat.messages;
  if (body.find("system") != nullptr) {
    std::string system;
    if (auto e = string_or_text_blocks(body.at("system"), system)) return *e;
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", std::move(system)}});
  }
  if (body.find("messages") == nullptr) return body.error("messages", "field required");
  std::optional<FieldReader> msgs;
  if (auto e = body.read_array("messages", msgs)) return *e;
  if (msgs->value().empty()) return msgs->error("must contain at least one message");
  Translator translator{messages, {}};
  for (size_t i = 0; i < msgs->value().size(); ++i) {
    if (auto e = translator.message(msgs->at(i))) return *e;
  }

  req.chat.tools = nullptr;
  if (auto e = parse_tools(body, req.chat.tools)) return *e;
  if (auto e = apply_tool_choice(body, req.chat)) return *e;
  if (auto e = parse_thinking(body, count_tokens, req.chat)) return *e;
  return req;
}

std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const std::string& body, bool count_tokens) {
  auto parsed = parse_json(body);
  if (auto* e = std::get_if<JsonParseError>(&parsed)) {
    if (e->kind == JsonParseError::Kind::kTooDeep) return field_error(e->path, e->message);
    return ApiError(400, "the request body is " + e->message);
  }
  return parse_anthropic_request(std::get<Json>(parsed), count_tokens);
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
  // The model's text: depth-limited like everything else that is parsed.
  auto parsed = parse_json(call.arguments);
  Json input = Json::object();
  if (auto* j = std::get_if<Json>(&parsed); j != nullptr && j->is_object()) input = std::move(*j);
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
  return sse_event(
      "content_block_start",
      dump_json({{"type", "content_block_start"}, {"index", open_index_}, {"content_block", std::move(block)}}));
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
  // tool_use blocks stream: content_block_start with the name and input {}
  // when the parser reads the name, input_json_delta per arguments piece,
  // content_block_stop when the call ends. Text never comes while a call is
  // open (the parser ends a call first).
  const std::vector<ToolCallDelta>& pieces = delta.tool_call_deltas;
  size_t k = 0, n_ended = 0;
  auto input_delta = [&](const std::string& piece) {
    if (open_ == Block::kToolUse && !piece.empty())
      block_delta(open_index_, {{"type", "input_json_delta"}, {"partial_json", piece}});
  };
  auto end_call = [&] {
    if (open_ != Block::kToolUse || n_ended >= delta.tool_calls.size()) return;
    out += close();
    ++n_ended;
  };
  for (; k < pieces.size() && open_ == Block::kToolUse && pieces[k].name.empty(); ++k) input_delta(pieces[k].arguments);
  end_call();
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
  for (; k < pieces.size(); ++k) {
    if (pieces[k].name.empty()) {
      input_delta(pieces[k].arguments);
      continue;
    }
    end_call();
    out += close();
    open_ = Block::kToolUse;
    open_index_ = n_blocks_++;
    const Json block = {
        {"type", "tool_use"}, {"id", new_anthropic_id("toolu_")}, {"name", pieces[k].name}, {"input", Json::object()}};
    out += sse_event("content_block_start",
                     dump_json({{"type", "content_block_start"}, {"index", open_index_}, {"content_block", block}}));
  }
  end_call();
  return out;
}

std::string AnthropicStreamEncoder::finish(const ChatResult& result, const AnthropicStop& stop) {
  std::string out;
  if (n_blocks_ == 0) out += open(Block::kText);
  out += close();
  Json delta = {{"stop_reason", stop.reason}, {"stop_sequence", stop_sequence_json(stop)}};
  out += sse_event(
      "message_delta",
      dump_json({{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", anthropic_usage(result.usage)}}));
  out += sse_event("message_stop", dump_json({{"type", "message_stop"}}));
  return out;
}

std::string AnthropicStreamEncoder::error(const std::string& message) {
  return sse_event("error", dump_json({{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}}));
}

}  // namespace rill::server
