// The engine over a tensor-parallel model (simulated ranks on the CPU): the
// scheduler's paged KV, chunked prefill and batching drive the split model
// unchanged. Greedy tokens equal the one-device engine's; and since every
// rank's ops and the group's sums are batch-invariant, a prompt gives the
// same tokens alone, batched with others and from the prefix cache, also
// when sampling with a seed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

std::vector<int32_t> golden_prompt(const std::string& family) {
  std::ifstream in(kGoldens + family + "/golden.json");
  return nlohmann::json::parse(in)["prompt_ids"].get<std::vector<int32_t>>();
}

// Prompts of 3..24 tokens: slices and rotations of the golden prompt.
std::vector<std::vector<int32_t>> prompts_from(const std::vector<int32_t>& ids) {
  std::vector<std::vector<int32_t>> out;
  const size_t n = ids.size();
  for (size_t len : {3u, 24u, 11u, 5u, 17u, 8u}) {
    const size_t start = (out.size() * 5) % n;
    std::vector<int32_t> p;
    for (size_t i = 0; i < std::min(len, n); ++i) p.push_back(ids[(start + i) % n]);
    out.push_back(std::move(p));
  }
  return out;
}

std::unique_ptr<Engine> make_engine(const std::string& family, int tensor_parallel) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 10;  // prompts are prefilled in chunks, sharing steps
  o.max_running = 8;
  o.kv_cache_mb = 4;
  o.check_integrity = true;
  auto files = open_model_files(kGoldens + family);
  EXPECT_TRUE(files.ok()) << files.error().message;
  ModelOptions mo;
  mo.n_threads = o.n_threads;
  mo.n_ctx = o.n_ctx;
  mo.max_batch_tokens = o.max_batch_tokens;
  mo.max_batch_seqs = o.max_running;
  mo.kv_cache_bytes = o.kv_cache_mb << 20;
  mo.tensor_parallel = tensor_parallel;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return nullptr;
  auto engine = Engine::create(std::move(model).value(), nullptr, o);
  EXPECT_TRUE(engine.ok()) << engine.error().message;
  return engine.ok() ? std::move(engine).value() : nullptr;
}

std::vector<std::vector<int32_t>> generate(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& sampling, bool concurrent, uint64_t ns) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  auto request = [&](size_t i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.cache_namespace = ns;
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return std::move(h).value();
  };
  auto drain = [&](RequestHandle& h, size_t i) {
    GenerationEvent ev;
    while (h.next(ev)) {
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
    }
  };
  if (concurrent) {
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts.size(); ++i) hs.push_back(request(i));
    for (size_t i = 0; i < prompts.size(); ++i) drain(hs[i], i);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestHandle h = request(i);
      drain(h, i);
    }
  }
  return out;
}

struct Case {
  std::string family;
  int n_ranks;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.family << " N=" << c.n_ranks; }

class TensorParallelEngine : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelEngine, TokensMatchOneDeviceAndAreBatchInvariant) {
  const auto [family, n_ranks] = GetParam();
  if (!std::filesystem::exists(kGoldens + family)) GTEST_SKIP() << "no golden " << family;
  auto one = make_engine(family, 1);
  auto tp = make_engine(family, n_ranks);
  ASSERT_TRUE(one && tp);
  const auto prompts = prompts_from(golden_prompt(family));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(generate(*tp, prompts, greedy, true, 1), generate(*one, prompts, greedy, true, 1));

  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 11;
  const auto alone = generate(*tp, prompts, seeded, false, 2);
  const auto batched = generate(*tp, prompts, seeded, true, 3);
  const auto cached = generate(*tp, prompts, seeded, true, 2);  // prefix-cache hits
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(alone[i].size(), 12u);
    EXPECT_EQ(batched[i], alone[i]) << "prompt " << i;
    EXPECT_EQ(cached[i], alone[i]) << "prompt " << i << " from the prefix cache";
  }
  EXPECT_EQ(tp->stats().integrity_errors, 0) << tp->stats().last_integrity_error;
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelEngine,
                         ::testing::Values(Case{"llama", 2}, Case{"llama", 4}, Case{"qwen3-moe", 2},
                                           Case{"mixtral", 4}),
                         [](const auto& info) {
                           std::string n = info.param.family + "_N" + std::to_string(info.param.n_ranks);
                           for (char& c : n) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace rill
