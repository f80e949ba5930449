// bert.cpu against sentence-transformers (tools/make_embedding_goldens.py):
// all-MiniLM-L6-v2 on the golden texts' token ids, cosine >= 0.9999 per
// text, batched and alone, and a sequence's bits independent of its batch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/registry.h"

namespace rill {
namespace {

const std::string kModelDir = std::string(RILL_MODEL_DIR) + "/all-MiniLM-L6-v2";
const std::string kGolden = std::string(RILL_TEST_DATA) + "/embeddings/all-minilm-l6-v2.json";

double cosine(const float* a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class BertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModelDir)) GTEST_SKIP() << kModelDir << " not found (run scripts/setup.sh)";
    std::ifstream in(kGolden);
    ASSERT_TRUE(in) << kGolden;
    golden_ = nlohmann::json::parse(in);
    auto files = open_model_files(kModelDir);
    ASSERT_TRUE(files.ok()) << files.error().message;
    ModelOptions o;
    o.n_threads = 2;
    o.max_batch_tokens = 1024;
    auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
    ASSERT_TRUE(model.ok()) << model.error().message;
    model_ = std::move(*model);
  }

  // Embeds the golden cases `which` in one batch.
  std::vector<float> embed(const std::vector<size_t>& which) {
    Batch batch;
    for (size_t c : which) {
      std::vector<int32_t> ids = golden_["cases"][c]["embedded_ids"].get<std::vector<int32_t>>();
      batch.pool_seqs.push_back(batch.add_sequence(ids.data(), static_cast<int32_t>(ids.size()), 0, false, {}));
    }
    std::vector<float> out(which.size() * static_cast<size_t>(model_->embedding().n_dims));
    Status st = model_->forward_pooled(batch, nullptr, out.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    return out;
  }

  nlohmann::json golden_;
  std::unique_ptr<Model> model_;
};

TEST_F(BertTest, DeclaresMeanPoolingNormalizedAndTheSentenceTransformersLength) {
  const EmbeddingSpec spec = model_->embedding();
  EXPECT_EQ(spec.pooling, EmbeddingSpec::Pooling::kMean);
  EXPECT_TRUE(spec.normalize);
  EXPECT_TRUE(spec.bidirectional);
  EXPECT_EQ(spec.n_dims, golden_["dimensions"].get<int64_t>());
  EXPECT_EQ(model_->n_ctx(), golden_["max_seq_length"].get<int64_t>());
}

TEST_F(BertTest, MatchesSentenceTransformersAloneAndBatched) {
  const size_t n = golden_["cases"].size();
  const auto dims = static_cast<size_t>(model_->embedding().n_dims);
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  const std::vector<float> batched = embed(all);
  for (size_t c = 0; c < n; ++c) {
    const std::vector<float> want = golden_["cases"][c]["embedding"].get<std::vector<float>>();
    const std::vector<float> alone = embed({c});
    const double cos = cosine(alone.data(), want);
    EXPECT_GE(cos, 0.9999) << "case " << c << ": " << golden_["cases"][c]["text"];
    double norm = 0;
    for (float v : alone) norm += double(v) * v;
    EXPECT_NEAR(norm, 1.0, 1e-5);
    // Batch invariance: the same bits whatever else the step holds.
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data() + c * dims, dims * sizeof(float))) << "case " << c;
  }
}

TEST_F(BertTest, RefusesLogitsAndChunkedSequences) {
  Batch batch;
  const int32_t ids[] = {101, 1037, 102};
  batch.add_sequence(ids, 3, 0, true, {});
  std::vector<float> logits(static_cast<size_t>(model_->n_vocab()));
  EXPECT_FALSE(model_->forward(batch, logits.data()).ok());
  Batch chunk;
  chunk.add_sequence(ids, 2, 1, false, {});  // positions 1..2 of a 3-token sequence
  EXPECT_FALSE(model_->forward_pooled(chunk, nullptr, nullptr).ok());
}

TEST(BertRegistry, EncoderProfileIsExplicitAndCudaRefusesCleanly) {
  if (!std::filesystem::exists(kModelDir)) GTEST_SKIP() << kModelDir << " not found (run scripts/setup.sh)";
  auto files = open_model_files(kModelDir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  const ModelProfile profile = infer_profile(**files);
  EXPECT_EQ(profile.graph, "bert");
  EXPECT_EQ(profile.generation_loop, "encoder");
  auto cpu = builtin_registry().select(profile, Device::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ((*cpu)->id, "bert.cpu");
  ModelOptions o;
  o.device = Device::kCuda;
  auto cuda = create_model(builtin_registry(), profile, *files, o);
  ASSERT_FALSE(cuda.ok());
  EXPECT_NE(cuda.error().message.find("bert.cuda"), std::string::npos) << cuda.error().message;
  // An autoregressive profile of the graph is refused, never run as an encoder.
  ModelProfile generate = profile;
  generate.generation_loop = "autoregressive";
  EXPECT_FALSE(builtin_registry().select(generate, Device::kCpu).ok());
}

}  // namespace
}  // namespace rill
