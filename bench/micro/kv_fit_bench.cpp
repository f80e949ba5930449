// The rotated KV encoder's candidate errors (backend/cpu/kv_fit.h): one
// 34-candidate grid of a Gaussian block, per kernel the CPU has, uniform
// (q8_0h's -127..127) and iq4_nl levels, blocks of 32 and 64.
//   bench_kv_fit_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_fit.h"
#include "core/half.h"

namespace {

using rill::cpu::detail::FitLevels;
using FitErrors = void (*)(const float*, int, const float*, int, FitLevels, double*);

// Args: block size, levels (0: -127..127, 1: iq4_nl).
void run(benchmark::State& state, FitErrors fn, bool available) {
  if (!available) {
    state.SkipWithError("this CPU lacks the kernel's ISA");
    return;
  }
  const int n = static_cast<int>(state.range(0));
  const FitLevels lv = state.range(1) ? FitLevels{true, 0, 15} : FitLevels{false, -127, 127};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n) * 64);
  for (float& v : x) v = nd(rng);
  std::vector<float> d(34);
  for (int c = 0; c < 34; ++c) d[static_cast<size_t>(c)] = rill::f16_to_f32(rill::f32_to_f16(0.02f + 0.0004f * c));
  double err[34];
  size_t b = 0;
  for (auto _ : state) {
    fn(x.data() + b * static_cast<size_t>(n), n, d.data(), 34, lv, err);
    benchmark::DoNotOptimize(err);
    b = (b + 1) % 64;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_fit_errors_ref(benchmark::State& s) {
  run(s, rill::cpu::detail::fit_errors_ref, true);
}
void BM_fit_errors_avx2(benchmark::State& s) {
  run(s, rill::cpu::detail::fit_errors_avx2, rill::cpu::cpu_features().avx2);
}
void BM_fit_errors_avx512(benchmark::State& s) {
  run(s, rill::cpu::detail::fit_errors_avx512, rill::cpu::cpu_features().avx512);
}

}  // namespace

BENCHMARK(BM_fit_errors_ref)->ArgsProduct({{32, 64}, {0, 1}});
BENCHMARK(BM_fit_errors_avx2)->ArgsProduct({{32, 64}, {0, 1}});
BENCHMARK(BM_fit_errors_avx512)->ArgsProduct({{32, 64}, {0, 1}});
