// Request JSON limits on every API (issue 15): deep nesting in any free-form
// field is a 400 naming the path (it used to overflow the stack in the
// template's json_to_value, or in the response store's dump), Responses
// metadata has OpenAI's shape, and integers follow one rule everywhere.
#include <string>

#include "server/response_store.h"
#include "server_test_util.h"

namespace rill::server::testing {
namespace {

// The crash report's shape: 27 KiB, 13,800 levels.
const std::string kDeep = std::string(13800, '[') + std::string(13800, ']');

class RequestLimits : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    store_ = std::make_unique<ResponseStore>(60, 16 << 20);
    ctx_->responses = store_.get();
  }
  // A 400 in the OpenAI shape whose param starts with `param` and whose
  // message names the depth limit.
  void expect_too_deep(const std::shared_ptr<FakeResponder>& res, const std::string& param) {
    ASSERT_EQ(res->status(), 400) << res->body().substr(0, 300);
    const json e = res->json()["error"];
    EXPECT_EQ(e["param"].get<std::string>().rfind(param, 0), 0u) << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("nested deeper than 128 levels"), std::string::npos) << e.dump();
  }
  // The same for Anthropic's shape (no param: the message starts with the path).
  void expect_anthropic_too_deep(const std::shared_ptr<FakeResponder>& res, const std::string& path) {
    ASSERT_EQ(res->status(), 400) << res->body().substr(0, 300);
    const json e = res->json();
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    const std::string message = e["error"]["message"];
    EXPECT_EQ(message.rfind(path, 0), 0u) << message;
    EXPECT_NE(message.find("nested deeper than 128 levels"), std::string::npos) << message;
  }
  std::unique_ptr<ResponseStore> store_;
};

const std::string kUser = R"({"role": "user", "content": "hi"})";

TEST_F(RequestLimits, ChatFreeFormFields) {
  expect_too_deep(call(&handle_chat_completions,
                       R"({"max_tokens": 1, "messages": [{"role": "user", "content": "hi", "extra": )" + kDeep + "}]}"),
                  "messages[0].extra[0][0]");
  expect_too_deep(
      call(&handle_chat_completions,
           R"({"max_tokens": 1, "messages": [)" + kUser +
               R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"p": )" + kDeep + "}}}]}"),
      "tools[0].function.parameters.p[0]");
  const std::string call_prefix =
      R"({"max_tokens": 1, "messages": [)" + kUser +
      R"(, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": )";
  expect_too_deep(call(&handle_chat_completions, call_prefix + R"({"p": )" + kDeep + "}}}]}]}"),
                  "messages[1].tool_calls[0].function.arguments.p[0]");
  // The same value sent as a JSON string, which the server parses for the template.
  expect_too_deep(call(&handle_chat_completions, call_prefix + json(R"({"p": )" + kDeep + "}").dump() + "}}]}]}"),
                  "messages[1].tool_calls[0].function.arguments.p[0]");
  expect_too_deep(call(&handle_chat_completions, R"({"max_tokens": 1, "messages": [)" + kUser +
                                                     R"(], "chat_template_kwargs": {"x": )" + kDeep + "}}"),
                  "chat_template_kwargs.x[0]");
  // Completions and cache warm-up read the body the same way.
  expect_too_deep(call(&handle_completions, R"({"prompt": "hi", "x": )" + kDeep + "}"), "x[0]");
}

TEST_F(RequestLimits, AnthropicFreeFormFields) {
  const std::string tool_use =
      R"({"model": "m", "max_tokens": 1, "messages": [)" + kUser +
      R"(, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"p": )" + kDeep +
      "}}]}]}";
  const std::string schema = R"({"model": "m", "max_tokens": 1, "messages": [)" + kUser +
                             R"(], "tools": [{"name": "f", "input_schema": {"p": )" + kDeep + "}}]}";
  for (auto handler : {&handle_messages, &handle_count_tokens}) {
    expect_anthropic_too_deep(call(handler, tool_use), "messages[1].content[0].input.p[0]");
    expect_anthropic_too_deep(call(handler, schema), "tools[0].input_schema.p[0]");
  }
}

TEST_F(RequestLimits, ResponsesFreeFormFields) {
  expect_too_deep(
      call(&handle_responses_create,
           R"({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"p": )" + kDeep + "}}]}"),
      "tools[0].parameters.p[0]");
  // metadata nested 64k deep used to crash the engine thread when the response was stored.
  const std::string very_deep = std::string(65536, '[') + std::string(65536, ']');
  expect_too_deep(call(&handle_responses_create,
                       R"({"input": "hi", "max_output_tokens": 1, "metadata": {"m": )" + very_deep + "}}"),
                  "metadata.m[0]");
  expect_too_deep(call(&handle_responses_create,
                       R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": )" +
                           json(R"({"p": )" + kDeep + "}").dump() + "}]}"),
                  "input[0].arguments.p[0]");
}

TEST_F(RequestLimits, DeepButWithinTheLimitIsServed) {
  // 120 levels in tool parameters (the body adds 4 around them): accepted.
  const std::string schema = std::string(120, '[') + std::string(120, ']');
  auto res = call(&handle_chat_completions,
                  R"({"max_tokens": 1, "messages": [)" + kUser +
                      R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"p": )" + schema +
                      "}}}]}");
  EXPECT_EQ(res->status(), 200) << res->body().substr(0, 300);
}

TEST_F(RequestLimits, ResponsesMetadataShape) {
  auto post = [&](const json& metadata) {
    json body = {{"input", "hi"}, {"max_output_tokens", 1}, {"metadata", metadata}};
    return call(&handle_responses_create, body.dump());
  };
  json ok = json::object();
  for (int i = 0; i < 16; ++i) ok["k" + std::to_string(i)] = std::string(512, 'v');
  ok[std::string(64, 'k')] = "x";
  ok.erase("k0");
  auto res = post(ok);
  ASSERT_EQ(res->status(), 200) << res->body().substr(0, 300);
  EXPECT_EQ(res->json()["metadata"], ok);
  EXPECT_EQ(store_->stats().entries, 1);

  json too_many = ok;
  too_many["k0"] = "x";
  auto error_of = [&](const json& metadata) {
    auto r = post(metadata);
    EXPECT_EQ(r->status(), 400) << r->body().substr(0, 300);
    return r->json()["error"];
  };
  EXPECT_EQ(error_of(too_many)["message"], "metadata: at most 16 key-value pairs");
  EXPECT_EQ(error_of({{std::string(65, 'k'), "x"}})["message"], "metadata: keys must be at most 64 characters");
  EXPECT_EQ(error_of({{"k", std::string(513, 'v')}})["param"], "metadata.k");
  EXPECT_EQ(error_of({{"k", {{"nested", "object"}}}})["message"], "metadata.k: expected a string, got an object");
  // Characters, not bytes: 512 two-byte characters fit.
  std::string wide;
  for (int i = 0; i < 512; ++i) wide += "\xc3\xa9";
  EXPECT_EQ(post({{"k", wide}})->status(), 200);
}

TEST_F(RequestLimits, IntegralFloatsAreIntegersOnEveryApi) {
  auto res = call(&handle_chat_completions, R"({"max_tokens": 2.0, "n": 1.0, "messages": [)" + kUser + "]}");
  EXPECT_EQ(res->status(), 200) << res->body();
  res = call(&handle_messages, R"({"model": "m", "max_tokens": 2.0, "top_k": 5.0, "messages": [)" + kUser + "]}");
  EXPECT_EQ(res->status(), 200) << res->body();
  res = call(&handle_responses_create, R"({"input": "hi", "max_output_tokens": 2.0, "top_k": 5.0})");
  EXPECT_EQ(res->status(), 200) << res->body();
  // 2.5 is no integer anywhere, with one wording.
  res = call(&handle_messages, R"({"model": "m", "max_tokens": 2.5, "messages": [)" + kUser + "]}");
  EXPECT_EQ(res->json()["error"]["message"], "max_tokens: expected an integer, got a number");
  res = call(&handle_responses_create, R"({"input": "hi", "max_output_tokens": 2.5})");
  EXPECT_EQ(res->json()["error"]["message"], "max_output_tokens: expected an integer, got a number");
  res = call(&handle_chat_completions, R"({"max_tokens": 2.5, "messages": [)" + kUser + "]}");
  EXPECT_EQ(res->json()["error"]["message"], "max_tokens: expected an integer, got a number");
}

}  // namespace
}  // namespace rill::server::testing
