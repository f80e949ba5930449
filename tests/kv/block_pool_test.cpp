#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace rill {
namespace {

void expect_ok(const BlockPool& pool) {
  Status s = pool.check_integrity();
  ASSERT_TRUE(s.ok()) << s.error().message;
}

std::vector<BlockLease> take(BlockPool& pool, int32_t n) {
  auto r = pool.allocate(n);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : std::vector<BlockLease>{};
}

TEST(BlockPool, AllocateGivesDistinctBlocksAndCounts) {
  BlockPool pool(8, 4);
  EXPECT_EQ(pool.block_size(), 4);
  EXPECT_EQ(BlockPool(2).block_size(), 16);
  EXPECT_EQ(pool.n_free(), 8);
  auto a = take(pool, 5);
  ASSERT_EQ(a.size(), 5u);
  std::vector<int32_t> ids;
  for (auto& l : a) {
    ASSERT_TRUE(l.valid());
    EXPECT_EQ(pool.refcount(l.block()), 1);
    ids.push_back(l.block());
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
  EXPECT_EQ(pool.n_used(), 5);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.n_cached(), 0);
  expect_ok(pool);
}

TEST(BlockPool, ExhaustionIsAnErrorAndChangesNothing) {
  BlockPool pool(4, 16);
  auto a = take(pool, 3);
  EXPECT_FALSE(pool.can_allocate(2));
  auto r = pool.allocate(2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot allocate 2 blocks"), std::string::npos) << r.error().message;
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.n_used(), 3);
  expect_ok(pool);
  auto b = take(pool, 1);
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_TRUE(pool.allocate(0).ok());
}

TEST(BlockPool, LeasesReleaseOnDestructionMoveAndExplicitRelease) {
  BlockPool pool(4, 16);
  {
    auto a = take(pool, 2);
    EXPECT_EQ(pool.n_used(), 2);
  }
  EXPECT_EQ(pool.n_free(), 4);
  auto a = take(pool, 1);
  const int32_t b = a[0].block();
  BlockLease moved = std::move(a[0]);
  EXPECT_FALSE(a[0].valid());  // NOLINT: moved-from state is specified
  EXPECT_EQ(moved.block(), b);
  EXPECT_EQ(pool.refcount(b), 1);
  BlockLease other;
  other = std::move(moved);
  EXPECT_EQ(pool.refcount(b), 1);
  other.release();
  EXPECT_FALSE(other.valid());
  other.release();  // second release is a no-op
  EXPECT_EQ(pool.n_free(), 4);
  expect_ok(pool);
}

TEST(BlockPool, RefcountsCountEveryLease) {
  BlockPool pool(4, 16);
  auto a = take(pool, 1);
  const int32_t b = a[0].block();
  BlockLease second = pool.acquire(b);
  BlockLease third = pool.acquire(b);
  EXPECT_EQ(pool.refcount(b), 3);
  a.clear();
  second.release();
  EXPECT_EQ(pool.refcount(b), 1);
  EXPECT_FALSE(pool.is_free(b));
  expect_ok(pool);
  third.release();
  EXPECT_TRUE(pool.is_free(b));
  expect_ok(pool);
}

TEST(BlockPool, CachedBlocksGoToLruAndAreEvictedOldestFirst) {
  BlockPool pool(4, 16);
  std::vector<int32_t> evicted;
  pool.set_evict_callback([&](int32_t b) { evicted.push_back(b); });
  auto a = take(pool, 4);
  std::vector<int32_t> ids;
  for (auto& l : a) {
    pool.mark_cached(l.block());
    ids.push_back(l.block());
  }
  // Release in the order 2, 0, 3, 1: that is the LRU order.
  for (int i : {2, 0, 3, 1}) a[i].release();
  EXPECT_EQ(pool.n_cached(), 4);
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_EQ(pool.lru_order(), (std::vector<int32_t>{ids[2], ids[0], ids[3], ids[1]}));
  expect_ok(pool);

  // Re-acquiring a cached block takes it off the LRU; releasing puts it last.
  BlockLease again = pool.acquire(ids[2]);
  EXPECT_EQ(pool.n_cached(), 3);
  again.release();
  EXPECT_EQ(pool.lru_order(), (std::vector<int32_t>{ids[0], ids[3], ids[1], ids[2]}));

  auto b = take(pool, 2);
  EXPECT_EQ(evicted, (std::vector<int32_t>{ids[0], ids[3]}));
  EXPECT_EQ(b[0].block(), ids[0]);
  EXPECT_EQ(b[1].block(), ids[3]);
  EXPECT_FALSE(pool.is_cached(ids[0]));  // fresh blocks are never cached
  EXPECT_EQ(pool.n_cached(), 2);
  expect_ok(pool);
  // Fresh, uncached blocks go back to the free list, not the LRU.
  b.clear();
  EXPECT_EQ(pool.n_free(), 2);
  expect_ok(pool);
}

TEST(BlockPool, UncacheMovesIdleBlockToFreeList) {
  BlockPool pool(3, 16);
  auto a = take(pool, 2);
  pool.mark_cached(a[0].block());
  pool.mark_cached(a[1].block());
  const int32_t idle = a[0].block(), busy = a[1].block();
  a[0].release();
  EXPECT_EQ(pool.n_cached(), 1);
  pool.uncache(idle);
  EXPECT_TRUE(pool.is_free(idle));
  pool.uncache(busy);  // still referenced: goes to the free list on release
  a[1].release();
  EXPECT_TRUE(pool.is_free(busy));
  EXPECT_EQ(pool.n_free(), 3);
  expect_ok(pool);
}

TEST(BlockPool, ReleaseTailFirstPutsTailAtLruFront) {
  BlockPool pool(3, 16);
  auto chain = take(pool, 3);
  std::vector<int32_t> ids;
  for (auto& l : chain) {
    pool.mark_cached(l.block());
    ids.push_back(l.block());
  }
  release_tail_first(chain);
  EXPECT_TRUE(chain.empty());
  EXPECT_EQ(pool.lru_order(), (std::vector<int32_t>{ids[2], ids[1], ids[0]}));
  expect_ok(pool);
}

TEST(BlockPool, EvictCallbackMayUncacheOtherBlocks) {
  // The prefix tree drops a whole subtree when an inner block is evicted;
  // the pool must stay consistent and hand out the extra freed blocks.
  BlockPool pool(4, 16);
  auto a = take(pool, 4);
  for (auto& l : a) pool.mark_cached(l.block());
  const int32_t first = a[0].block(), second = a[1].block();
  pool.set_evict_callback([&](int32_t b) {
    if (b == first && pool.is_cached(second)) pool.uncache(second);
  });
  a[0].release();
  a[1].release();
  auto b = take(pool, 2);  // evicts `first`, which frees `second` too
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.n_used(), 4);
  expect_ok(pool);
}

}  // namespace
}  // namespace rill
