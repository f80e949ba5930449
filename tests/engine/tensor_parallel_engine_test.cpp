// The engine over a tensor-parallel model (simulated ranks on the CPU): the
// scheduler's paged KV, chunked prefill and batching drive the split model
// unchanged. Greedy tokens equal the one-device engine's; and since every
// rank's ops and the group's sums are batch-invariant, a prompt gives the
// same tokens alone, batched with others and from the prefix cache, also
// when sampling with a seed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::unique_ptr<Engine> make_engine(const std::string& family, int tensor_parallel) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 10;  // prompts are prefilled in chunks, sharing steps
  o.max_running = 8;
  o.kv_cache_mb = 4;
  o.check_integrity = true;
  auto files = open_model_files(test::hf_golden_dir(family));
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

struct Case {
  std::string family;
  int n_ranks;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << " N=" << c.n_ranks;
}

class TensorParallelEngine : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelEngine, TokensMatchOneDeviceAndAreBatchInvariant) {
  const auto [family, n_ranks] = GetParam();
  if (!test::has_hf_golden(test::hf_golden_dir(family))) GTEST_SKIP() << "no golden " << family;
  auto one = make_engine(family, 1);
  auto tp = make_engine(family, n_ranks);
  ASSERT_TRUE(one && tp);
  const auto prompts = test::prompts_from(test::read_hf_golden(test::hf_golden_dir(family)).prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(test::generate_all(*tp, prompts, greedy, true, 1, 12),
            test::generate_all(*one, prompts, greedy, true, 1, 12));

  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 11;
  const auto alone = test::generate_all(*tp, prompts, seeded, false, 2, 12);
  const auto batched = test::generate_all(*tp, prompts, seeded, true, 3, 12);
  const auto cached = test::generate_all(*tp, prompts, seeded, true, 2, 12);  // prefix-cache hits
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
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace rill
