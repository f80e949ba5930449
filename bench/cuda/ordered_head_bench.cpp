// bench_ordered_head: Gemma 4's assistant's ordered-embedding head on the
// CUDA Backend (Backend::ordered_logits after the centroid matmul) at the
// public assistants' head shape, beside the dense head it replaces (the
// tied lm_head times the rows).
//
//   bench_ordered_head [E]   (default 256: the assistant's hidden size)
//
// Shapes: V = 262,144 (Gemma 4's vocabulary), 2,048 centroids of 128
// tokens, the top 32 (4,096 scored tokens per row); bf16 weights and
// activations, random values. Each figure is the median over 5 runs of 50
// back-to-back calls (eager launches, each run ended by a copy from the
// device), per call, at 1 and 8 rows; GB/s counts the head bytes a call
// must read (ordered: the picked rows and the centroids; dense: the whole
// lm_head).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/half.h"

namespace rill {
namespace {

constexpr int64_t kVocab = 262144;
constexpr int32_t kCentroids = 2048, kTopK = 32;

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = f32_to_bf16(d(rng));
  return v;
}

template <typename F>
double median_us(Backend& b, void* probe, F call) {
  std::vector<double> runs;
  float sink = 0;
  for (int run = 0; run < 6; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) call();
    if (!b.copy_out(&sink, probe, sizeof(float)).ok()) std::abort();
    const auto t1 = std::chrono::steady_clock::now();
    if (run > 0) runs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 50);  // run 0 warms up
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

int run(int64_t E) {
  auto made = make_cuda_backend({DType::kBF16, false, 0});
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.error().message.c_str());
    return 1;
  }
  Backend& b = **made;
  const auto head = random_bf16(static_cast<size_t>(kVocab * E), 1);
  const auto cents = random_bf16(static_cast<size_t>(kCentroids) * static_cast<size_t>(E), 2);
  HostMatrix hm{head.data(), DType::kBF16, kVocab, E, static_cast<size_t>(E) * 2};
  hm.gathered = true;
  const HostMatrix cm{cents.data(), DType::kBF16, kCentroids, E, static_cast<size_t>(E) * 2};
  auto lm_head = b.place(&hm, 1, "lm_head");
  auto centroids = b.place(&cm, 1, "centroids");
  if (!lm_head.ok() || !centroids.ok()) return 1;
  constexpr int64_t kMaxRows = 8;
  if (!b.reserve({kMaxRows, 8, 256, nullptr, &*lm_head, kMaxRows}).ok()) return 1;
  std::vector<int32_t> ordering(static_cast<size_t>(kVocab));
  std::iota(ordering.begin(), ordering.end(), 0);
  std::shuffle(ordering.begin(), ordering.end(), std::mt19937(3));
  const int64_t n_picked = int64_t{kTopK} * (kVocab / kCentroids);
  auto buffer = [&](size_t bytes, const void* host) {
    auto buf = b.allocate(bytes, "bench");
    if (!buf.ok()) std::abort();
    if (host && !b.copy_in(buf->data(), host, bytes).ok()) std::abort();
    return std::move(*buf);
  };
  const Buffer order_buf = buffer(ordering.size() * 4, ordering.data());
  const auto x = random_bf16(static_cast<size_t>(kMaxRows * E), 4);
  const Buffer rows_buf = buffer(x.size() * 2, x.data());
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  const Buffer rows_f32 = buffer(xf.size() * 4, xf.data());
  const Buffer scores = buffer(static_cast<size_t>(kMaxRows * kCentroids) * 4, nullptr);
  const Buffer logits = buffer(static_cast<size_t>(kMaxRows * kVocab) * 4, nullptr);
  const Buffer picked = buffer(static_cast<size_t>(kMaxRows * n_picked) * 4, nullptr);
  const Buffer dots = buffer(static_cast<size_t>(kMaxRows * n_picked) * 4, nullptr);
  std::printf("E = %lld, V = %lld, %d centroids, top %d (%lld tokens a row), bf16\n", static_cast<long long>(E),
              static_cast<long long>(kVocab), kCentroids, kTopK, static_cast<long long>(n_picked));
  std::printf("%-6s %14s %10s %14s %10s %8s\n", "rows", "ordered (us)", "GB/s", "dense (us)", "GB/s", "ratio");
  for (const int64_t n : {int64_t{1}, kMaxRows}) {
    const Tensor rows = Tensor::dense(rows_buf.data(), DType::kBF16, n, E);
    OrderedLogitsOp op;
    op.hidden = Tensor::dense(rows_f32.data(), DType::kF32, n, E);
    op.scores = Tensor::dense(scores.data(), DType::kF32, n, kCentroids);
    op.logits = Tensor::dense(logits.data(), DType::kF32, n, kVocab);
    op.lm_head = *lm_head;
    op.token_ordering = static_cast<const int32_t*>(order_buf.data());
    op.n_centroids = kCentroids;
    op.top_k = kTopK;
    op.picked = static_cast<int32_t*>(picked.data());
    op.dots = static_cast<float*>(dots.data());
    const double ordered = median_us(b, logits.data(), [&] {
      if (!b.matmul(*centroids, rows, op.scores, false).ok()) std::abort();
      b.ordered_logits(op);
    });
    const double dense = median_us(b, logits.data(), [&] {
      if (!b.matmul(*lm_head, rows, op.logits, false).ok()) std::abort();
    });
    const double ordered_bytes = double(n) * n_picked * E * 2 + double(kCentroids) * E * 2;
    const double dense_bytes = double(kVocab) * E * 2;
    std::printf("%-6lld %14.1f %10.0f %14.1f %10.0f %8.2f\n", static_cast<long long>(n), ordered,
                ordered_bytes / ordered / 1e3, dense, dense_bytes / dense / 1e3, dense / ordered);
  }
  return 0;
}

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  const int64_t E = argc > 1 ? std::atoll(argv[1]) : 256;
  return rill::run(E);
}
