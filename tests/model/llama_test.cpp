// The Llama family implementation: batch invariance of the flat Batch, and
// clear errors when the files and the config disagree.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

Result<std::unique_ptr<Model>> open(const std::string& dir, ModelOptions opts) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

std::vector<int32_t> prompt_of(const std::string& family) {
  std::ifstream in(kGoldens + family + "/golden.json");
  return nlohmann::json::parse(in)["prompt_ids"].get<std::vector<int32_t>>();
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

// Scattered block tables (4 blocks of 16 = 64 tokens per sequence): paged
// KV must not care where a sequence's blocks are.
const std::vector<int32_t> kTables[3] = {{11, 2, 7, 4}, {0, 9, 5, 1}, {3, 10, 6, 8}};

void add(Batch& b, int32_t slot, const int32_t* ids, int32_t n, int32_t pos0) {
  b.add_sequence(ids, n, pos0, true, kTables[slot]);
}

// Two sequences of different lengths in one Batch give, row for row, the
// logits each gives alone, on the prefill step and on a batched decode step.
TEST_P(BatchInvariance, BatchedRowsEqualSingleSequenceRows) {
  const std::string dir = kGoldens + GetParam();
  if (!fs::exists(dir)) GTEST_SKIP();
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.n_kv_slots = 3;
  auto model = open(dir, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  const auto ids = prompt_of(GetParam());
  const int32_t n_a = 17, n_b = 9;
  const size_t V = static_cast<size_t>(m.n_vocab());

  // Alone: sequence A in slot 0, sequence B in slot 1.
  std::vector<float> alone_a(V), alone_b(V), batched(2 * V);
  Batch b;
  add(b, 0, ids.data(), n_a, 0);
  ASSERT_TRUE(m.forward(b, alone_a.data()).ok());
  b.clear();
  add(b, 1, ids.data() + 3, n_b, 0);
  ASSERT_TRUE(m.forward(b, alone_b.data()).ok());

  // Together, into slot 2 (A) and slot 1 again (B overwrites its own KV).
  b.clear();
  add(b, 2, ids.data(), n_a, 0);
  add(b, 1, ids.data() + 3, n_b, 0);
  ASSERT_TRUE(m.forward(b, batched.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(batched[i], alone_a[i]) << "sequence A, logit " << i;
    ASSERT_EQ(batched[V + i], alone_b[i]) << "sequence B, logit " << i;
  }

  // One decode step each: alone (slot 0 / slot 1) vs batched (slot 2 / slot 1).
  const int32_t next_a = 5, next_b = 7;
  std::vector<float> step_a(V), step_b(V), step_ab(2 * V);
  b.clear();
  add(b, 0, &next_a, 1, n_a);
  ASSERT_TRUE(m.forward(b, step_a.data()).ok());
  b.clear();
  add(b, 2, &next_a, 1, n_a);
  add(b, 1, &next_b, 1, n_b);
  ASSERT_TRUE(m.forward(b, step_ab.data()).ok());
  b.clear();
  add(b, 1, &next_b, 1, n_b);  // recompute B's step alone (same position, same KV before)
  ASSERT_TRUE(m.forward(b, step_b.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(step_ab[i], step_a[i]) << "decode A, logit " << i;
    ASSERT_EQ(step_ab[V + i], step_b[i]) << "decode B, logit " << i;
  }
}

// A decode step of 10 sequences on 2 threads runs as two lanes of 5
// (forward() splits decode steps of 8+); every row must still be the
// sequence's alone logits, bit for bit, including the lane boundary.
TEST_P(BatchInvariance, DecodeLanesGiveEachSequenceItsAloneLogits) {
  const std::string dir = kGoldens + GetParam();
  if (!fs::exists(dir)) GTEST_SKIP();
  constexpr int32_t kSeqs = 10, kBlocksPerSeq = 4;
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.n_kv_slots = kSeqs;
  auto model = open(dir, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  ASSERT_GE(m.n_kv_blocks(), kSeqs * kBlocksPerSeq);
  const auto ids = prompt_of(GetParam());
  const size_t V = static_cast<size_t>(m.n_vocab());
  // Sequence i: its own blocks (reversed, so tables are not in order), a
  // prompt of 6 + i tokens from the golden prompt, then one decode token.
  std::vector<std::vector<int32_t>> tables(kSeqs);
  for (int32_t i = 0; i < kSeqs; ++i)
    for (int32_t b = kBlocksPerSeq - 1; b >= 0; --b) tables[i].push_back(i * kBlocksPerSeq + b);
  std::vector<float> logits(V * kSeqs);
  Batch b;
  for (int32_t i = 0; i < kSeqs; ++i) {
    b.clear();
    b.add_sequence(ids.data(), 6 + i, 0, true, tables[i]);
    ASSERT_TRUE(m.forward(b, logits.data()).ok());
  }
  const int32_t next[kSeqs] = {5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  std::vector<float> alone(V * kSeqs), together(V * kSeqs);
  for (int32_t i = 0; i < kSeqs; ++i) {
    b.clear();
    b.add_sequence(&next[i], 1, 6 + i, true, tables[i]);
    ASSERT_TRUE(m.forward(b, alone.data() + i * V).ok());
  }
  b.clear();  // the same step batched (each rewrites the K/V row it wrote alone)
  for (int32_t i = 0; i < kSeqs; ++i) b.add_sequence(&next[i], 1, 6 + i, true, tables[i]);
  ASSERT_TRUE(m.forward(b, together.data()).ok());
  for (int32_t i = 0; i < kSeqs; ++i)
    for (size_t j = 0; j < V; ++j)
      ASSERT_EQ(together[i * V + j], alone[i * V + j]) << "sequence " << i << ", logit " << j;
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, BatchInvariance, ::testing::Values("llama", "qwen3", "mistral-swa"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(LlamaModel, ConfigThatDisagreesWithTheTensorsNamesFileAndTensor) {
  const std::string src = kGoldens + "llama";
  if (!fs::exists(src)) GTEST_SKIP();
  const fs::path dir = fs::temp_directory_path() / ("rill_bad_config_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src + "/model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  std::ifstream in(src + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  cfg["intermediate_size"] = 96;  // the tensors say 128
  std::ofstream(dir / "config.json") << cfg.dump();
  auto model = open(dir.string(), ModelOptions{});
  ASSERT_FALSE(model.ok());
  const std::string& msg = model.error().message;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mlp.gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(LlamaModel, OutOfRangeTokensAndPositionsAreErrors) {
  const std::string dir = kGoldens + "llama";
  if (!fs::exists(dir)) GTEST_SKIP();
  ModelOptions opts;
  opts.n_ctx = 16;
  auto model = open(dir, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<float> logits((*model)->n_vocab());
  Batch b;
  const int32_t bad_id = 100000;
  const auto table = slot_block_table(0, 16, (*model)->kv_block_size());
  b.add_sequence(&bad_id, 1, 0, true, table);
  auto st = (*model)->forward(b, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("outside the vocabulary"), std::string::npos);
  b.clear();
  const int32_t ok_id = 1;
  b.add_sequence(&ok_id, 1, 16, true, table);
  st = (*model)->forward(b, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("outside the context"), std::string::npos);
}

}  // namespace
}  // namespace rill
