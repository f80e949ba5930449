#pragma once
// ThreadPool: a fixed set of workers for data-parallel kernels.
//
// The caller takes part in every job, so a pool of n threads has n-1
// workers. Workers spin briefly between jobs before sleeping, because a
// decode step issues a few hundred small jobs back to back and a sleep/wake
// per job would cost more than the work. Chunks are claimed dynamically and
// a job ends when its chunks are done, not when every worker has shown up:
// on a busy machine a descheduled worker delays nothing. Jobs are not
// reentrant: call parallel_for only from one thread at a time.
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
  // fn must not throw: workers may still be inside the job.
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

  // The claim word packs a job's generation (high 24 bits) with the index of
  // its next unclaimed chunk (low 40 bits). A chunk is claimed by a CAS on
  // the whole word, so a worker that wakes late can never claim a chunk of a
  // job that has moved on: between jobs the caller sets the index to kClosed.
  static constexpr int kIndexBits = 40;
  static constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
  static constexpr uint64_t kClosed = kIndexMask;
  static uint64_t pack(uint64_t gen, uint64_t index) { return (gen << kIndexBits) | index; }

  void run_job(int64_t n, int64_t grain, Trampoline t, void* ctx, bool one_per_thread = false);
  void worker_loop(int index);
  // Runs chunks of job `gen` until none is left; returns at once if `gen`
  // is not the current job.
  void help_with_job(uint64_t gen, int thread_index);

  int n_threads_;
  std::vector<std::thread> workers_;

  // The current job's descriptor: written by the caller only while the claim
  // word is closed; read by workers, whose successful claim proves they read
  // the descriptor of the job they claimed from.
  std::atomic<Trampoline> job_fn_{nullptr};
  std::atomic<void*> job_ctx_{nullptr};
  std::atomic<int64_t> job_n_{0};
  std::atomic<int64_t> job_grain_{1};
  std::atomic<int64_t> job_n_chunks_{0};
  std::atomic<bool> job_one_per_thread_{false};

  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> n_chunks_done_{0};
  std::atomic<uint64_t> generation_{0};  // the latest job (wakes workers)
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> n_sleeping_{0};
};

}  // namespace rill
