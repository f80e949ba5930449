// The MTP layer on CUDA (llama.cuda: GLM-4.5's nextn layer, through
// CudaModelBase's step kinds: forward_hidden and forward_mtp) on the tiny
// f32 checkpoint tests/data/mtp-glm4-moe: the hidden states and the MTP
// layer's fed-back rows match the CPU model's, the head's logits match
// tools/make_mtp_golden.py's numpy reference (1e-3) whole, in chunks and
// as one-token steps (which replay CUDA graphs of the MTP kind), and the
// speculator's chained drafts are the reference chain; an engine on the
// device with `--spec mtp` gives the output it gives without. Skipped
// without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "engine/mtp_speculator.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

const std::string kDir = std::string(RILL_TEST_DATA) + "/mtp-glm4-moe";

std::unique_ptr<Model> load(const std::shared_ptr<const ModelFiles>& files, Device d) {
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;  // every row of a 24-token prompt samples (the head's logits)
  o.mtp = true;
  auto m = create_model(builtin_registry(), infer_profile(*files), files, o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

// Logits of rows [from, from + len) of the head over (shifted, hidden).
Status mtp_rows(Model& m, const std::vector<int32_t>& shifted, const std::vector<float>& hidden,
                const std::vector<int32_t>& table, int32_t from, int32_t len, float* logits, float* out) {
  const int64_t E = m.config().n_embd;
  Batch b;
  b.add_sequence(shifted.data() + from, len, from, false, table);
  b.seqs[0].decode_from = 0;
  for (int32_t i = 0; i < len; ++i) b.sample_rows.push_back(i);
  return m.forward_mtp(b, hidden.data() + static_cast<size_t>(from) * E, logits, out);
}

TEST(MtpCuda, Glm4MoeMatchesTheCpuAndTheReference) {
  RILL_REQUIRE_GPU();
  std::ifstream in(kDir + "/golden.json");
  ASSERT_TRUE(in) << kDir;
  const auto gold = nlohmann::json::parse(in);
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = gold["mtp_logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(prompt.size());
  auto files = open_model_files(kDir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto gpu = load(*files, Device::kCuda);
  auto cpu = load(*files, Device::kCpu);
  ASSERT_TRUE(gpu && cpu);
  ASSERT_EQ(gpu->n_mtp_layers(), 1);
  const int64_t E = gpu->config().n_embd, V = gpu->n_vocab();
  const std::vector<int32_t> table = slot_block_table(0, gpu->n_ctx(), gpu->kv_block_size());

  std::vector<float> hidden[2], logits[2];
  for (int d = 0; d < 2; ++d) {
    Model& m = d == 0 ? *gpu : *cpu;
    Batch b;
    b.add_sequence(prompt.data(), n, 0, true, table);
    b.seqs[0].decode_from = n;
    hidden[d].resize(static_cast<size_t>(n * E));
    logits[d].resize(static_cast<size_t>(V));
    const Status st = m.forward_hidden(b, logits[d].data(), hidden[d].data());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  EXPECT_LT(test::max_abs_diff(hidden[0], hidden[1]), 1e-3) << "forward_hidden's rows";
  EXPECT_LT(test::max_abs_diff(logits[0], logits[1]), 1e-3) << "forward_hidden's logits";
  const auto next = static_cast<int32_t>(std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin());
  ASSERT_EQ(next, gold["next_token"].get<int32_t>());

  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(next);
  std::vector<float> cpu_out(static_cast<size_t>(n * E)), cpu_logits(static_cast<size_t>(n * V));
  const Status cpu_st = mtp_rows(*cpu, shifted, hidden[1], table, 0, n, cpu_logits.data(), cpu_out.data());
  ASSERT_TRUE(cpu_st.ok()) << cpu_st.error().message;
  // Whole, in chunks of 9, and one token a step (decode steps: the third
  // and later replay the MTP kind's CUDA graph).
  for (const int32_t split : {n, 9, 1}) {
    std::vector<float> got(static_cast<size_t>(n * V)), out(static_cast<size_t>(n * E));
    for (int32_t from = 0; from < n; from += split) {
      const int32_t len = std::min(split, n - from);
      const Status st = mtp_rows(*gpu, shifted, hidden[1], table, from, len, got.data() + static_cast<size_t>(from) * V,
                                 out.data() + static_cast<size_t>(from) * E);
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
    double err = 0;
    for (int32_t r = 0; r < n; ++r)
      for (int64_t v = 0; v < V; ++v)
        err = std::max(err, std::fabs(double(got[static_cast<size_t>(r * V + v)]) - want[r][v]));
    std::printf("glm4-moe MTP on CUDA, chunks of %d: max |logit - numpy reference| = %.3g\n", split, err);
    EXPECT_LT(err, 1e-3) << "chunks of " << split;
    EXPECT_LT(test::max_abs_diff(out, cpu_out), 1e-3) << "fed-back rows, chunks of " << split;
  }

  // The chain, every draft a one-token step on the device.
  const auto chain = gold["mtp_chain"].get<std::vector<int32_t>>();
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(next);
  MtpSpeculator spec(*gpu);
  const auto k = static_cast<int32_t>(chain.size());
  const HiddenRows rows{3, tokens, 0, n, hidden[0].data(), table, n, k};
  spec.observe(std::span<const HiddenRows>(&rows, 1));
  std::vector<int32_t> drafts;
  spec.propose(3, tokens, k, drafts);
  EXPECT_EQ(drafts, chain);
}

EngineOptions cuda_options(const std::string& spec) {
  EngineOptions o;
  o.device = Device::kCuda;
  o.batch_invariant = true;
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 4;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  return o;
}

TEST(MtpCuda, EngineOutputIsTheSameWithAndWithout) {
  RILL_REQUIRE_GPU();
  std::ifstream in(kDir + "/golden.json");
  ASSERT_TRUE(in) << kDir;
  const auto prompt = nlohmann::json::parse(in)["prompt_ids"].get<std::vector<int32_t>>();
  auto on = Engine::load(kDir, cuda_options("mtp"));
  auto off = Engine::load(kDir, cuda_options("off"));
  ASSERT_TRUE(on.ok()) << on.error().message;
  ASSERT_TRUE(off.ok()) << off.error().message;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len : {8u, 17u, 24u}) prompts.emplace_back(prompt.begin(), prompt.begin() + static_cast<long>(len));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = test::generate_all(**off, prompts, greedy, false, 1, 20);
  EXPECT_EQ(test::generate_all(**on, prompts, greedy, false, 1, 20), want);
  EXPECT_EQ(test::generate_all(**on, prompts, greedy, true, 2, 20), want) << "batched";
  EXPECT_GT((*on)->stats().spec_draft_tokens, 0);
  EXPECT_EQ((*on)->stats().integrity_errors, 0) << (*on)->stats().last_integrity_error;
}

}  // namespace
}  // namespace rill
