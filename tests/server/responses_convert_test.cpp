// Responses translation without a model: request validation (errors name the
// field), input items -> chat messages, and the event grammar of the encoder
// for reasoning, text and function calls (field names as in the openai SDK's
// types/responses/*.py).
#include "server/responses_convert.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

ResponsesRequest parse_ok(const std::string& body) {
  auto r = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<ResponsesRequest>(std::move(r));
}

ApiError parse_err(const std::string& body) {
  auto r = parse_responses_request(body);
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(r);
}

// (event name, data) frames of an SSE text.
std::vector<std::pair<std::string, Json>> frames(const std::string& sse) {
  std::vector<std::pair<std::string, Json>> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string f = sse.substr(pos, end - pos);
    const size_t nl = f.find('\n');
    EXPECT_EQ(f.rfind("event: ", 0), 0u);
    EXPECT_EQ(f.compare(nl + 1, 6, "data: "), 0);
    out.emplace_back(f.substr(7, nl - 7), Json::parse(f.substr(nl + 7)));
    pos = end + 2;
  }
  return out;
}

TEST(ResponsesConvert, StringInputIsOneUserMessage) {
  ResponsesRequest r = parse_ok(R"({"input": "hi", "model": "m", "stream": true, "store": false,
                                    "temperature": 0.5, "top_p": 0.9, "max_output_tokens": 12})");
  EXPECT_EQ(r.input_items, Json::parse(R"([{"type":"message","role":"user",
                                            "content":[{"type":"input_text","text":"hi"}]}])"));
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.store);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.max_output_tokens, 12);
  EXPECT_FALSE(r.instructions.has_value());
  EXPECT_TRUE(r.chat_tools.is_null());
}

TEST(ResponsesConvert, ErrorsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": [7]})", "input[0]"},
      {R"({"input": [{"content": "x"}]})", "input[0].type"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user"}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text"}]}]})", "input[0].content[0].text"},
      {R"({"input": ["ok", {"type": "function_call", "name": "f", "arguments": "{}"}]})", "input[0]"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type"},
      {R"({"input": [{"type": "web_search_call"}]})", "input[0].type"},
      {R"({"input": "x", "instructions": 3})", "instructions"},
      {R"({"input": "x", "previous_response_id": 3})", "previous_response_id"},
      {R"({"input": "x", "temperature": "hot"})", "temperature"},
      {R"({"input": "x", "temperature": 2.5})", "temperature"},
      {R"({"input": "x", "top_p": -0.1})", "top_p"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "max_output_tokens": 1.5})", "max_output_tokens"},
      {R"({"input": "x", "stream": "yes"})", "stream"},
      {R"({"input": "x", "tools": {}})", "tools"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 1}]})", "tools[0].parameters"},
      {R"({"input": "x", "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f"}],
           "tool_choice": {"type": "function", "name": "g"}})",
       "tool_choice.name"},
      {R"({"input": "x", "reasoning": {"effort": "max"}})", "reasoning.effort"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format.name"},
      {R"({"input": "x", "text": {"format": {"type": "yaml"}}})", "text.format.type"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"not": {}}}}})",
       "text.format.schema"},
  };
  for (const Case& c : cases) {
    ApiError e = parse_err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message.rfind(std::string(c.param) + ": ", 0), 0u) << e.message;
  }
  // The body itself: no param, as on the chat and Anthropic routes.
  ApiError not_object = parse_err("[1]");
  EXPECT_EQ(not_object.param, "");
  EXPECT_EQ(not_object.message, "the request body must be a JSON object, got an array");
  ApiError bad_json = parse_err("{\"input\": ");
  EXPECT_EQ(bad_json.status, 400);
  EXPECT_NE(bad_json.message.find("JSON"), std::string::npos);
}

TEST(ResponsesConvert, ToolsToolChoiceAndReasoning) {
  ResponsesRequest r = parse_ok(R"({"input": "x",
      "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true},
                {"type": "function", "name": "noop"}],
      "reasoning": {"effort": "minimal"}})");
  EXPECT_EQ(r.chat_tools, Json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "noop"}}])"));
  EXPECT_EQ(r.tools.size(), 2u);  // echoed as sent
  EXPECT_EQ(r.enable_thinking, false);

  r = parse_ok(
      R"({"input": "x", "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
                   "tool_choice": {"type": "function", "name": "b"}, "reasoning": {"effort": "high"}})");
  ASSERT_EQ(r.chat_tools.size(), 1u);
  EXPECT_EQ(r.chat_tools[0]["function"]["name"], "b");
  EXPECT_TRUE(r.tools_required);  // a named function forces a call of it
  EXPECT_EQ(r.enable_thinking, true);
  EXPECT_TRUE(parse_ok(R"({"input": "x", "tools": [{"type": "function", "name": "a"}], "tool_choice": "required"})")
                  .tools_required);
  EXPECT_FALSE(parse_ok(R"({"input": "x", "tools": [{"type": "function", "name": "a"}]})").tools_required);
  r = parse_ok(R"({"input": "x", "text": {"format": {"type": "json_object"}}})");
  EXPECT_FALSE(r.constraint.empty());
  EXPECT_EQ(r.text_format, Json::parse(R"({"type": "json_object"})"));  // echoed

  r = parse_ok(
      R"({"input": "x", "tools": [{"type": "function", "name": "a"}], "tool_choice": "none",
                   "reasoning": {"effort": "none"}})");
  EXPECT_TRUE(r.chat_tools.is_null());
  EXPECT_EQ(r.enable_thinking, false);
  EXPECT_EQ(r.tool_choice, "none");

  r = parse_ok(R"({"input": "x", "instructions": null})");
  EXPECT_FALSE(r.instructions.has_value());
  r = parse_ok(R"({"input": "x", "instructions": ""})");
  EXPECT_EQ(r.instructions, "");
}

TEST(ResponsesConvert, ItemsBecomeChatMessages) {
  ResponsesRequest r = parse_ok(R"({"input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                      {"type": "input_text", "text": "Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need a call."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": {"tz": "CET"}},
      {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
      {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "18C at noon.", "annotations": []}]},
      {"role": "user", "content": "Thanks"}]})");
  const Json messages = items_to_messages("Be brief.", r.input_items);
  const Json expected = Json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "system", "content": "Use tools."},
      {"role": "user", "content": "Weather in\nParis?"},
      {"role": "assistant", "content": "", "reasoning_content": "Need a call.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"CET\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C", "name": "get_weather"},
      {"role": "tool", "tool_call_id": "call_2", "content": "noon", "name": "get_time"},
      {"role": "assistant", "content": "18C at noon."},
      {"role": "user", "content": "Thanks"}])");
  EXPECT_EQ(messages, expected) << messages.dump(1);

  // A call right after an assistant message joins it.
  const Json joined = items_to_messages("", Json::parse(R"([
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])"));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0]["content"], "Checking.");
  EXPECT_EQ(joined[0]["tool_calls"][0]["id"], "c");
}

TEST(ResponsesConvert, EncoderStreamsReasoningTextAndCallsInOrder) {
  ResponsesRequest req = parse_ok(R"({"input": "x", "max_output_tokens": 5})");
  SamplingParams sampling;
  sampling.temperature = 0.7f;
  const Json skeleton = response_skeleton(req, "resp_1", 1700000000, "m", "Be brief.", sampling);
  EXPECT_EQ(skeleton["temperature"], 0.7);  // not 0.699999988...
  ResponsesEncoder enc(/*emit_events=*/true);
  std::string sse = enc.created(skeleton);
  OutputDelta d1;
  d1.reasoning = "Let me ";
  sse += enc.delta(d1);
  OutputDelta d2;
  d2.reasoning = "think.";
  d2.content = "Hello";
  sse += enc.delta(d2);
  OutputDelta d3;
  d3.content = " world";
  d3.tool_call_deltas = {{0, "call_9", "f", ""}, {0, "", "", "{\"a\":"}};
  sse += enc.delta(d3);
  OutputDelta d4;  // the call's last piece and its end
  d4.tool_call_deltas = {{0, "", "", "1}"}};
  d4.tool_calls.push_back({"call_9", "f", "{\"a\":1}"});
  sse += enc.delta(d4);
  Json response = skeleton;
  Usage usage;
  usage.prompt_tokens = 10;
  usage.cached_tokens = 4;
  usage.completion_tokens = 5;
  sse += enc.finish(response, /*incomplete=*/true, responses_usage(usage, 2));

  const auto ev = frames(sse);
  const std::vector<std::string> expected_names = {"response.created",
                                                   "response.in_progress",
                                                   "response.output_item.added",
                                                   "response.content_part.added",  // reasoning
                                                   "response.reasoning_text.delta",
                                                   "response.reasoning_text.delta",
                                                   "response.reasoning_text.done",
                                                   "response.content_part.done",
                                                   "response.output_item.done",
                                                   "response.output_item.added",
                                                   "response.content_part.added",  // message
                                                   "response.output_text.delta",
                                                   "response.output_text.delta",
                                                   "response.output_text.done",
                                                   "response.content_part.done",
                                                   "response.output_item.done",
                                                   "response.output_item.added",  // function call
                                                   "response.function_call_arguments.delta",
                                                   "response.function_call_arguments.delta",
                                                   "response.function_call_arguments.done",
                                                   "response.output_item.done",
                                                   "response.incomplete"};
  ASSERT_EQ(ev.size(), expected_names.size());
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].first, expected_names[i]) << i;
    EXPECT_EQ(ev[i].second["type"], expected_names[i]) << i;
    EXPECT_EQ(ev[i].second["sequence_number"], int64_t(i));
  }
  EXPECT_EQ(ev[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(ev[0].second["response"]["instructions"], "Be brief.");
  EXPECT_EQ(ev[6].second["text"], "Let me think.");
  EXPECT_EQ(ev[6].second["output_index"], 0);
  EXPECT_EQ(ev[11].second["delta"], "Hello");
  EXPECT_EQ(ev[11].second["output_index"], 1);
  EXPECT_EQ(ev[11].second["content_index"], 0);
  EXPECT_EQ(ev[11].second["item_id"], ev[9].second["item"]["id"]);
  EXPECT_EQ(ev[13].second["text"], "Hello world");
  EXPECT_EQ(ev[14].second["part"],
            Json::parse(R"({"type":"output_text","annotations":[],"logprobs":[],"text":"Hello world"})"));
  // The item is added with its name and empty arguments, then the pieces.
  EXPECT_EQ(ev[16].second["item"]["name"], "f");
  EXPECT_EQ(ev[16].second["item"]["arguments"], "");
  EXPECT_EQ(ev[16].second["item"]["status"], "in_progress");
  EXPECT_EQ(ev[17].second["delta"], "{\"a\":");
  EXPECT_EQ(ev[18].second["delta"], "1}");
  EXPECT_EQ(ev[18].second["item_id"], ev[16].second["item"]["id"]);
  EXPECT_EQ(ev[18].second["output_index"], 2);
  EXPECT_EQ(ev[19].second["arguments"], "{\"a\":1}");
  EXPECT_EQ(ev[20].second["item"]["call_id"], "call_9");
  EXPECT_EQ(ev[20].second["item"]["name"], "f");
  EXPECT_EQ(ev[20].second["item"]["arguments"], "{\"a\":1}");
  EXPECT_EQ(ev[20].second["item"]["status"], "completed");

  // The final object carries the same items as the stream's *.done events.
  const Json& final_response = ev.back().second["response"];
  EXPECT_EQ(final_response, response);
  EXPECT_EQ(response["status"], "incomplete");
  EXPECT_EQ(response["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(response["output"].size(), 3u);
  EXPECT_EQ(response["output"][0], ev[8].second["item"]);
  EXPECT_EQ(response["output"][1], ev[15].second["item"]);
  EXPECT_EQ(response["output"][2], ev[20].second["item"]);
  EXPECT_EQ(response["output"][1]["content"][0]["text"], "Hello world");
  EXPECT_EQ(response["usage"], Json::parse(R"({"input_tokens":10,"input_tokens_details":{"cached_tokens":4},
      "output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":15})"));
}

TEST(ResponsesConvert, EmptyOutputStillHasAMessageAndNonStreamingEmitsNothing) {
  ResponsesRequest req = parse_ok(R"({"input": "x"})");
  const Json skeleton = response_skeleton(req, "resp_2", 1, "m", "", SamplingParams{});
  EXPECT_TRUE(skeleton["instructions"].is_null());
  EXPECT_TRUE(skeleton["previous_response_id"].is_null());
  ResponsesEncoder enc(/*emit_events=*/false);
  EXPECT_EQ(enc.created(skeleton), "");
  EXPECT_EQ(enc.delta(OutputDelta{}), "");
  ResponsesEncoder empty(false);
  Json response = skeleton;
  EXPECT_EQ(empty.finish(response, false, responses_usage(Usage{}, 0)), "");
  EXPECT_EQ(response["status"], "completed");
  ASSERT_EQ(response["output"].size(), 1u);
  EXPECT_EQ(response["output"][0]["type"], "message");
  EXPECT_EQ(response["output"][0]["status"], "completed");
  EXPECT_EQ(response["output"][0]["content"][0]["text"], "");

  ResponsesEncoder errors(true);
  Json failed = skeleton;
  const auto ev = frames(errors.failed(failed, "boom", responses_usage(Usage{}, 0)));
  ASSERT_EQ(ev.size(), 1u);  // nothing was open
  EXPECT_EQ(ev[0].first, "response.failed");
  EXPECT_EQ(ev[0].second["type"], "response.failed");
  EXPECT_EQ(ev[0].second["sequence_number"], 0);
  EXPECT_EQ(ev[0].second["response"]["status"], "failed");
  EXPECT_EQ(ev[0].second["response"]["error"], Json::parse(R"({"code":"server_error","message":"boom"})"));
  EXPECT_EQ(failed["status"], "failed");
}

TEST(InputItemsPage, AssignsIdsOnceAndPagesInEitherOrder) {
  Json items = Json::parse(R"([
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"id": "msg_kept", "type": "message", "role": "assistant", "content": []},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "b"}]}])");
  assign_item_ids(items);
  EXPECT_EQ(items[0]["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(items[1]["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(items[2]["id"].get<std::string>().rfind("fco_", 0), 0u);
  EXPECT_EQ(items[3]["id"], "msg_kept");
  EXPECT_EQ(items[0].begin().key(), "id");  // listed first, as OpenAI does
  const Json again = [&] {
    Json copy = items;
    assign_item_ids(copy);
    return copy;
  }();
  EXPECT_EQ(again, items);  // ids are stable

  auto page = [&](const std::string& q) { return std::get<Json>(input_items_page(items, q)); };
  Json all = page("");  // desc by default
  ASSERT_EQ(all["data"].size(), 5u);
  EXPECT_EQ(all["object"], "list");
  EXPECT_EQ(all["first_id"], items[4]["id"]);
  EXPECT_EQ(all["last_id"], items[0]["id"]);
  EXPECT_FALSE(all["has_more"].get<bool>());

  Json asc2 = page("order=asc&limit=2");
  ASSERT_EQ(asc2["data"].size(), 2u);
  EXPECT_EQ(asc2["data"][0], items[0]);
  EXPECT_TRUE(asc2["has_more"].get<bool>());
  Json next = page("order=asc&limit=2&after=" + asc2["last_id"].get<std::string>());
  ASSERT_EQ(next["data"].size(), 2u);
  EXPECT_EQ(next["data"][0], items[2]);
  EXPECT_TRUE(next["has_more"].get<bool>());
  Json rest = page("order=asc&after=" + next["last_id"].get<std::string>());
  ASSERT_EQ(rest["data"].size(), 1u);
  EXPECT_FALSE(rest["has_more"].get<bool>());

  Json before = page("order=asc&limit=1&before=msg%5Fkept");  // %-escaped id
  ASSERT_EQ(before["data"].size(), 1u);
  EXPECT_EQ(before["data"][0], items[2]);
  EXPECT_TRUE(before["has_more"].get<bool>());

  Json none = page("after=" + items[0]["id"].get<std::string>());  // desc: nothing after the oldest
  EXPECT_TRUE(none["data"].empty());
  EXPECT_TRUE(none["first_id"].is_null());
}

TEST(InputItemsPage, BadParametersAre400sNamingThem) {
  const Json items = Json::array();
  auto error = [&](const std::string& q) { return std::get<ApiError>(input_items_page(items, q)); };
  for (const char* q : {"limit=0", "limit=101", "limit=x", "limit=", "limit=5x"})
    EXPECT_EQ(error(q).param, "limit") << q;
  EXPECT_EQ(error("order=up").param, "order");
  EXPECT_EQ(error("after=msg_nope").param, "after");
  EXPECT_EQ(error("before=msg_nope").param, "before");
  EXPECT_EQ(error("include[]=message.input_image.image_url").param, "include");
  EXPECT_EQ(error("colour=blue").param, "colour");
  EXPECT_EQ(error("limit=%4").status, 400);
  EXPECT_EQ(error("limit=%zz").status, 400);
}

}  // namespace
}  // namespace rill::server
