// POST /v1/cache/warm against the real default model: a text prompt or chat
// messages (rendered without the generation prompt) are computed and written
// to the disk tier as whole KV blocks; the reply counts them; a later
// completion / chat request that starts with the prefix reports them as
// cached; bad input is a 400 naming the field; a server without a disk tier
// refuses with a message naming --cache-dir.
#include <unistd.h>

#include <filesystem>
#include <random>

#include "kv/kv_dir.h"
#include "server/app.h"
#include "server/cache_warm.h"
#include "server/chat_stream.h"
#include "server_test_util.h"

namespace rill::server::testing {
namespace {
namespace fs = std::filesystem;

// An engine over a fresh cache directory, shared by the suite.
class CacheWarm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("rill_warm_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}())));
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 1024;
    eo.kv_cache_mb = 24;
    eo.cache_dir = dir_->string();
    auto e = Engine::load(RILL_MODEL_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf", eo);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    ServerOptions options;
    options.model_id = "smollm2-test";
    ctx_.reset(new ServerContext{*engine_, engine_->chat_template(), options, nullptr, nullptr, nullptr});
  }
  using HandlerFn = void (*)(ServerContext&, const HttpRequest&, std::shared_ptr<Responder>);
  std::shared_ptr<FakeResponder> post(HandlerFn handler, const json& body) {
    HttpRequest req;
    req.method = "POST";
    req.body = body.dump();
    auto res = std::make_shared<FakeResponder>();
    handler(*ctx_, req, res);
    EXPECT_TRUE(res->wait(std::chrono::seconds(60)));
    return res;
  }

  static inline fs::path* dir_ = nullptr;
  static inline Engine* engine_ = nullptr;
  std::unique_ptr<ServerContext> ctx_;
};

std::string long_text(int n_words) {
  static const char* kWords[] = {"river",  "stone", "light", "maps", "quiet",
                                 "engine", "north", "paper", "salt", "glass"};
  std::string s = "Background for every answer:";
  for (int i = 0; i < n_words; ++i) s += std::string(" ") + kWords[(i * 7 + i / 3) % 10];
  return s;
}

TEST_F(CacheWarm, TextPromptIsStoredAndThenHit) {
  const std::string text = long_text(120);
  auto res = post(&handle_cache_warm, {{"prompt", text}});
  ASSERT_EQ(res->status(), 200) << res->body();
  const json j = res->json();
  const auto ids = engine_->tokenizer()->encode(text, true, true);
  EXPECT_EQ(j["object"], "cache.warm");
  EXPECT_EQ(j["tokens"], ids.size());
  const int cached = j["cached_tokens"];
  EXPECT_EQ(cached, static_cast<int>(ids.size()) / 16 * 16) << "every whole block of the prompt";
  auto entries = list_kv_dir(dir_->string());
  ASSERT_TRUE(entries.ok());
  bool found = false;
  for (const KvDirEntry& e : *entries) found |= e.tokens == cached;
  EXPECT_TRUE(found) << "a file holding the warmed prefix";
  EXPECT_GE(engine_->stats().disk_tier.entries, 1);

  // The same prompt as token ids stores the same prefix.
  auto by_ids = post(&handle_cache_warm, {{"prompt", ids}});
  ASSERT_EQ(by_ids->status(), 200) << by_ids->body();
  EXPECT_EQ(by_ids->json()["cached_tokens"], cached);

  // A completion that continues the text starts from the cached blocks.
  auto done = post(&handle_completions, {{"prompt", text + " and then"}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(done->status(), 200) << done->body();
  EXPECT_GE(done->json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), cached - 16);
}

TEST_F(CacheWarm, MessagesAreRenderedWithoutTheGenerationPrompt) {
  const json system = {{"role", "system"}, {"content", long_text(100)}};
  auto res = post(&handle_cache_warm, {{"messages", json::array({system})}});
  ASSERT_EQ(res->status(), 200) << res->body();
  const int n = res->json()["tokens"];
  const int cached = res->json()["cached_tokens"];
  auto ids = cache_warm_chat_ids(*ctx_, nlohmann::ordered_json::array({system}));
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(static_cast<int>(ids->size()), n);
  const std::string rendered = engine_->tokenizer()->decode(*ids, /*skip_special=*/false);
  EXPECT_EQ(rendered.find("assistant"), std::string::npos) << "no assistant turn opened: " << rendered;

  // A chat request with that system message and a question shares the prefix.
  json user_turn = {{"role", "user"}, {"content", "What comes first?"}};
  ChatInput in;
  in.messages = nlohmann::ordered_json::array({system, user_turn});
  auto full = render_chat_prompt(*ctx_, in, nullptr);
  ASSERT_TRUE(full.ok());
  ASSERT_GT(full->size(), ids->size());
  EXPECT_TRUE(std::equal(ids->begin(), ids->end(), full->begin())) << "the warm prefix prefixes the chat prompt";
  auto chat = post(&handle_chat_completions,
                   {{"messages", json::array({system, user_turn})}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(chat->status(), 200) << chat->body();
  EXPECT_GE(chat->json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), cached);
}

TEST_F(CacheWarm, BadInputNamesTheField) {
  struct Case {
    json body;
    std::string param;
  };
  const Case cases[] = {
      {json::object(), "prompt"},
      {{{"prompt", "x"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}, "messages"},
      {{{"prompt", 42}}, "prompt"},
      {{{"prompt", json::array({1, 2, 49152})}}, "prompt"},  // outside the vocabulary
      {{{"prompt", json::array({1, "two"})}}, "prompt"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", ""}}, "prompt"},
      {{{"messages", "hello"}}, "messages"},
      {{{"messages", json::array()}}, "messages"},
      {{{"messages", json::array({{{"content", "x"}}})}}, "messages[0].role"},
      {{{"prompt", long_text(2000)}}, "prompt"},  // beyond the 1,024-token context
  };
  for (const Case& c : cases) {
    auto res = post(&handle_cache_warm, c.body);
    EXPECT_EQ(res->status(), 400) << c.body.dump().substr(0, 200) << " -> " << res->body();
    EXPECT_EQ(res->json()["error"]["param"], c.param) << c.body.dump().substr(0, 200) << " -> " << res->body();
  }
  HttpRequest req;
  req.method = "POST";
  req.body = "{not json";
  auto res = std::make_shared<FakeResponder>();
  handle_cache_warm(*ctx_, req, res);
  ASSERT_TRUE(res->wait(std::chrono::seconds(5)));
  EXPECT_EQ(res->status(), 400);
}

// /stats and /metrics through the App show the disk tier after a warm-up.
TEST_F(CacheWarm, StatsAndMetricsShowTheDiskTier) {
  ASSERT_EQ(post(&handle_cache_warm, {{"prompt", long_text(60)}})->status(), 200);
  Metrics metrics;
  ctx_->metrics = &metrics;
  App app(*ctx_);
  auto get = [&](const std::string& path) {
    HttpRequest req;
    req.method = "GET";
    req.path = path;
    auto res = std::make_shared<FakeResponder>();
    app.dispatch(req, res);
    EXPECT_TRUE(res->wait(std::chrono::seconds(5)));
    return res;
  };
  const json st = get("/stats")->json();
  const json& disk = st["kv"]["tiers"]["disk"];
  EXPECT_EQ(disk["enabled"], true);
  EXPECT_GE(disk["entries"].get<int>(), 1);
  EXPECT_GT(disk["bytes"].get<int64_t>(), 0);
  for (const char* k : {"hits", "misses", "evictions", "errors", "loads", "load_seconds"})
    EXPECT_TRUE(disk.contains(k)) << k;
  EXPECT_EQ(st["kv"]["tiers"]["ram"]["enabled"], false);
  EXPECT_TRUE(st["kv"]["tiers"].contains("restored_tokens"));
  EXPECT_EQ(st["kv"]["bytes_per_token"].get<int64_t>(), ctx_->engine.stats().kv_bytes_per_token);
  EXPECT_GT(st["kv"]["bytes_per_token"].get<int64_t>(), 0);
  const std::string text = get("/metrics")->body();
  EXPECT_NE(text.find("rill_kv_tier_enabled{tier=\"disk\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rill_kv_tier_entries{tier=\"disk\"} " + std::to_string(disk["entries"].get<int>()) + "\n"),
            std::string::npos);
}

// The shared default engine of ServerTest has no disk tier.
class CacheWarmWithoutDiskTier : public ServerTest {};

TEST_F(CacheWarmWithoutDiskTier, IsRefusedNamingTheFlag) {
  auto res = call(&handle_cache_warm, json({{"prompt", "hello there"}}).dump());
  EXPECT_EQ(res->status(), 400) << res->body();
  EXPECT_NE(res->json()["error"]["message"].get<std::string>().find("--cache-dir"), std::string::npos) << res->body();
}

}  // namespace
}  // namespace rill::server::testing
