// What drafting with a checkpoint's MTP layer costs next to a target decode
// step, on the tiny MTP checkpoints of tests/data (tools/make_mtp_golden.py:
// DeepSeek-V3 MLA, GLM-4.5 glm4_moe, Qwen3-Next hybrid; random MTP weights,
// so only the mechanism's cost means anything, not acceptance). Each
// iteration is one decode step of `rows` sequences: BM_target_step runs the
// target over one token per row with its hidden states
// (Model::forward_hidden, what a `--spec mtp` engine step computes);
// BM_mtp_observe runs that step and then MtpSpeculator::observe with k
// drafts per row (the MTP layer over the kept position, then k - 1 chained
// one-token forwards of all rows together). observe's cost is the
// difference. Args: {k, rows, checkpoint}; checkpoint 0 / 1 / 2 as above,
// 3 the directory RILL_BENCH_MTP_MODEL names (any checkpoint with an MTP
// layer, e.g. a full-size one with random weights). RILL_BENCH_DEVICE=cuda
// runs every model on the GPU (the CUDA runtimes' MTP step kinds). A model
// is loaded once per checkpoint (for the largest row count) and shared by
// the runs: each run starts its rows at position 0.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/mtp_speculator.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"

namespace rill {
namespace {

const char* const kCheckpoints[] = {"mtp-deepseek-v3", "mtp-glm4-moe", "mtp-qwen3-next"};
constexpr int32_t kPrompt = 24;
constexpr int32_t kMaxRows = 8;

std::string checkpoint_dir(int checkpoint) {
  if (checkpoint == 3) {
    const char* env = std::getenv("RILL_BENCH_MTP_MODEL");
    return env ? env : "";
  }
  return std::string(RILL_BENCH_SOURCE_DIR) + "/tests/data/" + kCheckpoints[checkpoint];
}

Device bench_device() {
  const char* env = std::getenv("RILL_BENCH_DEVICE");
  return env && std::string(env) == "cuda" ? Device::kCuda : Device::kCpu;
}

// The checkpoint's model with its MTP layer, loaded at the first call.
Result<Model*> model_for(int checkpoint) {
  static std::map<int, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[checkpoint];
  if (m) return m.get();
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(checkpoint_dir(checkpoint)));
  ModelOptions mo;
  mo.device = bench_device();
  mo.n_threads = 2;
  mo.n_ctx = 512;
  mo.max_batch_tokens = std::max(64, kMaxRows * kPrompt);
  mo.max_batch_seqs = kMaxRows;
  mo.n_kv_slots = kMaxRows;  // one whole context per row (slot_block_table)
  mo.mtp = true;
  RILL_ASSIGN_OR_RETURN(m, create_model(builtin_registry(), infer_profile(*files), files, mo));
  return m.get();
}

void run(benchmark::State& state, int checkpoint, bool draft) {
  const auto k = static_cast<int32_t>(state.range(0));
  const auto rows = static_cast<int32_t>(state.range(1));
  auto model = model_for(checkpoint);
  if (!model.ok()) return state.SkipWithError(model.error().message.c_str());
  Model& m = **model;
  const KvSpec& groups = m.kv_spec();
  const bool hybrid =
      std::any_of(groups.begin(), groups.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  std::vector<std::vector<int32_t>> tables, tokens(static_cast<size_t>(rows));
  for (int32_t i = 0; i < rows; ++i) {
    tables.push_back(slot_block_table(i, m.n_ctx(), m.kv_block_size()));
    for (int32_t j = 0; j < kPrompt; ++j) tokens[static_cast<size_t>(i)].push_back((7 + 13 * i + 29 * j) % 500);
  }
  std::vector<float> logits(static_cast<size_t>(rows * V)), hidden(static_cast<size_t>(m.max_batch_tokens() * E));
  MtpSpeculator spec(m);
  std::vector<HiddenRows> seen;
  Batch b;
  b.group_tables.resize(groups.size() - 1);
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
      if (hybrid) b.seqs[static_cast<size_t>(s)].state_slot = i;
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
      seen.push_back(HiddenRows{static_cast<uint64_t>(i),
                                t,
                                first[static_cast<size_t>(i)],
                                s.q_len,
                                hidden.data() + static_cast<size_t>(s.q_start) * E,
                                tables[static_cast<size_t>(i)],
                                kPrompt,
                                k,
                                0,
                                {}});
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
void BM_mtp_observe(benchmark::State& state) {
  run(state, static_cast<int>(state.range(2)), true);
}

void args(benchmark::internal::Benchmark* b, bool all_k) {
  const int n_checkpoints = std::getenv("RILL_BENCH_MTP_MODEL") ? 4 : 3;
  for (int c = 0; c < n_checkpoints; ++c)
    for (int rows : {1, 8})
      for (int k = 1; k <= (all_k ? 4 : 1); ++k) b->Args({k, rows, c});
}

BENCHMARK(BM_target_step)->Apply([](auto* b) { args(b, false); }) -> Iterations(200) -> Unit(benchmark::kMicrosecond);
BENCHMARK(BM_mtp_observe)->Apply([](auto* b) { args(b, true); }) -> Iterations(200) -> Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rill
