// Attention over an f16 KV cache on the default model's shapes (9 query
// heads, 3 KV heads, head_dim 64): a 512-token prefill and one decode token
// at 512 keys. GFLOP/s counts 4 * head_dim flops per visible (query, key,
// head) triple (q.k and p.v). Args: {n_threads}.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/cpu_features.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

void run(benchmark::State& state, int64_t n_q, int64_t n_kv) {
  static ThreadPool pool2(2), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  AttentionParams p;
  p.n_head = 9;
  p.n_head_kv = 3;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(n_q * 9 * 64), out(q.size());
  std::vector<uint16_t> k(n_kv * 3 * 64), v(k.size());
  for (auto& x : q) x = u(rng);
  for (auto& x : k) x = f32_to_f16(u(rng));
  for (auto& x : v) x = f32_to_f16(u(rng));
  std::vector<int32_t> pos(n_q);
  for (int64_t i = 0; i < n_q; ++i) pos[i] = static_cast<int32_t>(n_kv - n_q + i);
  double visible = 0;
  for (int32_t ps : pos) visible += ps + 1;
  for (auto _ : state) {
    attention_f16_rounded(q.data(), pos.data(), n_q, k.data(), v.data(), n_kv, p, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(visible * 9 * 4 * 64 * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(isa_name(best_isa()));
}

void BM_attention_prefill_512(benchmark::State& s) { run(s, 512, 512); }
void BM_attention_decode_at_512(benchmark::State& s) { run(s, 1, 512); }
BENCHMARK(BM_attention_prefill_512)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_decode_at_512)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rill::cpu
