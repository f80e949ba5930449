#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace rill {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 64, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 20; ++rep) {
      pool.parallel_for(n, 13, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 20) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, ForEachThreadRunsOncePerThread) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  pool.for_each_thread([&](int t) { hits[t].fetch_add(1); });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  int64_t sum = 0;
  pool.parallel_for(100, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

}  // namespace
}  // namespace rill
