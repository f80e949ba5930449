// CPU matmul on the default model's shapes (SmolLM2-135M: Q4_1 weights,
// Q8_0 tied LM head), decode (1 token) and prefill (512 tokens), 2 threads.
// Counters: weight GB/s (weight bytes read per call / time) and GFLOP/s
// (2 * rows * cols * tokens / time). The ceiling for decode is the memory
// read bandwidth that BM_ReadBandwidth measures on the same run.
// Runs the best kernel table of this CPU (cpu::best_isa(), in each label).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

constexpr int kThreads = 2;

std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> buf(row_bytes(t, cols) * rows);
  std::mt19937 rng(1);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const int bb = dtype_info(t).block_bytes;
  const uint16_t d = f32_to_f16(0.01f);
  for (size_t i = 0; i < buf.size(); i += bb) {
    std::memcpy(&buf[i], &d, 2);
    if (t == DType::kQ4_1 || t == DType::kQ4_K || t == DType::kQ5_K) std::memcpy(&buf[i + 2], &d, 2);
    if (t == DType::kQ6_K) std::memcpy(&buf[i + bb - 2], &d, 2);  // Q6_K's d is its last field
  }
  return buf;
}

void run_matmul(benchmark::State& state, DType t, int64_t rows, int64_t cols) {
  const int64_t n_tokens = state.range(0);
  const int n_threads = state.range(1) > 0 ? static_cast<int>(state.range(1)) : kThreads;
  static ThreadPool pool2(kThreads), pool1(1);
  ThreadPool& pool = n_threads == 1 ? pool1 : pool2;
  const auto w = random_weights(t, rows, cols);
  WeightView view{t, rows, cols, w.data(), row_bytes(t, cols)};
  std::vector<float> x(cols * n_tokens), y(rows * n_tokens);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(t, cols, n_tokens));
  for (auto _ : state) {
    matmul(view, x.data(), n_tokens, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(w.size()) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * rows * cols * n_tokens * iters / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(isa_name(best_isa())) + " " + std::string(dtype_name(t)) + " [" + std::to_string(rows) +
                 "x" + std::to_string(cols) + "]");
}

void BM_Q4_1_ffn_up_1536x576(benchmark::State& s) {
  run_matmul(s, DType::kQ4_1, 1536, 576);
}
void BM_Q4_1_attn_576x576(benchmark::State& s) {
  run_matmul(s, DType::kQ4_1, 576, 576);
}
void BM_Q4_1_ffn_down_576x1536(benchmark::State& s) {
  run_matmul(s, DType::kQ4_1, 576, 1536);
}
void BM_Q8_0_lm_head_49152x576(benchmark::State& s) {
  run_matmul(s, DType::kQ8_0, 49152, 576);
}
// Larger than the L3 cache (32 MiB): weights stream from DRAM every call.
void BM_Q4_1_cold_180000x576(benchmark::State& s) {
  run_matmul(s, DType::kQ4_1, 180000, 576);
}
void BM_Q8_0_cold_98304x576(benchmark::State& s) {
  run_matmul(s, DType::kQ8_0, 98304, 576);
}
BENCHMARK(BM_Q4_1_cold_180000x576)->Args({1, 1})->Args({1, 2})->UseRealTime();
BENCHMARK(BM_Q8_0_cold_98304x576)->Args({1, 1})->Args({1, 2})->UseRealTime();

// Args: {n_tokens, n_threads}. The 1-thread runs isolate kernel speed when
// the machine is shared.
BENCHMARK(BM_Q4_1_ffn_up_1536x576)->Args({1, 2})->Args({512, 2})->Args({1, 1})->Args({512, 1})->UseRealTime();
BENCHMARK(BM_Q4_1_attn_576x576)->Args({1, 2})->Args({512, 2})->UseRealTime();
BENCHMARK(BM_Q4_1_ffn_down_576x1536)->Args({1, 2})->Args({512, 2})->UseRealTime();
BENCHMARK(BM_Q8_0_lm_head_49152x576)->Args({1, 2})->Args({64, 2})->Args({1, 1})->UseRealTime();

// Batched decode (continuous batching: 2..16 streams) and a short prefill,
// 1 thread so the kernel is measured even when the machine is shared.
void batch_args(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 3, 4, 8, 16, 64}) b->Args({t, 1});
}
BENCHMARK(BM_Q4_1_ffn_up_1536x576)->Name("BM_Q4_1_batch_1536x576")->Apply(batch_args)->UseRealTime();
BENCHMARK(BM_Q4_1_ffn_down_576x1536)->Name("BM_Q4_1_batch_576x1536")->Apply(batch_args)->UseRealTime();
BENCHMARK(BM_Q8_0_lm_head_49152x576)->Name("BM_Q8_0_batch_49152x576")->Apply(batch_args)->UseRealTime();

// The Llama-3.2-1B shapes of the K-quant bench models (bench/make_bench_model.py):
// a 2048 x 2048 projection and the 2048 x 8192 FFN down, weights in L2/L3,
// 1 thread so the kernel is measured even when the machine is shared.
// Args: {n_tokens, n_threads}.
void kquant_args(benchmark::internal::Benchmark* b) {
  for (int t : {1, 4, 8, 16, 32, 64}) b->Args({t, 1});
}
void BM_Q4_K_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kQ4_K, 2048, 2048);
}
void BM_Q5_K_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kQ5_K, 2048, 2048);
}
void BM_Q6_K_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kQ6_K, 2048, 2048);
}
void BM_Q8_0_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kQ8_0, 2048, 2048);
}
void BM_Q4_K_down_2048x8192(benchmark::State& s) {
  run_matmul(s, DType::kQ4_K, 2048, 8192);
}
void BM_Q6_K_down_2048x8192(benchmark::State& s) {
  run_matmul(s, DType::kQ6_K, 2048, 8192);
}
void BM_IQ4_XS_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kIQ4_XS, 2048, 2048);
}
void BM_IQ4_NL_2048x2048(benchmark::State& s) {
  run_matmul(s, DType::kIQ4_NL, 2048, 2048);
}
void BM_IQ4_XS_down_2048x8192(benchmark::State& s) {
  run_matmul(s, DType::kIQ4_XS, 2048, 8192);
}
BENCHMARK(BM_Q4_K_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_Q5_K_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_Q6_K_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_Q8_0_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_Q4_K_down_2048x8192)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_Q6_K_down_2048x8192)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_IQ4_XS_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_IQ4_NL_2048x2048)->Apply(kquant_args)->UseRealTime();
BENCHMARK(BM_IQ4_XS_down_2048x8192)->Apply(kquant_args)->UseRealTime();
// A whole 512-token prefill step of one projection, 1 and 2 threads (do 2
// threads double the GFLOP/s of one?).
BENCHMARK(BM_Q6_K_2048x2048)->Args({512, 1})->Args({512, 2})->UseRealTime();
BENCHMARK(BM_Q4_K_2048x2048)->Args({512, 1})->Args({512, 2})->UseRealTime();
BENCHMARK(BM_Q5_K_2048x2048)->Args({512, 1})->UseRealTime();
BENCHMARK(BM_IQ4_XS_2048x2048)->Args({512, 1})->UseRealTime();

// One decode token's matmuls of the whole model with distinct weights per
// layer (30 x {q, k, v, o, gate, up, down} Q4_1 + the Q8_0 LM head, ~96 MB),
// so weights stream from DRAM as in real decode, unlike the hot-cache
// single-matrix runs above. Compare weight_GB/s with BM_ReadBandwidth.
// Args: {n_threads, n_tokens} (n_tokens > 1: one step of batched decode).
void BM_decode_token_all_layers(benchmark::State& state) {
  static ThreadPool pool2(kThreads), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  const int64_t n_tokens = state.range(1) > 0 ? state.range(1) : 1;
  struct Mat {
    DType t;
    int64_t rows, cols;
  };
  const Mat layer[] = {{DType::kQ4_1, 576, 576}, {DType::kQ4_1, 192, 576},  {DType::kQ4_1, 192, 576},
                       {DType::kQ4_1, 576, 576}, {DType::kQ4_1, 1536, 576}, {DType::kQ4_1, 1536, 576},
                       {DType::kQ4_1, 576, 1536}};
  static std::vector<std::vector<uint8_t>> bufs;
  static std::vector<WeightView> views;
  if (views.empty()) {
    for (int l = 0; l < 30; ++l)
      for (const Mat& m : layer) bufs.push_back(random_weights(m.t, m.rows, m.cols));
    bufs.push_back(random_weights(DType::kQ8_0, 49152, 576));
    size_t i = 0;
    for (int l = 0; l < 30; ++l)
      for (const Mat& m : layer) views.push_back({m.t, m.rows, m.cols, bufs[i++].data(), row_bytes(m.t, m.cols)});
    views.push_back({DType::kQ8_0, 49152, 576, bufs[i].data(), row_bytes(DType::kQ8_0, 576)});
  }
  std::vector<float> x(1536 * n_tokens), y(49152 * n_tokens);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  Scratch scratch;
  scratch.reserve(
      std::max(matmul_scratch_bytes(DType::kQ4_1, 1536, n_tokens), matmul_scratch_bytes(DType::kQ8_0, 1536, n_tokens)));
  size_t bytes = 0;
  for (const auto& b : bufs) bytes += b.size();
  for (auto _ : state) {
    for (const WeightView& v : views) matmul(v, x.data(), n_tokens, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * n_tokens), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(isa_name(best_isa())) + " " + std::to_string(bytes >> 20) + " MiB");
}
BENCHMARK(BM_decode_token_all_layers)
    ->Args({2, 1})
    ->Args({1, 1})
    ->Args({2, 8})
    ->Args({1, 8})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One decode token through 4 Llama-3.2-1B layers (q, k, v, o, gate, up,
// down; distinct weights, 240-400 MB: streamed from DRAM as in real decode)
// of one weight type. Compare weight_GB/s with BM_ReadBandwidth.
// Args: {n_threads}.
void run_decode_1b(benchmark::State& state, DType t) {
  static ThreadPool pool2(kThreads), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  struct Mat {
    int64_t rows, cols;
  };
  const Mat layer[] = {{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048}, {8192, 2048}, {8192, 2048}, {2048, 8192}};
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<WeightView> views;
  for (int l = 0; l < 4; ++l)
    for (const Mat& m : layer) bufs.push_back(random_weights(t, m.rows, m.cols));
  size_t i = 0, bytes = 0;
  for (int l = 0; l < 4; ++l)
    for (const Mat& m : layer) {
      bytes += bufs[i].size();
      views.push_back({t, m.rows, m.cols, bufs[i++].data(), row_bytes(t, m.cols)});
    }
  std::vector<float> x(8192), y(8192);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  Scratch scratch;
  scratch.reserve(matmul_scratch_bytes(t, 8192, 1));
  for (auto _ : state) {
    for (const WeightView& v : views) matmul(v, x.data(), 1, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(isa_name(best_isa())) + " " + std::string(dtype_name(t)) + " " +
                 std::to_string(bytes >> 20) + " MiB");
}
void BM_decode_1b_Q8_0(benchmark::State& s) {
  run_decode_1b(s, DType::kQ8_0);
}
void BM_decode_1b_Q4_K(benchmark::State& s) {
  run_decode_1b(s, DType::kQ4_K);
}
void BM_decode_1b_Q6_K(benchmark::State& s) {
  run_decode_1b(s, DType::kQ6_K);
}
void BM_decode_1b_Q5_K(benchmark::State& s) {
  run_decode_1b(s, DType::kQ5_K);
}
BENCHMARK(BM_decode_1b_Q8_0)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_1b_Q4_K)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_1b_Q5_K)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_1b_Q6_K)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// The decode ceiling: streaming reads of a buffer larger than the caches
// (256 MiB) by the same 2 threads.
void BM_ReadBandwidth(benchmark::State& state) {
  static ThreadPool pool2(kThreads), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  const int n_threads = pool.n_threads();
  const size_t n = size_t{256} << 20 >> 3;
  static std::vector<uint64_t> buf(n, 1);
  uint64_t sums[kThreads] = {};
  for (auto _ : state) {
    pool.for_each_thread([&](int t) {
      const size_t b = n / n_threads * t, e = b + n / n_threads;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = b; i < e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
      sums[t] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(sums);
  }
  state.counters["read_GB/s"] = benchmark::Counter(n * 8.0 * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadBandwidth)->Arg(2)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace rill::cpu
