// The hybrid gated-DeltaNet family (Qwen3.5, Qwen3-Next) against the
// Hugging Face goldens in ../shared/goldens/hf: logits within 1e-3 at every
// prompt position whatever the prefill chunking, greedy ids identical; and
// the recurrent state's contracts: chunked prefill, batching with other
// sequences and resuming from a checkpoint give bit-identical logits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

constexpr int64_t kCtx = 64;

// One sequence's step: tokens [pos0, pos0 + n) of `ids`, every row sampled,
// in state slot `slot` and the KV blocks of slot `kv_slot` (default: the same).
void add_step(Batch& b, const std::vector<int32_t>& ids, int32_t pos0, int32_t n, int32_t slot, const Model& m,
              int32_t kv_slot = -1) {
  const int32_t s = b.add_sequence(ids.data() + pos0, n, pos0, false,
                                   slot_block_table(kv_slot >= 0 ? kv_slot : slot, kCtx, m.kv_block_size()));
  b.seqs[static_cast<size_t>(s)].state_slot = slot;
  for (int32_t i = 0; i < n; ++i) b.sample_rows.push_back(b.seqs[static_cast<size_t>(s)].q_start + i);
}

// Logits [ids.size() - from, V] of ids[from..] computed in steps of `chunk`
// tokens on `slot` (whose state must hold ids[0, from)).
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, int32_t chunk, int32_t slot, int32_t from = 0,
                       int32_t restore = -1, int32_t kv_slot = -1) {
  const auto V = static_cast<size_t>(m.n_vocab());
  std::vector<float> out;
  for (auto t = from; t < static_cast<int32_t>(ids.size()); t += chunk) {
    const int32_t n = std::min<int32_t>(chunk, static_cast<int32_t>(ids.size()) - t);
    Batch b;
    add_step(b, ids, t, n, slot, m, kv_slot);
    if (t == from) b.seqs[0].state_restore = restore;
    std::vector<float> logits(static_cast<size_t>(n) * V);
    Status st = m.forward(b, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

class HybridParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    golden_ = test::read_hf_golden(dir_);
    auto files = open_model_files(dir_);
    ASSERT_TRUE(files.ok()) << files.error().message;
    ModelOptions o;
    o.n_threads = 2;
    o.n_ctx = kCtx;
    o.max_batch_tokens = 48;
    o.n_kv_slots = 3;
    o.n_state_checkpoints = 2;
    auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
    ASSERT_TRUE(model.ok()) << model.error().message;
    model_ = std::move(model).value();
  }
  std::string dir_;
  test::HfGolden golden_;
  std::unique_ptr<Model> model_;
};

TEST_P(HybridParity, LogitsMatchTransformersAtEveryPositionWhateverTheChunking) {
  ASSERT_EQ(model_->kv_spec().size(), 2u);
  EXPECT_EQ(model_->kv_spec()[1].kind, LayerKind::kRecurrent);
  EXPECT_GT(model_->state_bytes(), 0u);
  const std::vector<float> whole = run(*model_, golden_.prompt_ids, 48, 0);
  const double max_err = test::max_golden_error(whole, golden_);
  EXPECT_LT(max_err, 1e-3) << GetParam();
  // Chunked prefill and token-by-token decode give the same state: bit-identical logits.
  for (int32_t chunk : {1, 5, 7}) EXPECT_EQ(run(*model_, golden_.prompt_ids, chunk, 1), whole) << "chunk " << chunk;
}

TEST_P(HybridParity, GreedyContinuationMatchesTransformers) {
  std::vector<int32_t> ids = golden_.prompt_ids;
  std::vector<float> last = run(*model_, ids, 7, 0);
  std::vector<int32_t> got;
  const auto V = static_cast<size_t>(model_->n_vocab());
  for (size_t n = 0; n < golden_.greedy_ids.size(); ++n) {
    const float* row = last.data() + last.size() - V;
    const auto id = static_cast<int32_t>(std::max_element(row, row + V) - row);
    got.push_back(id);
    ids.push_back(id);
    last = run(*model_, ids, 1, 0, static_cast<int32_t>(ids.size()) - 1);
  }
  EXPECT_EQ(got, golden_.greedy_ids) << GetParam();
}

TEST_P(HybridParity, BatchedSequencesGiveTheirAloneLogits) {
  const auto V = static_cast<size_t>(model_->n_vocab());
  const std::vector<int32_t>& a = golden_.prompt_ids;
  const std::vector<int32_t> b(a.rbegin(), a.rbegin() + 11);
  const auto alone_a = run(*model_, a, 48, 0);
  const auto alone_b = run(*model_, b, 48, 1);
  // a in steps of 9 tokens beside b's steps of 4 (b ends first), in slots swapped.
  std::vector<float> got_a, got_b;
  for (int32_t ta = 0, tb = 0; ta < static_cast<int32_t>(a.size());) {
    Batch batch;
    const int32_t nb = std::min<int32_t>(4, static_cast<int32_t>(b.size()) - tb);
    if (nb > 0) add_step(batch, b, tb, nb, 0, *model_);
    const int32_t na = std::min<int32_t>(9, static_cast<int32_t>(a.size()) - ta);
    add_step(batch, a, ta, na, 2, *model_);
    std::vector<float> logits(batch.sample_rows.size() * V);
    Status st = model_->forward(batch, logits.data());
    ASSERT_TRUE(st.ok()) << st.error().message;
    got_b.insert(got_b.end(), logits.begin(), logits.begin() + static_cast<long>(nb * V));
    got_a.insert(got_a.end(), logits.begin() + static_cast<long>(nb * V), logits.end());
    ta += na;
    tb += nb;
  }
  EXPECT_EQ(got_a, alone_a);
  EXPECT_EQ(got_b, alone_b);
}

TEST_P(HybridParity, ResumingFromACheckpointMatchesTheColdRun) {
  const auto V = static_cast<size_t>(model_->n_vocab());
  const std::vector<int32_t>& p = golden_.prompt_ids;
  const auto cold = run(*model_, p, 48, 0);
  // Saves after positions 7 and 15 in one 24-token step (mid-step snapshots).
  Batch batch;
  add_step(batch, p, 0, static_cast<int32_t>(p.size()), 1, *model_);
  batch.state_saves = {{0, 7, 0}, {0, 15, 1}};
  std::vector<float> logits(p.size() * V);
  ASSERT_TRUE(model_->forward(batch, logits.data()).ok());
  EXPECT_EQ(logits, cold);
  // Another state slot, restored from either checkpoint, computes the rest as
  // the cold run did (over the KV blocks that hold the prefix, as a prefix-cache hit).
  for (auto [ckpt, from] : {std::pair{1, 16}, std::pair{0, 8}}) {
    const auto resumed = run(*model_, p, 5, 2, from, ckpt, /*kv_slot=*/1);
    EXPECT_EQ(resumed, std::vector<float>(cold.begin() + static_cast<long>(from * V), cold.end())) << "from " << from;
  }
  // Malformed state fields are errors, not crashes.
  Batch bad;
  add_step(bad, p, 0, 4, 0, *model_);
  bad.seqs[0].state_slot = -1;
  EXPECT_FALSE(model_->forward(bad, logits.data()).ok());
  bad.seqs[0].state_slot = 0;
  bad.state_saves = {{0, 9, 0}};  // outside the step
  EXPECT_FALSE(model_->forward(bad, logits.data()).ok());
  bad.state_saves = {{0, 1, 2}};  // no such checkpoint
  EXPECT_FALSE(model_->forward(bad, logits.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(Hybrid, HybridParity, ::testing::Values("qwen3_5", "qwen3-next"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace rill
