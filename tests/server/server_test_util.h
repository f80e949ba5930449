#pragma once
// A real engine on the default model (SmolLM2-135M-Instruct Q4_1, 2 threads,
// a 1,024-token context) shared by one test executable, a ServerContext over
// it, and helpers to call a handler with a JSON body and wait for its reply.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "fake_responder.h"
#include "rill/engine.h"
#include "server/api_handlers.h"
#include "server/metrics.h"
#include "server/server_context.h"
#include "text/tokenizer.h"

namespace rill::server::testing {

using json = nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 1024;
    eo.kv_cache_mb = 24;
    auto e = Engine::load(RILL_MODEL_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf", eo);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value().release();
    metrics_ = new Metrics();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete metrics_;
    engine_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    ServerOptions options;
    options.model_id = "smollm2-test";
    options.max_n = 4;
    ctx_.reset(new ServerContext{*engine_, engine_->chat_template(), options, metrics_, nullptr, nullptr});
  }

  using HandlerFn = void (*)(ServerContext&, const HttpRequest&, std::shared_ptr<Responder>);
  std::shared_ptr<FakeResponder> call(HandlerFn handler, const std::string& body, bool wait = true) {
    HttpRequest req;
    req.method = "POST";
    req.body = body;
    auto res = std::make_shared<FakeResponder>();
    handler(*ctx_, req, res);
    if (wait) {
      EXPECT_TRUE(res->wait(std::chrono::seconds(60)));
    }
    return res;
  }
  std::shared_ptr<FakeResponder> chat(const json& body, bool wait = true) {
    return call(&handle_chat_completions, body.dump(), wait);
  }
  std::shared_ptr<FakeResponder> completions(const json& body, bool wait = true) {
    return call(&handle_completions, body.dump(), wait);
  }
  // The JSON payloads of the SSE frames, checking the stream ends with [DONE].
  static std::vector<json> sse_chunks(const FakeResponder& res) {
    std::vector<json> out;
    auto events = res.events();
    EXPECT_FALSE(events.empty());
    if (events.empty()) return out;
    EXPECT_EQ(events.back().second, "[DONE]");
    for (size_t i = 0; i + 1 < events.size(); ++i) out.push_back(json::parse(events[i].second));
    return out;
  }
  // Waits until the engine runs nothing.
  static bool engine_idle(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      EngineStats s = engine_->stats();
      if (s.running == 0 && s.waiting == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static json user(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

  static inline Engine* engine_ = nullptr;
  static inline Metrics* metrics_ = nullptr;
  std::unique_ptr<ServerContext> ctx_;
};

}  // namespace rill::server::testing
