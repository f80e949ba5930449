// What verifying the disk tier costs: XXH3 over a run's bytes (checked on
// every load) against the copy a restore makes anyway (memcpy, the ceiling
// of copy_kv_in on the CPU), on a run the size of a 3,840-token prompt of
// the default model (30 layers x K,V x 192 f16 = 23 KiB per token, 88 MiB),
// and the model fingerprint (every weight byte) on the default model.
// Prints bytes/s; compare the two first rows.
#include <benchmark/benchmark.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "core/hash.h"
#include "loader/model_files.h"
#include "model/fingerprint.h"

namespace {

constexpr size_t kRunBytes = size_t{3840} * 30 * 2 * 192 * 2;

std::vector<uint8_t>& source() {
  static std::vector<uint8_t> buf = [] {
    std::vector<uint8_t> b(kRunBytes);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 131 + 7);
    return b;
  }();
  return buf;
}

void BM_Xxh3RunBytes(benchmark::State& state) {
  const auto& src = source();
  for (auto _ : state) benchmark::DoNotOptimize(rill::hash64(src.data(), src.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(src.size()));
}
BENCHMARK(BM_Xxh3RunBytes)->Unit(benchmark::kMillisecond);

void BM_MemcpyRunBytes(benchmark::State& state) {
  const auto& src = source();
  std::vector<uint8_t> dst(src.size(), 1);  // faulted in: the device cache is resident
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(src.size()));
}
BENCHMARK(BM_MemcpyRunBytes)->Unit(benchmark::kMillisecond);

void BM_ArtifactFingerprintDefaultModel(benchmark::State& state) {
  const std::string path = std::string(RILL_BENCH_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("default model missing");
    return;
  }
  auto files = rill::open_model_files(path);
  if (!files.ok()) {
    state.SkipWithError(files.error().message.c_str());
    return;
  }
  size_t bytes = 0;
  for (const auto& [name, t] : (*files)->tensors) bytes += t.n_bytes;
  const auto n_threads = static_cast<unsigned>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(rill::artifact_fingerprint(**files, n_threads));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_ArtifactFingerprintDefaultModel)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
