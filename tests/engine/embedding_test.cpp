// Embedding requests through the engine: all-MiniLM-L6-v2 (bert.cpu)
// against sentence-transformers (the golden of tools/make_embedding_goldens.py)
// with many requests in flight at once, so they share steps; the default
// decoder (SmolLM2, which declares no pooling) refuses them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rill/engine.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

const std::string kMiniLm = std::string(RILL_MODEL_DIR) + "/all-MiniLM-L6-v2";
const std::string kSmolLm = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kGolden = std::string(RILL_TEST_DATA) + "/embeddings/all-minilm-l6-v2.json";

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

EngineOptions options() {
  EngineOptions o;
  o.n_threads = 2;
  o.max_batch_tokens = 512;
  o.max_running = 16;
  o.kv_cache_mb = 16;
  o.check_integrity = true;
  return o;
}

TEST(EngineEmbeddings, ConcurrentRequestsMatchSentenceTransformersAndShareSteps) {
  if (!std::filesystem::exists(kMiniLm)) GTEST_SKIP() << kMiniLm << " not found (run scripts/setup.sh)";
  auto e = Engine::load(kMiniLm, options());
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& engine = **e;
  std::ifstream in(kGolden);
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<RequestHandle> handles;
  std::vector<size_t> cases;
  for (int round = 0; round < 2; ++round) {
    for (size_t c = 0; c < golden["cases"].size(); ++c) {
      GenerationRequest r;
      r.prompt = golden["cases"][c]["embedded_ids"].get<std::vector<int32_t>>();
      r.embed = true;
      auto h = engine.submit(std::move(r));
      ASSERT_TRUE(h.ok()) << h.error().message;
      handles.push_back(std::move(*h));
      cases.push_back(c);
    }
  }
  std::vector<std::vector<float>> first(golden["cases"].size());
  for (size_t i = 0; i < handles.size(); ++i) {
    GenerationEvent ev, last;
    while (handles[i].next(ev)) last = std::move(ev);
    ASSERT_TRUE(last.finished);
    ASSERT_NE(last.finish_reason, FinishReason::kError) << last.error;
    const nlohmann::json& c = golden["cases"][cases[i]];
    EXPECT_EQ(last.usage.prompt_tokens, static_cast<int32_t>(c["embedded_ids"].size()));
    EXPECT_TRUE(last.token_ids.empty());
    const auto want = c["embedding"].get<std::vector<float>>();
    ASSERT_EQ(last.embedding.size(), want.size());
    EXPECT_GE(cosine(last.embedding, want), 0.9999) << c["text"];
    // The same bits whichever requests shared its step (the second round
    // repeats the texts; no KV is reused for embeddings).
    std::vector<float>& seen = first[cases[i]];
    if (seen.empty()) {
      seen = last.embedding;
    } else {
      EXPECT_EQ(0, std::memcmp(seen.data(), last.embedding.data(), seen.size() * sizeof(float)));
    }
  }
  const EngineStats s = engine.stats();
  EXPECT_LT(s.steps, static_cast<int64_t>(handles.size()));  // requests shared steps
  EXPECT_EQ(s.integrity_errors, 0);
}

TEST(EngineEmbeddings, EncoderRefusesGenerationAndOverlongInput) {
  if (!std::filesystem::exists(kMiniLm)) GTEST_SKIP() << kMiniLm << " not found (run scripts/setup.sh)";
  auto e = Engine::load(kMiniLm, options());
  ASSERT_TRUE(e.ok()) << e.error().message;
  GenerationRequest gen;
  gen.prompt = {101, 1037, 102};
  gen.max_tokens = 4;
  auto refused = (*e)->submit(gen);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("encoder"), std::string::npos) << refused.error().message;
  GenerationRequest longer;
  longer.embed = true;
  longer.prompt.assign(static_cast<size_t>((*e)->model().n_ctx()) + 1, 1037);
  auto too_long = (*e)->submit(longer);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("context"), std::string::npos) << too_long.error().message;
}

// SmolLM2 (the default model) declares no pooling: no embeddings, clearly.
TEST(EngineEmbeddings, DecoderWithoutDeclaredPoolingRefuses) {
  if (!std::filesystem::exists(kSmolLm)) GTEST_SKIP() << kSmolLm << " not found (run scripts/setup.sh)";
  auto e = Engine::load(kSmolLm, options());
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ((*e)->model().embedding().pooling, EmbeddingSpec::Pooling::kNone);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.embed = true;
  auto refused = (*e)->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("declares no pooling"), std::string::npos) << refused.error().message;
}

// A decoder that declares a pooling (the tiny transformers-golden Llama
// given a sentence-transformers last-token Pooling): its embedding requests
// share steps with a generation request, which still gives the golden
// greedy tokens, and the embedding is the same whatever shares its step.
TEST(EngineEmbeddings, DecoderEmbeddingsBatchWithGeneration) {
  namespace fs = std::filesystem;
  const fs::path golden_dir = fs::path(RILL_SHARED_DIR) / "goldens" / "hf" / "llama";
  if (!fs::exists(golden_dir / "golden.json")) GTEST_SKIP() << golden_dir << " not found";
  const fs::path dir = fs::temp_directory_path() / ("rill_engine_pooling_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "1_Pooling");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(golden_dir / f, dir / f);
  std::ofstream(dir / "modules.json")
      << R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
             {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
             {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])";
  std::ofstream(dir / "1_Pooling" / "config.json") << R"({"pooling_mode_lasttoken": true})";
  EngineOptions o = options();
  o.max_batch_tokens = 64;
  auto e = Engine::load(dir.string(), o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& engine = **e;
  std::ifstream in(golden_dir / "golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = golden["greedy_ids"].get<std::vector<int32_t>>();

  auto embed = [&](std::vector<int32_t> ids) {
    GenerationRequest r;
    r.prompt = std::move(ids);
    r.embed = true;
    auto h = engine.submit(std::move(r));
    EXPECT_TRUE(h.ok());
    return std::move(*h);
  };
  auto last_event = [](RequestHandle& h) {
    GenerationEvent ev, last;
    while (h.next(ev)) {
      last.token_ids.insert(last.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) {
        auto tokens = std::move(last.token_ids);
        last = std::move(ev);
        last.token_ids = std::move(tokens);
      }
    }
    return last;
  };
  RequestHandle alone = embed(prompt);
  const GenerationEvent reference = last_event(alone);
  ASSERT_EQ(reference.embedding.size(), 64u) << reference.error;

  const int64_t steps_before = engine.stats().steps;
  GenerationRequest gen;
  gen.prompt = prompt;
  gen.max_tokens = static_cast<int32_t>(greedy.size());
  gen.sampling.temperature = 0;
  gen.ignore_eos = true;
  auto g = engine.submit(std::move(gen));
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<RequestHandle> embeds;
  for (int i = 0; i < 4; ++i) embeds.push_back(embed(prompt));
  for (RequestHandle& h : embeds) {
    const GenerationEvent ev = last_event(h);
    ASSERT_EQ(ev.embedding.size(), reference.embedding.size()) << ev.error;
    EXPECT_EQ(0, std::memcmp(ev.embedding.data(), reference.embedding.data(), ev.embedding.size() * sizeof(float)));
  }
  const GenerationEvent done = last_event(*g);
  EXPECT_EQ(done.token_ids, greedy);
  // Five requests, one of them generating greedy.size() tokens, in fewer
  // steps than running them one after another would take.
  EXPECT_LT(engine.stats().steps - steps_before, static_cast<int64_t>(greedy.size()) + 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rill
