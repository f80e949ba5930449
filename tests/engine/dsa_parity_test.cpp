// GLM-5 (glm_moe_dsa: multi-head latent attention plus DeepSeek sparse
// attention, index_topk 8, the third layer's indexer shared) on the tiny
// random model in ../shared/goldens/hf/glm-5.
//
// transformers breaks exact ties among index scores by where torch.topk's
// pivots fall over the whole forward call (tools/make_dsa_causal_golden.py
// says how), so its logits for a prompt depend on how the prompt was split;
// this golden has such ties from position 11 on (a key whose ReLU'd scores
// are all 0). rill selects by one total order over each token's own keys.
// So: the logits match transformers' golden up to the first tie (position
// 10) and tests/data/glm-5-causal (a numpy model that reproduces
// transformers' golden with its rule, run with rill's) at every position,
// with the prompt whole and in chunks of 7, 5 and 1, and the greedy
// continuation matches the latter; selection really drops keys; the cache
// holds [latent | rope key | indexer key] per token and layer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

constexpr int kFirstTie = 11;  // the golden's first position whose selection has a tie at the cut

Result<std::unique_ptr<Model>> open(const std::string& dir, int max_batch_tokens) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.max_batch_tokens = max_batch_tokens;
  opts.kv_block_size = 4;
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

std::vector<float> score(const std::string& dir, int chunk, const std::vector<int32_t>& prompt) {
  auto model = open(dir, chunk);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return {};
  SequenceRunner runner(**model);
  auto logits = runner.score(prompt);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  return logits.ok() ? *logits : std::vector<float>{};
}

double max_error(const std::vector<float>& logits, const test::HfGolden& g, size_t n_positions) {
  const size_t V = g.logits[0].size();
  double m = 0;
  EXPECT_GE(logits.size(), n_positions * V);
  for (size_t t = 0; t < n_positions && (t + 1) * V <= logits.size(); ++t)
    for (size_t i = 0; i < V; ++i) m = std::max(m, std::fabs(double(logits[t * V + i]) - g.logits[t][i]));
  return m;
}

class DsaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir("glm-5");
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    hf_ = test::read_hf_golden(dir_);
    causal_ = test::read_hf_golden(std::string(RILL_TEST_DATA) + "/glm-5-causal");
    ASSERT_EQ(causal_.prompt_ids, hf_.prompt_ids);
  }
  std::string dir_;
  test::HfGolden hf_, causal_;
};

TEST_F(DsaParity, LogitsMatchTheReferencesWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    const std::vector<float> logits = score(dir_, chunk, hf_.prompt_ids);
    const double before_tie = max_error(logits, hf_, kFirstTie);
    EXPECT_LT(before_tie, 1e-3) << "chunks of " << chunk << ": transformers, positions 0.." << kFirstTie - 1;
    const double err = test::max_golden_error(logits, causal_);
    EXPECT_LT(err, 1e-3) << "chunks of " << chunk << ": the causal reference, every position";
  }
}

TEST_F(DsaParity, GreedyTokensMatchTheCausalReference) {
  auto model = open(dir_, 7);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(causal_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(causal_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, causal_.greedy_ids);
}

// The golden's weights with an edited config.json, in a temp dir.
std::string with_config(const std::string& src, const std::function<void(nlohmann::json&)>& edit) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("rill_dsa_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

// With index_topk above the context every token attends to all its keys:
// the first index_topk positions (which attend to all of theirs anyway)
// keep their bits, every later one moves. So the selection is in force.
TEST_F(DsaParity, SelectionDropsKeysOnlyPastTopK) {
  const std::vector<float> sparse = score(dir_, 64, hf_.prompt_ids);
  const std::string dense_dir = with_config(dir_, [](nlohmann::json& c) { c["index_topk"] = 64; });
  const std::vector<float> dense = score(dense_dir, 64, hf_.prompt_ids);
  std::filesystem::remove_all(dense_dir);
  ASSERT_EQ(sparse.size(), dense.size());
  const size_t V = hf_.logits[0].size(), topk = 8;
  for (size_t t = 0; t < hf_.prompt_ids.size(); ++t) {
    double d = 0;
    for (size_t i = 0; i < V; ++i) d = std::max(d, std::fabs(double(sparse[t * V + i]) - dense[t * V + i]));
    if (t < topk) {
      EXPECT_EQ(d, 0.0) << "position " << t;
    } else {
      EXPECT_GT(d, 1e-4) << "position " << t;
    }
  }
}

// Per token and layer the cache keeps kv_lora_rank + qk_rope_head_dim +
// index_head_dim f32 values (16 + 8 + 16), split over the K and V planes;
// the shared layer keeps the same row (its indexer columns stay zero).
TEST_F(DsaParity, KvCacheHoldsTheIndexerKeys) {
  auto model = open(dir_, 8);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ((*model)->kv_bytes_per_token(), 3u * (16 + 8 + 16) * sizeof(float));
  const auto layers = (*model)->kv_layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].row_bytes, 20 * sizeof(float));
  ASSERT_EQ((*model)->kv_spec().size(), 1u);
}

}  // namespace
}  // namespace rill
