// The MTP layer on CUDA for every family that runs one (each family's one
// graph on the CUDA Backend, through CudaModelBase's step kinds:
// forward_hidden and forward_mtp): GLM-4.5's nextn layer (llama.cuda),
// DeepSeek-V3's and GLM-5's (deepseek_v3.cuda / glm_moe_dsa.cuda; GLM-5's
// with its own lightning indexer) and Qwen3-Next's mtp.* block
// (qwen3_next.cuda, a hybrid: the MTP layer is full attention, its steps
// name no recurrent state). On the tiny f32 checkpoints tests/data/mtp-*:
//  - the hidden states and the logits of forward_hidden match the CPU
//    model's (1e-3);
//  - the head's logits match tools/make_mtp_golden.py's numpy reference
//    and the CPU model's (1e-4, the CPU tests' bound; 1.3e-6 and 6e-7 on
//    the H200), and the fed-back rows the CPU's (1e-3), whole, in chunks
//    of 9 and as one-token steps (the third and later replay CUDA graphs of
//    the MTP kind);
//  - the speculator's chained drafts on the device are the reference
//    chain for every k up to the golden's;
//  - an engine on the device gives the same greedy output with `--spec
//    mtp` as without, at k = 1 and at k = 4 (chained drafts), alone and
//    batched, and the same output as the CPU engine with `--spec mtp`.
// RILL_TEST_DATA in the environment overrides the build-time path. Skipped
// without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
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

std::string data_dir(const std::string& name) {
  const char* env = std::getenv("RILL_TEST_DATA");
  return std::string(env ? env : RILL_TEST_DATA) + "/" + name;
}

nlohmann::json read_golden(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  EXPECT_TRUE(in) << dir;
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

std::unique_ptr<Model> load(const std::shared_ptr<const ModelFiles>& files, Device d) {
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;  // every row of a 24-token prompt samples (the head's logits)
  o.max_batch_seqs = 32;
  o.mtp = true;
  auto m = create_model(builtin_registry(), infer_profile(*files), files, o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

bool is_hybrid(const Model& m) {
  const KvSpec& groups = m.kv_spec();
  return std::any_of(groups.begin(), groups.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
}

// Logits of rows [from, from + len) of the head over (shifted, hidden).
Status mtp_rows(Model& m, const std::vector<int32_t>& shifted, const std::vector<float>& hidden,
                const std::vector<int32_t>& table, int32_t from, int32_t len, float* logits, float* out) {
  const int64_t E = m.config().n_embd;
  Batch b;
  b.add_sequence(shifted.data() + from, len, from, false, table);
  b.group_tables.resize(m.kv_spec().size() - 1);  // a hybrid's recurrent group: no blocks, no state
  b.seqs[0].decode_from = 0;
  for (int32_t i = 0; i < len; ++i) b.sample_rows.push_back(i);
  return m.forward_mtp(b, hidden.data() + static_cast<size_t>(from) * E, logits, out);
}

class MtpCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpCuda, HeadMatchesTheCpuAndTheNumpyReference) {
  RILL_REQUIRE_GPU();
  const std::string dir = data_dir(GetParam());
  const auto gold = read_golden(dir);
  ASSERT_TRUE(gold.contains("prompt_ids")) << dir;
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = gold["mtp_logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(prompt.size());
  auto files = open_model_files(dir);
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
    b.group_tables.resize(m.kv_spec().size() - 1);
    if (is_hybrid(m)) b.seqs[0].state_slot = 0;  // Qwen3-Next's recurrent state
    hidden[d].resize(static_cast<size_t>(n * E));
    logits[d].resize(static_cast<size_t>(V));
    const Status st = m.forward_hidden(b, logits[d].data(), hidden[d].data());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  EXPECT_LT(test::max_abs_diff(hidden[0], hidden[1]), 1e-3) << "forward_hidden's rows";
  EXPECT_LT(test::max_abs_diff(logits[0], logits[1]), 1e-3) << "forward_hidden's logits";
  const auto next = static_cast<int32_t>(std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin());
  ASSERT_EQ(next, gold["next_token"].get<int32_t>());

  // The head reads the CPU's rows, or the golden's given rows (Qwen3-Next:
  // no numpy gated DeltaNet), so the reference comparison is of the head.
  std::vector<float> rows = hidden[1];
  if (gold.contains("hidden")) {
    rows.clear();
    for (const auto& row : gold["hidden"]) {
      for (const auto& x : row) rows.push_back(x.get<float>());
    }
    ASSERT_EQ(rows.size(), static_cast<size_t>(n * E));
  }
  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(next);
  std::vector<float> cpu_out(static_cast<size_t>(n * E)), cpu_logits(static_cast<size_t>(n * V));
  const Status cpu_st = mtp_rows(*cpu, shifted, rows, table, 0, n, cpu_logits.data(), cpu_out.data());
  ASSERT_TRUE(cpu_st.ok()) << cpu_st.error().message;
  for (const int32_t split : {n, 9, 1}) {
    std::vector<float> got(static_cast<size_t>(n * V)), out(static_cast<size_t>(n * E));
    for (int32_t from = 0; from < n; from += split) {
      const int32_t len = std::min(split, n - from);
      const Status st = mtp_rows(*gpu, shifted, rows, table, from, len, got.data() + static_cast<size_t>(from) * V,
                                 out.data() + static_cast<size_t>(from) * E);
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
    double err = 0;
    for (int32_t r = 0; r < n; ++r)
      for (int64_t v = 0; v < V; ++v)
        err = std::max(err, std::fabs(double(got[static_cast<size_t>(r * V + v)]) - want[r][v]));
    const double vs_cpu = test::max_abs_diff(got, cpu_logits);
    std::printf("%s MTP on CUDA, chunks of %d: max |logit - numpy| = %.3g, |logit - CPU| = %.3g\n", GetParam().c_str(),
                split, err, vs_cpu);
    EXPECT_LT(err, 1e-4) << "chunks of " << split;  // the CPU tests' bound (tests/model/mtp_head_test.cpp)
    EXPECT_LT(vs_cpu, 1e-4) << "logits against the CPU's, chunks of " << split;
    EXPECT_LT(test::max_abs_diff(out, cpu_out), 1e-3) << "fed-back rows, chunks of " << split;
    const auto first_draft = static_cast<int32_t>(std::max_element(got.end() - V, got.end()) - (got.end() - V));
    EXPECT_EQ(first_draft, gold["mtp_greedy"].back().get<int32_t>()) << "chunks of " << split;
  }

  // The chains for every k, every draft past the first a one-token step on
  // the device (each observe rewrites the rows the previous chain wrote).
  const auto chain = gold["mtp_chain"].get<std::vector<int32_t>>();
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(next);
  const std::vector<float>& chain_rows = gold.contains("hidden") ? rows : hidden[0];
  MtpSpeculator spec(*gpu);
  for (int32_t k = 1; k <= static_cast<int32_t>(chain.size()); ++k) {
    const HiddenRows r{3, tokens, 0, n, chain_rows.data(), table, n, k, 0, {}};
    spec.observe(std::span<const HiddenRows>(&r, 1));
    std::vector<int32_t> drafts;
    spec.propose(3, tokens, k, drafts);
    EXPECT_EQ(drafts, std::vector<int32_t>(chain.begin(), chain.begin() + k)) << "k = " << k;
  }
}

EngineOptions engine_options(Device device, const std::string& spec, int32_t spec_tokens) {
  EngineOptions o;
  o.device = device;
  o.n_threads = 2;
  o.batch_invariant = device == Device::kCuda;  // a verify step's rows are the bits of decode steps
  o.n_ctx = 128;
  o.max_batch_tokens = 32;
  o.max_running = 4;
  o.kv_cache_mb = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = spec_tokens;
  return o;
}

TEST_P(MtpCuda, EngineOutputIsTheSameWithAndWithoutAndOnTheCpu) {
  RILL_REQUIRE_GPU();
  const std::string dir = data_dir(GetParam());
  const auto gold = read_golden(dir);
  ASSERT_TRUE(gold.contains("prompt_ids")) << dir;
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len : {8u, 17u, 24u}) prompts.emplace_back(prompt.begin(), prompt.begin() + static_cast<long>(len));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto off = Engine::load(dir, engine_options(Device::kCuda, "off", 4));
  ASSERT_TRUE(off.ok()) << off.error().message;
  const auto want = test::generate_all(**off, prompts, greedy, false, 1, 20);
  for (const int32_t k : {1, 4}) {
    auto on = Engine::load(dir, engine_options(Device::kCuda, "mtp", k));
    ASSERT_TRUE(on.ok()) << on.error().message;
    EXPECT_EQ((*on)->stats().speculator, "mtp");
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, false, 1, 20), want) << "k = " << k;
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, true, 2, 20), want) << "k = " << k << ", batched";
    const EngineStats st = (*on)->stats();
    std::printf("%s MTP on CUDA, k = %d (random weights): %lld drafted, %lld accepted\n", GetParam().c_str(), k,
                static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_accepted_tokens));
    EXPECT_GT(st.spec_draft_tokens, 0) << "k = " << k;
    EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
  }
  auto cpu = Engine::load(dir, engine_options(Device::kCpu, "mtp", 4));
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ(test::generate_all(**cpu, prompts, greedy, false, 1, 20), want) << "the CPU engine with --spec mtp";
}

INSTANTIATE_TEST_SUITE_P(Families, MtpCuda,
                         ::testing::Values("mtp-glm4-moe", "mtp-deepseek-v3", "mtp-glm-5", "mtp-qwen3-next"),
                         [](const auto& info) {
                           std::string s = info.param.substr(4);
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace rill
