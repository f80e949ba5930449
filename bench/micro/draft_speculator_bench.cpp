// Draft time per engine step of the draft-model speculator: the default
// model drafting for itself, k = 4 drafts for each of n rows (decoding
// requests with different prompts), every draft accepted plus a bonus token
// per step (what the engine feeds back when a draft holds throughout). The
// _per_row variant drafts the rows one after another (k forwards per row,
// the speculator before batching); _batched drafts them together
// (engine/draft_speculator.h: k forwards per step). One iteration is one
// step. Args: {n_rows}.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/speculator.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

constexpr int32_t kDrafts = 4;
const std::string kModel = std::string(RILL_BENCH_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

void run(benchmark::State& state, bool batched) {
  if (!std::filesystem::exists(kModel)) return state.SkipWithError("default model not found (scripts/setup.sh)");
  const auto n_rows = static_cast<size_t>(state.range(0));
  auto files = open_model_files(kModel);
  if (!files.ok()) return state.SkipWithError(files.error().message.c_str());
  ModelOptions mo;
  mo.n_threads = 2;
  mo.n_ctx = 1024;
  auto target = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  if (!target.ok()) return state.SkipWithError(target.error().message.c_str());
  SpeculatorTarget t;
  t.model = target->get();
  t.model_path = kModel;
  t.options.n_threads = 2;
  t.options.max_batch_tokens = 256;
  t.options.max_running = static_cast<int>(n_rows);
  t.options.kv_cache_mb = 64;
  auto spec = make_speculator("draft=" + kModel, t);
  if (!spec.ok()) return state.SkipWithError(spec.error().message.c_str());
  Speculator& s = **spec;

  std::vector<std::vector<int32_t>> seqs(n_rows);
  for (size_t i = 0; i < n_rows; ++i)
    for (int32_t j = 0; j < 32; ++j) seqs[i].push_back(static_cast<int32_t>(100 + 37 * i + 11 * j));
  std::vector<DraftRequest> reqs(n_rows);
  std::vector<int32_t> out;
  auto step = [&] {
    for (size_t i = 0; i < n_rows; ++i) reqs[i] = DraftRequest{i, seqs[i], kDrafts, 0};
    out.clear();
    if (batched) {
      s.propose_batch(reqs, out);
    } else {
      for (DraftRequest& r : reqs) s.propose_batch(std::span<DraftRequest>(&r, 1), out);
    }
    size_t at = 0;
    for (size_t i = 0; i < n_rows; ++i) {
      seqs[i].insert(seqs[i].end(), out.begin() + static_cast<ptrdiff_t>(at),
                     out.begin() + static_cast<ptrdiff_t>(at) + reqs[i].n_drafts);
      seqs[i].push_back(seqs[i].back());  // the bonus token
      at += static_cast<size_t>(reqs[i].n_drafts);
    }
  };
  step();  // the prompts' catch-up is not a decode step
  for (auto _ : state) step();
  state.counters["rows"] = static_cast<double>(n_rows);
  state.counters["draft_forwards_per_step"] = batched ? kDrafts : static_cast<double>(kDrafts * n_rows);
}

void BM_draft_step_per_row(benchmark::State& state) {
  run(state, false);
}
void BM_draft_step_batched(benchmark::State& state) {
  run(state, true);
}

BENCHMARK(BM_draft_step_per_row)->Arg(1)->Arg(4)->Arg(8)->Iterations(24)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_draft_step_batched)->Arg(1)->Arg(4)->Arg(8)->Iterations(24)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rill
