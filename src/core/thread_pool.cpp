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
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work_on_current_job(int thread_index) {
  if (job_one_per_thread_) {
    job_fn_(job_ctx_, thread_index, thread_index + 1);
    return;
  }
  for (;;) {
    int64_t begin = next_chunk_.fetch_add(job_grain_, std::memory_order_relaxed);
    if (begin >= job_n_) break;
    job_fn_(job_ctx_, begin, std::min(job_n_, begin + job_grain_));
  }
}

void ThreadPool::run_job(int64_t n, int64_t grain, Trampoline t, void* ctx, bool one_per_thread) {
  job_fn_ = t;
  job_ctx_ = ctx;
  job_n_ = n;
  job_grain_ = grain;
  job_one_per_thread_ = one_per_thread;
  next_chunk_.store(0, std::memory_order_relaxed);
  n_active_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the mutex pairs with the sleepers' predicate check.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (n_sleeping_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  work_on_current_job(0);
  while (n_active_.load(std::memory_order_acquire) != 0) RILL_PAUSE();
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
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      n_sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    work_on_current_job(index);
    n_active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace rill
