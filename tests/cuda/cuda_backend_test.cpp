// The CUDA Backend's buffers and uploads (backend/cuda/cuda_backend.h) are
// ordered with the work on its stream, which is non-blocking: a fresh
// buffer's clear never lands after what copy_in wrote into it, and a
// vector placed from the host is in device memory when placement returns.
// (Main cleared buffers with cudaMemset and uploaded with cudaMemcpy, both
// on the legacy stream, which the backend's stream does not wait for. These
// tests hold the contract; they did not catch the old code in 3 runs on an
// H200, so the hazard is timing-dependent, as the once-seen zeros of the
// MLA ops test were.) Skipped where no CUDA device is.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace rill {
namespace {

using cuda::testing::random_floats;

// A large allocation (its clear takes about a millisecond), then at once a
// small copy_in at its start: copy_out must read back the copy, and the
// rest of the buffer zeros. Repeated, since a race shows only sometimes.
TEST(CudaBackend, FreshBufferKeepsWhatCopyInWrote) {
  RILL_REQUIRE_GPU();
  auto backend = make_cuda_backend({DType::kBF16, false, 0});
  ASSERT_TRUE(backend.ok()) << backend.error().message;
  Backend& dev = **backend;
  const size_t big = size_t{1} << 30, small = size_t{1} << 16;
  const std::vector<float> pattern = random_floats(small / 4, 7, 1.0f, 2.0f);  // no zeros
  for (int round = 0; round < 8; ++round) {
    auto buf = dev.allocate(big, "test buffer");
    ASSERT_TRUE(buf.ok()) << buf.error().message;
    ASSERT_TRUE(dev.copy_in(buf->data(), pattern.data(), small).ok());
    std::vector<float> head(pattern.size(), 0.0f);
    ASSERT_TRUE(dev.copy_out(head.data(), buf->data(), small).ok());
    ASSERT_EQ(head, pattern) << "round " << round << ": the clear landed after copy_in";
    std::vector<uint8_t> tail(small, 0xFF);
    ASSERT_TRUE(dev.copy_out(tail.data(), static_cast<uint8_t*>(buf->data()) + big - small, small).ok());
    ASSERT_EQ(tail, std::vector<uint8_t>(small, 0)) << "round " << round << ": the buffer was not cleared";
  }
}

// A vector placed from the host (several MB, staged through pageable
// memory) reads back whole through the backend's stream right after
// place_vector returns.
TEST(CudaBackend, PlacedVectorIsOnTheDeviceWhenPlacementReturns) {
  RILL_REQUIRE_GPU();
  auto backend = make_cuda_backend({DType::kBF16, false, 0});
  ASSERT_TRUE(backend.ok()) << backend.error().message;
  Backend& dev = **backend;
  for (int round = 0; round < 4; ++round) {
    const std::vector<float> v = random_floats(size_t{4} << 20, 11 + round, 1.0f, 2.0f);
    auto placed = dev.place_vector(v.data(), static_cast<int64_t>(v.size()), "test vector");
    ASSERT_TRUE(placed.ok()) << placed.error().message;
    std::vector<float> back(v.size(), 0.0f);
    ASSERT_TRUE(dev.copy_out(back.data(), placed->data, v.size() * 4).ok());
    ASSERT_EQ(back, v) << "round " << round;
  }
}

}  // namespace
}  // namespace rill
