#pragma once
// A CUDA KV path that has not yet passed its GPU tests (k4c / k4a on
// gemma.cuda) is refused unless RILL_CUDA_UNTESTED_KV=1 (backend/cuda/ops.h
// kv_untested_allowed). The device tests are what would lift that: a test
// binary that includes this header sets it before its tests run (one
// environment per binary, however many of its files include it).
#include <gtest/gtest.h>

#include <cstdlib>

namespace rill::cuda::testing {

class AllowUntestedKv : public ::testing::Environment {
 public:
  void SetUp() override { setenv("RILL_CUDA_UNTESTED_KV", "1", 1); }
};
inline ::testing::Environment* const kAllowUntestedKv = ::testing::AddGlobalTestEnvironment(new AllowUntestedKv);

}  // namespace rill::cuda::testing
