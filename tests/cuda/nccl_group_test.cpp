// NcclGroup on the GPUs of this host (needs 2 devices; skips otherwise):
// the collectives give SimulatedGroup's results (all-reduce: the same value
// on every rank, equal to the host sum within one rounding per rank), they
// run in stream order, and NVLink multicast is off.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "parallel/nccl_group.h"

namespace rill {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

#define REQUIRE_TWO_GPUS()                                          \
  do {                                                              \
    if (device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices"; \
  } while (0)

// body(rank, stream) on one thread per rank, on that rank's device and stream.
void run_ranks(NcclGroup& g, const std::function<void(int, cudaStream_t)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < g.size(); ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(g.device(r)), cudaSuccess);
      cudaStream_t s = nullptr;
      ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
      g.set_stream(r, s);
      body(r, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
}

std::unique_ptr<NcclGroup> two_gpus() {
  const int devices[] = {0, 1};
  auto g = NcclGroup::create(devices);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? std::move(g).value() : nullptr;
}

TEST(NcclGroup, MulticastIsOffAndRanksAreNumbered) {
  REQUIRE_TWO_GPUS();
  auto g = two_gpus();
  ASSERT_TRUE(g);
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  EXPECT_EQ(g->size(), 2);
  EXPECT_EQ(g->rank(1).rank(), 1);
  EXPECT_EQ(g->rank(1).size(), 2);
}

TEST(NcclGroup, RefusesDevicesThatDoNotExist) {
  const int devices[] = {0, 999};
  auto g = NcclGroup::create(devices);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("does not exist"), std::string::npos) << g.error().message;
}

TEST(NcclGroup, CollectivesMatchTheHost) {
  REQUIRE_TWO_GPUS();
  auto g = two_gpus();
  ASSERT_TRUE(g);
  constexpr int64_t kN = 1 << 20;  // large enough for NCCL's multi-chunk paths
  std::vector<std::vector<float>> in = {cuda::testing::random_floats(kN, 1), cuda::testing::random_floats(kN, 2)};
  std::vector<std::vector<float>> reduced(2, std::vector<float>(kN)), gathered(2, std::vector<float>(2 * kN)),
      broadcast(2, std::vector<float>(kN));
  run_ranks(*g, [&](int r, cudaStream_t s) {
    float *buf = nullptr, *all = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&all, 2 * kN * sizeof(float)), cudaSuccess);
    Communicator& c = g->rank(r);
    ASSERT_EQ(cudaMemcpyAsync(buf, in[r].data(), kN * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_TRUE(c.all_gather(buf, kN, all).ok());
    ASSERT_TRUE(c.all_reduce_sum(buf, kN).ok());  // in stream order: after the gather read buf
    ASSERT_EQ(cudaMemcpyAsync(reduced[r].data(), buf, kN * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(gathered[r].data(), all, 2 * kN * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(buf, in[r].data(), kN * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_TRUE(c.broadcast(buf, kN, 1).ok());
    ASSERT_EQ(cudaMemcpyAsync(broadcast[r].data(), buf, kN * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaFree(buf);
    cudaFree(all);
  });
  // Two terms: a + b rounds the same in either order, so the result is exact.
  EXPECT_EQ(0, std::memcmp(reduced[0].data(), reduced[1].data(), kN * sizeof(float)));
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(reduced[0][i], in[0][i] + in[1][i]) << i;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(0, std::memcmp(gathered[r].data(), in[0].data(), kN * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(gathered[r].data() + kN, in[1].data(), kN * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(broadcast[r].data(), in[1].data(), kN * sizeof(float)));
  }
}

}  // namespace
}  // namespace rill
