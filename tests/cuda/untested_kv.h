#pragma once
// iq4_nlh64's CUDA kernels have not yet run on a GPU, so the CUDA backend
// refuses them unless RILL_CUDA_UNTESTED_KV=1 (backend/cuda/ops.h
// kv_untested). The device tests are what would lift that: a test binary
// that includes this header sets it before its tests run (one environment
// per binary, however many of its files include it).
#include <gtest/gtest.h>

#include <cstdlib>

namespace rill::cuda::testing {

class AllowUntestedKv : public ::testing::Environment {
 public:
  void SetUp() override { setenv("RILL_CUDA_UNTESTED_KV", "1", 1); }
};
inline ::testing::Environment* const kAllowUntestedKv = ::testing::AddGlobalTestEnvironment(new AllowUntestedKv);

}  // namespace rill::cuda::testing
