// The limits and KV cache every CPU family gets from CpuPagedModel, seen
// through the Llama family on the tiny golden model: a KV budget too small
// for one block is an error naming the file, the cache sizes from the
// budget or from whole contexts, block export refuses what is not there, the
// batched block copies move the bytes the per-block ones do, and the KV
// numerics name the CPU and its instruction set.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "backend/cpu/cpu_features.h"
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

// The batched copies (Model's defaults over copy_kv_out / copy_kv_in) move
// blocks[i] to and from offset i * block_bytes: written in as a batch into
// scattered blocks, each reads back alone, and a batch out gives the same.
TEST_F(CpuPagedModelTest, BatchedBlockCopiesMoveWhatPerBlockCopiesDo) {
  ModelOptions o;
  o.n_ctx = 64;
  o.kv_block_size = 4;
  auto m = open_llama(o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  const size_t bb = model.kv_layers()[0].row_bytes * static_cast<size_t>(model.kv_block_size());
  const std::vector<int32_t> blocks = {5, 2, 3, 11};
  std::vector<uint8_t> k(blocks.size() * bb), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint8_t>(i * 7 + 1);
    v[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  const int64_t layer = model.config().n_layer - 1;
  ASSERT_TRUE(model.copy_kv_blocks_in(layer, blocks, bb, k.data(), v.data()).ok());
  std::vector<uint8_t> one_k(bb), one_v(bb);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(model.copy_kv_out(layer, blocks[i], one_k.data(), one_v.data()).ok());
    EXPECT_TRUE(std::equal(one_k.begin(), one_k.end(), k.begin() + static_cast<ptrdiff_t>(i * bb))) << i;
    EXPECT_TRUE(std::equal(one_v.begin(), one_v.end(), v.begin() + static_cast<ptrdiff_t>(i * bb))) << i;
  }
  std::vector<uint8_t> k2(k.size()), v2(v.size());
  ASSERT_TRUE(model.copy_kv_blocks_out(layer, blocks, bb, k2.data(), v2.data()).ok());
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
  const std::vector<int32_t> bad = {1, model.n_kv_blocks()};
  EXPECT_FALSE(model.copy_kv_blocks_out(layer, bad, bb, k2.data(), v2.data()).ok());
}

TEST_F(CpuPagedModelTest, KvNumericsNameTheCpuAndItsInstructionSet) {
  auto m = open_llama(ModelOptions{});
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->kv_numerics(), std::string("cpu ") + cpu::isa_name(cpu::best_isa()) + " r4");
}

}  // namespace
}  // namespace rill
