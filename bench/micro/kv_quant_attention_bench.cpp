// Decode attention over each KV cache type (model/kv_types.h) on the default
// model's shapes (9 query heads, 3 KV heads, head_dim 64, 30 layers): one
// query at 1k / 4k / 8k keys per layer, cycling through 30 layers' paged
// pools so K/V come from memory as in serving (8k: 30 x 8k x 384 B = 94 MB
// of f16 KV). f16 runs the llama.cpp-rounded kernel (attention_f16.h); every
// other type attention_quant.h. The counters give the attention time of one
// decode token across all 30 layers ("ms/token") and the KV bytes it reads
// per second ("GB/s", against the machine's DRAM bandwidth: bench_peak).
// Args: {n_kv, type index (kTypes)}. k4c (K per channel over blocks of 32,
// V iq4_nlh64, the own block in q8_0 rows: attention_chan.h) has its own
// cases: BM_k4c_decode (Args: {n_kv, threads}) and BM_k4c_prefill (Args:
// {threads}; one step of 512 queries at [3584, 4096), "ms/step": the
// step's attention in 30 layers). BM_k4a_decode / BM_k4a_prefill: the
// same with k4a's K (q4a: each channel at its own width, bit planes;
// widths from allocate_channel_bits over lognormal statistics, 0..8 bits).
// On a loaded machine the 1-thread cases' CPU time is the steadier measure
// of the kernel's work.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/attention_f16.h"
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"

namespace rill::cpu {
namespace {

struct Type {
  const char* name;
  DType dtype;
  bool rotated;
};
constexpr Type kTypes[] = {
    {"f16", DType::kF16, false},   {"bf16", DType::kBF16, false},     {"q8_0", DType::kQ8_0, false},
    {"q5_1", DType::kQ5_1, false}, {"q5_0", DType::kQ5_0, false},     {"q4_1", DType::kQ4_1, false},
    {"q4_0", DType::kQ4_0, false}, {"q4_0h", DType::kQ4_0, true},     {"q8_0h", DType::kQ8_0, true},
    {"q8_0h64", kKvQ8_0x64, true}, {"iq4_nlh", DType::kIQ4_NL, true}, {"fp8", kF8E4M3, false}};
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
    ->ArgsProduct({{1024, 4096, 8192}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// k4c's KV of n_kv tokens in 30 layers' pools (blocks of 32: the K group,
// then 32 V rows; a shuffled block table) and the q8_0 rows of positions
// [c0 - c0 % 32, c0 + n_q): the tail's and the step's, shared by the layers.
struct K4cKv {
  static constexpr int64_t kWidth = 3 * 64;
  size_t k_row = 0, v_row = 0, tail_row = 0, block_bytes = 0;
  std::vector<std::vector<uint8_t>> pools;
  std::vector<int32_t> table;
  std::vector<uint8_t> tail_k, tail_v, step_k, step_v;
  std::vector<uint8_t> widths;  // k4a's q4a K; empty: k4c
  int64_t c0 = 0;

  K4cKv(int64_t n_kv, int64_t n_q, bool alloc) : pools(kLayers), c0(n_kv - n_q) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    if (alloc) {
      std::lognormal_distribution<double> ln(0.0, 1.5);
      std::vector<double> q(kWidth, 1.0), r(kWidth);
      for (double& x : r) x = ln(rng);
      widths.resize(kWidth);
      allocate_channel_bits(q.data(), r.data(), kWidth, 64, RopePairs::kNeox, widths.data(), false);
    }
    k_row = row_bytes(kKvQ4Chan, kWidth);
    v_row = row_bytes(kKvIq4Nl64, kWidth);
    tail_row = row_bytes(kKvChanTailType, kWidth);
    block_bytes = kKvChanTokens * (k_row + v_row);
    const int64_t n_blocks = (n_kv + kKvChanTokens - 1) / kKvChanTokens;
    table.resize(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), rng);
    // K as a model's after RoPE (one channel per head offset), V N(0,1).
    auto fill = [&](float* k, float* v) {
      for (int64_t c = 0; c < kWidth; ++c) {
        k[c] = c % 64 == 5 ? 6.0f + 3.0f * nd(rng) : nd(rng);
        v[c] = nd(rng);
      }
    };
    std::vector<float> k(static_cast<size_t>(kKvChanTokens * kWidth)), v(k.size());
    for (auto& pl : pools) {
      pl.resize(static_cast<size_t>(n_blocks) * block_bytes);
      for (int64_t b = 0; b < n_blocks; ++b) {
        uint8_t* blk = pl.data() + static_cast<size_t>(table[static_cast<size_t>(b)]) * block_bytes;
        for (int64_t r = 0; r < kKvChanTokens; ++r) {
          fill(k.data() + r * kWidth, v.data() + r * kWidth);
          store_kv_row(kKvIq4Nl64, true, v.data() + r * kWidth, blk + kKvChanTokens * k_row + r * v_row, 3, 64);
        }
        if (alloc) {
          quantize_alloc_block(k.data(), kWidth, kWidth, widths.data(), blk, b == 0);
        } else {
          quantize_chan_block(k.data(), kWidth, kWidth, blk, b == 0);
        }
      }
    }
    const int64_t t0 = c0 - c0 % kKvChanTokens;
    tail_k.resize(static_cast<size_t>(kKvChanTokens) * tail_row);
    tail_v.resize(tail_k.size());
    step_k.resize(static_cast<size_t>(n_q) * tail_row);
    step_v.resize(step_k.size());
    for (int64_t t = t0; t < c0 + n_q; ++t) {
      fill(k.data(), v.data());
      const size_t at = static_cast<size_t>(t < c0 ? t - t0 : t - c0) * tail_row;
      store_chan_tail_rows(k.data(), v.data(), true, 3, 64, (t < c0 ? tail_k : step_k).data() + at,
                           (t < c0 ? tail_v : step_v).data() + at);
    }
  }
  // Queries at [c0, c0 + n_q) of layer `layer` into out.
  void attend(int layer, const float* q, const int32_t* pos, int64_t n_q, int64_t n_kv, float* out,
              ThreadPool& pool) const {
    AttentionParams p;
    p.n_head = 9;
    p.n_head_kv = 3;
    p.head_dim = 64;
    p.scale = 0.125f;
    p.kv_dtype = kKvQ4Chan;
    AttentionSeq s;
    s.q = q;
    s.q_pos = pos;
    s.n_q = n_q;
    s.kv.k = pools[static_cast<size_t>(layer)].data();
    s.kv.v = s.kv.k + kKvChanTokens * k_row;
    s.kv.table = table.data();
    s.kv.block_shift = 5;
    s.kv.block_bytes = block_bytes;
    s.kv.row_bytes = k_row;
    s.kv.v_row_bytes = v_row;
    s.n_kv = n_kv;
    s.out = out;
    ChanTail t;
    t.tail_k = tail_k.data();
    t.tail_v = tail_v.data();
    t.step_k = step_k.data();
    t.step_v = step_v.data();
    t.c0 = c0;
    if (widths.empty()) {
      attention_chan_batch(&s, &t, 1, p, {kKvQ4Chan, kKvIq4Nl64, false, true}, pool);
    } else {
      attention_chan_batch(&s, &t, 1, p, {kKvQ4Alloc, kKvIq4Nl64, false, true}, pool, widths.data());
    }
  }
};

// The KV of (n_kv, n_q, alloc), built once per process.
const K4cKv& k4c_kv(int64_t n_kv, int64_t n_q, bool alloc) {
  static std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<K4cKv>> cache;
  auto& kv = cache[{n_kv, n_q, alloc}];
  if (!kv) kv = std::make_unique<K4cKv>(n_kv, n_q, alloc);
  return *kv;
}

ThreadPool& k4c_pool(int64_t threads) {
  static ThreadPool one(1), two(2);
  return threads == 1 ? one : two;
}

void chan_decode(benchmark::State& state, bool alloc) {
  ThreadPool& pool = k4c_pool(state.range(1));
  const int64_t n_kv = state.range(0);
  const K4cKv& kv = k4c_kv(n_kv, 1, alloc);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(9 * 64), out(q.size());
  for (float& x : q) x = nd(rng);
  const auto pos = static_cast<int32_t>(n_kv - 1);
  int layer = 0;
  for (auto _ : state) {
    kv.attend(layer, q.data(), &pos, 1, n_kv, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  state.counters["ms/token"] = benchmark::Counter(
      1.0 / (kLayers * 1e3), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>((kv.k_row + kv.v_row) * n_kv) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(alloc ? "k4a " : "k4c ") + isa_name(best_isa()));
}
void BM_k4c_decode(benchmark::State& state) {
  chan_decode(state, false);
}
void BM_k4a_decode(benchmark::State& state) {
  chan_decode(state, true);
}
BENCHMARK(BM_k4c_decode)->ArgsProduct({{1024, 4096, 8192}, {1, 2}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_k4a_decode)->ArgsProduct({{1024, 4096, 8192}, {1, 2}})->Unit(benchmark::kMicrosecond)->UseRealTime();

void chan_prefill(benchmark::State& state, bool alloc) {
  ThreadPool& pool = k4c_pool(state.range(0));
  constexpr int64_t kNq = 512, kNkv = 4096;
  const K4cKv& kv = k4c_kv(kNkv, kNq, alloc);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(kNq * 9 * 64)), out(q.size());
  for (float& x : q) x = nd(rng);
  std::vector<int32_t> pos(static_cast<size_t>(kNq));
  for (int64_t i = 0; i < kNq; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(kv.c0 + i);
  int layer = 0;
  for (auto _ : state) {
    kv.attend(layer, q.data(), pos.data(), kNq, kNkv, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  state.counters["ms/step"] = benchmark::Counter(
      1.0 / (kLayers * 1e3), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(alloc ? "k4a " : "k4c ") + isa_name(best_isa()));
}
void BM_k4c_prefill(benchmark::State& state) {
  chan_prefill(state, false);
}
void BM_k4a_prefill(benchmark::State& state) {
  chan_prefill(state, true);
}
BENCHMARK(BM_k4c_prefill)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_k4a_prefill)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace rill::cpu
