// Gemma 4's assistant (`--spec assistant=PATH`) on CUDA: the Gemma graph's
// assistant_forward on the CUDA Backend, through CudaModelBase's step kinds
// (forward_hidden, forward_mtp), on the tiny f32 pair of
// tests/data/gemma4-assistant (tools/make_gemma4_assistant_golden.py,
// transformers 5.25.0; the assistant's sliding layers read the target's
// window + 1 keys, its head is ordered: 16 centroids of 16 tokens, top 4):
//  - forward_hidden's rows and logits match the CPU model's (1e-3);
//  - the draft logits of steps 1..4 after the prompt match transformers'
//    (1e-4, the CPU test's bound) and the CPU's (1e-4), the fed-back rows
//    the CPU's (1e-3), the drafts are transformers'; three sequences of
//    different lengths in one forward_mtp per step, every row against the
//    CPU's (the ordered head's per-row scratch); steps 2 and later of each
//    batch shape replay CUDA graphs of the MTP kind;
//  - the speculator on the device proposes transformers' drafts, k = 1..4;
//  - an engine on the device gives the same greedy output with the
//    assistant as without it and as transformers, at k = 1..4: one request,
//    six prompts one at a time and batched, and a batch mixing speculating
//    and opted-out rows; the CPU engine with the assistant gives it too.
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
#include "engine/assistant_speculator.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

std::string data_dir() {
  const char* env = std::getenv("RILL_TEST_DATA");
  return std::string(env ? env : RILL_TEST_DATA) + "/gemma4-assistant";
}

nlohmann::json read_golden() {
  std::ifstream in(data_dir() + "/golden.json");
  EXPECT_TRUE(in) << data_dir();
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

std::unique_ptr<Model> load(Device d) {
  auto files = open_model_files(data_dir() + "/target");
  EXPECT_TRUE(files.ok()) << files.error().message;
  if (!files.ok()) return nullptr;
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 64;
  o.max_batch_seqs = 8;
  o.n_kv_slots = 4;  // whole contexts for slot_block_table's slots 0..3
  o.gemma4_assistant = data_dir() + "/assistant";
  auto m = create_model(builtin_registry(), infer_profile(**files), *files, o);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

// Sequences in slots 0, 1, ...: forward_hidden over their prompts (one
// step), then `n_steps` draft steps, each one forward_mtp of every
// sequence's next token at its last prompt position (the first the
// target's greedy token with the prompt's last hidden row, each later one
// the previous step's argmax with its post_projection).
struct DraftRun {
  std::vector<float> hidden, logits;            // forward_hidden's: [sum of prompts, E], [n_seqs, V]
  std::vector<std::vector<float>> step_logits;  // per step: [n_seqs, V]
  std::vector<std::vector<float>> step_out;     // per step: [n_seqs, E]
  std::vector<std::vector<int32_t>> drafts;     // per sequence: its argmax per step
};

void add_row(Batch& b, const Model& m, const int32_t* ids, int32_t len, int32_t pos, bool sample, int32_t decode_from,
             const std::vector<int32_t>& table) {
  const int32_t s = b.add_sequence(ids, len, pos, sample, table);
  b.seqs[static_cast<size_t>(s)].decode_from = decode_from;
  b.group_tables.resize(m.kv_spec().size() - 1);
  for (auto& g : b.group_tables) g.insert(g.end(), table.begin(), table.end());
}

DraftRun run_drafts(Model& m, const std::vector<std::vector<int32_t>>& prompts, int n_steps) {
  DraftRun r;
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  const auto n_seqs = static_cast<int32_t>(prompts.size());
  std::vector<std::vector<int32_t>> tables;
  Batch b;
  int64_t n_tokens = 0;
  for (int32_t i = 0; i < n_seqs; ++i) {
    tables.push_back(slot_block_table(i, m.n_ctx(), m.kv_block_size()));
    const auto& p = prompts[static_cast<size_t>(i)];
    const auto n = static_cast<int32_t>(p.size());
    add_row(b, m, p.data(), n, 0, true, n, tables.back());
    n_tokens += n;
  }
  r.hidden.resize(static_cast<size_t>(n_tokens * E));
  r.logits.resize(static_cast<size_t>(n_seqs * V));
  const Status st = m.forward_hidden(b, r.logits.data(), r.hidden.data());
  EXPECT_TRUE(st.ok()) << st.error().message;
  if (!st.ok()) return r;
  std::vector<int32_t> token(static_cast<size_t>(n_seqs));
  std::vector<float> hidden(static_cast<size_t>(n_seqs * E));
  int64_t end = 0;
  for (int32_t i = 0; i < n_seqs; ++i) {
    const float* row = r.logits.data() + static_cast<size_t>(i) * V;
    token[static_cast<size_t>(i)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    end += static_cast<int64_t>(prompts[static_cast<size_t>(i)].size());
    std::copy_n(r.hidden.begin() + (end - 1) * E, E, hidden.begin() + i * E);
  }
  r.drafts.resize(static_cast<size_t>(n_seqs));
  for (int j = 0; j < n_steps; ++j) {
    Batch d;
    for (int32_t i = 0; i < n_seqs; ++i) {
      const auto n = static_cast<int32_t>(prompts[static_cast<size_t>(i)].size());
      add_row(d, m, &token[static_cast<size_t>(i)], 1, n - 1, true, n, tables[static_cast<size_t>(i)]);
    }
    std::vector<float> logits(static_cast<size_t>(n_seqs * V)), out(static_cast<size_t>(n_seqs * E));
    const Status ms = m.forward_mtp(d, hidden.data(), logits.data(), out.data());
    EXPECT_TRUE(ms.ok()) << ms.error().message;
    if (!ms.ok()) return r;
    for (int32_t i = 0; i < n_seqs; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * V;
      token[static_cast<size_t>(i)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      r.drafts[static_cast<size_t>(i)].push_back(token[static_cast<size_t>(i)]);
    }
    hidden = out;
    r.step_logits.push_back(std::move(logits));
    r.step_out.push_back(std::move(out));
  }
  return r;
}

TEST(Gemma4AssistantCuda, DraftLogitsMatchTransformersAndTheCpu) {
  RILL_REQUIRE_GPU();
  const auto g = read_golden();
  ASSERT_TRUE(g.contains("prompt_ids"));
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = g["draft_logits"];
  const auto want_drafts = g["draft_tokens"].get<std::vector<int32_t>>();
  auto gpu = load(Device::kCuda);
  auto cpu = load(Device::kCpu);
  ASSERT_TRUE(gpu && cpu);
  EXPECT_EQ(gpu->n_mtp_layers(), 4);
  const int64_t V = gpu->n_vocab();
  const auto n_steps = static_cast<int>(want.size());
  // The golden prompt alone (one-token steps: eager, captured, replayed),
  // then with two shorter prefixes beside it (one forward_mtp of 3 rows).
  for (const size_t n_seqs : {size_t{1}, size_t{3}}) {
    std::vector<std::vector<int32_t>> prompts = {prompt};
    if (n_seqs == 3) {
      prompts.emplace_back(prompt.begin(), prompt.begin() + 13);
      prompts.emplace_back(prompt.begin(), prompt.begin() + 5);
    }
    const DraftRun on_gpu = run_drafts(*gpu, prompts, n_steps), on_cpu = run_drafts(*cpu, prompts, n_steps);
    ASSERT_EQ(on_gpu.step_logits.size(), static_cast<size_t>(n_steps));
    ASSERT_EQ(on_cpu.step_logits.size(), static_cast<size_t>(n_steps));
    EXPECT_LT(test::max_abs_diff(on_gpu.hidden, on_cpu.hidden), 1e-3) << "forward_hidden's rows";
    EXPECT_LT(test::max_abs_diff(on_gpu.logits, on_cpu.logits), 1e-3) << "forward_hidden's logits";
    const auto next = static_cast<int32_t>(std::max_element(on_gpu.logits.begin(), on_gpu.logits.begin() + V) -
                                           on_gpu.logits.begin());
    ASSERT_EQ(next, g["next_token"].get<int32_t>());
    double vs_golden = 0, vs_cpu = 0, out_vs_cpu = 0;
    for (int j = 0; j < n_steps; ++j) {
      const auto& got = on_gpu.step_logits[static_cast<size_t>(j)];
      ASSERT_EQ(want[static_cast<size_t>(j)].size(), static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) {
        vs_golden = std::max(vs_golden, std::fabs(double(got[static_cast<size_t>(v)]) -
                                                  want[static_cast<size_t>(j)][static_cast<size_t>(v)].get<double>()));
      }
      vs_cpu = std::max(vs_cpu, test::max_abs_diff(got, on_cpu.step_logits[static_cast<size_t>(j)]));
      out_vs_cpu = std::max(out_vs_cpu, test::max_abs_diff(on_gpu.step_out[static_cast<size_t>(j)],
                                                           on_cpu.step_out[static_cast<size_t>(j)]));
    }
    std::printf(
        "assistant on CUDA, %zu sequence(s), %d steps: max |logit - transformers| = %.3g (row 0), "
        "|logit - CPU| = %.3g, |post_projection - CPU| = %.3g\n",
        n_seqs, n_steps, vs_golden, vs_cpu, out_vs_cpu);
    EXPECT_LT(vs_golden, 1e-4) << n_seqs << " sequence(s)";  // the CPU test's bound (f32 on both sides)
    EXPECT_LT(vs_cpu, 1e-4) << n_seqs << " sequence(s)";
    EXPECT_LT(out_vs_cpu, 1e-3) << n_seqs << " sequence(s)";
    EXPECT_EQ(on_gpu.drafts[0], want_drafts) << n_seqs << " sequence(s)";
    EXPECT_EQ(on_gpu.drafts, on_cpu.drafts) << n_seqs << " sequence(s)";
  }
}

TEST(Gemma4AssistantCuda, ProposesTransformersDrafts) {
  RILL_REQUIRE_GPU();
  const auto g = read_golden();
  ASSERT_TRUE(g.contains("prompt_ids"));
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto chain = g["draft_tokens"].get<std::vector<int32_t>>();
  auto gpu = load(Device::kCuda);
  ASSERT_TRUE(gpu);
  const DraftRun r = run_drafts(*gpu, {prompt}, 0);
  const auto n = static_cast<int32_t>(prompt.size());
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(static_cast<int32_t>(std::max_element(r.logits.begin(), r.logits.end()) - r.logits.begin()));
  const std::vector<int32_t> table = slot_block_table(0, gpu->n_ctx(), gpu->kv_block_size());
  const int32_t own = (n + gpu->kv_block_size() - 1) / gpu->kv_block_size();
  AssistantSpeculator spec(*gpu);
  for (int32_t k = 1; k <= static_cast<int32_t>(chain.size()); ++k) {
    const HiddenRows rows{7,     tokens, 0, n,   r.hidden.data(),
                          table, n,      k, own, std::span<const int32_t>(table).first(static_cast<size_t>(own))};
    spec.observe(std::span<const HiddenRows>(&rows, 1));
    std::vector<int32_t> drafts;
    spec.propose(7, tokens, k, drafts);
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

TEST(Gemma4AssistantCuda, EngineOutputIsTheSameWithAndWithoutAndOnTheCpu) {
  RILL_REQUIRE_GPU();
  const auto g = read_golden();
  ASSERT_TRUE(g.contains("prompt_ids"));
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto golden = g["greedy"].get<std::vector<int32_t>>();
  const std::string dir = data_dir(), spec = "assistant=" + dir + "/assistant";
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto off = Engine::load(dir + "/target", engine_options(Device::kCuda, "off", 4));
  ASSERT_TRUE(off.ok()) << off.error().message;
  const auto prompts = test::prompts_from(prompt);
  const auto want = test::generate_all(**off, prompts, greedy, false, 1, 20);
  const auto alone = test::generate_all(**off, {prompt}, greedy, false, 1, static_cast<int>(golden.size()));
  EXPECT_EQ(alone[0], golden) << "the CUDA engine without the assistant against transformers";
  for (int32_t k = 1; k <= 4; ++k) {
    auto on = Engine::load(dir + "/target", engine_options(Device::kCuda, spec, k));
    ASSERT_TRUE(on.ok()) << on.error().message;
    EXPECT_EQ((*on)->stats().speculator, "assistant");
    EXPECT_EQ(test::generate_all(**on, {prompt}, greedy, false, 1, static_cast<int>(golden.size()))[0], golden)
        << "k = " << k << ", one request";
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, false, 2, 20), want) << "k = " << k;
    EXPECT_EQ(test::generate_all(**on, prompts, greedy, true, 3, 20), want) << "k = " << k << ", batched";
    // Speculating and opted-out rows in the same steps.
    std::vector<RequestHandle> handles;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 20;
      r.ignore_eos = true;
      r.sampling = greedy;
      r.cache_namespace = 4;
      r.speculative = i % 2 == 0;
      auto h = (*on)->submit(std::move(r));
      ASSERT_TRUE(h.ok()) << h.error().message;
      handles.push_back(std::move(h).value());
    }
    std::vector<std::vector<int32_t>> mixed(prompts.size());
    for (size_t i = 0; i < handles.size(); ++i) {
      GenerationEvent ev;
      Usage usage;
      while (handles[i].next(ev)) {
        mixed[i].insert(mixed[i].end(), ev.token_ids.begin(), ev.token_ids.end());
        usage = ev.usage;
      }
      if (i % 2 == 0) {
        EXPECT_GT(usage.draft_tokens, 0) << "k = " << k << ", request " << i;
      } else {
        EXPECT_EQ(usage.draft_tokens, 0) << "k = " << k << ", request " << i;
      }
    }
    EXPECT_EQ(mixed, want) << "k = " << k << ", mixed batch";
    const EngineStats st = (*on)->stats();
    std::printf("assistant on CUDA, k = %d (random weights): %lld drafted, %lld accepted\n", k,
                static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_accepted_tokens));
    EXPECT_GT(st.spec_draft_tokens, 0) << "k = " << k;
    EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
  }
  auto cpu = Engine::load(dir + "/target", engine_options(Device::kCpu, spec, 4));
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ(test::generate_all(**cpu, prompts, greedy, false, 1, 20), want) << "the CPU engine with the assistant";
}

}  // namespace
}  // namespace rill
