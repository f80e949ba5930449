#include "kv/prefix_tree.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace rill {
namespace {

constexpr int32_t kBs = 4;

void expect_ok(const BlockPool& pool, const PrefixTree& tree) {
  Status p = pool.check_integrity();
  ASSERT_TRUE(p.ok()) << p.error().message;
  Status t = tree.check_integrity();
  ASSERT_TRUE(t.ok()) << t.error().message;
}

std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Allocates blocks for `tokens` beyond a match, "computes" them and inserts
// the full ones: what the engine does for one prompt.
std::vector<BlockLease> compute(BlockPool& pool, PrefixTree& tree, uint64_t ns, const std::vector<int32_t>& tokens) {
  PrefixMatch m = tree.match(ns, tokens);
  const int32_t n_needed = static_cast<int32_t>((tokens.size() + kBs - 1) / kBs);
  auto fresh = pool.allocate(n_needed - static_cast<int32_t>(m.blocks.size()));
  EXPECT_TRUE(fresh.ok());
  std::vector<BlockLease> chain = std::move(m.blocks);
  for (auto& l : fresh.value()) chain.push_back(std::move(l));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens.size() / kBs; ++i) ids.push_back(chain[i].block());
  tree.insert(ns, tokens, ids);
  return chain;
}

TEST(PrefixTree, MatchReturnsFullBlocksOnlyAndTakesLeases) {
  BlockPool pool(8, kBs);
  PrefixTree tree(pool);
  auto tokens = iota_tokens(10);  // 2 full blocks + 2 tokens
  auto chain = compute(pool, tree, 1, tokens);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(tree.n_nodes(), 2);
  EXPECT_FALSE(pool.is_cached(chain[2].block()));  // the partial block is never cached
  expect_ok(pool, tree);

  PrefixMatch m = tree.match(1, tokens);
  EXPECT_EQ(m.n_tokens, 8);
  EXPECT_EQ(m.block_ids(), (std::vector<int32_t>{chain[0].block(), chain[1].block()}));
  EXPECT_EQ(pool.refcount(chain[0].block()), 2);
  // The caller trims: an 8-token prompt matched without its last token hits one block.
  auto prompt = iota_tokens(8);
  PrefixMatch trimmed = tree.match(1, std::span<const int32_t>(prompt).first(7));
  EXPECT_EQ(trimmed.n_tokens, 4);
  // A different first block misses everything.
  auto other = iota_tokens(8, 101);
  EXPECT_EQ(tree.match(1, other).n_tokens, 0);
  expect_ok(pool, tree);
}

TEST(PrefixTree, NamespacesIsolate) {
  BlockPool pool(8, kBs);
  PrefixTree tree(pool);
  auto tokens = iota_tokens(8);
  auto chain = compute(pool, tree, 7, tokens);
  EXPECT_EQ(tree.match(7, tokens).n_tokens, 8);
  EXPECT_EQ(tree.match(8, tokens).n_tokens, 0);
  auto chain2 = compute(pool, tree, 8, tokens);  // same tokens, other namespace: own blocks
  EXPECT_NE(chain2[0].block(), chain[0].block());
  EXPECT_EQ(tree.n_nodes(), 4);
  EXPECT_EQ(tree.match(8, tokens).block_ids(), (std::vector<int32_t>{chain2[0].block(), chain2[1].block()}));
  expect_ok(pool, tree);
}

TEST(PrefixTree, SharedPrefixesShareBlocks) {
  BlockPool pool(16, kBs);
  PrefixTree tree(pool);
  auto a = iota_tokens(12);
  auto b = a;
  b[9] = 999;  // shares the first two blocks, differs in the third
  auto chain_a = compute(pool, tree, 1, a);
  auto chain_b = compute(pool, tree, 1, b);
  EXPECT_EQ(chain_b[0].block(), chain_a[0].block());
  EXPECT_EQ(chain_b[1].block(), chain_a[1].block());
  EXPECT_NE(chain_b[2].block(), chain_a[2].block());
  EXPECT_EQ(pool.refcount(chain_a[0].block()), 2);
  EXPECT_EQ(tree.n_nodes(), 4);
  EXPECT_EQ(pool.n_used(), 4);
  expect_ok(pool, tree);
}

TEST(PrefixTree, DuplicateInsertKeepsTheFirstBlock) {
  BlockPool pool(8, kBs);
  PrefixTree tree(pool);
  auto tokens = iota_tokens(4);
  auto first = pool.allocate(1).value();
  auto second = pool.allocate(1).value();
  const int32_t ids1[] = {first[0].block()}, ids2[] = {second[0].block()};
  EXPECT_EQ(tree.insert(1, tokens, ids1), 1);
  EXPECT_EQ(tree.insert(1, tokens, ids2), 0);  // computed twice concurrently
  EXPECT_FALSE(pool.is_cached(second[0].block()));
  second.clear();
  EXPECT_EQ(pool.n_free(), 7);
  expect_ok(pool, tree);
}

TEST(PrefixTree, EvictionIsLruAndPartialEvictionShortensTheMatch) {
  BlockPool pool(4, kBs);
  PrefixTree tree(pool);
  auto tokens = iota_tokens(16);
  {
    auto chain = compute(pool, tree, 1, tokens);
    release_tail_first(chain);
  }
  EXPECT_EQ(pool.n_cached(), 4);
  EXPECT_EQ(pool.n_free(), 0);
  expect_ok(pool, tree);
  // Need one block: the tail (a leaf, released first) is evicted.
  auto one = pool.allocate(1).value();
  EXPECT_EQ(tree.n_nodes(), 3);
  expect_ok(pool, tree);
  {
    PrefixMatch m = tree.match(1, tokens);
    EXPECT_EQ(m.n_tokens, 12);
    // Every remaining block is held (3 by the match, 1 by `one`): nothing to evict.
    EXPECT_FALSE(pool.can_allocate(1));
    release_tail_first(m.blocks);
  }
  auto two = pool.allocate(2).value();
  EXPECT_EQ(tree.match(1, tokens).n_tokens, 4);
  expect_ok(pool, tree);
}

TEST(PrefixTree, EvictingAnInnerBlockDropsItsSubtree) {
  BlockPool pool(3, kBs);
  PrefixTree tree(pool);
  auto tokens = iota_tokens(12);
  {
    auto chain = compute(pool, tree, 1, tokens);
    chain.clear();  // head-first release: the first block is the LRU victim
  }
  EXPECT_EQ(pool.n_free(), 0);
  auto one = pool.allocate(1).value();
  EXPECT_EQ(tree.n_nodes(), 0);
  EXPECT_EQ(pool.n_free(), 2);  // the orphaned descendants came back
  EXPECT_EQ(tree.match(1, tokens).n_tokens, 0);
  expect_ok(pool, tree);
}

TEST(PrefixTree, DestructionUncachesEverything) {
  BlockPool pool(6, kBs);
  {
    PrefixTree tree(pool);
    auto chain = compute(pool, tree, 1, iota_tokens(12));
    release_tail_first(chain);
    EXPECT_EQ(pool.n_cached(), 3);
  }
  EXPECT_EQ(pool.n_free(), 6);
  ASSERT_TRUE(pool.check_integrity().ok());
}

// Random operations on a tiny pool with a two-token alphabet (lots of shared
// prefixes). Every block a request writes is recorded with the tokens it
// holds; every match must return blocks that still hold exactly the matched
// tokens, i.e. the cache never serves KV of other tokens or of a recycled
// block.
TEST(PrefixTree, RandomizedStress) {
  BlockPool pool(12, kBs);
  auto tree = std::make_unique<PrefixTree>(pool);
  std::mt19937 rng(1234);
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::map<int32_t, std::vector<int32_t>> content;  // block -> tokens written
  std::vector<std::vector<BlockLease>> live;
  int n_hits = 0, n_rejected = 0, n_evicted_blocks = 0;
  const int32_t n_ops = 4000;
  for (int32_t op = 0; op < n_ops; ++op) {
    const uint64_t ns = rand(0, 1);
    const int kind = rand(0, 9);
    if (kind < 5) {  // a request: match, allocate the rest, compute, insert
      std::vector<int32_t> tokens(rand(1, 5 * kBs));
      for (auto& t : tokens) t = rand(0, 1);
      PrefixMatch m = tree->match(ns, std::span<const int32_t>(tokens).first(tokens.size() - 1));
      for (size_t i = 0; i < m.blocks.size(); ++i) {
        std::vector<int32_t> want(tokens.begin() + i * kBs, tokens.begin() + (i + 1) * kBs);
        want.push_back(static_cast<int32_t>(ns));
        ASSERT_EQ(content[m.blocks[i].block()], want) << "op " << op << " block " << i;
      }
      n_hits += m.blocks.size() > 0;
      const int32_t n_needed = static_cast<int32_t>((tokens.size() + kBs - 1) / kBs);
      const int32_t n_cached_before = pool.n_cached();
      auto fresh = pool.allocate(n_needed - static_cast<int32_t>(m.blocks.size()));
      if (!fresh.ok()) {
        ++n_rejected;  // the match's leases go back with m
      } else {
        n_evicted_blocks += n_cached_before - pool.n_cached();
        std::vector<BlockLease> chain = std::move(m.blocks);
        for (auto& l : fresh.value()) {
          content[l.block()].clear();  // recycled: old KV is gone
          chain.push_back(std::move(l));
        }
        std::vector<int32_t> ids;
        for (size_t i = m.n_tokens / kBs; i < chain.size(); ++i) {
          const size_t end = std::min(tokens.size(), (i + 1) * kBs);
          std::vector<int32_t> written(tokens.begin() + i * kBs, tokens.begin() + end);
          written.push_back(static_cast<int32_t>(ns));
          content[chain[i].block()] = written;
        }
        for (size_t i = 0; i < tokens.size() / kBs; ++i) ids.push_back(chain[i].block());
        tree->insert(ns, tokens, ids);
        live.push_back(std::move(chain));
      }
    } else if (kind < 9 && !live.empty()) {  // a request finishes
      const size_t i = rand(0, static_cast<int>(live.size()) - 1);
      if (rand(0, 3) == 0) {
        live[i].clear();  // head-first: may evict inner nodes later
      } else {
        release_tail_first(live[i]);
      }
      live.erase(live.begin() + i);
    } else {  // memory pressure from outside the cache
      if (pool.can_allocate(2)) auto scratch = pool.allocate(2).value();
    }
    Status p = pool.check_integrity();
    ASSERT_TRUE(p.ok()) << "op " << op << ": " << p.error().message;
    Status t = tree->check_integrity();
    ASSERT_TRUE(t.ok()) << "op " << op << ": " << t.error().message;
    ASSERT_EQ(pool.n_free() + pool.n_cached() + pool.n_used(), pool.n_blocks());
  }
  // The run exercised hits, rejections and eviction.
  EXPECT_GT(n_hits, 100);
  EXPECT_GT(n_rejected, 10);
  EXPECT_GT(n_evicted_blocks, 100);
  live.clear();
  EXPECT_EQ(pool.n_used(), 0);
  EXPECT_EQ(pool.n_cached(), tree->n_nodes());
  tree.reset();
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  ASSERT_TRUE(pool.check_integrity().ok());
}

// A chain evicted from its root (a sliding group gives its oldest blocks
// back first) is handed to the spill hook whole: the evicted node's chain
// continued down its deepest descendant path, which is dropped with it.
TEST(PrefixTree, SpillHookSeesTheDroppedDescendants) {
  BlockPool pool(4, kBs);
  PrefixTree tree(pool);
  const auto tokens = iota_tokens(12);  // 3 full blocks
  auto chain = compute(pool, tree, 7, tokens);
  const std::vector<int32_t> ids = {chain[0].block(), chain[1].block(), chain[2].block()};
  EXPECT_EQ(tree.find_chain(7, tokens), ids);
  EXPECT_EQ(pool.refcount(ids[0]), 1) << "find_chain takes no leases";
  std::vector<int32_t> seen_tokens, seen_blocks;
  tree.set_spill_hook([&](uint64_t ns, std::span<const int32_t> t, std::span<const int32_t> b) {
    EXPECT_EQ(ns, 7u);
    seen_tokens.assign(t.begin(), t.end());
    seen_blocks.assign(b.begin(), b.end());
  });
  for (auto& l : chain) l.release();  // head first: block 0 is the least recently used
  auto taken = pool.allocate(2);      // one free block, then evicts block 0
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(seen_blocks, ids);
  EXPECT_EQ(seen_tokens, tokens);
  EXPECT_TRUE(tree.find_chain(7, tokens).empty());
  tree.set_spill_hook(nullptr);
  expect_ok(pool, tree);
}

// Hollow nodes (a restored sliding-window run's dropped blocks): matched as
// empty leases, never left as leaves, filled by computed blocks, and gone
// with the last real block below them.
TEST(PrefixTree, HollowNodesMatchAsHolesAndGoWithTheirLastChild) {
  BlockPool pool(8, kBs);
  PrefixTree tree(pool);
  const auto tokens = iota_tokens(16);  // 4 full blocks
  auto fresh = pool.allocate(2);
  ASSERT_TRUE(fresh.ok());
  const int32_t b2 = (*fresh)[0].block(), b3 = (*fresh)[1].block();
  EXPECT_EQ(tree.insert(5, tokens, std::vector<int32_t>{-1, -1, b2, b3}), 2);
  EXPECT_EQ(tree.n_nodes(), 2);
  EXPECT_EQ(tree.n_hollow(), 2);
  expect_ok(pool, tree);
  {
    PrefixMatch m = tree.match(5, tokens);
    EXPECT_EQ(m.n_tokens, 16);
    EXPECT_FALSE(m.blocks[0].valid());
    EXPECT_FALSE(m.blocks[1].valid());
    EXPECT_EQ(m.block_ids(), (std::vector<int32_t>{-1, -1, b2, b3}));
    EXPECT_EQ(tree.find_chain(5, tokens), m.block_ids());
  }
  // A chain that would end hollow leaves nothing behind.
  const auto other = iota_tokens(8, 900);
  EXPECT_EQ(tree.insert(5, other, std::vector<int32_t>{-1, -1}), 0);
  EXPECT_EQ(tree.n_hollow(), 2);
  expect_ok(pool, tree);
  // A computed block fills a hollow node in place.
  auto filler = pool.allocate(1);
  ASSERT_TRUE(filler.ok());
  const int32_t b0 = (*filler)[0].block();
  EXPECT_EQ(tree.insert(5, std::span<const int32_t>(tokens).first(4), std::vector<int32_t>{b0}), 1);
  EXPECT_EQ(tree.n_hollow(), 1);
  EXPECT_EQ(tree.find_chain(5, tokens), (std::vector<int32_t>{b0, -1, b2, b3}));
  expect_ok(pool, tree);
  // Evicting the real blocks below the hollow one drops it too; the spill
  // hook sees it as -1.
  std::vector<int32_t> seen;
  tree.set_spill_hook([&](uint64_t, std::span<const int32_t>, std::span<const int32_t> b) {
    if (seen.empty()) seen.assign(b.begin(), b.end());
  });
  release_tail_first(*fresh);  // b3 then b2 become the least recently used
  (*filler)[0].release();
  auto all = pool.allocate(8);  // evicts b3, b2 (and with them the hollow node), then b0
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(seen, (std::vector<int32_t>{b0, -1, b2, b3}));
  EXPECT_EQ(tree.n_nodes(), 0);
  EXPECT_EQ(tree.n_hollow(), 0);
  tree.set_spill_hook(nullptr);
  expect_ok(pool, tree);
}

}  // namespace
}  // namespace rill
