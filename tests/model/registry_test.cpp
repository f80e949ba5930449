#include "model/registry.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>

#include "core/e4m3.h"
#include "model/fingerprint.h"

namespace rill {
namespace {

Result<std::unique_ptr<Model>> no_model(std::shared_ptr<const ModelFiles>, const ModelOptions&) {
  return Error{"test factory"};
}

Implementation impl(std::string id, std::vector<std::string> graphs, Device device = Device::kCpu) {
  return {std::move(id), std::move(graphs), {"gguf", "hf"}, "autoregressive", device, &no_model, false};
}

ModelProfile profile(std::string graph, std::optional<std::string> id = std::nullopt) {
  ModelProfile p;
  p.graph = std::move(graph);
  p.loader = "hf";
  p.generation_loop = "autoregressive";
  p.implementation_id = std::move(id);
  return p;
}

bool has(const Error& e, const std::string& part) {
  return e.message.find(part) != std::string::npos;
}

TEST(Registry, RejectsEmptyAndDuplicateIds) {
  auto empty = ImplementationRegistry::create({impl("", {"llama"})});
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(has(empty.error(), "empty id"));
  auto dup = ImplementationRegistry::create({impl("a", {"llama"}), impl("a", {"qwen2"})});
  ASSERT_FALSE(dup.ok());
  EXPECT_TRUE(has(dup.error(), "duplicate implementation id 'a'"));
}

TEST(Registry, SelectsExactlyTheDeclaredImplementation) {
  auto r = ImplementationRegistry::create({impl("a.cpu", {"llama"}), impl("b.cpu", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto a = r->select(profile("llama", "b.cpu"), Device::kCpu);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->id, "b.cpu");
  // Two candidates on the device and none declared: ambiguous, not a guess.
  auto ambiguous = r->select(profile("llama"), Device::kCpu);
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_TRUE(has(ambiguous.error(), "must declare"));
}

TEST(Registry, RefusesToFallBack) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto missing = r->select(profile("llama", "llama.tpu"), Device::kCpu);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(has(missing.error(), "refusing to fall back"));
  auto wrong_graph = r->select(profile("gemma3", "llama.cpu"), Device::kCpu);
  ASSERT_FALSE(wrong_graph.ok());
  EXPECT_TRUE(has(wrong_graph.error(), "refusing to fall back"));
  auto unknown = r->select(profile("gemma3"), Device::kCpu);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(has(unknown.error(), "no implementation"));
}

TEST(Registry, SelectsPerDevice) {
  auto r = ImplementationRegistry::create(
      {impl("llama.cpu", {"llama"}, Device::kCpu), impl("llama.cuda", {"llama"}, Device::kCuda)});
  ASSERT_TRUE(r.ok());
  // One implementation per device is not ambiguous: the device picks it.
  auto cpu = r->select(profile("llama"), Device::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ((*cpu)->id, "llama.cpu");
  auto cuda = r->select(profile("llama"), Device::kCuda);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  EXPECT_EQ((*cuda)->id, "llama.cuda");
  EXPECT_EQ((*cuda)->device, Device::kCuda);
}

TEST(Registry, RefusesADeclaredIdOfAnotherDevice) {
  auto r = ImplementationRegistry::create(
      {impl("llama.cpu", {"llama"}, Device::kCpu), impl("llama.cuda", {"llama"}, Device::kCuda)});
  ASSERT_TRUE(r.ok());
  auto cuda_on_cpu = r->select(profile("llama", "llama.cuda"), Device::kCpu);
  ASSERT_FALSE(cuda_on_cpu.ok());
  EXPECT_TRUE(has(cuda_on_cpu.error(), "'llama.cuda' runs on cuda, not on cpu"));
  EXPECT_TRUE(has(cuda_on_cpu.error(), "refusing to fall back"));
  auto cpu_on_cuda = r->select(profile("llama", "llama.cpu"), Device::kCuda);
  ASSERT_FALSE(cpu_on_cuda.ok());
  EXPECT_TRUE(has(cpu_on_cuda.error(), "'llama.cpu' runs on cpu, not on cuda"));
  EXPECT_TRUE(has(cpu_on_cuda.error(), "refusing to fall back"));
}

TEST(Registry, NeverFallsBackToAnotherDevice) {
  auto cpu_only = ImplementationRegistry::create({impl("gemma.cpu", {"gemma3"}, Device::kCpu)});
  ASSERT_TRUE(cpu_only.ok());
  auto on_cuda = cpu_only->select(profile("gemma3"), Device::kCuda);
  ASSERT_FALSE(on_cuda.ok());
  EXPECT_TRUE(has(on_cuda.error(), "no cuda implementation"));
  EXPECT_TRUE(has(on_cuda.error(), "'gemma.cpu'"));
  EXPECT_TRUE(has(on_cuda.error(), "refusing to fall back to another device"));
  auto cuda_only = ImplementationRegistry::create({impl("gemma.cuda", {"gemma3"}, Device::kCuda)});
  ASSERT_TRUE(cuda_only.ok());
  auto on_cpu = cuda_only->select(profile("gemma3"), Device::kCpu);
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_TRUE(has(on_cpu.error(), "no cpu implementation"));
}

// create_model builds with the factory of options.device's implementation.
TEST(Registry, CreateModelCallsTheFactoryOfTheOptionsDevice) {
  auto tagged = [](std::string id, Device device) {
    Implementation i = impl(id, {"llama"}, device);
    i.create = [id](std::shared_ptr<const ModelFiles>, const ModelOptions&) -> Result<std::unique_ptr<Model>> {
      return Error{"factory " + id};
    };
    return i;
  };
  auto r = ImplementationRegistry::create({tagged("llama.cpu", Device::kCpu), tagged("llama.cuda", Device::kCuda)});
  ASSERT_TRUE(r.ok());
  auto files = std::make_shared<ModelFiles>();
  ModelOptions o;
  o.device = Device::kCuda;
  auto cuda = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.error().message, "factory llama.cuda");
  o.device = Device::kCpu;
  auto cpu = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.error().message, "factory llama.cpu");
}

// --quantize fp8 is the CUDA backend's: a CPU model refuses it before its
// factory runs, instead of loading float weights and ignoring it.
TEST(Registry, Fp8WeightsOnTheCpuAreRefused) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto files = std::make_shared<ModelFiles>();
  files->path = "m.gguf";
  ModelOptions o;
  o.quantize = WeightQuantization::kFp8;
  auto m = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(has(m.error(), "--quantize fp8")) << m.error().message;
  EXPECT_TRUE(has(m.error(), "m.gguf")) << m.error().message;
  o.quantize = WeightQuantization::kNone;
  auto plain = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.error().message, "test factory");
}

// q8_0h64 (rotated q8_0 in blocks of 64) runs on CUDA too: a CUDA model
// takes it to its factory (which checks the head_dim), on either side or
// from a --kv-config line, as the CPU does; so does k4c's iq4_nlh64.
TEST(Registry, Q8_0h64KvReachesTheCudaFactory) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"}), impl("llama.cuda", {"llama"}, Device::kCuda)});
  ASSERT_TRUE(r.ok());
  auto files = std::make_shared<ModelFiles>();
  files->path = "m.gguf";
  const std::optional<KvType> t = parse_kv_type("q8_0h64"), k4c_v = parse_kv_type("iq4_nlh64");
  ASSERT_TRUE(t && k4c_v);
  for (int side = 0; side < 3; ++side) {
    ModelOptions o;
    o.device = Device::kCuda;
    if (side == 0) o.kv_types.k = t;
    if (side == 1) o.kv_types.v = t;
    if (side == 2) o.kv_types.layers.push_back({1, 1, std::nullopt, t, "kv.conf:1"});
    auto m = create_model(*r, profile("llama"), files, o);
    ASSERT_FALSE(m.ok()) << side;
    EXPECT_EQ(m.error().message, "test factory") << side;
    o.device = Device::kCpu;
    auto cpu = create_model(*r, profile("llama"), files, o);
    ASSERT_FALSE(cpu.ok());
    EXPECT_EQ(cpu.error().message, "test factory") << side;
  }
  ModelOptions o;
  o.device = Device::kCuda;
  o.kv_types.k = o.kv_types.v = k4c_v;
  auto m = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message, "test factory");
}

// k4c's q4c K outside the Llama and Gemma families' models (here a hybrid
// family without tails, on either device): refused naming the rule first,
// before any device check; the Llama and Gemma models reach their factory
// on both devices.
TEST(Registry, Q4cIsRefusedWhereNoKvTailIsKeptFirst) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"}), impl("llama.cuda", {"llama"}, Device::kCuda),
                                           impl("gemma.cuda", {"gemma3"}, Device::kCuda), impl("gemma.cpu", {"gemma3"}),
                                           impl("qwen3_next.cpu", {"qwen3_next"}),
                                           impl("qwen3_next.cuda", {"qwen3_next"}, Device::kCuda)});
  ASSERT_TRUE(r.ok());
  auto files = std::make_shared<ModelFiles>();
  files->path = "m.gguf";
  for (const auto& [d, id] : {std::pair{Device::kCuda, "qwen3_next.cuda"}, std::pair{Device::kCpu, "qwen3_next.cpu"}}) {
    ModelOptions o;
    o.device = d;
    o.kv_types.k = KvType{kKvQ4Chan, false};
    o.kv_types.v = KvType{kKvIq4Nl64, true};
    auto m = create_model(*r, profile("qwen3_next"), files, o);
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(has(m.error(), "m.gguf: KV type q4c (k4c) runs on the Llama and Gemma families' models only"))
        << m.error().message;
    EXPECT_TRUE(has(m.error(), std::string("not on ") + id)) << m.error().message;
  }
  for (const Device d : {Device::kCpu, Device::kCuda}) {
    ModelOptions o;
    o.device = d;
    o.kv_types.k = KvType{kKvQ4Chan, false};
    o.kv_types.v = KvType{kKvIq4Nl64, true};
    for (const char* graph : {"llama", "gemma3"}) {
      auto m = create_model(*r, profile(graph), files, o);
      ASSERT_FALSE(m.ok());
      EXPECT_EQ(m.error().message, "test factory") << graph;
    }
  }
}

// q4a (k4a) runs on the Llama and Gemma families' models only (others
// refused naming the type: here gemma3 registered under another id than
// gemma.cpu / gemma.cuda), on CUDA as on the CPU.
TEST(Registry, Q4aRunsOnTheLlamaAndGemmaFamilies) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"}), impl("llama.cuda", {"llama"}, Device::kCuda),
                                           impl("gemma3.cpu", {"gemma3"}), impl("gemma.cpu", {"gemma2"})});
  ASSERT_TRUE(r.ok());
  auto files = std::make_shared<ModelFiles>();
  files->path = "m.gguf";
  ModelOptions o;
  o.kv_types.k = KvType{kKvQ4Alloc, false};
  o.kv_types.v = KvType{kKvIq4Nl64, true};
  o.device = Device::kCuda;
  auto cuda = create_model(*r, profile("llama"), files, o);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.error().message, "test factory");
  o.device = Device::kCpu;
  auto gemma = create_model(*r, profile("gemma3"), files, o);
  ASSERT_FALSE(gemma.ok());
  EXPECT_TRUE(has(gemma.error(), "m.gguf: KV type q4a (k4a) runs on the Llama and Gemma families' models only"))
      << gemma.error().message;
  for (const char* graph : {"llama", "gemma2"}) {
    auto m = create_model(*r, profile(graph), files, o);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().message, "test factory") << graph;
  }
}

TEST(Registry, WithReturnsANewRegistryAndLeavesTheOriginal) {
  auto r = ImplementationRegistry::create({impl("llama.cpu", {"llama"})});
  ASSERT_TRUE(r.ok());
  auto r2 = r->with(impl("gemma.cpu", {"gemma3"}));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r->implementations().size(), 1u);
  EXPECT_EQ(r2->implementations().size(), 2u);
  EXPECT_TRUE(r2->select(profile("gemma3"), Device::kCpu).ok());
  EXPECT_FALSE(r->select(profile("gemma3"), Device::kCpu).ok());
  EXPECT_FALSE(r->with(impl("llama.cpu", {"qwen2"})).ok());  // duplicate through with()
}

TEST(Registry, BuiltinNamesOneImplementationPerFamilyAndDevice) {
  struct Family {
    const char* name;
    std::vector<const char*> graphs;
    bool tensor_parallel;
    const char* loop = "autoregressive";
  };
  const std::vector<Family> families = {
      {"llama", {"llama", "mistral", "qwen2", "qwen3", "smollm", "mixtral", "qwen3_moe", "glm4_moe", "minicpm"}, true},
      {"gemma", {"gemma2", "gemma3_text", "gemma3"}, false},
      {"qwen3_next", {"qwen3_5_text", "qwen3_next"}, false},
      {"bert", {"bert"}, false, "encoder"},
      {"gpt_oss", {"gpt_oss"}, false},
      {"deepseek_v3", {"deepseek_v3"}, false},
      {"minicpm3", {"minicpm3"}, false},
      {"glm_moe_dsa", {"glm_moe_dsa"}, false},
  };
  EXPECT_EQ(builtin_registry().implementations().size(), 2 * families.size());
  for (const Family& f : families) {
    for (const char* graph : f.graphs) {
      // An encoder is chosen by its loop: an autoregressive profile of it is refused.
      ModelProfile p = profile(graph);
      EXPECT_EQ(builtin_registry().select(p, Device::kCpu).ok(), std::string(f.loop) == "autoregressive") << graph;
      p.generation_loop = f.loop;
      for (Device device : {Device::kCpu, Device::kCuda}) {
        auto sel = builtin_registry().select(p, device);
        ASSERT_TRUE(sel.ok()) << graph << ": " << sel.error().message;
        EXPECT_EQ((*sel)->id, std::string(f.name) + "." + device_name(device)) << graph;
        EXPECT_EQ((*sel)->device, device);
        EXPECT_EQ((*sel)->tensor_parallel, f.tensor_parallel) << (*sel)->id;
      }
    }
  }
}

#if !RILL_HAVE_CUDA
// A CUDA id is registered in every build; without CUDA its factory says so
// (before reading the files, so none are needed here).
TEST(Registry, CudaIdInABuildWithoutCudaSaysSo) {
  auto files = std::make_shared<ModelFiles>();
  files->config.n_head = 4;  // splits over 2 ranks, so tensor parallelism reaches the build check
  files->config.n_head_kv = 2;
  files->config.n_ff = 128;
  for (const char* graph : {"llama", "gemma3", "qwen3_next"}) {
    for (int tp : {1, 2}) {
      if (tp == 2 && std::string(graph) != "llama") continue;
      ModelOptions o;
      o.device = Device::kCuda;
      o.tensor_parallel = tp;
      files->config.architecture = graph;
      auto m = create_model(builtin_registry(), profile(graph, std::nullopt), files, o);
      ASSERT_FALSE(m.ok()) << graph;
      EXPECT_TRUE(has(m.error(), "built without CUDA") || has(m.error(), "needs a build with CUDA"))
          << graph << " tp " << tp << ": " << m.error().message;
    }
  }
}
#endif

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
