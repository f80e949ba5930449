// The K scores of q4a's bit-plane blocks (backend/cpu/kv_alloc.h) beside
// q4c's (kKvQ4Chan) on the default model's shapes: one block of 32 tokens,
// 3 KV heads of head_dim 64 with 3 query heads each (9 rows of 32 scores),
// one thread. Cycles through 256 blocks (~0.9 MB, L2-resident) so loads
// are not all from L1; "ns/block" is one block's 3 x 3 x 32 scores.
// Args of BM_q4a_scores: {widths (0: all 4 bits, 1: the realistic mix:
// 3% 2 bits, 30% 3, 42% 4, 17% 5, 5% 6, 2% 7, 0.5% 8), form (0: masked
// adds of the planes' weights, 1: codes widened from the planes then FMAs,
// 2: the double reference)}. BM_q4c_scores: q4c's group sums restated here
// (attention_chan_avx512.cpp's: nibbles widened to f32, one FMA per row;
// its kernel is internal) with the same q.z, the baseline per block.
// BM_q4a_encode / BM_q4c_encode: the encoders (below).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "core/e4m3.h"

namespace rill::cpu {
namespace {

constexpr int64_t kHd = 64, kKvHeads = 3, kWidth = kHd * kKvHeads;
constexpr int kRows = 3, kBlocks = 256;

std::vector<uint8_t> mix_widths(bool realistic) {
  if (!realistic) return std::vector<uint8_t>(kWidth, 4);
  const int counts[9] = {0, 0, 6, 57, 81, 33, 10, 4, 1};  // 192 channels, 768 bits
  std::vector<uint8_t> b;
  for (int bits = 0; bits <= 8; ++bits)
    b.insert(b.end(), static_cast<size_t>(counts[bits]), static_cast<uint8_t>(bits));
  std::mt19937 rng(3);
  std::shuffle(b.begin(), b.end(), rng);
  return b;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

void BM_q4a_scores(benchmark::State& state) {
  const bool realistic = state.range(0) == 1;
  const int form = static_cast<int>(state.range(1));
  if (form < 2 && !cpu_features().avx512) return state.SkipWithError("no AVX-512");
  const std::vector<uint8_t> widths = mix_widths(realistic);
  const auto bytes = static_cast<size_t>(alloc_block_bytes(widths.data(), kWidth));
  std::vector<uint8_t> blocks(bytes * kBlocks);
  const std::vector<float> x = random_floats(static_cast<size_t>(kKvChanTokens * kWidth), 1);
  for (int b = 0; b < kBlocks; ++b) quantize_alloc_block(x.data(), kWidth, kWidth, widths.data(), &blocks[b * bytes]);
  int64_t offsets[kKvHeads];
  for (int64_t h = 0; h < kKvHeads; ++h) offsets[h] = alloc_plane_offset(widths.data(), kWidth, h * kHd);
  const std::vector<float> q = random_floats(static_cast<size_t>(kKvHeads * kRows * kHd), 2);
  std::vector<float> scores(static_cast<size_t>(kKvHeads * kRows * kKvChanTokens));
  int blk = 0;
  for (auto _ : state) {
    const uint8_t* block = &blocks[blk * bytes];
    for (int64_t h = 0; h < kKvHeads; ++h) {
      const AllocHead head = alloc_head(block, kWidth, widths.data(), offsets[h], h, kHd);
      const float* qh = q.data() + h * kRows * kHd;
      float* out = scores.data() + h * kRows * kKvChanTokens;
      if (form == 0) detail::alloc_block_scores_avx512(head, qh, kRows, out);
      if (form == 1) detail::alloc_block_scores_widen_avx512(head, qh, kRows, out);
      if (form == 2) alloc_block_scores_ref(head, qh, kRows, out);
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
    blk = blk + 1 == kBlocks ? 0 : blk + 1;
  }
  state.counters["ns/block"] = benchmark::Counter(static_cast<double>(state.iterations()) * 1e-9,
                                                  benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  static const char* kForms[] = {"masked adds", "widened codes", "reference (double)"};
  state.SetLabel(std::string(realistic ? "mix " : "all 4 ") + kForms[form]);
}
BENCHMARK(BM_q4a_scores)->ArgsProduct({{0, 1}, {0, 1, 2}});

// gcc 12 warns inside its own avx512 headers (_mm512_undefined_* in
// functions given the ISA by a target attribute, as CMakeLists.txt notes
// for *_avx512.cpp files); the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// q4c's block: z [W] f16, d [W] e4m3, nibbles [W][16] (token j low, j + 16
// high). One KV head's kRows rows of 32 scores, as the AVX-512 attention's
// group sums do it, plus q.z in 16 lanes.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void q4c_scores(const uint8_t* block, int64_t head,
                                                                                   const float* q, float* out) {
  const auto* z = reinterpret_cast<const uint16_t*>(block) + head * kHd;
  const uint8_t* d = block + 2 * kWidth + head * kHd;
  const uint8_t* qs = block + 3 * kWidth + head * kHd * 16;
  const float* steps = e4m3_values();
  __m512 zacc[kRows], lo[kRows], hi[kRows];
  for (int g = 0; g < kRows; ++g) zacc[g] = lo[g] = hi[g] = _mm512_setzero_ps();
  for (int64_t c = 0; c < kHd; c += 16) {
    const __m512 zf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + c)));
    for (int g = 0; g < kRows; ++g) zacc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * kHd + c), zf, zacc[g]);
  }
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t c = 0; c < kHd; ++c) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + c * 16));
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
    const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
    const float step = steps[d[c]] * (1.0f / 16.0f);
    for (int g = 0; g < kRows; ++g) {
      const __m512 w = _mm512_set1_ps(q[g * kHd + c] * step);
      lo[g] = _mm512_fmadd_ps(w, flo, lo[g]);
      hi[g] = _mm512_fmadd_ps(w, fhi, hi[g]);
    }
  }
  for (int g = 0; g < kRows; ++g) {
    float lanes[16];
    _mm512_storeu_ps(lanes, zacc[g]);
    float qz = 0.0f;
    for (float v : lanes) qz += v;
    _mm512_storeu_ps(out + g * 32, _mm512_add_ps(lo[g], _mm512_set1_ps(qz)));
    _mm512_storeu_ps(out + g * 32 + 16, _mm512_add_ps(hi[g], _mm512_set1_ps(qz)));
  }
}

#pragma GCC diagnostic pop

void BM_q4c_scores(benchmark::State& state) {
  if (!cpu_features().avx512) return state.SkipWithError("no AVX-512");
  const size_t bytes = static_cast<size_t>(19 * kWidth);
  std::vector<uint8_t> blocks(bytes * kBlocks);
  const std::vector<float> x = random_floats(static_cast<size_t>(kKvChanTokens * kWidth), 1);
  for (int b = 0; b < kBlocks; ++b) quantize_chan_block(x.data(), kWidth, kWidth, &blocks[b * bytes]);
  const std::vector<float> q = random_floats(static_cast<size_t>(kKvHeads * kRows * kHd), 2);
  std::vector<float> scores(static_cast<size_t>(kKvHeads * kRows * kKvChanTokens));
  int blk = 0;
  for (auto _ : state) {
    const uint8_t* block = &blocks[blk * bytes];
    for (int64_t h = 0; h < kKvHeads; ++h) {
      q4c_scores(block, h, q.data() + h * kRows * kHd, scores.data() + h * kRows * kKvChanTokens);
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
    blk = blk + 1 == kBlocks ? 0 : blk + 1;
  }
  state.counters["ns/block"] = benchmark::Counter(static_cast<double>(state.iterations()) * 1e-9,
                                                  benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel("q4c widened nibbles");
}
BENCHMARK(BM_q4c_scores);

// The encoders of one block (all 192 channels), q4a's at its widths beside
// q4c's; Args: {widths (as above; BM_q4c_encode: none), sequence_start}.
// A sequence's first block tries 2^b grids through token 0 per step, so
// its cost grows with the widest channels.
void BM_q4a_encode(benchmark::State& state) {
  const std::vector<uint8_t> widths = mix_widths(state.range(0) == 1);
  const bool start = state.range(1) == 1;
  std::vector<uint8_t> block(static_cast<size_t>(alloc_block_bytes(widths.data(), kWidth)));
  const std::vector<float> x = random_floats(static_cast<size_t>(kKvChanTokens * kWidth), 1);
  for (auto _ : state) {
    quantize_alloc_block(x.data(), kWidth, kWidth, widths.data(), block.data(), start);
    benchmark::DoNotOptimize(block.data());
  }
  state.SetLabel(std::string(state.range(0) == 1 ? "mix" : "all 4") + (start ? ", sequence start" : ""));
}
BENCHMARK(BM_q4a_encode)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

void BM_q4c_encode(benchmark::State& state) {
  const bool start = state.range(0) == 1;
  std::vector<uint8_t> block(static_cast<size_t>(19 * kWidth));
  const std::vector<float> x = random_floats(static_cast<size_t>(kKvChanTokens * kWidth), 1);
  for (auto _ : state) {
    quantize_chan_block(x.data(), kWidth, kWidth, block.data(), start);
    benchmark::DoNotOptimize(block.data());
  }
  state.SetLabel(start ? "sequence start" : "");
}
BENCHMARK(BM_q4c_encode)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace rill::cpu
