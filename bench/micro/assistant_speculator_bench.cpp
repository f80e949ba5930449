// What drafting with Gemma 4's assistant (`--spec assistant=PATH`,
// engine/assistant_speculator.h) costs next to a target decode step. Each
// iteration is one decode step of `rows` sequences: BM_target_step runs the
// target over one token per row with its hidden states
// (Model::forward_hidden, what a speculating step computes);
// BM_assistant_observe runs that step and then AssistantSpeculator::observe
// with k drafts per row (k one-token assistant passes of all rows
// together, each reading the target's KV). observe's cost is the
// difference. Args: {k, rows, pair}: pair 0 is the tiny random pair of
// tests/data/gemma4-assistant (tools/make_gemma4_assistant_golden.py), 1
// the target and assistant directories RILL_BENCH_GEMMA4_TARGET and
// RILL_BENCH_GEMMA4_ASSISTANT name (e.g. the tool's --medium pair). A model
// is loaded once per pair (for the largest row count) and shared by the
// runs: each run starts its rows at position 0. RILL_BENCH_THREADS sets the
// CPU threads (default 2); with 1 every op runs on the benchmark's thread,
// so its CPU time is the whole work, which a loaded machine does not blur.
// RILL_BENCH_DEVICE=cuda runs the pair on the GPU (the CUDA Gemma runtime's
// step kinds; wall time is then the figure).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/assistant_speculator.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"

namespace rill {
namespace {

constexpr int32_t kPrompt = 24;
constexpr int32_t kMaxRows = 8;

// The pair's (target, assistant) directories; empty when not given.
std::pair<std::string, std::string> pair_dirs(int pair) {
  if (pair == 1) {
    const char* t = std::getenv("RILL_BENCH_GEMMA4_TARGET");
    const char* a = std::getenv("RILL_BENCH_GEMMA4_ASSISTANT");
    return {t ? t : "", a ? a : ""};
  }
  const std::string dir = std::string(RILL_BENCH_SOURCE_DIR) + "/tests/data/gemma4-assistant";
  return {dir + "/target", dir + "/assistant"};
}

Device bench_device() {
  const char* env = std::getenv("RILL_BENCH_DEVICE");
  return env && std::string(env) == "cuda" ? Device::kCuda : Device::kCpu;
}

// The target with its assistant bound, loaded at the first call.
Result<Model*> model_for(int pair) {
  static std::map<int, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[pair];
  if (m) return m.get();
  const auto [target, assistant] = pair_dirs(pair);
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(target));
  ModelOptions mo;
  mo.device = bench_device();
  const char* threads = std::getenv("RILL_BENCH_THREADS");
  mo.n_threads = threads ? std::atoi(threads) : 2;
  mo.n_ctx = 512;
  mo.max_batch_tokens = std::max(64, kMaxRows * kPrompt);
  mo.max_batch_seqs = kMaxRows;
  mo.n_kv_slots = kMaxRows;  // one whole context per row (slot_block_table)
  mo.gemma4_assistant = assistant;
  RILL_ASSIGN_OR_RETURN(m, create_model(builtin_registry(), infer_profile(*files), files, mo));
  return m.get();
}

void run(benchmark::State& state, int pair, bool draft) {
  const auto k = static_cast<int32_t>(state.range(0));
  const auto rows = static_cast<int32_t>(state.range(1));
  auto model = model_for(pair);
  if (!model.ok()) return state.SkipWithError(model.error().message.c_str());
  Model& m = **model;
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  const auto n_groups = m.kv_spec().size();
  std::vector<std::vector<int32_t>> tables, tokens(static_cast<size_t>(rows));
  for (int32_t i = 0; i < rows; ++i) {
    tables.push_back(slot_block_table(i, m.n_ctx(), m.kv_block_size()));
    for (int32_t j = 0; j < kPrompt; ++j)
      tokens[static_cast<size_t>(i)].push_back(static_cast<int32_t>((7 + 13 * i + 29 * j) % (V - 3) + 3));
  }
  std::vector<float> logits(static_cast<size_t>(rows * V)), hidden(static_cast<size_t>(m.max_batch_tokens() * E));
  std::vector<std::vector<int32_t>> other_groups(static_cast<size_t>(rows));
  AssistantSpeculator spec(m);
  std::vector<HiddenRows> seen;
  Batch b;
  b.group_tables.resize(n_groups - 1);
  // One target step over each row's uncomputed tokens; then, with `draft`,
  // observe over its last position.
  auto step = [&](bool prompt, bool observe) {
    b.clear();
    std::vector<int32_t> first(static_cast<size_t>(rows));
    for (int32_t i = 0; i < rows; ++i) {
      const std::vector<int32_t>& t = tokens[static_cast<size_t>(i)];
      const int32_t n_done = prompt ? 0 : static_cast<int32_t>(t.size()) - 1;
      first[static_cast<size_t>(i)] = n_done;
      const int32_t s = b.add_sequence(t.data() + n_done, static_cast<int32_t>(t.size()) - n_done, n_done, true,
                                       tables[static_cast<size_t>(i)]);
      b.seqs[static_cast<size_t>(s)].decode_from = kPrompt;
      for (auto& g : b.group_tables)
        g.insert(g.end(), tables[static_cast<size_t>(i)].begin(), tables[static_cast<size_t>(i)].end());
    }
    if (!m.forward_hidden(b, logits.data(), hidden.data()).ok()) return false;
    seen.clear();
    for (int32_t i = 0; i < rows; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * V;
      std::vector<int32_t>& t = tokens[static_cast<size_t>(i)];
      t.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
      const BatchSeq& s = b.seqs[static_cast<size_t>(i)];
      const std::vector<int32_t>& table = tables[static_cast<size_t>(i)];
      std::vector<int32_t>& others = other_groups[static_cast<size_t>(i)];
      others.clear();
      for (size_t g = 1; g < n_groups; ++g) others.insert(others.end(), table.begin(), table.end());
      seen.push_back(HiddenRows{static_cast<uint64_t>(i), t, first[static_cast<size_t>(i)], s.q_len,
                                hidden.data() + static_cast<size_t>(s.q_start) * E, table, kPrompt, k,
                                static_cast<int32_t>(table.size()), others});
    }
    if (observe) spec.observe(seen);
    return true;
  };
  if (!step(true, true)) return state.SkipWithError("the prompt step failed");
  for (auto _ : state) {
    if (!step(false, draft)) return state.SkipWithError("a decode step failed");
  }
  state.counters["k"] = k;
  state.counters["rows"] = rows;
}

void BM_target_step(benchmark::State& state) {
  run(state, static_cast<int>(state.range(2)), false);
}
void BM_assistant_observe(benchmark::State& state) {
  run(state, static_cast<int>(state.range(2)), true);
}

void args(benchmark::internal::Benchmark* b, bool all_k) {
  const int n_pairs = std::getenv("RILL_BENCH_GEMMA4_TARGET") ? 2 : 1;
  for (int p = 0; p < n_pairs; ++p)
    for (int rows : {1, 8})
      for (int k = 1; k <= (all_k ? 4 : 1); ++k) b->Args({k, rows, p});
}

BENCHMARK(BM_target_step)->Apply([](auto* b) { args(b, false); }) -> Iterations(200) -> Unit(benchmark::kMicrosecond);
BENCHMARK(BM_assistant_observe)
    ->Apply([](auto* b) { args(b, true); }) -> Iterations(200) -> Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rill
