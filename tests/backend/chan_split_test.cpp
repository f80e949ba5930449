// The fast k4c / k4a CUDA attention's split plan (backend/cuda/
// attention_chan_split.h, pure host / device functions): the splits cover a
// query's KV blocks exactly once, in order, each non-empty; no plan has
// more splits than the launch's grid holds (chan_split_grid of any key
// count at least the query's); the plan is the query's own (a function of
// its key range only).
#include "backend/cuda/attention_chan_split.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace rill::cuda {
namespace {

TEST(ChanSplit, SplitsCoverTheBlocksOnceInOrder) {
  for (int64_t j_begin : {0, 1, 31, 32, 33, 100, 4000}) {
    for (int64_t n = 1; n <= 6000; n += (n < 300 ? 1 : 37)) {
      const int64_t j_end = j_begin + n;
      const ChanSplit s = chan_split_plan(j_begin, j_end);
      ASSERT_GE(s.n_splits, 1);
      ASSERT_LE(s.n_splits, kChanMaxSplits);
      EXPECT_EQ(s.first_block, j_begin / 32);
      EXPECT_EQ(s.first_block + s.n_blocks - 1, (j_end - 1) / 32);
      int64_t next = s.first_block;
      for (int32_t z = 0; z < s.n_splits; ++z) {
        int64_t lo = 0, hi = 0;
        chan_split_blocks(s, z, &lo, &hi);
        ASSERT_EQ(lo, next) << "keys [" << j_begin << ", " << j_end << ") split " << z;
        ASSERT_GT(hi, lo) << "an empty split";
        ASSERT_LE(hi - lo, s.split_blocks);
        // a split is at least kChanMinSplitBlocks blocks unless it is the last
        if (z + 1 < s.n_splits) {
          EXPECT_GE(hi - lo, kChanMinSplitBlocks);
        }
        next = hi;
      }
      EXPECT_EQ(next, s.first_block + s.n_blocks);
      // the launch's grid (sized from any key count >= the query's) holds it
      EXPECT_LE(s.n_splits, chan_split_grid(n));
      EXPECT_LE(s.n_splits, chan_split_grid(n + 1000));
    }
  }
}

TEST(ChanSplit, NoKeysNoSplits) {
  EXPECT_EQ(chan_split_plan(5, 5).n_splits, 0);
  EXPECT_EQ(chan_split_plan(7, 3).n_splits, 0);
  EXPECT_GE(chan_split_grid(0), 1);
}

TEST(ChanSplit, KeyRangeIsTheReferences) {
  int64_t b = 0, e = 0;
  chan_key_range(99, 0, &b, &e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 100);
  chan_key_range(99, 40, &b, &e);
  EXPECT_EQ(b, 60);
  EXPECT_EQ(e, 100);
  chan_key_range(10, 40, &b, &e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 11);
}

// The shapes the design aims at: a B=1 decode after 1,024 tokens fills
// about one H100 wave with 8 KV heads; long contexts stop at kChanMaxSplits.
TEST(ChanSplit, DecodeShapes) {
  EXPECT_EQ(chan_split_plan(0, 1025).n_splits, 17);  // 33 blocks, 2 a split
  EXPECT_EQ(chan_split_plan(0, 1024).n_splits, 16);
  EXPECT_EQ(chan_split_plan(0, 4097).n_splits, 26);  // 129 blocks, 5 a split
  EXPECT_EQ(chan_split_plan(0, 4096).n_splits, 32);  // 128 blocks, 4 a split
  EXPECT_EQ(chan_split_plan(0, 1).n_splits, 1);
  EXPECT_EQ(chan_split_plan(0, 64).n_splits, 1);
  EXPECT_EQ(chan_split_plan(0, 65).n_splits, 2);
}

}  // namespace
}  // namespace rill::cuda
