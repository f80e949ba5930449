// POST/GET/DELETE /v1/responses handlers against the real engine on
// SmolLM2-135M (greedy, a few tokens per request), through FakeResponder:
// the reply and the stream match the engine's own greedy output, prompts are
// the template's rendering of the whole previous_response_id chain (exact
// token counts), instructions carry over, the store expires through an
// injected clock, errors name the field, a disconnect cancels, and an engine
// failure becomes an `error` event.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "fake_responder.h"
#include "rill/engine.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/response_store.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;
using testing::FakeResponder;

const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr double kTtlS = 60;

// Delegates to a real engine but fails every request after one token of text,
// on its own thread (as the engine thread would).
class FailingEngine final : public Engine {
 public:
  explicit FailingEngine(Engine& real) : real_(real) {}
  ~FailingEngine() override {
    if (worker_.joinable()) worker_.join();
  }
  using Engine::submit;
  Result<uint64_t> submit(GenerationRequest, EventCallback on_event) override {
    if (worker_.joinable()) worker_.join();
    worker_ = std::thread([cb = std::move(on_event)] {
      GenerationEvent first;
      first.token_ids = {42};
      first.text = "Hel";
      cb(std::move(first));
      GenerationEvent last;
      last.finished = true;
      last.finish_reason = FinishReason::kError;
      last.error = "injected failure";
      cb(std::move(last));
    });
    return uint64_t(1);
  }
  void cancel(uint64_t) override {}
  void shut_down(std::string) override {}
  EngineStats stats() const override { return real_.stats(); }
  const Model& model() const override { return real_.model(); }
  const Tokenizer* tokenizer() const override { return real_.tokenizer(); }
  const ChatTemplate* chat_template() const override { return real_.chat_template(); }
  const std::vector<int32_t>& eos_ids() const override { return real_.eos_ids(); }

 private:
  Engine& real_;
  std::thread worker_;
};

class ResponsesApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.kv_cache_mb = 64;
    auto e = Engine::load(kModel, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    store_ = std::make_unique<ResponseStore>(kTtlS, 16 << 20, [this] { return now_; });
    ServerOptions options;
    options.model_id = "smollm2-test";
    ctx_ = std::make_unique<ServerContext>(
        ServerContext{*engine_, engine_->chat_template(), options, nullptr, store_.get(), nullptr});
  }

  std::shared_ptr<FakeResponder> call(const char* method, const std::string& path, const std::string& body,
                                      ServerContext* ctx = nullptr) {
    if (ctx == nullptr) ctx = ctx_.get();
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.body = body;
    auto res = std::make_shared<FakeResponder>();
    if (req.method == "POST") handle_responses_create(*ctx, req, res);
    if (req.method == "GET") handle_responses_get(*ctx, req, res);
    if (req.method == "DELETE") handle_responses_delete(*ctx, req, res);
    EXPECT_TRUE(res->wait());
    return res;
  }
  Json post(const Json& body, int expected_status = 200) {
    auto res = call("POST", "/v1/responses", body.dump());
    EXPECT_EQ(res->status(), expected_status) << res->body();
    return Json::parse(res->body());
  }
  // The error body of a failed call, checked for the OpenAI shape.
  Json error_of(const std::shared_ptr<FakeResponder>& res, int status, const std::string& param) {
    EXPECT_EQ(res->status(), status) << res->body();
    Json body = Json::parse(res->body());
    const Json& e = body["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_EQ(e["type"], status >= 500 ? "server_error" : "invalid_request_error");
    if (param.empty()) {
      EXPECT_TRUE(e["param"].is_null()) << body.dump();
    } else {
      EXPECT_EQ(e["param"], param) << body.dump();
    }
    return body;
  }
  // Prompt length of chat messages as the template renders them.
  int64_t prompt_tokens(const Json& messages, const Json& tools = nullptr) {
    ChatInput in;
    in.messages = messages;
    in.tools = tools;
    auto ids = render_chat_prompt(*ctx_, in, nullptr);
    EXPECT_TRUE(ids.ok()) << ids.error().message;
    return ids.ok() ? int64_t(ids.value().size()) : -1;
  }
  // The engine's own greedy continuation of those messages.
  std::string greedy_text(const Json& messages, int32_t max_tokens) {
    ChatInput in;
    in.messages = messages;
    auto ids = render_chat_prompt(*ctx_, in, nullptr);
    EXPECT_TRUE(ids.ok());
    GenerationRequest g;
    g.prompt = ids.value();
    g.sampling.temperature = 0;
    g.max_tokens = max_tokens;
    auto handle = engine_->submit(std::move(g));
    EXPECT_TRUE(handle.ok());
    std::string text;
    GenerationEvent ev;
    while (handle.value().next(ev)) text += ev.text;
    return text;
  }
  static std::string output_text(const Json& response) {
    std::string text;
    for (const Json& item : response["output"]) {
      if (item["type"] != "message") continue;
      for (const Json& part : item["content"]) text += part["text"].get<std::string>();
    }
    return text;
  }

  static Engine* engine_;
  ResponseStore::Clock::time_point now_ = ResponseStore::Clock::time_point(std::chrono::hours(1));
  std::unique_ptr<ResponseStore> store_;
  std::unique_ptr<ServerContext> ctx_;
};

Engine* ResponsesApi::engine_ = nullptr;

TEST_F(ResponsesApi, PlainResponseMatchesTheEngineAndIsStored) {
  const Json r = post({{"input", "What is the capital of France?"}, {"max_output_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["model"], "smollm2-test");
  EXPECT_TRUE(r["instructions"].is_null());
  EXPECT_TRUE(r["previous_response_id"].is_null());
  EXPECT_EQ(r["store"], true);
  EXPECT_EQ(r["max_output_tokens"], 8);
  EXPECT_GT(r["created_at"].get<int64_t>(), 1'600'000'000);
  ASSERT_EQ(r["output"].size(), 1u);
  const Json& msg = r["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  EXPECT_EQ(msg["content"][0]["annotations"], Json::array());

  const Json messages = Json::parse(R"([{"role": "user", "content": "What is the capital of France?"}])");
  EXPECT_EQ(output_text(r), greedy_text(messages, 8));
  const Json& usage = r["usage"];
  EXPECT_EQ(usage["input_tokens"], prompt_tokens(messages));
  const int64_t n_out = usage["output_tokens"];
  EXPECT_GE(n_out, 1);
  EXPECT_LE(n_out, 8);
  EXPECT_EQ(usage["total_tokens"], usage["input_tokens"].get<int64_t>() + n_out);
  EXPECT_EQ(usage["output_tokens_details"]["reasoning_tokens"], 0);
  if (r["status"] == "incomplete") {
    EXPECT_EQ(n_out, 8);
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(msg["status"], "incomplete");
  } else {
    EXPECT_EQ(r["status"], "completed");
    EXPECT_TRUE(r["incomplete_details"].is_null());
  }

  const std::string id = r["id"];
  auto got = call("GET", "/v1/responses/" + id, "");
  EXPECT_EQ(got->status(), 200);
  EXPECT_EQ(Json::parse(got->body()), r);
  auto del = call("DELETE", "/v1/responses/" + id, "");
  EXPECT_EQ(del->status(), 200);
  EXPECT_EQ(Json::parse(del->body()), (Json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}}));
  error_of(call("GET", "/v1/responses/" + id, ""), 404, "");
  error_of(call("DELETE", "/v1/responses/" + id, ""), 404, "");
}

TEST_F(ResponsesApi, StreamFollowsTheEventGrammarAndMatchesThePlainReply) {
  const Json body = {{"input", "Name three colors."}, {"max_output_tokens", 10}, {"temperature", 0}};
  const Json plain = post(body);
  Json streamed_body = body;
  streamed_body["stream"] = true;
  auto res = call("POST", "/v1/responses", streamed_body.dump());
  EXPECT_EQ(res->status(), 200);
  EXPECT_TRUE(res->streaming());
  EXPECT_EQ(res->content_type(), "text/event-stream");
  const auto events = res->events();
  ASSERT_GE(events.size(), 9u);

  std::vector<std::string> names;
  std::string deltas;
  for (size_t i = 0; i < events.size(); ++i) {
    const Json data = Json::parse(events[i].second);
    EXPECT_EQ(data["type"], events[i].first);
    EXPECT_EQ(data["sequence_number"], int64_t(i));
    if (events[i].first == "response.output_text.delta") {
      deltas += data["delta"].get<std::string>();
      EXPECT_EQ(data["output_index"], 0);
      EXPECT_EQ(data["content_index"], 0);
      EXPECT_TRUE(data["item_id"].is_string());
    }
    if (names.empty() || names.back() != events[i].first || events[i].first != "response.output_text.delta") {
      names.push_back(events[i].first);
    }
  }
  const std::string last = plain["status"] == "completed" ? "response.completed" : "response.incomplete";
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             last};
  EXPECT_EQ(names, expected);

  const Json created = Json::parse(events[0].second)["response"];
  EXPECT_EQ(created["status"], "in_progress");
  EXPECT_EQ(created["output"], Json::array());
  const Json done_text = Json::parse(events[events.size() - 4].second);
  EXPECT_EQ(done_text["text"], deltas);
  const Json final_response = Json::parse(events.back().second)["response"];
  EXPECT_EQ(final_response["id"], created["id"]);
  EXPECT_EQ(output_text(final_response), deltas);
  EXPECT_EQ(deltas, output_text(plain));  // greedy: same text either way
  EXPECT_EQ(final_response["usage"]["input_tokens"], plain["usage"]["input_tokens"]);
  EXPECT_EQ(final_response["output"][0]["id"], Json::parse(events[2].second)["item"]["id"]);

  auto got = call("GET", "/v1/responses/" + final_response["id"].get<std::string>(), "");
  EXPECT_EQ(Json::parse(got->body()), final_response);
}

TEST_F(ResponsesApi, ChainsCarryTheConversationAndInstructions) {
  const Json r1 = post({{"input", "My name is Ada."},
                        {"instructions", "You are a terse assistant."},
                        {"max_output_tokens", 8},
                        {"temperature", 0}});
  const Json r2 = post({{"input", "What is my name?"},
                        {"previous_response_id", r1["id"]},
                        {"max_output_tokens", 8},
                        {"temperature", 0}});
  EXPECT_EQ(r2["previous_response_id"], r1["id"]);
  EXPECT_EQ(r2["instructions"], "You are a terse assistant.");  // carried over

  Json messages = Json::parse(R"([{"role": "system", "content": "You are a terse assistant."},
                                   {"role": "user", "content": "My name is Ada."}])");
  const int64_t n1 = r1["usage"]["input_tokens"];
  EXPECT_EQ(n1, prompt_tokens(messages));
  messages.push_back({{"role", "assistant"}, {"content", output_text(r1)}});
  messages.push_back({{"role", "user"}, {"content", "What is my name?"}});
  const int64_t n2 = r2["usage"]["input_tokens"];
  EXPECT_EQ(n2, prompt_tokens(messages));
  EXPECT_EQ(output_text(r2), greedy_text(messages, 8));
  EXPECT_GT(n2, n1 + r1["usage"]["output_tokens"].get<int64_t>());
  // The first exchange's prompt was computed already: its full KV blocks
  // come from the prefix cache.
  const int64_t cached = r2["usage"]["input_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, n1 / 16 * 16);
  EXPECT_LT(cached, n2);

  // New instructions replace the carried ones; the chain keeps accumulating.
  const Json r3 = post({{"input", "Again?"},
                        {"previous_response_id", r2["id"]},
                        {"instructions", "Answer in French."},
                        {"max_output_tokens", 8},
                        {"temperature", 0}});
  EXPECT_EQ(r3["instructions"], "Answer in French.");
  messages[0]["content"] = "Answer in French.";
  messages.push_back({{"role", "assistant"}, {"content", output_text(r2)}});
  messages.push_back({{"role", "user"}, {"content", "Again?"}});
  EXPECT_EQ(r3["usage"]["input_tokens"], prompt_tokens(messages));

  const Json r4 = post({{"input", "Thanks."}, {"previous_response_id", r3["id"]}, {"max_output_tokens", 4}});
  EXPECT_EQ(r4["instructions"], "Answer in French.");
  messages.push_back({{"role", "assistant"}, {"content", output_text(r3)}});
  messages.push_back({{"role", "user"}, {"content", "Thanks."}});
  EXPECT_EQ(r4["usage"]["input_tokens"], prompt_tokens(messages));

  // A chain may also start from a streamed response.
  auto streamed =
      call("POST", "/v1/responses", Json{{"input", "Hi"}, {"stream", true}, {"max_output_tokens", 4}}.dump());
  const Json s = Json::parse(streamed->events().back().second)["response"];
  const Json r5 = post({{"input", "Bye"}, {"previous_response_id", s["id"]}, {"max_output_tokens", 4}});
  EXPECT_EQ(r5["usage"]["input_tokens"],
            prompt_tokens(Json::array({{{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", output_text(s)}},
                                       {{"role", "user"}, {"content", "Bye"}}})));
}

TEST_F(ResponsesApi, ExpiredOrUnstoredResponsesAre404) {
  const Json r1 = post({{"input", "Hello"}, {"max_output_tokens", 4}});
  const std::string id = r1["id"];
  now_ += std::chrono::seconds(int(kTtlS) - 1);
  EXPECT_EQ(call("GET", "/v1/responses/" + id, "")->status(), 200);
  now_ += std::chrono::seconds(1);  // exactly the TTL: expired
  const Json body = Json{{"input", "Again"}, {"previous_response_id", id}, {"max_output_tokens", 4}};
  const Json e = error_of(call("POST", "/v1/responses", body.dump()), 404, "previous_response_id");
  EXPECT_EQ(e["error"]["code"], "previous_response_not_found");
  EXPECT_NE(e["error"]["message"].get<std::string>().find(id), std::string::npos);
  error_of(call("GET", "/v1/responses/" + id, ""), 404, "");
  EXPECT_EQ(store_->stats().expirations, 1);

  const Json unstored = post({{"input", "Hello"}, {"max_output_tokens", 4}, {"store", false}});
  EXPECT_EQ(unstored["store"], false);
  error_of(call("GET", "/v1/responses/" + unstored["id"].get<std::string>(), ""), 404, "");
  const Json chained = Json{{"input", "x"}, {"previous_response_id", unstored["id"]}};
  error_of(call("POST", "/v1/responses", chained.dump()), 404, "previous_response_id");
  EXPECT_EQ(store_->stats().entries, 0);
}

TEST_F(ResponsesApi, ErrorsNameTheField) {
  error_of(call("POST", "/v1/responses", "{\"input\": "), 400, "");
  error_of(call("POST", "/v1/responses", R"({"max_output_tokens": 4})"), 400, "input");
  error_of(call("POST", "/v1/responses", R"({"input": []})"), 400, "input");
  error_of(call("POST", "/v1/responses", R"({"input": [{"role": "robot", "content": "x"}]})"), 400, "input[0].role");
  error_of(call("POST", "/v1/responses", R"({"input": "x", "temperature": "hot"})"), 400, "temperature");
  error_of(call("POST", "/v1/responses", R"({"input": "x", "tools": [{"type": "file_search"}]})"), 400,
           "tools[0].type");
  // More output than the 1,024-token context holds.
  const Json e =
      error_of(call("POST", "/v1/responses", R"({"input": "x", "max_output_tokens": 5000})"), 400, "max_output_tokens");
  EXPECT_EQ(e["error"]["message"].get<std::string>().rfind("max_output_tokens: ", 0), 0u);
  error_of(call("POST", "/v1/responses", R"({"input": "x", "previous_response_id": "resp_nope"})"), 404,
           "previous_response_id");
  EXPECT_EQ(store_->stats().entries, 0);
}

TEST_F(ResponsesApi, FunctionCallItemsRenderAsToolTurns) {
  const Json body = Json::parse(R"({"max_output_tokens": 4, "temperature": 0,
      "tools": [{"type": "function", "name": "get_weather", "description": "Current weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "input": [{"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                 "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"}]})");
  const Json r = post(body);
  const Json messages = Json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny", "name": "get_weather"}])");
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  EXPECT_EQ(r["usage"]["input_tokens"], prompt_tokens(messages, tools));
  EXPECT_EQ(r["tools"], body["tools"]);
  EXPECT_EQ(r["tool_choice"], "auto");
}

TEST_F(ResponsesApi, DisconnectCancelsTheGeneration) {
  const int64_t before = engine_->stats().completion_tokens;
  HttpRequest req;
  req.method = "POST";
  req.path = "/v1/responses";
  req.body = Json{
      {"input", "Write a very long story about a dragon."},
      {"stream", true},
      {"max_output_tokens", 500},
      {"temperature",
       0}}.dump();
  auto res = std::make_shared<FakeResponder>();
  handle_responses_create(*ctx_, req, res);
  res->disconnect();
  ASSERT_TRUE(res->wait());
  const std::string body = res->body();
  EXPECT_EQ(body.find("response.completed"), std::string::npos);
  EXPECT_NE(body.find("the generation was cancelled"), std::string::npos);
  for (int i = 0; i < 100 && engine_->stats().running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_->stats().running, 0);
  EXPECT_LT(engine_->stats().completion_tokens - before, 500);
  EXPECT_EQ(store_->stats().entries, 0);
}

TEST_F(ResponsesApi, EngineFailureEndsTheStreamWithResponseFailed) {
  FailingEngine failing(*engine_);
  ServerContext ctx{failing, engine_->chat_template(), ctx_->options, nullptr, store_.get(), nullptr};
  auto res = call("POST", "/v1/responses", R"({"input": "Hi", "stream": true, "max_output_tokens": 4})", &ctx);
  const auto events = res->events();
  ASSERT_FALSE(events.empty());
  std::vector<std::string> names;
  for (const auto& [name, data] : events) names.push_back(name);
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.failed"};
  EXPECT_EQ(names, expected);
  const Json failed = Json::parse(events.back().second);
  EXPECT_EQ(failed["response"]["status"], "failed");
  EXPECT_EQ(failed["response"]["error"]["code"], "server_error");
  EXPECT_EQ(failed["response"]["error"]["message"], "injected failure");
  EXPECT_EQ(failed["response"]["output"][0]["status"], "incomplete");
  EXPECT_EQ(failed["sequence_number"], 8);

  auto plain = call("POST", "/v1/responses", R"({"input": "Hi", "max_output_tokens": 4})", &ctx);
  const Json e = error_of(plain, 500, "");
  EXPECT_EQ(e["error"]["code"], "server_error");
  EXPECT_EQ(e["error"]["message"], "injected failure");
  EXPECT_EQ(store_->stats().entries, 0);
}

}  // namespace
}  // namespace rill::server
