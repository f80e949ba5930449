// Attention over an f16 KV cache on the default model's shapes (9 query
// heads, 3 KV heads, head_dim 64): a 512-token prefill and one decode token
// at 512 keys, and a 512-token chunk at 8,192 keys (also in a sliding
// window of 1,024, as is a decode token there). GFLOP/s counts 4 *
// head_dim flops per visible (query, key, head) triple (q.k and p.v). The
// _paged variants scatter the K/V rows over 16-row blocks in shuffled
// order (a block table), as the paged cache does; _hd96 takes head_dim 96
// (the AVX2 kernels).
// Args: {n_threads}.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/cpu_features.h"
#include "core/half.h"

namespace rill::cpu {
namespace {

void run(benchmark::State& state, int64_t n_q, int64_t n_kv, bool paged, int64_t window = 0, int64_t hd = 64) {
  static ThreadPool pool2(2), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  AttentionParams p;
  p.n_head = 9;
  p.n_head_kv = 3;
  p.head_dim = hd;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  p.window = window;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(n_q * 9 * hd), out(q.size());
  std::vector<uint16_t> k(n_kv * 3 * hd), v(k.size());
  for (auto& x : q) x = u(rng);
  for (auto& x : k) x = f32_to_f16(u(rng));
  for (auto& x : v) x = f32_to_f16(u(rng));
  std::vector<int32_t> pos(n_q);
  for (int64_t i = 0; i < n_q; ++i) pos[i] = static_cast<int32_t>(n_kv - n_q + i);
  double visible = 0;
  for (int32_t ps : pos) visible += window > 0 ? std::min<int64_t>(ps + 1, window) : ps + 1;
  const size_t row_b = 3 * hd * sizeof(uint16_t);
  PagedKv kv = make_contiguous_kv(k.data(), v.data(), row_b);
  constexpr int32_t kShift = 4;
  const int64_t n_blocks = (n_kv + 15) >> kShift;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::vector<uint16_t> k_pool(static_cast<size_t>(n_blocks) * 16 * 3 * hd), v_pool(k_pool.size());
  if (paged) {
    for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), rng);
    kv.k = reinterpret_cast<const uint8_t*>(k_pool.data());
    kv.v = reinterpret_cast<const uint8_t*>(v_pool.data());
    kv.table = table.data();
    kv.block_shift = kShift;
    kv.block_bytes = 16 * row_b;
    for (int64_t j = 0; j < n_kv; ++j) {
      std::memcpy(const_cast<uint8_t*>(kv.k_row(j)), k.data() + j * 3 * hd, row_b);
      std::memcpy(const_cast<uint8_t*>(kv.v_row(j)), v.data() + j * 3 * hd, row_b);
    }
  }
  for (auto _ : state) {
    attention_f16_rounded(q.data(), pos.data(), n_q, kv, n_kv, p, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(visible * 9 * 4 * hd * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  // The kernels' ISA: AVX-512's exact kernels take head_dims of 64, 128, ...
  // only; the others run the AVX2 ones.
  state.SetLabel(best_isa() == Isa::kAvx512 && !detail::attend_f16_exact_supported(hd) ? "avx2" : isa_name(best_isa()));
}

// Decode as an 8-stream engine step sees it: 8 sequences of 256 keys, one
// query each, cycling through 30 layers' paged pools (47 MB of K/V, more
// than the caches hold), so K/V come from memory as they do in serving.
void BM_attention_decode_8x256_cold(benchmark::State& state) {
  static ThreadPool pool2(2), pool1(1);
  ThreadPool& pool = state.range(0) == 1 ? pool1 : pool2;
  constexpr int kSeqs = 8, kLayers = 30;
  constexpr int64_t kKv = 256, kRowElems = 3 * 64, kBlocks = kKv / 16;
  AttentionParams p;
  p.n_head = 9;
  p.n_head_kv = 3;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t pool_elems = static_cast<size_t>(kSeqs * kBlocks * 16 * kRowElems);
  std::vector<std::vector<uint16_t>> k_pool(kLayers), v_pool(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    k_pool[l].resize(pool_elems);
    v_pool[l].resize(pool_elems);
    for (auto& x : k_pool[l]) x = f32_to_f16(u(rng));
    for (auto& x : v_pool[l]) x = f32_to_f16(u(rng));
  }
  std::vector<int32_t> table(kSeqs * kBlocks);
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> q(kSeqs * 9 * 64), out(q.size());
  for (auto& x : q) x = u(rng);
  const int32_t pos = kKv - 1;
  std::vector<AttentionSeq> seqs(kSeqs);
  int layer = 0;
  for (auto _ : state) {
    for (int s = 0; s < kSeqs; ++s) {
      PagedKv kv;
      kv.k = reinterpret_cast<const uint8_t*>(k_pool[layer].data());
      kv.v = reinterpret_cast<const uint8_t*>(v_pool[layer].data());
      kv.table = table.data() + s * kBlocks;
      kv.block_shift = 4;
      kv.row_bytes = kRowElems * 2;
      kv.block_bytes = 16 * kv.row_bytes;
      seqs[s] = AttentionSeq{q.data() + s * 9 * 64, &pos, 1, kv, kKv, out.data() + s * 9 * 64};
    }
    attention_f16_rounded_batch(seqs.data(), kSeqs, p, pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  state.SetLabel(isa_name(best_isa()));
}
BENCHMARK(BM_attention_decode_8x256_cold)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

void BM_attention_prefill_512(benchmark::State& s) {
  run(s, 512, 512, false);
}
void BM_attention_decode_at_512(benchmark::State& s) {
  run(s, 1, 512, false);
}
void BM_attention_prefill_512_paged(benchmark::State& s) {
  run(s, 512, 512, true);
}
void BM_attention_decode_at_512_paged(benchmark::State& s) {
  run(s, 1, 512, true);
}
// The last 512-token chunk of an 8,192-token prompt: K and V (12 MB) no
// longer fit the caches, so how often each row is read shows.
void BM_attention_prefill_512_at_8k_paged(benchmark::State& s) {
  run(s, 512, 8192, true);
}
// The same in a sliding-window layer of 1,024 keys (Gemma 3's local layers).
void BM_attention_prefill_512_at_8k_window1024_paged(benchmark::State& s) {
  run(s, 512, 8192, true, 1024);
}
// The 8k chunk at head_dim 96 (Phi-3's): the AVX2 kernels on every x86
// machine (AVX-512's exact ones take multiples of 64).
void BM_attention_prefill_512_at_8k_hd96_paged(benchmark::State& s) {
  run(s, 512, 8192, true, 0, 96);
}
// One decode token at 8,192 keys, head_dim 96 (the AVX2 kernels).
void BM_attention_decode_at_8k_hd96_paged(benchmark::State& s) {
  run(s, 1, 8192, true, 0, 96);
}
// One decode token at 8,192 keys in a 1,024-key window.
void BM_attention_decode_at_8k_window1024_paged(benchmark::State& s) {
  run(s, 1, 8192, true, 1024);
}
BENCHMARK(BM_attention_prefill_512)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_decode_at_512)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_prefill_512_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_decode_at_512_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_prefill_512_at_8k_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_decode_at_8k_window1024_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_decode_at_8k_hd96_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_prefill_512_at_8k_hd96_paged)->Arg(2)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_prefill_512_at_8k_window1024_paged)
    ->Arg(2)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace rill::cpu
