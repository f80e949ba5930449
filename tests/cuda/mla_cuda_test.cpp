// The MLA families (deepseek_v3, minicpm3, glm_moe_dsa: GLM-5's sparse
// attention too) on CUDA: not implemented yet (the CUDA Backend has no
// multi-head latent attention ops; GLM-4.5's sigmoid MoE router runs on
// CUDA now: llama_cuda_test.cpp, moe_cuda_test.cpp), so asking for the
// CUDA device refuses at load with a message that says so and names the CPU,
// never computes other numbers. When the CUDA MLA ops land this becomes the
// parity test of gemma_cuda_test.cpp (HF goldens within 1e-3, greedy ids,
// batch invariance) and tests/backend/backend_ops_test.cpp's
// MultiHeadLatentAttention case holds the ops to the CPU.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <string>

#include <cstdlib>

#include "cuda_test_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

class MlaCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaCuda, RefusesAtLoadNamingTheCpu) {
  RILL_REQUIRE_GPU();
  // RILL_SHARED_DIR in the environment first: a GPU machine gets the goldens carried elsewhere.
  const char* shared = std::getenv("RILL_SHARED_DIR");
  const std::string dir = std::string(shared ? shared : RILL_SHARED_DIR) + "/goldens/hf/" + GetParam();
  auto files = open_model_files(dir);
  if (!files.ok()) GTEST_SKIP() << files.error().message;
  ModelOptions o;
  o.device = Device::kCuda;
  o.n_ctx = 64;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_FALSE(model.ok()) << GetParam() << " loads on CUDA now: replace this test by the parity test";
  EXPECT_NE(model.error().message.find("CUDA"), std::string::npos) << model.error().message;
  EXPECT_NE(model.error().message.find("CPU"), std::string::npos) << model.error().message;
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaCuda, ::testing::Values("deepseek-v3", "minicpm3", "glm-5"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace rill
