// Anthropic Messages translation (server/anthropic_convert.h): request JSON
// -> OpenAI-shaped ChatInput, ChatResult -> Message, and the SSE grammar.
// Field names checked against the `anthropic` Python SDK's types.
#include "server/anthropic_convert.h"

#include <gtest/gtest.h>

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

AnthropicRequest parse_ok(const Json& body, bool count_tokens = false) {
  auto r = parse_anthropic_request(body, count_tokens);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<AnthropicRequest>(std::move(r));
}

ApiError parse_err(const Json& body, bool count_tokens = false) {
  auto r = parse_anthropic_request(body, count_tokens);
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "expected an error for " << body.dump();
    return {};
  }
  return std::get<ApiError>(r);
}

Json base(Json messages) {
  return {{"model", "m"}, {"max_tokens", 16}, {"messages", std::move(messages)}};
}

TEST(AnthropicConvert, SystemTextAndSampling) {
  Json body = base({{{"role", "user"}, {"content", "hi"}}});
  body["system"] = Json::array({{{"type", "text"}, {"text", "be brief"}}, {{"type", "text"}, {"text", "be kind"}}});
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["top_k"] = 40;
  body["stop_sequences"] = {"END", "\n\n"};
  body["stream"] = true;
  body["metadata"] = {{"user_id", "u"}};
  AnthropicRequest r = parse_ok(body);
  EXPECT_EQ(r.chat.messages, Json::parse(R"([{"role":"system","content":"be brief\nbe kind"},
                                              {"role":"user","content":"hi"}])"));
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.chat.generation.max_tokens, 16);
  EXPECT_EQ(r.chat.generation.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.sampling.top_k, 40);
  EXPECT_TRUE(r.chat.tools.is_null());
  EXPECT_TRUE(r.chat.template_kwargs.empty());
}

TEST(AnthropicConvert, ToolUseAndToolResultRoundTrip) {
  Json body = base(Json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "I should call the tool", "signature": "sig"},
      {"type": "text", "text": "Checking."},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 2}}]},
    {"role": "user", "content": [
      {"type": "text", "text": "Here you go"},
      {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22 C"}]},
      {"type": "tool_result", "tool_use_id": "toolu_9", "content": "boom", "is_error": true}]}
  ])"));
  AnthropicRequest r = parse_ok(body);
  // Tool results come first (right after the assistant's calls), then the
  // user's text; the arguments are the input as compact JSON text.
  EXPECT_EQ(r.chat.messages, Json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
      {"id": "toolu_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"days\":2}"}}],
     "reasoning_content": "I should call the tool"},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "22 C", "name": "get_weather"},
    {"role": "tool", "tool_call_id": "toolu_9", "content": "Error: boom"},
    {"role": "user", "content": "Here you go"}
  ])"))
      << r.chat.messages.dump(2);
}

TEST(AnthropicConvert, ConsecutiveTurnsMerge) {
  AnthropicRequest r = parse_ok(base(Json::parse(R"([
    {"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "c"}])")));
  EXPECT_EQ(r.chat.messages, Json::parse(R"([{"role":"user","content":"a\nb"},{"role":"assistant","content":"c"}])"));
}

TEST(AnthropicConvert, ToolsToolChoiceAndThinking) {
  Json body = base({{{"role", "user"}, {"content", "hi"}}});
  body["tools"] = Json::parse(R"([
    {"name": "a", "description": "tool a", "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}},
    {"name": "b", "input_schema": {"type": "object"}}])");
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 10}};
  AnthropicRequest r = parse_ok(body);
  ASSERT_TRUE(r.chat.thinking.has_value());
  EXPECT_EQ(r.chat.thinking->budget, 10);
  EXPECT_EQ(r.chat.thinking->param, "thinking");
  EXPECT_EQ(r.chat.tools, Json::parse(R"([
    {"type": "function", "function": {"name": "a", "description": "tool a",
      "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(r.chat.template_kwargs, Json({{"enable_thinking", true}}));

  body["tool_choice"] = {{"type", "tool"}, {"name", "b"}};
  body["thinking"] = {{"type", "disabled"}};
  r = parse_ok(body);
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "b");
  EXPECT_TRUE(r.chat.tools_required);  // "tool" forces a call of it
  EXPECT_TRUE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.chat.template_kwargs, Json({{"enable_thinking", false}}));
  EXPECT_FALSE(r.chat.thinking.has_value());
  body["thinking"] = {{"type", "adaptive"}};
  r = parse_ok(body);
  ASSERT_TRUE(r.chat.thinking.has_value());
  EXPECT_EQ(r.chat.thinking->budget, -1);

  body["tool_choice"] = {{"type", "none"}};
  EXPECT_TRUE(parse_ok(body).chat.tools.is_null());
  body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  r = parse_ok(body);
  EXPECT_EQ(r.chat.tools.size(), 2u);
  EXPECT_TRUE(r.chat.tools_required);  // "any" forces a call of one of them
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  body["tool_choice"] = {{"type", "auto"}};
  EXPECT_FALSE(parse_ok(body).chat.tools_required);
  body["tool_choice"] = {{"type", "tool"}, {"name", "zzz"}};
  EXPECT_EQ(parse_err(body).message, "tool_choice.name: no tool named \"zzz\" in tools");
}

TEST(AnthropicConvert, CountTokensNeedsNoMaxTokens) {
  Json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(parse_ok(body, /*count_tokens=*/true).chat.messages.size(), 1u);
  EXPECT_EQ(parse_err(body).message, "max_tokens: field required");
}

TEST(AnthropicConvert, ErrorsNameTheField) {
  const Json user = {{{"role", "user"}, {"content", "hi"}}};
  auto message_of = [](Json body) { return parse_err(body).message; };
  auto with = [&](const char* key, Json v) {
    Json b = base(user);
    b[key] = std::move(v);
    return b;
  };
  EXPECT_EQ(message_of(with("max_tokens", "16")), "max_tokens: expected an integer, got a string");
  EXPECT_EQ(message_of(with("max_tokens", 0)), "max_tokens: must be at least 1");
  EXPECT_EQ(message_of(with("max_tokens", 1.5)), "max_tokens: expected an integer, got a number");
  EXPECT_EQ(message_of(with("temperature", "hot")), "temperature: expected a number, got a string");
  EXPECT_EQ(message_of(with("top_k", -1)), "top_k: must be at least 0");
  EXPECT_EQ(message_of(with("stream", "yes")), "stream: expected a boolean, got a string");
  EXPECT_EQ(message_of(with("stop_sequences", Json::array({1}))), "stop_sequences[0]: expected a string, got a number");
  EXPECT_EQ(message_of(with("system", 3)), "system: expected a string or an array of text blocks, got a number");
  EXPECT_EQ(message_of(with("messages", Json::array())), "messages: must contain at least one message");
  EXPECT_EQ(message_of(with("messages", "hi")), "messages: expected an array, got a string");
  EXPECT_EQ(message_of(with("model", 7)), "model: expected a string, got a number");
  EXPECT_EQ(message_of(with("tools", Json::parse(R"([{"name": "t"}])"))), "tools[0].input_schema: field required");
  EXPECT_EQ(message_of(with("tools", Json::parse(R"([{"type": "web_search_20250305", "name": "web_search"}])"))),
            "tools[0].type: only client tools (type \"custom\") are supported");
  EXPECT_EQ(message_of(with("thinking", {{"type", "maybe"}})),
            "thinking.type: must be \"enabled\", \"adaptive\" or \"disabled\"");
  EXPECT_EQ(message_of(with("thinking", {{"type", "enabled"}})), "thinking.budget_tokens: field required");
  EXPECT_EQ(message_of(with("thinking", {{"type", "enabled"}, {"budget_tokens", 16}})),
            "thinking.budget_tokens: must be less than max_tokens (16)");
  EXPECT_EQ(message_of(with("thinking", {{"type", "enabled"}, {"budget_tokens", 0}})),
            "thinking.budget_tokens: must be at least 1");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}])"))),
            "messages[0].content[0].type: thinking blocks belong to assistant messages");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "system", "content": "x"}])"))),
            "messages[0].role: must be \"user\" or \"assistant\"");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"content": "x"}])"))), "messages[0].role: field required");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user"}])"))), "messages[0].content: field required");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": 5}])"))),
            "messages[0].content: expected a string or an array of content blocks, got a number");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [
              {"type": "text", "text": "look"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])"))),
            "messages[0].content[1]: images are not supported");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [
              {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}])"))),
            "messages[0].content[0].content[0]: images are not supported");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n",
              "input": {}}]}])"))),
            "messages[0].content[0].type: tool_use blocks belong to assistant messages");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "assistant", "content": [{"type": "tool_use", "id": "t",
              "name": "n", "input": [1]}]}])"))),
            "messages[0].content[0].input: expected an object, got an array");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [{"text": "x"}]}])"))),
            "messages[0].content[0].type: field required");
  EXPECT_EQ(message_of(base(Json::parse(R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])"))),
            "messages[0].content[0].text: expected a string, got a number");

  ApiError e = parse_err(with("max_tokens", nullptr));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  auto bad_json = parse_anthropic_request(std::string("{\"model\": "), false);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_json));
  EXPECT_EQ(std::get<ApiError>(bad_json).message.rfind("the request body is not valid JSON: ", 0), 0u)
      << std::get<ApiError>(bad_json).message;
}

ChatResult result_of(std::string finish, std::string content = "", std::string reasoning = "",
                     std::vector<ToolCall> calls = {}) {
  ChatResult r;
  r.finish_reason = std::move(finish);
  r.content = std::move(content);
  r.reasoning = std::move(reasoning);
  r.tool_calls = std::move(calls);
  r.usage.prompt_tokens = 10;
  r.usage.cached_tokens = 4;
  r.usage.completion_tokens = 3;
  return r;
}

TEST(AnthropicConvert, StopReasons) {
  EXPECT_EQ(anthropic_stop(result_of("stop")).reason, "end_turn");
  EXPECT_FALSE(anthropic_stop(result_of("stop")).sequence.has_value());
  EXPECT_EQ(anthropic_stop(result_of("length")).reason, "max_tokens");
  EXPECT_EQ(anthropic_stop(result_of("tool_calls")).reason, "tool_use");
  EXPECT_EQ(anthropic_stop(result_of("stop", "", "", {{"call_1", "f", "{}"}})).reason, "tool_use");
  ChatResult r = result_of("stop");
  r.stop_string = "END";
  AnthropicStop s = anthropic_stop(r);
  EXPECT_EQ(s.reason, "stop_sequence");
  EXPECT_EQ(s.sequence, "END");
}

TEST(AnthropicConvert, MessageShapeAndUsage) {
  // input_tokens excludes the cached prompt tokens, reported apart.
  EXPECT_EQ(anthropic_usage(result_of("stop").usage),
            Json::parse(R"({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 4})"));

  Json m = anthropic_message("msg_1", "smol", result_of("stop"), {"end_turn", std::nullopt});
  EXPECT_EQ(m["id"], "msg_1");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "smol");
  EXPECT_EQ(m["content"], Json::parse(R"([{"type": "text", "text": ""}])"));  // never empty without tools
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_TRUE(m["stop_sequence"].is_null());

  ChatResult r = result_of("tool_calls", "Sure.", "think", {{"call_1", "get", R"({"a":1})"}});
  m = anthropic_message("msg_2", "smol", r, anthropic_stop(r));
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0], Json::parse(R"({"type": "thinking", "thinking": "think", "signature": ""})"));
  EXPECT_EQ(m["content"][1], Json::parse(R"({"type": "text", "text": "Sure."})"));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["name"], "get");
  EXPECT_EQ(m["content"][2]["input"], Json({{"a", 1}}));
  EXPECT_EQ(m["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(m["stop_reason"], "tool_use");

  r = result_of("stop", "", "", {{"call_1", "get", "{}"}});
  EXPECT_EQ(anthropic_message("msg_3", "smol", r, anthropic_stop(r))["content"].size(), 1u);  // no empty text
}

TEST(AnthropicConvert, Ids) {
  const std::string a = new_anthropic_id("msg_"), b = new_anthropic_id("msg_");
  EXPECT_EQ(a.size(), 28u);
  EXPECT_EQ(a.rfind("msg_", 0), 0u);
  EXPECT_NE(a, b);
}

std::vector<Json> frames(const std::string& sse, std::vector<std::string>* names) {
  std::vector<Json> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    const std::string frame = sse.substr(pos, end - pos);
    const size_t nl = frame.find('\n');
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    EXPECT_EQ(frame.compare(nl + 1, 6, "data: "), 0) << frame;
    names->push_back(frame.substr(7, nl - 7));
    out.push_back(Json::parse(frame.substr(nl + 7)));
    EXPECT_EQ(out.back()["type"], names->back());  // the event name repeats the payload's type
    pos = end + 2;
  }
  return out;
}

TEST(AnthropicConvert, StreamGrammar) {
  AnthropicStreamEncoder enc("msg_x", "smol");
  std::string sse = enc.start();
  OutputDelta d;
  d.reasoning = "hm";
  sse += enc.delta(d);
  sse += enc.delta(d);
  d = {};
  d.content = "Hi";
  sse += enc.delta(d);
  d = {};
  sse += enc.delta(d);  // empty: nothing
  d.tool_call_deltas = {{0, "call_1", "get", ""}, {0, "", "", R"({"a":)"}};
  sse += enc.delta(d);
  d = {};
  d.tool_call_deltas = {{0, "", "", "1}"}};
  d.tool_calls = {{"call_1", "get", R"({"a":1})"}};
  sse += enc.delta(d);
  ChatResult r = result_of("tool_calls", "Hi", "hmhm", d.tool_calls);
  sse += enc.finish(r, anthropic_stop(r));

  std::vector<std::string> names;
  std::vector<Json> ev = frames(sse, &names);
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_delta", "content_block_stop",
                                             "message_delta", "message_stop"}));
  EXPECT_EQ(ev[0]["message"]["id"], "msg_x");
  EXPECT_EQ(ev[0]["message"]["content"], Json::array());
  EXPECT_TRUE(ev[0]["message"]["stop_reason"].is_null());
  EXPECT_EQ(ev[1], Json::parse(R"({"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}})"));
  EXPECT_EQ(ev[2], Json::parse(R"({"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "thinking_delta", "thinking": "hm"}})"));
  EXPECT_EQ(ev[4], Json::parse(R"({"type": "content_block_stop", "index": 0})"));
  EXPECT_EQ(ev[5]["content_block"], Json::parse(R"({"type": "text", "text": ""})"));
  EXPECT_EQ(ev[6]["delta"], Json::parse(R"({"type": "text_delta", "text": "Hi"})"));
  EXPECT_EQ(ev[7]["index"], 1);
  EXPECT_EQ(ev[8]["index"], 2);
  EXPECT_EQ(ev[8]["content_block"]["type"], "tool_use");
  EXPECT_EQ(ev[8]["content_block"]["name"], "get");
  EXPECT_EQ(ev[8]["content_block"]["input"], Json::object());
  EXPECT_EQ(ev[8]["content_block"]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  // The input streams as the model writes it.
  EXPECT_EQ(ev[9]["delta"], Json::parse(R"({"type": "input_json_delta", "partial_json": "{\"a\":"})"));
  EXPECT_EQ(ev[10]["delta"], Json::parse(R"({"type": "input_json_delta", "partial_json": "1}"})"));
  EXPECT_EQ(ev[10]["index"], 2);
  EXPECT_EQ(ev[11], Json::parse(R"({"type": "content_block_stop", "index": 2})"));
  EXPECT_EQ(ev[12]["delta"], Json::parse(R"({"stop_reason": "tool_use", "stop_sequence": null})"));
  EXPECT_EQ(ev[12]["usage"]["output_tokens"], 3);
  EXPECT_EQ(ev[12]["usage"]["cache_read_input_tokens"], 4);

  // Nothing streamed: one empty text block, as the non-streaming reply has.
  AnthropicStreamEncoder empty("msg_y", "smol");
  names.clear();
  ev = frames(empty.start() + empty.finish(result_of("stop"), {"stop_sequence", "END"}), &names);
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_stop",
                                             "message_delta", "message_stop"}));
  EXPECT_EQ(ev[3]["delta"]["stop_sequence"], "END");

  names.clear();
  ev = frames(AnthropicStreamEncoder::error("boom"), &names);
  EXPECT_EQ(ev[0], Json::parse(R"({"type": "error", "error": {"type": "api_error", "message": "boom"}})"));
}

}  // namespace
}  // namespace rill::server
