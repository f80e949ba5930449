// POST /v1/messages and /v1/messages/count_tokens (server/anthropic_api.cpp)
// against a real engine on SmolLM2-135M, through FakeResponder. Greedy
// (temperature 0) so streamed and non-streamed replies must agree.
#include <gtest/gtest.h>

#include <thread>

#include "fake_responder.h"
#include "server/anthropic_convert.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using Json = nlohmann::json;
using testing::FakeResponder;

class AnthropicApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions options;
    options.n_threads = 2;
    options.n_ctx = 1024;
    options.kv_cache_mb = 64;
    auto engine = Engine::load(RILL_MODEL_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf", options);
    ASSERT_TRUE(engine.ok()) << engine.error().message;
    engine_ = std::move(engine).value().release();
    ctx_ = new ServerContext{*engine_, engine_->chat_template(), ServerOptions{}};
    ctx_->options.model_id = "smollm2";
  }
  static void TearDownTestSuite() {
    delete ctx_;
    delete engine_;
  }

  // Runs a handler to completion.
  static std::shared_ptr<FakeResponder> call(const Json& body, bool count_tokens = false) {
    HttpRequest req;
    req.method = "POST";
    req.path = count_tokens ? "/v1/messages/count_tokens" : "/v1/messages";
    req.body = body.dump();
    auto res = std::make_shared<FakeResponder>();
    count_tokens ? handle_count_tokens(*ctx_, req, res) : handle_messages(*ctx_, req, res);
    EXPECT_TRUE(res->wait());
    return res;
  }

  static Json request(int max_tokens = 12) {
    return {{"model", "claude-test"},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"system", "You are a helpful assistant."},
            {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}}};
  }

  static std::string text_of(const Json& message) {
    std::string text;
    for (const auto& block : message["content"])
      if (block["type"] == "text") text += block["text"].get<std::string>();
    return text;
  }

  static inline Engine* engine_ = nullptr;
  static inline ServerContext* ctx_ = nullptr;
};

TEST_F(AnthropicApiTest, PlainMessage) {
  auto res = call(request());
  ASSERT_EQ(res->status(), 200) << res->body();
  EXPECT_EQ(res->content_type(), "application/json");
  Json m = res->json();
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "claude-test");
  ASSERT_EQ(m["content"].size(), 1u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "text");
  EXPECT_FALSE(text_of(m).empty());
  EXPECT_TRUE(m["stop_reason"] == "end_turn" || m["stop_reason"] == "max_tokens") << m.dump();
  EXPECT_TRUE(m["stop_sequence"].is_null());
  const Json& u = m["usage"];
  EXPECT_GT(u["input_tokens"].get<int>() + u["cache_read_input_tokens"].get<int>(), 10);
  EXPECT_GE(u["output_tokens"].get<int>(), 1);
  EXPECT_LE(u["output_tokens"].get<int>(), 12);
  EXPECT_EQ(u["cache_creation_input_tokens"], 0);
  if (m["stop_reason"] == "max_tokens") {
    EXPECT_EQ(u["output_tokens"], 12);
  }
}

TEST_F(AnthropicApiTest, StreamMatchesNonStream) {
  Json body = request();
  const Json plain = call(body)->json();
  body["stream"] = true;
  auto res = call(body);
  ASSERT_TRUE(res->streaming());
  EXPECT_EQ(res->content_type(), "text/event-stream");
  auto events = res->events();
  ASSERT_GE(events.size(), 5u) << res->body();

  // message_start, then blocks (start, deltas of that index, stop), then
  // message_delta and message_stop; every event's name repeats its type.
  std::vector<std::string> names;
  std::string text;
  int open_index = -1, n_blocks = 0;
  Json start, delta;
  for (const auto& [name, data] : events) {
    Json ev = Json::parse(data);
    EXPECT_EQ(ev["type"], name);
    names.push_back(name);
    if (name == "message_start") start = ev;
    if (name == "message_delta") delta = ev;
    if (name == "content_block_start") {
      EXPECT_EQ(open_index, -1);
      EXPECT_EQ(ev["index"], n_blocks);
      open_index = n_blocks++;
    } else if (name == "content_block_delta") {
      EXPECT_EQ(ev["index"], open_index);
      if (ev["delta"]["type"] == "text_delta") text += ev["delta"]["text"].get<std::string>();
    } else if (name == "content_block_stop") {
      EXPECT_EQ(ev["index"], open_index);
      open_index = -1;
    }
  }
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(open_index, -1);
  EXPECT_EQ(n_blocks, 1);

  EXPECT_EQ(start["message"]["content"], Json::array());
  EXPECT_TRUE(start["message"]["stop_reason"].is_null());
  EXPECT_EQ(start["message"]["model"], "claude-test");
  // message_start already knows the prompt size (before cache hits).
  const Json& pu = plain["usage"];
  EXPECT_EQ(start["message"]["usage"]["input_tokens"],
            pu["input_tokens"].get<int>() + pu["cache_read_input_tokens"].get<int>());

  EXPECT_EQ(text, text_of(plain));
  EXPECT_EQ(delta["delta"]["stop_reason"], plain["stop_reason"]);
  EXPECT_EQ(delta["usage"]["output_tokens"], pu["output_tokens"]);
  // The same prompt again: read from the prefix cache, reported apart.
  EXPECT_EQ(delta["usage"]["input_tokens"].get<int>() + delta["usage"]["cache_read_input_tokens"].get<int>(),
            pu["input_tokens"].get<int>() + pu["cache_read_input_tokens"].get<int>());
  EXPECT_GT(delta["usage"]["cache_read_input_tokens"].get<int>(), 0);
}

TEST_F(AnthropicApiTest, StopSequence) {
  Json body = request(16);
  const std::string full = text_of(call(body)->json());
  ASSERT_GE(full.size(), 8u) << full;
  // A piece of the greedy reply: generation must end right before it.
  const std::string stop = full.substr(full.size() / 2, 3);
  body["stop_sequences"] = {"zzqq-never", stop};
  Json m = call(body)->json();
  EXPECT_EQ(m["stop_reason"], "stop_sequence") << m.dump();
  EXPECT_EQ(m["stop_sequence"], stop);
  EXPECT_EQ(text_of(m), full.substr(0, full.find(stop)));
}

TEST_F(AnthropicApiTest, CountTokensEqualsPromptTokens) {
  Json body = request(4);
  const Json m = call(body)->json();
  const int prompt = m["usage"]["input_tokens"].get<int>() + m["usage"]["cache_read_input_tokens"].get<int>();
  body.erase("max_tokens");
  body.erase("temperature");
  auto res = call(body, /*count_tokens=*/true);
  ASSERT_EQ(res->status(), 200) << res->body();
  EXPECT_EQ(res->json(), Json({{"input_tokens", prompt}}));
}

TEST_F(AnthropicApiTest, ToolResultRoundTripRenders) {
  Json body = Json::parse(R"({
    "model": "m", "max_tokens": 8, "temperature": 0,
    "tools": [{"name": "get_weather", "description": "Weather for a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "22 degrees and sunny"}]}]})");
  // What the template sees: the call's arguments and the result's text.
  auto parsed = parse_anthropic_request(nlohmann::ordered_json(body), false);
  ASSERT_TRUE(std::holds_alternative<AnthropicRequest>(parsed));
  auto prompt = prepare_chat_prompt(*ctx_, std::get<AnthropicRequest>(parsed).chat);
  ASSERT_TRUE(std::holds_alternative<ChatPrompt>(prompt)) << std::get<ApiError>(prompt).message;
  const std::string rendered = engine_->tokenizer()->decode(std::get<ChatPrompt>(prompt).ids, false);
  EXPECT_NE(rendered.find("22 degrees and sunny"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("Paris"), std::string::npos) << rendered;
  EXPECT_LT(rendered.find("Weather in Paris?"), rendered.find("22 degrees and sunny"));

  auto res = call(body);
  ASSERT_EQ(res->status(), 200) << res->body();
  Json m = res->json();
  EXPECT_FALSE(m["content"].empty());
  auto count = call(body, /*count_tokens=*/true);
  EXPECT_EQ(count->json()["input_tokens"].get<int>(),
            m["usage"]["input_tokens"].get<int>() + m["usage"]["cache_read_input_tokens"].get<int>());
}

TEST_F(AnthropicApiTest, ErrorsInAnthropicShape) {
  auto expect_400 = [](const Json& body, const std::string& needle, bool count_tokens = false) {
    auto res = call(body, count_tokens);
    EXPECT_EQ(res->status(), 400) << res->body();
    Json e = res->json();
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos) << e.dump();
  };
  Json body = request();
  body.erase("max_tokens");
  expect_400(body, "max_tokens: field required");
  body = request();
  body["messages"] = Json::array();
  expect_400(body, "messages: must contain at least one message");
  expect_400(body, "messages: must contain at least one message", /*count_tokens=*/true);
  body["messages"] = {{{"role", "tool"}, {"content", "x"}}};
  expect_400(body, "messages[0].role");
  body["messages"] = Json::parse(R"([{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])");
  expect_400(body, "images are not supported");
  body = request();
  body["max_tokens"] = "12";
  expect_400(body, "max_tokens: expected an integer");
  body["max_tokens"] = 100000;  // beyond the 1024-token context
  expect_400(body, "max_tokens");

  HttpRequest req;
  req.body = "{not json";
  auto res = std::make_shared<FakeResponder>();
  handle_messages(*ctx_, req, res);
  EXPECT_EQ(res->status(), 400);
  EXPECT_EQ(res->json()["error"]["message"].get<std::string>().rfind("the request body is not valid JSON: ", 0), 0u)
      << res->body();
}

TEST_F(AnthropicApiTest, DisconnectCancelsGeneration) {
  Json body = request(400);
  body["stream"] = true;
  HttpRequest req;
  req.body = body.dump();
  auto res = std::make_shared<FakeResponder>();
  handle_messages(*ctx_, req, res);
  res->disconnect();
  ASSERT_TRUE(res->wait());
  // Cancelled at a step boundary: no message_stop, nothing left running.
  EXPECT_EQ(res->body().find("message_stop"), std::string::npos);
  for (int i = 0; i < 200 && engine_->stats().running + engine_->stats().waiting > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->stats().running + engine_->stats().waiting, 0);
}

}  // namespace
}  // namespace rill::server
