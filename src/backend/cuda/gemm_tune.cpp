#include "backend/cuda/gemm_tune.h"

#include <algorithm>

namespace rill::cuda {
namespace {

// Owns `count` timing events.
class Events {
 public:
  Events() = default;
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Status create(size_t count) {
    events_.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      if (cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
        return Error{cuda_error_text(err, "cudaEventCreate (GEMM tuning)")};
      }
      events_.push_back(e);
    }
    return Status::Ok();
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

float elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = -1.0f;
  return cudaEventElapsedTime(&ms, from, to) == cudaSuccess ? ms : -1.0f;
}

}  // namespace

Result<std::vector<float>> time_candidates(const Context& ctx, int count, const std::function<bool(int)>& launch,
                                           void* flush, size_t flush_bytes) {
  const cudaStream_t st = ctx.stream();
  const auto n = static_cast<size_t>(std::max(count, 0));
  std::vector<float> ms(n, -1.0f);
  std::vector<char> runs(n, 0);
  Events warm;
  RILL_TRY(warm.create(2 * n));
  for (size_t i = 0; i < n; ++i) {
    RILL_CUDA_CHECK(cudaEventRecord(warm[2 * i], st));
    runs[i] = launch(static_cast<int>(i)) ? 1 : 0;
    RILL_CUDA_CHECK(cudaEventRecord(warm[2 * i + 1], st));
  }
  if (cudaError_t e = cudaStreamSynchronize(st); e != cudaSuccess) {
    return Error{cuda_error_text(e, "GEMM tuning warm-up")};
  }
  const auto first = std::find(runs.begin(), runs.end(), 1);
  if (first == runs.end()) return ms;
  const auto f = static_cast<size_t>(first - runs.begin());
  const int reps = elapsed_ms(warm[2 * f], warm[2 * f + 1]) > 2.0f ? 1 : 3;

  Events timed;
  RILL_TRY(timed.create(2 * n * static_cast<size_t>(reps)));
  // Repetitions outermost, so a drift of the clock or the power state over
  // the timing spreads over every candidate alike.
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (!runs[i]) continue;
      if (flush) RILL_CUDA_CHECK(cudaMemsetAsync(flush, r + 1, flush_bytes, st));
      const size_t at = 2 * (static_cast<size_t>(r) * n + i);
      RILL_CUDA_CHECK(cudaEventRecord(timed[at], st));
      if (!launch(static_cast<int>(i))) runs[i] = 0;
      RILL_CUDA_CHECK(cudaEventRecord(timed[at + 1], st));
    }
  }
  if (cudaError_t e = cudaStreamSynchronize(st); e != cudaSuccess) {
    return Error{cuda_error_text(e, "GEMM tuning")};
  }
  for (size_t i = 0; i < n; ++i) {
    if (!runs[i]) continue;
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      const size_t at = 2 * (static_cast<size_t>(r) * n + i);
      t.push_back(elapsed_ms(timed[at], timed[at + 1]));
    }
    std::sort(t.begin(), t.end());
    ms[i] = t[t.size() / 2];
  }
  return ms;
}

int fastest(const std::vector<float>& ms) {
  int best = -1;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (ms[i] >= 0 && (best < 0 || ms[i] < ms[static_cast<size_t>(best)])) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace rill::cuda
