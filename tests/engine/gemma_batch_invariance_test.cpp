// Batch invariance of the Gemma family through the engine: prompts of
// different lengths (most longer than the sliding window of 8) run alone,
// batched, and again from the prefix cache give exactly the tokens the
// unpaged SequenceRunner gives. Blocks of 4 tokens and a step budget of 10
// make batched prompts split into chunks at other places than alone, and
// make the sliding group give back blocks that left its window: the model
// sees those holes (-1 entries) in its sliding table, and the blocks go to
// other sequences, so reading one would change tokens. With k4c's q4c K
// (blocks of 32, per-sequence KV tails) the same holds, the prompts and
// their continuations crossing a block boundary.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

constexpr int kMaxTokens = 12;

// k: K's KV type (null: the checkpoint's); q4c makes blocks of 32.
Result<std::unique_ptr<Model>> open(const std::string& dir, int n_kv_slots = 1, const char* k = nullptr) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 64;
  opts.max_batch_tokens = 10;
  opts.kv_block_size = 4;
  opts.n_kv_slots = n_kv_slots;  // of 16 blocks (2 with q4c)
  if (k) opts.kv_types.k = parse_kv_type(k);
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

// Forwards to the model and records what the engine's batches held.
class RecordingModel final : public Model {
 public:
  explicit RecordingModel(std::unique_ptr<Model> m) : m_(std::move(m)) {}
  const ModelConfig& config() const override { return m_->config(); }
  int64_t n_vocab() const override { return m_->n_vocab(); }
  int64_t n_ctx() const override { return m_->n_ctx(); }
  int max_batch_tokens() const override { return m_->max_batch_tokens(); }
  int max_batch_seqs() const override { return m_->max_batch_seqs(); }
  const KvSpec& kv_spec() const override { return m_->kv_spec(); }
  int32_t kv_block_size() const override { return m_->kv_block_size(); }
  int32_t n_kv_blocks() const override { return m_->n_kv_blocks(); }
  size_t kv_bytes_per_token() const override { return m_->kv_bytes_per_token(); }
  int32_t n_kv_tail_slots() const override { return m_->n_kv_tail_slots(); }
  size_t kv_tail_bytes() const override { return m_->kv_tail_bytes(); }
  Status forward(const Batch& batch, float* logits) override {
    max_seqs = std::max(max_seqs, static_cast<int>(batch.seqs.size()));
    for (const BatchSeq& s : batch.seqs) {
      const auto sliding = batch.table(0, s), full = batch.table(1, s);
      for (size_t i = 0; i < sliding.size(); ++i) {
        sliding_holes += sliding[i] < 0;
        full_holes += full[i] < 0;
        same_block += sliding[i] >= 0 && sliding[i] == full[i];
      }
    }
    return m_->forward(batch, logits);
  }

  int max_seqs = 0;
  int64_t sliding_holes = 0, full_holes = 0, same_block = 0;

 private:
  std::unique_ptr<Model> m_;
};

// Deterministic prompts of these lengths over the golden's vocabulary.
std::vector<std::vector<int32_t>> make_prompts(int64_t n_vocab) {
  std::vector<std::vector<int32_t>> out;
  uint32_t state = 12345;
  for (int len : {3, 9, 17, 26, 33, 12, 41, 5}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) {
      state = state * 1664525u + 1013904223u;
      p.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(n_vocab)));
    }
    out.push_back(std::move(p));
  }
  return out;
}

class GemmaBatchInvariance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir(GetParam());
    if (!std::filesystem::exists(dir_ + "/golden.json")) GTEST_SKIP() << dir_ << " not found";
  }

  // n_kv_slots = 3: 48 blocks, fewer than the prompts' steps need at once
  // (blocks are reused, requests wait for blocks); 9: 144, more than all
  // eight requests ever allocate (130), so a second run hits the cache.
  void start_engine(int n_kv_slots, const char* k = nullptr) {
    auto model = open(dir_, n_kv_slots, k);
    ASSERT_TRUE(model.ok()) << model.error().message;
    ASSERT_EQ((*model)->kv_spec().size(), 2u);
    ASSERT_EQ((*model)->kv_spec()[0].kind, LayerKind::kSliding);
    auto recording = std::make_unique<RecordingModel>(std::move(model).value());
    recording_ = recording.get();
    prompts_ = make_prompts(recording->n_vocab());
    EngineOptions o;
    o.max_batch_tokens = 10;
    o.max_running = 8;
    o.check_integrity = true;
    auto e = Engine::create(std::move(recording), nullptr, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value();
  }

  // The tokens SequenceRunner (one fixed slot, no paging, no holes) gives.
  std::vector<std::vector<int32_t>> reference(const SamplingParams& sampling, const char* k = nullptr) {
    auto model = open(dir_, 1, k);
    EXPECT_TRUE(model.ok()) << model.error().message;
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : prompts_) {
      SequenceRunner runner(**model);
      GenerationOptions go;
      go.max_tokens = kMaxTokens;
      go.ignore_eos = true;
      go.sampling = sampling;
      auto r = runner.generate(p, go, [](int32_t) { return true; });
      EXPECT_TRUE(r.ok()) << r.error().message;
      out.push_back(r.ok() ? r->ids : std::vector<int32_t>{});
    }
    return out;
  }

  std::string dir_;
  RecordingModel* recording_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(GemmaBatchInvariance, GreedyTokensAreTheSameAloneBatchedAndUnpaged) {
  start_engine(3);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto want = reference(greedy);
  const auto alone = test::generate_all(*engine_, prompts_, greedy, false, 1, kMaxTokens);
  const auto batched = test::generate_all(*engine_, prompts_, greedy, true, 2, kMaxTokens);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    ASSERT_EQ(want[i].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(alone[i], want[i]) << "prompt " << i << " (" << prompts_[i].size() << " tokens) alone";
    EXPECT_EQ(batched[i], want[i]) << "prompt " << i << " (" << prompts_[i].size() << " tokens) batched";
  }
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
  EXPECT_GT(recording_->max_seqs, 1) << "prompts never shared a step";
  EXPECT_GT(recording_->sliding_holes, 0) << "the sliding group never gave a block back";
  EXPECT_EQ(recording_->full_holes, 0);
  EXPECT_EQ(recording_->same_block, 0) << "groups must hold distinct blocks";
}

// A prefix hit resumes both groups: the full group from its blocks, the
// sliding group from the blocks still inside the window (holes before it).
TEST_P(GemmaBatchInvariance, PrefixCacheHitsGiveTheSameTokens) {
  start_engine(9);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto alone = test::generate_all(*engine_, prompts_, greedy, false, 1, kMaxTokens);
  const int64_t cached_before = engine_->stats().cached_tokens;
  const auto cached = test::generate_all(*engine_, prompts_, greedy, true, 1, kMaxTokens);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ(cached[i], alone[i]) << "prompt " << i << " (" << prompts_[i].size() << " tokens) from the cache";
  }
  const EngineStats st = engine_->stats();
  EXPECT_EQ(cached_before, 0);
  // Every prompt but the 3-token one has a whole block to reuse.
  EXPECT_GE(st.cached_tokens, 4 * static_cast<int64_t>(prompts_.size() - 1));
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

TEST_P(GemmaBatchInvariance, SeededSamplingIsTheSameAloneAndBatched) {
  start_engine(3);
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_p = 0.95f;
  s.seed = 7;
  const auto alone = test::generate_all(*engine_, prompts_, s, false, 1, kMaxTokens);
  const auto batched = test::generate_all(*engine_, prompts_, s, true, 2, kMaxTokens);
  for (size_t i = 0; i < prompts_.size(); ++i) EXPECT_EQ(batched[i], alone[i]) << "prompt " << i;
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
}

// k4c's q4c K (model/kv_tails.h): blocks of 32, so the sliding group
// gives back [0, 32) once a sequence passes 39; 3 slots: 6 blocks and 3
// tails, requests wait for both; 20 slots: room for the prefix cache to
// keep every prompt's first block.
TEST_P(GemmaBatchInvariance, K4cTokensAreTheSameAloneBatchedCachedAndUnpaged) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  start_engine(3, "q4c");
  const auto want = reference(greedy, "q4c");
  const auto alone = test::generate_all(*engine_, prompts_, greedy, false, 1, kMaxTokens);
  const auto batched = test::generate_all(*engine_, prompts_, greedy, true, 2, kMaxTokens);
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
  EXPECT_GT(recording_->max_seqs, 1) << "prompts never shared a step";
  EXPECT_GT(recording_->sliding_holes, 0) << "the sliding group never gave a block back";
  start_engine(20, "q4c");
  const auto cold = test::generate_all(*engine_, prompts_, greedy, false, 1, kMaxTokens);
  const auto cached = test::generate_all(*engine_, prompts_, greedy, true, 1, kMaxTokens);
  EXPECT_EQ(engine_->stats().cached_tokens, 2 * 32) << "the 33- and 41-token prompts' first blocks";
  EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    ASSERT_EQ(want[i].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(alone[i], want[i]) << "prompt " << i << " (" << prompts_[i].size() << " tokens) alone";
    EXPECT_EQ(batched[i], want[i]) << "prompt " << i << " batched";
    EXPECT_EQ(cold[i], want[i]) << "prompt " << i << " cold";
    EXPECT_EQ(cached[i], want[i]) << "prompt " << i << " from the prefix cache";
  }
}

INSTANTIATE_TEST_SUITE_P(GemmaFamily, GemmaBatchInvariance,
                         ::testing::Values("gemma2", "gemma3", "gemma4", "gemma4-moe"));

}  // namespace
}  // namespace rill
