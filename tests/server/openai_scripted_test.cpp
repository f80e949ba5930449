// /v1/chat/completions over a scripted engine (the real model, tokenizer and
// template, but events whose text the test chooses), for replies the small
// default model does not produce on its own: reasoning + content + a Hermes
// tool call (non-streamed message and streamed deltas, finish_reason
// "tool_calls"), and a generation that fails after streaming began (an error
// frame, then [DONE]) or before the reply (500).
#include <thread>

#include "server_test_util.h"

namespace rill::server::testing {
namespace {

// Answers every submit with `script`, from its own thread.
class ScriptedEngine final : public Engine {
 public:
  ScriptedEngine(Engine& real, std::vector<GenerationEvent> script) : real_(real), script_(std::move(script)) {}
  ~ScriptedEngine() override { join(); }
  // Waits for every script to be delivered (their callbacks use the
  // caller's ServerContext: join before it goes).
  void join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  Result<uint64_t> submit(GenerationRequest, EventCallback on_event) override {
    threads_.emplace_back([script = script_, on_event = std::move(on_event)]() mutable {
      for (GenerationEvent& ev : script) on_event(std::move(ev));
    });
    return uint64_t(threads_.size());
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
  std::vector<GenerationEvent> script_;
  std::vector<std::thread> threads_;
};

GenerationEvent text_event(std::string text) {
  GenerationEvent ev;
  ev.token_ids = {100};
  ev.text = std::move(text);
  return ev;
}

const json kTools = json::array(
    {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});

class OpenAiScripted : public ServerTest {
 protected:
  std::shared_ptr<FakeResponder> run_script(std::vector<GenerationEvent> script, json body) {
    ScriptedEngine scripted(*engine_, std::move(script));
    ServerContext ctx{scripted, engine_->chat_template(), ctx_->options, nullptr, nullptr, nullptr};
    HttpRequest req;
    req.body = body.dump();
    auto res = std::make_shared<FakeResponder>();
    handle_chat_completions(ctx, req, res);
    EXPECT_TRUE(res->wait(std::chrono::seconds(10)));
    scripted.join();  // a script may still run after the reply ended; ctx must outlive it
    return res;
  }
  static std::vector<GenerationEvent> tool_script() {
    std::vector<GenerationEvent> s = {text_event("<think>\nplan it"), text_event("\n</think>\n\nSure.\n<tool"),
                                      text_event("_call>\n{\"name\": \"get_weather\", "),
                                      text_event("\"arguments\": {\"city\": \"Pa"),
                                      text_event("ris\"}}\n</tool_call>")};
    GenerationEvent last;
    last.token_ids = {2};
    last.finished = true;
    last.finish_reason = FinishReason::kStop;
    last.stop_token = 2;
    last.usage.prompt_tokens = 30;
    last.usage.completion_tokens = 5;
    s.push_back(last);
    return s;
  }
};

TEST_F(OpenAiScripted, ToolCallReply) {
  json body = {{"messages", user("Weather in Paris?")}, {"tools", kTools}, {"max_tokens", 16}};
  auto res = run_script(tool_script(), body);
  ASSERT_EQ(res->status(), 200) << res->body();
  json j = res->json();
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Sure.");
  EXPECT_EQ(choice["message"]["reasoning_content"], "plan it");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);

  // Without tools the markup is content.
  body.erase("tools");
  j = run_script(tool_script(), body)->json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
}

TEST_F(OpenAiScripted, ToolCallStream) {
  json body = {{"messages", user("Weather in Paris?")}, {"tools", kTools}, {"max_tokens", 16}, {"stream", true}};
  auto res = run_script(tool_script(), body);
  auto chunks = sse_chunks(*res);
  std::string content, reasoning, finish;
  json calls = json::array();
  for (const json& c : chunks) {
    for (const json& ch : c["choices"]) {
      const json& d = ch["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const json& t : d["tool_calls"]) calls.push_back(t);
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(reasoning, "plan it");
  EXPECT_EQ(finish, "tool_calls");
  // As OpenAI streams a call: the first chunk has index, id, type and the
  // name with arguments "", the next ones index and arguments pieces only,
  // each its own chunk.
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"], json({{"name", "get_weather"}, {"arguments", ""}}));
  std::string arguments;
  for (size_t k = 1; k < calls.size(); ++k) {
    EXPECT_EQ(calls[k].size(), 2u) << calls[k];  // index and function
    EXPECT_EQ(calls[k]["index"], 0);
    EXPECT_EQ(calls[k]["function"].size(), 1u) << calls[k];
    arguments += calls[k]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(calls[1]["function"]["arguments"], R"({"city":"Pa)");  // as far as the model had written
  EXPECT_EQ(arguments, R"({"city":"Paris"})");
  // No partial marker ever streamed.
  EXPECT_EQ(res->body().find("<tool"), std::string::npos);
}

TEST_F(OpenAiScripted, FailureAfterAndBeforeStreaming) {
  GenerationEvent failed;
  failed.finished = true;
  failed.finish_reason = FinishReason::kError;
  failed.error = "the forward pass failed: boom";
  json body = {{"messages", user("Hi")}, {"max_tokens", 8}, {"stream", true}};
  auto res = run_script({text_event("Hello"), failed}, body);
  auto events = res->events();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back().second, "[DONE]");
  json err = json::parse(events[events.size() - 2].second);
  EXPECT_EQ(err["error"]["message"], "the forward pass failed: boom");
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_NE(res->body().find("\"content\":\"Hello\""), std::string::npos);

  body["stream"] = false;
  res = run_script({text_event("Hello"), failed}, body);
  EXPECT_EQ(res->status(), 500);
  EXPECT_EQ(res->json()["error"]["type"], "server_error");
}

}  // namespace
}  // namespace rill::server::testing
