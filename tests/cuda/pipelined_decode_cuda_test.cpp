// Pipelined decode on the CUDA runtime (engine.cpp run_step, CudaModelBase's
// StepOverlap): decode steps queued behind the step in flight, their tokens
// copied on the device from its draws. On the llama HF golden (f32, batch
// invariant), the engine with pipelined steps gives the tokens of the
// engine with serial steps, greedy and seeded, one request at a time and
// all at once, with requests ending at different steps; the greedy
// continuation is transformers' (the golden), and chained steps ran.
// Skipped without a CUDA device or the golden.
#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "cuda_test_util.h"
#include "rill/engine.h"

namespace rill {
namespace {

EngineOptions cuda_options(bool pipelined) {
  EngineOptions o;
  o.device = Device::kCuda;
  o.batch_invariant = true;  // a request's tokens do not depend on the batch the pipeline gives it
  o.n_ctx = 256;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.kv_cache_mb = 16;
  o.check_integrity = true;
  o.pipelined_decode = pipelined;
  return o;
}

// Every prompt's tokens; request i stops after 6 + 3 * i tokens, so
// requests end at different steps while others go on.
std::vector<std::vector<int32_t>> generate(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& sampling, bool concurrent) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  auto submit = [&](size_t i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.max_tokens = 6 + 3 * static_cast<int32_t>(i);
    r.ignore_eos = true;
    r.sampling = sampling;
    if (sampling.temperature > 0) r.sampling.seed = 500 + i;
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return std::move(h).value();
  };
  auto drain = [&](RequestHandle& h, size_t i) {
    GenerationEvent ev;
    while (h.next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
    }
  };
  if (concurrent) {
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts.size(); ++i) hs.push_back(submit(i));
    for (size_t i = 0; i < prompts.size(); ++i) drain(hs[i], i);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestHandle h = submit(i);
      drain(h, i);
    }
  }
  return out;
}

TEST(CudaPipelinedDecode, TokensAreTheSerialStepsTokens) {
  RILL_REQUIRE_GPU();
  const std::string dir = test::hf_golden_dir("llama");
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);
  auto piped = Engine::load(dir, cuda_options(true));
  auto serial = Engine::load(dir, cuda_options(false));
  ASSERT_TRUE(piped.ok()) << piped.error().message;
  ASSERT_TRUE(serial.ok()) << serial.error().message;
  test::expect_greedy_prefixes(**piped, g, 3, "llama on CUDA, pipelined decode");
  const auto prompts = test::prompts_from(g.prompt_ids);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_k = 40;
  seeded.top_p = 0.95f;
  for (const SamplingParams& sp : {greedy, seeded}) {
    const char* what = sp.temperature > 0 ? "seeded" : "greedy";
    const auto want = generate(**serial, prompts, sp, true);
    const auto alone = generate(**piped, prompts, sp, false);
    const auto batched = generate(**piped, prompts, sp, true);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(want[i].size(), 6 + 3 * i) << what << ", prompt " << i;
      EXPECT_EQ(alone[i], want[i]) << what << ", prompt " << i << " alone";
      EXPECT_EQ(batched[i], want[i]) << what << ", prompt " << i << " batched";
    }
  }
  EXPECT_GT((*piped)->stats().steps_pipelined, 0) << "no step was chained";
  EXPECT_EQ((*serial)->stats().steps_pipelined, 0);
  EXPECT_EQ((*piped)->stats().integrity_errors, 0) << (*piped)->stats().last_integrity_error;
}

}  // namespace
}  // namespace rill
