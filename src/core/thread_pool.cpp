#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define RILL_PAUSE() _mm_pause()
#else
#define RILL_PAUSE() std::this_thread::yield()
#endif

namespace rill {
namespace {
// About 50-100 microseconds of spinning before a worker sleeps.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  claim_.store(pack(0, kClosed));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::help_with_job(uint64_t gen, int thread_index) {
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    if ((c >> kIndexBits) != gen) return;
    const uint64_t index = c & kIndexMask;
    // Read the descriptor before claiming; the claim validates it.
    const Trampoline fn = job_fn_.load(std::memory_order_relaxed);
    void* ctx = job_ctx_.load(std::memory_order_relaxed);
    const int64_t n = job_n_.load(std::memory_order_relaxed);
    const int64_t grain = job_grain_.load(std::memory_order_relaxed);
    const auto n_chunks = static_cast<uint64_t>(job_n_chunks_.load(std::memory_order_relaxed));
    const bool one_per_thread = job_one_per_thread_.load(std::memory_order_relaxed);
    if (index >= n_chunks) return;  // all claimed (or closed)
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    if (one_per_thread) {
      // Each thread takes one claim and runs its own index, so the job
      // cannot end before every thread has run once.
      fn(ctx, thread_index, thread_index + 1);
      n_chunks_done_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    const int64_t begin = static_cast<int64_t>(index) * grain;
    fn(ctx, begin, std::min(n, begin + grain));
    n_chunks_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run_job(int64_t n, int64_t grain, Trampoline t, void* ctx, bool one_per_thread) {
  const uint64_t gen = (generation_.load(std::memory_order_relaxed) + 1) & ((uint64_t{1} << 24) - 1);
  const int64_t n_chunks = one_per_thread ? n_threads_ : (n + grain - 1) / grain;
  // The claim word is closed (previous job finished), so no worker can be
  // using the descriptor.
  job_fn_.store(t, std::memory_order_relaxed);
  job_ctx_.store(ctx, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_grain_.store(grain, std::memory_order_relaxed);
  job_n_chunks_.store(n_chunks, std::memory_order_relaxed);
  job_one_per_thread_.store(one_per_thread, std::memory_order_relaxed);
  n_chunks_done_.store(0, std::memory_order_relaxed);
  claim_.store(pack(gen, 0), std::memory_order_release);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.store(gen, std::memory_order_release);
  }
  if (n_sleeping_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  help_with_job(gen, 0);
  while (n_chunks_done_.load(std::memory_order_acquire) < n_chunks) RILL_PAUSE();
  claim_.store(pack(gen, kClosed), std::memory_order_release);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      RILL_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      n_sleeping_.fetch_add(1, std::memory_order_acq_rel);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); });
      n_sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    help_with_job(gen, index);
  }
}

}  // namespace rill
