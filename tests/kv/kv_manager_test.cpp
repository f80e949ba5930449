#include "kv/kv_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace rill {
namespace {

// One pool + tree + state pool + manager, as the engine wires them.
struct Rig {
  Rig(KvSpec spec, int32_t n_blocks, int32_t block_size, int32_t n_slots = 0, int32_t n_checkpoints = 2,
      int32_t checkpoint_every = 8, int32_t n_spec_states = 0)
      : pool(n_blocks, block_size),
        tree(pool),
        states(n_slots, n_checkpoints, n_spec_states),
        kv(std::move(spec), pool, tree, states, checkpoint_every) {}
  void expect_ok() const {
    Status s = kv.check_integrity();
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  BlockPool pool;
  PrefixTree tree;
  StatePool states;
  KvManager kv;
};

std::vector<int32_t> iota(int32_t n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

int32_t n_holes(const std::vector<int32_t>& table) {
  return static_cast<int32_t>(std::count(table.begin(), table.end(), -1));
}

TEST(KvManager, FullAttentionReusesCommittedPrefixes) {
  Rig r({full()}, 16, 4);
  const auto a = iota(10);
  auto adm = r.kv.admit(1, 7, a);
  ASSERT_TRUE(adm.ok()) << adm.error().message;
  EXPECT_EQ(adm->n_cached_tokens, 0);
  EXPECT_EQ(r.kv.length(1), 0);
  ASSERT_TRUE(r.kv.append(1, 10).ok());
  r.expect_ok();
  const auto t1 = r.kv.block_table(1);
  ASSERT_EQ(t1.size(), 3u);
  EXPECT_EQ(r.kv.commit_full_blocks(1, a).value(), 2);  // the partial third block is never cached
  EXPECT_EQ(r.kv.commit_full_blocks(1, a).value(), 0);  // idempotent
  r.expect_ok();

  auto b = a;
  b.push_back(100);
  b.push_back(101);  // 12 tokens: 3 full blocks, only 2 cached
  adm = r.kv.admit(2, 7, b);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 8);
  ASSERT_TRUE(r.kv.append(2, 4).ok());
  const auto t2 = r.kv.block_table(2);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);
  EXPECT_EQ(adm->cached_blocks[0], std::vector<int32_t>(t1.begin(), t1.begin() + 2));
  EXPECT_EQ(r.pool.refcount(t1[0]), 2);
  r.expect_ok();

  // A prompt of exactly two cached blocks still computes its last token.
  adm = r.kv.admit(3, 7, std::vector<int32_t>(a.begin(), a.begin() + 8));
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 4);
  // Namespaces never share blocks.
  adm = r.kv.admit(4, 8, a);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 0);
  EXPECT_FALSE(r.kv.admit(4, 8, a).ok());  // already admitted
  EXPECT_FALSE(r.kv.admit(5, 8, {}).ok());
  r.expect_ok();

  for (int64_t s : {1, 2, 3, 4}) {
    r.kv.release(s);
    r.expect_ok();
  }
  r.kv.release(99);  // unknown: no-op
  EXPECT_EQ(r.pool.n_used(), 0);
  EXPECT_EQ(r.pool.n_cached(), 2);
  EXPECT_EQ(r.kv.n_free_blocks(), 16);
}

TEST(KvManager, AdmissionAccountingAndNeverFittingRequests) {
  Rig r({full()}, 4, 4);
  auto too_big = r.kv.admit(1, 0, iota(17));
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.error().message.find("only 4"), std::string::npos);
  EXPECT_FALSE(r.kv.contains(1));
  ASSERT_TRUE(r.kv.admit(1, 0, iota(16)).ok());
  EXPECT_TRUE(r.kv.can_allocate(1, 16));
  EXPECT_FALSE(r.kv.can_allocate(1, 17));
  EXPECT_FALSE(r.kv.can_allocate(2, 1));  // unknown sequence
  EXPECT_EQ(r.kv.blocks_needed(1, 5), 2);
  ASSERT_TRUE(r.kv.append(1, 16).ok());
  EXPECT_EQ(r.kv.n_free_blocks(), 0);
  EXPECT_FALSE(r.kv.can_allocate(1, 1));
  EXPECT_TRUE(r.kv.can_allocate(1, 0));
  const auto before = r.kv.block_table(1);
  EXPECT_FALSE(r.kv.append(1, 1).ok());  // out of blocks: an error, nothing changes
  EXPECT_FALSE(r.kv.append(1, -1).ok());
  EXPECT_FALSE(r.kv.append(9, 1).ok());
  EXPECT_EQ(r.kv.block_table(1), before);
  EXPECT_EQ(r.kv.length(1), 16);
  EXPECT_FALSE(r.kv.commit_full_blocks(1, iota(17)).ok());  // more than appended
  r.expect_ok();
  r.kv.release(1);
  EXPECT_EQ(r.kv.n_free_blocks(), 4);

  // Every attention group needs its own blocks: 2 groups x 4 blocks > 6.
  Rig two({sliding(4), full()}, 6, 4);
  EXPECT_FALSE(two.kv.admit(1, 0, iota(16)).ok());
  EXPECT_TRUE(two.kv.admit(1, 0, iota(12)).ok());
  two.expect_ok();
}

TEST(KvManager, SlidingGroupsPunchHolesAndResumeFromTheCache) {
  Rig r({sliding(4), full()}, 32, 2);
  const auto toks = iota(13, 50);
  ASSERT_TRUE(r.kv.admit(1, 0, std::vector<int32_t>(toks.begin(), toks.begin() + 1)).ok());
  for (int32_t len = 1; len <= 12; ++len) {
    const int32_t old_len = len - 1;
    ASSERT_TRUE(r.kv.append(1, 1).ok());
    // The token at old_len attends to positions >= old_len - 3.
    const int32_t dead = std::max(0, (old_len - 3) / 2);
    const auto sl = r.kv.block_table(1, 0);
    EXPECT_EQ(static_cast<int32_t>(sl.size()), (len + 1) / 2);
    EXPECT_EQ(n_holes(sl), std::min(dead, static_cast<int32_t>(sl.size())));
    for (int32_t b = 0; b < n_holes(sl); ++b) EXPECT_EQ(sl[b], -1);  // holes are a prefix
    EXPECT_EQ(n_holes(r.kv.block_table(1, 1)), 0);
    ASSERT_TRUE(r.kv.commit_full_blocks(1, std::span(toks).first(len)).ok());
    r.expect_ok();
  }
  EXPECT_EQ(r.kv.block_table(1, 0),
            (std::vector<int32_t>{-1, -1, -1, -1, r.kv.block_table(1, 0)[4], r.kv.block_table(1, 0)[5]}));
  EXPECT_EQ(r.pool.n_used(), 2 + 6);
  // Every block was committed before it left the window.
  EXPECT_EQ(r.kv.preempt(1), 12);
  r.expect_ok();
  EXPECT_EQ(r.pool.n_used(), 0);
  auto adm = r.kv.admit(2, 0, toks);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 12);
  EXPECT_EQ(n_holes(r.kv.block_table(2, 0)), 4);  // only the window is re-leased
  EXPECT_EQ(r.pool.n_used(), 2 + 6);
  r.expect_ok();
}

// A sliding group's chain with hollow nodes (restored from a cache tier that
// kept only the window): a match resumes only where the blocks the next
// token reads hold KV, in every group.
TEST(KvManager, HollowBlocksAreResumedOnlyWhereTheyAreDead) {
  Rig r({sliding(4), full()}, 32, 2);
  const auto toks = iota(13, 50);  // 6 full blocks of 2
  // Group 0 (sliding): blocks 0..3 hollow, 4..5 real; group 1 (full): all real.
  auto fresh = r.pool.allocate(2 + 6);
  ASSERT_TRUE(fresh.ok());
  std::vector<int32_t> sl = {-1, -1, -1, -1, (*fresh)[0].block(), (*fresh)[1].block()}, fl;
  for (int i = 2; i < 8; ++i) fl.push_back((*fresh)[static_cast<size_t>(i)].block());
  r.tree.insert(KvManager::group_ns(0, 0), std::span(toks).first(12), sl);
  r.tree.insert(KvManager::group_ns(0, 1), std::span(toks).first(12), fl);
  release_tail_first(*fresh);
  // Resuming at 12 reads positions 9..12: blocks 4, 5 (and the new token).
  auto adm = r.kv.admit(1, 0, toks);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 12);
  EXPECT_EQ(n_holes(r.kv.block_table(1, 0)), 4);
  r.expect_ok();
  // Resuming at 8 would read block 3 (position 5): hollow, so step down; at
  // 6, 4, 2 blocks 2, 1, 0 are hollow as well: nothing is reused.
  std::vector<int32_t> short_prompt(toks.begin(), toks.begin() + 8);
  short_prompt.push_back(999);
  auto miss = r.kv.admit(2, 0, short_prompt);
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->n_cached_tokens, 0);
  EXPECT_EQ(r.kv.length(2), 0);
  r.expect_ok();
}

TEST(KvManager, RecurrentGroupsTakeOneStateSlotPerSequence) {
  Rig r({recurrent(), full()}, 16, 4, 2);
  const auto p = iota(9);
  ASSERT_TRUE(r.kv.admit(1, 0, p).ok());
  ASSERT_TRUE(r.kv.append(1, 9).ok());
  EXPECT_GE(r.kv.state_slot(1, 0), 0);
  EXPECT_EQ(r.kv.state_slot(1, 1), -1);
  EXPECT_TRUE(r.kv.block_table(1, 0).empty());
  EXPECT_EQ(r.kv.block_table(1, 1).size(), 3u);
  EXPECT_EQ(r.kv.commit_full_blocks(1, p).value(), 2);
  ASSERT_TRUE(r.kv.admit(2, 0, p).ok());
  EXPECT_NE(r.kv.state_slot(1, 0), r.kv.state_slot(2, 0));
  EXPECT_FALSE(r.kv.admit(2, 0, p).ok());  // already admitted
  auto third = r.kv.admit(3, 0, p);
  ASSERT_FALSE(third.ok());  // no free state slot: an error, nothing taken
  EXPECT_FALSE(r.kv.contains(3));
  EXPECT_EQ(r.states.n_leased(), 2);
  r.expect_ok();
  EXPECT_EQ(r.kv.preempt(1), 8);  // an upper bound: a resume needs a checkpoint too
  EXPECT_EQ(r.states.n_leased(), 1);
  auto again = r.kv.admit(3, 0, p);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->n_cached_tokens, 8);  // the prompt's last full block was checkpointed
  EXPECT_GE(again->state_restore, 0);
  r.expect_ok();

  Rig no_slots({recurrent()}, 4, 4, 0);
  EXPECT_FALSE(no_slots.kv.admit(1, 0, p).ok());
}

std::vector<CheckpointSave> saves(const KvManager& kv, int64_t seq) {
  auto s = kv.state_saves(seq);
  return {s.begin(), s.end()};
}

TEST(KvManager, HybridPrefixesResumeAtCheckpointedBoundaries) {
  // Block size 4, a checkpoint every 2nd block and at the prompt's last full block.
  Rig r({recurrent(), full()}, 12, 4, 3, 4, 2);
  ASSERT_TRUE(r.kv.checkpoints_enabled());
  const auto p = iota(22);  // 5 full blocks + 2
  r.kv.begin_step();
  auto adm = r.kv.admit(1, 0, p);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 0);
  EXPECT_EQ(adm->state_restore, -1);
  ASSERT_TRUE(r.kv.append(1, 10).ok());  // chunked prefill: boundaries after blocks 1, 2
  const auto s1 = saves(r.kv, 1);
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0].pos, 7);
  r.expect_ok();
  ASSERT_TRUE(r.kv.commit_full_blocks(1, std::span(p).first(10)).ok());
  EXPECT_TRUE(saves(r.kv, 1).empty());  // taken by the step
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.append(1, 12).ok());  // blocks 3, 4 (every 2nd) and 5 (the prompt's last full one)
  const auto s2 = saves(r.kv, 1);
  ASSERT_EQ(s2.size(), 2u);
  EXPECT_EQ(s2[0].pos, 15);
  EXPECT_EQ(s2[1].pos, 19);
  EXPECT_EQ(r.states.n_checkpoints_used(), 3);
  ASSERT_TRUE(r.kv.commit_full_blocks(1, p).ok());
  const auto table = r.kv.block_table(1, 1);
  EXPECT_EQ(r.states.checkpoint_of(table[1]), s1[0].checkpoint);
  EXPECT_EQ(r.states.checkpoint_of(table[4]), s2[1].checkpoint);
  r.expect_ok();

  // The whole prompt again: 5 blocks match, the last has a checkpoint.
  r.kv.begin_step();
  adm = r.kv.admit(2, 0, p);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 20);
  EXPECT_EQ(adm->state_restore, s2[1].checkpoint);
  EXPECT_EQ(r.kv.state_restore(2), s2[1].checkpoint);
  EXPECT_EQ(adm->cached_blocks[1], std::vector<int32_t>(table.begin(), table.begin() + 5));
  ASSERT_TRUE(r.kv.append(2, 2).ok());
  EXPECT_TRUE(saves(r.kv, 2).empty());  // no new boundary
  ASSERT_TRUE(r.kv.commit_full_blocks(2, p).ok());
  EXPECT_EQ(r.kv.state_restore(2), -1);  // consumed by the step
  // A prompt sharing 3 blocks and a bit: block 3 has no checkpoint, block 2 has.
  auto q = std::vector<int32_t>(p.begin(), p.begin() + 14);
  q.push_back(99);
  adm = r.kv.admit(3, 0, q);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 8);
  EXPECT_EQ(adm->state_restore, s1[0].checkpoint);
  EXPECT_EQ(adm->cached_blocks[1].size(), 2u);  // the matched third block went back
  // Its recomputed copy takes the prompt's last-full-block checkpoint; the
  // tree keeps the first copy, so the checkpoint moves there at commit.
  ASSERT_TRUE(r.kv.append(3, 7).ok());
  const auto s3 = saves(r.kv, 3);
  ASSERT_EQ(s3.size(), 1u);
  EXPECT_EQ(s3[0].pos, 11);
  ASSERT_TRUE(r.kv.commit_full_blocks(3, q).ok());
  EXPECT_EQ(r.states.checkpoint_of(table[2]), s3[0].checkpoint);
  EXPECT_FALSE(r.states.checkpoint_of(r.kv.block_table(3, 1)[2]).has_value());
  r.kv.release(2);  // frees a state slot
  adm = r.kv.admit(6, 0, q);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 12);
  EXPECT_EQ(adm->state_restore, s3[0].checkpoint);
  r.expect_ok();
  for (int64_t s : {1, 3, 6}) r.kv.release(s);
  r.expect_ok();

  // Reallocating a block id drops its checkpoint: fill the pool with other
  // tokens (evicting the cached prompt), then the prompt matches nothing.
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.admit(4, 0, iota(48, 1000)).ok());
  ASSERT_TRUE(r.kv.append(4, 48).ok());
  r.kv.release(4);
  adm = r.kv.admit(5, 0, p);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 0);
  EXPECT_EQ(adm->state_restore, -1);
  r.expect_ok();
}

// Speculative decoding on a hybrid: a verify step saves the state after
// the owed token and each draft but the last (a position with a prefix
// checkpoint save reuses it); truncate() makes the accepted one the pending
// restore, pins it while it is a prefix checkpoint, and drops the
// checkpoints of blocks that saw rejected tokens.
TEST(KvManager, VerifyStatesRollTheRecurrentStateBack) {
  Rig r({full(), recurrent()}, 16, 4, 2, 2, 2, 3);  // prefix checkpoints every 2nd block, 3 verify states
  const auto toks = iota(10);
  const auto first = [&](int32_t n) { return std::span<const int32_t>(toks).first(static_cast<size_t>(n)); };
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.admit(1, 0, first(6)).ok());
  ASSERT_TRUE(r.kv.append(1, 6).ok());
  ASSERT_TRUE(r.kv.commit_full_blocks(1, first(6)).ok());
  const int32_t slot = r.kv.state_slot(1, 1);

  // Owed token at 6, drafts at 7..9: states after 6, 7 and 8 are saved; 7
  // ends block 1, whose prefix checkpoint is the one save there.
  r.kv.begin_step();
  EXPECT_FALSE(r.kv.append(1, 5, 4).ok()) << "more drafts than verify states";
  ASSERT_TRUE(r.kv.append(1, 4, 3).ok());
  auto s = saves(r.kv, 1);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].pos, 6);
  EXPECT_EQ(s[0].checkpoint, r.states.spec_state(slot, 0));
  EXPECT_EQ(s[1].pos, 7);
  EXPECT_LT(s[1].checkpoint, r.states.n_checkpoints());  // the prefix checkpoint of block 1
  EXPECT_EQ(s[2].pos, 8);
  EXPECT_EQ(s[2].checkpoint, r.states.spec_state(slot, 2));
  r.expect_ok();
  ASSERT_TRUE(r.kv.commit_full_blocks(1, first(7)).ok());  // drafts are not committed
  EXPECT_FALSE(r.kv.truncate(1, 6).ok()) << "the state after position 5 was not saved";
  // One draft held: 8 tokens, the state after position 7 (a prefix checkpoint, pinned).
  ASSERT_TRUE(r.kv.commit_full_blocks(1, first(8)).ok());
  ASSERT_TRUE(r.kv.truncate(1, 8).ok());
  EXPECT_EQ(r.kv.state_restore(1), s[1].checkpoint);
  r.expect_ok();
  r.kv.begin_step();
  for (int32_t b = 100; b < 104; ++b) EXPECT_NE(r.states.take_checkpoint(b).value(), s[1].checkpoint);
  ASSERT_TRUE(r.kv.append(1, 1).ok());
  ASSERT_TRUE(r.kv.commit_full_blocks(1, first(9)).ok());  // the step that read the restore ran: unpinned
  EXPECT_EQ(r.kv.state_restore(1), -1);

  // Next round: owed token at 9, drafts at 10, 11 (none held): the state after 9.
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.truncate(1, 9).ok());  // nothing to roll back
  ASSERT_TRUE(r.kv.append(1, 3, 2).ok());
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.commit_full_blocks(1, first(10)).ok());
  const int32_t block2 = r.kv.block_table(1)[2];
  ASSERT_TRUE(r.states.take_checkpoint(block2).ok());  // as if position 11 had ended a checkpointed block
  ASSERT_TRUE(r.kv.truncate(1, 10).ok());
  EXPECT_EQ(r.kv.state_restore(1), r.states.spec_state(slot, 0));
  EXPECT_FALSE(r.states.checkpoint_of(block2).has_value()) << "a checkpoint after rejected tokens survived";
  EXPECT_EQ(r.kv.length(1), 10);
  r.expect_ok();
  r.kv.release(1);
  r.expect_ok();
}

TEST(KvManager, OneStepNeverRecyclesItsOwnCheckpoints) {
  Rig r({full(), recurrent()}, 16, 4, 2, 2, 1);  // 2 checkpoint slots, one per block wanted
  r.kv.begin_step();
  const auto p = iota(17);
  ASSERT_TRUE(r.kv.admit(1, 0, p).ok());
  ASSERT_TRUE(r.kv.append(1, 17).ok());
  auto s = saves(r.kv, 1);
  ASSERT_EQ(s.size(), 2u);  // 4 boundaries, 2 slots: the step keeps the first two
  EXPECT_EQ(s[0].pos, 3);
  EXPECT_EQ(s[1].pos, 7);
  EXPECT_NE(s[0].checkpoint, s[1].checkpoint);
  ASSERT_TRUE(r.kv.commit_full_blocks(1, p).ok());
  // The next step recycles the least recently used ones.
  r.kv.begin_step();
  ASSERT_TRUE(r.kv.admit(2, 0, iota(9, 50)).ok());
  ASSERT_TRUE(r.kv.append(2, 9).ok());
  EXPECT_EQ(saves(r.kv, 2).size(), 2u);
  r.expect_ok();

  // Without checkpoint slots a hybrid reuses nothing.
  Rig none({full(), recurrent()}, 16, 4, 2, 0);
  EXPECT_FALSE(none.kv.checkpoints_enabled());
  ASSERT_TRUE(none.kv.admit(1, 0, p).ok());
  ASSERT_TRUE(none.kv.append(1, 17).ok());
  EXPECT_TRUE(saves(none.kv, 1).empty());
  ASSERT_TRUE(none.kv.commit_full_blocks(1, p).ok());
  auto adm = none.kv.admit(2, 0, p);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->n_cached_tokens, 0);
  EXPECT_EQ(none.kv.preempt(1), 0);
}

// Many sequences with shared prefixes on a tiny pool, random operations;
// the invariants hold after every step and everything comes back.
void random_run(KvSpec spec, uint32_t seed) {
  const bool has_recurrent = std::any_of(spec.begin(), spec.end(), [](auto& g) { return !g.is_attention(); });
  Rig r(std::move(spec), 14, 2, 3, 3, 2);
  std::mt19937 rng(seed);
  // checkpoint -> the tokens whose state it holds (filled when its step is planned)
  std::map<int32_t, std::vector<int32_t>> shadow_ckpt;
  auto record_saves = [&](int64_t seq, const std::vector<int32_t>& toks) {
    for (const CheckpointSave& v : r.kv.state_saves(seq)) {
      shadow_ckpt[v.checkpoint].assign(toks.begin(), toks.begin() + v.pos + 1);
    }
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int32_t k = 0; k < 3; ++k) prefixes.push_back(iota(6, 100 * k));
  std::map<int64_t, std::vector<int32_t>> live;                       // seq -> all tokens (length() of them appended)
  std::map<std::pair<size_t, int32_t>, std::vector<int32_t>> shadow;  // (group, block) -> committed tokens
  const int32_t bs = r.pool.block_size();
  int64_t next_seq = 0;
  int32_t n_hits = 0, n_refused = 0, n_preempted_cached = 0, n_restored = 0, max_hollow = 0;  // coverage of the run
  for (int step = 0; step < 3000; ++step) {
    r.kv.begin_step();
    const uint32_t op = rng() % 10;
    if (op < 3 || live.empty()) {
      auto toks = prefixes[rng() % prefixes.size()];
      for (uint32_t i = rng() % 5; i > 0; --i) toks.push_back(static_cast<int32_t>(rng() % 4));
      const int64_t seq = next_seq++;
      auto adm = r.kv.admit(seq, 0, toks);
      if (!adm.ok()) ++n_refused;
      if (adm.ok()) {
        n_hits += adm->n_cached_tokens > 0;
        ASSERT_LT(adm->n_cached_tokens, static_cast<int32_t>(toks.size()));
        if (has_recurrent) {  // a hit resumes from the state of exactly the cached tokens
          ASSERT_EQ(adm->state_restore >= 0, adm->n_cached_tokens > 0);
          if (adm->state_restore >= 0) {
            ASSERT_EQ(shadow_ckpt[adm->state_restore],
                      std::vector<int32_t>(toks.begin(), toks.begin() + adm->n_cached_tokens));
          }
        }
        for (size_t g = 0; g < adm->cached_blocks.size(); ++g) {
          for (size_t i = 0; i < adm->cached_blocks[g].size(); ++i) {
            if (adm->cached_blocks[g][i] < 0) continue;  // a hollow node, dead at the resume point
            auto want = std::vector<int32_t>(toks.begin() + static_cast<long>(i) * bs,
                                             toks.begin() + static_cast<long>(i + 1) * bs);
            ASSERT_EQ(shadow[std::make_pair(g, adm->cached_blocks[g][i])], want) << "matched a block with other tokens";
          }
        }
        // Prefill the rest if it fits, else give up on it.
        const int32_t rest = static_cast<int32_t>(toks.size()) - adm->n_cached_tokens;
        if (r.kv.can_allocate(seq, rest)) {
          ASSERT_TRUE(r.kv.append(seq, rest).ok());
          record_saves(seq, toks);
          live[seq] = toks;
        } else {
          r.kv.release(seq);
        }
      }
    } else if (op < 7) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      auto& toks = it->second;
      // The appended tokens are computed: commit, then grow by 1..3.
      ASSERT_TRUE(r.kv.commit_full_blocks(it->first, toks).ok());
      for (size_t g = 0; g < r.kv.spec().size(); ++g) {
        const auto table = r.kv.block_table(it->first, static_cast<int32_t>(g));
        for (size_t b = 0; b < table.size() && (b + 1) * bs <= toks.size(); ++b) {
          if (table[b] >= 0 && r.pool.is_cached(table[b])) {
            auto& sh = shadow[{g, table[b]}];
            sh.assign(toks.begin() + static_cast<long>(b) * bs, toks.begin() + static_cast<long>(b + 1) * bs);
          }
        }
      }
      const int32_t n = 1 + static_cast<int32_t>(rng() % 3);
      if (!r.kv.can_allocate(it->first, n)) ++n_refused;
      if (r.kv.can_allocate(it->first, n)) {
        ASSERT_TRUE(r.kv.append(it->first, n).ok());
        for (int32_t i = 0; i < n; ++i) toks.push_back(static_cast<int32_t>(rng() % 4));
        record_saves(it->first, toks);
      }
    } else if (op == 9 && !has_recurrent && rng() % 2 == 0) {
      // What a cache tier's restore does: a prefix goes (back) into the tree,
      // each group's blocks beyond its match fresh, except a sliding group's
      // blocks before the window of the prefix's end: hollow nodes.
      auto toks = prefixes[rng() % prefixes.size()];
      for (uint32_t i = rng() % 5; i > 0; --i) toks.push_back(static_cast<int32_t>(rng() % 4));
      const auto n = static_cast<int32_t>(toks.size()) / bs;
      std::vector<PrefixMatch> m(r.kv.spec().size());
      int32_t need = 0;
      bool usable = true;
      for (size_t g = 0; g < m.size(); ++g) {
        m[g] = r.tree.match(KvManager::group_ns(0, static_cast<int32_t>(g)),
                            std::span(toks).first(static_cast<size_t>(n * bs)));
        const int32_t have = static_cast<int32_t>(m[g].blocks.size());
        const int32_t first = first_needed_block(r.kv.spec()[g], n * bs, bs);
        need += n - std::max(have, first);
        for (int32_t b = first; b < have; ++b) usable = usable && m[g].blocks[static_cast<size_t>(b)].valid();
      }
      if (usable && need > 0 && r.pool.can_allocate(need)) {
        auto fresh = r.pool.allocate(need);
        ASSERT_TRUE(fresh.ok());
        size_t next = 0;
        for (size_t g = 0; g < m.size(); ++g) {
          std::vector<int32_t> ids = m[g].block_ids();
          const int32_t first = first_needed_block(r.kv.spec()[g], n * bs, bs);
          for (int32_t b = static_cast<int32_t>(ids.size()); b < n; ++b) {
            ids.push_back(b < first ? -1 : (*fresh)[next++].block());
          }
          r.tree.insert(KvManager::group_ns(0, static_cast<int32_t>(g)),
                        std::span(toks).first(static_cast<size_t>(n * bs)), ids);
          for (int32_t b = 0; b < n; ++b) {
            const int32_t id = ids[static_cast<size_t>(b)];
            if (id >= 0 && r.pool.is_cached(id)) {
              shadow[{g, id}].assign(toks.begin() + static_cast<long>(b) * bs,
                                     toks.begin() + static_cast<long>(b + 1) * bs);
            }
          }
          release_tail_first(m[g].blocks);
        }
        release_tail_first(*fresh);
        ++n_restored;
      }
    } else if (op < 8) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const int32_t n_kept = r.kv.preempt(it->first);
      ASSERT_LE(n_kept, static_cast<int32_t>(it->second.size()));
      n_preempted_cached += n_kept > 0;
      live.erase(it);
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      r.kv.release(it->first);
      live.erase(it);
    }
    ASSERT_EQ(r.kv.n_sequences(), static_cast<int32_t>(live.size()));
    max_hollow = std::max(max_hollow, r.tree.n_hollow());
    Status s = r.kv.check_integrity();
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error().message;
  }
  for (auto& [seq, toks] : live) r.kv.release(seq);
  r.expect_ok();
  EXPECT_EQ(r.pool.n_used(), 0);
  EXPECT_EQ(r.pool.n_free() + r.pool.n_cached(), r.pool.n_blocks());
  EXPECT_EQ(r.tree.n_nodes(), r.pool.n_cached());
  EXPECT_EQ(r.states.n_leased(), 0);
  EXPECT_GT(n_refused, 0);                     // the pool (or the state pool) ran out at times
  EXPECT_GT(n_hits, has_recurrent ? 20 : 50);  // shared prefixes were reused
  EXPECT_GT(n_preempted_cached, 0);
  if (!has_recurrent) {
    EXPECT_GT(n_restored, 10);
  }
  if (r.kv.spec()[0].kind == LayerKind::kSliding) {
    EXPECT_GT(max_hollow, 0) << "restores made hollow nodes";
  }
}

TEST(KvManager, RandomizedFull) {
  for (uint32_t seed : {1u, 2u, 3u}) random_run({full()}, seed);
}
TEST(KvManager, RandomizedSlidingAndFull) {
  for (uint32_t seed : {4u, 5u, 6u}) random_run({sliding(3), full()}, seed);
}
TEST(KvManager, RandomizedRecurrentHybrid) {
  for (uint32_t seed : {7u, 8u}) random_run({recurrent(), full()}, seed);
}

}  // namespace
}  // namespace rill
