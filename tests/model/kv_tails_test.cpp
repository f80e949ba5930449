// k4c KV on the default model (model/kv_tails.h): a query reads its own
// block's keys and values from q8_0 rows (the sequence's tail and the
// step's rows), the earlier blocks quantized, so how a sequence is chunked
// (prompts of 31, 32, 33, 65 tokens, steps across and onto block
// boundaries, one token at a time) and which sequences share its steps
// change no logit; and the batches a tail cannot serve are refused naming
// the slot.
#include <gtest/gtest.h>

#include <climits>
#include <filesystem>
#include <random>
#include <vector>

#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kSmol = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr int32_t kCtx = 128;

std::vector<int32_t> tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 49152);
  return t;
}

// The default model with KV pair `pair` (k4c, or k4a calibrated on
// `calibration`: random tokens unless given).
Result<std::unique_ptr<Model>> try_open(const char* pair, std::vector<int32_t> calibration = tokens(200, 99),
                                        int max_batch_tokens = 256) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(kSmol));
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = kCtx;
  o.n_kv_slots = 2;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_types.k = parse_kv_pair(pair)->k;
  o.kv_types.v = parse_kv_pair(pair)->v;
  o.kv_types.calibration_tokens = std::move(calibration);
  return create_model(builtin_registry(), infer_profile(*files), files, o);
}

std::unique_ptr<Model> open_k4c(const char* pair = "k4c") {
  auto m = try_open(pair);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m).value() : nullptr;
}

// One step's worth of a sequence: tokens [c0, c1) in tail slot `slot`
// (its own fixed blocks), every row sampled.
void add_step(Batch& b, const std::vector<int32_t>& ids, int32_t c0, int32_t c1, int32_t slot) {
  const std::vector<int32_t> table = slot_block_table(slot, kCtx, 32);
  const int32_t first_row = b.n_tokens();
  b.add_sequence(ids.data() + c0, c1 - c0, c0, false, table);
  b.seqs.back().kv_tail = slot;
  b.seqs.back().decode_from = static_cast<int32_t>(ids.size());
  for (int32_t r = first_row; r < b.n_tokens(); ++r) b.sample_rows.push_back(r);
}

// Every row's logits of `ids` computed in the steps between `cuts`.
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, const std::vector<int32_t>& cuts, int32_t slot) {
  const auto V = static_cast<size_t>(m.n_vocab());
  std::vector<float> out(ids.size() * V);
  Batch b;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    b.clear();
    add_step(b, ids, cuts[i], cuts[i + 1], slot);
    const Status st = m.forward(b, out.data() + static_cast<size_t>(cuts[i]) * V);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  return out;
}

// Each test of the tails runs on k4c and k4a (the same flow, q4a's K).
class KvTailsOf : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Pair, KvTailsOf, ::testing::Values("k4c", "k4a"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

TEST_P(KvTailsOf, ChunkingAcrossBlockBoundariesChangesNoLogit) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  auto m = open_k4c(GetParam());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kv_block_size(), 32) << "q4c pools have blocks of its group";
  EXPECT_EQ(m->n_kv_tail_slots(), 2) << "n_kv_slots: max_batch_seqs unset (not max_batch_tokens' 256)";
  EXPECT_EQ(m->kv_bytes_per_token(), 30u * (114 + 99));
  const auto ids = tokens(65, 1);
  const std::vector<float> whole = run(*m, ids, {0, 65}, 0);
  // Prompts of 31, 32, 33 and 65 tokens continued a token at a time; steps
  // ending on, just before and just after block boundaries.
  for (const std::vector<int32_t>& cuts :
       {std::vector<int32_t>{0, 31, 32, 33, 34, 65}, std::vector<int32_t>{0, 32, 33, 64, 65},
        std::vector<int32_t>{0, 33, 40, 63, 64, 65}}) {
    const std::vector<float> chunked = run(*m, ids, cuts, 1);
    ASSERT_EQ(chunked, whole) << "cuts " << cuts[1] << ", " << cuts[2] << ", ...";
  }
}

TEST_P(KvTailsOf, SequencesSharingStepsEqualAlone) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  auto m = open_k4c(GetParam());
  ASSERT_TRUE(m);
  const auto a = tokens(65, 2), b = tokens(50, 3);
  const std::vector<float> alone_a = run(*m, a, {0, 33, 65}, 0);
  const std::vector<float> alone_b = run(*m, b, {0, 20, 50}, 1);
  // Together: A's steps [0, 33), [33, 65) beside B's [0, 20), [20, 50).
  const auto V = static_cast<size_t>(m->n_vocab());
  std::vector<float> out((33 + 20) * V), out2((32 + 30) * V);
  Batch batch;
  add_step(batch, a, 0, 33, 0);
  add_step(batch, b, 0, 20, 1);
  ASSERT_TRUE(m->forward(batch, out.data()).ok());
  batch.clear();
  add_step(batch, b, 20, 50, 1);
  add_step(batch, a, 33, 65, 0);
  ASSERT_TRUE(m->forward(batch, out2.data()).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 33 * V, alone_a.begin()));
  EXPECT_TRUE(std::equal(out.begin() + 33 * V, out.end(), alone_b.begin()));
  EXPECT_TRUE(std::equal(out2.begin(), out2.begin() + 30 * V, alone_b.begin() + 20 * V));
  EXPECT_TRUE(std::equal(out2.begin() + 30 * V, out2.end(), alone_a.begin() + 33 * V));
}

TEST(KvTails, BatchesATailCannotServeAreRefused) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  auto m = open_k4c();
  ASSERT_TRUE(m);
  const auto ids = tokens(50, 4);
  std::vector<float> out(50 * static_cast<size_t>(m->n_vocab()));
  Batch b;
  add_step(b, ids, 0, 8, 0);
  b.seqs.back().kv_tail = -1;
  Status st = m->forward(b, out.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("KV tail slot -1"), std::string::npos) << st.error().message;
  // Two sequences of a step cannot share a tail.
  b.clear();
  add_step(b, ids, 0, 8, 0);
  add_step(b, ids, 0, 8, 0);
  st = m->forward(b, out.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("also sequence 0's"), std::string::npos) << st.error().message;
  // Slot 1 computed [0, 40): its tail holds [32, 40). Continuing at 19 or
  // 45 would need keys it no longer (or never) held; 36 and 32 are fine.
  run(*m, ids, {0, 40}, 1);
  for (const int32_t c0 : {19, 45}) {
    b.clear();
    add_step(b, ids, c0, c0 + 1, 1);
    st = m->forward(b, out.data());
    ASSERT_FALSE(st.ok()) << c0;
    EXPECT_NE(st.error().message.find("holds positions [32, 40)"), std::string::npos) << st.error().message;
  }
  b.clear();
  add_step(b, ids, 36, 40, 1);  // rewinding within the tail's block is fine
  EXPECT_TRUE(m->forward(b, out.data()).ok());
  b.clear();
  add_step(b, ids, 32, 40, 1);
  EXPECT_TRUE(m->forward(b, out.data()).ok());
}

// Families whose forward does not keep KV tails (Qwen3-Next's) refuse k4c
// at load, naming it (the Gemma family's CPU model takes it:
// gemma_kv_tails_test.cpp).
TEST(KvTails, OtherFamiliesRefuseK4cByName) {
  const std::string dir = std::string(RILL_SHARED_DIR) + "/goldens/hf/qwen3-next";
  if (!fs::exists(dir)) GTEST_SKIP() << "golden missing: " << dir;
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 2;
  o.kv_types.k = parse_kv_pair("k4c")->k;  // q4c K alone: the golden's rows of 32 hold no iq4_nlh64 block
  auto m = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("q4c (k4c)"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("not on qwen3_next.cpu"), std::string::npos) << m.error().message;
}

// q4a's widths come from the calibration tokens alone: the same tokens
// give the same widths (the numerics' hash), whatever the step size of the
// pass; other tokens other widths; too few tokens are refused.
TEST(KvTails, K4aCalibrationIsDeterministicAndNamedInTheNumerics) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  auto a = try_open("k4a", tokens(200, 5));
  auto b = try_open("k4a", tokens(200, 5), /*max_batch_tokens=*/40);
  auto c = try_open("k4a", tokens(200, 6));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::string na = (*a)->kv_numerics();
  EXPECT_NE(na.find(" q4a-widths="), std::string::npos) << na;
  EXPECT_EQ((*b)->kv_numerics(), na) << "the pass in steps of 40 tokens";
  EXPECT_NE((*c)->kv_numerics(), na);
  auto k4c = try_open("k4c");
  ASSERT_TRUE(k4c.ok());
  EXPECT_EQ((*k4c)->kv_numerics().find("q4a"), std::string::npos);
  auto few = try_open("k4a", tokens(63, 5));
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.error().message.find("at least 64 tokens"), std::string::npos) << few.error().message;
}

}  // namespace
}  // namespace rill
