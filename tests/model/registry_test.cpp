#include "model/registry.h"

#include <gtest/gtest.h>

#include "model/fingerprint.h"

namespace rill {
namespace {

Result<std::unique_ptr<Model>> no_model(std::shared_ptr<const ModelFiles>, const ModelOptions&) {
  return Error{"test factory"};
}

Implementation impl(std::string id, std::vector<std::string> graphs) {
  return {std::move(id), std::move(graphs), {"gguf", "hf"}, "autoregressive", &no_model};
}

ModelProfile profile(std::string graph, std::optional<std::string> id = std::nullopt) {
  ModelProfile p;
  p.graph = std::move(graph);
  p.loader = "hf";
  p.generation_loop = "autoregressive";
  p.implementation_id = std::move(id);
  return p;
}

TEST(Registry, RejectsEmptyAndDuplicateIds) {
  auto empty = ImplementationRegistry::create({impl("", {"llama"})});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty id"), std::string::npos);
  auto dup = ImplementationRegistry::create({impl("a", {"llama"}), impl("a", {"qwen2"})});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("duplicate implementation id 'a'"), std::string::npos);
}

TEST(Registry, SelectsExactlyTheDeclaredImplementation) {
  auto r = ImplementationRegistry::create({impl("cpu.a", {"llama"}), impl("cpu.b", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto a = r->select(profile("llama", "cpu.b"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->id, "cpu.b");
  // Two candidates and none declared: ambiguous, not a guess.
  auto ambiguous = r->select(profile("llama"));
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.error().message.find("must declare"), std::string::npos);
}

TEST(Registry, RefusesToFallBack) {
  auto r = ImplementationRegistry::create({impl("cpu.llama", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto missing = r->select(profile("llama", "cuda.llama"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("refusing to fall back"), std::string::npos);
  auto wrong_graph = r->select(profile("gemma3", "cpu.llama"));
  ASSERT_FALSE(wrong_graph.ok());
  EXPECT_NE(wrong_graph.error().message.find("refusing to fall back"), std::string::npos);
  auto unknown = r->select(profile("gemma3"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("no implementation"), std::string::npos);
}

TEST(Registry, WithReturnsANewRegistryAndLeavesTheOriginal) {
  auto r = ImplementationRegistry::create({impl("cpu.llama", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto r2 = r->with(impl("cpu.gemma", {"gemma3"}));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r->implementations().size(), 1u);
  EXPECT_EQ(r2->implementations().size(), 2u);
  EXPECT_TRUE(r2->select(profile("gemma3")).ok());
  EXPECT_FALSE(r->select(profile("gemma3")).ok());
  EXPECT_FALSE(r->with(impl("cpu.llama", {"qwen2"})).ok());  // duplicate through with()
}

TEST(Registry, BuiltinServesTheLlamaFamily) {
  for (const char* graph : {"llama", "mistral", "qwen2", "qwen3", "smollm"}) {
    auto sel = builtin_registry().select(profile(graph));
    ASSERT_TRUE(sel.ok()) << graph;
    EXPECT_EQ((*sel)->id, "cpu.llama");
  }
}

TEST(Fingerprint, ChangesWithEveryGraphFieldButNotWithGenerationDefaults) {
  ModelConfig c;
  c.architecture = "llama";
  c.n_vocab = 512;
  c.n_embd = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 128;
  const std::string base = config_fingerprint(c);
  EXPECT_EQ(base, config_fingerprint(c));
  ModelConfig d = c;
  d.generation.temperature = 0.3f;
  d.generation.eos_token_ids = {2};
  EXPECT_EQ(base, config_fingerprint(d));
  auto differs = [&](auto mutate) {
    ModelConfig m = c;
    mutate(m);
    return config_fingerprint(m) != base;
  };
  EXPECT_TRUE(differs([](ModelConfig& m) { m.n_layer = 3; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.rope_theta = 5e5f; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.sliding_window = 8; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.rope_scaling.type = RopeScaling::Type::kLlama3; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.rope_style = RopeStyle::kInterleaved; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.tie_word_embeddings = true; }));
  EXPECT_TRUE(differs([](ModelConfig& m) { m.raw = {{"query_pre_attn_scalar", 256}}; }));
}

}  // namespace
}  // namespace rill
