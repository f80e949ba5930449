// The gpt-oss family against Hugging Face transformers on the tiny random
// model in ../shared/goldens/hf/gpt-oss (alternating sliding (window 8) and
// full layers with sink logits, q/k/v/o biases, YaRN with truncate false,
// 4 experts with biases and the clamped SwiGLU, top-2 routing with a router
// bias): logits within 1e-3 at every prompt position with the prompt in one
// step and in chunks of 7, 5 and 1 tokens, the greedy continuation
// identical; through the engine, prompts of different lengths (most longer
// than the window; a step budget of 10 tokens chunks them across it) give
// the same tokens alone, batched and from the prefix cache; a prefix-cache
// hit (a second sequence resuming over the first one's blocks) gives the
// cold run's logits bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

constexpr int32_t kBlock = 4;
constexpr int64_t kCtx = 64;

Result<std::unique_ptr<Model>> open(int max_batch_tokens, int n_kv_slots = 1) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(test::hf_golden_dir("gpt-oss")));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = kCtx;
  opts.max_batch_tokens = max_batch_tokens;
  opts.kv_block_size = kBlock;  // the window of 8 spans several blocks
  opts.n_kv_slots = n_kv_slots;
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

class GptOss : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::has_hf_golden(test::hf_golden_dir("gpt-oss"))) GTEST_SKIP() << "gpt-oss golden not found";
    golden_ = test::read_hf_golden(test::hf_golden_dir("gpt-oss"));
  }
  test::HfGolden golden_;
};

TEST_F(GptOss, LogitsMatchTransformersAtEveryPositionWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    auto model = open(chunk);
    ASSERT_TRUE(model.ok()) << model.error().message;
    ASSERT_EQ((*model)->kv_spec().size(), 2u) << "sliding and full groups";
    EXPECT_EQ((*model)->kv_spec()[0].kind, LayerKind::kSliding);
    SequenceRunner runner(**model);
    auto logits = runner.score(golden_.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const double max_err = test::max_golden_error(*logits, golden_);
    EXPECT_LT(max_err, 1e-3) << "chunks of " << chunk << ": max |logit - reference| = " << max_err;
    RecordProperty("max_error_chunks_of_" + std::to_string(chunk), std::to_string(max_err));
  }
}

// The attention sinks run in the f32 kernels only: a quantized KV type is
// refused at load rather than run without its sinks; f32 is accepted.
TEST_F(GptOss, QuantizedKvTypesAreRefused) {
  auto files = open_model_files(test::hf_golden_dir("gpt-oss"));
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = kCtx;
  opts.kv_block_size = kBlock;
  opts.kv_types.v = parse_kv_type("q8_0");
  auto m = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("sinks"), std::string::npos) << m.error().message;
  opts.kv_types.k = opts.kv_types.v = parse_kv_type("f32");
  auto f32 = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  EXPECT_TRUE(f32.ok()) << f32.error().message;
}

TEST_F(GptOss, GreedyTokensMatchTransformers) {
  auto model = open(7);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(golden_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(golden_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, golden_.greedy_ids);
}

// A sequence's step: tokens [pos0, pos0 + n) of ids, every row sampled, over
// slot `slot`'s blocks in both groups (group 0 sliding, group 1 full).
void add_step(Batch& b, const std::vector<int32_t>& ids, int32_t pos0, int32_t n, int32_t slot) {
  const std::vector<int32_t> table = slot_block_table(slot, kCtx, kBlock);
  const int32_t s = b.add_sequence(ids.data() + pos0, n, pos0, false, table);
  b.group_tables.resize(1);
  b.group_tables[0].resize(static_cast<size_t>(b.seqs[static_cast<size_t>(s)].table_start));
  b.group_tables[0].insert(b.group_tables[0].end(), table.begin(), table.end());
  for (int32_t i = 0; i < n; ++i) b.sample_rows.push_back(b.seqs[static_cast<size_t>(s)].q_start + i);
}

// Logits of ids[from..] in steps of `chunk` tokens on slot `slot` (whose
// blocks must hold ids[0, from)).
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, int32_t chunk, int32_t slot, int32_t from = 0) {
  const auto V = static_cast<size_t>(m.n_vocab());
  std::vector<float> out;
  for (int32_t t = from; t < static_cast<int32_t>(ids.size()); t += chunk) {
    const int32_t n = std::min<int32_t>(chunk, static_cast<int32_t>(ids.size()) - t);
    Batch b;
    add_step(b, ids, t, n, slot);
    std::vector<float> logits(static_cast<size_t>(n) * V);
    Status st = m.forward(b, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

TEST_F(GptOss, ChunkedAndResumedRunsGiveTheColdLogitsBitForBit) {
  auto model = open(32, 2);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const std::vector<int32_t>& p = golden_.prompt_ids;
  const auto V = static_cast<size_t>((*model)->n_vocab());
  const auto cold = run(**model, p, 32, 0);
  EXPECT_LT(test::max_golden_error(cold, golden_), 1e-3);
  for (int32_t chunk : {1, 5, 7}) EXPECT_EQ(run(**model, p, chunk, 1), cold) << "chunks of " << chunk;
  // Slot 1 holds the prompt's KV (the chunked runs above): resuming at a
  // block boundary computes the rest as the cold run did (a prefix hit).
  for (int32_t from : {8, 12, 20}) {
    const auto resumed = run(**model, p, 5, 1, from);
    EXPECT_EQ(resumed, std::vector<float>(cold.begin() + static_cast<long>(from * V), cold.end())) << "from " << from;
  }
}

TEST_F(GptOss, BatchedSequencesGiveTheirAloneLogits) {
  auto model = open(32, 3);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto V = static_cast<size_t>((*model)->n_vocab());
  const std::vector<int32_t>& a = golden_.prompt_ids;
  const std::vector<int32_t> b(a.rbegin(), a.rbegin() + 11);
  const auto alone_a = run(**model, a, 32, 0);
  const auto alone_b = run(**model, b, 32, 1);
  std::vector<float> got_a, got_b;
  for (int32_t ta = 0, tb = 0; ta < static_cast<int32_t>(a.size());) {
    Batch batch;
    const int32_t nb = std::min<int32_t>(4, static_cast<int32_t>(b.size()) - tb);
    if (nb > 0) add_step(batch, b, tb, nb, 0);
    const int32_t na = std::min<int32_t>(9, static_cast<int32_t>(a.size()) - ta);
    add_step(batch, a, ta, na, 2);
    std::vector<float> logits(batch.sample_rows.size() * V);
    Status st = (*model)->forward(batch, logits.data());
    ASSERT_TRUE(st.ok()) << st.error().message;
    got_b.insert(got_b.end(), logits.begin(), logits.begin() + static_cast<long>(nb * V));
    got_a.insert(got_a.end(), logits.begin() + static_cast<long>(nb * V), logits.end());
    ta += na;
    tb += nb;
  }
  EXPECT_EQ(got_a, alone_a);
  EXPECT_EQ(got_b, alone_b);
}

// Deterministic prompts of these lengths over the golden's vocabulary.
std::vector<std::vector<int32_t>> make_prompts(int64_t n_vocab) {
  std::vector<std::vector<int32_t>> out;
  uint32_t state = 4242;
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

// Through the engine (max_batch_tokens 10, blocks of 4: prompts are
// chunked across the window and the sliding group gives blocks back):
// alone, batched and from the prefix cache equal the unpaged SequenceRunner.
TEST_F(GptOss, EngineGivesTheSameTokensAloneBatchedAndFromThePrefixCache) {
  constexpr int kMaxTokens = 10;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto ref_model = open(10);
  ASSERT_TRUE(ref_model.ok()) << ref_model.error().message;
  const auto prompts = make_prompts((*ref_model)->n_vocab());
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    SequenceRunner runner(**ref_model);
    GenerationOptions go;
    go.max_tokens = kMaxTokens;
    go.ignore_eos = true;
    go.sampling = greedy;
    auto r = runner.generate(p, go, [](int32_t) { return true; });
    ASSERT_TRUE(r.ok()) << r.error().message;
    want.push_back(r->ids);
  }
  auto model = open(10, 9);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EngineOptions o;
  o.max_batch_tokens = 10;
  o.max_running = 8;
  o.check_integrity = true;
  auto e = Engine::create(std::move(model).value(), nullptr, o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& engine = **e;
  const auto alone = test::generate_all(engine, prompts, greedy, false, 1, kMaxTokens);
  const int64_t cached_before = engine.stats().cached_tokens;
  const auto cached = test::generate_all(engine, prompts, greedy, true, 1, kMaxTokens);
  const int64_t cached_after = engine.stats().cached_tokens;
  const auto batched = test::generate_all(engine, prompts, greedy, true, 2, kMaxTokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(want[i].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(alone[i], want[i]) << "prompt " << i << " (" << prompts[i].size() << " tokens) alone";
    EXPECT_EQ(batched[i], want[i]) << "prompt " << i << " batched";
    EXPECT_EQ(cached[i], want[i]) << "prompt " << i << " from the prefix cache";
  }
  EXPECT_EQ(cached_before, 0);
  // Every prompt but the 3-token one has a whole block to reuse.
  EXPECT_GE(cached_after, 4 * static_cast<int64_t>(prompts.size() - 1));
  EXPECT_EQ(engine.stats().integrity_errors, 0) << engine.stats().last_integrity_error;
}

}  // namespace
}  // namespace rill
