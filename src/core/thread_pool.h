#pragma once
// ThreadPool: a fixed set of workers for data-parallel kernels.
//
// The caller takes part in every job, so a pool of n threads has n-1
// workers. Workers spin briefly between jobs before sleeping, because a
// decode step issues a few hundred small jobs back to back and a sleep/wake
// per job would cost more than the work. Jobs are not reentrant: call
// parallel_for only from one thread at a time (the engine thread).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace rill {

class ThreadPool {
 public:
  // n_threads <= 0 means one per available core.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of at most `grain`, spread
  // across the threads; returns when every chunk is done. No allocation.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n);
      return;
    }
    run_job(n, grain, &invoke<std::remove_reference_t<Fn>>, &fn);
  }

  // Calls fn(thread_index) once on each of the n_threads() threads.
  template <typename Fn>
  void for_each_thread(Fn&& fn) {
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(static_cast<int>(i));
    };
    run_job(n_threads_, 1, &invoke<decltype(body)>, &body, /*one_per_thread=*/true);
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);
  template <typename Fn>
  static void invoke(void* ctx, int64_t b, int64_t e) {
    (*static_cast<Fn*>(ctx))(b, e);
  }

  void run_job(int64_t n, int64_t grain, Trampoline t, void* ctx, bool one_per_thread = false);
  void worker_loop(int index);
  void work_on_current_job(int thread_index);

  int n_threads_;
  std::vector<std::thread> workers_;

  // The current job. Published by bumping generation_.
  Trampoline job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  bool job_one_per_thread_ = false;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> n_active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace rill
