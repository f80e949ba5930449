// DraftModelSpeculator's batched drafting (engine/draft_speculator.h): a
// step's requests drafted together (catch-up chunks packed into shared
// forwards, one forward per draft position) give every request the drafts
// it gets when drafted alone, round after round, as the target accepts a
// prefix of each request's drafts and rejects the rest (the draft's KV
// rolls back per row). The llama golden drafts for itself.
#include <gtest/gtest.h>

#include "engine/draft_speculator.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

EngineOptions options() {
  EngineOptions o;
  o.n_threads = 2;
  o.max_batch_tokens = 32;  // less than the prompts together: catch-up chunks span forwards
  o.max_running = 6;
  o.kv_cache_mb = 8;
  return o;
}

std::unique_ptr<Speculator> make_draft(const std::string& dir, Model& target) {
  SpeculatorTarget t;
  t.model = &target;
  t.model_path = dir;
  t.options = options();
  auto s = make_speculator("draft=" + dir, t);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(DraftModelSpeculatorBatch, BatchedDraftsEqualPerRowDrafts) {
  const std::string dir = test::hf_golden_dir("llama");
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions mo;
  mo.n_threads = 2;
  mo.n_ctx = 256;
  auto target = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  ASSERT_TRUE(target.ok()) << target.error().message;
  auto batched = make_draft(dir, **target);
  auto per_row = make_draft(dir, **target);
  ASSERT_TRUE(batched && per_row);

  const test::HfGolden g = test::read_hf_golden(dir);
  std::vector<std::vector<int32_t>> seqs = test::prompts_from(g.prompt_ids);
  // One long prompt: its catch-up alone takes several forwards.
  std::vector<int32_t> longest;
  while (longest.size() < 70) longest.insert(longest.end(), g.prompt_ids.begin(), g.prompt_ids.end());
  seqs.push_back(longest);
  const auto n_vocab = static_cast<int32_t>((*target)->n_vocab());

  int64_t n_compared = 0;
  std::vector<DraftRequest> reqs;
  std::vector<int32_t> got, want;
  for (int round = 0; round < 6; ++round) {
    reqs.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      if ((i + static_cast<size_t>(round)) % 4 == 3) continue;  // a row that sits a step out
      reqs.push_back(DraftRequest{i, seqs[i], 1 + static_cast<int32_t>((i + static_cast<size_t>(round)) % 4), 0});
    }
    got.clear();
    batched->propose_batch(reqs, got);
    size_t at = 0;
    for (const DraftRequest& r : reqs) {
      want.clear();
      per_row->propose(r.seq, r.tokens, r.max_tokens, want);
      ASSERT_LE(at + static_cast<size_t>(r.n_drafts), got.size());
      const std::vector<int32_t> mine(got.begin() + static_cast<ptrdiff_t>(at),
                                      got.begin() + static_cast<ptrdiff_t>(at) + r.n_drafts);
      EXPECT_EQ(mine, want) << "round " << round << " request " << r.seq;
      EXPECT_EQ(r.n_drafts, r.max_tokens) << "round " << round << " request " << r.seq;
      n_compared += r.n_drafts;
      at += static_cast<size_t>(r.n_drafts);
    }
    EXPECT_EQ(at, got.size());
    // The target keeps a prefix of the drafts (a different length per row
    // and round) and then takes a token the draft did not propose, so the
    // next round rolls each draft KV back.
    at = 0;
    for (const DraftRequest& r : reqs) {
      std::vector<int32_t>& s = seqs[r.seq];
      const int32_t n_keep = static_cast<int32_t>((r.seq * 7 + static_cast<size_t>(round)) % (r.n_drafts + 1));
      s.insert(s.end(), got.begin() + static_cast<ptrdiff_t>(at), got.begin() + static_cast<ptrdiff_t>(at) + n_keep);
      const int32_t next = n_keep < r.n_drafts ? got[at + static_cast<size_t>(n_keep)] : s.back();
      s.push_back((next + 1 + static_cast<int32_t>(r.seq)) % n_vocab);
      at += static_cast<size_t>(r.n_drafts);
    }
  }
  EXPECT_GT(n_compared, 60);
  // A request that ended is dropped; a later one under its id starts again.
  batched->release(0);
  per_row->release(0);
  reqs.assign(1, DraftRequest{0, seqs[1], 3, 0});
  got.clear();
  want.clear();
  batched->propose_batch(reqs, got);
  per_row->propose(0, seqs[1], 3, want);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace rill
