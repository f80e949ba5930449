// The compute ceilings that prefill is measured against: int8 dot-product
// throughput of this CPU (AVX-512 VNNI vpdpbusd, else AVX2 maddubs+madd)
// and f32 FMA throughput on 512-bit registers (the f16 KV attention
// kernels' arithmetic), with 1 and 2 threads, on independent register
// accumulators (no memory). One vpdpbusd on 512-bit registers is 64 int8
// multiply-adds = 128 ops; one 512-bit FMA is 16 multiply-adds = 32 flops.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kIters = 1 << 22;

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t vnni_loop() {
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  __m512i acc[10];
  for (auto& x : acc) x = _mm512_setzero_si512();
  for (int64_t i = 0; i < kIters; ++i) {
    for (auto& x : acc) x = _mm512_dpbusd_epi32(x, a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512i s = acc[0];
  for (int k = 1; k < 10; ++k) s = _mm512_add_epi32(s, acc[k]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  int64_t sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}
constexpr double kVnniOpsPerIter = 10 * 64 * 2;

__attribute__((target("avx2"))) int64_t avx2_loop() {
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  __m256i acc[8];
  for (auto& x : acc) x = _mm256_setzero_si256();
  for (int64_t i = 0; i < kIters; ++i) {
    for (auto& x : acc) x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
    __asm__ volatile("" : "+x"(a));
  }
  __m256i s = acc[0];
  for (int k = 1; k < 8; ++k) s = _mm256_add_epi32(s, acc[k]);
  return _mm256_extract_epi32(s, 0);
}
constexpr double kAvx2OpsPerIter = 8 * 32 * 2;

__attribute__((target("avx512f"))) int64_t fma_loop() {
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.999999f);
  __m512 acc[12];
  for (auto& x : acc) x = _mm512_setzero_ps();
  for (int64_t i = 0; i < kIters; ++i) {
    for (auto& x : acc) x = _mm512_fmadd_ps(a, b, x);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return static_cast<int64_t>(lanes[0]);
}
constexpr double kFmaFlopsPerIter = 12 * 16 * 2;

constexpr char kInt8Gops[] = "int8_GOP/s";
template <int64_t (*Loop)(), const double* OpsPerIter, const char* kCounter = kInt8Gops>
void run(benchmark::State& state) {
  const int n_threads = static_cast<int>(state.range(0));
  std::atomic<int64_t> sink{0};
  for (auto _ : state) {
    std::vector<std::thread> ts;
    for (int t = 0; t < n_threads; ++t) ts.emplace_back([&] { sink += Loop(); });
    for (auto& t : ts) t.join();
  }
  benchmark::DoNotOptimize(sink.load());
  state.counters[kCounter] =
      benchmark::Counter(*OpsPerIter * kIters * n_threads * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

constexpr double kVnni = kVnniOpsPerIter, kAvx2 = kAvx2OpsPerIter, kFma = kFmaFlopsPerIter;
constexpr char kGflops[] = "f32_GFLOP/s";
void BM_Int8PeakVnni(benchmark::State& s) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    s.SkipWithError("no AVX-512 VNNI");
    return;
  }
  run<vnni_loop, &kVnni>(s);
}
void BM_Int8PeakAvx2(benchmark::State& s) {
  run<avx2_loop, &kAvx2>(s);
}

void BM_F32PeakAvx512Fma(benchmark::State& s) {
  if (!__builtin_cpu_supports("avx512f")) {
    s.SkipWithError("no AVX-512");
    return;
  }
  run<fma_loop, &kFma, kGflops>(s);
}

BENCHMARK(BM_Int8PeakVnni)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Int8PeakAvx2)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_F32PeakAvx512Fma)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
