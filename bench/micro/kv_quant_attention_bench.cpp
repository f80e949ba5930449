// Decode attention over each KV cache type (model/kv_types.h) on the default
// model's shapes (9 query heads, 3 KV heads, head_dim 64, 30 layers): one
// query at 1k / 4k / 8k keys per layer, cycling through 30 layers' paged
// pools so K/V come from memory as in serving (8k: 30 x 8k x 384 B = 94 MB
// of f16 KV). f16 runs the llama.cpp-rounded kernel (attention_f16.h); every
// other type attention_quant.h. The counters give the attention time of one
// decode token across all 30 layers ("ms/token") and the KV bytes it reads
// per second ("GB/s", against the machine's DRAM bandwidth: bench_peak).
// Args: {n_kv, type index (kTypes)}.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"

namespace rill::cpu {
namespace {

struct Type {
  const char* name;
  DType dtype;
  bool rotated;
};
constexpr Type kTypes[] = {{"f16", DType::kF16, false},   {"bf16", DType::kBF16, false}, {"q8_0", DType::kQ8_0, false},
                           {"q5_1", DType::kQ5_1, false}, {"q5_0", DType::kQ5_0, false}, {"q4_1", DType::kQ4_1, false},
                           {"q4_0", DType::kQ4_0, false}, {"q4_0h", DType::kQ4_0, true}, {"q8_0h", DType::kQ8_0, true},
                           {"q8_0h64", kKvQ8_0x64, true}};
constexpr int kLayers = 30;

void BM_kv_decode(benchmark::State& state) {
  static ThreadPool pool(2);
  const int64_t n_kv = state.range(0);
  const Type t = kTypes[state.range(1)];
  const int64_t width = 3 * 64;
  AttentionParams p;
  p.n_head = 9;
  p.n_head_kv = 3;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.kv_dtype = t.dtype;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const size_t row_b = row_bytes(t.dtype, width);
  const int64_t n_blocks = (n_kv + 15) / 16;
  std::vector<std::vector<uint8_t>> pools(kLayers);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> row(static_cast<size_t>(width));
  for (auto& pl : pools) {
    pl.resize(static_cast<size_t>(n_blocks) * 32 * row_b);  // per block: 16 K rows, then 16 V rows
    for (int64_t j = 0; j < n_blocks * 32; ++j) {
      for (float& x : row) x = nd(rng);
      store_kv_row(t.dtype, t.rotated, row.data(), pl.data() + static_cast<size_t>(j) * row_b, 3, 64);
    }
  }
  std::vector<float> q(9 * 64), out(q.size());
  for (float& x : q) x = nd(rng);
  const int32_t pos = static_cast<int32_t>(n_kv - 1);
  int layer = 0;
  for (auto _ : state) {
    AttentionSeq s;
    s.q = q.data();
    s.q_pos = &pos;
    s.n_q = 1;
    s.kv.k = pools[static_cast<size_t>(layer)].data();
    s.kv.v = s.kv.k + 16 * row_b;
    s.kv.table = table.data();
    s.kv.block_shift = 4;
    s.kv.block_bytes = 32 * row_b;
    s.kv.row_bytes = row_b;
    s.n_kv = n_kv;
    s.out = out.data();
    s.decode_from = 0;
    if (t.dtype == DType::kF16 && !t.rotated) {
      attention_f16_rounded_batch(&s, 1, p, pool);
    } else {
      attention_quant_batch(&s, 1, p, {t.dtype, t.dtype, t.rotated, t.rotated}, pool);
    }
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  // Inverted rate: seconds / (iterations * value) = ms of 30 layers per token.
  state.counters["ms/token"] = benchmark::Counter(
      1.0 / (kLayers * 1e3), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(2 * row_b * n_kv) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(t.name) + " " + isa_name(best_isa()));
}
BENCHMARK(BM_kv_decode)
    ->ArgsProduct({{1024, 4096, 8192}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace rill::cpu
