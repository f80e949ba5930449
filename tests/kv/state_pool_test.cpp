#include "kv/state_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace rill {
namespace {

void expect_ok(const StatePool& pool) {
  Status s = pool.check_integrity();
  ASSERT_TRUE(s.ok()) << s.error().message;
}

TEST(StatePool, SlotsAreExclusiveAndReturnedByRaii) {
  StatePool pool(2, 0);
  EXPECT_EQ(pool.n_free(), 2);
  {
    auto a = pool.acquire();
    ASSERT_TRUE(a.ok());
    auto b = pool.acquire();
    ASSERT_TRUE(b.ok());
    EXPECT_NE(a->slot(), b->slot());
    EXPECT_TRUE(pool.is_leased(a->slot()));
    EXPECT_EQ(pool.n_free(), 0);
    expect_ok(pool);
    auto c = pool.acquire();
    EXPECT_FALSE(c.ok());  // exhausted: an error, nothing changes
    EXPECT_EQ(pool.n_leased(), 2);
    StateSlot moved = std::move(*a);
    EXPECT_FALSE(a->valid());
    moved.release();
    EXPECT_EQ(pool.n_free(), 1);
    moved.release();  // no-op when empty
    EXPECT_EQ(pool.n_free(), 1);
    expect_ok(pool);
  }
  EXPECT_EQ(pool.n_free(), 2);
  expect_ok(pool);
}

TEST(StatePool, MoveAssignReleasesTheOldSlot) {
  StatePool pool(2, 0);
  StateSlot a = std::move(pool.acquire()).value();
  StateSlot b = std::move(pool.acquire()).value();
  int32_t kept = b.slot();
  a = std::move(b);
  EXPECT_EQ(a.slot(), kept);
  EXPECT_EQ(pool.n_free(), 1);
  expect_ok(pool);
}

TEST(StatePool, CheckpointsAreKeyedByBlockAndRecycledLru) {
  StatePool none(1, 0);
  EXPECT_FALSE(none.take_checkpoint(3).ok());

  StatePool pool(0, 2);
  auto c7 = pool.take_checkpoint(7);
  ASSERT_TRUE(c7.ok());
  EXPECT_EQ(pool.take_checkpoint(7).value(), *c7);  // same block -> same slot
  auto c9 = pool.take_checkpoint(9);
  ASSERT_TRUE(c9.ok());
  EXPECT_NE(*c9, *c7);
  EXPECT_EQ(pool.n_checkpoints_used(), 2);
  ASSERT_TRUE(pool.find_checkpoint(7).has_value());  // 7 now more recent than 9
  auto c4 = pool.take_checkpoint(4);                 // recycles 9's slot
  ASSERT_TRUE(c4.ok());
  EXPECT_EQ(*c4, *c9);
  EXPECT_FALSE(pool.find_checkpoint(9).has_value());
  EXPECT_EQ(*pool.find_checkpoint(7), *c7);
  expect_ok(pool);
  pool.drop_checkpoint(7);
  pool.drop_checkpoint(7);  // no-op
  EXPECT_FALSE(pool.find_checkpoint(7).has_value());
  EXPECT_EQ(pool.n_checkpoints_used(), 1);
  EXPECT_EQ(pool.take_checkpoint(5).value(), *c7);  // the freed slot is reused first
  expect_ok(pool);
}

TEST(StatePool, CheckpointsOfTheCurrentStepAreNotRecycled) {
  StatePool pool(1, 2);
  const uint64_t step = pool.clock() + 1;
  const int32_t a = pool.take_checkpoint(10, step).value();
  const int32_t b = pool.take_checkpoint(11, step).value();
  EXPECT_NE(a, b);
  EXPECT_FALSE(pool.take_checkpoint(12, step).ok());  // both kept: nothing recycled
  EXPECT_EQ(pool.checkpoint_of(10), a);
  EXPECT_EQ(pool.checkpoint_of(11), b);
  EXPECT_EQ(pool.take_checkpoint(11, step).value(), b);  // a block's own checkpoint is reused
  // A later step may recycle them, least recently used first (10).
  EXPECT_EQ(pool.take_checkpoint(12, pool.clock() + 1).value(), a);
  EXPECT_FALSE(pool.checkpoint_of(10).has_value());
  EXPECT_EQ(pool.checkpoint_of(12), a);
  expect_ok(pool);
}

TEST(StatePool, RandomizedLeasesAndCheckpointsStayConsistent) {
  StatePool pool(4, 3);
  std::mt19937 rng(11);
  std::vector<StateSlot> held;
  for (int step = 0; step < 2000; ++step) {
    switch (rng() % 4) {
      case 0: {
        auto s = pool.acquire();
        EXPECT_EQ(s.ok(), static_cast<int32_t>(held.size()) < 4);
        if (s.ok()) held.push_back(std::move(s).value());
        break;
      }
      case 1:
        if (!held.empty()) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
        break;
      case 2:
        ASSERT_TRUE(pool.take_checkpoint(static_cast<int32_t>(rng() % 8)).ok());
        break;
      default:
        pool.drop_checkpoint(static_cast<int32_t>(rng() % 8));
        break;
    }
    ASSERT_EQ(pool.n_leased(), static_cast<int32_t>(held.size()));
    ASSERT_LE(pool.n_checkpoints_used(), 3);
    expect_ok(pool);
  }
  held.clear();
  EXPECT_EQ(pool.n_free(), 4);
}

}  // namespace
}  // namespace rill
