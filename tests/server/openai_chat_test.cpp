// POST /v1/chat/completions driven through FakeResponder against the real
// default model: the chat.completion shape and usage, streaming that adds up
// to the non-streamed reply (greedy and seeded), n choices with seed + i,
// stop strings that never stream, logprobs, tools and tool round trips, 400s
// naming the field, and cancellation when the client goes away.
#include <algorithm>
#include <cmath>

#include "server_test_util.h"

namespace rill::server::testing {
namespace {

class OpenAiChat : public ServerTest {
 protected:
  // Content and finish reason of a non-streamed reply.
  std::pair<std::string, std::string> complete(json body) {
    auto res = chat(body);
    EXPECT_EQ(res->status(), 200) << res->body();
    json j = res->json();
    return {j["choices"][0]["message"]["content"].get<std::string>(),
            j["choices"][0]["finish_reason"].get<std::string>()};
  }
  // Concatenated content deltas and the finish reason of choice `index` of a streamed reply.
  std::pair<std::string, std::string> stream_content(const std::vector<json>& chunks, int index = 0) {
    std::string content, finish;
    for (const json& c : chunks) {
      for (const json& ch : c["choices"]) {
        if (ch["index"] != index) continue;
        if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      }
    }
    return {content, finish};
  }
};

TEST_F(OpenAiChat, PlainReply) {
  auto res = chat({{"model", "whatever"}, {"messages", user("Say hello.")}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(res->status(), 200) << res->body();
  EXPECT_EQ(res->content_type(), "application/json");
  json j = res->json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "whatever");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_TRUE(j["system_fingerprint"].is_string());
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_FALSE(c["message"]["content"].get<std::string>().empty());
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length");
  const json& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
  EXPECT_GE(u["completion_tokens"].get<int>(), 1);
  EXPECT_LE(u["completion_tokens"].get<int>(), 8);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());

  // The same prompt again: its full blocks come from the prefix cache.
  json again = chat({{"messages", user("Say hello.")}, {"max_tokens", 8}, {"temperature", 0}})->json();
  EXPECT_EQ(again["model"], "smollm2-test");  // no model given: the served id
  EXPECT_EQ(again["choices"][0]["message"]["content"], c["message"]["content"]);
  EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST_F(OpenAiChat, StreamAddsUpToTheReply) {
  for (json sampling : {json{{"temperature", 0}}, json{{"temperature", 0.9}, {"seed", 42}}}) {
    json body = {{"messages", user("Name three colors.")}, {"max_tokens", 12}};
    body.update(sampling);
    auto [content, finish] = complete(body);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto res = chat(body);
    ASSERT_EQ(res->status(), 200);
    EXPECT_TRUE(res->streaming());
    EXPECT_EQ(res->content_type(), "text/event-stream");
    auto chunks = sse_chunks(*res);
    ASSERT_GE(chunks.size(), 3u);
    // First: the role; every chunk a chat.completion.chunk with one id.
    EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for (const json& c : chunks) {
      EXPECT_EQ(c["object"], "chat.completion.chunk");
      EXPECT_EQ(c["id"], chunks[0]["id"]);
      EXPECT_TRUE(c.contains("usage"));
    }
    auto [streamed, stream_finish] = stream_content(chunks);
    EXPECT_EQ(streamed, content) << sampling.dump();
    EXPECT_EQ(stream_finish, finish);
    // Last: usage alone, no choices.
    const json& last = chunks.back();
    EXPECT_TRUE(last["choices"].empty());
    EXPECT_GE(last["usage"]["completion_tokens"].get<int>(), 1);
    EXPECT_EQ(last["usage"]["total_tokens"],
              last["usage"]["prompt_tokens"].get<int>() + last["usage"]["completion_tokens"].get<int>());
  }
}

TEST_F(OpenAiChat, NChoicesUseSeedPlusIndex) {
  json body = {{"messages", user("Write a word.")}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 7}, {"n", 2}};
  auto res = chat(body);
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  body["n"] = 1;
  EXPECT_EQ(complete(body).first, j["choices"][0]["message"]["content"]);
  body["seed"] = 8;
  EXPECT_EQ(complete(body).first, j["choices"][1]["message"]["content"]);
  const int completion = j["usage"]["completion_tokens"];
  EXPECT_GE(completion, 2);

  // Streamed n=2: both choices open with a role and end with a finish reason.
  body["seed"] = 7;
  body["n"] = 2;
  body["stream"] = true;
  auto chunks = sse_chunks(*chat(body));
  for (int i = 0; i < 2; ++i) {
    auto [content, finish] = stream_content(chunks, i);
    EXPECT_EQ(content, j["choices"][i]["message"]["content"]);
    EXPECT_FALSE(finish.empty());
  }
}

TEST_F(OpenAiChat, StopStringNeverStreams) {
  json body = {{"messages", user("Count from one to ten in words.")}, {"max_tokens", 16}, {"temperature", 0}};
  const std::string full = complete(body).first;
  ASSERT_GE(full.size(), 8u) << full;
  // A stop string from the middle of the greedy reply.
  const std::string stop = full.substr(full.size() / 2, 3);
  const std::string expected = full.substr(0, full.find(stop));
  body["stop"] = json::array({"zzzz-never", stop});
  auto [content, finish] = complete(body);
  EXPECT_EQ(content, expected);
  EXPECT_EQ(finish, "stop");

  body["stream"] = true;
  body["stop"] = stop;
  auto res = chat(body);
  auto [streamed, stream_finish] = stream_content(sse_chunks(*res));
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(stream_finish, "stop");
  EXPECT_EQ(streamed.find(stop), std::string::npos);
}

TEST_F(OpenAiChat, Logprobs) {
  json body = {
      {"messages", user("Hi")}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
  auto res = chat(body);
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array());
  const int n_tokens = j["usage"]["completion_tokens"];
  const bool ended_on_eos = j["choices"][0]["finish_reason"] == "stop";
  EXPECT_EQ(int(content.size()), ended_on_eos ? n_tokens - 1 : n_tokens);
  std::string bytes_text;
  for (const json& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    for (const json& b : e["bytes"]) bytes_text += char(b.get<int>());
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_GE(e["top_logprobs"][1]["logprob"].get<double>(), e["top_logprobs"][2]["logprob"].get<double>());
  }
  EXPECT_EQ(bytes_text, j["choices"][0]["message"]["content"]);

  // Streamed: the same entries, spread over the chunks.
  body["stream"] = true;
  json streamed = json::array();
  for (const json& c : sse_chunks(*chat(body))) {
    for (const json& ch : c["choices"]) {
      if (!ch["logprobs"].is_null()) {
        for (const json& e : ch["logprobs"]["content"]) streamed.push_back(e);
      }
    }
  }
  EXPECT_EQ(streamed, content);

  // logprobs without alternatives.
  body["stream"] = false;
  body.erase("top_logprobs");
  json plain = chat(body)->json();
  EXPECT_TRUE(plain["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());
}

TEST_F(OpenAiChat, LogitBiasSteersTheChoice) {
  // A +100 bias on one token makes greedy decoding pick it every time.
  const int32_t id = 28;  // a plain byte-level token of the vocabulary
  json body = {{"messages", user("Hi")},
               {"max_tokens", 3},
               {"temperature", 0},
               {"logprobs", true},
               {"logit_bias", {{std::to_string(id), 100}}}};
  json j = chat(body)->json();
  const std::string piece = engine_->tokenizer()->token_to_piece(id);
  for (const json& e : j["choices"][0]["logprobs"]["content"]) EXPECT_EQ(e["token"], piece);
}

TEST_F(OpenAiChat, ToolsAndToolRoundTrip) {
  json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"parameters",
           {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}}});
  auto res = chat({{"messages", user("Weather in Paris?")},
                   {"tools", tools},
                   {"tool_choice", "auto"},
                   {"max_tokens", 8},
                   {"temperature", 0}});
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length" || finish == "tool_calls") << finish;

  json messages = json::array({
      {{"role", "system"}, {"content", "You are terse."}},
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp_c\": 21}"}},
  });
  res = chat({{"messages", messages}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(res->status(), 200) << res->body();
  res = chat({{"messages", messages},
              {"tools", tools},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
              {"max_tokens", 4},
              {"temperature", 0},
              {"reasoning_effort", "none"}});
  EXPECT_EQ(res->status(), 200) << res->body();
}

TEST_F(OpenAiChat, BadRequestsNameTheField) {
  struct Case {
    std::string body, param;
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> cases = {
      {R"({"messages": [)", ""},
      {R"([1, 2])", ""},
      {R"({"model": "m"})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]})", "messages[1].role"},
      {R"({"messages": [{"content": "a"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {"{" + msgs + R"(, "temperature": "hot"})", "temperature"},
      {"{" + msgs + R"(, "temperature": -1})", "temperature"},
      {"{" + msgs + R"(, "top_p": 1.5})", "top_p"},
      {"{" + msgs + R"(, "temperature": 2.5})", "temperature"},
      {"{" + msgs + R"(, "n": 9})", "n"},
      {"{" + msgs + R"(, "n": 1.5})", "n"},
      {"{" + msgs + R"(, "max_tokens": 0})", "max_tokens"},
      {"{" + msgs + R"(, "max_tokens": 5000})", "max_tokens"},
      {"{" + msgs + R"(, "stream": "yes"})", "stream"},
      {"{" + msgs + R"(, "stop": 3})", "stop"},
      {"{" + msgs + R"(, "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "stop"},
      {"{" + msgs + R"(, "logit_bias": {"abc": 1}})", "logit_bias"},
      {"{" + msgs + R"(, "logit_bias": {"99999999": 1}})", "logit_bias"},
      {"{" + msgs + R"(, "logit_bias": {"5": 101}})", "logit_bias"},
      {"{" + msgs + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {"{" + msgs + R"(, "top_logprobs": 2})", "top_logprobs"},
      {"{" + msgs + R"(, "tools": {}})", "tools"},
      {"{" + msgs + R"(, "tools": [{"type": "function", "function": {"description": "x"}}]})",
       "tools[0].function.name"},
      {"{" + msgs + R"(, "tool_choice": "sometimes"})", "tool_choice"},
      {"{" + msgs + R"(, "reasoning_effort": "extreme"})", "reasoning_effort"},
      {"{" + msgs + R"(, "stream_options": {"include_usage": 1}})", "stream_options.include_usage"},
      {"{" + msgs + R"(, "chat_template_kwargs": []})", "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    auto res = call(&handle_chat_completions, c.body);
    ASSERT_EQ(res->status(), 400) << c.body << " -> " << res->body();
    json err = res->json()["error"];
    EXPECT_EQ(err["type"], "invalid_request_error") << c.body;
    EXPECT_TRUE(err["message"].is_string());
    if (c.param.empty()) {
      EXPECT_TRUE(err["param"].is_null()) << c.body;
    } else {
      EXPECT_EQ(err["param"], c.param) << c.body << " -> " << err.dump();
    }
  }
  EXPECT_TRUE(engine_idle());
}

TEST_F(OpenAiChat, ClientDisconnectCancels) {
  // Streaming: disconnect after the first content delta.
  json body = {
      {"messages", user("Tell me a long story.")}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  auto res = chat(body, /*wait=*/false);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (res->events().size() < 3) {  // the role chunk and two deltas
    ASSERT_LT(std::chrono::steady_clock::now(), until);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  res->disconnect();
  ASSERT_TRUE(res->wait(std::chrono::seconds(10)));
  EXPECT_TRUE(engine_idle());
  EXPECT_EQ(res->body().find("\"finish_reason\":\"length\""), std::string::npos);

  // Not streaming, n = 2: both generations end.
  body["stream"] = false;
  body["n"] = 2;
  res = chat(body, /*wait=*/false);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  res->disconnect();
  EXPECT_TRUE(engine_idle());
  EXPECT_TRUE(res->wait(std::chrono::seconds(10)));
  EXPECT_NE(res->status(), 200);
}

}  // namespace
}  // namespace rill::server::testing
