// The limits and KV cache every CPU family gets from CpuPagedModel, seen
// through the Llama family on the tiny golden model: a KV budget too small
// for one block is an error naming the file, the cache sizes from the
// budget or from whole contexts, and block export refuses what is not there.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

Result<std::unique_ptr<Model>> open_llama(const ModelOptions& opts) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(test::hf_golden_dir("llama")));
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

class CpuPagedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::has_hf_golden(test::hf_golden_dir("llama"))) GTEST_SKIP() << "no llama golden";
  }
};

TEST_F(CpuPagedModelTest, LimitsAndCacheFollowTheOptions) {
  ModelOptions o;
  o.n_ctx = 100;
  o.max_batch_tokens = 24;
  o.max_batch_seqs = 64;  // capped at the token budget
  o.kv_block_size = 16;
  o.n_kv_slots = 3;
  auto m = open_llama(o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->n_ctx(), 100);
  EXPECT_EQ((*m)->max_batch_tokens(), 24);
  EXPECT_EQ((*m)->max_batch_seqs(), 24);
  EXPECT_EQ((*m)->n_kv_blocks(), 3 * 7);  // three contexts of ceil(100 / 16) blocks

  o.kv_cache_bytes = static_cast<int64_t>((*m)->kv_bytes_per_token()) * 16 * 5 + 1;
  auto sized = open_llama(o);
  ASSERT_TRUE(sized.ok()) << sized.error().message;
  EXPECT_EQ((*sized)->n_kv_blocks(), 5);
}

TEST_F(CpuPagedModelTest, TooSmallABudgetNamesTheFile) {
  ModelOptions o;
  o.kv_cache_bytes = 1;
  auto m = open_llama(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("goldens/hf/llama"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("holds no whole block"), std::string::npos) << m.error().message;
}

TEST_F(CpuPagedModelTest, BlockExportRefusesWhatIsNotThere) {
  ModelOptions o;
  o.n_ctx = 32;
  auto m = open_llama(o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  const std::vector<Model::KvLayer> layers = model.kv_layers();
  ASSERT_EQ(static_cast<int64_t>(layers.size()), model.config().n_layer);
  std::vector<uint8_t> k(layers[0].row_bytes * static_cast<size_t>(model.kv_block_size()));
  std::vector<uint8_t> v(k.size());
  EXPECT_TRUE(model.copy_kv_out(0, 0, k.data(), v.data()).ok());
  EXPECT_TRUE(model.copy_kv_in(0, model.n_kv_blocks() - 1, k.data(), v.data()).ok());
  for (auto [layer, block] :
       {std::pair<int64_t, int32_t>{-1, 0}, {model.config().n_layer, 0}, {0, -1}, {0, model.n_kv_blocks()}}) {
    Status out = model.copy_kv_out(layer, block, k.data(), v.data());
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.error().message.find("does not exist"), std::string::npos) << out.error().message;
    EXPECT_FALSE(model.copy_kv_in(layer, block, k.data(), v.data()).ok());
  }
}

}  // namespace
}  // namespace rill
