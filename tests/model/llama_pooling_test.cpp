// Decoder embeddings on llama.cpu: a decoder pools only when its files
// declare a pooling (here the tiny transformers-golden Llama given a
// sentence-transformers modules.json), and then the pooled vector is the
// final-normed hidden state transformers computes: its product with the LM
// head is the golden logits row (last-token pooling) or the mean of the
// golden rows (mean pooling), up to the L2 normalization.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/registry.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kGoldenDir = std::string(RILL_SHARED_DIR) + "/goldens/hf/llama";

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A copy of the golden model directory declaring `mode` pooling + Normalize.
std::string with_pooling(const std::string& mode) {
  const fs::path dir = fs::temp_directory_path() / ("rill_llama_pooling_" + mode + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(kGoldenDir) / f, dir / f);
  write(dir / "modules.json",
        R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])");
  write(dir / "1_Pooling" / "config.json", "{\"word_embedding_dimension\": 64, \"pooling_mode_" + mode + "\": true}");
  return dir.string();
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class LlamaPooling : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaPooling, PooledStateTimesLmHeadIsTheGoldenLogits) {
  if (!fs::exists(kGoldenDir + "/golden.json")) GTEST_SKIP() << kGoldenDir << " not found";
  const std::string mode = GetParam();
  const std::string dir = with_pooling(mode);
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 1;
  o.n_ctx = 64;
  o.max_batch_tokens = 64;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const EmbeddingSpec spec = (*model)->embedding();
  ASSERT_EQ(spec.pooling, mode == "lasttoken" ? EmbeddingSpec::Pooling::kLast : EmbeddingSpec::Pooling::kMean);
  EXPECT_TRUE(spec.normalize);
  EXPECT_FALSE(spec.bidirectional);

  std::ifstream in(kGoldenDir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto ids = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto n = static_cast<int32_t>(ids.size());
  Batch batch;
  batch.pool_seqs.push_back(
      batch.add_sequence(ids.data(), n, 0, false, slot_block_table(0, o.n_ctx, (*model)->kv_block_size())));
  const auto E = static_cast<size_t>(spec.n_dims);
  std::vector<float> pooled(E);
  Status st = (*model)->forward_pooled(batch, nullptr, pooled.data());
  ASSERT_TRUE(st.ok()) << st.error().message;
  double norm = 0;
  for (float v : pooled) norm += double(v) * v;
  EXPECT_NEAR(norm, 1.0, 1e-5);

  // logits = lm_head . hidden: compare lm_head . pooled with the golden.
  const TensorRef* head = (*files)->find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_EQ(head->dtype, DType::kF32);
  const auto n_vocab = static_cast<size_t>(head->shape[0]);
  std::vector<double> got(n_vocab), want(n_vocab, 0.0);
  for (size_t r = 0; r < n_vocab; ++r) {
    const auto* w = reinterpret_cast<const float*>(head->data) + r * E;
    for (size_t c = 0; c < E; ++c) got[r] += double(w[c]) * pooled[c];
  }
  for (int32_t t = (mode == "lasttoken" ? n - 1 : 0); t < n; ++t) {
    const auto row = golden["logits"][static_cast<size_t>(t)].get<std::vector<double>>();
    for (size_t r = 0; r < n_vocab; ++r) want[r] += row[r];
  }
  EXPECT_GE(cosine(got, want), 0.99999);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, LlamaPooling, ::testing::Values("lasttoken", "mean_tokens"));

}  // namespace
}  // namespace rill
